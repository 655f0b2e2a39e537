#!/usr/bin/env python3
"""The crate map of docs/design.md, made from the workspace's Cargo.toml files and checked
against them.

    scripts/crate_map.py            # exit 1 naming each difference between the map and the code
    scripts/crate_map.py --write    # rewrite the map's generated parts from the code
    scripts/crate_map.py --print    # print the arrows block as the code has it

Two parts of the map come from the code: the arrows block (the `text` block after the table:
one line per crate with its `[dependencies]` on crates of ours, dev-dependencies left out) and
the table's "May be called by" column (the crates and binaries whose `[dependencies]` name the
crate). The "Job" column is prose and stays hand-written. Two cells are rules instead of lists:
`everyone` (the pure model: it must itself depend on no crate of ours) and `tests and `lab/`
only` (no `[dependencies]` entry may name the crate; dev-dependencies and the lab may).
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
BINARY_NAMES = {"erdma-agent": "agent", "erdma-controller": "controller"}
EVERYONE = "everyone"
TESTS_ONLY = "tests and `lab/` only"
WIDTH = 100


def members():
    ws = tomllib.loads((ROOT / "Cargo.toml").read_text())
    for m in ws["workspace"]["members"]:
        d = ROOT / m
        manifest = tomllib.loads((d / "Cargo.toml").read_text())
        yield manifest["package"]["name"], m, manifest


def arrows():
    crates = list(members())
    names = {n for n, _, _ in crates}
    out = {}
    for name, folder, manifest in crates:
        deps = manifest.get("dependencies", {})
        out[name] = (folder, sorted(k for k in deps if k in names and k != name))
    return out


def height(graph, name, memo):
    if name not in memo:
        memo[name] = 1 + max((height(graph, d, memo) for d in graph[name][1]), default=0)
    return memo[name]


def arrows_block(graph):
    """One line per crate that depends on others of ours: binaries first, then the crates from
    the top of the graph down; each line's targets from the highest down."""
    memo = {}
    order = sorted(
        (n for n in graph if graph[n][1]),
        key=lambda n: (not graph[n][0].startswith("bins/"), -height(graph, n, memo), n),
    )
    lines = []
    for n in order:
        targets = sorted(graph[n][1], key=lambda d: (-height(graph, d, memo), d))
        head = f"{n} ──▶ "
        line = head
        for i, t in enumerate(targets):
            piece = t + (", " if i + 1 < len(targets) else "")
            if len(line) + len(piece.rstrip()) > WIDTH and line.strip() != head.strip():
                lines.append(line.rstrip())
                line = " " * len(head) + piece
            else:
                line += piece
        lines.append(line.rstrip())
    return "\n".join(lines)


def callers(graph, crate):
    return sorted(n for n, (_, deps) in graph.items() if crate in deps)


def cell_of(names):
    shown = [BINARY_NAMES.get(n, f"`{n}`") for n in names]
    # Crates first, then the binaries by their short name, as the map has always read.
    shown.sort(key=lambda s: (not s.startswith("`"), s))
    return ", ".join(shown) if shown else "—"


def parse_cell(cell):
    names = set()
    for word in cell.split(","):
        w = word.strip().strip("`")
        if not w or w == "—":
            continue
        names.add({v: k for k, v in BINARY_NAMES.items()}.get(w, w))
    return names


TABLE_ROW = re.compile(r"^\| (`[^|]+`) \| (.+) \| ([^|]+) \|$")
ARROWS = re.compile(r"(## Map: crates.*?```text\n)(.*?)(\n```)", re.S)


def table_rows(text):
    for i, line in enumerate(text.splitlines()):
        m = TABLE_ROW.match(line)
        if m:
            crates = [c.strip().strip("`") for c in m.group(1).split(",")]
            yield i, crates, m.group(2), m.group(3).strip()


def check(graph, text):
    problems = []
    m = ARROWS.search(text)
    if not m:
        return ["docs/design.md: no ```text arrows block under '## Map: crates'"]
    if m.group(2) != arrows_block(graph):
        problems.append(
            "docs/design.md: the arrows block differs from the Cargo.toml files; "
            "run scripts/crate_map.py --write"
        )
    seen = set()
    for _, crates, _, cell in table_rows(text):
        for c in crates:
            c = c.removeprefix("bins/")
            if c not in graph:
                continue
            seen.add(c)
            actual = set(callers(graph, c))
            if cell == EVERYONE:
                if graph[c][1]:
                    problems.append(f"`{c}` is marked '{EVERYONE}' but depends on {graph[c][1]}")
            elif cell == TESTS_ONLY:
                if actual:
                    problems.append(f"`{c}` is for tests only but {sorted(actual)} depend on it")
            elif graph[c][0].startswith("bins/"):
                if actual:
                    problems.append(f"binary `{c}` is depended on by {sorted(actual)}")
            elif parse_cell(cell) != actual:
                problems.append(
                    f"`{c}`: 'May be called by' says {cell!r}, the code has {cell_of(sorted(actual))!r}"
                )
    for c in sorted(set(graph) - seen):
        problems.append(f"`{c}` has no row in the crate map of docs/design.md")
    return problems


def write(graph, text):
    text = ARROWS.sub(lambda m: m.group(1) + arrows_block(graph) + m.group(3), text, count=1)
    lines = text.splitlines()
    for i, crates, job, cell in table_rows(text):
        if cell in (EVERYONE, TESTS_ONLY) or len(crates) != 1:
            continue
        c = crates[0].removeprefix("bins/")
        if c in graph and not graph[c][0].startswith("bins/"):
            lines[i] = f"| {', '.join(f'`{x}`' for x in crates)} | {job} | {cell_of(callers(graph, c))} |"
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def main():
    graph = arrows()
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--print":
        print(arrows_block(graph))
        return 0
    text = DESIGN.read_text()
    if mode == "--write":
        DESIGN.write_text(write(graph, text))
        return 0
    problems = check(graph, text)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
