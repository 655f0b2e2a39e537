#!/usr/bin/env python3
"""Writes a CycloneDX 1.5 SBOM (JSON) of an erdma binary or image: the crates compiled into the
given binaries (the workspace's normal dependencies on the target platform, from `cargo metadata`,
with their licences and Cargo.lock checksums) and the Debian packages an image's root tree records
in var/lib/dpkg/status.d/ (as scripts/build-images.sh writes them).

  scripts/sbom.py --name erdmactl --version 0.1.0 --package erdmactl [--target TRIPLE] > out.cdx.json
  scripts/sbom.py --name erdma-agent --version 0.1.0 --package erdma-agent --package erdmactl \
      --package smcr-init --rootfs DIR > erdma-agent.cdx.json

The output is reproducible: the timestamp is SOURCE_DATE_EPOCH (or 0), the serial number is a
UUID derived from the content, components are sorted.
"""

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

def cargo_metadata(target):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def lock_checksums(root):
    """name@version -> sha256 of the .crate, as Cargo.lock records it."""
    with open(Path(root) / "Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    return {f"{p['name']}@{p['version']}": p["checksum"] for p in lock["package"] if "checksum" in p}


def crate_closure(meta, packages):
    """The packages linked into the named workspace packages: normal dependencies, followed
    transitively (build scripts and proc macros run at build time and are left out)."""
    by_id = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [p["id"] for p in meta["packages"] if p["name"] in packages and p["source"] is None]
    missing = set(packages) - {by_id[r]["name"] for r in roots}
    if missing:
        sys.exit(f"sbom: no workspace package named {', '.join(sorted(missing))}")
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen or any("proc-macro" in t["kind"] for t in by_id[pid]["targets"]):
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            # dep_kinds' kind: null for a normal dependency, "build" or "dev" otherwise.
            if any(k["kind"] is None for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    return [by_id[pid] for pid in seen]


def crate_component(p, sums):
    key = f"{p['name']}@{p['version']}"
    c = {
        "type": "library",
        "bom-ref": f"pkg:cargo/{key}",
        "name": p["name"],
        "version": p["version"],
        "purl": f"pkg:cargo/{key}",
    }
    if p.get("license"):
        c["licenses"] = [{"expression": p["license"].replace("/", " OR ")}]
    if key in sums:
        c["hashes"] = [{"alg": "SHA-256", "content": sums[key]}]
    if p["source"] is None:
        c["type"] = "application" if any("bin" in t["kind"] for t in p["targets"]) else "library"
        del c["purl"]
        c["bom-ref"] = f"erdma/{p['name']}@{p['version']}"
    return c


def debian_components(rootfs):
    """One component per status file in ROOTFS/var/lib/dpkg/status.d."""
    out = []
    status_dir = Path(rootfs) / "var/lib/dpkg/status.d"
    if not status_dir.is_dir():
        sys.exit(f"sbom: {status_dir} is missing: --rootfs names an image root tree "
                 "(scripts/build-images.sh --stage DIR writes them)")
    for f in sorted(status_dir.iterdir()):
        fields = {}
        for line in f.read_text().splitlines():
            if ":" in line and not line.startswith(" "):
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        name, version, arch = fields.get("Package"), fields.get("Version"), fields.get("Architecture")
        if not (name and version and arch):
            sys.exit(f"sbom: {f} lacks Package, Version or Architecture")
        purl = f"pkg:deb/debian/{name}@{version}?arch={arch}"
        c = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        if fields.get("Homepage"):
            c["externalReferences"] = [{"type": "website", "url": fields["Homepage"]}]
        out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="the image or binary the SBOM describes")
    ap.add_argument("--version", required=True)
    ap.add_argument("--package", action="append", required=True,
                    help="a workspace package whose binaries it holds (repeatable)")
    ap.add_argument("--target", default="x86_64-unknown-linux-gnu")
    ap.add_argument("--rootfs", help="an image root tree: adds its Debian packages")
    ap.add_argument("--type", default=None, help="container or application (default: container with --rootfs)")
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    os.chdir(root)
    meta = cargo_metadata(a.target)
    sums = lock_checksums(root)
    components = [crate_component(p, sums) for p in crate_closure(meta, set(a.package))]
    if a.rootfs:
        components += debian_components(a.rootfs)
    components.sort(key=lambda c: c["bom-ref"])
    kind = a.type or ("container" if a.rootfs else "application")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": stamp,
            "tools": {"components": [{"type": "application", "name": "erdma scripts/sbom.py"}]},
            "component": {"type": kind, "bom-ref": f"erdma/{a.name}@{a.version}",
                          "name": a.name, "version": a.version},
        },
        "components": components,
    }
    digest = hashlib.sha256(json.dumps(bom, sort_keys=True).encode()).hexdigest()
    bom["serialNumber"] = f"urn:uuid:{uuid.UUID(digest[:32], version=4)}"
    json.dump(bom, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
