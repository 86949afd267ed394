#!/usr/bin/env bash
# Builds the release artifacts into dist/, smoke-tests every binary, and
# writes dist/SHA256SUMS:
#
#   relay-<version>-x86_64-linux            static (musl): any x86_64 Linux
#   relay-<version>-aarch64-linux           static (musl): 64-bit Raspberry Pi OS, ARM VPS
#   relay-<version>-armv7-linux-gnueabihf   32-bit Raspberry Pi OS (Pi 2 and up),
#                                           dynamically linked, glibc >= 2.31
#   relay-<version>-image-amd64.oci.tar     the FROM scratch image (Containerfile)
#   relay-<version>-image-arm64.oci.tar     as OCI archives (scripts/image.sh)
#
# armv7 is the glibc target because the Rust standard library for armv7 musl
# cannot be downloaded here; zig compiles and links it against glibc 2.31
# (scripts/zig-cc), and this script checks that the binary asks for nothing
# newer. There is no arm/v7 image: a FROM scratch image would need the
# loader and libc copied in; 32-bit Pi users run the binary (deploy/).
#
# Each binary is smoke-tested where it would run: x86_64 natively, the ARM
# ones under Debian's qemu-user (armv7 with the armhf libc of
# libc6-armhf-cross): `--version`, then a prompt, its long-poll, the response
# and its WebSocket message (examples/smoke.rs) in memory, with a data
# directory and with Redis, and a clean exit on SIGTERM; then TLS, ring's
# code for the target on both ends (smoke_relay in scripts/lib.sh).
#
# The static binaries are also run under qemu-user through their start and
# first requests (scripts/symbol-order.py): if that code spreads over more
# than ORDER_WINDOWS 64 KiB windows, the symbol ordering has gone stale and
# the idle RSS has grown by 64 KiB a window; scripts/symbol-order.sh
# rewrites it.
#
# Installs what is missing: the rustup targets and PyPI ziglang
# (scripts/static-toolchain.sh); Debian's qemu-user, libc6-armhf-cross,
# redis-server, openssl and buildah (apt).
#
# Environment:
#   DIST    output directory (default dist); emptied first
#   IMAGES  0 to skip the container images (default 1)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
. scripts/lib.sh

DIST="${DIST:-dist}"
IMAGES="${IMAGES:-1}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
ARMHF_ROOT=/usr/arm-linux-gnueabihf
# The newest glibc symbol version the armv7 binary may need (Bullseye's).
ARMV7_GLIBC=2.31
# The most 64 KiB windows of code the static binaries' start and first
# requests may run in: 8 on x86_64 and 7 on aarch64 with a fresh ordering,
# about 30 without one.
ORDER_WINDOWS=12
started=$SECONDS

# file name suffix, cargo target
RELEASES=(
  "x86_64-linux x86_64-unknown-linux-musl"
  "aarch64-linux aarch64-unknown-linux-musl"
  "armv7-linux-gnueabihf armv7-unknown-linux-gnueabihf"
)

runner() {
  case "$1" in
    x86_64-unknown-linux-musl) [[ "$(uname -m)" == x86_64 ]] || echo qemu-x86_64 ;;
    aarch64-unknown-linux-musl) [[ "$(uname -m)" == aarch64 ]] || echo qemu-aarch64 ;;
    armv7-unknown-linux-gnueabihf) echo "qemu-arm -L $ARMHF_ROOT" ;;
  esac
}

step() { printf '\n== %s\n' "$*"; }
fail() { echo "release: FAIL $*" >&2; exit 1; }

# The musl binaries need nothing; the armv7 one the system's glibc, no newer
# than ARMV7_GLIBC.
check_linkage() {
  local file="$1" target="$2" newest
  case "$target" in
    *-musl)
      ! readelf -lW "$file" | grep -q INTERP || fail "$file needs a loader"
      ! readelf -dW "$file" | grep -q NEEDED || fail "$file needs shared libraries"
      echo "ok   $(basename "$file"): static"
      ;;
    *-gnueabihf)
      newest="$(readelf -VW "$file" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n1)"
      [[ "$(printf '%s\n%s\n' "$newest" "$ARMV7_GLIBC" | sort -V | tail -n1)" == "$ARMV7_GLIBC" ]] ||
        fail "$file needs glibc $newest, newer than $ARMV7_GLIBC"
      echo "ok   $(basename "$file"): needs $(readelf -dW "$file" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | paste -sd ' ') (glibc >= $newest)"
      ;;
  esac
}

step "toolchains"
targets=()
for r in "${RELEASES[@]}"; do targets+=("${r#* }"); done
scripts/static-toolchain.sh "${targets[@]}"
apt_install qemu-user libc6-armhf-cross redis-server openssl binutils
echo "ok   rustup targets ${targets[*]}, ziglang, qemu-user, libc6-armhf-cross"

rm -rf "$DIST"
mkdir -p "$DIST"
for r in "${RELEASES[@]}"; do
  read -r suffix target <<<"$r"
  step "build $target"
  cargo build --release --locked --target "$target"
  cp "target/$target/release/relay" "$DIST/relay-$VERSION-$suffix"
  check_linkage "$DIST/relay-$VERSION-$suffix" "$target"
  if [[ "$target" == *-musl ]]; then
    python3 scripts/symbol-order.py check "$target" "$DIST/relay-$VERSION-$suffix" "$ORDER_WINDOWS"
  fi
  # The tests' clock (the `test-clock` feature, src/time.rs) is built for
  # the test targets only: a release that reads RELAY_TEST_CLOCK_FILE
  # would let its environment move its clock.
  if grep -q RELAY_TEST_CLOCK_FILE "$DIST/relay-$VERSION-$suffix"; then
    echo "release.sh: relay-$VERSION-$suffix carries the tests' clock (feature test-clock)" >&2
    exit 1
  fi
done

step "smoke tests"
cargo build --quiet --locked --example smoke --bin relay
trap 'stop_relay; smoke_cleanup' EXIT
for r in "${RELEASES[@]}"; do
  read -r suffix target <<<"$r"
  RUNNER="$(runner "$target")" smoke_relay "$suffix" "$DIST/relay-$VERSION-$suffix"
done

if [[ "$IMAGES" != 0 ]]; then
  step "images"
  OCI_DIR="$DIST" scripts/image.sh amd64 arm64
fi

step "checksums"
(cd "$DIST" && sha256sum relay-* >SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
echo "ok   $DIST/SHA256SUMS"
echo
ls -l "$DIST" | tail -n +2
echo "release: relay $VERSION, $(find "$DIST" -name 'relay-*' | wc -l) artifacts in $DIST/ ($((SECONDS - started)) s)"
