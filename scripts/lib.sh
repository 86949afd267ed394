# Sourced by the scripts that run the real server: find or build the binary,
# start it on a free loopback port, and stop it again.
#
#   . "$ROOT/scripts/lib.sh"
#   relay_binary                       # sets RELAY_BIN (builds release if unset)
#   start_relay NAME LOG [VAR=VALUE…]  # sets SERVER_PID and ADDR; extra env for the server
#   RUNNER=qemu-aarch64 start_relay …  # run the binary under a runner
#   stop_relay                         # SIGTERM, then SIGKILL after 3 s
# The caller's EXIT trap should call stop_relay.

SERVER_PID=""
ADDR=""

relay_binary() {
  if [[ -z "${RELAY_BIN:-}" ]]; then
    cargo build --release --quiet
    RELAY_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/relay"
  fi
  [[ -x "$RELAY_BIN" ]] || { echo "no relay binary at $RELAY_BIN" >&2; exit 2; }
}

start_relay() {
  local name="$1" log="$2"
  shift 2
  env RELAY_HOST=127.0.0.1 RELAY_PORT=0 RELAY_LOG_FORMAT=json RELAY_LOG=info "$@" \
    ${RUNNER:-} "$RELAY_BIN" 2>"$log" &
  SERVER_PID=$!
  ADDR=""
  for _ in $(seq 1 300); do
    ADDR="$(sed -n 's/.*"event":"listening".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -n1)"
    [[ -n "$ADDR" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; echo "$name: server exited" >&2; exit 2; }
    sleep 0.1
  done
  [[ -n "$ADDR" ]] || { cat "$log" >&2; echo "$name: no listening line" >&2; exit 2; }
}

stop_relay() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
}
