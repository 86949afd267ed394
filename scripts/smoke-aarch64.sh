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
echo "aarch64 smoke test passed (clean exit after SIGTERM)"
