#!/usr/bin/env python3
"""Writes the agent's link order from callgrind profiles (see scripts/agent-link-order.sh).

Arguments: the profiled binary, the directory of callgrind.PID[.N] profiles, the output file.
A profile `callgrind.PID.1` is the part of a run up to its dump (start-up); `callgrind.PID` of
the same PID what the run did after it. A run without a dump (the bench's short starts) is
start-up only.
"""
import collections
import os
import re
import subprocess
import sys

LINE = re.compile(r"^(c?fn|c?ob)=\((\d+)\)(?: (.*))?$")
TEXT_TYPES = set("tTwW")


def symbols(binary):
    """Function symbols of the binary: address by mangled name, mangled names by demangled."""
    def nm(*flags):
        return subprocess.run(["nm", "--defined-only", *flags, binary], capture_output=True,
                              text=True, check=True).stdout.splitlines()
    address, by_demangled = {}, collections.defaultdict(list)
    for raw, demangled in zip(nm(), nm("-C")):
        r, d = raw.split(maxsplit=2), demangled.split(maxsplit=2)
        if len(r) == 3 and len(d) == 3 and r[1] in TEXT_TYPES:
            address[r[2]] = int(r[0], 16)
            by_demangled[d[2]].append(r[2])
    return address, by_demangled


def ran(profile, name, address, by_demangled):
    """Symbols of the object `name` with cost in a callgrind profile.

    Names are compressed (`fn=(7) name` once, `fn=(7)` after); callgrind marks a recursion
    level with a `'N` suffix and names some functions demangled."""
    names, objects, current, ids = {}, {}, None, set()
    with open(profile, errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            kind, ident, text = m.groups()
            if kind in ("ob", "cob"):
                if text is not None:
                    objects[ident] = text
                if kind == "ob":
                    current = objects.get(ident)
            else:
                if text is not None:
                    names[ident] = text
                if kind == "fn" and current and os.path.basename(current) == name:
                    ids.add(ident)
    out = set()
    for ident in ids:
        sym = re.sub(r"'\d+$", "", names.get(ident, ""))
        if sym in address:
            out.add(sym)
        else:
            out.update(by_demangled.get(sym, []))
    return out


def main():
    binary, profiles, output = sys.argv[1:4]
    address, by_demangled = symbols(binary)
    files = sorted(os.listdir(profiles))
    dumped = {f.split(".")[1] for f in files if f.count(".") == 2}
    later, startup = set(), set()
    for f in files:
        parts = f.split(".")
        group = later if len(parts) == 2 and parts[1] in dumped else startup
        group |= ran(os.path.join(profiles, f), os.path.basename(binary), address, by_demangled)
    if not later or not startup:
        sys.exit(f"agent-link-order.py: no functions of {binary} in {profiles}: "
                 f"{len(later)} after start-up, {len(startup)} during start-up")
    startup -= later
    with open(output, "w") as out:
        for group in (later, startup):
            for sym in sorted(group, key=address.get):
                out.write(sym + "\n")
    print(f"agent-link-order.py: {output}: {len(later)} functions run after start-up, "
          f"{len(startup)} only during start-up")


if __name__ == "__main__":
    main()
