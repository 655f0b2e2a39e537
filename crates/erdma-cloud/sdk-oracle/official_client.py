#!/usr/bin/env python3
"""Drives the OFFICIAL Python ECS client (`alibabacloud-ecs20140526` on `alibabacloud-tea-openapi`)
against the erdma ECS emulator over HTTP, with signature V3 (ACS3-HMAC-SHA256, the SDK default)
and V2 (HMAC-SHA1), for the calls the controller makes. Every call must succeed: the emulator's
signature verifier and its SDK-derived parameter check accept what the official SDK builds and
sends. Then one request with a wrong secret and one with a parameter ModifyNetworkInterfaceAttribute
does not define (sent through the SDK's generic call_api) must be refused with ECS's codes.

Usage: official_client.py EMULATOR-COMMAND...   (the command prints the `ENDPOINT ...` line of
examples/ecs_emulator.rs and serves until its stdin closes)
"""

import subprocess
import sys


def client(endpoint, ak, secret, algorithm):
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import utils_models

    host = endpoint.removeprefix("http://")
    cfg = utils_models.Config(
        access_key_id=ak, access_key_secret=secret, region_id="emu-region", endpoint=host,
        protocol="http",
    )
    if algorithm:
        cfg.signature_algorithm = algorithm
    return Client(cfg)


def code_of(err):
    return getattr(err, "code", None) or getattr(err, "data", {}).get("Code")


def main():
    from alibabacloud_ecs20140526 import models
    from alibabacloud_tea_openapi import utils_models
    from darabonba.runtime import RuntimeOptions

    emu = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first = emu.stdout.readline().split()
        if len(first) != 6 or first[0] != "ENDPOINT":
            raise SystemExit(f"official_client: the emulator printed {first!r}")
        _, endpoint, ak, secret, instance, primary = first
        rt = RuntimeOptions(autoretry=False, max_attempts=1)
        for algorithm in (None, "v2"):
            c = client(endpoint, ak, secret, algorithm)
            c.describe_instances_with_options(
                models.DescribeInstancesRequest(region_id="emu-region", instance_ids=f'["{instance}"]'), rt)
            c.describe_instance_types_with_options(
                models.DescribeInstanceTypesRequest(instance_types=["ecs.ebmgn8v.48xlarge"]), rt)
            c.describe_instance_attribute_with_options(
                models.DescribeInstanceAttributeRequest(instance_id=instance), rt)
            c.describe_network_interfaces_with_options(models.DescribeNetworkInterfacesRequest(
                region_id="emu-region", instance_id=instance, max_results=100), rt)
            c.describe_network_interfaces_with_options(models.DescribeNetworkInterfacesRequest(
                region_id="emu-region", tag=[models.DescribeNetworkInterfacesRequestTag(
                    key="creator", value="alibabacloud-erdma-controller")]), rt)
            created = c.create_network_interface_with_options(models.CreateNetworkInterfaceRequest(
                region_id="emu-region", v_switch_id="vsw-1", security_group_ids=["sg-1"],
                network_interface_name="eri-official", network_interface_traffic_mode="HighPerformance",
                queue_pair_number=8, client_token=f"official-{algorithm}",
                tag=[models.CreateNetworkInterfaceRequestTag(key="creator", value="alibabacloud-erdma-controller")]), rt)
            eni = created.body.network_interface_id
            c.attach_network_interface_with_options(models.AttachNetworkInterfaceRequest(
                region_id="emu-region", network_interface_id=eni, instance_id=instance, network_card_index=1), rt)
            c.modify_network_interface_attribute_with_options(models.ModifyNetworkInterfaceAttributeRequest(
                region_id="emu-region", network_interface_id=primary,
                network_interface_traffic_config=models.ModifyNetworkInterfaceAttributeRequestNetworkInterfaceTrafficConfig(
                    network_interface_traffic_mode="HighPerformance", queue_pair_number=16)), rt)
            c.tag_resources_with_options(models.TagResourcesRequest(
                region_id="emu-region", resource_type="eni", resource_id=[eni],
                tag=[models.TagResourcesRequestTag(key="instance-id", value=instance)]), rt)

            # Refusals, as ECS answers them.
            bad = client(endpoint, ak, "not-the-secret", algorithm)
            try:
                bad.describe_instance_attribute_with_options(
                    models.DescribeInstanceAttributeRequest(instance_id=instance), rt)
                raise SystemExit("official_client: a wrong secret was accepted")
            except SystemExit:
                raise
            except Exception as e:  # the SDK raises its own exception types
                if code_of(e) != "SignatureDoesNotMatch":
                    raise SystemExit(f"official_client: wrong secret answered {code_of(e)}: {e}")
            params = utils_models.Params(
                action="ModifyNetworkInterfaceAttribute", version="2014-05-26", protocol="HTTP",
                pathname="/", method="POST", auth_type="AK", style="RPC", req_body_type="formData",
                body_type="json")
            req = utils_models.OpenApiRequest(query={
                "RegionId": "emu-region", "NetworkInterfaceId": primary, "QueuePairNumber": "8"})
            try:
                c.call_api(params, req, rt)
                raise SystemExit("official_client: an undefined parameter was accepted")
            except SystemExit:
                raise
            except Exception as e:
                if code_of(e) != "InvalidParameter" or "QueuePairNumber" not in str(e):
                    raise SystemExit(f"official_client: undefined parameter answered {code_of(e)}: {e}")
    finally:
        out, _ = emu.communicate(timeout=30)
    calls = [line.split() for line in out.splitlines() if line.startswith("CALL ")]
    schemes = {c[2] for c in calls}
    ok = sum(1 for c in calls if c[3] == "200")
    if schemes != {"V2", "V3"} or ok != 18:
        raise SystemExit(f"official_client: expected 18 accepted calls over V2 and V3, got {calls}")
    print(f"official_client: the emulator accepted {ok} official-SDK requests (V3 and V2) and refused the bad ones")


if __name__ == "__main__":
    main()
