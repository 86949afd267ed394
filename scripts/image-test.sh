#!/usr/bin/env bash
# Builds the amd64 container image (scripts/image.sh: fails when it is over
# 4 MiB) and runs it without a container daemon: `buildah run` with chroot
# isolation and the host's network, so the server's port is a real port on
# this machine and every request below goes to 127.0.0.1. Checks:
#   - the image: numeric non-root user, /data volume owned by it, port 8000,
#     RELAY_HOST, the shell-less HEALTHCHECK, OCI labels, only /relay and /data
#     in its root;
#   - the server starts from the image's own settings with no warning about
#     an unknown RELAY_* variable, and runs as 65532:65532;
#   - GET /healthz answers 200;
#   - a prompt, its long-poll, the response and its WebSocket message
#     (examples/smoke.rs);
#   - `relay send` inside the image gets the answer of `relay agent` on the host;
#   - the image's HEALTHCHECK command exits 0, and 1 once the server is gone;
#   - SIGTERM stops the server cleanly.
# Needs root (buildah's chroot isolation); installs buildah when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

IMAGE="${IMAGE:-localhost/relay}"
BUILDAH=(buildah --storage-driver vfs)
CTR=""
RUN_PID=""
SERVER_PID=""
AGENT_PID=""
log="$(mktemp)"
agent_log="$(mktemp)"

fail() {
  echo "image-test: FAIL $*" >&2
  echo "--- server log" >&2
  cat "$log" >&2
  exit 1
}
ok() { echo "ok   $*"; }

stop_pid() {
  local pid="$1"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  stop_pid "$AGENT_PID"
  stop_pid "$SERVER_PID"
  stop_pid "$RUN_PID"
  [[ -z "$CTR" ]] || "${BUILDAH[@]}" rm "$CTR" >/dev/null 2>&1 || true
  rm -f "$log" "$agent_log"
}
trap cleanup EXIT

# One field of the image's configuration (docker format), as JSON.
config() {
  "${BUILDAH[@]}" inspect --type image "$IMAGE:amd64" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["Docker"]["config"].get(sys.argv[1])))' "$1"
}

expect_config() {
  local got
  got="$(config "$1")"
  [[ "$got" == "$2" ]] || fail "image $1 is $got, expected $2"
  ok "image $1 $got"
}

check_image() {
  expect_config User '"65532:65532"'
  expect_config ExposedPorts '{"8000/tcp": {}}'
  expect_config Volumes '{"/data": {}}'
  expect_config Entrypoint '["/relay"]'
  config Env | grep -q '"RELAY_HOST=0.0.0.0"' || fail "image Env lacks RELAY_HOST=0.0.0.0"
  ok "image Env has RELAY_HOST=0.0.0.0"
  config Healthcheck | grep -q '"Test": \["CMD", "/relay", "health"\]' ||
    fail "image HEALTHCHECK is $(config Healthcheck)"
  ok "image HEALTHCHECK CMD [\"/relay\", \"health\"]"
  config Labels | grep -q '"org.opencontainers.image.licenses": "MIT"' || fail "no OCI labels"
  ok "image OCI labels"
  local root
  root="$("${BUILDAH[@]}" mount "$CTR")"
  [[ "$(cd "$root" && echo *)" == "data relay" ]] || fail "image root holds $(cd "$root" && echo *)"
  [[ "$(stat -c %u:%g "$root/data")" == "65532:65532" ]] || fail "/data is owned by $(stat -c %u:%g "$root/data")"
  ok "image root is /relay and /data (owned by 65532:65532)"
  # Static: no program interpreter (loader) and no shared library needed.
  readelf -lW "$root/relay" >/dev/null 2>&1 || fail "/relay is not an ELF binary"
  ! readelf -lW "$root/relay" | grep -q INTERP || fail "/relay needs a loader"
  ! readelf -dW "$root/relay" | grep -q NEEDED || fail "/relay needs shared libraries"
  ok "/relay is a static binary"
  "${BUILDAH[@]}" umount "$CTR" >/dev/null
}

# Starts the image's server on a free port (RELAY_PORT=0; everything else
# as the image sets it); sets RUN_PID, SERVER_PID and PORT.
start_server() {
  "${BUILDAH[@]}" run --isolation chroot --network host --env RELAY_PORT=0 "$CTR" -- /relay \
    >/dev/null 2>"$log" &
  RUN_PID=$!
  PORT=""
  for _ in $(seq 1 100); do
    PORT="$(sed -n 's/.*listening addr=0\.0\.0\.0:\([0-9]*\).*/\1/p' "$log" | head -n1)"
    [[ -n "$PORT" ]] && break
    kill -0 "$RUN_PID" 2>/dev/null || fail "the container exited"
    sleep 0.1
  done
  [[ -n "$PORT" ]] || fail "no listening line within 10 s"
  SERVER_PID="$(ss -Hltnp "sport = :$PORT" | sed -n 's/.*"relay",pid=\([0-9]*\).*/\1/p' | head -n1)"
  [[ -n "$SERVER_PID" ]] || fail "no relay process listens on port $PORT"
  ok "server from the image listening on 0.0.0.0:$PORT"
  ! grep -q 'is not a setting' "$log" || fail "the image sets an unknown RELAY_* variable"
  ok "no unknown-setting warning at start"
  local ids
  ids="$(awk '/^Uid:/ { u = $2 } /^Gid:/ { g = $2 } END { print u ":" g }' "/proc/$SERVER_PID/status")"
  [[ "$ids" == "65532:65532" ]] || fail "server runs as $ids"
  ok "server runs as 65532:65532"
}

# The image's own HEALTHCHECK command, run in the container with the
# server's port (as a runtime does: same environment as the server).
healthcheck() {
  local cmd
  mapfile -t cmd < <(config Healthcheck | python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)["Test"][1:]))')
  timeout 20 "${BUILDAH[@]}" run --isolation chroot --network host --env RELAY_PORT="$PORT" \
    "$CTR" -- "${cmd[@]}"
}

check_round_trips() {
  local status answer
  status="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT/healthz")"
  [[ "$status" == 200 ]] || fail "GET /healthz answered $status"
  ok "GET /healthz 200"
  timeout 60 target/debug/examples/smoke "127.0.0.1:$PORT" || fail "round trip (examples/smoke)"
  local bin="target/x86_64-unknown-linux-musl/release/relay"
  "$bin" agent --session image-cli --url "http://127.0.0.1:$PORT" -- tr a-z A-Z 2>"$agent_log" &
  AGENT_PID=$!
  answer="$(timeout 60 "${BUILDAH[@]}" run --isolation chroot --network host "$CTR" -- \
    /relay send --session image-cli --url "http://127.0.0.1:$PORT" --timeout 20 hello 2>/dev/null)" ||
    { cat "$agent_log" >&2; fail "relay send in the image"; }
  [[ "$answer" == HELLO ]] || fail "relay send printed '$answer', expected HELLO"
  ok "relay send (in the image) -> relay agent (host): HELLO"
  kill -TERM "$AGENT_PID"
  wait "$AGENT_PID" || fail "relay agent did not exit 0 on SIGTERM"
  AGENT_PID=""
  healthcheck >/dev/null || fail "the HEALTHCHECK command exited $?"
  ok "HEALTHCHECK command in the image exits 0"
}

check_shutdown() {
  kill -TERM "$SERVER_PID"
  wait "$RUN_PID" || fail "the container exited $? after SIGTERM"
  RUN_PID=""
  SERVER_PID=""
  grep -q 'shutdown complete' "$log" || fail "no 'shutdown complete' after SIGTERM"
  ok "SIGTERM: clean exit"
  if healthcheck >/dev/null 2>&1; then fail "the HEALTHCHECK passed with no server"; fi
  ok "HEALTHCHECK command exits non-zero with no server"
}

scripts/image.sh amd64
cargo build --quiet --example smoke
CTR="$("${BUILDAH[@]}" from "$IMAGE:amd64")"
check_image
start_server
check_round_trips
check_shutdown
echo "image-test: $IMAGE:amd64 passed"
