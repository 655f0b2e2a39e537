#!/usr/bin/env bash
# CI check of the example workload: 2 processes, gloo on CPU, a few dozen steps; fails unless the
# loss decreases and rank 0 prints its TRAIN_RESULT line. Then checks that `erdmactl nccl compare`
# reads the run's figures: with the erdmactl binary given as ERDMACTL=path, or else the one it builds
# with `cargo build -p erdmactl` (in cargo's target directory, which honours CARGO_TARGET_DIR).
#
# Needs python3 with venv (Debian: apt-get install python3-venv) and plain PyPI. torch comes from
# PyPI: its Linux x86_64 wheels are CUDA builds that also run on CPU, but they pull the CUDA
# libraries (about 4-5 GB installed). The venv is cached in $TORCH_VENV (default
# ~/.cache/erdma/torch-venv) so that later runs skip the download.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/erdma/torch-venv}"
torch_spec="${TORCH_SPEC:-torch}"
steps="${STEPS:-40}"

if ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    echo "ci-test: installing $torch_spec from PyPI into $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet --no-cache-dir "$torch_spec" numpy
    echo "ci-test: torch installed in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
fi
"$venv/bin/python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(); print("ci-test: torch", torch.__version__)'

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# No GPU in CI; hide any that exist so the run is the same everywhere.
CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 "$venv/bin/python" -m torch.distributed.run \
    --standalone --nproc-per-node 2 \
    "$here/train.py" --backend gloo --steps "$steps" --log-every 10 --check-loss-decreases 2>&1 | tee "$log"

result="$(grep '^TRAIN_RESULT ' "$log" | tail -n 1 | cut -d' ' -f2-)"
test -n "$result" || { echo "ci-test: no TRAIN_RESULT line" >&2; exit 1; }
"$venv/bin/python" - "$result" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
assert r["world"] == 2 and r["backend"] == "gloo", r
assert r["loss_last"] < r["loss_first"], r
print(f"ci-test: OK, loss {r['loss_first']} -> {r['loss_last']} over {r['steps']} steps, {r['step_ms_mean']} ms/step")
PY

erdmactl="${ERDMACTL:-}"
if [ -z "$erdmactl" ]; then
    repo="$(cd "$here/../.." && pwd)"
    (cd "$repo" && cargo build -q -p erdmactl) || { echo "ci-test: cargo build -p erdmactl failed" >&2; exit 1; }
    target="$(cd "$repo" && cargo metadata --no-deps --format-version 1 | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
    erdmactl="$target/debug/erdmactl"
fi
test -x "$erdmactl" || { echo "ci-test: no erdmactl binary at $erdmactl" >&2; exit 1; }
"$erdmactl" nccl compare -o json "$log" "$log" | "$venv/bin/python" -c '
import json, sys
c = json.load(sys.stdin)
assert c["steps"] is not None and c["steps"]["a_ms"] > 0, c
print("ci-test: erdmactl nccl compare read step time", c["steps"]["a_ms"], "ms")'
echo "ci-test: erdmactl check ran with $erdmactl"
