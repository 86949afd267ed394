#!/usr/bin/env bash
# Builds the FROM scratch container images (Containerfile) from the static
# musl builds, with Debian's buildah and no container daemon, and prints the
# size of each image.
#
#   scripts/image.sh              # amd64 and arm64, tagged relay:amd64, relay:arm64
#   scripts/image.sh amd64        # one architecture
#   IMAGE=registry.example.com/relay scripts/image.sh
#
# Also makes the manifest list $IMAGE:latest naming the images built, for
# `buildah manifest push --all`. Installs buildah (apt) and the rustup
# targets when missing. The images live in buildah's storage with the vfs
# driver (no overlay mounts needed), built with chroot isolation (no
# namespaces needed); podman sees them with `podman --storage-driver vfs`.
#
# Environment:
#   IMAGE           repository name (default localhost/relay)
#   MAX_IMAGE_BYTES fail when an image is larger, uncompressed (default 4194304:
#                   the 4 MiB footprint budget of the static binary with
#                   everything, which the image's few KB must fit in too)
#   OCI_DIR         also write each image there as an OCI archive,
#                   relay-<version>-image-<arch>.oci.tar, tagged relay:<version>
#                   (scripts/release.sh: dist/). The OCI format has no
#                   HEALTHCHECK field, so these archives carry none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

IMAGE="${IMAGE:-localhost/relay}"
MAX_IMAGE_BYTES="${MAX_IMAGE_BYTES:-4194304}"
BUILDAH=(buildah --storage-driver vfs)
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
OCI_DIR="${OCI_DIR:-}"

musl_target() {
  case "$1" in
    amd64) echo x86_64-unknown-linux-musl ;;
    arm64) echo aarch64-unknown-linux-musl ;;
    *) echo "image.sh: unknown architecture '$1' (amd64, arm64)" >&2; exit 2 ;;
  esac
}

need_buildah() {
  command -v buildah >/dev/null && return
  echo "image.sh: installing buildah (apt)" >&2
  local sudo=""
  [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null
}

# The static binary for a cargo target, built when missing or stale (cargo
# decides; a fresh build is a no-op).
build_binary() {
  local target="$1"
  scripts/static-toolchain.sh "$target"
  cargo build --release --quiet --target "$target"
}

# Bytes of an image as a registry stores it: "uncompressed compressed", each
# the layers plus the config (the manifest is a few hundred bytes more).
image_bytes() {
  local ref="$1" dir sizes=()
  for flag in --disable-compression ""; do
    dir="$(mktemp -d)"
    "${BUILDAH[@]}" push --quiet $flag "$ref" "dir:$dir" >/dev/null
    sizes+=("$(find "$dir" -type f ! -name manifest.json ! -name version -printf '%s\n' \
      | awk '{ s += $1 } END { print s }')")
    rm -rf "$dir"
  done
  echo "${sizes[@]}"
}

build_image() {
  local arch="$1" target
  target="$(musl_target "$arch")"
  build_binary "$target"
  # The image this replaces would stay behind untagged at each rebuild.
  "${BUILDAH[@]}" rmi "$IMAGE:$arch" >/dev/null 2>&1 || true
  "${BUILDAH[@]}" build --quiet --isolation chroot --format docker \
    --arch "$arch" --os linux \
    --build-arg RELAY_TARGET="$target" \
    --build-arg RELAY_VERSION="$VERSION" \
    --build-arg RELAY_REVISION="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --build-arg RELAY_CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -f Containerfile -t "$IMAGE:$arch" . >/dev/null
}

main() {
  local archs=("$@") failed=0
  [[ ${#archs[@]} -gt 0 ]] || archs=(amd64 arm64)
  need_buildah
  "${BUILDAH[@]}" manifest rm "$IMAGE:latest" >/dev/null 2>&1 || true
  "${BUILDAH[@]}" manifest create "$IMAGE:latest" >/dev/null
  for arch in "${archs[@]}"; do
    build_image "$arch"
    "${BUILDAH[@]}" manifest add "$IMAGE:latest" "containers-storage:$IMAGE:$arch" >/dev/null
    read -r raw packed < <(image_bytes "$IMAGE:$arch")
    printf '%s:%s  %d bytes (%d KiB), %d bytes compressed (binary %d bytes)\n' \
      "$IMAGE" "$arch" "$raw" $((raw / 1024)) "$packed" \
      "$(stat -c %s "target/$(musl_target "$arch")/release/relay")"
    if [[ -n "$OCI_DIR" ]]; then
      local archive="$OCI_DIR/relay-$VERSION-image-$arch.oci.tar"
      mkdir -p "$OCI_DIR"
      rm -f "$archive"
      "${BUILDAH[@]}" push --quiet "$IMAGE:$arch" "oci-archive:$archive:relay:$VERSION" >/dev/null
      printf '%s  %d bytes\n' "$archive" "$(stat -c %s "$archive")"
    fi
    if ((raw > MAX_IMAGE_BYTES)); then
      echo "image.sh: $IMAGE:$arch is $raw bytes, over the limit of $MAX_IMAGE_BYTES" >&2
      failed=1
    fi
  done
  return "$failed"
}

main "$@"
