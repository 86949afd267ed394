#!/usr/bin/env bash
# End-to-end benchmark: relay against nginx + nchan on the same data paths.
#
#   benches/load/run.sh                      # every figure, REPEAT=3 runs each
#   REPEAT=1 SECS=3 FIGURES="rt:100 fan:1000" benches/load/run.sh
#   BASE_BIN=/tmp/relay-before TARGETS="relay base" benches/load/run.sh
#   TLS=1 FIGURES="ingest rt:1 handshake idle:ws:2000" benches/load/run.sh
#
# Targets (TARGETS, space-separated, default "relay nchan"):
#   relay         the static musl build, target/x86_64-unknown-linux-musl/
#                 release/relay (what users run); RELAY_BUILD=glibc measures
#                 target/release/relay instead. Built by this script.
#   base          the relay binary at BASE_BIN, started exactly like relay:
#                 a before/after comparison in one interleaved run.
#   durable       the relay build with a fresh data directory on the disk and
#                 RELAY_SYNC=always; its figures add fsyncs_per_s (storage
#                 commits per second, from /metrics).
#   durable-base  durable with the relay binary at BASE_BIN: the storage
#                 engine's before/after in one interleaved run.
#   redis         Redis (Debian redis-server) with appendonly yes and
#                 appendfsync always: the ingest figure only, as SET of
#                 256-byte values by redis-benchmark -c 64 -P 1, the anchor
#                 of "acknowledged means on disk", for about INGEST_SECS
#                 (REDIS_RATE, default 50000, times INGEST_SECS requests).
#   shared        the relay build with its sessions in Redis (RELAY_REDIS_URL;
#                 Debian redis-server without persistence, pinned to the
#                 server's core too): the engine's own cost. Fan-out puts
#                 every other subscriber on a second instance on the same
#                 Redis. Its figures add redis_cpu_pct and redis_us_per_op
#                 (Redis's CPU, apart from the relays' server_* figures).
#   shared-base   shared with the relay binary at BASE_BIN: the engine's
#                 before/after in one interleaved run.
#   cluster       shared with Redis in cluster mode (cluster-enabled, one
#                 master holding every slot) and RELAY_REDIS_URL
#                 redis-cluster://: the cluster path's own cost (the
#                 router, the sessions' buckets, sharded pub/sub) against
#                 shared's, on the same single Redis process. A session's
#                 calls go to the one master holding its slot, so its
#                 redis_us_per_op is what a prompt costs its master in a
#                 cluster of any size.
#   script        the floor of shared: redis-benchmark -c 64 -P 1 calling the
#                 engine's script (src/store/redis/relay.lua) directly with
#                 the prompt of the ingest figure, no relay, as the relay
#                 calls it (its library by FCALL on Redis 7, EVALSHA on
#                 6.2): the ingest figure only; its server_* figures are
#                 Redis's. One line in front of the script fills in the
#                 caller's cursor (the relay sends it; redis-benchmark
#                 cannot), one HGET.
#                 SCRIPT_RATE (default 20000) times INGEST_SECS calls.
#   nchan         nginx + nchan (NCHAN_DIR) mapped onto relay's data paths.
#   nchan-redis   nginx + nchan with its channels in Redis (NCHAN_DIR's
#                 nginx-redis.conf; Debian redis-server without persistence,
#                 pinned to the server's core): the peer of shared, set up
#                 the same way. Fan-out puts every other subscriber on a
#                 second nginx on the same Redis; its figures add
#                 redis_cpu_pct and redis_us_per_op as shared's do.
#   nginx-static  nginx answering every request with a static
#                 {"stored":true} (nginx-static/): the ingest figure only,
#                 the floor for that HTTP exchange on this kernel.
#
# The server under test runs pinned to SERVER_CORE (default 0), the load (the
# `load` bench binary, or wrk for ingest) to LOAD_CORE (default 1). Each run
# gets a fresh server on a fresh port; the targets' runs are interleaved
# (relay, nchan, relay, nchan, ...), and the table shows the median of the
# REPEAT runs of every figure per target, and relay / each other target, with
# both sides' CPU so a reader can tell which side was the limit. nginx's CPU
# and RSS are its one worker process's (the master does no work).
# server_kernel_us_per_op is the system-time part of server_us_per_op:
# loopback TCP send and receive, wake-ups and epoll, which no change in the
# server's own code removes. A figure a target cannot run shows "-". Raw
# RESULT lines and logs go to OUT (a temp dir).
#
# Figures (FIGURES, space-separated):
#   rt:S             round trip with S sessions
#   fan:N            fan-out to N subscribers, as fast as all keep up
#   catchup:N:M      N subscribers connect with ?after=0 to a session holding
#                    M answers and each reads all M (relay and base only;
#                    the server runs with RELAY_HISTORY_LIMIT=2*M)
#   rate:N:R         fan-out to N subscribers at R messages/s
#   idle:ws:N        N idle WebSocket subscribers: server RSS per connection,
#                    each on its own session created before the measurement
#                    starts (relay; nchan's channel comes with its subscriber)
#   idle:poll:N      N parked long-polls, the same way
#   idle:ws:N:new    the same, each connection creating its own session
#   idle:poll:N:new  inside the measurement: the session's cost included
#   idle:sessions:N  N sessions created and no connection held: server RSS
#                    per session, what the :new figures hold besides their
#                    connections (relay and base only)
#   ingest           wrk -t1 -c64 -d${INGEST_SECS}s posting prompts (ingest.lua)
#   irate:R          prompts at R per second on 64 connections, open loop,
#                    latency from when each was due (the load binary's
#                    `ingest` mode, polling without sleep on its core): the
#                    ingest latency below saturation; nginx-static runs it too
#   stream:N[:W]     one agent connection streams parts of answers (POST
#                    /response with "partial": true) to N subscribers, at
#                    most W (default 4) not yet delivered everywhere; every
#                    subscriber must get every part as a delta frame, in
#                    order, or the run fails. stream:1:1 is the part latency
#                    (one part at a time, as rt:1 is one round at a time)
#   partcost:N:M     server CPU per part, per final answer and per small
#                    POST /prompt, M of each in turns, parts and answers
#                    delivered to N subscribers; part/answer and part/prompt
#                    ratios. stream and partcost run on relay and base only:
#                    nchan has no streamed answers
#   handshake        TLS=1 only: new connections, 8 at a time, each a full
#                    TLS handshake and one GET /healthz (the load binary's
#                    `handshake` mode); 1e6 / server_us_per_op is handshakes
#                    per second on one core of the server
#
# TLS=1 runs every figure over TLS (targets relay, base, nchan and
# nginx-static): relay with its own TLS (RELAY_TLS_CERT), nginx terminating
# TLS in front of nchan (or of its static answer), all with one ECDSA P-256
# certificate made for the run. The clients offer TLS 1.3 with
# TLS_AES_128_GCM_SHA256 alone, so every server negotiates that suite (and
# X25519, the first group of both client libraries): the load binary by
# its own settings (--ca), wrk through an OpenSSL configuration file
# (OPENSSL_CONF, its system_default section). Keep-alive is the same as
# without TLS: one handshake per connection, then requests on it.
# Needs: taskset, curl, file, wrk, nginx + libnginx-mod-nchan
#   (apt-get install -y nginx libnginx-mod-nchan wrk).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
REPEAT="${REPEAT:-3}"
SECS="${SECS:-5}"
INGEST_SECS="${INGEST_SECS:-10}"
IDLE_N="${IDLE_N:-19000}"
SERVER_CORE="${SERVER_CORE:-0}"
LOAD_CORE="${LOAD_CORE:-1}"
TARGETS="${TARGETS:-relay nchan}"
FIGURES="${FIGURES:-rt:1 rt:100 rt:1000 fan:1000 fan:10000 catchup:1000:10000 rate:1000:50 rate:10000:5 idle:ws:$IDLE_N idle:poll:$IDLE_N idle:ws:$IDLE_N:new idle:poll:$IDLE_N:new ingest stream:1:1 stream:1000 partcost:1:60000 partcost:100:6000 partcost:1000:1200}"
NCHAN_DIR="${NCHAN_DIR:-$root/benches/load/nchan}"
RELAY_BUILD="${RELAY_BUILD:-musl}"
BASE_BIN="${BASE_BIN:-}"
TLS="${TLS:-0}"
port="${BASE_PORT:-18100}"
OUT="${OUT:-$(mktemp -d /tmp/relay-bench.XXXXXX)}"
mkdir -p "$OUT"
results="$OUT/results.txt"
: > "$results"

# The generator and both servers hold one descriptor per connection.
ulimit -n "$(ulimit -Hn)"

for t in $TARGETS; do
  case "$t" in
    relay | nchan | nchan-redis | nginx-static | durable | redis | shared | cluster | script) ;;
    base | shared-base | durable-base)
      [ -x "$BASE_BIN" ] || { echo "run.sh: target base needs BASE_BIN=<a relay binary>" >&2; exit 2; }
      BASE_BIN="$(realpath "$BASE_BIN")"
      ;;
    *) echo "run.sh: unknown target $t (relay, base, durable, durable-base, redis, shared, shared-base, cluster, script, nchan, nchan-redis, nginx-static)" >&2; exit 2 ;;
  esac
  case "$TLS:$t" in
    0:* | 1:relay | 1:base | 1:nchan | 1:nginx-static) ;;
    *) echo "run.sh: TLS=1 runs the targets relay, base, nchan and nginx-static, not $t" >&2; exit 2 ;;
  esac
done

# TLS=1: the certificate every server presents and the clients trust, and
# the OpenSSL settings that pin wrk to the same version and suite as the
# load binary (net::tls_config).
scheme=http
tls_ca=""
tls_args=()
if [ "$TLS" = 1 ]; then
  scheme=https
  mkdir -p "$OUT/tls"
  tls_ca="$OUT/tls/cert.pem"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -addext basicConstraints=critical,CA:FALSE \
    -keyout "$OUT/tls/key.pem" -out "$tls_ca" 2>/dev/null
  chmod 0644 "$OUT/tls/key.pem"  # nginx's worker reads it as nobody
  cat >"$OUT/tls/openssl.cnf" <<'EOF'
openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
MinProtocol = TLSv1.3
Ciphersuites = TLS_AES_128_GCM_SHA256
EOF
  tls_args=(--ca "$tls_ca")
  relay_tls_env=(RELAY_TLS_CERT="$tls_ca" RELAY_TLS_KEY="$OUT/tls/key.pem")
  nginx_tls_env=(NGINX_TLS_CERT="$tls_ca" NGINX_TLS_KEY="$OUT/tls/key.pem")
else
  relay_tls_env=()
  nginx_tls_env=()
fi
# curl to a server under test, trusting the run's certificate under TLS=1.
curl_s() { curl -s ${tls_ca:+--cacert "$tls_ca"} "$@"; }

cd "$root"
echo "building the load generator and relay ($RELAY_BUILD, release)..." >&2
# The generator first: `cargo bench` also builds the relay binary, with the
# bench profile (symbols kept), into target/release/, where it would replace
# the release build measured with RELAY_BUILD=glibc.
# Pick the bench artifact by name: cargo also reports the relay binary, and the
# order of artifacts follows build completion.
load_bin="$(cargo bench --bench load --no-run --message-format=json 2>/dev/null |
  grep '"kind":\["bench"\],"crate_types":\["bin"\],"name":"load"' |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)"
case "$RELAY_BUILD" in
  musl)
    musl=x86_64-unknown-linux-musl
    "$root/scripts/static-toolchain.sh" "$musl"
    cargo build --release --target "$musl" --bin relay >&2
    relay_bin="${CARGO_TARGET_DIR:-$root/target}/$musl/release/relay"
    ;;
  glibc)
    cargo build --release --bin relay >&2
    relay_bin="${CARGO_TARGET_DIR:-$root/target}/release/relay"
    ;;
  *) echo "run.sh: RELAY_BUILD must be musl or glibc" >&2; exit 2 ;;
esac
[ -x "$load_bin" ] && [ -x "$relay_bin" ] || { echo "run.sh: build failed" >&2; exit 1; }
clk_tck="$(getconf CLK_TCK)"

server_pid="" stop_pid="" redis_pid="" second_pid=""
# Extra environment of relay-like servers for the current figure.
relay_env=()

# The binary a relay-like target runs.
bin_of() { case "$1" in base | shared-base | durable-base) echo "$BASE_BIN" ;; *) echo "$relay_bin" ;; esac; }

# The protocol a target speaks to the load generator and wrk's script.
proto_of() { case "$1" in durable | durable-base | shared | shared-base | cluster) echo relay ;; nchan-redis) echo nchan ;; *) echo "$1" ;; esac; }

# The storage thread's commits so far (one fsync each with RELAY_SYNC=always).
commits() {
  curl_s "$scheme://127.0.0.1:$1/metrics" | awk '$1 == "relay_storage_commits_total" { print $2 }'
}

# "path (static-pie linked, N bytes)" for the header.
describe_bin() {
  local link
  link="$(file -b "$1" | grep -o '\(static-pie\|statically\|dynamically\) linked' || echo "unknown linking")"
  echo "${1#"$root"/} ($link, $(stat -c %s "$1") bytes)"
}

wait_healthy() {
  for _ in $(seq 1 100); do
    curl_s -f -o /dev/null "$scheme://127.0.0.1:$1/healthz" && return 0
    sleep 0.1
  done
  echo "run.sh: server on port $1 never became healthy" >&2
  return 1
}

# wait_ready PORT: /readyz answers 200 (a shared relay reached Redis).
wait_ready() {
  for _ in $(seq 1 100); do
    curl_s -f -o /dev/null "$scheme://127.0.0.1:$1/readyz" && return 0
    sleep 0.1
  done
  echo "run.sh: server on port $1 never became ready" >&2
  return 1
}

# start_server TARGET PORT: sets server_pid (measured) and stop_pid (signalled).
start_server() {
  local log="$OUT/$1-$2.log"
  case "$1" in
    relay | base | durable | durable-base)
      local data=()
      # durable: the relay with a fresh data directory on the disk,
      # RELAY_SYNC=always (every answer waits for its fsync).
      case "$1" in durable*) data=(RELAY_DATA_DIR="$OUT/data-$2" RELAY_SYNC=always) ;; esac
      # The memory budget is large enough that no figure meets it (a
      # build from before the budget warns that it is no setting).
      env RELAY_HOST=127.0.0.1 RELAY_PORT="$2" RELAY_LOG=warn \
        RELAY_MAX_CONNECTIONS=25000 RELAY_MAX_SUBSCRIBERS=20000 RELAY_MAX_WAITERS=1000 RELAY_MAX_PENDING=100000 \
        RELAY_MAX_MEMORY=2G "${data[@]}" "${relay_env[@]}" "${relay_tls_env[@]}" taskset -c "$SERVER_CORE" "$(bin_of "$1")" 2>"$log" &
      stop_pid=$!
      wait_healthy "$2"
      server_pid=$stop_pid
      ;;
    nchan-redis)
      # Redis first, as for shared, then nginx on it, and for fan-out a
      # second nginx on the same Redis.
      local rport=$(($2 + 2000))
      mkdir -p "$OUT/nchan-redis-$2"
      taskset -c "$SERVER_CORE" redis-server --port "$rport" --bind 127.0.0.1 --dir "$OUT/nchan-redis-$2" \
        --save '' --appendonly no --daemonize no >"$OUT/nchan-redis-redis-$2.log" 2>&1 &
      redis_pid=$!
      for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
      taskset -c "$SERVER_CORE" "$NCHAN_DIR/run.sh" "$2" "$rport" 2>"$log" &
      stop_pid=$!
      wait_healthy "$2"
      server_pid="$(pgrep -P "$stop_pid" | head -1)"
      if [ -n "${SECOND:-}" ]; then
        taskset -c "$SERVER_CORE" "$NCHAN_DIR/run.sh" "$SECOND" "$rport" 2>"$log.2" &
        second_pid=$!
        wait_healthy "$SECOND"
        server_pid="$server_pid,$(pgrep -P "$second_pid" | head -1)"
      fi
      ;;
    shared | shared-base | cluster)
      # Redis first (no persistence: the engine's cost), then the relay
      # on it, and for fan-out a second relay on the same Redis.
      # Below the kernel's ephemeral range (32768 up): a port there may be
      # held by one of the load's own connections.
      local rport=$(($2 + 2000)) scheme_r=redis cluster_args=()
      [ "$1" = cluster ] && scheme_r=redis-cluster cluster_args=(--cluster-enabled yes --cluster-config-file "$OUT/shared-$2/nodes.conf")
      mkdir -p "$OUT/shared-$2"
      taskset -c "$SERVER_CORE" redis-server --port "$rport" --bind 127.0.0.1 --dir "$OUT/shared-$2" \
        --save '' --appendonly no --daemonize no "${cluster_args[@]}" >"$OUT/shared-redis-$2.log" 2>&1 &
      redis_pid=$!
      for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
      if [ "$1" = cluster ]; then
        redis-cli -p "$rport" cluster addslotsrange 0 16383 >/dev/null
        for _ in $(seq 1 100); do
          redis-cli -p "$rport" cluster info | grep -q 'cluster_state:ok' && break
          sleep 0.1
        done
      fi
      local shared_env=(RELAY_HOST=127.0.0.1 RELAY_LOG=warn RELAY_REDIS_URL="$scheme_r://127.0.0.1:$rport"
        RELAY_MAX_CONNECTIONS=25000 RELAY_MAX_SUBSCRIBERS=20000 RELAY_MAX_WAITERS=1000 RELAY_MAX_PENDING=100000
        RELAY_MAX_MEMORY=2G)
      env RELAY_PORT="$2" "${shared_env[@]}" "${relay_env[@]}" taskset -c "$SERVER_CORE" "$(bin_of "$1")" 2>"$log" &
      stop_pid=$!
      wait_ready "$2"
      server_pid=$stop_pid
      if [ -n "${SECOND:-}" ]; then
        env RELAY_PORT="$SECOND" "${shared_env[@]}" "${relay_env[@]}" taskset -c "$SERVER_CORE" "$(bin_of "$1")" 2>"$log.2" &
        second_pid=$!
        wait_ready "$SECOND"
        server_pid="$stop_pid,$second_pid"
      fi
      ;;
    script)
      mkdir -p "$OUT/script-$2"
      taskset -c "$SERVER_CORE" redis-server --port "$2" --bind 127.0.0.1 --dir "$OUT/script-$2" \
        --save '' --appendonly no --daemonize no >"$log" 2>&1 &
      stop_pid=$!
      for _ in $(seq 1 100); do redis-cli -p "$2" ping >/dev/null 2>&1 && break; sleep 0.1; done
      server_pid=$stop_pid
      ;;
    redis)
      # Redis with "acknowledged means on disk": the AOF fsynced before
      # every reply (appendfsync always), no snapshots.
      mkdir -p "$OUT/redis-$2"
      taskset -c "$SERVER_CORE" redis-server --port "$2" --bind 127.0.0.1 --dir "$OUT/redis-$2" \
        --appendonly yes --appendfsync always --save '' --daemonize no >"$log" 2>&1 &
      stop_pid=$!
      for _ in $(seq 1 100); do redis-cli -p "$2" ping >/dev/null 2>&1 && break; sleep 0.1; done
      server_pid=$stop_pid
      ;;
    nchan | nginx-static)
      local dir="$NCHAN_DIR"
      [ "$1" = nginx-static ] && dir="$here/nginx-static"
      env "${nginx_tls_env[@]}" taskset -c "$SERVER_CORE" "$dir/run.sh" "$2" 2>"$log" &
      stop_pid=$!
      wait_healthy "$2"
      server_pid="$(pgrep -P "$stop_pid" | head -1)"
      ;;
  esac
}

# stop_server TARGET FIGURE: stops it; notes it if it had died during the run.
stop_server() {
  if ! kill -0 "$stop_pid" 2>/dev/null; then
    echo "PROBLEM $1 died during $2 (log: $OUT/$1-$port.log)" | tee -a "$OUT/problems.txt" >&2
  fi
  kill -TERM "$stop_pid" 2>/dev/null || true
  wait "$stop_pid" 2>/dev/null || true
  for p in $second_pid $redis_pid; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  second_pid="" redis_pid=""
}

# Prints user + system ticks and system (kernel) ticks alone, from one read.
ticks() { awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13], f[13] }' "/proc/$1/stat"; }

# wrk's latency line ("99%  1.23ms") in microseconds.
wrk_us() {
  awk -v q="$1" '$1 == q { v = $2; u = v; gsub(/[0-9.]/, "", u); sub(/[a-z]+$/, "", v);
    m = (u == "us") ? 1 : (u == "ms") ? 1000 : (u == "s") ? 1000000 : 60000000; printf "%.1f", v * m }' "$2"
}

# The Redis anchor of the durable ingest: SET of 256-byte values from 64
# connections, one request in flight each, as wrk posts prompts.
run_redis_ingest() {
  run_benchmark_ingest redis "${REDIS_RATE:-50000}" -t set -d 256 -r 1000000
}

# The floor of the shared ingest: the engine's script, called as the relay
# calls it for a prompt of the ingest figure (a 256-byte prompt, a fresh
# client_msg_id each time), into one session.
run_script_ingest() {
  local now head record how
  local cursor="if A[5] == 'next' then A[5] = redis.call('HGET', K[1], 'n') or '1' end"
  if redis-server --version | grep -q 'v=[7-9]'; then
    # As the relay calls it on Redis 7: the library, by FCALL.
    { echo "#!lua name=bench"; sed '$d' "$root/src/store/redis/relay.lua"
      echo "redis.register_function('bench', function(K, A) $cursor return run(K, A) end)"; } |
      redis-cli -p "$port" -x function load >/dev/null
    how=(fcall bench)
  else
    how=(evalsha "$({ echo "local K, A = KEYS, ARGV $cursor"; cat "$root/src/store/redis/relay.lua"; } |
      redis-cli -p "$port" -x script load)")
  fi
  now="$(date +%s%3N)"
  local keys=(3 b:s:x b:sessions b:w:x)
  local limits=(10000 100000 1000000000 00000000-0000-4000-8000-000000000000 b:e:x b:)
  redis-cli -p "$port" "${how[@]}" "${keys[@]}" create x "$now" '' 0 "${limits[@]}" >/dev/null
  head='{"session_id":"x","client_msg_id":"m0-0000000000","prompt":"'"$(printf 'x%.0s' $(seq 256))"'","ts":'"$now"',"seq":'
  # The record the relay sends (src/store/redis/mod.rs, `record`).
  record="$(printf 'P\nm0-0000000000\n\n%s\n%s' "$now" "$head")"
  run_benchmark_ingest script "${SCRIPT_RATE:-20000}" -r 1000000000 "${how[@]}" "${keys[@]}" prompt x "$now" \
    00000000-0000-4000-8000-000000000000 next "${limits[@]}" "m__rand_int__" "$record"
}

# run_benchmark_ingest TARGET RATE ARGS...: redis-benchmark -c 64 -P 1 with
# ARGS against the Redis on $port, as an ingest RESULT line. redis-benchmark
# sends a count of requests, not a duration: RATE times INGEST_SECS of them,
# RATE being about the rate expected, so that Redis runs about as long as
# wrk runs against the relays (the append-only file of `redis` growing, and
# being rewritten, as relay's database grows); secs= says how long it ran.
run_benchmark_ingest() {
  local t="$1" out="$OUT/redis-bench-$port.csv" t0 t1 k0 k1 n=$((INGEST_SECS * $2))
  shift 2
  read -r t0 k0 < <(ticks "$server_pid")
  local w0 w1
  w0="$(date +%s.%N)"
  taskset -c "$LOAD_CORE" redis-benchmark -p "$port" -c 64 -P 1 -n "$n" --csv "$@" >"$out" 2>/dev/null
  w1="$(date +%s.%N)"
  read -r t1 k1 < <(ticks "$server_pid")
  awk -F, -v t="$t" -v n="$n" -v d="$((t1 - t0))" -v k="$((k1 - k0))" -v hz="$clk_tck" -v w0="$w0" -v w1="$w1" '
    NR >= 2 { last = $0 }
    # The figures end the last line (the test name may span lines).
    END { $0 = last; gsub(/"/, ""); rps = $(NF - 6); p50 = $(NF - 3) * 1000; p99 = $(NF - 1) * 1000
      secs = w1 - w0; cpu = d / hz
      printf "RESULT figure=ingest target=%s requests=%d secs=%.1f req_per_s=%.0f p50_us=%.1f p99_us=%.1f server_cpu_pct=%.1f server_us_per_op=%.2f server_kernel_us_per_op=%.2f\n",
        t, n, secs, rps, p50, p99, 100 * cpu / secs, 1e6 * cpu / n, 1e6 * k / hz / n }' "$out"
}

run_ingest() {
  local t="$1" wrk_out="$OUT/wrk-$1-$port.txt" t0 t1 k0 k1 r0=0 r1=0 rk
  read -r t0 k0 < <(ticks "$server_pid")
  [ -n "$redis_pid" ] && read -r r0 rk < <(ticks "$redis_pid")
  (
    env TARGET="$(proto_of "$t")" RUN_ID="$port" ${tls_ca:+OPENSSL_CONF="$OUT/tls/openssl.cnf"} taskset -c "$LOAD_CORE" \
      wrk -t1 -c64 -d"${INGEST_SECS}s" --latency -s "$here/ingest.lua" "$scheme://127.0.0.1:$port" >"$wrk_out"
    times >"$wrk_out.times"
  )
  read -r t1 k1 < <(ticks "$server_pid")
  [ -n "$redis_pid" ] && read -r r1 rk < <(ticks "$redis_pid")
  local reqs secs non2xx errs gen_s
  reqs="$(awk '/requests in/ { print $1 }' "$wrk_out")"
  secs="$(awk '/requests in/ { sub(/s,$/, "", $4); print $4 }' "$wrk_out")"
  non2xx="$(awk '/Non-2xx/ { print $NF }' "$wrk_out")"
  errs="$(awk '/Socket errors/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$wrk_out")"
  # `times` line 2: children's user and system time, e.g. "0m1.234s 0m0.567s".
  gen_s="$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] } print n }' "$wrk_out.times")"
  awk -v f=ingest -v t="$t" -v r="$reqs" -v s="$secs" -v d="$((t1 - t0))" -v k="$((k1 - k0))" -v hz="$clk_tck" -v g="$gen_s" \
    -v p50="$(wrk_us 50% "$wrk_out")" -v p99="$(wrk_us 99% "$wrk_out")" -v n="${non2xx:-0}" -v e="${errs:-0}" \
    -v rd="$((r1 - r0))" -v hasr="${redis_pid:+1}" \
    'BEGIN { cpu = d / hz; printf "RESULT figure=%s target=%s requests=%d req_per_s=%.0f p50_us=%s p99_us=%s server_cpu_pct=%.1f server_us_per_op=%.2f server_kernel_us_per_op=%.2f gen_cpu_pct=%.1f non_2xx=%d socket_errors=%d",
      f, t, r, r / s, p50, p99, 100 * cpu / s, 1e6 * cpu / r, 1e6 * k / hz / r, 100 * g / s, n, e
      if (hasr) printf " redis_cpu_pct=%.1f redis_us_per_op=%.2f", 100 * rd / hz / s, 1e6 * rd / hz / r
      printf "\n" }'
}

# runs KIND TARGET: can this target run this kind of figure? nchan has no
# replay by cursor and no streamed answers; nginx-static answers the ingest
# requests only; the streamed answers' figures run on relay in memory (and
# base, its before/after).
runs() {
  case "$2:$1" in
    relay:stream | relay:partcost | base:stream | base:partcost) return 0 ;;
    *:stream | *:partcost) return 1 ;;
    nchan:catchup | nchan-redis:catchup) return 1 ;;
    redis:ingest | script:ingest) return 0 ;;
    redis:* | script:*) return 1 ;;
    nginx-static:ingest | nginx-static:irate | nginx-static:handshake) return 0 ;;
    nginx-static:*) return 1 ;;
  esac
}

# run_figure SPEC TARGET: one run of one figure against a fresh server.
run_figure() {
  local spec="$1" t="$2" figure args=() c=""
  IFS=: read -r kind a b c <<<"$spec"
  runs "$kind" "$t" || return 0
  relay_env=()
  case "$kind" in
    rt) figure="roundtrip/S=$a"; args=(roundtrip --sessions "$a") ;;
    fan) figure="fanout/N=$a/rate=max"; args=(fanout --subscribers "$a" --rate max) ;;
    catchup)
      [ -n "$b" ] || { echo "run.sh: catchup needs catchup:N:M" >&2; exit 2; }
      figure="catchup/N=$a/M=$b"; args=(catchup --subscribers "$a" --answers "$b")
      relay_env=(RELAY_HISTORY_LIMIT=$((2 * b)))
      ;;
    rate) figure="fanout/N=$a/rate=$b"; args=(fanout --subscribers "$a" --rate "$b") ;;
    stream) figure="stream/N=$a/window=${b:-4}"; args=(stream --subscribers "$a" --window "${b:-4}") ;;
    partcost)
      [ -n "$b" ] || { echo "run.sh: partcost needs partcost:N:M" >&2; exit 2; }
      figure="partcost/N=$a/M=$b"; args=(partcost --subscribers "$a" --posts "$b")
      ;;
    idle)
      case "${c:-}" in
        "") figure="idle/$a/N=$b"; args=(idle --kind "$a" --connections "$b") ;;
        new) figure="idle/$a/N=$b/new-sessions"; args=(idle --kind "$a" --connections "$b" --sessions new) ;;
        *) echo "run.sh: idle:KIND:N takes only :new after it" >&2; exit 2 ;;
      esac
      ;;
    ingest) figure="ingest" ;;
    irate) figure="ingest/rate=$a"; args=(ingest --rate "$a" --connections 64) ;;
    handshake)
      [ "$TLS" = 1 ] || { echo "run.sh: the handshake figure needs TLS=1" >&2; exit 2; }
      figure="handshake"; args=(handshake --connections 8)
      ;;
    *) echo "run.sh: unknown figure $spec" >&2; exit 2 ;;
  esac
  port=$((port + 1))
  SECOND=""
  case "$t:$kind" in shared:fan | shared-base:fan | cluster:fan | nchan-redis:fan) SECOND=$((port + 4000)) ;; esac
  start_server "$t" "$port"
  local extra=()
  [ -n "$redis_pid" ] && extra+=(--redis-pid "$redis_pid")
  [ -n "$SECOND" ] && extra+=(--addr2 "127.0.0.1:$SECOND")
  echo "== $figure $t (port $port, server pid $server_pid)" >&2
  local line c0="" c1=""
  case "$t" in durable*) c0="$(commits "$port")" ;; esac
  if [ "$kind" = ingest ] && [ "$t" = redis ]; then
    line="$(run_redis_ingest)"
  elif [ "$kind" = ingest ] && [ "$t" = script ]; then
    line="$(run_script_ingest)"
  elif [ "$kind" = ingest ]; then
    line="$(run_ingest "$t")"
  else
    line="$(taskset -c "$LOAD_CORE" "$load_bin" "${args[@]}" --target "$(proto_of "$t")" --addr "127.0.0.1:$port" \
      --server-pid "$server_pid" "${extra[@]}" "${tls_args[@]}" --seconds "$SECS" --figure "$figure" 2>>"$OUT/gen.log" | grep '^RESULT')" ||
      line="RESULT figure=$figure target=$t failed=1"
    line="${line/target=$(proto_of "$t") /target=$t }"
  fi
  if [[ "$t" == durable* ]]; then
    c1="$(commits "$port")"
    local secs="$SECS"
    [ "$kind" = ingest ] && secs="$INGEST_SECS"
    line="$line fsyncs_per_s=$(awk -v a="${c0:-0}" -v b="${c1:-0}" -v s="$secs" 'BEGIN { printf "%.0f", (b - a) / s }')"
  fi
  echo "$line" | tee -a "$results" >&2
  case "$line" in
    *failed=1*) echo "PROBLEM $t $figure: generator failed, see $OUT/gen.log" >>"$OUT/problems.txt" ;;
    *" missing="[1-9]* | *" out_of_order="[1-9]* | *" snapshots="[1-9]* | *" errors="[1-9]* | *" non_2xx="[1-9]* | *" socket_errors="[1-9]*)
      echo "PROBLEM $t $figure: lost, reordered or failed messages, see $OUT/gen.log" >>"$OUT/problems.txt" ;;
  esac
  stop_server "$t" "$figure"
  # What a persisting target wrote is removed and the rest flushed before
  # the next run: the kernel's writeback would otherwise interrupt the next
  # server on its core, and those interrupts count as its system time
  # (an in-memory ingest right after a durable one measured twice the
  # kernel time per request).
  case "$t" in
    durable*) rm -rf "$OUT/data-$port"; sync ;;
    redis) rm -rf "$OUT/redis-$port"; sync ;;
    shared | shared-base) rm -rf "$OUT/shared-$port" ;;
    nchan-redis) rm -rf "$OUT/nchan-redis-$port" ;;
    script) rm -rf "$OUT/script-$port" ;;
  esac
}

{
  echo "# relay benchmark (${TARGETS// /, }): $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "relay $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "(not a git checkout)"), $(nginx -v 2>&1), $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)," \
    "$(nproc) cores, kernel $(uname -r); server on core $SERVER_CORE, load on core $LOAD_CORE;" \
    "REPEAT=$REPEAT SECS=$SECS INGEST_SECS=$INGEST_SECS; median of the runs; ratios are relay / each other target."
  if [ "$TLS" = 1 ]; then
    echo
    echo "Over TLS: TLS 1.3, TLS_AES_128_GCM_SHA256, X25519, an ECDSA P-256 certificate; $(openssl version | cut -d' ' -f1-2) under nginx."
  fi
  echo
  for t in $TARGETS; do
    case "$t" in
      relay | base | durable | durable-base) echo "- $t: $(describe_bin "$(bin_of "$t")")" ;;
      shared | shared-base) echo "- $t: $(describe_bin "$(bin_of "$t")") on $(redis-server --version | cut -d' ' -f1-3), no persistence" ;;
      nchan-redis) echo "- nchan-redis: $(nginx -v 2>&1 | cut -d' ' -f3), nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?'), channels in $(redis-server --version | cut -d' ' -f1-3), no persistence" ;;
      redis) echo "- redis: $(redis-server --version | cut -d' ' -f1-3), appendonly yes, appendfsync always" ;;
      script) echo "- script: $(redis-server --version | cut -d' ' -f1-3), no persistence, src/store/redis/relay.lua by redis-benchmark" ;;
    esac
  done
} >"$OUT/header.md"

for spec in $FIGURES; do
  for rep in $(seq 1 "$REPEAT"); do
    for t in $TARGETS; do
      run_figure "$spec" "$t"
    done
  done
done

# Medians per figure, target and key; one table row per key, one column per
# target, then relay / each other target.
awk -v targets="$TARGETS" '
  function median(list,   n, a, i, j, v) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > v + 0; j--) a[j + 1] = a[j]; a[j + 1] = v }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function fmt(v) { return v == "" ? "-" : (v == int(v) ? sprintf("%d", v) : sprintf("%.2f", v)) }
  BEGIN {
    nt = split(targets, tg, " ")
    for (i = 1; i <= nt; i++) if (tg[i] == "relay") has_relay = 1
    for (i = 1; i <= nt; i++) if (has_relay && tg[i] != "relay") ratio_of[++nr] = tg[i]
  }
  $1 == "RESULT" {
    fig = ""; tgt = ""
    for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "figure") fig = substr($i, 8); else if (kv[1] == "target") tgt = kv[2] }
    if (!(fig in seen)) { seen[fig] = 1; figs[++nf] = fig }
    for (i = 2; i <= NF; i++) {
      eq = index($i, "="); k = substr($i, 1, eq - 1); v = substr($i, eq + 1)
      if (k == "figure" || k == "target") continue
      if (!((fig, k) in haskey)) { haskey[fig, k] = 1; keys[fig, ++nk[fig]] = k }
      vals[fig, tgt, k] = vals[fig, tgt, k] " " v
    }
  }
  END {
    head = "| figure | metric |"; rule = "|---|---|"
    for (i = 1; i <= nt; i++) { head = head " " tg[i] " |"; rule = rule "---:|" }
    for (i = 1; i <= nr; i++) { head = head " relay / " ratio_of[i] " |"; rule = rule "---:|" }
    print head; print rule
    for (f = 1; f <= nf; f++) {
      fig = figs[f]
      for (j = 1; j <= nk[fig]; j++) {
        k = keys[fig, j]
        row = sprintf("| %s | %s |", (j == 1 ? fig : ""), k)
        for (i = 1; i <= nt; i++) {
          m[tg[i]] = ((fig, tg[i], k) in vals) ? median(vals[fig, tg[i], k]) : ""
          row = row " " fmt(m[tg[i]]) " |"
        }
        for (i = 1; i <= nr; i++) {
          r = m["relay"]; o = m[ratio_of[i]]
          row = row " " ((r != "" && o != "" && o + 0 != 0) ? sprintf("%.2f", r / o) : "-") " |"
        }
        print row
      }
    }
  }' "$results" >"$OUT/table.md"

cat "$OUT/header.md"
echo
cat "$OUT/table.md"
echo
if [ -s "$OUT/problems.txt" ]; then
  echo "Problems:"
  cat "$OUT/problems.txt"
fi
echo "raw results: $results; logs: $OUT" >&2
