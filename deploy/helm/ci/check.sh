#!/usr/bin/env bash
# Renders and lints the chart (deploy/helm) with the real Helm engine and runs the upgrade-identity
# check; see check.py. Installs helm-python-sdk from PyPI into a venv outside the repository
# ($HELM_VENV, default ~/.cache/erdma/helm-venv) on first use. `--update` rewrites ci/rendered/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${HELM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/erdma/helm-venv}"
spec="${HELM_SDK_SPEC:-helm-python-sdk==0.2.2}"
if ! "$venv/bin/python" -c 'import helm_python.chart' >/dev/null 2>&1; then
    echo "chart check: installing $spec into $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
fi
# The chart's pre-install check runs Helm's lookup against the lab's API server.
root="$(cd "$here/../../.." && pwd)"
if [ -z "${ERDMA_FAKE_KUBELET_BIN:-}" ]; then
    (cd "$root" && cargo build --quiet --locked -p erdma-fake-kubelet --bin erdma-fake-kubelet)
    export ERDMA_FAKE_KUBELET_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/erdma-fake-kubelet"
fi
exec "$venv/bin/python" "$here/check.py" "$@"
