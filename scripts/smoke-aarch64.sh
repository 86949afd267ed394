#!/usr/bin/env bash
# Builds the static Raspberry Pi binary (aarch64-unknown-linux-musl, linked by
# rust-lld, SQLite's C by zig), runs it under qemu-aarch64, and checks
# `--version`, then a prompt, a long-poll and a WebSocket message against it
# with examples/smoke.rs, in memory, with a data directory, and with its
# sessions in Redis, then TLS with ring's aarch64 code on both ends
# (smoke_relay in scripts/lib.sh). scripts/release.sh does the same for
# every release binary; this is the quick check of one.
# Installs what is missing: the rustup target and PyPI ziglang
# (scripts/static-toolchain.sh), Debian's qemu-user, redis-server, openssl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
. scripts/lib.sh
scripts/static-toolchain.sh aarch64-unknown-linux-musl
apt_install qemu-user redis-server openssl
cargo build --release --target aarch64-unknown-linux-musl
bin=target/aarch64-unknown-linux-musl/release/relay
file "$bin" 2>/dev/null || true
printf 'size: %s bytes\n' "$(stat -c %s "$bin")"
cargo build --example smoke --bin relay
trap 'stop_relay; smoke_cleanup' EXIT
RUNNER=qemu-aarch64 smoke_relay aarch64 "$bin"
echo "aarch64 smoke test passed"
