#!/usr/bin/env bash
# What the static musl builds need, installed only when missing: the Rust
# target, and zig (PyPI `ziglang`) as the C compiler of the bundled SQLite
# (.cargo/config.toml points cc-rs at scripts/zig-cc-<arch>).
#
#   scripts/static-toolchain.sh x86_64-unknown-linux-musl [aarch64-unknown-linux-musl]
set -euo pipefail
PYTHON="${PYTHON:-python3}"
for target in "$@"; do
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
done
if ! "$PYTHON" -m ziglang version >/dev/null 2>&1; then
  echo "static-toolchain: installing ziglang (pip)" >&2
  "$PYTHON" -m pip install --quiet --disable-pip-version-check ziglang >&2
fi
