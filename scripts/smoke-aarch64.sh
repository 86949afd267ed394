#!/usr/bin/env bash
# Builds the static Raspberry Pi binary (aarch64-unknown-linux-musl, linked by
# rust-lld), runs it under qemu-aarch64, and checks a prompt, a long-poll and a
# WebSocket message against it with examples/smoke.rs.
# Needs: rustup target aarch64-unknown-linux-musl, Debian's qemu-user.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rustup target list --installed | grep -q aarch64-unknown-linux-musl || rustup target add aarch64-unknown-linux-musl
command -v qemu-aarch64 >/dev/null || { apt-get update -qq && apt-get install -y -qq qemu-user; }
cargo build --release --target aarch64-unknown-linux-musl
bin=target/aarch64-unknown-linux-musl/release/relay
file "$bin" 2>/dev/null || true
printf 'size: %s bytes\n' "$(stat -c %s "$bin")"
cargo build --example smoke
log=$(mktemp)
RELAY_HOST=127.0.0.1 RELAY_PORT=0 RELAY_LOG_FORMAT=json qemu-aarch64 "$bin" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
addr=
for _ in $(seq 300); do
  addr=$(sed -n 's/.*"event":"listening".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -1)
  [ -n "$addr" ] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "relay under qemu exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { cat "$log"; echo "relay under qemu did not start" >&2; exit 1; }
echo "relay (aarch64, qemu) listening on $addr"
target/debug/examples/smoke "$addr"
kill -TERM $pid
wait $pid
echo "aarch64 smoke test passed (clean exit after SIGTERM)"
