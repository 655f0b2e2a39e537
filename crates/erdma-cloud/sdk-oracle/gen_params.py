#!/usr/bin/env python3
"""Generates testdata/ecs-2014-05-26-params.json: for each ECS action the erdma client calls, the
request parameter names the official Alibaba Cloud SDK defines, and which of them are required.

Source of truth, in this order:

* Names: the official Python SDK `alibabacloud-ecs20140526` (models + client), EXECUTED, not read:
  for each action a request model is filled with a value in every field (recursively: a list gets
  one element, a nested struct every one of its fields), the SDK client's
  `<action>_with_options` is called with `call_api` replaced by a recorder, and the flat query
  names it produces (its own `Utils.query` flattening: `Tag.1.Key`,
  `NetworkInterfaceTrafficConfig.QueuePairNumber`, ...) are recorded with every list index
  written as `N`.
* Cross-check: the legacy SDK `aliyun-python-sdk-ecs` request class of the same action, executed
  the same way (every setter called); names it defines that the new SDK lacks, and the reverse,
  are listed per action (`legacy_only`, `new_only`) but are NOT part of `params`.
* Required: neither SDK enforces required parameters in code (`validate()` only recurses). The
  new SDK's generated models carry the API metadata's `This parameter is required.` in the
  comment of each field; that comment is the source of `required` (top-level fields) and of
  `required_in_parent` (fields of a struct/list element, required when the element is sent).
* Common parameters: the SDK runtime's (`alibabacloud-tea-openapi`) own V2 request, captured the
  same way (client with a security token; the action's own parameters removed), gives
  `common_v2`; V3 sends the same information in `x-acs-*` headers, so it has no common query
  parameters.

Usage: gen_params.py OUT.json   (run inside the venv made by sdk-oracle/check.sh)
"""

import importlib
import importlib.metadata as md
import inspect
import json
import re
import sys
import typing

ACTIONS = [
    "DescribeInstances",
    "DescribeInstanceTypes",
    "DescribeInstanceAttribute",
    "DescribeNetworkInterfaces",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "TagResources",
]

REQUIRED_MARK = "This parameter is required."


class Captured(Exception):
    """Raised by the recorder that replaces the SDK's transport."""

    def __init__(self, payload):
        super().__init__("captured")
        self.payload = payload


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def flat_pattern(name):
    return ".".join("N" if part.isdigit() else part for part in name.split("."))


def sample(hint, models):
    """A value for a field whose type hint is `hint` (a model, a list, or a scalar)."""
    origin = typing.get_origin(hint)
    if origin in (list, typing.List):
        (inner,) = typing.get_args(hint) or (str,)
        return [sample(inner, models)]
    if origin in (dict, typing.Dict):
        return {"k": "v"}
    if inspect.isclass(hint) and hint.__module__.startswith("alibabacloud_ecs20140526"):
        return filled(hint, models)
    if hint is bool:
        return True
    if hint in (int, float):
        return 1
    return "v"


def filled(cls, models):
    hints = typing.get_type_hints(cls.__init__, globalns=vars(sys.modules[cls.__module__]) | {"main_models": models})
    kwargs = {k: sample(h, models) for k, h in hints.items() if k not in ("self", "return")}
    return cls(**kwargs)


def wire_names(cls):
    """snake field -> wire name, from the model's `to_map`."""
    src = inspect.getsource(cls.to_map)
    return dict((f, w) for w, f in re.findall(r"result\['([^']+)'\] = self\.(\w+)", src))


def required_fields(cls):
    """snake fields whose doc comment carries the API metadata's required mark."""
    src = inspect.getsource(cls.__init__)
    out, comment = set(), []
    for line in src.splitlines():
        s = line.strip()
        if s.startswith("#"):
            comment.append(s)
            continue
        m = re.match(r"self\.(\w+) = \w+", s)
        if m:
            if any(REQUIRED_MARK in c for c in comment):
                out.add(m.group(1))
            comment = []
        elif s:
            comment = []
    return out


def required_tree(cls, models, prefix=""):
    """(top-level required, required-in-parent) wire patterns of `cls` and its nested models."""
    hints = typing.get_type_hints(cls.__init__, globalns=vars(sys.modules[cls.__module__]) | {"main_models": models})
    wire = wire_names(cls)
    req = required_fields(cls)
    top, nested = [], []
    for field, hint in hints.items():
        if field in ("self", "return") or field not in wire:
            continue
        name = prefix + wire[field]
        if field in req:
            (top if not prefix else nested).append(name)
        inner, suffix = hint, ""
        if typing.get_origin(hint) in (list, typing.List):
            (inner,) = typing.get_args(hint) or (str,)
            suffix = ".N"
        if inspect.isclass(inner) and inner.__module__.startswith("alibabacloud_ecs20140526"):
            t, n = required_tree(inner, models, name + suffix + ".")
            nested.extend(t + n)
    return top, nested


def new_sdk_names(action):
    from alibabacloud_ecs20140526 import models
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import utils_models
    from darabonba.runtime import RuntimeOptions

    cls = getattr(models, action + "Request")
    client = Client(
        utils_models.Config(
            access_key_id="AKID", access_key_secret="secret", region_id="cn-hangzhou",
            endpoint="ecs.cn-hangzhou.aliyuncs.com",
        )
    )

    def recorder(params, req, runtime):
        raise Captured((params, req))

    client.call_api = recorder
    method = getattr(client, snake(action) + "_with_options")
    try:
        method(filled(cls, models), RuntimeOptions())
    except Captured as c:
        params, req = c.payload
    else:
        raise SystemExit(f"{action}: the SDK client did not reach call_api")
    if params.action != action or params.version != "2014-05-26":
        raise SystemExit(f"{action}: the SDK called {params.action} {params.version}")
    names = set(req.query or {})
    if req.body:
        from alibabacloud_tea_openapi.utils import Utils

        names |= set(Utils.query(req.body))
    top, nested = required_tree(cls, models)
    return (
        sorted({flat_pattern(n) for n in names}),
        sorted(top),
        sorted(set(nested)),
        {"method": params.method, "style": params.style},
    )


class Anything:
    """A value for every legacy setter: a one-element list of itself, a struct with every key."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        if i != 0:
            raise IndexError(i)
        return self

    def get(self, key, default=None):
        return self

    def __str__(self):
        return "v"


def legacy_sdk_names(action):
    mod = importlib.import_module(f"aliyunsdkecs.request.v20140526.{action}Request")
    req = getattr(mod, action + "Request")()
    for name in dir(req):
        if name.startswith("set_") and name[4:5].isupper():
            getattr(req, name)(Anything())
    names = set(req.get_query_params()) | set(req.get_body_params())
    return sorted({flat_pattern(n) for n in names})


def common_v2():
    from alibabacloud_ecs20140526 import models
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import client as openapi_client
    from alibabacloud_tea_openapi import utils_models
    from darabonba.runtime import RuntimeOptions

    client = Client(
        utils_models.Config(
            access_key_id="AKID", access_key_secret="secret", security_token="token",
            region_id="cn-hangzhou", endpoint="ecs.cn-hangzhou.aliyuncs.com",
            signature_algorithm="v2",
        )
    )

    seen = []

    def do_action(request, runtime):
        seen.append(dict(request.query))
        raise Captured(request)

    saved = openapi_client.DaraCore.do_action
    openapi_client.DaraCore.do_action = staticmethod(do_action)
    try:
        client.describe_instance_attribute_with_options(
            models.DescribeInstanceAttributeRequest(instance_id="i-x"), RuntimeOptions()
        )
    except Exception:  # the SDK wraps the recorder's exception in its own
        pass
    finally:
        openapi_client.DaraCore.do_action = saved
    if not seen:
        raise SystemExit("the SDK runtime sent no V2 request")
    query = seen[0]
    query.pop("InstanceId", None)
    return sorted(query)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gen_params.py OUT.json")
    actions = {}
    for action in ACTIONS:
        names, required, required_in_parent, call = new_sdk_names(action)
        legacy = legacy_sdk_names(action)
        actions[action] = {
            "params": names,
            "required": required,
            "required_in_parent": required_in_parent,
            "sdk_call": call,
            "legacy_only": sorted(set(legacy) - set(names)),
            "new_only": sorted(set(names) - set(legacy)),
        }
    out = {
        "comment": "GENERATED by crates/erdma-cloud/sdk-oracle/gen_params.py from the official SDK; "
        "do not edit. Regenerate: crates/erdma-cloud/sdk-oracle/check.sh --write. "
        "params/required: alibabacloud-ecs20140526 (executed; required from its 'This parameter is "
        "required.' API-metadata comments). legacy_only/new_only: diff against aliyun-python-sdk-ecs. "
        "common_v2: the query parameters alibabacloud-tea-openapi adds to a V2 (HMAC-SHA1) request. "
        "'N' in a name stands for a 1-based list index.",
        "api_version": "2014-05-26",
        "sdk": {
            "alibabacloud-ecs20140526": md.version("alibabacloud-ecs20140526"),
            "alibabacloud-tea-openapi": md.version("alibabacloud-tea-openapi"),
            "aliyun-python-sdk-ecs": md.version("aliyun-python-sdk-ecs"),
        },
        "common_v2": common_v2(),
        "actions": actions,
    }
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
