#!/usr/bin/env bash
# The modules of src/ form layers that point one way: a module may name
# (`crate::x`, `crate::{x, y}`) only modules of a lower layer, so there is
# no cycle and the store never reaches up into the core, the parser, the
# settings or the loop. A module missing from the table below fails the
# check: a new module gets its place on purpose. docs/src/architecture.md
# draws the same layers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 - "$@" <<'EOF'
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
layer = {m: i for i, ms in enumerate(LAYERS) for m in ms}

src = pathlib.Path("src")
def module_of(path):
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")

comment = re.compile(r"//.*")
single = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
group = re.compile(r"\bcrate::\{([^}]*)\}", re.S)

problems = []
edges = 0
for path in sorted(src.rglob("*.rs")):
    module = module_of(path)
    if module in ("lib", "main"):
        continue
    if module not in layer:
        problems.append(f"{path}: module `{module}` has no layer in scripts/check-layers.sh")
        continue
    text = comment.sub("", path.read_text())
    named = set(single.findall(text))
    for inner in group.findall(text):
        named.update(p.strip().split("::")[0] for p in inner.split(",") if p.strip())
    named.discard(module)
    for other in sorted(named):
        edges += 1
        if other not in layer:
            problems.append(f"{path}: names `crate::{other}`, which has no layer")
        elif layer[other] >= layer[module]:
            problems.append(
                f"{path}: `{module}` (layer {layer[module]}) names `crate::{other}` "
                f"(layer {layer[other]}): imports must point down"
            )

# Inside the store, an engine (a directory of its own) names neither the
# dispatcher (store/engine.rs) nor another engine: the words they share
# live below them, in store/seam.rs.
ENGINES = ["redis", "sqlite"]
store_name = re.compile(r"\bcrate::store::([a-z_][a-z0-9_]*)")
store_group = re.compile(r"\bcrate::store::\{([^}]*)\}", re.S)
for engine in ENGINES:
    for path in sorted((src / "store" / engine).rglob("*.rs")):
        text = comment.sub("", path.read_text())
        # `super::` is the store in the engine's mod.rs, and the engine
        # in its other files, whose `super::super::` is the store.
        up = r"\bsuper::" if path.name == "mod.rs" else r"\bsuper::super::"
        named = set(store_name.findall(text))
        named.update(re.findall(up + r"([a-z_][a-z0-9_]*)", text))
        for inner in store_group.findall(text) + re.findall(up + r"\{([^}]*)\}", text):
            named.update(p.strip().split("::")[0] for p in inner.split(",") if p.strip())
        for other in sorted(named & ({"engine"} | set(ENGINES)) - {engine}):
            edges += 1
            problems.append(
                f"{path}: the {engine} engine names `store::{other}`: "
                "what engines share belongs in store/seam.rs"
            )

if problems:
    print("check-layers: an import points up or sideways:", file=sys.stderr)
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"check-layers: {len(layer)} modules in {len(LAYERS)} layers, every import points down")
EOF
