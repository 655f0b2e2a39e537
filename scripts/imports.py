#!/usr/bin/env python3
"""The import picture of the workspace: which crate uses which, and inside each crate which file
(module) uses which. Exits 1 when two or more files of one crate import each other in a circle.

    scripts/imports.py            # the circles (none: prints nothing), exit status
    scripts/imports.py --dot      # Graphviz of the crate arrows and of every crate's files
    scripts/imports.py --crates   # the crate arrows as text ("a -> b")

A file's module is its path under src/ (`policy/mod.rs` is `policy`). A file uses another when
it names `crate::<module>` (in `use` or in a path; `use crate::{a, b::c}` counts each), or
`super::<module>` from a child file; a name the crate root re-exports (`pub use a::X;`) counts as
module `a`. The crate root (lib.rs, main.rs) is the table of contents and is left out. Generated
code (src/gen/) is left out.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def members():
    ws = tomllib.loads((ROOT / "Cargo.toml").read_text())
    for m in ws["workspace"]["members"]:
        d = ROOT / m
        name = tomllib.loads((d / "Cargo.toml").read_text())["package"]["name"]
        yield name, d


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_of(src, path):
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts.pop()
    if parts in (["lib"], ["main"]) or (parts and parts[0] == "bin"):
        return None
    return "::".join(parts)


def split_group(body):
    """Top-level comma-separated entries of a `{...}` use group."""
    out, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [e.strip() for e in out if e.strip()]


def paths_after(text, prefix):
    """Every path named after `prefix::`, groups expanded one level."""
    found = []
    for m in re.finditer(rf"\b{prefix}::", text):
        rest = text[m.end():]
        if rest.startswith("{"):
            depth, end = 0, 0
            for i, ch in enumerate(rest):
                depth += ch == "{"
                depth -= ch == "}"
                if depth == 0:
                    end = i
                    break
            for entry in split_group(rest[1:end]):
                p = re.match(rf"{IDENT}(::{IDENT})*", entry)
                if p:
                    found.append(p.group(0))
        else:
            p = re.match(rf"{IDENT}(::{IDENT})*", rest)
            if p:
                found.append(p.group(0))
    return found


def reexports(root_text):
    """Names the crate root re-exports → the module they come from."""
    names = {}
    for m in re.finditer(rf"pub\s+use\s+({IDENT})::([^;]+);", root_text):
        module, rest = m.group(1), m.group(2)
        for name in re.findall(IDENT, rest):
            names.setdefault(name, module)
    return names


def file_graph(crate_dir):
    src = crate_dir / "src"
    files = {}
    for path in sorted(src.rglob("*.rs")):
        if "gen" in path.relative_to(src).parts:
            continue
        mod = module_of(src, path)
        if mod is not None:
            files[mod] = path
    root_text = ""
    for r in ("lib.rs", "main.rs"):
        if (src / r).exists():
            root_text += strip_comments((src / r).read_text())
    exported = reexports(root_text)
    edges = {m: set() for m in files}
    for mod, path in files.items():
        text = strip_comments(path.read_text())
        named = paths_after(text, "crate")
        parent = mod.rsplit("::", 1)[0] if "::" in mod else ""
        for p in paths_after(text, "super"):
            named.append(f"{parent}::{p}" if parent else p)
        for p in named:
            segs = p.split("::")
            target = None
            for n in range(len(segs), 0, -1):
                cand = "::".join(segs[:n])
                if cand in files:
                    target = cand
                    break
            if target is None and segs[0] in exported and exported[segs[0]] in files:
                target = exported[segs[0]]
            if target and target != mod and not mod.startswith(target + "::") \
                    and not target.startswith(mod + "::"):
                edges[mod].add(target)
    return edges


def circles(edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def crate_graph(crates):
    names = {n for n, _ in crates}
    out = {}
    for name, d in crates:
        deps = tomllib.loads((d / "Cargo.toml").read_text()).get("dependencies", {})
        out[name] = sorted(k for k in deps if k in names and k != name)
    return out


def main():
    crates = list(members())
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "--crates":
        for c, deps in crate_graph(crates).items():
            for d in deps:
                print(f"{c} -> {d}")
        return 0
    bad = 0
    if mode == "--dot":
        print("digraph erdma {\n  rankdir=LR;")
        for c, deps in crate_graph(crates).items():
            for d in deps:
                print(f'  "{c}" -> "{d}";')
    for name, d in crates:
        edges = file_graph(d)
        if mode == "--dot":
            print(f'  subgraph "cluster_{name}" {{ label="{name}";')
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print(f'    "{name}/{a}" -> "{name}/{b}";')
            print("  }")
        for comp in circles(edges):
            bad += 1
            print(f"circle in {name}: {' <-> '.join(comp)}", file=sys.stderr)
    if mode == "--dot":
        print("}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
