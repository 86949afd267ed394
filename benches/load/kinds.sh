#!/usr/bin/env bash
# What a cancel, an ask and a reply cost over real sockets beside a prompt:
# wrk (kinds.lua) posts each kind as fast as the answers come, one wrk
# thread, 64 keep-alive connections, to 1000 sessions of the in-memory
# engine. In each round a fresh server (pinned to SERVER_CORE, wrk to
# LOAD_CORE) takes prompts (SECS), then cancels of those prompts (at
# most SECS, stopped before they run out), then asks (SECS), then replies
# to those asks (likewise): the kinds alternate within each round, and
# the table shows
# the medians over ROUNDS rounds of requests per second and the server's
# CPU (user + system) per request, and the medians of each kind's ratio
# to the prompt's of the same round.
# A request answered with anything but 200 fails the run.
#
#   ROUNDS=5 SECS=6 benches/load/kinds.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROUNDS="${ROUNDS:-3}"
SECS="${SECS:-4}"
SERVER_CORE="${SERVER_CORE:-0}"
LOAD_CORE="${LOAD_CORE:-1}"
command -v wrk >/dev/null || { echo "needs wrk (apt-get install -y wrk)" >&2; exit 1; }
cargo build --release --bin relay -q
out=$(mktemp -d)
clk_tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
port=$((20000 + RANDOM % 20000))
for round in $(seq "$ROUNDS"); do
  port=$((port + 1))
  RELAY_PORT=$port RELAY_HOST=127.0.0.1 taskset -c "$SERVER_CORE" target/release/relay \
    >"$out/server$round.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.05
  done
  for kind in prompt cancel ask reply; do
    # A cancel or a reply run stops 200 short of what the run before it
    # stored: wrk keeps up to 64 requests in flight past the limit.
    case $kind in prompt | ask) limit=0 ;; *) limit=$((reqs - 200)) ;; esac
    t0=$(cpu_ticks $pid)
    KIND=$kind RUN_ID=$round LIMIT=$limit taskset -c "$LOAD_CORE" wrk -t1 -c64 -d"${SECS}s" \
      -s benches/load/kinds.lua "http://127.0.0.1:$port" >"$out/$kind$round.txt"
    t1=$(cpu_ticks $pid)
    if grep -q "Non-2xx" "$out/$kind$round.txt"; then
      echo "$kind, round $round: answers other than 200" >&2
      cat "$out/$kind$round.txt" >&2
      exit 1
    fi
    reqs=$(awk '/requests in/ {print $1}' "$out/$kind$round.txt")
    secs=$(awk '/requests in/ { t = $4; ms = t ~ /ms,$/; sub(/m?s,$/, "", t); print ms ? t / 1000 : t }' \
      "$out/$kind$round.txt")
    awk -v k="$kind" -v r="$round" -v n="$reqs" -v s="$secs" -v t="$((t1 - t0))" -v hz="$clk_tck" \
      'BEGIN { printf "RESULT kind=%s round=%d req_per_s=%.0f server_us_per_op=%.2f\n", k, r, n / s, t / hz * 1e6 / n }' \
      | tee -a "$out/results"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
awk '
  { split($2, k, "="); split($3, w, "="); split($4, q, "="); split($5, u, "=");
    rate[k[2], w[2]] = q[2]; cost[k[2], w[2]] = u[2]; rounds = w[2] }
  function median(list,   a, m, i, j, t) {
    m = split(list, a, " ")
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    printf "%-8s %10s %15s %12s %12s\n", "kind", "req/s", "server us/req", "rate/prompt", "cpu/prompt"
    split("prompt cancel ask reply", kinds, " ")
    for (i = 1; i <= 4; i++) {
      r = c = rr = cr = ""
      for (n = 1; n <= rounds; n++) {
        r = r " " rate[kinds[i], n]; c = c " " cost[kinds[i], n]
        rr = rr " " rate[kinds[i], n] / rate["prompt", n]; cr = cr " " cost[kinds[i], n] / cost["prompt", n]
      }
      printf "%-8s %10.0f %15.2f %12.2f %12.2f\n", kinds[i], median(r), median(c), median(rr), median(cr)
    }
  }' "$out/results"
echo "(medians of $ROUNDS rounds; raw output in $out)"
