#!/usr/bin/env bash
# Faults in combination on the real binaries: three relays on one Redis
# (Debian's redis-server, no persistence, no AOF) and one relay with a data
# directory (on a small tmpfs, so the disk can fill), under steady traffic
# from every kind of client (prompts with reused ids, answers and streamed
# parts, cancels, asks and replies, long-polls of one session and of all
# sessions, WebSocket subscribers reconnecting with `after` and `epoch`,
# deletes), while random faults strike for the whole run: kill -9 and
# restart of any relay, Redis killed and restarted, paused, flushed, out of
# memory, its connections cut, the disk stalling (strace fault injection on
# fdatasync) and full. scripts/chaos.py then checks the promises over
# everything acknowledged and refused. The last line is
# `chaos: N operations, M faults, K problems, seed S`; the exit status is
# non-zero unless K is 0.
#
#   scripts/chaos.sh                      # 180 s
#   CHAOS_SECS=3600 scripts/chaos.sh      # an hour
#   CHAOS_SEED=123 scripts/chaos.sh       # the same clients' operations and faults' schedule (threads still interleave anew)
#   CHAOS_KEEP=1 scripts/chaos.sh         # keep the relays' logs (the path is printed)
#
# Needs redis-server, redis-cli and strace (scripts/install-test-deps.sh);
# the disk-full fault needs root (a tmpfs mount) and is skipped, saying so,
# without it. RELAY_BIN uses a given binary instead of building the release
# one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. "$ROOT/scripts/lib.sh"
relay_binary
export RELAY_BIN CHAOS_SECS="${CHAOS_SECS:-180}"
exec timeout --kill-after=30 $((CHAOS_SECS + 300)) python3 "$ROOT/scripts/chaos.py"
