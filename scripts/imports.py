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

It also exits 1 when a pure type is shared between protocol crates. The protocol crates are
PROTOCOL_CRATES (the kubelet, CRI, NRI, cloud and Kubernetes protocols, the device plugin, the DRA
driver, SMC-R). A pure type is a `struct` or `enum` defined in one of them (src/, generated code
left out) in a file that does no I/O: none of IO_MARKERS (std::fs, std::io, std::net, tokio,
tonic, kube, nix, ...) appears in it. When the src/ of ANOTHER protocol crate names such a type
(`use erdma_x::a::{B, c::D}` or a path `erdma_x::a::B`), the type is plain data both protocols
share, so it belongs in the pure `erdma-model`; each such import is printed as
`pure type <Type> of <crate> imported by <crate> (<file>); move it to erdma-model`. Tests and
benches are not checked (dev-dependencies may reach across).
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PROTOCOL_CRATES = (
    "erdma-deviceplugin",
    "erdma-dra",
    "erdma-kubelet",
    "erdma-cri",
    "erdma-nri",
    "erdma-cloud",
    "erdma-k8s",
    "erdma-smc",
)
IO_MARKERS = re.compile(
    r"\bstd::(fs|io|net|process|env|os)\b|\b(tokio|tonic|hyper|hyper_util|kube|nix|libc|notify"
    r"|rtnetlink|netlink_sys|reqwest|tower)::|\bUnixStream\b|\bFile::"
)


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


def use_leaves(tree):
    """The paths of a `use` tree (`a::{b, c::{d, e}}` → a::b, a::c::d, a::c::e)."""
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree).strip()
    if "{" not in tree:
        return [tree]
    head, rest = tree.split("{", 1)
    body = rest[: rest.rfind("}")]
    return [head + leaf for entry in split_group(body) for leaf in use_leaves(entry)]


def external_paths(text, krate):
    """Every path of crate `krate` (`erdma_x`) a file names: `use` trees fully expanded, other
    paths as written."""
    found = []
    for m in re.finditer(rf"\buse\s+(::)?{krate}::([^;]+);", text):
        found += use_leaves(m.group(2))
    outside = re.sub(rf"\buse\s+(::)?{krate}::[^;]+;", "", text)
    found += [m.group(1) for m in re.finditer(rf"\b{krate}::({IDENT}(::{IDENT})*)", outside)]
    return found


def pure_types(crate_dir):
    """Pure types of a crate: struct/enum name → the file (relative to src/) defining it, for
    files without any of IO_MARKERS."""
    src = crate_dir / "src"
    out = {}
    for path in sorted(src.rglob("*.rs")):
        if "gen" in path.relative_to(src).parts:
            continue
        text = strip_comments(path.read_text())
        if IO_MARKERS.search(text):
            continue
        for m in re.finditer(rf"\bpub(\([a-z]+\))?\s+(struct|enum)\s+({IDENT})", text):
            out.setdefault(m.group(3), path.relative_to(src))
    return out


def shared_pure_types(crates):
    """(type, defining crate, importing crate, importing file) for every pure type of a protocol
    crate that another protocol crate's src/ names."""
    dirs = {n: d for n, d in crates if n in PROTOCOL_CRATES}
    pure = {n: pure_types(d) for n, d in dirs.items()}
    found = set()
    for importer, d in dirs.items():
        src = d / "src"
        for path in sorted(src.rglob("*.rs")):
            if "gen" in path.relative_to(src).parts:
                continue
            text = strip_comments(path.read_text())
            for owner in dirs:
                if owner == importer:
                    continue
                for p in external_paths(text, owner.replace("-", "_")):
                    p = re.sub(r"\s+as\s+.*$", "", p)
                    ty = next((seg for seg in p.split("::") if seg[:1].isupper()), None)
                    if ty and ty in pure[owner]:
                        found.add((ty, owner, importer, str(path.relative_to(ROOT))))
    return sorted(found)


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
    for ty, owner, importer, path in shared_pure_types(crates):
        bad += 1
        print(
            f"pure type {ty} of {owner} imported by {importer} ({path}); move it to erdma-model",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
