#!/usr/bin/env bash
# Restart time with persistence: a data directory holding MESSAGES stored
# messages (SESSIONS sessions, half prompts and half answers, answers of
# TEXT bytes), written straight into relay.db with the server's schema;
# then the time from exec until the server answers /healthz, i.e. until it
# listens (it reads no session first), and until it acknowledged a first
# write (to a new session: the storage thread first reads the sessions
# with pending prompts for the loop, then only the sessions a write
# names) (medians of RUNS starts), the file's size, and the server's RSS
# once up. With TOUCH=1, then: every session read in turn (`GET
# /messages`, a page of 100), the RSS after that, and the time of a read
# of a session the server does not hold against one it holds (medians of
# READS each).
#
#   benches/restart.sh                         # 1,000,000 messages
#   MESSAGES=100000 RUNS=3 benches/restart.sh
#   MESSAGES=10000000 SESSIONS=100000 MEMORY=64M TOUCH=1 benches/restart.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/lib.sh
MESSAGES="${MESSAGES:-1000000}"
SESSIONS="${SESSIONS:-100}"
TEXT="${TEXT:-200}"
RUNS="${RUNS:-5}"
MEMORY="${MEMORY:-256M}"
TOUCH="${TOUCH:-0}"
READS="${READS:-2000}"
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
    # What the server keeps beside the rows: the sessions counted (no
    # prompt is pending, so the `pending` table stays empty).
    con.execute("UPDATE generation SET sessions = (SELECT count(*) FROM sessions)")
    # Every row listed for reading its session back, as the server lists
    # them (`session_rows`, src/store/sqlite/schema.rs): no unlisted tail.
    con.execute("INSERT INTO session_rows (session, id) SELECT session, id FROM messages ORDER BY session, id")
    con.execute("UPDATE generation SET indexed = (SELECT coalesce(max(id), 0) FROM messages)")
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
con.close()
PY
echo "database: $(stat -c %s "$dir/relay.db") bytes for $MESSAGES messages in $SESSIONS sessions"
python3 - "$RELAY_BIN" "$dir" "$RUNS" "$MEMORY" "$SESSIONS" "$TOUCH" "$READS" <<'PY'
import random, socket, statistics, sys, time
sys.path.insert(0, "benches")
from ready import rss_kib, start_until_ready
binary, data, runs, memory = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sessions, touch, reads = int(sys.argv[5]), sys.argv[6] == "1", int(sys.argv[7])
env = {"RELAY_DATA_DIR": data, "RELAY_LOG": "error", "RELAY_SYNC": "always",
       "RELAY_MAX_MEMORY": memory, "RELAY_MAX_SESSIONS": str(2 * sessions + 2 * runs)}
ready, written, rss = [], [], []
for run in range(runs):
    t0 = time.perf_counter()
    p, port, secs = start_until_ready([binary], env, pause=0.0005)
    ready.append(secs)
    body = b'{"session_id":"after-restart-%d-%d","prompt":"hi"}' % (run, time.time_ns())
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
      f"median {ms(written):.1f} ms, min {1000 * min(written):.1f} ms, max {1000 * max(written):.1f} ms; "
      f"RSS once up: median {statistics.median(rss) // 1024} MiB")
if not touch:
    sys.exit(0)
p, port, _ = start_until_ready([binary], env, pause=0.001)
c = socket.create_connection(("127.0.0.1", port))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
def get(path):
    # One request on a kept-alive connection; the whole body read.
    global buf
    c.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: r\r\n\r\n")
    while b"\r\n\r\n" not in buf:
        buf += c.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    n = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
    while len(buf) < n:
        buf += c.recv(65536)
    body, buf = buf[:n], buf[n:]
    return body
t = time.perf_counter()
for s in range(sessions):
    get(f"/messages/bench-{s}")
touched = time.perf_counter() - t
after = rss_kib(p.pid)
# A session just read is held; one read long ago (the first ones) is not.
def timed(sid):
    t = time.perf_counter(); get(f"/messages/{sid}"); return time.perf_counter() - t
held, cold = [], []
last = f"bench-{sessions - 1}"
order = list(range(sessions))
random.Random(1).shuffle(order)
for i in range(min(reads, sessions)):
    held.append(timed(last))
    cold.append(timed(f"bench-{order[i]}"))
    last = f"bench-{order[i]}"
p.terminate(); p.wait()
us = lambda xs: 1e6 * statistics.median(xs)
print(f"every session read in turn ({sessions}, RELAY_MAX_MEMORY={memory}): {touched:.1f} s; "
      f"RSS after: {after // 1024} MiB")
print(f"a page of 100: held p50 {us(held):.0f} us, p99 {1e6 * sorted(held)[len(held) * 99 // 100]:.0f} us; "
      f"not held (read back) p50 {us(cold):.0f} us, p99 {1e6 * sorted(cold)[len(cold) * 99 // 100]:.0f} us "
      f"({len(cold)} reads each)")
PY
