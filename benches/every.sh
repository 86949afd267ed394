#!/usr/bin/env bash
# One agent for many sessions, over real sockets (the `load` bench binary):
#
# 1. wake: prompts spread over S sessions (default 10,000), C lanes of
#    clients posting one at a time, answered by an agent parked either on
#    each session's own `GET /prompts/{sid}` (S connections, "own") or on
#    one `GET /prompts` for every session ("every"). PAIRS interleaved
#    pairs, order alternating, a fresh server per run; the medians of the
#    server's CPU per round and of p99, and the median of the per-pair
#    ratios every / own. At C=1 each wake lists one prompt in both; at
#    C=16 the every-session poll may list several per wake.
# 2. jobs: `relay agent --all --jobs J` (default 8) with a stand-in
#    command (`cat`, so each prompt is one process) serving S2 sessions
#    (default "8 1000": as many sessions as jobs, then more than the jobs
#    can take at once), each with a WebSocket client posting one prompt at
#    a time (the `roundtrip` figure with `--agent external`): rounds per
#    second and p99, RUNS runs, medians.
#
# The server (target/release/relay, RELAY_MAX_MEMORY=2G as in
# benches/load/run.sh) is pinned to SERVER_CORE (0), the load
# and the agent to LOAD_CORE (1).
#
#   benches/every.sh
#   PAIRS=3 SECS=2 FIGURES=wake benches/every.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pairs=${PAIRS:-5}; secs=${SECS:-3}; runs=${RUNS:-3}
sessions=${SESSIONS:-10000}; sessions2=${SESSIONS2:-8 1000}; jobs=${JOBS:-8}
server_core=${SERVER_CORE:-0}; load_core=${LOAD_CORE:-1}
cargo build --release --quiet
load=$(cargo bench --bench load --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*load-[^"]*\)".*/\1/p' | tail -1)
[ -x "$load" ] || { echo "could not build benches/load" >&2; exit 1; }
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts a fresh server on $port, pinned; waits for its /healthz.
start() {
  port=$(free_port)
  RELAY_PORT=$port RELAY_HOST=127.0.0.1 RELAY_MAX_CONNECTIONS=19000 RELAY_MAX_MEMORY=2G RUST_LOG=warn \
    taskset -c "$server_core" target/release/relay >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return; sleep 0.05
  done
  echo "server did not start" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

for figure in ${FIGURES:-wake jobs}; do
  case $figure in
  wake)
    for lanes in 1 16; do
      : >"$out/wake-$lanes"
      for i in $(seq 1 "$pairs"); do
        order="own every"; [ $((i % 2)) = 0 ] && order="every own"
        for agent in $order; do
          start
          line=$(taskset -c "$load_core" "$load" wake --addr "127.0.0.1:$port" --server-pid "$pid" \
            --sessions "$sessions" --lanes "$lanes" --agent "$agent" --seconds "$secs" | grep '^RESULT')
          stop
          echo "$i $agent $line" >>"$out/wake-$lanes"
        done
      done
      python3 - "$out/wake-$lanes" "$lanes" "$sessions" "$pairs" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    i, agent, rest = line.split(" ", 2)
    f = dict(re.findall(r"(\w+)=([\d.]+)", rest))
    rows.setdefault(agent, {})[i] = f
med = lambda agent, k: statistics.median(float(r[k]) for r in rows[agent].values())
ratio = statistics.median(float(rows["every"][i]["server_us_per_op"]) /
                          float(rows["own"][i]["server_us_per_op"]) for i in rows["own"])
print(f"wake S={sys.argv[3]} C={sys.argv[2]} ({sys.argv[4]} pairs, medians)")
for agent in ("own", "every"):
    print(f"  {agent:<6} server_us_per_round={med(agent, 'server_us_per_op'):6.2f} "
          f"(kernel {med(agent, 'server_kernel_us_per_op'):6.2f}) "
          f"rounds/s={med(agent, 'ops_per_s'):8.0f} p99_us={med(agent, 'p99_us'):8.0f} "
          f"prompts_per_wake={med(agent, 'prompts_per_page'):.2f}")
print(f"  every/own server CPU per round: {ratio:.3f}")
EOF
    done
    ;;
  jobs)
    for n in $sessions2; do
      : >"$out/jobs"
      for i in $(seq 1 "$runs"); do
        start
        taskset -c "$load_core" target/release/relay agent --all --jobs "$jobs" \
          --url "http://127.0.0.1:$port" -- cat >"$out/agent.log" 2>&1 &
        agent=$!
        taskset -c "$load_core" "$load" roundtrip --agent external --addr "127.0.0.1:$port" \
          --server-pid "$pid" --sessions "$n" --seconds "$secs" | grep '^RESULT' >>"$out/jobs"
        kill -TERM "$agent"; wait "$agent" 2>/dev/null || true
        stop
      done
      python3 - "$out/jobs" "$n" "$jobs" "$runs" <<'EOF'
import re, statistics, sys
rows = [dict(re.findall(r"(\w+)=([\d.]+)", l)) for l in open(sys.argv[1])]
med = lambda k: statistics.median(float(r[k]) for r in rows)
print(f"relay agent --all --jobs {sys.argv[3]} -- cat, {sys.argv[2]} sessions "
      f"({sys.argv[4]} runs, medians): prompts/s={med('ops_per_s'):.0f} "
      f"p50_ms={med('p50_us')/1000:.1f} p99_ms={med('p99_us')/1000:.1f} "
      f"server_us_per_prompt={med('server_us_per_op'):.1f} errors={max(float(r['errors']) for r in rows):.0f}")
EOF
    done
    ;;
  *) echo "unknown figure $figure" >&2; exit 1 ;;
  esac
done
