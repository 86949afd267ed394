# Sourced by the scripts that run the real server: find or build the binary,
# start it on a free loopback port, and stop it again.
#
#   . "$ROOT/scripts/lib.sh"
#   relay_binary                       # sets RELAY_BIN (builds release if unset)
#   start_relay NAME LOG [VAR=VALUE…]  # sets SERVER_PID and ADDR; extra env for the server
#   RUNNER=qemu-aarch64 start_relay …  # run the binary under a runner
#   stop_relay                         # SIGTERM, then SIGKILL after 3 s
#   apt_install PACKAGE…               # Debian packages, when missing
#   RUNNER=… smoke_relay LABEL BINARY  # --version and round trips (below)
# The caller's EXIT trap should call stop_relay (and smoke_cleanup).

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
  # Emptied here, not by the background job's redirect: that runs after
  # the fork, and the loop below could read the last server's address.
  : >"$log"
  env RELAY_HOST=127.0.0.1 RELAY_PORT=0 RELAY_LOG_FORMAT=json RELAY_LOG=info "$@" \
    ${RUNNER:-} "$RELAY_BIN" 2>>"$log" &
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

# Installs Debian packages that are missing (apt; sudo when not root).
#   apt_install PACKAGE…
apt_install() {
  local missing=() pkg sudo=""
  for pkg in "$@"; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  [[ ${#missing[@]} -gt 0 ]] || return 0
  echo "installing ${missing[*]} (apt)" >&2
  [[ "$(id -u)" -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Smoke test of a (possibly cross-built) binary, under RUNNER when set
# (qemu-aarch64, qemu-arm -L …): `--version` prints "relay VERSION", then a
# prompt, its long-poll, the response and its WebSocket message
# (examples/smoke.rs, built natively) against the server three times: in
# memory, with a data directory (SQLite compiled for the target), and with
# its sessions in a Redis (Debian's redis-server, native, on a free port);
# each time SIGTERM must end the server with status 0. Then TLS, with ring's
# code for the target on both ends: the server with a certificate made on
# the fly, and `relay health` over https:// from the same binary and from a
# native build. Needs target/debug/examples/smoke and target/debug/relay
# (cargo build --example smoke --bin relay), redis-server and openssl. The
# caller's EXIT trap should call stop_relay and smoke_cleanup.
#   RUNNER=… smoke_relay LABEL BINARY
SMOKE_TMP=""
SMOKE_REDIS_PORT=""

smoke_relay() {
  local label="$1" version want log data rport sessions
  RELAY_BIN="$2"
  want="relay $(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
  version="$(${RUNNER:-} "$RELAY_BIN" --version)"
  [[ "$version" == "$want" ]] || { echo "$label: --version printed '$version', expected '$want'" >&2; return 1; }
  echo "ok   $label: --version: $version"
  smoke_cleanup
  SMOKE_TMP="$(mktemp -d)"
  log="$SMOKE_TMP/log" data="$SMOKE_TMP/data"
  mkdir "$data" "$SMOKE_TMP/redis"

  start_relay "$label" "$log"
  _smoke_round_trip "$label" "$log" | sed "s/^/     $label: /"
  _smoke_stop "$label" "$log"
  echo "ok   $label: round trip in memory, clean exit after SIGTERM"

  start_relay "$label-data" "$log" RELAY_DATA_DIR="$data"
  _smoke_round_trip "$label" "$log" >/dev/null
  _smoke_stop "$label" "$log"
  [[ -s "$data/relay.db" ]] || { echo "$label: no database written in $data" >&2; return 1; }
  echo "ok   $label: round trip with a data directory ($(stat -c %s "$data/relay.db") bytes of database)"

  rport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$rport" --bind 127.0.0.1 --dir "$SMOKE_TMP/redis" --save '' --appendonly no \
    --daemonize yes >/dev/null
  SMOKE_REDIS_PORT="$rport"
  for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
  start_relay "$label-redis" "$log" RELAY_REDIS_URL="redis://127.0.0.1:$rport"
  for _ in $(seq 1 300); do grep -q '"connected to Redis"' "$log" && break; sleep 0.1; done
  grep -q '"connected to Redis"' "$log" || { cat "$log" >&2; echo "$label: never reached Redis" >&2; return 1; }
  _smoke_round_trip "$label" "$log" >/dev/null
  _smoke_stop "$label" "$log"
  sessions=$(redis-cli -p "$rport" zcard relay:sessions)
  [[ "$sessions" -ge 1 ]] || { echo "$label: no session stored in Redis" >&2; return 1; }
  echo "ok   $label: round trip with Redis ($sessions session(s) stored there)"
  redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
  SMOKE_REDIS_PORT=""

  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
    -keyout "$SMOKE_TMP/key.pem" -out "$SMOKE_TMP/cert.pem" 2>/dev/null
  start_relay "$label-tls" "$log" RELAY_TLS_CERT="$SMOKE_TMP/cert.pem" RELAY_TLS_KEY="$SMOKE_TMP/key.pem"
  ${RUNNER:-} "$RELAY_BIN" health --url "https://$ADDR" --ca "$SMOKE_TMP/cert.pem" >/dev/null ||
    { cat "$log" >&2; echo "$label: relay health over TLS (same binary) failed" >&2; return 1; }
  "$ROOT/target/debug/relay" health --url "https://$ADDR" --ca "$SMOKE_TMP/cert.pem" >/dev/null ||
    { cat "$log" >&2; echo "$label: relay health over TLS (native client) failed" >&2; return 1; }
  _smoke_stop "$label" "$log"
  echo "ok   $label: TLS: relay health over https:// from this binary and from a native one"
  smoke_cleanup
}

# examples/smoke.rs against the server at ADDR; the server's log on failure.
_smoke_round_trip() {
  "$ROOT/target/debug/examples/smoke" "$ADDR" ||
    { cat "$2" >&2; echo "$1: round trip failed against $ADDR" >&2; return 1; }
}

# SIGTERM, and the server must exit 0.
_smoke_stop() {
  local status=0
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || status=$?
  SERVER_PID=""
  [[ "$status" -eq 0 ]] || { cat "$2" >&2; echo "$1: the server exited $status after SIGTERM" >&2; return 1; }
}

smoke_cleanup() {
  if [[ -n "$SMOKE_REDIS_PORT" ]]; then
    redis-cli -p "$SMOKE_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    SMOKE_REDIS_PORT=""
  fi
  if [[ -n "$SMOKE_TMP" ]]; then
    rm -rf "$SMOKE_TMP"
    SMOKE_TMP=""
  fi
}
