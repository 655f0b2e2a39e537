#!/usr/bin/env python3
"""Keeps deploy/docker/*.Dockerfile in step with the images scripts/build-images.sh makes.

    scripts/check-dockerfiles.py                    # every image of `build-images.sh --describe`
    scripts/check-dockerfiles.py --describe FILE    # the same against a saved --describe JSON
    scripts/check-dockerfiles.py --self-test        # wrong Dockerfiles are refused, a right one not

For each image it parses the Dockerfile that builds it and fails, naming the file, the line and the
difference, when the final stage
  - is not `FROM scratch` with exactly one `COPY --from=<stage> /out/<name>/ /` (nothing else adds
    files, runs or sets image config the script's image lacks: CMD, EXPOSE, VOLUME, ...),
  - has an ENTRYPOINT (exec form), USER or ENV other than the description's,
  - has another set of LABEL keys, a fixed label with another value, or sets a label that changes
    with every build (version, revision, created) from anything but its ARG of the final stage,
or when the stage it copies from does not run `scripts/build-images.sh --stage /out`.
Exit status: 0 all agree, 1 a difference (each printed), 2 usage error or no description.
"""

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKER_DIR = ROOT / "deploy" / "docker"

# The Dockerfile of each image build-images.sh describes.
DOCKERFILES = {
    "erdma-agent": "agent.Dockerfile",
    "erdma-controller": "controller.Dockerfile",
    "smcr-init": "smcr-init.Dockerfile",
}

# Labels whose value differs between builds: the Dockerfile takes each from this ARG.
ARG_LABELS = {
    "org.opencontainers.image.version": "VERSION",
    "org.opencontainers.image.revision": "REVISION",
    "org.opencontainers.image.created": "CREATED",
}

# Instructions a final stage may have: each other one adds files, runs something or sets image
# config (Cmd, ExposedPorts, Volumes, StopSignal, Healthcheck, Shell, OnBuild, Author) that the
# script's image does not have.
FINAL_ALLOWED = {"FROM", "ARG", "COPY", "USER", "ENV", "WORKDIR", "LABEL", "ENTRYPOINT"}

STAGE_COMMAND = ("scripts/build-images.sh", "--stage", "/out")


class ParseError(Exception):
    """A Dockerfile this checker cannot read (the message names the line)."""


@dataclass
class Instruction:
    """One logical instruction: keyword, flags (`--from=build`), the rest, its first line."""

    keyword: str
    flags: dict
    args: str
    line: int


@dataclass
class Stage:
    """A build stage: the FROM image, its name, its instructions (FROM first)."""

    image: str
    name: str
    index: int
    instructions: list = field(default_factory=list)


def _marker(arg: str) -> str:
    """Stands for the value of ARG `arg` while values are compared."""
    return f"\0{arg}\0"


def show(value: str) -> str:
    """A value for a message, ARG markers written back as `${NAME}`."""
    out, parts = [], value.split("\0")
    for i, p in enumerate(parts):
        out.append("${" + p + "}" if i % 2 else p)
    return json.dumps("".join(out))


def _expand(text: str, i: int, env: dict, escape: str) -> tuple:
    """Expands the variable at text[i] == '$': `$X`, `${X}`, `${X:-w}`, `${X-w}`, `${X:+w}`,
    `${X+w}`. Returns (value, index after it); unset variables are empty, as Docker has them."""
    n = len(text)
    if i + 1 < n and text[i + 1] == "{":
        j = text.find("}", i + 2)
        if j < 0:
            raise ParseError(f"unterminated ${{ in {text!r}")
        body = text[i + 2 : j]
        name, op, word = body, "", ""
        for k, c in enumerate(body):
            if not (c.isalnum() or c == "_"):
                name, rest = body[:k], body[k:]
                for candidate in (":-", ":+", "-", "+"):
                    if rest.startswith(candidate):
                        op, word = candidate, rest[len(candidate) :]
                        break
                else:
                    raise ParseError(f"unsupported substitution ${{{body}}}")
                break
        if not name:
            raise ParseError(f"bad substitution ${{{body}}}")
        word = "".join(words(word, env, escape, split=False)) if word else ""
        value = env.get(name)
        if op == ":-":
            value = value if value else word
        elif op == "-":
            value = value if value is not None else word
        elif op == ":+":
            value = word if value else ""
        elif op == "+":
            value = word if value is not None else ""
        return value or "", j + 1
    k = i + 1
    while k < n and (text[k].isalnum() or text[k] == "_"):
        k += 1
    if k == i + 1 or text[i + 1].isdigit():
        return "$", i + 1
    return env.get(text[i + 1 : k], ""), k


def words(text: str, env: dict, escape: str = "\\", split: bool = True) -> list:
    """Docker's word processing of ENV, LABEL, USER, FROM, ... arguments: quotes removed, the
    escape character honoured, variables expanded (not in single quotes); split on blanks outside
    quotes unless `split` is false."""
    out, cur, have, i, n = [], [], False, 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace() and split:
            if have:
                out.append("".join(cur))
                cur, have = [], False
            i += 1
            continue
        have = True
        if c == escape:
            if i + 1 < n:
                cur.append(text[i + 1])
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise ParseError(f"unterminated single quote in {text!r}")
            cur.append(text[i + 1 : j])
            i = j + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise ParseError(f"unterminated double quote in {text!r}")
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == escape and i + 1 < n and text[i + 1] in ('"', "$", escape):
                    cur.append(text[i + 1])
                    i += 2
                elif c == "$":
                    value, i = _expand(text, i, env, escape)
                    cur.append(value)
                else:
                    cur.append(c)
                    i += 1
        elif c == "$":
            value, i = _expand(text, i, env, escape)
            cur.append(value)
        else:
            cur.append(c)
            i += 1
    if have:
        out.append("".join(cur))
    return out


def pairs(ins: Instruction, env: dict, escape: str) -> list:
    """The (key, value) pairs of an ENV or LABEL: `K=V ...` or the old `K V` form."""
    first = ins.args.split(None, 1)
    if not first:
        raise ParseError(f"line {ins.line}: {ins.keyword} without arguments")
    if "=" not in first[0]:
        if len(first) < 2:
            raise ParseError(f"line {ins.line}: {ins.keyword} {first[0]} has no value")
        key = words(first[0], env, escape)[0]
        return [(key, "".join(words(first[1].strip(), env, escape, split=False)))]
    out = []
    for w in words(ins.args, env, escape):
        if "=" not in w:
            raise ParseError(f"line {ins.line}: {ins.keyword} word {w!r} is not KEY=VALUE")
        key, value = w.split("=", 1)
        out.append((key, value))
    return out


def exec_form(args: str):
    """The JSON (exec) form's list of strings, or None for the shell form."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def parse(text: str) -> tuple:
    """(global ARG instructions, stages, escape character) of a Dockerfile's text."""
    lines = text.split("\n")
    escape, i = "\\", 0
    # Parser directives: `# name=value` lines at the very top.
    while i < len(lines):
        s = lines[i].strip()
        if not s.startswith("#") or "=" not in s:
            break
        name, value = (p.strip() for p in s[1:].split("=", 1))
        if not name.isalpha():
            break
        if name.lower() == "escape":
            if value not in ("\\", "`"):
                raise ParseError(f"line {i + 1}: escape directive {value!r} is neither \\ nor `")
            escape = value
        i += 1
    instructions, buf, start = [], None, 0
    for num in range(i, len(lines)):
        raw = lines[num].rstrip("\r")
        s = raw.strip()
        if buf is None and (not s or s.startswith("#")):
            continue
        if buf is not None and (not s or s.startswith("#")):
            continue  # comments and blank lines inside a continuation are dropped
        if buf is None:
            buf, start = "", num + 1
        stripped = raw.rstrip()
        if stripped.endswith(escape):
            buf += stripped[: -len(escape)]
            continue
        buf += raw
        instructions.append(_instruction(buf.strip(), start))
        buf = None
    if buf is not None and buf.strip():
        instructions.append(_instruction(buf.strip(), start))
    global_args, stages = [], []
    for ins in instructions:
        if ins.keyword == "FROM":
            stages.append(_stage(ins, len(stages), global_args, escape))
        elif not stages:
            if ins.keyword != "ARG":
                raise ParseError(f"line {ins.line}: {ins.keyword} before the first FROM")
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    if not stages:
        raise ParseError("no FROM instruction")
    return global_args, stages, escape


def _instruction(logical: str, line: int) -> Instruction:
    keyword, rest = (logical.split(None, 1) + [""])[:2]
    keyword, rest = keyword.upper(), rest.strip()
    flags = {}
    if keyword in ("FROM", "COPY", "ADD", "RUN"):
        while rest.startswith("--"):
            flag, rest = (rest.split(None, 1) + [""])[:2]
            name, _, value = flag[2:].partition("=")
            flags.setdefault(name, []).append(value)
            rest = rest.strip()
    if "<<" in rest and keyword in ("RUN", "COPY", "ADD"):
        raise ParseError(f"line {line}: heredocs are not read by this checker")
    return Instruction(keyword, flags, rest, line)


def _stage(ins: Instruction, index: int, global_args: list, escape: str) -> Stage:
    env = {}
    for a in global_args:
        name, _, default = a.args.partition("=")
        env[name.strip()] = "".join(words(default, env, escape, split=False)) if default else None
    parts = words(ins.args, {k: v for k, v in env.items() if v is not None}, escape)
    if len(parts) == 3 and parts[1].lower() == "as":
        image, name = parts[0], parts[2]
    elif len(parts) == 1:
        image, name = parts[0], ""
    else:
        raise ParseError(f"line {ins.line}: FROM {ins.args!r} is not `FROM image [AS name]`")
    return Stage(image, name, index, [ins])


def _runs_stage_command(stage: Stage) -> bool:
    for ins in stage.instructions:
        if ins.keyword != "RUN":
            continue
        argv = exec_form(ins.args)
        tokens = []
        for t in argv if argv is not None else [ins.args]:
            try:
                tokens.extend(words(t, {}) if argv is None or " " in t else [t])
            except ParseError:  # shell syntax this reader does not follow: blanks split it
                tokens.extend(t.split())
        # A shell comment ends the command.
        tokens = tokens[: next((k for k, t in enumerate(tokens) if t.startswith("#")), len(tokens))]
        for k, t in enumerate(tokens):
            if t == STAGE_COMMAND[0] or t.endswith("/" + STAGE_COMMAND[0]):
                tail = [x.rstrip("/") or "/" for x in tokens[k + 1 : k + 3]]
                if tail == list(STAGE_COMMAND[1:]):
                    return True
    return False


def check(text: str, image: dict, where: str) -> list:
    """The differences between a Dockerfile's text and an image of `--describe`, each a message
    starting with `where` (the file) and the line."""
    name = image["name"]
    try:
        _, stages, escape = parse(text)
    except ParseError as e:
        return [f"{where}: cannot be read: {e}"]
    final = stages[-1]

    def at(ins: Instruction) -> str:
        return f"{where}:{ins.line}"

    problems = []
    if final.image.lower() != "scratch":
        problems.append(f"{at(final.instructions[0])}: the final stage is FROM {final.image}, not FROM scratch "
                        "(the script's image has no base image)")
    args, env, env_lines, labels, label_lines = {}, {}, {}, {}, {}
    user = entrypoint = workdir = None
    copies = []
    for ins in final.instructions[1:]:
        kw = ins.keyword
        if kw not in FINAL_ALLOWED:
            problems.append(f"{at(ins)}: the final stage has {kw}, which the script's image does not have")
            continue
        try:
            values = {**{k: _marker(k) for k in args}, **env}
            if kw == "ARG":
                n, _, default = ins.args.partition("=")
                args[n.strip()] = "".join(words(default, values, escape, split=False)) if default else None
            elif kw == "ENV":
                for k, v in pairs(ins, values, escape):
                    env[k], env_lines[k], values[k] = v, ins.line, v
            elif kw == "LABEL":
                for k, v in pairs(ins, values, escape):
                    labels[k], label_lines[k] = v, ins.line
            elif kw == "USER":
                user = (" ".join(words(ins.args, values, escape)), ins)
            elif kw == "WORKDIR":
                workdir = (" ".join(words(ins.args, values, escape)), ins)
            elif kw == "ENTRYPOINT":
                entrypoint = (exec_form(ins.args), ins)
            elif kw == "COPY":
                copies.append(ins)
        except ParseError as e:
            problems.append(f"{at(ins)}: cannot be read: {e}")

    # The one COPY of the image's tree from the build stage.
    want_src = f"/out/{name}"
    if len(copies) != 1:
        problems.append(f"{where}: the final stage has {len(copies)} COPY instructions; it needs exactly one, "
                        f"COPY --from=<build stage> {want_src}/ /")
    for ins in copies[:1]:
        parts = words(ins.args, {}, escape)
        srcs = [p.rstrip("/") for p in parts[:-1]]
        other_flags = sorted(set(ins.flags) - {"from", "link"})
        if srcs != [want_src] or len(parts) < 2 or parts[-1] != "/":
            problems.append(f"{at(ins)}: COPY {ins.args}: the final stage must copy {want_src}/ to /")
        if other_flags:
            problems.append(f"{at(ins)}: COPY --{' --'.join(other_flags)} changes the script's files")
        src_stage = (ins.flags.get("from") or [""])[-1]
        build = _stage_named(stages[:-1], src_stage)
        if build is None:
            problems.append(f"{at(ins)}: COPY --from={src_stage!r} names no earlier build stage")
        elif not any(_runs_stage_command(s) for s in _stage_chain(stages, build)):
            problems.append(f"{where}: the build stage {build.name or build.index} (FROM {build.image}) does not run "
                            f"`{' '.join(STAGE_COMMAND)}`")

    want_ep = image.get("entrypoint")
    if entrypoint is None:
        problems.append(f"{where}: no ENTRYPOINT; --describe says {json.dumps(want_ep)}")
    elif entrypoint[0] is None:
        problems.append(f"{at(entrypoint[1])}: ENTRYPOINT {entrypoint[1].args} is the shell form "
                        f"(the image has no shell); --describe says {json.dumps(want_ep)}")
    elif entrypoint[0] != want_ep:
        problems.append(f"{at(entrypoint[1])}: ENTRYPOINT is {json.dumps(entrypoint[0])}, "
                        f"--describe says {json.dumps(want_ep)}")

    want_user = image.get("user")
    if user is None:
        problems.append(f"{where}: no USER; --describe says {want_user!r}")
    elif user[0] != want_user:
        problems.append(f"{at(user[1])}: USER is {show(user[0])}, --describe says {want_user!r}")
    if workdir is not None and workdir[0] != "/":
        problems.append(f"{at(workdir[1])}: WORKDIR is {show(workdir[0])}; the script's image works in /")

    want_env = dict(e.split("=", 1) for e in image.get("env", []))
    for k in sorted(set(env) | set(want_env)):
        if k not in want_env:
            problems.append(f"{where}:{env_lines[k]}: ENV {k}={show(env[k])} is not in --describe's env")
        elif k not in env:
            problems.append(f"{where}: no ENV {k}; --describe says {k}={want_env[k]}")
        elif env[k] != want_env[k]:
            problems.append(f"{where}:{env_lines[k]}: ENV {k} is {show(env[k])}, --describe says {want_env[k]!r}")

    want_labels = image.get("labels", {})
    for k in sorted(set(labels) - set(want_labels)):
        problems.append(f"{where}:{label_lines[k]}: LABEL {k} is not one of --describe's labels")
    for k in sorted(set(want_labels) - set(labels)):
        problems.append(f"{where}: no LABEL {k} (--describe: {want_labels[k]!r})")
    for k in sorted(set(want_labels) & set(labels)):
        have, line = labels[k], f"{where}:{label_lines[k]}"
        arg = ARG_LABELS.get(k)
        if arg is not None:
            if arg not in args:
                problems.append(f"{line}: LABEL {k} changes with every build: it needs ARG {arg} in the final "
                                f"stage (a global ARG is not seen there) and the value \"${{{arg}}}\"")
            elif have != _marker(arg):
                problems.append(f"{line}: LABEL {k} is {show(have)}; it changes with every build, "
                                f"so it must be \"${{{arg}}}\" (ARG {arg} of the final stage)")
            elif args.get(arg) not in (None, want_labels[k]):
                problems.append(f"{line}: ARG {arg} defaults to {args[arg]!r}, --describe says {want_labels[k]!r}")
        elif have != want_labels[k]:
            problems.append(f"{line}: LABEL {k} is {show(have)}, --describe says {want_labels[k]!r}")
    return problems


def _stage_named(stages: list, ref: str):
    for s in stages:
        if ref and (s.name.lower() == ref.lower() or str(s.index) == ref):
            return s
    return None


def _stage_chain(stages: list, stage: Stage) -> list:
    """The stage and the earlier stages it is built FROM."""
    chain = [stage]
    while (parent := _stage_named(stages[: chain[-1].index], chain[-1].image)) is not None:
        chain.append(parent)
    return chain


def describe(path) -> dict:
    if path is not None:
        return json.loads(Path(path).read_text())
    script = ROOT / "scripts" / "build-images.sh"
    if not script.exists():
        print(f"check-dockerfiles: {script.relative_to(ROOT)} does not exist", file=sys.stderr)
        sys.exit(2)
    r = subprocess.run(["bash", str(script), "--describe"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        print(f"check-dockerfiles: `bash scripts/build-images.sh --describe` exited {r.returncode}:\n{r.stderr}",
              file=sys.stderr)
        sys.exit(2)
    return json.loads(r.stdout)


def check_repo(desc: dict) -> int:
    images = desc.get("images") or []
    problems, names = [], set()
    if not images:
        problems.append("build-images.sh --describe lists no images")
    for image in images:
        name = image["name"]
        names.add(name)
        if name not in DOCKERFILES:
            problems.append(f"image {name}: no Dockerfile known for it (add it to DOCKERFILES in "
                            "scripts/check-dockerfiles.py)")
            continue
        path = DOCKER_DIR / DOCKERFILES[name]
        where = str(path.relative_to(ROOT))
        if not path.exists():
            problems.append(f"{where}: missing (builds image {name})")
            continue
        found = check(path.read_text(), image, where)
        problems += found
        if not found:
            print(f"{where}: ok ({name}: FROM scratch with /out/{name}/, entrypoint, user, env, "
                  f"{len(image.get('labels', {}))} labels)")
    known = {DOCKERFILES[n] for n in names if n in DOCKERFILES}
    for path in sorted(DOCKER_DIR.glob("*.Dockerfile")):
        if path.name not in known:
            problems.append(f"{path.relative_to(ROOT)}: builds no image that build-images.sh --describe lists")
    for p in problems:
        print(f"FAIL {p}")
    n = len(problems)
    print(f"check-dockerfiles: {len(images)} images, {n} difference{'' if n == 1 else 's'}")
    return 1 if problems else 0


# --- self-test -----------------------------------------------------------------------------------

SAMPLE = {
    "name": "erdma-controller",
    "ref": "ghcr.io/erdma/erdma-controller:0.1.0",
    "entrypoint": ["/usr/local/bin/erdma-controller"],
    "user": "65532:65532",
    "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
    "labels": {
        "org.opencontainers.image.source": "https://github.com/erdma/erdma",
        "org.opencontainers.image.version": "0.1.0",
        "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
        "org.opencontainers.image.created": "2026-01-01T00:00:00Z",
        "org.opencontainers.image.title": "erdma-controller",
        "org.opencontainers.image.description": "the controller's \"image\"",
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
}

# A right Dockerfile for SAMPLE, written the long way round: directives, a comment and a blank line
# inside a continuation, both ENV forms, quoting, a global ARG, a stage built from another.
GOOD = r"""# syntax=docker/dockerfile:1
# a comment
ARG RUST=1.95
FROM rust:${RUST}-bookworm AS base
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/src/target \
    # the stage trees
    bash scripts/build-images.sh --stage /out

FROM base AS build
RUN echo built

from scratch
ARG VERSION
ARG REVISION
ARG CREATED
COPY --from=build /out/erdma-controller/ /
user 65532:65532
ENV PATH /usr/local/bin:/usr/bin:/bin
WORKDIR /
LABEL org.opencontainers.image.source="https://github.com/erdma/erdma" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision=$REVISION

LABEL "org.opencontainers.image.created"="${CREATED}" org.opencontainers.image.title=erdma-controller \
      org.opencontainers.image.description='the controller'\''s "image"' \
      org.opencontainers.image.licenses=Apache-2.0
ENTRYPOINT ["/usr/local/bin/erdma-controller"]
"""

# (what is wrong, text replaced, its replacement, words the refusal must contain)
WRONG = [
    ("user root", "user 65532:65532", "USER 0:0", "USER is"),
    ("user missing", "user 65532:65532\n", "", "no USER"),
    ("entrypoint elsewhere", '["/usr/local/bin/erdma-controller"]', '["/bin/erdma-controller"]', "ENTRYPOINT is"),
    ("entrypoint shell form", '["/usr/local/bin/erdma-controller"]', "/usr/local/bin/erdma-controller",
     "shell form"),
    ("entrypoint with an argument", '["/usr/local/bin/erdma-controller"]',
     '["/usr/local/bin/erdma-controller", "--v=2"]', "ENTRYPOINT is"),
    ("PATH differs", "ENV PATH /usr/local/bin:/usr/bin:/bin", "ENV PATH=/usr/bin:/bin", "ENV PATH is"),
    ("extra ENV", "WORKDIR /\n", "WORKDIR /\nENV RUST_LOG=debug\n", "ENV RUST_LOG"),
    ("no ENV", "ENV PATH /usr/local/bin:/usr/bin:/bin\n", "", "no ENV PATH"),
    ("label missing", " \\\n      org.opencontainers.image.licenses=Apache-2.0", "",
     "no LABEL org.opencontainers.image.licenses"),
    ("extra label", "ENTRYPOINT", "LABEL maintainer=someone\nENTRYPOINT", "LABEL maintainer is not"),
    ("label value", "title=erdma-controller", "title=erdma-agent", "LABEL org.opencontainers.image.title is"),
    ("version fixed", 'version="${VERSION}"', 'version="0.1.0"', "must be \"${VERSION}\""),
    ("version from another ARG", 'version="${VERSION}"', 'version="${REVISION}"', "must be \"${VERSION}\""),
    ("ARG not in the final stage", "ARG VERSION\nARG REVISION", "ARG REVISION", "needs ARG VERSION in the final"),
    ("ARG default wrong", "ARG VERSION\n", "ARG VERSION=9.9.9\n", "ARG VERSION defaults to"),
    ("base image", "from scratch", "FROM debian:12-slim", "not FROM scratch"),
    ("another tree", "/out/erdma-controller/ /", "/out/erdma-agent/ /", "must copy /out/erdma-controller/"),
    ("into a subdirectory", "/out/erdma-controller/ /\n", "/out/erdma-controller/ /usr/\n",
     "must copy /out/erdma-controller/"),
    ("owner changed", "COPY --from=build", "COPY --chown=1:1 --from=build", "--chown"),
    ("copy from an image", "--from=build", "--from=ghcr.io/erdma/erdma-controller:0.1.0",
     "names no earlier build stage"),
    ("second COPY", "WORKDIR /\n", "WORKDIR /\nCOPY --from=build /etc/hosts /etc/hosts\n", "2 COPY"),
    ("CMD", "ENTRYPOINT", 'CMD ["--help"]\nENTRYPOINT', "has CMD"),
    ("EXPOSE", "WORKDIR /\n", "WORKDIR /\nEXPOSE 9443\n", "has EXPOSE"),
    ("WORKDIR", "WORKDIR /\n", "WORKDIR /app\n", "WORKDIR is"),
    ("no build-images.sh", "bash scripts/build-images.sh --stage /out", "cargo build --release", "does not run"),
    ("describe instead of stage", "--stage /out", "--describe", "does not run"),
    ("stage elsewhere", "--stage /out", "--stage /tmp/out", "does not run"),
    ("build step a shell comment", "    bash scripts/build-images.sh", "    true # bash scripts/build-images.sh",
     "does not run"),
    ("unterminated quote", "title=erdma-controller", 'title="erdma-controller', "cannot be read"),
    ("built in a stage not copied from", "FROM base AS build", "FROM rust:1.95-bookworm AS build", "does not run"),
]

# (what, text replaced, its replacement): other spellings of the right Dockerfile, still right.
RIGHT = [
    ("a shell comment with an apostrophe", "RUN echo built", "RUN echo built # it's built"),
    ("a tab after the keyword", "user 65532:65532", "USER\t65532:65532"),
    ("the exec form", "    bash scripts/build-images.sh --stage /out",
     '    ["bash", "scripts/build-images.sh", "--stage", "/out/"]'),
    ("no trailing slash, --link", "COPY --from=build /out/erdma-controller/ /",
     "COPY --link --from=build /out/erdma-controller /"),
    ("the stage by number", "--from=build", "--from=1"),
]


def self_test() -> int:
    failures = []
    good = check(GOOD, SAMPLE, "good.Dockerfile")
    if good:
        failures.append("the right Dockerfile was refused:\n  " + "\n  ".join(good))
    # With the backtick as escape character (`# escape=``) the same file reads the same.
    tick = "# escape=`\n" + GOOD.replace("'the controller'\\''s \"image\"'", '"the controller\'s `"image`""')
    tick = tick.replace("\\\n", "`\n")
    if found := check(tick, SAMPLE, "tick.Dockerfile"):
        failures.append("the right Dockerfile with `# escape=`` was refused:\n  " + "\n  ".join(found))
    for what, old, new in RIGHT:
        if old not in GOOD:
            failures.append(f"{what}: the self-test's text {old!r} is not in its Dockerfile")
        elif found := check(GOOD.replace(old, new, 1), SAMPLE, "right.Dockerfile"):
            failures.append(f"{what}: refused:\n  " + "\n  ".join(found))
    for what, old, new, expect in WRONG:
        if old not in GOOD:
            failures.append(f"{what}: the self-test's text {old!r} is not in its Dockerfile")
            continue
        found = check(GOOD.replace(old, new, 1), SAMPLE, "wrong.Dockerfile")
        if not any(expect in p for p in found):
            failures.append(f"{what}: not refused with {expect!r}; got {found or 'no difference'}")
    # A description that differs is found too (the Dockerfile is right for SAMPLE, not for this).
    other = json.loads(json.dumps(SAMPLE))
    other["labels"]["org.opencontainers.image.vendor"] = "erdma"
    if not any("no LABEL org.opencontainers.image.vendor" in p for p in check(GOOD, other, "good.Dockerfile")):
        failures.append("a label only --describe has was not reported")
    for f in failures:
        print(f"FAIL self-test: {f}")
    print(f"check-dockerfiles self-test: the right Dockerfile and {len(RIGHT) + 1} other spellings of it, "
          f"{len(WRONG) + 1} wrong cases; {len(failures)} not as expected")
    return 1 if failures else 0


def main(argv: list) -> int:
    if argv[:1] == ["--self-test"] and len(argv) == 1:
        return self_test()
    if argv[:1] == ["--describe"] and len(argv) == 2:
        return check_repo(describe(argv[1]))
    if not argv:
        return check_repo(describe(None))
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
