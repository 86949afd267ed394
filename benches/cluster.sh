#!/usr/bin/env bash
# What the Redis Cluster router costs the relay: prompts per second and
# the relay's CPU per prompt through one relay on one Redis (Debian
# redis-server, no persistence), named by redis:// (no router) and by
# redis-cluster:// (the router in its one-node mode), in PAIRS interleaved
# pairs, each a fresh relay under wrk -c64 for SECS seconds
# (benches/load/ingest.lua: 256-byte prompts over 1000 sessions).
#
#   benches/cluster.sh                   # the static build, 3 pairs of 5 s
#   BIN=target/release/relay PAIRS=5 SECS=10 benches/cluster.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN="${BIN:-target/x86_64-unknown-linux-musl/release/relay}"
PAIRS="${PAIRS:-3}"
SECS="${SECS:-5}"
dir="$(mktemp -d)"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
master="$(free_port)"
cleanup() {
  redis-cli -p "$master" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/$master"
redis-server --port "$master" --bind 127.0.0.1 --dir "$dir/$master" --save '' --appendonly no --daemonize yes >/dev/null
for _ in $(seq 1 100); do
  redis-cli -p "$master" ping >/dev/null 2>&1 && break
  sleep 0.1
done
tck="$(getconf CLK_TCK)"
printf '%-14s %12s %16s\n' scheme prompts_per_s relay_us_per_prompt
for pair in $(seq 1 "$PAIRS"); do
  for n in redis redis-cluster; do
    port="$(free_port)"
    RELAY_PORT="$port" RELAY_HOST=127.0.0.1 RELAY_LOG=warn RELAY_MAX_PENDING=100000 \
      RELAY_REDIS_URL="$n://127.0.0.1:$master" RELAY_REDIS_PREFIX="b$pair-$n:" \
      "$BIN" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
      sleep 0.05
    done
    before="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"
    out="$(RUN_ID="$pair$n" wrk -t1 -c64 -d"${SECS}s" -s benches/load/ingest.lua "http://127.0.0.1:$port")"
    after="$(awk '{ print $14 + $15 }' "/proc/$pid/stat")"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    requests="$(echo "$out" | awk '/requests in/ { print $1 }')"
    non2xx="$(echo "$out" | awk '/Non-2xx/ { print $NF }')"
    if [[ -n "$non2xx" ]]; then
      echo "$n: $non2xx answers were not 2xx" >&2
      exit 1
    fi
    awk -v n="$n" -v r="$requests" -v s="$SECS" -v t="$((after - before))" -v hz="$tck" \
      'BEGIN { printf "%-14s %12.0f %16.1f\n", n, r / s, t / hz * 1e6 / r }'
  done
done
