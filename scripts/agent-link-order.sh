#!/usr/bin/env bash
# Regenerates bins/erdma-agent/link-order.txt: the order in which the linker places the agent's
# functions (bins/erdma-agent/build.rs passes it to LLD as --symbol-ordering-file).
#
# The agent bench runs the shipped agent (cargo profile `agent`) under callgrind, which records
# every function a process runs. Each agent's profile is dumped 25 s after its start (the bench
# lets start-up settle for 13 s, then idles), so a run splits into what start-up ran and what the
# agent ran afterwards (the idle loop, device flips through inotify, kubelet restarts, shutdown).
# The file names the functions the agent ran afterwards first, then those only start-up ran,
# each group in the binary's current address order: the idle loop then maps a few 64 KiB windows
# of the text, start-up the ~3 MiB it runs, instead of windows spread over the whole text.
#
# Run it after changes that move the agent's start-up or idle code (a new dependency version,
# a refactor of the main loop): a stale file still links (missing names are skipped, new
# functions placed after the ordered ones), only less of the code stays together; the agent
# bench prints how many of the named functions the binary has. Needs valgrind (installed here
# from Debian when missing) and the bench's build dependencies (scripts/host-deps.sh).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
  echo "agent-link-order.sh: installing valgrind" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >&2
fi
TARGET_DIR=$(cargo metadata --no-deps --format-version 1 \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cargo build --locked -q --profile agent -p erdma-agent --features bpf --bin erdma-agent
AGENT=$TARGET_DIR/agent/erdma-agent

WORK=$(mktemp -d /tmp/agent-link-order.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/profiles"
cp "$AGENT" "$WORK/erdma-agent"
# The bench starts this wrapper as the agent; exec keeps the PID it signals.
cat > "$WORK/agent-under-callgrind" <<WRAP
#!/usr/bin/env bash
( sleep 25; callgrind_control --dump \$\$ >/dev/null 2>&1 ) &
exec valgrind --tool=callgrind --demangle=no --dump-instr=no \\
  --callgrind-out-file=$WORK/profiles/callgrind.%p $WORK/erdma-agent "\$@"
WRAP
chmod +x "$WORK/agent-under-callgrind"
echo "agent-link-order.sh: agent bench under callgrind (a few minutes)" >&2
ERDMA_AGENT_BIN=$WORK/agent-under-callgrind ERDMA_BENCH_IDLE_S=20 \
  cargo bench -q -p erdma-agent --features bpf --bench agent > "$WORK/bench.log" 2>&1 \
  || { tail -20 "$WORK/bench.log" >&2; echo "agent-link-order.sh: the bench failed" >&2; exit 1; }
python3 "$REPO/scripts/agent-link-order.py" "$WORK/erdma-agent" "$WORK/profiles" \
  "$REPO/bins/erdma-agent/link-order.txt"
