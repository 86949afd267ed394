#!/usr/bin/env python3
"""Faults in combination on the real binaries, and a history checker.

Started by scripts/chaos.sh. Runs one redis-server (no persistence, no AOF),
three relays on it and one relay with a data directory (on a small tmpfs when
one can be mounted, so the disk can fill), drives steady traffic from every
kind of client into both worlds, strikes random faults for CHAOS_SECS
seconds, then checks the promises over everything acknowledged and refused:

  * every acknowledged write is in the final history: always for the data
    directory; for Redis unless a flush or a restart of Redis (which, with no
    persistence, loses every session: docs/src/several-instances.md) came
    after it was sent, and then the session is in another epoch;
  * nothing refused (4xx/503) is ever shown: not in /messages, not in a
    long-poll, not on a WebSocket; a 200 "duplicate" never follows only
    refusals of the same id;
  * every answer belongs to its request (the ids it names, its session);
  * seq is gapless per epoch, and one (epoch, seq) is one message everywhere;
  * each subscriber's frames are in order, with no gap and no duplicate
    unless a resync says so, and a resync only where something was lost;
  * a 504 (or a cut connection) may be stored or not, never both ways;
  * the three relays on Redis end with the same history;
  * a streamed part on a WebSocket names a draft an agent streamed, for its
    prompt and session, with one of its parts (a snapshot: parts in order),
    and none follows the answer's `message` on one connection; presence and
    receipt frames name their session, a receipt a prompt stored;
  * the all-sessions poll lists prompts oldest first by arrival (checked in
    the data directory's sessions that are never deleted).

CHAOS_SEED seeds every choice: each thread draws from a generator of its
own, seeded by the seed and the thread's name, so a seed replays each
client's operations and the faults' schedule (which, when, how long); the
threads' interleaving, and so what each client is answered, still differs.
Its last line is `chaos: N operations, M faults, K problems, seed S`.
"""

import base64
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict

RELAY_BIN = os.environ["RELAY_BIN"]
SECS = float(os.environ.get("CHAOS_SECS", "180"))
SEED = int(os.environ.get("CHAOS_SEED", str(random.randrange(1 << 31))))
random.seed(SEED)
_LOCAL = threading.local()


def rng():
    """The calling thread's generator, seeded by CHAOS_SEED and the
    thread's name: each client's draws and the faults' schedule are the
    same on every run of a seed, whatever the threads' interleaving."""
    r = getattr(_LOCAL, "rng", None)
    if r is None:
        r = _LOCAL.rng = random.Random(f"{SEED}/{threading.current_thread().name}")
    return r

WORK = tempfile.mkdtemp(prefix="chaos.")
LOCK = threading.Lock()
STOP = threading.Event()  # traffic stops
FAULTS_STOP = threading.Event()
T0 = time.monotonic()
OPS = [0]
FAULTS = [0]
PROBLEMS = []


def now():
    return time.monotonic() - T0


def problem(msg):
    with LOCK:
        PROBLEMS.append(msg)


def op():
    with LOCK:
        OPS[0] += 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def log(msg):
    print(f"chaos: [{now():7.1f}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


class Redis:
    def __init__(self):
        self.port = free_port()
        self.dir = os.path.join(WORK, "redis")
        os.mkdir(self.dir)
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self.cli("ping") == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        try:
            out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                                 text=True, timeout=5)
            return out.stdout.strip()
        except subprocess.TimeoutExpired:
            return ""

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class Relay:
    def __init__(self, name, env):
        self.name, self.env = name, env
        self.port = free_port()
        self.proc = None
        self.log = open(os.path.join(WORK, f"{name}.log"), "ab")
        self.start()

    def start(self):
        env = dict(os.environ)
        env.update(RELAY_HOST="127.0.0.1", RELAY_PORT=str(self.port), RELAY_LOG_FORMAT="json",
                   RELAY_LOG="warn", RELAY_HISTORY_LIMIT="1000000", RELAY_SESSION_TTL="0",
                   RELAY_STORE_TIMEOUT="5")
        env.update(self.env)
        for attempt in range(50):
            self.proc = subprocess.Popen([RELAY_BIN], env=env, stdout=subprocess.DEVNULL,
                                         stderr=self.log)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    return
                except OSError:
                    time.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            # The port still held, or the data directory still locked by a
            # dying process: try again.
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start")

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------- clients


class Http:
    """Keep-alive connections per port; no retry: a request is sent once."""

    def __init__(self):
        self.conns = {}

    def req(self, port, method, path, body=None, timeout=10):
        op()
        c = self.conns.get(port)
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            self.conns[port] = c
        c.timeout = timeout
        if c.sock is not None:
            c.sock.settimeout(timeout)
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        try:
            c.request(method, path, body=data, headers=hdrs)
            r = c.getresponse()
            raw = r.read()
            if r.getheader("Connection", "").lower() == "close":
                self.drop(port)
        except (OSError, http.client.HTTPException):
            self.drop(port)
            return None, None  # cut: may or may not have happened
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, None

    def drop(self, port):
        c = self.conns.pop(port, None)
        if c is not None:
            c.close()


def cut(port, method, path, body):
    """Sends a request and closes the connection at once (a reset, unread)."""
    op()
    data = json.dumps(body).encode()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                  .encode() + data)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass


def ws_connect(port, path, timeout=3):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise OSError("closed during upgrade")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 101"):
        s.close()
        raise OSError("upgrade refused: " + head.split(b"\r\n")[0].decode(errors="replace"))
    return s, rest


def ws_send(s, opcode, payload):
    mask = os.urandom(4)
    n = len(payload)
    hdr = bytes([0x80 | opcode])
    if n < 126:
        hdr += bytes([0x80 | n])
    elif n < 65536:
        hdr += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        hdr += bytes([0x80 | 127]) + struct.pack("!Q", n)
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


class WsReader:
    def __init__(self, s, rest):
        self.s, self.buf = s, rest

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk

    def frame(self):
        """One text message (str), or None for a close; control frames handled."""
        while True:
            self._need(2)
            b0, b1 = self.buf[0], self.buf[1]
            n, off = b1 & 0x7F, 2
            if n == 126:
                self._need(4)
                n, off = struct.unpack("!H", self.buf[2:4])[0], 4
            elif n == 127:
                self._need(10)
                n, off = struct.unpack("!Q", self.buf[2:10])[0], 10
            self._need(off + n)
            payload, self.buf = self.buf[off:off + n], self.buf[off + n:]
            opcode = b0 & 0x0F
            if opcode == 0x9:
                ws_send(self.s, 0xA, payload)
            elif opcode == 0x8:
                return None
            elif opcode in (0x1, 0x0):
                return payload.decode()


# ---------------------------------------------------------------- the record


class World:
    """One set of relays sharing state: the Redis three, or the data one."""

    def __init__(self, name, relays, persistent, ephemeral):
        self.name = name
        self.relays = relays
        self.persistent = persistent  # never deleted
        self.ephemeral = ephemeral  # deleted and created again
        # (kind, id) -> list of (status, t_sent, t_done, session, seq or None)
        self.writes = defaultdict(list)
        self.shown = {}  # (kind, id) -> where it was first shown
        self.hist = defaultdict(dict)  # (session, epoch) -> {seq: (kind, id)}
        self.seen_in = defaultdict(set)  # (kind, id) -> {(session, epoch)} where shown
        self.subs = []  # subscriber runs
        self.polled = {}  # client_msg_id -> session it was shown in
        self.final = {}  # session -> (epoch, {seq: (kind, id)}) per relay list
        self.lost = []  # (t_start, t_end) of Redis flushes and restarts
        # assistant_msg_id -> (session, client_msg_id, [texts of its parts])
        self.drafts = {}
        self.frames = defaultdict(int)  # frame type -> frames read and checked
        self.ordered = [0]  # all-sessions lists checked for arrival order

    def port(self):
        return rng().choice(self.relays).port

    def record(self, kind, ident, status, t_sent, session, seq=None):
        with LOCK:
            self.writes[(kind, ident)].append((status, t_sent, now(), session, seq))

    def show(self, kind, ident, where):
        with LOCK:
            self.shown.setdefault((kind, ident), where)

    def note_history(self, session, epoch, items, where):
        with LOCK:
            h = self.hist[(session, epoch)]
            for seq, key in items:
                old = h.get(seq)
                if old is not None and old != key:
                    PROBLEMS.append(f"{self.name} {session} epoch {epoch[:8]}: seq {seq} is {old} "
                                    f"and also {key} ({where})")
                h[seq] = key
                self.seen_in[key].add((session, epoch))
        for seq, key in items:
            self.show(key[0], key[1], where)


def msg_key(item):
    t, d = item["type"], item["data"]
    ident = {"prompt": "client_msg_id", "assistant": "assistant_msg_id", "cancel": "client_msg_id",
             "ask": "ask_id", "reply": "ask_id"}[t]
    return d["seq"], (t, d[ident])


def read_history(w, port, session, after=0, http=None):
    """Every message of `session` after `after`: (epoch, [(seq, key)]), or None."""
    http = http or Http()
    items, epoch = [], None
    while True:
        st, body = http.req(port, "GET", f"/messages/{session}?limit=1000&after={after}")
        if st == 404 and not items:
            return None, []  # no such session (deleted, or lost with the store)
        if st != 200 or not isinstance(body, dict):
            return None
        if body.get("session_id") != session:
            problem(f"{w.name}: /messages/{session} answered for {body.get('session_id')}")
        if epoch is not None and body["epoch"] != epoch:
            return None  # changed while paging: read again later
        epoch = body["epoch"]
        page = [msg_key(m) for m in body["messages"]]
        items += page
        if len(page) < 1000:
            return epoch, items
        after = page[-1][0]


# ---------------------------------------------------------------- traffic


def prompter(w, tag):
    http = Http()
    mine = []  # (session, id, text)
    n = 0
    while not STOP.is_set():
        if mine and rng().random() < 0.2:
            session, cid, text = rng().choice(mine)  # a reused id, same text
        else:
            n += 1
            session = rng().choice(w.persistent + w.ephemeral)
            cid, text = f"{tag}-{n}", f"prompt {tag} {n}"
            mine.append((session, cid, text))
        t = now()
        if rng().random() < 0.02:
            # A client that hangs up before its answer: stored or not.
            cut(w.port(), "POST", "/prompt",
                {"session_id": session, "prompt": text, "client_msg_id": cid})
            w.record("prompt", cid, None, t, session)
            continue
        st, body = http.req(w.port(), "POST", "/prompt",
                            {"session_id": session, "prompt": text, "client_msg_id": cid})
        if st == 200:
            if body.get("client_msg_id") != cid:
                problem(f"{w.name}: POST /prompt {cid} answered for {body.get('client_msg_id')}")
            if body.get("duplicate"):
                prior = [x[0] for x in w.writes[("prompt", cid)]]
                if prior and all(s is not None and s != 504 and s != 200 for s in prior):
                    # Only refusals before: the refused write was stored.
                    problem(f"{w.name}: prompt {cid} duplicate after only refusals {prior}")
        w.record("prompt", cid, st, t, session)
        time.sleep(0.005)


def agent(w, tag, all_sessions):
    http = Http()
    n = 0
    cursor = None
    while not STOP.is_set():
        port = w.port()
        if all_sessions:
            path = "/prompts?timeout=1&limit=20" + (f"&after={cursor}" if cursor else "")
            if rng().random() < 0.3:
                cursor = None
        else:
            session = rng().choice(w.persistent + w.ephemeral)
            path = f"/prompts/{session}?timeout=1"
        st, body = http.req(port, "GET", path)
        if st != 200 or not isinstance(body, list):
            time.sleep(0.05)
            continue
        if all_sessions:
            arrival_order(w, path, body)
        for p in body:
            sid = p.get("session_id", None if all_sessions else session)
            if not all_sessions and sid not in (None, session):
                problem(f"{w.name}: GET {path} gave a prompt of {sid}")
            w.show("prompt", p["client_msg_id"], f"long-poll {path}")
            if all_sessions and p.get("cursor"):
                cursor = p["cursor"]
        for p in body[:5]:
            sid = p.get("session_id") or session
            n += 1
            aid = f"{tag}-{n}"
            if rng().random() < 0.3:
                parts = [f"part{k} " for k in range(rng().randint(1, 2))]
                with LOCK:
                    w.drafts[aid] = (sid, p["client_msg_id"], parts)
                for text in parts:
                    http.req(w.port(), "POST", "/response",
                             {"session_id": sid, "client_msg_id": p["client_msg_id"],
                              "assistant_msg_id": aid, "text": text, "partial": True})
            t = now()
            answer = {"session_id": sid, "client_msg_id": p["client_msg_id"],
                      "assistant_msg_id": aid, "text": f"answer {aid}"}
            if rng().random() < 0.02:
                cut(w.port(), "POST", "/response", answer)
                w.record("assistant", aid, None, t, sid)
                continue
            st, rb = http.req(w.port(), "POST", "/response", answer)
            if st == 200 and rb.get("assistant_msg_id") != aid:
                problem(f"{w.name}: POST /response {aid} answered for {rb.get('assistant_msg_id')}")
            w.record("assistant", aid, st, t, sid)


def canceller_asker(w, tag):
    http = Http()
    n = 0
    while not STOP.is_set():
        time.sleep(0.02)
        session = rng().choice(w.persistent + w.ephemeral)
        n += 1
        if rng().random() < 0.5:
            # Cancel a prompt of its own, posted just now.
            cid = f"{tag}-c{n}"
            t = now()
            st, _ = http.req(w.port(), "POST", "/prompt",
                             {"session_id": session, "prompt": cid, "client_msg_id": cid})
            w.record("prompt", cid, st, t, session)
            t = now()
            st, body = http.req(w.port(), "POST", "/cancel",
                                {"session_id": session, "client_msg_id": cid})
            seq = body.get("seq") if st == 200 else None
            w.record("cancel", cid, st, t, session, seq)
        else:
            aid = str(uuid.UUID(int=rng().getrandbits(128), version=4))
            t = now()
            st, body = http.req(w.port(), "POST", "/ask",
                                {"session_id": session, "ask_id": aid, "text": "go?",
                                 "choices": ["yes", "no"], "timeout": 3600})
            if st == 200 and body.get("ask_id") != aid:
                problem(f"{w.name}: POST /ask {aid} answered for {body.get('ask_id')}")
            w.record("ask", aid, st, t, session, body.get("seq") if st == 200 else None)
            t = now()
            st, body = http.req(w.port(), "POST", "/reply",
                                {"session_id": session, "ask_id": aid, "text": "yes"})
            w.record("reply", aid, st, t, session, body.get("seq") if st == 200 else None)


def deleter(w):
    http = Http()
    while not STOP.is_set():
        time.sleep(rng().uniform(2, 6))
        http.req(w.port(), "DELETE", f"/sessions/{rng().choice(w.ephemeral)}")


def snapshotter(w):
    http = Http()
    known = {}  # session -> (epoch, last seq)
    while not STOP.is_set():
        for session in w.persistent + w.ephemeral:
            epoch, last = known.get(session, (None, 0))
            got = read_history(w, w.port(), session, last, http)
            if got is None or got[0] is None:
                continue
            if got[0] != epoch and last:
                got = read_history(w, w.port(), session, 0, http)
                if got is None or got[0] is None:
                    continue
            e, items = got
            w.note_history(session, e, items, "/messages")
            known[session] = (e, items[-1][0] if items else (last if e == epoch else 0))
        time.sleep(0.2)


class Run:
    def __init__(self, session, epoch, after, why):
        self.session, self.epoch, self.after, self.why = session, epoch, after, why
        self.frames = []  # (seq, key)
        self.t = now()


def subscriber(w, session):
    http = Http()
    epoch = None
    while epoch is None and not STOP.is_set():
        st, body = http.req(w.port(), "PUT", f"/sessions/{session}")
        if st == 200:
            epoch = body["epoch"]
        else:
            time.sleep(0.1)
    run = Run(session, epoch, 0, "start")
    with LOCK:
        w.subs.append(run)
    last = 0
    while not STOP.is_set():
        port = w.port()
        op()
        try:
            s, rest = ws_connect(port, f"/ws/{session}?after={last}&epoch={run.epoch}")
        except OSError:
            time.sleep(0.1)
            continue
        s.settimeout(0.5)
        rd = WsReader(s, rest)
        finals = set()  # answers this connection was sent whole
        until = time.monotonic() + rng().uniform(0.5, 6)
        try:
            while time.monotonic() < until and not STOP.is_set():
                try:
                    text = rd.frame()
                except socket.timeout:
                    continue
                if text is None:
                    break
                f = json.loads(text)
                t = f.get("type")
                with LOCK:
                    w.frames[t] += 1
                if t == "resync":
                    # First on a connection that resumed, or on a live one
                    # when the store lost the session (a new epoch).
                    run = Run(session, f["epoch"], f["first_seq"] - 1, "resync")
                    with LOCK:
                        w.subs.append(run)
                    last = f["first_seq"] - 1
                elif t in ("message", "cancel", "ask", "reply"):
                    seq, key = msg_key({"type": "assistant" if t == "message" else t,
                                        "data": f["data"]})
                    if f["data"].get("session_id", session) != session:
                        problem(f"{w.name} {session}: a frame of {f['data'].get('session_id')}")
                    run.frames.append((seq, key))
                    with LOCK:
                        w.seen_in[key].add((session, run.epoch))
                    w.show(key[0], key[1], f"WebSocket {session}")
                    last = seq
                    if t == "message":
                        finals.add(f["data"].get("assistant_msg_id"))
                elif t in ("delta", "delta_end"):
                    draft_frame(w, session, f, finals)
                elif t == "presence":
                    d = f["data"]
                    if d.get("session_id") != session or d.get("agent") not in ("online", "offline"):
                        problem(f"{w.name} {session}: a presence frame {d}")
                elif t == "receipt":
                    # A prompt fetched by an agent: stored, so never one refused.
                    d = f["data"]
                    if d.get("session_id") != session or d.get("state") != "fetched":
                        problem(f"{w.name} {session}: a receipt frame {d}")
                    else:
                        w.show("prompt", d.get("client_msg_id"), f"receipt {session}")
        except (OSError, EOFError, ValueError):
            pass
        finally:
            s.close()


def draft_frame(w, session, f, finals):
    """A part of a streamed answer (`delta`, or `delta_end` when its draft
    ends unanswered) names a draft an agent streamed in this session, for
    its prompt, and carries one of its parts (a snapshot: parts taken so
    far, in the order sent); on one connection no part follows the answer's `message`,
    which ends the draft."""
    t, d = f["type"], f["data"]
    aid = d.get("assistant_msg_id")
    with LOCK:
        draft = w.drafts.get(aid)
    if draft is None:
        problem(f"{w.name} {session}: a {t} frame of {aid}, which no agent streamed")
        return
    sid, cid, parts = draft
    if sid != session or d.get("session_id", session) != session or d.get("client_msg_id") != cid:
        problem(f"{w.name} {session}: a {t} frame of {aid} for {d.get('session_id')} "
                f"{d.get('client_msg_id')}, streamed for {sid} {cid}")
    if t != "delta":
        return
    if aid in finals:
        problem(f"{w.name} {session}: a part of {aid} after its final answer")
    text = d.get("text")
    if d.get("snapshot"):
        # The parts taken so far, in order (a part may have been refused).
        rest = text if isinstance(text, str) else ""
        for part in parts:
            if rest.startswith(part):
                rest = rest[len(part):]
        ok = bool(text) and rest == ""
    else:
        ok = text in parts
    if not ok:
        problem(f"{w.name} {session}: a part of {aid} reads {text!r}, streamed {parts}")


def arrival_order(w, path, body):
    """The all-sessions poll lists prompts oldest first by arrival across
    sessions: a prompt acknowledged before another was first sent arrived
    first, and must not be listed after it. Checked where arrivals are
    known once acknowledged: the data directory's sessions never deleted
    (Redis may lose a prompt and take it again later, and a deleted
    session's id may be prompted again, with no acknowledgement seen)."""
    if w.name != "data":
        return
    listed = []
    with LOCK:
        for p in body:
            cid, sid = p.get("client_msg_id"), p.get("session_id")
            recs = w.writes.get(("prompt", cid), [])
            sent = min((r[1] for r in recs), default=None)
            acked = min((r[2] for r in recs if r[0] == 200), default=None)
            listed.append((cid, sid in w.persistent, sent, acked))
        w.ordered[0] += 1
    for i, (ci, kept_i, sent_i, _) in enumerate(listed):
        for cj, kept_j, _, acked_j in listed[i + 1:]:
            if kept_i and kept_j and sent_i is not None and acked_j is not None \
                    and acked_j < sent_i:
                problem(f"{w.name}: GET {path} listed {ci} (first sent at {sent_i:.3f} s) "
                        f"before {cj} (acknowledged at {acked_j:.3f} s)")


# ---------------------------------------------------------------- faults


class Faults:
    def __init__(self, redis, rworld, dworld, disk):
        self.redis, self.rw, self.dw, self.disk = redis, rworld, dworld, disk
        self.busy = set()
        self.straces = []

    def hold(self, lo, hi):
        end = time.monotonic() + rng().uniform(lo, hi)
        while time.monotonic() < end and not FAULTS_STOP.is_set():
            time.sleep(0.05)

    def kill_relay(self, r):
        r.kill9()
        self.hold(0, 1.5)
        r.start()

    def redis_restart(self):
        t = now()
        self.redis.kill()
        self.hold(0.2, 2)
        self.redis.start()
        with LOCK:
            self.rw.lost.append((t, now()))

    def redis_pause(self):
        self.redis.proc.send_signal(signal.SIGSTOP)
        self.hold(0.5, 3)
        self.redis.proc.send_signal(signal.SIGCONT)

    def redis_flush(self):
        t = now()
        self.redis.cli("flushall")
        with LOCK:
            self.rw.lost.append((t, now()))

    def redis_oom(self):
        self.redis.cli("config", "set", "maxmemory", "1")
        self.hold(0.5, 3)
        self.redis.cli("config", "set", "maxmemory", "0")

    def redis_cut(self):
        self.redis.cli("client", "kill", "type", rng().choice(["normal", "pubsub"]))

    def disk_stall(self):
        d = self.dw.relays[0]
        delay = rng().choice([500000, 2000000, 4000000])
        p = subprocess.Popen(["strace", "-f", "-o", "/dev/null", "-e", "trace=fdatasync", "-e",
                              f"inject=fdatasync:delay_enter={delay}", "-p", str(d.proc.pid)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.hold(1, 5)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def disk_fill(self):
        filler = os.path.join(self.disk, "filler")
        st = os.statvfs(self.disk)
        free = st.f_bavail * st.f_frsize
        chunk = b"\0" * (1 << 20)
        try:
            with open(filler, "wb") as f:
                for _ in range(free // len(chunk) + 1):
                    f.write(chunk)
        except OSError:
            pass  # full: what we wanted
        self.hold(1, 4)
        os.unlink(filler)

    def run(self):
        kinds = [("relay", 4), ("redis_restart", 1), ("redis_pause", 1), ("redis_flush", 1),
                 ("redis_oom", 1), ("redis_cut", 2), ("disk_stall", 2)]
        if self.disk:
            kinds.append(("disk_fill", 1))
        drawn = 0
        while not FAULTS_STOP.is_set():
            drawn += 1
            time.sleep(rng().uniform(0.5, 2.5))
            self.watch()
            kind = rng().choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            if kind == "relay":
                r = rng().choice(self.rw.relays + self.dw.relays)
                res, fn = r.name, lambda r=r: self.kill_relay(r)
            elif kind.startswith("redis"):
                res, fn = "redis", getattr(self, kind)
            else:
                res, fn = "disk", getattr(self, kind)
            with LOCK:
                if res in self.busy or FAULTS_STOP.is_set():
                    continue
                self.busy.add(res)
                FAULTS[0] += 1
            log(f"fault: {kind} {res}")

            def go(res=res, fn=fn):
                try:
                    fn()
                finally:
                    with LOCK:
                        self.busy.discard(res)

            # Named by its place in the schedule: its own draws (how long
            # it holds) are the same on every run of the seed.
            threading.Thread(target=go, name=f"fault{drawn}", daemon=True).start()

    def watch(self):
        """A relay that exited while no fault held it died on its own."""
        for r in self.rw.relays + self.dw.relays:
            with LOCK:
                if r.name in self.busy or r.proc.poll() is None:
                    continue
                self.busy.add(r.name)
            PROBLEMS.append(f"{r.name} exited on its own (status {r.proc.returncode})")
            r.start()
            with LOCK:
                self.busy.discard(r.name)

    def wait_idle(self):
        while True:
            with LOCK:
                if not self.busy:
                    return
            time.sleep(0.1)


# ---------------------------------------------------------------- checks


def check(w):
    # The final history, from every relay of the world: the same everywhere.
    final = {}
    for session in w.persistent + w.ephemeral:
        views = []
        for r in w.relays:
            got = None
            for _ in range(50):
                got = read_history(w, r.port, session)
                if got is not None:
                    break
                time.sleep(0.2)
            views.append(got)
        if views[0] is None:
            problem(f"{w.name} {session}: no final history")
            continue
        if views[0][0] is None:
            final[session] = (None, {})
            continue
        for r, v in zip(w.relays[1:], views[1:]):
            if v != views[0]:
                problem(f"{w.name} {session}: {r.name} ends with another history than "
                        f"{w.relays[0].name}")
        epoch, items = views[0]
        seqs = [seq for seq, _ in items]
        if seqs != list(range(1, len(seqs) + 1)):
            missing = sorted(set(range(1, max(seqs) + 1)) - set(seqs))[:10]
            problem(f"{w.name} {session} epoch {epoch[:8]}: the final history lacks seq {missing}")
        w.note_history(session, epoch, items, "final /messages")
        final[session] = (epoch, {key: seq for seq, key in items})

    # seq gapless per epoch.
    for (session, epoch), h in w.hist.items():
        seqs = sorted(h)
        if seqs and seqs != list(range(seqs[0], seqs[-1] + 1)):
            missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))[:10]
            problem(f"{w.name} {session} epoch {epoch[:8]}: seq gaps {missing}")
        if seqs and seqs[0] != 1 and (session, epoch) in [(s, final[s][0]) for s in final]:
            problem(f"{w.name} {session} epoch {epoch[:8]}: history starts at {seqs[0]}")

    # Anything shown in a session's final epoch is still there.
    for key, places in w.seen_in.items():
        for session, epoch in places:
            fin = final.get(session)
            if fin is not None and fin[0] == epoch and key not in fin[1]:
                problem(f"{w.name} {session}: {key} was shown in epoch {epoch[:8]} and is gone "
                        "from it")

    # Acknowledged, refused, maybe.
    where_seen = w.seen_in
    acked = refused = maybe = 0
    for key, attempts in w.writes.items():
        statuses = [a[0] for a in attempts]
        ok = [a for a in attempts if a[0] == 200]
        unsure = [a for a in attempts if a[0] is None or a[0] == 504]
        session = attempts[0][3]
        fin = final.get(session)
        present = fin is not None and key in fin[1]
        if ok:
            acked += 1
            if session in w.ephemeral:
                continue
            t_sent = min(a[1] for a in ok)
            if not present:
                lost = [l for l in w.lost if l[1] >= t_sent]
                if not lost:
                    problem(f"{w.name} {session}: acknowledged {key} ({statuses}) is not in "
                            f"the final history")
            else:
                lost = [l for l in w.lost if l[1] >= min(a[1] for a in ok)]
                for a in ok:
                    if a[4] is not None and not lost and fin[1][key] != a[4]:
                        problem(f"{w.name} {session}: {key} acknowledged with seq {a[4]}, "
                                f"stored at {fin[1][key]}")
        elif unsure:
            maybe += 1
        else:
            refused += 1
            if key in w.shown:
                problem(f"{w.name}: {key} refused {statuses} but shown in {w.shown[key]}")

    # Subscribers.
    resyncs = 0
    for run in w.subs:
        seqs = [s for s, _ in run.frames]
        if any(b <= a for a, b in zip(seqs, seqs[1:])):
            bad = [(a, b) for a, b in zip(seqs, seqs[1:]) if b <= a][:5]
            problem(f"{w.name} {run.session}: a subscriber's frames out of order or repeated "
                    f"{bad} (epoch {run.epoch[:8]})")
        if run.why == "resync":
            resyncs += 1
            if run.session in w.persistent and not any(l[0] <= run.t for l in w.lost):
                problem(f"{w.name} {run.session}: resync at {run.t:.1f} s with nothing lost")
        h = w.hist.get((run.session, run.epoch), {})
        seen = dict(run.frames)
        for seq, key in run.frames:
            if seq in h and h[seq] != key:
                problem(f"{w.name} {run.session}: subscriber got {key} as seq {seq}, history "
                        f"has {h[seq]} (epoch {run.epoch[:8]})")
        if seqs:
            for seq in range(run.after + 1, seqs[-1] + 1):
                if seq in h and h[seq][0] != "prompt" and seq not in seen:
                    problem(f"{w.name} {run.session}: subscriber missed seq {seq} {h[seq]} "
                            f"(epoch {run.epoch[:8]})")
                    break
    log(f"{w.name}: {acked} acknowledged, {refused} refused, {maybe} unsure writes; "
        f"{len(w.subs)} subscriber runs, {resyncs} resyncs; {len(w.lost)} losses of Redis; "
        f"frames {dict(sorted(w.frames.items()))}; {w.ordered[0]} all-sessions lists ordered")


# ---------------------------------------------------------------- main


def guarded(run):
    """A client that fails (an answer it cannot read) is a problem, not a
    silent end of its traffic."""

    def go():
        try:
            run()
        except Exception as e:  # noqa: BLE001
            problem(f"a client stopped: {e!r}")

    return go


def main():
    disk = os.path.join(WORK, "disk")
    os.mkdir(disk)
    # Room for what the run writes (about a quarter of a MiB a second,
    # never trimmed), so that the disk is full only while the fault fills it.
    size = 32 + int(SECS) // 2
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs", disk],
                             capture_output=True).returncode == 0
    if not mounted:
        log("no tmpfs could be mounted (needs root): the disk-full fault is skipped")
    redis = Redis()
    relays, procs = [], []
    try:
        url = f"redis://127.0.0.1:{redis.port}"
        rw = World("redis", [Relay(f"r{i}", {"RELAY_REDIS_URL": url}) for i in range(3)],
                   [f"rp{i}" for i in range(4)], ["re0", "re1"])
        dw = World("data", [Relay("d", {"RELAY_DATA_DIR": os.path.join(disk, "data")})],
                   [f"dp{i}" for i in range(4)], ["de0", "de1"])
        relays = rw.relays + dw.relays
        if os.environ.get("CHAOS_KEEP") == "1":
            log(f"logs in {WORK}")
        log(f"seed {SEED}; redis :{redis.port}; relays "
            + " ".join(f"{r.name}:{r.port}" for r in relays) + f"; {SECS:.0f} s")
        threads = []
        for w in (rw, dw):
            # Each thread is named, for its generator (`rng`).
            def thread(target, name, *args):
                threads.append(threading.Thread(target=target, name=name, args=args))
            for i in range(2):
                thread(prompter, f"{w.name}-p{i}", w, f"{w.name}-p{i}")
            thread(agent, f"{w.name}-a", w, f"{w.name}-a", False)
            thread(agent, f"{w.name}-all", w, f"{w.name}-all", True)
            thread(canceller_asker, f"{w.name}-c", w, f"{w.name}-c")
            thread(deleter, f"{w.name}-deleter", w)
            thread(snapshotter, f"{w.name}-snapshots", w)
            for s in w.persistent + w.ephemeral:
                thread(subscriber, f"{w.name}-sub-{s}", w, s)
        for t in threads:
            t.daemon = True
            t.run = guarded(t.run)
            t.start()
        faults = Faults(redis, rw, dw, disk if mounted else None)
        ft = threading.Thread(target=faults.run, name="faults", daemon=True)
        ft.start()
        # The faults stop a few seconds early, so that the calm below and
        # the checks keep the whole run near CHAOS_SECS.
        while now() < max(SECS - 5, SECS * 0.8):
            time.sleep(0.5)
        FAULTS_STOP.set()
        ft.join()
        faults.wait_idle()
        faults.watch()
        # Calm: a few seconds of traffic with no fault, so that subscribers
        # catch up, then traffic stops.
        time.sleep(3)
        STOP.set()
        for t in threads:
            t.join(timeout=30)
        for w in (rw, dw):
            check(w)
        faults.watch()
        for r in relays:
            with open(os.path.join(WORK, f"{r.name}.log"), errors="replace") as f:
                panics = sum("panicked" in line for line in f)
            if panics:
                problem(f"{r.name}: {panics} panics in its log")
    finally:
        for r in relays:
            r.stop()
        try:
            redis.kill()
        except Exception:
            pass
        if mounted:
            subprocess.run(["umount", "-l", disk])
        if os.environ.get("CHAOS_KEEP") != "1":
            subprocess.run(["rm", "-rf", WORK])
    for p in PROBLEMS[:40]:
        print(f"chaos: problem: {p}")
    if len(PROBLEMS) > 40:
        print(f"chaos: … and {len(PROBLEMS) - 40} more")
    if PROBLEMS:
        print(f"chaos: replay the schedule: CHAOS_SEED={SEED} CHAOS_SECS={SECS:.0f} scripts/chaos.sh")
    print(f"chaos: {OPS[0]} operations, {FAULTS[0]} faults, {len(PROBLEMS)} problems, "
          f"seed {SEED}")
    sys.exit(1 if PROBLEMS else 0)


if __name__ == "__main__":
    main()
