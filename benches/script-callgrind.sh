#!/usr/bin/env bash
# What one call of the engine's script (src/store/redis/relay.lua) costs
# Redis, in instructions, under valgrind --tool=callgrind: repeatable where
# CPU time is not. Redis (Debian's redis-server) runs under callgrind on a
# free port; redis-benchmark calls the script's prompt into one session
# (the call the relay makes for a prompt of the ingest figure: a 256-byte
# prompt, a fresh client_msg_id each time), 1,000 calls to warm up, then
# the counters are zeroed and 3,000 more are counted. The same for a
# script that returns at once, with the same arguments: the cost of the
# EVALSHA itself; and for the `prompts` call carrying 8 prompts (what the
# relay sends when a loop turn holds several), counted per prompt. On
# Redis 7 and later the same three for the library the relay loads there
# and calls with FCALL (see mod.rs).
#
#   benches/script-callgrind.sh
#   CLUSTER=1 benches/script-callgrind.sh
#
# CLUSTER=1 measures the calls as a relay on a Redis Cluster makes them
# (redis-cluster://): Redis in cluster mode holding every slot, the keys
# under a bucket's hash tag, each call naming every key it may touch. A
# prompt's calls go to the one master of its session's slot, so this is
# what a prompt costs its master in a cluster of any size.
#
# Needs valgrind, redis-server, redis-tools.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

now="$(date +%s%3N)"
if [ "${CLUSTER:-0}" = 1 ]; then
  # The keys src/store/redis/calls.rs names for a prompt in a cluster.
  b='b{x}'
  keys=(5 "${b}s:x" "${b}sessions" "${b}pending" "${b}arrived" "${b}generation")
  cluster_args=(--cluster-enabled yes --cluster-config-file "$work/nodes.conf")
else
  b='b:'
  keys=(3 b:s:x b:sessions b:w:x)
  cluster_args=()
fi
limits=(10000 100000 1000000000 00000000-0000-4000-8000-000000000000 "${b}e:x" "$b")
head='{"session_id":"x","client_msg_id":"m0-0000000000","prompt":"'"$(printf 'x%.0s' $(seq 256))"'","ts":'"$now"',"seq":'
# The record the relay sends (src/store/redis/mod.rs, `record`).
record="P
m0-0000000000

$now
$head"
# The relay sends the cursor its copy holds; redis-benchmark cannot, so
# lines in front of the script read it (one HGET, in every variant).
cursor() {
  echo "if $2[5] == 'next' then $2[5] = redis.call('HGET', $1[1], 'n') or '1' end
if $2[1] == 'prompts' then local n = redis.call('HGET', $1[4], 'n') or '1'
for i = 14, #$2, 6 do $2[i] = n end end"
}

# measure FILE [FUNCTION]: instructions per call of the script FILE
# (EVALSHA), or of FUNCTION in the library FILE (FCALL).
measure() {
  local out="$work/out" how
  rm -f "$out".* "$work/nodes.conf"
  valgrind --tool=callgrind --callgrind-out-file="$out.%p" \
    redis-server --port "$port" --bind 127.0.0.1 --dir "$work" --save '' --appendonly no "${cluster_args[@]}" >"$work/log" 2>&1 &
  for _ in $(seq 1 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  if [ "${CLUSTER:-0}" = 1 ]; then
    redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
    for _ in $(seq 1 300); do
      redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok' && break
      sleep 0.1
    done
  fi
  if [ -n "${2:-}" ]; then
    redis-cli -p "$port" -x function load <"$1" >/dev/null
    how=(fcall "$2")
  else
    how=(evalsha "$(redis-cli -p "$port" -x script load <"$1")")
  fi
  redis-cli -p "$port" "${how[@]}" "${keys[@]}" create x "$now" '' 0 "${limits[@]}" >/dev/null
  call() {
    if [ "${BATCH:-1}" = 1 ]; then
      redis-benchmark -p "$port" -c 1 -P 16 -n "$1" -r 1000000000 "${how[@]}" "${keys[@]}" \
        prompt x "$now" 00000000-0000-4000-8000-000000000000 next "${limits[@]}" "m__rand_int__" "$record" >/dev/null 2>&1
    else
      # The cursor each prompt sends is the one before the call (the
      # answers carry what the later ones wrote), as the relay sends it.
      local groups=() bkeys=() i
      for i in $(seq 1 "$BATCH"); do
        bkeys+=("${b}s:x")
        groups+=(x 00000000-0000-4000-8000-000000000000 next 00000000-0000-4000-8000-000000000000 "m${i}__rand_int__" "$record")
      done
      # pipeline.rs, send_batch: three keys, the sessions', and in a
      # cluster the bucket's generation.
      local head=("" b:sessions "") tail=()
      if [ "${CLUSTER:-0}" = 1 ]; then
        head=("${b}pending" "${b}sessions" "${b}arrived") tail=("${b}generation")
      fi
      redis-benchmark -p "$port" -c 1 -P 16 -n "$1" -r 1000000000 "${how[@]}" $((3 + BATCH + ${#tail[@]})) \
        "${head[@]}" "${bkeys[@]}" "${tail[@]}" \
        prompts "" "$now" "" 0 10000 100000 1000000000 "" "" "$b" "${groups[@]}" >/dev/null 2>&1
    fi
  }
  call 1000
  callgrind_control -z >/dev/null 2>&1
  call 3000
  callgrind_control -d >/dev/null 2>&1
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait
  awk -v b="${BATCH:-1}" '/^summary:/ { printf "%.0f\n", $2 / 3000 / b }' "$(ls "$out".*.1)"
}

script="$root/src/store/redis/relay.lua"
{ cursor KEYS ARGV; cat "$script"; } >"$work/script.lua"
{ cursor KEYS ARGV; echo "do return {'ok'} end"; cat "$script"; } >"$work/empty.lua"
# The library the relay loads on Redis 7 (mod.rs): the script without its
# last line, which runs it as a script, and a function calling `run`.
library() {
  echo "#!lua name=bench"
  sed '$d' "$script"
  echo "redis.register_function('bench', function(keys, argv)"
  cursor keys argv
  echo "$1"
  echo "end)"
}
library "return run(keys, argv)" >"$work/library.lua"
library "do return {'ok'} end" >"$work/library-empty.lua"
echo "instructions per call ($(redis-server --version | cut -d' ' -f1-3)):"
echo "  prompt call of relay.lua (EVALSHA): $(measure "$work/script.lua")"
echo "  the same call, script returning at once: $(measure "$work/empty.lua")"
echo "  per prompt of a prompts call carrying 8: $(BATCH=8 measure "$work/script.lua")"
if redis-server --version | grep -q 'v=[7-9]'; then
  echo "  prompt call of the library (FCALL): $(measure "$work/library.lua" bench)"
  echo "  the same call, function returning at once: $(measure "$work/library-empty.lua" bench)"
  echo "  per prompt of a prompts call carrying 8 (FCALL): $(BATCH=8 measure "$work/library.lua" bench)"
fi
