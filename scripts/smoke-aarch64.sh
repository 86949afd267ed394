#!/usr/bin/env bash
# Builds the static Raspberry Pi binary (aarch64-unknown-linux-musl, linked by
# rust-lld, SQLite's C by zig), runs it under qemu-aarch64, and checks a
# prompt, a long-poll and a WebSocket message against it with
# examples/smoke.rs, in memory, with a data directory, and with its
# sessions in Redis (Debian's redis-server, native, on a free port); then
# TLS with ring's aarch64 code on both ends: the server under qemu with a
# certificate made on the fly, `relay health` over https:// from the
# aarch64 binary (under qemu too) and from a native build.
# Needs: rustup target aarch64-unknown-linux-musl, PyPI ziglang, Debian's
# qemu-user (scripts/static-toolchain.sh and apt install what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/static-toolchain.sh aarch64-unknown-linux-musl
command -v qemu-aarch64 >/dev/null || { apt-get update -qq && apt-get install -y -qq qemu-user; }
cargo build --release --target aarch64-unknown-linux-musl
bin=target/aarch64-unknown-linux-musl/release/relay
file "$bin" 2>/dev/null || true
printf 'size: %s bytes\n' "$(stat -c %s "$bin")"
cargo build --example smoke
ROOT=$(pwd)
. scripts/lib.sh
RELAY_BIN=$bin
log=$(mktemp)
trap 'stop_relay; rm -f "$log"' EXIT
RUNNER=qemu-aarch64 start_relay smoke-aarch64 "$log"
addr=$ADDR
pid=$SERVER_PID
echo "relay (aarch64, qemu) listening on $addr"
target/debug/examples/smoke "$addr"
kill -TERM $pid
wait $pid
echo "aarch64 smoke test passed in memory (clean exit after SIGTERM)"
# With persistence: SQLite, compiled for aarch64, under qemu.
data=$(mktemp -d)
trap 'stop_relay; rm -f "$log"; rm -rf "$data"' EXIT
RUNNER=qemu-aarch64 start_relay smoke-aarch64-data "$log" RELAY_DATA_DIR="$data"
target/debug/examples/smoke "$ADDR"
kill -TERM $SERVER_PID
wait $SERVER_PID
[[ -s "$data/relay.db" ]] || { echo "no database written in $data" >&2; exit 1; }
echo "aarch64 smoke test passed with a data directory ($(stat -c %s "$data/relay.db") bytes of database)"
# Several instances: the sessions in Redis, spoken to by the aarch64 build.
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
rdir=$(mktemp -d)
rport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'stop_relay; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -f "$log"; rm -rf "$data" "$rdir"' EXIT
redis-server --port "$rport" --bind 127.0.0.1 --dir "$rdir" --save '' --appendonly no --daemonize yes >/dev/null
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
RUNNER=qemu-aarch64 start_relay smoke-aarch64-redis "$log" RELAY_REDIS_URL="redis://127.0.0.1:$rport"
for _ in $(seq 1 300); do grep -q '"connected to Redis"' "$log" && break; sleep 0.1; done
grep -q '"connected to Redis"' "$log" || { cat "$log" >&2; echo "the aarch64 relay never reached Redis" >&2; exit 1; }
target/debug/examples/smoke "$ADDR"
kill -TERM $SERVER_PID
wait $SERVER_PID
sessions=$(redis-cli -p "$rport" zcard relay:sessions)
[[ "$sessions" -ge 1 ]] || { echo "no session stored in Redis" >&2; exit 1; }
echo "aarch64 smoke test passed with Redis ($sessions session(s) stored there)"
# TLS: ring's aarch64 assembly on the server side and on the client side.
tdir=$(mktemp -d)
trap 'stop_relay; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -f "$log"; rm -rf "$data" "$rdir" "$tdir"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
  -keyout "$tdir/key.pem" -out "$tdir/cert.pem" 2>/dev/null
RUNNER=qemu-aarch64 start_relay smoke-aarch64-tls "$log" RELAY_TLS_CERT="$tdir/cert.pem" RELAY_TLS_KEY="$tdir/key.pem"
qemu-aarch64 "$bin" health --url "https://$ADDR" --ca "$tdir/cert.pem" >/dev/null
cargo build --quiet --bin relay
target/debug/relay health --url "https://$ADDR" --ca "$tdir/cert.pem" >/dev/null
kill -TERM $SERVER_PID
wait $SERVER_PID
echo "aarch64 smoke test passed over TLS (server and client under qemu)"
