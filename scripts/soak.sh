#!/usr/bin/env bash
# Bounded soak test against a freshly started release server.
#
#   scripts/soak.sh                    # 180 s
#   SOAK_SECONDS=120 scripts/soak.sh
#
# Starts target/release/relay on a free loopback port with a small subscriber
# buffer (so slow readers lag and are refilled from the log) and a history
# limit and a memory budget high enough to
# keep every message, runs scripts/soak.py against it (clients, agents,
# WebSocket subscribers that come and go, slow readers, deliberate bad
# requests, VmRSS sampling), prints the summary, stops the server, and exits
# non-zero on any violation.
#
# Environment:
#   SOAK_SECONDS     run length (default 180)
#   SOAK_ARGS        extra arguments for soak.py (see scripts/soak.py --help)
#   CARGO_TARGET_DIR cargo target dir (default: <repo>/target)
#   RELAY_BIN        use this binary instead of building one
#   SOAK_LOG         keep the server's log here (default: a temp file, removed)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_TO_RUN="${SOAK_SECONDS:-180}"
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import websocket' 2>/dev/null; then
  echo "soak: installing websocket-client" >&2
  "$PYTHON" -m pip install --quiet "websocket-client==1.9.*"
fi

. "$ROOT/scripts/lib.sh"
relay_binary
WORK="$(mktemp -d)"
LOG="${SOAK_LOG:-$WORK/server.log}"
trap 'stop_relay; rm -rf "$WORK"' EXIT INT TERM
start_relay soak "$LOG" RELAY_SUBSCRIBER_BUFFER=262144 RELAY_HISTORY_LIMIT=1000000 RELAY_MAX_MEMORY=2G
echo "soak: server pid $SERVER_PID at $ADDR, ${SECONDS_TO_RUN} s" >&2

set +e
# shellcheck disable=SC2086
timeout --kill-after=10 $((SECONDS_TO_RUN + 120)) \
  "$PYTHON" "$ROOT/scripts/soak.py" --addr "$ADDR" --pid "$SERVER_PID" \
  --seconds "$SECONDS_TO_RUN" ${SOAK_ARGS:-}
RC=$?
set -e

if ! kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "soak: FAIL: the server died" >&2
  tail -n 20 "$LOG" >&2
  RC=1
else
  echo "soak: server log: $(grep -c '"level":"error"' "$LOG") error lines, $(grep -c '"level":"warn"' "$LOG") warnings"
  kill -TERM "$SERVER_PID"
  for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "soak: FAIL: server still running 5 s after SIGTERM" >&2
    RC=1
  else
    wait "$SERVER_PID"; SRC=$?
    [[ $SRC -eq 0 ]] || { echo "soak: FAIL: server exit status $SRC after SIGTERM" >&2; RC=1; }
  fi
fi
exit "$RC"
