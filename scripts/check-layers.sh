#!/usr/bin/env bash
# Imports point one way, at two scales, so there is no cycle:
#
# - The modules of src/ form layers: a module may name (`crate::x`,
#   `crate::{x, y}`) only modules of a lower layer, so the store never
#   reaches up into the core, the parser, the settings or the loop.
# - Inside a package listed in FILE_LAYERS, its files form layers too: a
#   file may name (`super::x`, `super::{x, y}`, `crate::pkg::x`) only files
#   of a lower layer. In `net/` the buffers and the one socket read sit at
#   the bottom, the WebSocket codec under the connection, the connection
#   under the context, the stages above both, and the loop on top. In
#   `store/` the engines (`redis/`, `sqlite/`) sit below the dispatcher
#   (`engine.rs`) and beside each other, so neither names the other: the
#   words they share live in `seam.rs`, the rules in `mem.rs`. Files in
#   a subfolder (`net/server/*.rs`, `store/redis/*.rs`) count as the unit
#   that owns it (`server`, `redis`).
#
# A module or file missing from its table fails the check: a new one gets
# its place on purpose. docs/src/architecture.md draws the same layers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 - "$@" <<'EOF_PY'
import pathlib, re, sys

# Bottom to top. Within a layer, modules do not name each other.
LAYERS = [
    ["time", "wire", "error", "histogram", "token", "tls"],  # leaves
    ["timer", "keepalive", "ratelimit"],
    ["store"],   # the log and the engines
    ["relay"],   # sessions, waiters, subscribers: the semantics
    ["config"],  # settings, read once at start
    ["http", "logging"],
    ["metrics", "web"],
    ["api"],  # every endpoint's rules of access and answer
    ["cli", "net"],  # the tools and the loop: the shells
    ["fuzzing"],
]

# Package -> its files' layers, bottom to top (a file `x.rs` or a folder
# `x/` is `x`; the package's own `mod.rs` only declares them). Within a
# layer, files do not name each other.
FILE_LAYERS = {
    "net": [
        ["buffer", "read", "ws_read"],  # output queue; one socket read and its budget; client WebSocket frames parsed
        ["stream"],          # the socket, or TLS over it
        ["ws", "redis"],     # the WebSocket codec; the links to Redis
        ["conn"],            # one connection and its stage
        ["ctx"],             # what a stage may touch besides its connection
        ["closing"],         # the stages, each over one connection
        ["http", "subscriber"],
        ["parked"],
        ["server"],          # the loop: the slab, the poll, the effects
    ],
    "store": [
        ["types", "idmap"],     # the log's keys; interned ids
        ["message", "model"],   # a stored message; the bodies and a Write
        ["pending", "arrivals", "asks", "record"],  # unanswered prompts (one session's, every session's by arrival); asks; what a write records
        ["log", "seam"],        # one session's log; the words engines share
        ["mem", "image"],       # the rules, which every engine decides with; a session read whole made a log
        ["redis", "sqlite"],    # the engines: neither names the other
        ["engine"],             # the dispatcher, over every engine
    ],
}

src = pathlib.Path("src")
comment = re.compile(r"//.*")
problems = []


def names(pattern, text):
    """The first segment of every path `pattern` finds: `x` in `p::x` and
    in `p::{x, y::z}`."""
    found = set()
    for m in re.finditer(pattern + r"(?:([a-z_][a-z0-9_]*)|\{([^}]*)\})", text, re.S):
        if m.group(1):
            found.add(m.group(1))
        else:
            found.update(p.strip().split("::")[0] for p in m.group(2).split(",") if p.strip())
    return found


def check(kind, where, table, units):
    """`units`: (path, unit, names it uses). Returns the number of edges."""
    layer = {u: i for i, us in enumerate(table) for u in us}
    edges = 0
    for path, unit, named in units:
        if unit not in layer:
            problems.append(f"{path}: {kind} `{unit}` has no layer in {where}")
            continue
        for other in sorted(named - {unit}):
            edges += 1
            if other not in layer:
                problems.append(f"{path}: names {kind} `{other}`, which has no layer in {where}")
            elif layer[other] >= layer[unit]:
                problems.append(
                    f"{path}: {kind} `{unit}` (layer {layer[unit]}) names `{other}` "
                    f"(layer {layer[other]}): imports must point down"
                )
    return edges


def text_of(path):
    return comment.sub("", path.read_text())


# The modules of src/.
units = []
for path in sorted(src.rglob("*.rs")):
    module = path.relative_to(src).parts[0].removesuffix(".rs")
    if module in ("lib", "main"):
        continue
    units.append((path, module, names(r"\bcrate::", text_of(path))))
check("module", "LAYERS of scripts/check-layers.sh", LAYERS, units)
summary = [f"{len(LAYERS)} layers of modules"]

# The files of each package.
for pkg, table in FILE_LAYERS.items():
    root = src / pkg
    files = {p.relative_to(root).parts[0].removesuffix(".rs") for p in root.iterdir()} - {"mod"}
    units = []
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        if rel == pathlib.Path("mod.rs"):
            continue
        text = text_of(path)
        # `super::` from `net/x.rs` is `net`; from `net/x/y.rs` it is
        # `net::x`, and from `store/redis/mod.rs` it is `store`.
        depth = len(rel.parts) - (rel.name == "mod.rs")
        ups = r"(?<![:\w])" + r"super::" * depth
        named = names(ups, text) | names(rf"\bcrate::{pkg}::", text)
        # Only the package's files count: `super::f` in a `mod tests` is a function.
        units.append((path, rel.parts[0].removesuffix(".rs"), named & files))
    check("file", f"FILE_LAYERS[{pkg!r}] of scripts/check-layers.sh", table, units)
    summary.append(f"{len(table)} layers of files in {pkg}/")

if problems:
    print("check-layers: an import points up or sideways, or has no layer:", file=sys.stderr)
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"check-layers: {', '.join(summary)}; every import points down")
EOF_PY
