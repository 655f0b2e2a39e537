"""Renders and lints deploy/helm with the real Helm engine (helm-python-sdk, Helm v4 as a library).

For each values file in ci/values/ (the matrix: defaults, the original chart's values.yaml,
local discovery, webhook, each credentials type, every boolean flipped, placement):
  - `helm lint --strict` with those values must report nothing at warning level or above;
  - the chart is rendered for release alibaba-erdma-controller in kube-system; the objects (JSON,
    in template order) and NOTES.txt go to ci/rendered/<case>.json. With --update the files are
    rewritten; without it a difference from the committed file fails (the Rust test
    crates/erdma-k8s/tests/chart.rs reads these files: every object deserialises into its
    k8s-openapi type, and erdmactl's renderer produces the same objects);
  - the upgrade-identity check against ci/original-objects.yaml.
Then values that must be refused are rendered and the error must name the value, and the
config.smcInitImage forms (the original's smcr_init image replaced by erdma's) are checked.

Usage: check.py [--update]   (run through ci/check.sh, which installs the package)
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from helm_python import chart as helm
from helm_python.errors import HelmError

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parent
RELEASE = "alibaba-erdma-controller"
NAMESPACE = "kube-system"

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print(f"FAIL {msg}")


def load_yaml(path: pathlib.Path) -> dict:
    # Helm's own YAML reader (sigs.k8s.io/yaml), so values mean what they mean to `helm -f`.
    return helm.values_from_yaml(path.read_text()) or {}


def split_docs(text: str) -> list[str]:
    return [d for d in re.split(r"(?m)^---[ \t]*$", text) if d.strip()]


def render(chart: helm.Chart, values: dict) -> tuple[list[dict], str]:
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict] = []
    notes = ""
    for path in sorted(out):
        if path.endswith("NOTES.txt"):
            notes = out[path]
            continue
        for doc in split_docs(out[path]):
            obj = helm.values_from_yaml(doc)
            if obj:
                objects.append(obj)
    return objects, notes


def booleans(values: dict, schema: dict, prefix: str = "") -> list[str]:
    # The chart's own switches: booleans inside Kubernetes objects passed through as given
    # (securityContext, ...: free-form in the schema) are the user's, not the chart's.
    found = []
    props = schema.get("properties") or {}
    for k, v in values.items():
        key = f"{prefix}{k}"
        sub = props.get(k) or {}
        if isinstance(v, bool):
            found.append(key)
        elif isinstance(v, dict) and "properties" in sub:
            found += booleans(v, sub, key + ".")
    return found


def dig(obj: dict, dotted: str):
    # `a.b[0].c`: keys and list indexes (no key used here contains a dot).
    cur = obj
    for part in dotted.split("."):
        m = re.fullmatch(r"([^\[]+)((?:\[\d+\])*)", part)
        key, idx = (m.group(1), m.group(2)) if m else (part, "")
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
        for i in re.findall(r"\[(\d+)\]", idx):
            if not isinstance(cur, list) or int(i) >= len(cur):
                return None
            cur = cur[int(i)]
    return cur


def flatten(items) -> list[dict]:
    out = []
    for i in items:
        out += flatten(i) if isinstance(i, list) else [i]
    return out


def ident(o: dict) -> tuple[str, str, str]:
    meta = o.get("metadata", {})
    return (o.get("kind", ""), meta.get("name", ""), meta.get("namespace", ""))


def upgrade_identity(chart: helm.Chart) -> None:
    """The upgrade identity table: for each case, every object of the original's render and each
    of its immutable and identity fields against erdma's render of the same values."""
    spec = load_yaml(HERE / "original-objects.yaml")
    assert spec["release"] == RELEASE and spec["namespace"] == NAMESPACE
    rows: list[tuple[str, str, str, str, str]] = []
    for case in spec["cases"]:
        values = load_yaml(HERE / "values" / case["values"])
        objects, _ = render(chart, values)
        mine = {ident(o): o for o in objects}
        dropped = {(d["kind"], d["name"], d.get("namespace", "")) for d in case["dropped"]}
        kept = 0
        for want in flatten(case["objects"]):
            key = (want["kind"], want["name"], want.get("namespace", ""))
            label = f"{key[0]} {key[2] + '/' if key[2] else ''}{key[1]}"
            if key in dropped:
                if key in mine:
                    fail(f"upgrade {case['values']}: {key} is listed as dropped but rendered")
                rows.append((case["values"], label, "(object)", "present", "dropped on purpose"))
                continue
            got = mine.get(key)
            if got is None:
                fail(f"upgrade {case['values']}: the original's {key} is missing (an upgrade would delete it)")
                rows.append((case["values"], label, "(object)", "present", "MISSING"))
                continue
            kept += 1
            rows.append((case["values"], label, "(object)", "present", "kept"))
            for what, fields in (("immutable", want.get("immutable") or {}), ("identity", want.get("identity") or {})):
                for field, value in fields.items():
                    have = dig(got, field)
                    shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)
                    if have != value:
                        why = "immutable: the upgrade would be refused" if what == "immutable" else "renamed: what depends on the name breaks during or after the upgrade"
                        fail(f"upgrade {case['values']}: {key} {field} = {json.dumps(have)}, the original's is {json.dumps(value)} ({why})")
                        rows.append((case["values"], label, field, shown, f"DIFFERS: {json.dumps(have)}"))
                    else:
                        rows.append((case["values"], label, field, shown[:60], "equal"))
        originals = {(w["kind"], w["name"], w.get("namespace", "")) for w in flatten(case["objects"])}
        added = sorted(f"{k}/{n}" for (k, n, _ns) in mine if (k, n, _ns) not in originals)
        print(f"ok   upgrade identity {case['values']}: {kept} of the original's objects kept with equal immutable and identity fields, {len(dropped)} dropped on purpose, {len(added)} added: {', '.join(added)}")
    print("\nupgrade identity table (the original's render vs erdma's, release alibaba-erdma-controller in kube-system):")
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in [("values", "object", "field", "original")] + rows:
        cells = [r[i].ljust(widths[i]) for i in range(4)] + [r[4] if len(r) > 4 else "erdma"]
        print("  " + "  ".join(cells))
    for d in spec.get("differs") or []:
        print(f"  differs on purpose: {d['field']}: {d['why']}")
    print()


# Values that must be refused at install time, and a word the error must contain.
REFUSED = [
    ({"agent": {"preferDriver": "turbo"}}, "preferDriver"),
    ({"agent": {"jumboFrameMTU": 100}}, "jumboFrameMTU"),
    ({"agent": {"exposedLocalERIs": ["erdma_0"]}}, "exposedLocalERIs"),
    ({"webhookFailurePolicy": "Sometimes"}, "webhookFailurePolicy"),
    ({"webhookTimeoutSeconds": 60}, "webhookTimeoutSeconds"),
    ({"credentials": {"type": "password"}}, "type"),
    ({"controller": {"replicaCount": 0}}, "replicaCount"),
    ({"config": {"enableWebhok": True}}, "enableWebhok"),
    ({"agent": {"image": {"repository": "registry.aliyuncs.com/erdma/agent", "tag": "v0.2.0"}}}, "Go image"),
    ({"controller": {"image": {"repository": "registry-vpc.cn-hangzhou.aliyuncs.com/erdma/controller", "tag": "v0.3.0"}}}, "Go image"),
    ({"agent": {"criSocket": "/run/cri-dockerd.sock"}}, "criSocket"),
    ({"agent": {"driverInstaller": {"sha256": "abc"}}}, "sha256"),
    ({"agent": {"nri": "maybe"}}, "nri"),
    ({"agent": {"nriRdmaMax": "hca_handle=lots"}}, "nriRdmaMax"),
    ({"agent": {"driverInstaller": {"version": "1.5.9;rm"}}}, "version"),
    ({"agent": {"driverInstaller": {"baseURL": "http://10.0.0.1/erdma"}}}, "baseURL"),
    ({"agent": {"extraArgs": ["--rdma-driver=rxe", ""]}}, "extraArgs"),
    ({"agent": {"extraArgs": [" "]}}, "extraArgs"),
    ({"agent": {"extraArgs": "--rdma-driver=rxe"}}, "extraArgs"),
    ({"agent": {"preferDrvier": "ofed"}}, "preferDrvier"),
    ({"namespace": "erdma-system"}, "namespace"),
    ({"nameOverride": "Bad_Name"}, "nameOverride"),
    ({"fullnameOverride": "-bad-"}, "fullnameOverride"),
    ({"kubeletRootDir": "var/lib/kubelet"}, "kubeletRootDir"),
    ({"kubeletRootDir": "/var/lib/../kubelet"}, "kubeletRootDir"),
    ({"logFormat": "xml"}, "logFormat"),
    ({"logLevel": ""}, "logLevel"),
    ({"controller": {"extraArgs": [" "]}}, "extraArgs"),
    ({"agent": {"metricsPort": 0}}, "metricsPort"),
    ({"agent": {"updateStrategy": {"type": "Sometimes"}}}, "type"),
    ({"serviceMonitor": {"interval": "soon"}}, "interval"),
    ({"podLabels": {"team": 1}}, "team"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name"),
    ({"serviceAccount": {"create": False, "name": "default"}}, "serviceAccount.name"),
    ({"serviceAccount": {"name": "default"}}, "serviceAccount.name"),
    ({"credentials": {"existingSecret": "Bad_Name"}}, "existingSecret"),
    ({"credentials": {"existingSecret": "erdma-creds", "accessKeySecret": "x"}}, "existingSecret"),
    ({"config": {"vpcId": "vpc x"}}, "vpcId"),
]

# Refused by the templates themselves too (`helm install --skip-schema-validation`), with the
# message erdmactl gives: rendered from a copy of the chart without values.schema.json.
REFUSED_WITHOUT_SCHEMA = [
    ({"agent": {"extraArgs": ["--rdma-driver=rxe", ""]}}, 'agent.extraArgs[1] "" is empty'),
    ({"agent": {"extraArgs": ["\t "]}}, 'agent.extraArgs[0] "\\t " is empty'),
    ({"serviceAccount": {"create": False}}, "namespace's default ServiceAccount"),
]


def no_secret_creation(case: str, objects: list[dict]) -> None:
    """No role of the chart lets anyone create Secrets: RBAC cannot limit `create` by name, and a
    Secret of type service-account-token or bootstrap.kubernetes.io/token is a credential."""
    for o in objects:
        if o["kind"] not in ("Role", "ClusterRole"):
            continue
        for r in o.get("rules") or []:
            if {"", "*"} & set(r.get("apiGroups") or []) and {"secrets", "*"} & set(r.get("resources") or []) \
                    and {"create", "*"} & set(r.get("verbs") or []):
                fail(f"{case}: {o['kind']} {o['metadata']['name']} grants create on secrets: {r}")


def refused_without_schema() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "erdma"
        shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("ci"))
        (copy / "values.schema.json").unlink()
        chart = helm.Chart.load(str(copy))
        for values, words in REFUSED_WITHOUT_SCHEMA:
            try:
                render(chart, values)
            except HelmError as e:
                if words not in str(e):
                    fail(f"refused without the schema {values}: error does not say {words!r}: {e}")
                else:
                    print(f"ok   refused without the schema {json.dumps(values)}: {words}")
                continue
            fail(f"refused without the schema {values}: rendered without error")


# config.smcInitImage -> the smcInitImage of config.json ("{app}": the chart's appVersion). The
# original's smcr_init image at its default tag is replaced by erdma's; anything else is kept.
SMC_INIT_IMAGES = [
    ("", "ghcr.io/erdma/smcr-init:{app}"),
    ("registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:latest", "ghcr.io/erdma/smcr-init:{app}"),
    ("registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init", "ghcr.io/erdma/smcr-init:{app}"),
    ("registry-vpc.cn-beijing.aliyuncs.com/erdma/smcr_init:latest", "ghcr.io/erdma/smcr-init:{app}"),
    ("registry-vpc.ap-southeast-1.aliyuncs.com/erdma/smcr_init", "ghcr.io/erdma/smcr-init:{app}"),
    ("registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:v1.2.0", "registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init:v1.2.0"),
    ("registry-vpc..aliyuncs.com/erdma/smcr_init", "registry-vpc..aliyuncs.com/erdma/smcr_init"),
    ("mirror.example/registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init", "mirror.example/registry.cn-hangzhou.aliyuncs.com/erdma/smcr_init"),
    ("registry.example/erdma/smcr-init:dev", "registry.example/erdma/smcr-init:dev"),
]


def smc_init_images(chart: helm.Chart) -> None:
    app = load_yaml(CHART / "Chart.yaml")["appVersion"]
    for given, want in SMC_INIT_IMAGES:
        want = want.format(app=app)
        values = {"config": {"enableWebhook": True, "smcInitImage": given}, "credentials": {"type": "ecs_ram_role"}}
        objects, notes = render(chart, values)
        cms = [o for o in objects if o["kind"] == "ConfigMap"]
        got = json.loads(cms[0]["data"]["config.json"])["smcInitImage"] if cms else None
        noted = "is the original chart's smcr_init image" in notes
        if got != want:
            fail(f"smcInitImage {given!r}: config.json has {got!r}, want {want!r}")
        elif noted != (bool(given) and want != given):
            fail(f"smcInitImage {given!r}: NOTES.txt {'names' if noted else 'does not name'} a replaced image: {notes}")
        else:
            print(f"ok   smcInitImage {given!r} -> {got}")


def refused(chart: helm.Chart) -> None:
    for values, word in REFUSED:
        try:
            chart.validate_schema(values)
            render(chart, values)
        except HelmError as e:
            msg = str(e)
            if word not in msg:
                fail(f"refused {values}: error does not name {word!r}: {msg}")
            else:
                print(f"ok   refused {json.dumps(values)}: {msg.splitlines()[0][:160]}")
            continue
        fail(f"refused {values}: rendered without error")


def helm_verdict(chart: helm.Chart, values: dict) -> dict:
    """What `helm install -f` does with a values file: accepted, or refused with Helm's error."""
    try:
        chart.validate_schema(values)
        render(chart, values)
    except HelmError as e:
        return {"helm": "refused", "error": str(e).splitlines()[0][:300]}
    return {"helm": "accepted"}


def contract(chart: helm.Chart, update: bool) -> None:
    """Helm's verdict on every values file erdmactl must judge alike (ci/values/*.yaml, the
    ci/contract/*.yaml files, the REFUSED values), in ci/contract.json; crates/erdma-k8s/tests/chart.rs
    runs `erdmactl install`'s reading of each and requires the same verdict."""
    entries = []
    for path in sorted((HERE / "values").glob("*.yaml")) + sorted((HERE / "contract").glob("*.yaml")):
        values = load_yaml(path)
        entries.append({"name": str(path.relative_to(HERE)), "values": values, **helm_verdict(chart, values)})
    for i, (values, _word) in enumerate(REFUSED):
        entries.append({"name": f"refused[{i}]", "values": values, **helm_verdict(chart, values)})
    text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
    target = HERE / "contract.json"
    if update:
        target.write_text(text)
    elif not target.exists() or target.read_text() != text:
        fail("contract: differs from the committed ci/contract.json (run deploy/helm/ci/check.sh --update and review the diff)")
    accepted = sum(e["helm"] == "accepted" for e in entries)
    print(f"ok   values contract: {len(entries)} values files, {accepted} accepted and {len(entries) - accepted} refused by Helm (ci/contract.json)")


def daemonset(ns: str, name: str, image: str, labels: dict, release: str | None = None, command: list | None = None) -> str:
    meta_labels = {"app.kubernetes.io/instance": release} if release else {}
    container = {"name": "alibabacloud-erdma-controller", "image": image}
    if command:
        container["command"] = command
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns, "labels": meta_labels},
        "spec": {"selector": {"matchLabels": labels or {"app": name}}, "template": {
            "metadata": {"labels": labels or {"app": name}},
            "spec": {"containers": [container]}}}})


def helm_release_secret(ns: str, name: str, status: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
                       "metadata": {"name": f"sh.helm.release.v1.{name}.v1", "namespace": ns,
                                    "labels": {"owner": "helm", "name": name, "status": status, "version": "1"}},
                       "data": {"release": ""}})


ORIGINAL_AGENT_LABELS = {"app.kubernetes.io/name": "alibabacloud-erdma-controller",
                         "app.kubernetes.io/instance": RELEASE, "tier": "agent"}
ADDON = daemonset("ack-erdma-controller", "ack-erdma-agent", "registry-vpc.cn-beijing.aliyuncs.com/erdma/agent:v1.2.0",
                  {"app": "ack-erdma-agent"}, "ack-erdma-controller")
ADDON_NS = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ack-erdma-controller"}})


def eni_config(on: bool) -> str:
    conf = json.dumps({"version": "1", "enable_erdma": on})
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "eni-config", "namespace": "kube-system"}, "data": {"eni_conf": conf}})


# (cluster objects, values, None when the install goes on, else the words the refusal names[, the
# release's namespace])
PREFLIGHT = [
    ([ADDON_NS, helm_release_secret("ack-erdma-controller", "ack-erdma-controller", "deployed")], {},
     "Helm release ack-erdma-controller/ack-erdma-controller (the ACK console add-on"),
    ([ADDON_NS, helm_release_secret("ack-erdma-controller", "ack-erdma-controller", "uninstalled")], {}, None),
    ([ADDON_NS, daemonset("ack-erdma-controller", "alibabacloud-erdma-agent", "ghcr.io/erdma/erdma-agent:0.1.0",
                          dict(ORIGINAL_AGENT_LABELS, **{"app.kubernetes.io/instance": RELEASE}), RELEASE)],
     {}, None, "ack-erdma-controller"),
    ([daemonset("tools", "rdma-agent", "registry.example/mirror/erdma/agent@sha256:" + "ab" * 32, {}, "x")], {},
     "DaemonSet tools/rdma-agent (another eRDMA agent"),
    ([daemonset("tools", "rdma-agent", "registry.example/tools/node-agent:2", {}, "x",
                ["/usr/local/bin/agent", "--prefer-driver", "compat"])], {}, "DaemonSet tools/rdma-agent"),
    ([daemonset("tools", "other-agent", "registry.example/tools/node-agent:2", {}, "x", ["/usr/local/bin/agent"])], {}, None),
    ([], {}, None),
    ([ADDON_NS, ADDON], {}, "DaemonSet ack-erdma-controller/ack-erdma-agent (the ACK console add-on"),
    ([ADDON_NS, ADDON], {"allowExistingInstallation": True}, None),
    ([daemonset("kube-system", "alibabacloud-erdma-agent", "registry.aliyuncs.com/erdma/agent:latest", ORIGINAL_AGENT_LABELS, RELEASE)], {}, None),
    ([daemonset("erdma", "alibabacloud-erdma-agent", "registry.aliyuncs.com/erdma/agent:latest",
                dict(ORIGINAL_AGENT_LABELS, **{"app.kubernetes.io/instance": "old"}), "old"),
      json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "erdma"}})],
     {}, 'DaemonSet erdma/alibabacloud-erdma-agent (another eRDMA agent, release "old"'),
    ([daemonset("kube-system", "alibabacloud-erdma-agent", "ghcr.io/erdma/erdma-agent:0.1.0", ORIGINAL_AGENT_LABELS, "other")],
     {}, 'release "other"'),
    ([eni_config(True)], {}, "ConfigMap kube-system/eni-config eni_conf.enable_erdma=true"),
    ([eni_config(False)], {}, None),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiServer:
    """The lab's API server (erdma-fake-kubelet apiserver) on a free port, for real Helm."""

    def __init__(self, tmp: pathlib.Path, objects: list[dict] | None = None):
        self.kubeconfig = tmp / "kubeconfig"
        self.port = free_port()
        args = [os.environ.get("ERDMA_FAKE_KUBELET_BIN", ""), "apiserver", "--listen", f"127.0.0.1:{self.port}",
                "--kubeconfig", str(self.kubeconfig), "--node", "node-a"]
        if objects:
            path = tmp / "objects.json"
            path.write_text(json.dumps(objects))
            args += ["--objects", str(path)]
        # ERDMA_CHART_APISERVER_LOG=FILE (with RUST_LOG=debug): every request the server saw.
        log = os.environ.get("ERDMA_CHART_APISERVER_LOG")
        out = open(log, "a") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=out, stderr=out)
        for _ in range(100):
            if self.kubeconfig.exists():
                break
            time.sleep(0.1)

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"content-type": content_type})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"{}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def preflight() -> None:
    """The chart's pre-install check (templates/preflight.yaml) through the real Helm engine's
    `lookup` against the lab's API server (erdma-fake-kubelet apiserver) holding each case's
    objects: another installation serving aliyun/erdma is refused with its location named."""
    from helm_python.config import Config
    binary = os.environ.get("ERDMA_FAKE_KUBELET_BIN", "")
    if not binary or not os.access(binary, os.X_OK):
        fail(f"preflight: ERDMA_FAKE_KUBELET_BIN {binary!r} is not an executable (check.sh builds it)")
        return
    for i, (objects, values, words, *where) in enumerate(PREFLIGHT):
        namespace = where[0] if where else NAMESPACE
        with tempfile.TemporaryDirectory() as tmp:
            server = ApiServer(pathlib.Path(tmp), [json.loads(o) for o in objects])
            try:
                config = Config(kubeconfig_path=str(server.kubeconfig), namespace=namespace)
                try:
                    config.render(helm.Chart.load(str(CHART)), values, name=RELEASE, namespace=namespace, is_install=True)
                    got = None
                except HelmError as e:
                    got = str(e)
            finally:
                server.close()
        kinds = ", ".join(json.loads(o)["kind"] + " " + json.loads(o)["metadata"].get("namespace", "") + "/" + json.loads(o)["metadata"]["name"] for o in objects) or "nothing"
        if words is None and got is not None:
            fail(f"preflight[{i}] ({kinds}, {values}): refused: {got}")
        elif words is not None and (got is None or words not in got):
            fail(f"preflight[{i}] ({kinds}, {values}): want a refusal naming {words!r}, got {got!r}")
        else:
            print(f"ok   preflight[{i}] {kinds} {json.dumps(values)}: {'installs' if got is None else 'refused: ' + words}")


# The paths each controller's pods serve the webhook on: the original's registers only /mutating
# (its cmd/controller/main.go), erdma's serves /mutate-pod and /mutating (bins/erdma-controller/src/webhook.rs).
OLD_PODS_SERVE = {"/mutating"}
NEW_PODS_SERVE = {"/mutating", "/mutate-pod"}


def helm_action(config, action: str, chart: helm.Chart, values: dict, server_side: bool | str) -> None:
    """helm install/upgrade through the SDK's native call, with Helm's --server-side choice (the
    Python wrapper does not pass it; install takes a bool, upgrade true/false/auto): `False`
    installs as Helm 3 did (the original's users), and an
    upgrade of such a release is Helm's client-side three-way merge (`auto`)."""
    from helm_python import _native
    opts = {"namespace": NAMESPACE, "server_side_apply": server_side}
    _native.call_string(f"helm_{action}", config._raw(), _native.HANDLE(0), chart._raw(), None, RELEASE,
                        json.dumps(values), json.dumps(opts))


def refused_pods(mwc: dict, old_ca: str) -> tuple[int, list[str]]:
    """Pod creations the API server refuses per rollout phase (old controller pods only, both,
    new only; 10 pods each): with failurePolicy Fail, a CREATE of a pod matching an entry is
    refused when the call cannot succeed on the pod the Service routes it to: an old pod needs
    its CA in the entry's caBundle and its one path; a new pod its path (its CA is added by the
    erdma controller, tests/webhook.rs)."""
    refused, why = 0, []
    for w in mwc.get("webhooks") or []:
        if w.get("failurePolicy") != "Fail":
            continue
        path = w["clientConfig"]["service"].get("path", "/")
        bundle = w["clientConfig"].get("caBundle", "")
        old_ok = old_ca in bundle and path in OLD_PODS_SERVE
        new_ok = path in NEW_PODS_SERVE
        for phase, ok in (("old pods", old_ok), ("old and new pods", old_ok and new_ok), ("new pods", new_ok)):
            if not ok:
                refused += 10
                why.append(f"{w['name']} at {path} ({phase}): {'caBundle lacks the old CA' if old_ca not in bundle and 'old' in phase else 'path not served'}")
    return refused, why


def fail_policy_upgrade_run(chart_dir: pathlib.Path) -> tuple[dict, int, list[str]]:
    """The original's release (ci/upgrade/original-webhook-fail.yaml) installed by Helm as Helm 3
    did, its controller's CA patched into the webhook as the Go controller patches it (a
    strategic merge patch), then `helm upgrade` to the chart at chart_dir with the webhook on and
    failurePolicy Fail: the real Helm three-way merge against the lab's API server."""
    from helm_python.config import Config
    import base64
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        original = tmp / "original"
        (original / "templates").mkdir(parents=True)
        (original / "Chart.yaml").write_text("apiVersion: v2\nname: alibabacloud-erdma-controller\nversion: 0.1.0\nappVersion: \"1.16.0\"\n")
        shutil.copy(HERE / "upgrade" / "original-webhook-fail.yaml", original / "templates" / "original.yaml")
        server = ApiServer(tmp)
        try:
            config = Config(kubeconfig_path=str(server.kubeconfig), namespace=NAMESPACE, storage_driver="memory")
            helm_action(config, "install", helm.Chart.load(str(original)), {}, False)
            old_ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nthe original controller's CA\n-----END CERTIFICATE-----\n").decode()
            mwc_path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/alibabacloud-erdma-controller"
            before = server.request("GET", mwc_path)
            server.request("PATCH", mwc_path, {"webhooks": [{"name": w["name"], "clientConfig": {"caBundle": old_ca}} for w in before["webhooks"]]},
                           "application/strategic-merge-patch+json")
            values = {"config": {"enableWebhook": True}, "webhookFailurePolicy": "Fail", "credentials": {"type": "ecs_ram_role"}}
            helm_action(config, "upgrade", helm.Chart.load(str(chart_dir)), values, "auto")
            after = server.request("GET", mwc_path)
        finally:
            server.close()
    refused, why = refused_pods(after, old_ca)
    return after, refused, why


def fail_policy_upgrade() -> None:
    """The Fail-policy upgrade run, and the same run with the webhook entry renamed and moved (as
    erdma's chart had it) to show what the run catches."""
    after, refused, why = fail_policy_upgrade_run(CHART)
    entries = [(w["name"], w["clientConfig"]["service"].get("path"), bool(w["clientConfig"].get("caBundle")), w.get("failurePolicy")) for w in after["webhooks"]]
    if refused:
        fail(f"fail-policy upgrade: {refused} pod creations refused during the rollout: {why}; entries after the upgrade: {entries}")
    else:
        print(f"ok   fail-policy upgrade (helm install of the original as Helm 3, caBundle patched by its controller, helm upgrade: Helm's three-way merge): entries {entries}; 0 of 30 pod creations refused across the rollout")
    with tempfile.TemporaryDirectory() as tmp:
        renamed = pathlib.Path(tmp) / "erdma"
        shutil.copytree(CHART, renamed, ignore=shutil.ignore_patterns("ci"))
        helpers = renamed / "templates" / "_helpers.tpl"
        text = helpers.read_text()
        text = text.replace("alibabacloud-erdma-controller.mutating.k8s.io{{- end }}", "erdma-smcr.network.alibabacloud.com{{- end }}")
        text = text.replace('{{- define "erdma.webhookPath" -}}/mutating{{- end }}', '{{- define "erdma.webhookPath" -}}/mutate-pod{{- end }}')
        helpers.write_text(text)
        after, refused, why = fail_policy_upgrade_run(renamed)
    if refused == 0:
        fail(f"fail-policy upgrade control: a renamed and moved entry refused no pod, so the run cannot catch it: {after}")
    else:
        print(f"ok   fail-policy upgrade control (entry renamed to erdma-smcr.network.alibabacloud.com at /mutate-pod): {refused} of 30 pod creations refused ({'; '.join(why)})")


# What Helm knows of a cluster that serves ValidatingAdmissionPolicy (Kubernetes 1.30, the first
# release with admissionregistration.k8s.io/v1 policies and node claims in pod tokens).
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def render_for_cluster(chart: helm.Chart, values: dict, api_versions: list[str]) -> list[dict]:
    """An offline render as `helm template --kube-version 1.30.0 --api-versions ...` does it."""
    from helm_python import _native
    opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True,
            "kube_version": "v1.30.0", "api_versions": api_versions}
    out = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
    return [o for path in sorted(out) if not path.endswith("NOTES.txt")
            for o in (helm.values_from_yaml(d) for d in split_docs(out[path])) if o]


def agent_admission_policy(chart: helm.Chart, update: bool) -> None:
    """The agents' node-scope policy (templates/agent-admission-policy.yaml) as Helm renders it for a
    cluster serving ValidatingAdmissionPolicy, in ci/agent-admission-policy.json: erdma-agent's
    tests/admission_policy.rs evaluates its CEL against the agent's own writes. Not rendered
    where the API is not served, nor with agent.admissionPolicy.enabled=false."""
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    policy = [o for o in render_for_cluster(chart, {}, [VAP_API]) if o["kind"] in kinds]
    if sorted(o["kind"] for o in policy) != sorted(kinds):
        fail(f"agent admission policy: want a policy and its binding where {VAP_API} is served, got {[o['kind'] for o in policy]}")
    for values, api in (({}, []), ({"agent": {"admissionPolicy": {"enabled": False}}}, [VAP_API])):
        extra = [o["kind"] for o in render_for_cluster(chart, values, api) if o["kind"] in kinds]
        if extra:
            fail(f"agent admission policy: rendered with values {values} and API versions {api}: {extra}")
    text = json.dumps({"objects": policy}, indent=1, sort_keys=True) + "\n"
    target = HERE / "agent-admission-policy.json"
    if update:
        target.write_text(text)
    elif not target.exists() or target.read_text() != text:
        fail("agent admission policy: differs from the committed ci/agent-admission-policy.json (run deploy/helm/ci/check.sh --update and review the diff)")
    print(f"ok   agent admission policy: {len(policy)} objects where {VAP_API} is served, none where it is not or when disabled")

def agent_apparmor(chart: helm.Chart) -> None:
    """agent.appArmorProfile reaches the agent container on both sides of Kubernetes 1.30: the
    securityContext field from 1.30, the beta annotation before it (never both)."""
    from helm_python import _native
    key = "container.apparmor.security.beta.kubernetes.io/"
    for kube, want_field, want_ann in (("v1.29.0", None, "unconfined"), ("v1.30.0", {"type": "Unconfined"}, None)):
        opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "kube_version": kube}
        out = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps({}), json.dumps(opts)))
        ds = [o for path in sorted(out) if not path.endswith("NOTES.txt")
              for o in (helm.values_from_yaml(d) for d in split_docs(out[path])) if o and o.get("kind") == "DaemonSet"]
        if len(ds) != 1:
            fail(f"agent apparmor {kube}: {len(ds)} DaemonSets rendered")
            continue
        tpl = ds[0]["spec"]["template"]
        container = tpl["spec"]["containers"][0]
        field = container.get("securityContext", {}).get("appArmorProfile")
        # the API server refuses an AppArmor annotation naming a container the pod does not have
        ann = (tpl["metadata"].get("annotations") or {}).get(key + container["name"])
        if field != want_field or ann != want_ann:
            fail(f"agent apparmor {kube}: securityContext.appArmorProfile {field}, annotation {ann}; want {want_field}, {want_ann}")
        else:
            print(f"ok   agent apparmor {kube}: field {field}, annotation {ann}")


def webhook_scope(chart: helm.Chart) -> None:
    """Issue 45: the webhook sees only annotated pods outside kube-system and the release
    namespace, within 5 s; the controller has a PodDisruptionBudget with more than one replica,
    and its readiness probe is /readyz (503 until the webhook port serves)."""
    for ns in (NAMESPACE, "erdma-system"):
        for timeout, want_timeout in ((10, 5), (3, 3)):
            values = {"config": {"enableWebhook": True}, "credentials": {"type": "ecs_ram_role"},
                      "webhookTimeoutSeconds": timeout}
            out = chart.render(values, name=RELEASE, namespace=ns, is_install=True)
            objects = [o for p in sorted(out) if not p.endswith("NOTES.txt")
                       for o in (helm.values_from_yaml(d) for d in split_docs(out[p])) if o]
            where = f"webhook scope (namespace {ns}, webhookTimeoutSeconds {timeout})"
            hooks = [w for o in objects if o["kind"] == "MutatingWebhookConfiguration" for w in o["webhooks"]]
            if len(hooks) != 1:
                fail(f"{where}: want one webhook, got {len(hooks)}")
                continue
            w = hooks[0]
            skipped = sorted({"kube-system", ns})
            selector = (w.get("namespaceSelector") or {}).get("matchExpressions") or [{}]
            exprs = [c.get("expression", "") for c in w.get("matchConditions") or []]
            pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
            deploy = [o for o in objects if o["kind"] == "Deployment"]
            probe = deploy[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] if deploy else None
            problems = []
            if w.get("timeoutSeconds") != want_timeout:
                problems.append(f"timeoutSeconds {w.get('timeoutSeconds')}, want {want_timeout}")
            if len(selector) != 1 or selector[0].get("key") != "kubernetes.io/metadata.name" \
                    or selector[0].get("operator") != "NotIn" or sorted(selector[0].get("values") or []) != skipped:
                problems.append(f"namespaceSelector {w.get('namespaceSelector')}, want kubernetes.io/metadata.name NotIn {skipped}")
            if exprs != ["has(object.metadata.annotations) && 'network.alibabacloud.com/erdma-smcr' in object.metadata.annotations"]:
                problems.append(f"matchConditions {exprs}")
            if len(pdbs) != 1 or pdbs[0]["spec"].get("maxUnavailable") != 1 or pdbs[0]["metadata"]["namespace"] != ns:
                problems.append(f"PodDisruptionBudget {pdbs}")
            if probe != "/readyz":
                problems.append(f"readinessProbe path {probe}")
            if problems:
                fail(f"{where}: {'; '.join(problems)}")
            else:
                print(f"ok   {where}: matchConditions, namespaceSelector NotIn {skipped}, timeoutSeconds {want_timeout}, PDB maxUnavailable 1, readiness /readyz")
    one = {"config": {"enableWebhook": True}, "credentials": {"type": "ecs_ram_role"}, "controller": {"replicaCount": 1}}
    objects, _ = render(chart, one)
    if any(o["kind"] == "PodDisruptionBudget" for o in objects):
        fail("webhook scope: a PodDisruptionBudget with one controller replica (it would only block drains)")
    else:
        print("ok   webhook scope: no PodDisruptionBudget with one replica")


def main() -> int:
    update = "--update" in sys.argv[1:]
    chart = helm.Chart.load(str(CHART))
    defaults = load_yaml(CHART / "values.yaml")
    cases = sorted((HERE / "values").glob("*.yaml"))
    names = {c.stem for c in cases}
    for b in booleans(defaults, json.loads((CHART / "values.schema.json").read_text())):
        if f"flip-{b}" not in names:
            fail(f"matrix: no ci/values/flip-{b}.yaml for the boolean {b}")
    out_dir = HERE / "rendered"
    out_dir.mkdir(exist_ok=True)
    seen = set()
    for case in cases:
        values = load_yaml(case)
        report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
        bad = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] + [
            {"error": e} for e in report.get("errors") or []
        ]
        for m in bad:
            fail(f"lint --strict {case.name}: {m.get('path', '')} {m['error']}")
        try:
            objects, notes = render(chart, values)
        except HelmError as e:
            fail(f"render {case.name}: {e}")
            continue
        text = json.dumps({"values": case.name, "objects": objects, "notes": notes}, indent=1, sort_keys=True) + "\n"
        target = out_dir / f"{case.stem}.json"
        seen.add(target.name)
        if update:
            target.write_text(text)
        elif not target.exists() or target.read_text() != text:
            fail(f"render {case.name}: differs from the committed {target.relative_to(CHART)} (run deploy/helm/ci/check.sh --update and review the diff)")
        no_secret_creation(case.name, objects)
        kinds = sorted({o["kind"] for o in objects})
        print(f"ok   lint+render {case.name}: {len(objects)} objects ({', '.join(kinds)}); {len(bad)} lint findings")
    for stale in out_dir.glob("*.json"):
        if stale.name not in seen:
            if update:
                stale.unlink()
            else:
                fail(f"{stale.relative_to(CHART)} has no values file")
    upgrade_identity(chart)
    refused(chart)
    contract(chart, update)
    preflight()
    fail_policy_upgrade()
    refused_without_schema()
    smc_init_images(chart)
    agent_admission_policy(chart, update)
    webhook_scope(chart)
    agent_apparmor(chart)
    if failures:
        print(f"\n{len(failures)} failed")
        return 1
    print("\nchart check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
