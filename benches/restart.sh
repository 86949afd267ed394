#!/usr/bin/env bash
# Restart time with persistence: a data directory holding MESSAGES stored
# messages (SESSIONS sessions, half prompts and half answers, answers of
# TEXT bytes), written straight into relay.db with the server's schema;
# then the time from exec until the server answers /healthz, i.e. until it
# listens (it reads no session first), and until it acknowledged a first
# write (to a new session: the storage thread first reads the sessions
# with pending prompts for the loop, then only the sessions a write
# names) (medians of RUNS starts), the file's size, and the server's RSS
# once up.
#
#   benches/restart.sh                         # 1,000,000 messages
#   MESSAGES=100000 RUNS=3 benches/restart.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/lib.sh
MESSAGES="${MESSAGES:-1000000}"
SESSIONS="${SESSIONS:-100}"
TEXT="${TEXT:-200}"
RUNS="${RUNS:-5}"
relay_binary
dir="$(mktemp -d /tmp/relay-restart.XXXXXX)"
trap 'stop_relay; rm -rf "$dir"' EXIT
# The schema, as the server writes it: let it create an empty database.
start_relay restart "$dir/log" RELAY_DATA_DIR="$dir"
stop_relay
python3 - "$dir/relay.db" "$MESSAGES" "$SESSIONS" "$TEXT" <<'PY'
import json, sqlite3, sys, uuid
db, total, sessions, text = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
per = total // sessions
con = sqlite3.connect(db)
con.execute("PRAGMA journal_mode = WAL")
con.execute("PRAGMA synchronous = OFF")
body = "x" * text
with con:
    for s in range(sessions):
        name = f"bench-{s}"
        cur = con.execute(
            "INSERT INTO sessions (name, epoch, next_seq, last_assistant, dropped_assistant)"
            " VALUES (?, ?, ?, ?, 0)", (name, str(uuid.uuid4()), per + 1, per - per % 2))
        sid = cur.lastrowid
        rows = []
        for seq in range(1, per + 1):
            n = (seq + 1) // 2
            cid = f"c{n}"
            if seq % 2:
                data = json.dumps({"session_id": name, "client_msg_id": cid, "prompt": "q", "ts": 1, "seq": seq}, separators=(",", ":"))
                rows.append((sid, seq, 0, cid, None, 1, data))
            else:
                aid = f"a{n}"
                data = json.dumps({"session_id": name, "assistant_msg_id": aid, "client_msg_id": cid, "text": body, "ts": 1, "seq": seq}, separators=(",", ":"))
                rows.append((sid, seq, 1, cid, aid, 1, data))
        con.executemany("INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, data)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.close()
PY
echo "database: $(stat -c %s "$dir/relay.db") bytes for $MESSAGES messages in $SESSIONS sessions"
python3 - "$RELAY_BIN" "$dir" "$RUNS" <<'PY'
import socket, statistics, sys, time
sys.path.insert(0, "benches")
from ready import rss_kib, start_until_ready
binary, data, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
ready, written, rss = [], [], []
for _ in range(runs):
    t0 = time.perf_counter()
    p, port, secs = start_until_ready([binary], {"RELAY_DATA_DIR": data, "RELAY_LOG": "error"}, pause=0.001)
    ready.append(secs)
    body = b'{"session_id":"after-restart","prompt":"hi"}'
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"POST /prompt HTTP/1.1\r\nHost: r\r\nConnection: close\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert c.recv(64).startswith(b"HTTP/1.1 200")
    c.close()
    written.append(time.perf_counter() - t0)
    rss.append(rss_kib(p.pid))
    p.terminate(); p.wait()
ms = lambda xs: 1000 * statistics.median(xs)
print(f"restart (exec to first 200, {runs} starts): median {ms(ready):.1f} ms, "
      f"min {1000 * min(ready):.1f} ms, max {1000 * max(ready):.1f} ms; first write acknowledged: "
      f"median {ms(written):.1f} ms; RSS once up: median {statistics.median(rss) // 1024} MiB")
PY
