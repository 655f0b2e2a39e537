#!/usr/bin/env bash
# The project's test command (README, second set-up command; `.ci/run` calls it).
# Installs what the tests need on a fresh Debian 12 machine, then runs, in order:
#   rustfmt check, clippy -D warnings, every workspace test, the fuzz tests again with more cases
#   (tests/fuzz_*.rs: parsers fed arbitrary and mutated input), the #[ignore]d tests that need root
#   (run here with --ignored; CI runs as root), the ECS SDK, Helm and deploy lint checks, the
#   three images (scripts/build-images.sh), the example training script, and the lab scenarios
#   on real kernels (which also run the #[ignore]d tests of the `::lab::` modules in the VMs).
# Every stage runs even after an earlier one failed; the last line is one summary of all counts,
# and the exit status is non-zero when any stage failed or an #[ignore]d test ran nowhere.
# Set ERDMA_SKIP_LAB=1 to skip the lab (it needs ~1 GB of downloads on first run and qemu); the
# summary then lists it, and the #[ignore]d lab tests, as skips.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# Keep build output outside the clone so repeated runs (and CI on a machine that built before)
# reuse it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/erdma/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A clean clone gains nothing from incremental state, and it is the largest part of a debug target.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# The kept target dir grows with every toolchain, lockfile and feature set it has seen; a full run
# needs about ERDMA_MIN_FREE_GB on its filesystem. When less is free, the old build output goes
# (a cold build costs minutes; running out of disk half-way fails the whole run).
min_free_gb=${ERDMA_MIN_FREE_GB:-16}
free_gb() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
mkdir -p "$CARGO_TARGET_DIR"
if [ "$(free_gb "$CARGO_TARGET_DIR")" -lt "$min_free_gb" ]; then
  printf '==> %s GiB free for %s, below %s GiB: removing its old build output (%s)\n' \
    "$(free_gb "$CARGO_TARGET_DIR")" "$CARGO_TARGET_DIR" "$min_free_gb" "$(du -sh "$CARGO_TARGET_DIR" | cut -f1)"
  rm -rf "$CARGO_TARGET_DIR" && mkdir -p "$CARGO_TARGET_DIR"
  if [ "$(free_gb "$CARGO_TARGET_DIR")" -lt "$min_free_gb" ]; then
    printf '==> WARNING: still only %s GiB free for %s (a full run needs about %s GiB); free disk space or set CARGO_TARGET_DIR to a larger filesystem\n' \
      "$(free_gb "$CARGO_TARGET_DIR")" "$CARGO_TARGET_DIR" "$min_free_gb"
  fi
fi

# One installer for the host's needs, shared with lab/demo.sh (the lab installs its own group
# when it runs: lab/run.sh and lab/demo.sh call the same script).
groups=(build test)
[ "${ERDMA_SKIP_LAB:-0}" = 1 ] || groups+=(lab)
bash scripts/host-deps.sh "${groups[@]}"

LOGS=$(mktemp -d /tmp/erdma-test.XXXXXX)
failures=()
# stage NAME CMD...: runs CMD, its output also in $LOGS/NAME.log; a failure is recorded and the
# script goes on with the next stage.
stage() {
  local name=$1; shift
  log "$name"
  "$@" 2>&1 | tee "$LOGS/$name.log" || failures+=("$name")
}
# libtest_sum LOG: "PASSED FAILED IGNORED", summed over libtest's `test result:` lines.
libtest_sum() {
  awk '/^test result: / { for (i = 2; i < NF; i++) {
         if ($(i + 1) ~ /^passed;/) p += $i; if ($(i + 1) ~ /^failed;/) f += $i
         if ($(i + 1) ~ /^ignored;/) g += $i } }
       END { printf "%d %d %d\n", p, f, g }' "$1"
}
# The test targets: libraries, binaries and integration tests (doc tests have no #[ignore]d ones).
targets=(--workspace --all-features --locked --lib --bins --tests)

stage rustfmt cargo fmt --all --check

stage clippy cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

# No two files import each other anywhere (docs/design.md's crate map is the picture).
stage imports python3 scripts/imports.py
# docs/design.md's crate map (arrows and "May be called by") agrees with the Cargo.toml files.
stage crate-map python3 scripts/crate_map.py

stage cargo-test cargo test --workspace --all-features --locked --no-fail-fast
read -r t_pass t_fail t_ign < <(libtest_sum "$LOGS/cargo-test.log")

# The fuzz targets (tests/fuzz_*.rs of each crate: NCCL logs, sysfs values, values files,
# annotations, ERdmaDevice objects, kubelet/NRI protobuf and framing) again with more cases than
# the cargo-test stage's defaults; ERDMA_FUZZ_CASES changes it (docs/testing.md).
fuzz_cases=${ERDMA_FUZZ_CASES:-2000}
stage fuzz env PROPTEST_CASES="$fuzz_cases" cargo test --workspace --all-features --locked --no-fail-fast --test 'fuzz_*'
read -r z_pass z_fail _ < <(libtest_sum "$LOGS/fuzz.log")
if [ "$z_pass" = 0 ] && [[ ! " ${failures[*]} " =~ " fuzz " ]]; then echo "FAIL: no fuzz test ran"; failures+=(fuzz); fi

# #[ignore]d tests that need root (namespaces, veth, mknod) or a kernel without SMC: this host.
# Those in `::lab::` modules need a lab VM (BPF, SMC, kernel modules): lab/ci.sh runs them.
stage ignored-on-host cargo test "${targets[@]}" --no-fail-fast -- --ignored --skip ::lab::
read -r h_pass h_fail _ < <(libtest_sum "$LOGS/ignored-on-host.log")
if [ "$h_pass" = 0 ] && [[ ! " ${failures[*]} " =~ " ignored-on-host " ]]; then
  echo "FAIL: no #[ignore]d test ran on this host"; failures+=(ignored-on-host)
fi
# The #[ignore]d tests only the lab VMs can run (names, checked against what lab/ci.sh ran).
{ cargo test "${targets[@]}" -q -- --list --ignored ::lab:: 2>/dev/null || true; } \
  | sed -n 's/: test$//p' | sort -u > "$LOGS/lab-only.txt"
lab_only=$(wc -l < "$LOGS/lab-only.txt")

# Checked against someone else's truth: the official Alibaba Cloud SDKs (ECS parameter names and
# signatures) and the real Helm engine (lint, render matrix, upgrade identity), both from PyPI.
stage ecs-sdk bash crates/erdma-cloud/sdk-oracle/check.sh
stage helm bash deploy/helm/ci/check.sh
# The workflows and Dockerfiles (actionlint, shellcheck, hadolint) and the Dockerfiles' agreement
# with scripts/build-images.sh.
stage lint-deploy bash scripts/lint-deploy.sh
# The images operators deploy, built as the release workflow builds them (no daemon, no base
# image), twice with identical digests; the lab's chart scenario runs the agent's.
stage images bash scripts/build-images.sh
# Licences, banned crates and sources (cargo deny, deny.toml), and the CycloneDX SBOMs of erdmactl
# and of the images just built, validated against the schema.
stage supply-chain bash scripts/supply-chain.sh

stage example bash examples/pytorch-mnist/ci-test.sh

l_pass=- l_fail=- l_ign=0 l_where="" lab_note=""
if [ "${ERDMA_SKIP_LAB:-0}" != 1 ]; then
  stage lab bash lab/ci.sh
  if counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$LOGS/lab.log" | tail -n 1) && [ -n "$counts" ]; then
    l_pass=${counts%% passed*}; l_fail=${counts#*, }; l_fail=${l_fail%% failed}
  fi
  where=$(sed -n 's/^ignored tests run in lab VMs: //p' "$LOGS/lab.log" | tail -n 1)
  l_ign=${where%% *}; l_ign=${l_ign:-0}; l_where=${where#* }
  sed -n 's/^RAN-IGNORED: [^ ]* //p' "$LOGS/lab.log" | sort -u > "$LOGS/lab-ran.txt"
  missing=$(comm -23 "$LOGS/lab-only.txt" "$LOGS/lab-ran.txt")
  if [ -n "$missing" ]; then
    echo "FAIL: #[ignore]d lab tests that did not run and pass in any lab VM:"; printf '  %s\n' $missing
    failures+=(lab-ignored)
  fi
  lab_missing=$(printf '%s' "$missing" | grep -c . || true)
else
  log "lab scenarios skipped (ERDMA_SKIP_LAB=1)"
  lab_missing=$lab_only lab_note="lab skipped (ERDMA_SKIP_LAB=1), $lab_only #[ignore]d lab tests not run"
fi

# Every #[ignore]d test of the cargo-test stage ran on this host or is a lab one.
unrun=$((t_ign - h_pass - h_fail - lab_only))
if [ "$unrun" -gt 0 ]; then
  echo "FAIL: $unrun #[ignore]d tests ran neither on this host nor in a lab VM"; failures+=(ignored-unrun)
fi
skips=$(( (unrun > 0 ? unrun : 0) + lab_missing ))
printf '\n==> build output: %s in %s, %s GiB free there\n' "$(du -sh "$CARGO_TARGET_DIR" | cut -f1)" \
  "$CARGO_TARGET_DIR" "$(free_gb "$CARGO_TARGET_DIR")"
verdict() { if [[ " ${failures[*]} " =~ " $1 " ]]; then echo FAILED; else echo ok; fi; }
example=$(verdict example)
lab="$l_pass passed, $l_fail failed"; [ -n "$lab_note" ] && lab=skipped
status=ok; [ ${#failures[@]} -gt 0 ] && status="FAILED (${failures[*]})"
printf '\nSUMMARY: %s | cargo test: %s passed, %s failed, %s ignored | fuzz (%s cases): %s passed, %s failed | #[ignore]d on this host: %s passed, %s failed | #[ignore]d lab tests: %s of %s passed in a VM (%s runs%s) | ECS SDK oracle: %s | Helm chart: %s | deploy lint: %s | images: %s | example training script: %s | lab scenarios: %s | skips: %s%s\n' \
  "$status" "$t_pass" "$t_fail" "$t_ign" "$fuzz_cases" "$z_pass" "$z_fail" "$h_pass" "$h_fail" "$((lab_only - lab_missing))" "$lab_only" \
  "$l_ign" "${l_where:+: ${l_where:1:-1}}" "$(verdict ecs-sdk)" "$(verdict helm)" "$(verdict lint-deploy)" "$(verdict images)" "$example" "$lab" "$skips" "${lab_note:+ ($lab_note)}"
[ ${#failures[@]} -eq 0 ]
