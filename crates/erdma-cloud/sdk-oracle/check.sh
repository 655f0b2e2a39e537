#!/usr/bin/env bash
# Regenerates the SDK-derived test data of erdma-cloud from the official Alibaba Cloud SDKs
# (requirements.txt, from PyPI, into a venv under ~/.cache/erdma/, never into the repository) and
# checks the committed files equal what the SDKs produce now.
#   check.sh           compare; exit 1 with a diff when they differ; then run the official ECS client
#                      against the emulator (examples/ecs_emulator.rs, built with cargo)
#   check.sh --write   overwrite testdata/ with the regenerated files
# Needs python3 (with venv) and network access to PyPI on the first run; later runs are offline.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="$here/../testdata"
venv="${ERDMA_SDK_ORACLE_VENV:-${HOME:-/root}/.cache/erdma/sdk-oracle-venv}"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
  echo "$want" >"$stamp"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$venv/bin/python" "$here/gen_params.py" "$out/ecs-2014-05-26-params.json"
"$venv/bin/python" "$here/gen_vectors.py" "$out/signature-vectors.json"
status=0
for f in ecs-2014-05-26-params.json signature-vectors.json; do
  if [ "${1:-}" = --write ]; then
    cp "$out/$f" "$data/$f"
  elif ! diff -u "$data/$f" "$out/$f"; then
    echo "sdk-oracle: testdata/$f differs from what the official SDK generates (above); run $0 --write and review" >&2
    status=1
  fi
done
[ "$status" = 0 ] && [ "${1:-}" != --write ] && echo "sdk-oracle: testdata matches the official SDKs ($(grep -v '^#' "$here/requirements.txt" | tr '\n' ' '))"
[ "$status" = 0 ] || exit "$status"
# The official client against the emulator over HTTP (V3 and V2): the emulator's verifier and
# parameter check accept what the SDK itself sends, and refuse a wrong secret / undefined name.
if [ "${1:-}" != --write ]; then
  (cd "$here/.." && cargo build -q --locked -p erdma-cloud --features emulator --example ecs_emulator)
  target="$(cd "$here/.." && cargo metadata -q --no-deps --format-version 1 | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  "$venv/bin/python" "$here/official_client.py" "$target/debug/examples/ecs_emulator"
fi
