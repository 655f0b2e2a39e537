#!/usr/bin/env python3
"""Writes a large NCCL log for the `nccl analyze` benchmark: the project's real and synthetic
fixtures, re-labelled as many ranks on many hosts and interleaved, repeated up to the target size.

    gen-log.py OUT [SIZE_MIB]    (default 1024 MiB)
"""
import pathlib
import random
import re
import sys

root = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "nccl"
sources = sorted(root.glob("real/*/*.log")) + sorted(root.glob("synthetic/*.log"))
prefix = re.compile(r"^(\[[^\]]*\] )?([A-Za-z0-9._-]+):(\d+):(\d+) ")

lines = []
for path in sources:
    lines += path.read_text(errors="replace").splitlines()

rng = random.Random(7)
block = []
for rank in range(64):  # 64 ranks on 16 hosts
    host, pid = f"node-{rank // 4:02d}", 10000 + rank
    for line in lines:
        block.append(prefix.sub(lambda m: f"{m.group(1) or ''}{host}:{pid}:{m.group(4)} ", line, count=1))
rng.shuffle(block)  # interleave ranks
data = ("\n".join(block) + "\n").encode()

out, size = pathlib.Path(sys.argv[1]), int(sys.argv[2] if len(sys.argv) > 2 else 1024) << 20
with out.open("wb") as f:
    written = 0
    while written < size:
        chunk = data[: size - written]
        f.write(chunk)
        written += len(chunk)
print(f"{out}: {written} bytes, {len(block)} lines per block from {len(sources)} fixtures")
