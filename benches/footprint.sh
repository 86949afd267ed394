#!/usr/bin/env bash
# The static binary's footprint: size, idle RSS, and time from exec until it
# answers its first request (median of RUNS starts).
#
#   benches/footprint.sh                        # x86_64-unknown-linux-musl
#   TARGET=aarch64-unknown-linux-musl RUNNER=qemu-aarch64 benches/footprint.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="${TARGET:-x86_64-unknown-linux-musl}"
runs="${RUNS:-20}"
scripts/static-toolchain.sh "$target"
cargo build --release --target "$target" >&2
bin="target/$target/release/relay"
echo "binary: $bin"
file "$bin" 2>/dev/null | sed 's/^[^:]*: /type: /' || true
echo "size: $(stat -c %s "$bin") bytes ($(( $(stat -c %s "$bin") / 1024 )) KiB)"
python3 - "$bin" "$runs" "${RUNNER:-}" <<'PY'
import statistics, sys
sys.path.insert(0, "benches")
from ready import rss_kib, start_until_ready
binary, runs, runner = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmd = ([runner] if runner else []) + [binary]
ready, rss = [], []
for i in range(runs):
    p, _, secs = start_until_ready(cmd, {"RELAY_LOG": "warn"})
    ready.append(secs * 1000)
    rss.append(rss_kib(p.pid))
    p.terminate(); p.wait()
print(f"ready to serve (exec to first 200, {runs} starts): median {statistics.median(ready):.2f} ms, "
      f"min {min(ready):.2f} ms, max {max(ready):.2f} ms")
print(f"idle RSS after the first request: median {statistics.median(rss):.0f} KiB, max {max(rss)} KiB")
PY
