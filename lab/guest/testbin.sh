# Guest helper: run a cargo test binary in the lab VM and check libtest's counts (sourced by
# dash, after lib.sh).
#
# test_binary LABEL BIN [FILTER | --skip NAME]...
#   Runs BIN --include-ignored --test-threads=1 --nocapture with the filters: every selected
#   test, the #[ignore]d ones too (they are ignored elsewhere because they need this VM: root on a
#   disposable host, SMC, no SMC, BPF, a kernel module). A test that needs the opposite of this VM
#   is left out by the caller with --skip, never by the test itself.
#   It is one check (ck), and it fails when a test fails, when a selected test stays ignored (not
#   run), when no test runs, when no #[ignore]d test runs, or when a test prints a SKIP line.
#   Records in $OUT/tests.txt:
#     TESTS: SCEN LABEL passed=P failed=F ignored=I ignored_ran=R
#     RAN-IGNORED: SCEN NAME        (each #[ignore]d test that ran and passed here)
#   The full output is in $OUT/SCEN-LABEL-tests.txt. Sets TB_IGNORED_RAN.
test_binary() {
  _tb_label=$1; _tb_bin=$2; shift 2
  _tb_out="$OUT/$SCEN-$_tb_label-tests.txt"
  "$_tb_bin" --list --ignored "$@" 2>/dev/null | sed -n 's/: test$//p' > /tmp/tb-ignored.txt
  TB_IGNORED_RAN=$(wc -l < /tmp/tb-ignored.txt)
  RUST_BACKTRACE=1 "$_tb_bin" --include-ignored --test-threads=1 --nocapture "$@" > "$_tb_out" 2>&1
  _tb_rc=$?
  _tb_res=$(grep '^test result: ' "$_tb_out" | tail -n 1)
  _tb_p=$(echo "$_tb_res" | sed -n 's/.* \([0-9][0-9]*\) passed;.*/\1/p')
  _tb_f=$(echo "$_tb_res" | sed -n 's/.* \([0-9][0-9]*\) failed;.*/\1/p')
  _tb_i=$(echo "$_tb_res" | sed -n 's/.* \([0-9][0-9]*\) ignored;.*/\1/p')
  _tb_skips=$(grep -cE '^(SKIP|skipping)' "$_tb_out")
  echo "TESTS: $SCEN $_tb_label passed=${_tb_p:-0} failed=${_tb_f:-?} ignored=${_tb_i:-?} ignored_ran=$TB_IGNORED_RAN" >> "$OUT/tests.txt"
  grep -E '^test .* \.\.\. |^test result' "$_tb_out" | sed 's/^/    /'
  _tb_why=
  [ "$_tb_rc" = 0 ] || _tb_why="exit $_tb_rc"
  [ -n "$_tb_res" ] || _tb_why="${_tb_why:+$_tb_why, }no libtest result line"
  [ "${_tb_f:-1}" = 0 ] || _tb_why="${_tb_why:+$_tb_why, }${_tb_f:-?} failed"
  [ "${_tb_i:-1}" = 0 ] || _tb_why="${_tb_why:+$_tb_why, }${_tb_i:-?} left ignored"
  [ "${_tb_p:-0}" -gt 0 ] || _tb_why="${_tb_why:+$_tb_why, }no test ran"
  [ "$TB_IGNORED_RAN" -gt 0 ] || _tb_why="${_tb_why:+$_tb_why, }no #[ignore]d test selected"
  [ "$_tb_skips" = 0 ] || _tb_why="${_tb_why:+$_tb_why, }$_tb_skips SKIP line(s)"
  _tb_what="$_tb_label tests on $(uname -r): ${_tb_p:-0} passed (${TB_IGNORED_RAN} of them #[ignore]d, run here), ${_tb_f:-?} failed, ${_tb_i:-?} ignored"
  if [ -z "$_tb_why" ]; then
    good "$_tb_what"
    sed "s/^/RAN-IGNORED: $SCEN /" /tmp/tb-ignored.txt >> "$OUT/tests.txt"
  else
    bad "$_tb_what: $_tb_why (see out/$SCEN-$_tb_label-tests.txt)"
    grep -E 'panicked|^---- ' "$_tb_out" | head -n 20 | sed 's/^/        | /'
  fi
}
