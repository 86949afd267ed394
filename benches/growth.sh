#!/usr/bin/env bash
# File growth with persistence under steady traffic: a durable relay with a
# small RELAY_HISTORY_LIMIT takes prompt + response pairs on SESSIONS
# sessions for SECONDS seconds (CONNS keep-alive clients); every STEP
# seconds it prints the messages written so far and the sizes of relay.db
# and relay.db-wal. Once each session holds its limit, trimming frees pages
# as fast as new messages take them: the file stops growing.
#
#   benches/growth.sh
#   SECONDS_=120 LIMIT=1000 benches/growth.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/lib.sh
DURATION="${SECONDS_:-60}"
STEP="${STEP:-5}"
LIMIT="${LIMIT:-500}"
SESSIONS="${SESSIONS:-20}"
CONNS="${CONNS:-8}"
relay_binary
dir="$(mktemp -d /tmp/relay-growth.XXXXXX)"
trap 'stop_relay; rm -rf "$dir"' EXIT
start_relay growth "$dir/log" RELAY_DATA_DIR="$dir" RELAY_HISTORY_LIMIT="$LIMIT"
python3 - "$dir" "${ADDR##*:}" "$DURATION" "$STEP" "$SESSIONS" "$CONNS" "$LIMIT" <<'PY'
import http.client, json, os, sys, threading, time
data, port, duration, step, sessions, conns, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
stop = time.monotonic() + duration
written = [0] * conns
text = "y" * 200
prompt = "x" * 200
def client(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    h = {"Content-Type": "application/json"}
    n = 0
    while time.monotonic() < stop:
        n += 1
        sid = f"g{(n * conns + k) % sessions}"
        cid = f"c{k}-{n}"
        for path, body in (("/prompt", {"session_id": sid, "client_msg_id": cid, "prompt": prompt}),
                           ("/response", {"session_id": sid, "client_msg_id": cid, "text": text})):
            c.request("POST", path, json.dumps(body), h)
            r = c.getresponse(); r.read()
            if r.status != 200:
                sys.exit(f"{path}: {r.status}")
            written[k] += 1
threads = [threading.Thread(target=client, args=(k,)) for k in range(conns)]
for t in threads: t.start()
def size(name):
    try: return os.stat(os.path.join(data, name)).st_size
    except FileNotFoundError: return 0
steady = sessions * limit
print(f"limit {limit} x {sessions} sessions = {steady} messages kept")
print(f"{'s':>4} {'written':>9} {'relay.db':>11} {'relay.db-wal':>13}")
t0 = time.monotonic()
while time.monotonic() < stop:
    time.sleep(step)
    print(f"{time.monotonic() - t0:4.0f} {sum(written):9d} {size('relay.db'):11d} {size('relay.db-wal'):13d}", flush=True)
for t in threads: t.join()
PY
