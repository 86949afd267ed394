#!/usr/bin/env bash
# Instructions per long-poll round of the whole server, the loop and the
# connections included (benches/callgrind.sh counts the relay core alone):
# the static binary runs under valgrind --tool=callgrind while
# loop-rounds.py drives LO and then HI rounds (a park, a /healthz until it
# shows, a POST /prompt that wakes it, its answer), each against a fresh
# server; the figure is the difference over HI - LO, so start-up and
# shutdown cancel out.
#
#   benches/loop-callgrind.sh                 # builds the static binary
#   BIN=/tmp/relay-before benches/loop-callgrind.sh
#
# Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --target x86_64-unknown-linux-musl >&2
  BIN=target/x86_64-unknown-linux-musl/release/relay
fi
port="${PORT:-18990}"
lo=${LO:-200}; hi=${HI:-1200}
total() { # rounds -> instructions of the server
  local out; out=$(mktemp)
  RELAY_PORT=$port RELAY_LOG=warn RELAY_MAX_PENDING=100000 valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.3; done
  python3 benches/loop-rounds.py "$port" "$1"
  kill -TERM "$pid"; wait "$pid" || true
  sed -n 's/^summary: //p' "$out"; rm -f "$out"
}
a=$(total "$lo"); b=$(total "$hi")
printf 'long-poll round %8d instructions/round\n' $(( (b - a) / (hi - lo) ))
