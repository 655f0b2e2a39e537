#!/usr/bin/env python3
"""Writes a large NCCL log for the `nccl analyze` benchmark: the project's real and synthetic
fixtures, re-labelled as many ranks on many hosts and interleaved, repeated up to the target size.

    gen-log.py OUT [SIZE_MIB]    (default 1024 MiB)

Every process of every fixture, copied for 64 ranks on 16 hosts, gets a `host:pid` of its own.
Each repetition is another round of communicators of the same long-running processes (their own
communicator ids, as a training job that creates communicators as it goes): the version banner is
in the first round only, as NCCL prints it once per process (a second banner of one `host:pid` is
a restart, which the analyser tracks as a new process).
"""
import pathlib
import random
import re
import sys

root = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "nccl"
sources = sorted(root.glob("real/*/*.log")) + sorted(root.glob("synthetic/*.log"))
prefix = re.compile(r"^(\[[^\]]*\] )?([A-Za-z0-9._-]+):(\d+):(\d+) ")
comm_id = re.compile(r"commId 0x([0-9a-fA-F]+)")

# (fixture index, line, original host:pid or None) per line of every fixture.
lines = []
for i, path in enumerate(sources):
    for line in path.read_text(errors="replace").splitlines():
        m = prefix.match(line)
        lines.append((i, line, f"{m.group(2)}:{m.group(3)}" if m else None))

out, size = pathlib.Path(sys.argv[1]), int(sys.argv[2] if len(sys.argv) > 2 else 1024) << 20
rng = random.Random(7)
pids = {}
next_pid = 10000
written = 0
runs = 0
with out.open("wb") as f:
    while written < size:
        block = []
        salt = (runs + 1) * 0x9E3779B97F4A7C15
        for rank in range(64):  # 64 ranks on 16 hosts
            host = f"node-{rank // 4:02d}"
            for i, line, proc in lines:
                if runs > 0 and "NCCL version" in line:
                    continue
                if proc is not None:
                    key = (rank, i, proc)
                    if key not in pids:
                        pids[key] = next_pid
                        next_pid += 1
                    pid = pids[key]
                    line = prefix.sub(lambda m: f"{m.group(1) or ''}{host}:{pid}:{m.group(4)} ", line, count=1)
                if "commId 0x" in line:
                    line = comm_id.sub(lambda m: f"commId 0x{(int(m.group(1), 16) ^ salt) & (2**64 - 1):x}", line)
                block.append(line)
        rng.shuffle(block)  # interleave ranks
        data = ("\n".join(block) + "\n").encode()
        chunk = data[: size - written]
        f.write(chunk)
        written += len(chunk)
        runs += 1
print(f"{out}: {written} bytes, {runs} rounds of {len(block)} lines from {len(sources)} fixtures, {next_pid - 10000} processes")
