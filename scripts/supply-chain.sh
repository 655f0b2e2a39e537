#!/usr/bin/env bash
# The supply-chain checks (scripts/test.sh stage `supply-chain`):
#   1. cargo deny (deny.toml): licences, banned crates and sources of the whole dependency graph.
#      Advisories are not checked: the RustSec advisory data is published only as a git
#      repository, which CI cannot reach (docs/testing.md, "Supply chain").
#   2. SBOMs (scripts/sbom.py): erdmactl's, written here, and the images' that
#      scripts/build-images.sh wrote into target/images (when that stage ran), each validated
#      against the CycloneDX 1.5 JSON schema by cyclonedx-python-lib (PyPI, pinned, in a venv
#      outside the repository) and checked to list crates (and, for an image, Debian packages).
#      A deliberately broken SBOM must be rejected, so a validator that accepts anything fails.
# Exits 1 when any check failed (each one runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${ERDMA_SBOM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/erdma/sbom-venv}"
requirement='cyclonedx-python-lib[json-validation]==11.12.0'
if [ "$(cat "$venv/erdma-requirements.txt" 2>/dev/null)" != "$requirement" ]; then
  echo "supply-chain: installing $requirement into $venv"
  rm -rf "$venv"; mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$requirement"
  printf '%s' "$requirement" > "$venv/erdma-requirements.txt"
fi

failures=()
run() {
  local name=$1; shift
  echo "==> $name"
  "$@" || failures+=("$name")
}

run cargo-deny cargo deny --locked check licenses bans sources

out=$(mktemp -d /tmp/erdma-sbom.XXXXXX)
trap 'rm -rf "$out"' EXIT
version=$(sed -n '/^\[workspace.package\]/,/^\[/{s/^version *= *"\(.*\)"/\1/p}' Cargo.toml | head -n 1)
run sbom-erdmactl sh -c "python3 scripts/sbom.py --name erdmactl --version '$version' --package erdmactl > '$out/erdmactl.cdx.json'"
shopt -s nullglob
images=(target/images/*.cdx.json)
shopt -u nullglob
[ ${#images[@]} -gt 0 ] || echo "supply-chain: no image SBOMs in target/images (scripts/build-images.sh did not run): only erdmactl's is checked"

run sbom-schema "$venv/bin/python" - "$out/erdmactl.cdx.json" "${images[@]}" <<'EOF'
import copy, json, sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

validator = JsonStrictValidator(SchemaVersion.V1_5)
bad = 0
for path in sys.argv[1:]:
    text = open(path).read()
    bom = json.loads(text)
    error = validator.validate_str(text)
    purls = [c.get("purl", "") for c in bom.get("components", [])]
    crates = sum(p.startswith("pkg:cargo/") for p in purls)
    debs = sum(p.startswith("pkg:deb/debian/") for p in purls)
    image = bom["metadata"]["component"]["type"] == "container"
    problems = []
    if error is not None:
        problems.append(f"not valid CycloneDX 1.5: {error}")
    if crates < 20:
        problems.append(f"only {crates} crates listed")
    if image and debs == 0:
        problems.append("an image without Debian packages (var/lib/dpkg/status.d)")
    if not image and debs:
        problems.append(f"a binary listing {debs} Debian packages")
    print(f"{path}: {crates} crates, {debs} Debian packages"
          + ("" if not problems else ": " + "; ".join(problems)))
    bad += bool(problems)
    # The validator itself: a component without a name must be rejected.
    broken = copy.deepcopy(bom)
    del broken["components"][0]["name"]
    if validator.validate_str(json.dumps(broken)) is None:
        print(f"{path}: the schema validator accepted a component without a name")
        bad += 1
sys.exit(1 if bad else 0)
EOF

if [ ${#failures[@]} -gt 0 ]; then
  echo "supply-chain: FAILED: ${failures[*]}"
  exit 1
fi
echo "supply-chain: ok (cargo deny: licenses, bans, sources; $((1 + ${#images[@]})) SBOMs valid)"
