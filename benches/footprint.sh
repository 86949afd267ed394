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
import os, socket, statistics, subprocess, sys, time
binary, runs, runner = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmd = ([runner] if runner else []) + [binary]
ready, rss = [], []
for i in range(runs):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    env = dict(os.environ, RELAY_HOST="127.0.0.1", RELAY_PORT=str(port), RELAY_LOG="warn")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env)
    while True:
        c = socket.socket()
        try:
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n")
            if c.recv(64).startswith(b"HTTP/1.1 200"):
                break
        except OSError:
            pass
        finally:
            c.close()
    ready.append((time.perf_counter() - t0) * 1000)
    with open(f"/proc/{p.pid}/status") as f:
        rss += [int(l.split()[1]) for l in f if l.startswith("VmRSS")]
    p.terminate(); p.wait()
print(f"ready to serve (exec to first 200, {runs} starts): median {statistics.median(ready):.2f} ms, "
      f"min {min(ready):.2f} ms, max {max(ready):.2f} ms")
print(f"idle RSS after the first request: median {statistics.median(rss):.0f} KiB, max {max(rss)} KiB")
PY
