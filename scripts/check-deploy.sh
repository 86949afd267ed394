#!/usr/bin/env bash
# Checks the deployment files in deploy/ for real, with no network beyond
# 127.0.0.1:
#   relay.service  `systemd-analyze verify` in a scratch root holding the
#                  unit, systemd's own units and the static binary at the
#                  ExecStart path (any message fails the check, since verify
#                  exits 0 on unknown keys and bad values), the directives
#                  the sandbox relies on, and `systemd-analyze security`
#                  (fails above MAX_EXPOSURE);
#   relay.env      the unit's Environment= lines plus this file start the
#                  server on 127.0.0.1 with no warning;
#   relay-tls.conf the unit with this drop-in verified and rated the same
#                  way (MAX_EXPOSURE_TLS: it adds one capability), then its
#                  environment with a certificate made on the fly: the
#                  server answers `relay health` over https:// and reloads
#                  the pair on SIGHUP (the drop-in's ExecReload);
#   nginx.conf     `nginx -t` with a self-signed certificate made on the fly
#                  in a temporary prefix, then nginx run from it on free
#                  loopback ports in front of that server: the plain port
#                  redirects, and a WebSocket, a parked long-poll, a prompt
#                  and a response go through TLS (scripts/proxy_roundtrip.py);
#                  then the same with two relays on one Redis behind it
#                  (the upstream's second line), each answering some;
#   fly.toml       parsed, and the settings that matter checked: the /data
#                  volume, port 8000, the /healthz check, connection
#                  concurrency below the server's cap, one machine always up.
# Installs systemd, nginx, caddy, openssl and redis-server (apt) when missing; builds the static
# x86_64 binary when missing.
#
# Environment: MAX_EXPOSURE (default 1.5, systemd's 0-10 scale),
# MAX_EXPOSURE_TLS (default 2.0, with deploy/relay-tls.conf).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
. scripts/lib.sh

MAX_EXPOSURE="${MAX_EXPOSURE:-1.5}"
MAX_EXPOSURE_TLS="${MAX_EXPOSURE_TLS:-2.0}"
TARGET=x86_64-unknown-linux-musl
RELAY_BIN="target/$TARGET/release/relay"
tmp="$(mktemp -d)"
NGINX_PID=""
CADDY_PID=""
log="$tmp/relay.log"

OTHER_PID=""
REDIS_PORT=""

cleanup() {
  stop_nginx
  stop_caddy
  stop_relay
  if [[ -n "$OTHER_PID" ]]; then
    kill -TERM "$OTHER_PID" 2>/dev/null
    wait "$OTHER_PID" 2>/dev/null
  fi
  [[ -n "$REDIS_PORT" ]] && redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "check-deploy: FAIL $*" >&2; exit 1; }
ok() { echo "ok   $*"; }

need() {
  local cmd="$1" pkg="$2"
  command -v "$cmd" >/dev/null && return
  echo "check-deploy: installing $pkg (apt)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The directives the unit's sandbox is made of; dropping one fails the check
# even where the exposure score would barely move.
REQUIRED=(
  "DynamicUser=yes" "StateDirectory=relay" "ProtectSystem=strict" "ProtectHome=yes"
  "NoNewPrivileges=yes" "PrivateTmp=yes" "PrivateDevices=yes"
  "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" "CapabilityBoundingSet="
  "SystemCallFilter=@system-service" "MemoryDenyWriteExecute=yes" "LockPersonality=yes"
  "RestrictNamespaces=yes" "Restart=on-failure" "EnvironmentFile=-/etc/relay.env"
  "LimitNOFILE=65536" "ExecStart=/usr/local/bin/relay" "Environment=RELAY_HOST=127.0.0.1"
)

check_unit() {
  local root="$tmp/root" out threshold
  for line in "${REQUIRED[@]}"; do
    grep -qxF "$line" deploy/relay.service || fail "relay.service lacks the line $line"
  done
  ok "relay.service has every sandbox directive"
  mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
  cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/system"
  install -m 0755 "$RELAY_BIN" "$root/usr/local/bin/relay"
  install -m 0644 deploy/relay.service "$root/etc/systemd/system/relay.service"
  out="$(systemd-analyze verify --root="$root" relay.service 2>&1)" || fail "systemd-analyze verify: $out"
  [[ -z "$out" ]] || fail "systemd-analyze verify: $out"
  ok "systemd-analyze verify relay.service: no message"
  threshold="$(awk -v x="$MAX_EXPOSURE" 'BEGIN { printf "%d", x * 10 + 0.5 }')"
  out="$(systemd-analyze security --offline=true --root="$root" --threshold="$threshold" relay.service 2>&1)" ||
    fail "systemd-analyze security above $MAX_EXPOSURE: $(grep -E '✗|Overall' <<<"$out")"
  grep 'Overall exposure level' <<<"$out" | sed 's/^→ /ok   /'
  # The same unit with the built-in TLS drop-in.
  install -D -m 0644 deploy/relay-tls.conf "$root/etc/systemd/system/relay.service.d/tls.conf"
  install -D -m 0755 /bin/kill "$root/bin/kill"  # its ExecReload
  out="$(systemd-analyze verify --root="$root" relay.service 2>&1)" || fail "systemd-analyze verify (tls.conf): $out"
  [[ -z "$out" ]] || fail "systemd-analyze verify (tls.conf): $out"
  ok "systemd-analyze verify relay.service with relay-tls.conf: no message"
  threshold="$(awk -v x="$MAX_EXPOSURE_TLS" 'BEGIN { printf "%d", x * 10 + 0.5 }')"
  out="$(systemd-analyze security --offline=true --root="$root" --threshold="$threshold" relay.service 2>&1)" ||
    fail "systemd-analyze security with relay-tls.conf above $MAX_EXPOSURE_TLS: $(grep -E '✗|Overall' <<<"$out")"
  grep 'Overall exposure level' <<<"$out" | sed 's/^→ /ok   (with relay-tls.conf) /'
  rm -r "$root/etc/systemd/system/relay.service.d"
}

# The unit's environment with deploy/relay-tls.conf, its certificate
# made on the fly and its port a free one: https:// answers, and SIGHUP
# (the drop-in's ExecReload) loads a new pair.
check_tls_environment() {
  local env=() dir="$tmp/tls" port out
  mkdir -p "$dir" "$tmp/state-tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=relay.example.com \
    -addext "subjectAltName=DNS:relay.example.com,IP:127.0.0.1" -addext basicConstraints=critical,CA:FALSE \
    -keyout "$dir/privkey.pem" -out "$dir/fullchain.pem" 2>/dev/null
  grep -q '^ExecReload=/bin/kill -HUP \$MAINPID$' deploy/relay-tls.conf || fail "relay-tls.conf: no SIGHUP reload"
  port="$(free_port)"
  mapfile -t env < <(sed -n 's/^Environment=//p' deploy/relay.service deploy/relay-tls.conf |
    sed -e "s|%S|$tmp/state-tls|g" -e "s|/etc/relay/tls/|$dir/|" -e "s|^RELAY_PORT=443$|RELAY_PORT=$port|" \
      -e "s|^RELAY_HOST=0.0.0.0$|RELAY_HOST=127.0.0.1|"
    grep -E '^[A-Z_]+=' deploy/relay.env)
  start_relay check-deploy "$tmp/tls.log" "${env[@]}" RELAY_LOG_FORMAT=json
  [[ "$ADDR" == "127.0.0.1:$port" ]] || fail "relay-tls.conf's environment listens on $ADDR"
  out="$("$RELAY_BIN" health --url "https://127.0.0.1:$port" --ca "$dir/fullchain.pem" 2>&1)" ||
    fail "relay health over https:// with relay-tls.conf's environment: $out"
  ok "relay-tls.conf's environment serves https:// on $ADDR"
  kill -HUP "$SERVER_PID"
  for _ in $(seq 1 50); do grep -q 'TLS certificate reloaded' "$tmp/tls.log" && break; sleep 0.1; done
  grep -q 'TLS certificate reloaded' "$tmp/tls.log" || fail "SIGHUP did not reload the pair: $(cat "$tmp/tls.log")"
  ok "SIGHUP reloads the certificate"
  stop_relay
}

check_environment() {
  local env=()
  # systemd's %S (the state directory root, /var/lib) is a temporary
  # directory here, so the data directory never lands in the repository.
  mkdir -p "$tmp/state"
  mapfile -t env < <(sed -n 's/^Environment=//p' deploy/relay.service | sed "s|%S|$tmp/state|g"
    grep -E '^[A-Z_]+=' deploy/relay.env)
  start_relay check-deploy "$log" "${env[@]}" RELAY_PORT=0 RELAY_LOG_FORMAT=json
  [[ "$ADDR" == 127.0.0.1:* ]] || fail "the unit's environment listens on $ADDR, not on loopback"
  ! grep -q '"level":"\(warn\|error\)"' "$log" || fail "the unit's environment gives warnings: $(cat "$log")"
  ok "the unit's environment and relay.env start the server on $ADDR with no warning"
}

nginx_main_conf() {
  cat <<EOF
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log;
events {}
http {
    access_log off;
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    include $tmp/nginx/site.conf;
}
EOF
}

# check_nginx ADDR [ADDR2]: deploy/nginx.conf in front of the relay at
# ADDR (and, with ADDR2, of a second one: the upstream's commented line).
check_nginx() {
  local dir="$tmp/nginx" out https_port http_port second=""
  rm -rf "$dir"
  mkdir -p "$dir"
  chmod 0755 "$tmp" "$dir"  # nginx's workers run as nobody
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=relay.example.com \
    -addext "subjectAltName=DNS:relay.example.com,IP:127.0.0.1" \
    -keyout "$dir/privkey.pem" -out "$dir/fullchain.pem" 2>/dev/null
  sed "s|/etc/letsencrypt/live/relay.example.com/|$dir/|" deploy/nginx.conf >"$dir/site.conf"
  nginx_main_conf >"$dir/nginx.conf"
  out="$(nginx -t -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>&1)" || fail "nginx -t: $out"
  ! grep -q '\[warn\]\|\[emerg\]' <<<"$out" || fail "nginx -t: $out"
  https_port="$(free_port)"
  http_port="$(free_port)"
  [[ -n "${2:-}" ]] && second="s|# server 127.0.0.1:8001;|server $2;|"
  sed -i -e "s|listen 443 ssl;|listen 127.0.0.1:$https_port ssl;|" -e "s|listen 80;|listen 127.0.0.1:$http_port;|" \
    -e '/listen \[::\]/d' -e "s|server 127.0.0.1:8000;|server $1;|" ${second:+-e "$second"} "$dir/site.conf"
  [[ -z "${2:-}" ]] || grep -q "server $2;" "$dir/site.conf" || fail "deploy/nginx.conf has no line for a second relay"
  out="$(nginx -t -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>&1)" || fail "nginx -t: $out"
  ok "nginx -t deploy/nginx.conf (self-signed certificate, upstream ${*})"
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off;' &
  NGINX_PID=$!
  for _ in $(seq 1 100); do
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$http_port/" && break
    kill -0 "$NGINX_PID" 2>/dev/null || fail "nginx exited: $(cat "$dir/error.log")"
    sleep 0.1
  done
  timeout 60 python3 scripts/proxy_roundtrip.py "$https_port" "$http_port" "$dir/fullchain.pem" ||
    fail "round trip through nginx; its log: $(cat "$dir/error.log")"
  stop_nginx
}

stop_nginx() {
  if [[ -n "$NGINX_PID" ]] && kill -0 "$NGINX_PID" 2>/dev/null; then
    kill -QUIT "$NGINX_PID" 2>/dev/null || true
    wait "$NGINX_PID" 2>/dev/null || true
  fi
  NGINX_PID=""
}

# check_instances PROXY: two relays on one Redis behind the proxy's file
# (check_nginx or check_caddy): the round trip again, its requests spread
# over both (each must have answered some).
check_instances() {
  local proxy="$1" rport first_pid first_addr
  rport="$(free_port)"
  rm -rf "$tmp/redis"
  mkdir -p "$tmp/redis"
  redis-server --port "$rport" --bind 127.0.0.1 --dir "$tmp/redis" --save '' --appendonly no \
    --daemonize yes --pidfile "$tmp/redis/pid" >/dev/null
  REDIS_PORT="$rport"
  for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
  local shared=(RELAY_REDIS_URL="redis://127.0.0.1:$rport" RELAY_LOG=debug)
  start_relay check-deploy "$tmp/a.log" "${shared[@]}"
  first_pid="$SERVER_PID" first_addr="$ADDR"
  start_relay check-deploy "$tmp/b.log" "${shared[@]}"
  OTHER_PID="$first_pid"
  "$proxy" "$first_addr" "$ADDR"
  for l in a b; do
    grep -q '"event":"request"' "$tmp/$l.log" || fail "relay $l answered no request through ${proxy#check_}"
  done
  ok "both relays on one Redis answered requests of the round trip through ${proxy#check_}"
  stop_relay
  kill -TERM "$OTHER_PID" 2>/dev/null
  wait "$OTHER_PID" 2>/dev/null || true
  OTHER_PID=""
  redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
  REDIS_PORT=""
}

# The global options that put deploy/Caddyfile on loopback
# (caddy_globals HTTPS_PORT HTTP_PORT): free ports, no admin endpoint,
# every certificate from Caddy's local CA (not trusted system-wide: the
# round trip trusts its root file), storage in $tmp.
caddy_globals() {
  cat <<EOF
{
	admin off
	http_port $2
	https_port $1
	default_bind 127.0.0.1
	local_certs
	skip_install_trust
	storage file_system $tmp/caddy/data
}
EOF
}

# check_caddy ADDR [ADDR2]: deploy/Caddyfile in front of the relay at ADDR
# (and, with ADDR2, of a second one: the commented `to` line).
check_caddy() {
  local dir="$tmp/caddy" out https_port http_port second=""
  rm -rf "$dir"
  mkdir -p "$dir"
  # Caddy keeps its autosave and certificates under these; never in $HOME.
  export XDG_CONFIG_HOME="$dir/config" XDG_DATA_HOME="$dir/data"
  out="$(caddy validate --config deploy/Caddyfile --adapter caddyfile 2>&1)" || fail "caddy validate: $out"
  ! grep -q '"level":"\(warn\|error\)"' <<<"$out" || fail "caddy validate: $out"
  https_port="$(free_port)"
  http_port="$(free_port)"
  [[ -n "${2:-}" ]] && second="s|# to 127.0.0.1:8001|to $2|"
  { caddy_globals "$https_port" "$http_port"
    sed -e 's|^relay\.example\.com {|127.0.0.1 {|' -e "s|reverse_proxy 127.0.0.1:8000 {|reverse_proxy $1 {|" \
      ${second:+-e "$second"} deploy/Caddyfile; } >"$dir/Caddyfile"
  grep -q "^127.0.0.1 {" "$dir/Caddyfile" || fail "deploy/Caddyfile has no site relay.example.com"
  grep -q "reverse_proxy $1 {" "$dir/Caddyfile" || fail "deploy/Caddyfile does not proxy to 127.0.0.1:8000"
  [[ -z "${2:-}" ]] || grep -q "^[[:space:]]*to $2$" "$dir/Caddyfile" || fail "deploy/Caddyfile has no line for a second relay"
  out="$(caddy validate --config "$dir/Caddyfile" --adapter caddyfile 2>&1)" || fail "caddy validate (loopback copy): $out"
  ok "caddy validate deploy/Caddyfile (as shipped, and on loopback with upstream ${*})"
  caddy run --config "$dir/Caddyfile" --adapter caddyfile >"$dir/caddy.log" 2>&1 &
  CADDY_PID=$!
  # Ready once the local CA issued the site's certificate and the https
  # port answers with it. A probe is never cut short while caddy has it
  # upstream: caddy counts a request its client gave up on as the
  # upstream's failure and skips that relay for fail_duration (10 s),
  # which is the whole round trip.
  local root="$dir/data/pki/authorities/local/root.crt"
  for _ in $(seq 1 100); do
    [[ -f "$root" ]] && curl -s -o /dev/null --max-time 10 --cacert "$root" "https://127.0.0.1:$https_port/healthz" && break
    kill -0 "$CADDY_PID" 2>/dev/null || fail "caddy exited: $(cat "$dir/caddy.log")"
    sleep 0.1
  done
  timeout 60 python3 scripts/proxy_roundtrip.py "$https_port" "$http_port" "$root" ||
    fail "round trip through caddy; its log: $(cat "$dir/caddy.log")"
  stop_caddy
  unset XDG_CONFIG_HOME XDG_DATA_HOME
}

stop_caddy() {
  if [[ -n "$CADDY_PID" ]] && kill -0 "$CADDY_PID" 2>/dev/null; then
    kill -TERM "$CADDY_PID" 2>/dev/null || true
    wait "$CADDY_PID" 2>/dev/null || true
  fi
  CADDY_PID=""
}

check_fly() {
  python3 - deploy/fly.toml <<'EOF' || fail "deploy/fly.toml"
import sys, tomllib
fly = tomllib.load(open(sys.argv[1], "rb"))
svc = fly["http_service"]
checks = {
    "a volume at /data": any(m.get("destination") == "/data" for m in fly["mounts"]),
    "internal_port 8000": svc["internal_port"] == 8000,
    "health check GET /healthz": any(c.get("path") == "/healthz" for c in svc["checks"]),
    "concurrency by connections": svc["concurrency"]["type"] == "connections",
    "hard_limit below RELAY_MAX_CONNECTIONS": svc["concurrency"]["hard_limit"] < 10000,
    "one machine always up": svc["auto_stop_machines"] in ("off", False) and svc["min_machines_running"] >= 1,
    "SIGTERM to stop": fly["kill_signal"] == "SIGTERM",
}
for what, good in checks.items():
    print(("ok   fly.toml " if good else "FAIL fly.toml ") + what)
sys.exit(0 if all(checks.values()) else 1)
EOF
}

need systemd-analyze systemd
need nginx nginx
need caddy caddy
need openssl openssl
need redis-server redis-server
rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"
cargo build --release --quiet --target "$TARGET"
check_unit
check_tls_environment
check_environment
check_nginx "$ADDR"
check_caddy "$ADDR"
stop_relay
check_instances check_nginx
check_instances check_caddy
check_fly
echo "check-deploy: deploy/ passed"
