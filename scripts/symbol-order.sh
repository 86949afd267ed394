#!/usr/bin/env bash
# Writes scripts/symbol-order/<target>.txt, the functions the static binary
# runs from exec through its first requests, which lld places first in
# .text (.cargo/config.toml): the kernel maps 64 KiB of the binary around
# each page the start touches, so the start's code, gathered, costs a few
# of those windows instead of most of the 2 MiB idle RSS target
# (docs/src/benchmarks.md, "Footprint").
#
#   scripts/symbol-order.sh                                # both static targets
#   scripts/symbol-order.sh aarch64-unknown-linux-musl
#
# Run it when scripts/release.sh says the start's code has spread: Rust's
# symbol names end in a hash of the crate's version, dependencies and
# compiler, so a version bump, `cargo update` or a new rustc renames most
# of the functions, while a change to their bodies renames nothing. For
# each target it links the release binary once with its symbol table
# (same names as the release, which is linked without one), runs it under
# qemu-user through the start, /healthz, /readyz, a WebSocket subscribe, a
# prompt, its long-poll and the response (scripts/symbol-order.py), writes
# the list, and builds the release again with it: one or two release links
# per target.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/lib.sh
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
scripts/static-toolchain.sh "${targets[@]}"
apt_install qemu-user
for target in "${targets[@]}"; do
  list="scripts/symbol-order/$target.txt"
  [[ -f "$list" ]] || echo "# Written by scripts/symbol-order.sh." >"$list"
  # Same crate hashes as the release; only the linker keeps the symbols.
  cargo rustc --release --locked --target "$target" --bin relay -- -C strip=debuginfo
  symbols=$(mktemp)
  install -m 755 "target/$target/release/relay" "$symbols"
  python3 scripts/symbol-order.py write "$target" "$symbols" "$list"
  rm -f "$symbols"
  # The release, linked with the new list: cargo does not see a list
  # change, and keeps the release and the symbol-table link apart, so the
  # binary's crate is made to build again.
  touch src/main.rs
  cargo build --release --locked --target "$target"
  python3 scripts/symbol-order.py check "$target" "target/$target/release/relay"
done
