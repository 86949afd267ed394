#!/usr/bin/env python3
"""Bounded soak test of a running relay server (driven by scripts/soak.sh).

Load, all on loopback, all loops bounded by time (and counts):
  * client posters: POST /prompt to the sessions of the current generation
  * agents: long-poll GET /prompts (after=..., short timeout) and answer with
    POST /response (sometimes in two parts, sometimes resending a part, which
    must come back as a duplicate)
  * WebSocket subscribers that come and go, reconnecting with `after`
  * slow readers that stop reading while big answers are posted to their
    session, and then get every one, in order, without being closed
  * a few deliberate bad requests (counted as provoked)
  * an RSS sampler (/proc/PID/status VmRSS)

Sessions live in generations of GEN_SECONDS: producers use the current one;
two generations later every session of a generation is checked against what
the server acknowledged and then deleted, so memory reaches a steady state
while every acknowledged message is still verified.

Checks (exit 1 on any violation): every acknowledged prompt and response is in
GET /messages; no duplicate seq in a session; seq strictly increasing; every
WebSocket connection saw every answer between its cursor and its last frame,
in seq order; RSS flat after warm-up; no HTTP error status except the
provoked ones.
"""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict

import websocket  # websocket-client

MiB = 1024 * 1024


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = Counter()
        self.violations = []
        self.status = Counter()  # (endpoint, status) of unprovoked requests
        self.provoked = Counter()  # (kind, status)

    def inc(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def violation(self, msg):
        with self.lock:
            if len(self.violations) < 200:
                self.violations.append(msg)
            self.c["violations"] += 1


class Http:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, host, port, timeout=15):
        self.host, self.port, self.timeout = host, port, timeout
        self.conn = None

    def request(self, method, path, body=None, headers=None):
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            if isinstance(data, str):
                data = data.encode()
            hdrs.setdefault("Content-Type", "application/json")
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=hdrs)
                r = self.conn.getresponse()
                raw = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                try:
                    parsed = json.loads(raw) if raw else None
                except ValueError:
                    parsed = raw
                return r.status, parsed
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                # A keep-alive connection the server closed while idle: retry
                # once on a fresh one. A second failure is real.
                if attempt == 1:
                    raise
        raise RuntimeError("unreachable")

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None


class Soak:
    def __init__(self, args):
        self.a = args
        self.host, port = args.addr.rsplit(":", 1)
        self.port = int(port)
        self.stats = Stats()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        # Acknowledged writes, per session: client_msg_id set, assistant_msg_id set.
        self.acked_prompts = defaultdict(set)
        self.acked_responses = defaultdict(set)
        self.retired = set()  # sessions verified and deleted
        self.ws_segments = []  # (sid, after, [seqs received]) of regular subscribers
        self.rss = []  # (t, kib)
        self.verified_gens = 0
        self.verified_msgs = 0

    # -- sessions ----------------------------------------------------------
    def gen(self, t=None):
        t = time.monotonic() if t is None else t
        return int((t - self.t0) // self.a.gen_seconds)

    def sessions(self, g):
        return [f"soak-g{g}-s{i}" for i in range(self.a.sessions)]

    def running(self):
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def record(self, endpoint, status, sid=None):
        """Counts a status of a request that was not meant to fail."""
        with self.stats.lock:
            self.stats.status[(endpoint, status)] += 1
        if status == 200:
            return True
        if status == 404 and sid is not None and sid in self.retired:
            self.stats.inc("404 on a retired session (race with delete)")
            return False
        self.stats.violation(f"{endpoint}: unexpected HTTP {status}")
        return False

    # -- workers -----------------------------------------------------------
    def poster(self, idx):
        h = Http(self.host, self.port)
        rng = random.Random(idx)
        n = 0
        while self.running() and n < self.a.max_ops:
            n += 1
            g = self.gen()
            sid = rng.choice(self.sessions(g))
            cmid = f"p{idx}-{n}"
            body = {"session_id": sid, "client_msg_id": cmid, "prompt": f"prompt {n} " + "x" * rng.randint(0, 200)}
            if rng.random() < 0.2:
                body["metadata"] = {"n": n, "poster": idx}
            try:
                st, js = h.request("POST", "/prompt", body)
            except OSError as e:
                self.stats.violation(f"POST /prompt: transport error {e!r}")
                continue
            if self.record("POST /prompt", st, sid):
                if js.get("duplicate"):
                    self.stats.violation(f"POST /prompt: fresh id {cmid} answered duplicate")
                with self.lock:
                    self.acked_prompts[sid].add(cmid)
                self.stats.inc("prompts acked")
                # Sometimes resend: must be a duplicate, stored once.
                if rng.random() < 0.05:
                    st2, js2 = h.request("POST", "/prompt", body)
                    if self.record("POST /prompt", st2, sid) and not js2.get("duplicate"):
                        self.stats.violation(f"POST /prompt resend of {cmid}: no duplicate flag")
                    self.stats.inc("prompt resends")
            time.sleep(self.a.post_interval * rng.uniform(0.5, 1.5))
        h.close()

    def agent(self, idx, nagents):
        h = Http(self.host, self.port)
        rng = random.Random(1000 + idx)
        after = {}  # sid -> highest prompt seq handled
        n = 0
        while self.running() and n < self.a.max_ops:
            n += 1
            g = self.gen()
            # Serve the current and the previous generation (prompts posted
            # just before a generation change still get answers).
            mine = [s for gg in (g, g - 1) if gg >= 0 for s in self.sessions(gg)[idx::nagents]]
            for sid in mine:
                if not self.running():
                    break
                if sid in self.retired:
                    continue
                q = f"/prompts/{sid}?timeout={self.a.poll_timeout}"
                if sid in after:
                    q += f"&after={after[sid]}"
                try:
                    st, js = h.request("GET", q)
                except OSError as e:
                    self.stats.violation(f"GET /prompts: transport error {e!r}")
                    continue
                if st == 404 and sid not in self.retired:
                    # Not created yet (no prompt so far): create it, as an
                    # agent that starts first would.
                    self.stats.inc("agent 404 before session exists")
                    st, _ = h.request("PUT", f"/sessions/{sid}")
                    self.record("PUT /sessions", st, sid)
                    continue
                if not self.record("GET /prompts", st, sid):
                    continue
                self.stats.inc("polls")
                if not js:
                    self.stats.inc("polls empty")
                prev = -1
                for p in js:
                    if p["seq"] <= prev:
                        self.stats.violation(f"GET /prompts {sid}: seq not increasing")
                    prev = p["seq"]
                    after[sid] = max(after.get(sid, 0), p["seq"])
                    self.answer(h, rng, sid, p)
        h.close()

    def answer(self, h, rng, sid, p):
        parts = 2 if rng.random() < 0.1 else 1
        for part in range(parts):
            aid = f"a-{p['client_msg_id']}-{part}"
            body = {"session_id": sid, "client_msg_id": p["client_msg_id"], "assistant_msg_id": aid,
                    "text": f"answer to {p['client_msg_id']} part {part} " + "y" * rng.randint(0, 300)}
            st, js = h.request("POST", "/response", body)
            if self.record("POST /response", st, sid):
                if js.get("duplicate"):
                    self.stats.violation(f"POST /response: fresh id {aid} answered duplicate")
                with self.lock:
                    self.acked_responses[sid].add(aid)
                self.stats.inc("responses acked")
                if js.get("delivered"):
                    self.stats.inc("responses delivered to a subscriber")
                if rng.random() < 0.05:
                    st2, js2 = h.request("POST", "/response", body)
                    if self.record("POST /response", st2, sid) and not js2.get("duplicate"):
                        self.stats.violation(f"POST /response resend of {aid}: no duplicate flag")
                    self.stats.inc("response resends")

    def ws_url(self, sid, after):
        q = f"?after={after}" if after is not None else ""
        return f"ws://{self.host}:{self.port}/ws/{sid}{q}"

    def subscriber(self, idx):
        """Comes and goes: a few seconds on a random session, reading every
        frame; reconnects to the same session with `after` half the time."""
        rng = random.Random(2000 + idx)
        cursor = {}  # sid -> last seq seen
        n = 0
        sid = None
        while self.running() and n < self.a.max_ops:
            n += 1
            g = self.gen()
            if sid is None or rng.random() < 0.5 or self.gen_of(sid) < g:
                sid = rng.choice(self.sessions(g))
            after = cursor.get(sid, 0)
            try:
                ws = websocket.create_connection(self.ws_url(sid, after), timeout=5)
            except Exception as e:  # handshake failure is a server error here
                self.stats.violation(f"WS connect {sid}: {e!r}")
                time.sleep(1)
                continue
            self.stats.inc("ws connects")
            seen = []
            stay = time.monotonic() + rng.uniform(1.0, self.a.ws_stay)
            ws.settimeout(0.5)
            closed_code = None
            while time.monotonic() < min(stay, self.deadline):
                try:
                    op, data = ws.recv_data(control_frame=True)
                except websocket.WebSocketTimeoutException:
                    continue
                except websocket.WebSocketConnectionClosedException:
                    closed_code = "eof"
                    break
                if op == websocket.ABNF.OPCODE_CLOSE:
                    closed_code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
                    break
                if op != websocket.ABNF.OPCODE_TEXT:
                    continue
                f = json.loads(data)
                if f.get("type") == "message":
                    d = f["data"]
                    if d["session_id"] != sid:
                        self.stats.violation(f"WS {sid}: frame of session {d['session_id']}")
                    if seen and d["seq"] <= seen[-1]:
                        self.stats.violation(f"WS {sid}: seq {d['seq']} after {seen[-1]}")
                    if d["seq"] <= after:
                        self.stats.violation(f"WS {sid}: seq {d['seq']} not after cursor {after}")
                    seen.append(d["seq"])
                    self.stats.inc("ws messages")
                elif f.get("type") == "resync":
                    self.stats.violation(f"WS {sid}: unexpected resync {f}")
                elif f.get("type") == "error":
                    self.stats.violation(f"WS {sid}: error frame {f}")
            try:
                ws.close()
            except Exception:
                pass
            if closed_code is not None:
                if sid in self.retired and closed_code in (1000, "eof"):
                    self.stats.inc("ws closed by session delete")
                else:
                    self.stats.violation(f"WS {sid}: closed by server ({closed_code})")
            if seen:
                cursor[sid] = seen[-1]
            with self.lock:
                self.ws_segments.append((sid, after, seen))

    def gen_of(self, sid):
        return int(sid.split("-")[1][1:])

    def slow_reader(self, idx):
        """A subscriber that stops reading. Each cycle: subscribe (tiny
        receive buffer) to a fresh hot session, post big answers to it while
        it reads nothing, well past the kernel buffers and
        RELAY_SUBSCRIBER_BUFFER (every answer must still say `delivered`:
        nobody is closed for being slow), then read: every answer must
        arrive, in order, with no close. Verify the history, delete it."""
        h = Http(self.host, self.port)
        rng = random.Random(3000 + idx)
        n = 0
        while self.running() and n < self.a.max_ops:
            n += 1
            sid = f"soak-slow{idx}-{n}"
            try:
                ws = websocket.create_connection(
                    self.ws_url(sid, 0), timeout=5,
                    sockopt=((socket.SOL_SOCKET, socket.SO_RCVBUF, 4096),))
            except Exception as e:
                self.stats.violation(f"slow WS connect {sid}: {e!r}")
                time.sleep(1)
                continue
            self.stats.inc("slow connects")
            sent, k, acked = 0, 0, []
            t_end = time.monotonic() + 60
            while time.monotonic() < t_end and sent < self.a.slow_max_bytes and self.running():
                k += 1
                cmid, aid = f"s{k}", f"sa{k}"
                st, _ = h.request("POST", "/prompt", {"session_id": sid, "client_msg_id": cmid, "prompt": "hot"})
                if not self.record("POST /prompt", st, sid):
                    break
                with self.lock:
                    self.acked_prompts[sid].add(cmid)
                st, js = h.request("POST", "/response", {"session_id": sid, "client_msg_id": cmid,
                                                         "assistant_msg_id": aid, "text": "z" * self.a.hot_bytes})
                if not self.record("POST /response", st, sid):
                    break
                with self.lock:
                    self.acked_responses[sid].add(aid)
                acked.append(aid)
                self.stats.inc("hot responses acked")
                sent += self.a.hot_bytes
                if not js["delivered"]:
                    self.stats.violation(f"slow WS {sid}: delivered=false while it was connected")
                    break
                time.sleep(self.a.hot_bytes / self.a.slow_rate)
            with self.stats.lock:
                self.stats.c["slow reader KiB posted while not reading"] += sent // 1024
            # Now read: every acknowledged answer, in order, no close.
            got, prev, end = [], 0, None
            ws.settimeout(10)
            while len(got) < len(acked):
                try:
                    op, data = ws.recv_data(control_frame=True)
                except websocket.WebSocketTimeoutException:
                    end = "timeout"
                    break
                except Exception as e:
                    end = f"closed: {type(e).__name__}"
                    break
                if op == websocket.ABNF.OPCODE_CLOSE:
                    end = f"close {int.from_bytes(data[:2], 'big') if len(data) >= 2 else None}"
                    break
                if op == websocket.ABNF.OPCODE_TEXT:
                    f = json.loads(data)
                    if f.get("type") == "message":
                        s = f["data"]["seq"]
                        if s <= prev:
                            self.stats.violation(f"slow WS {sid}: seq {s} after {prev}")
                        prev = s
                        got.append(f["data"]["assistant_msg_id"])
            try:
                ws.close()
            except Exception:
                pass
            if end is not None or got != acked:
                self.stats.violation(f"slow WS {sid}: read {len(got)} of {len(acked)} answers ({end or 'out of order'})")
            else:
                self.stats.inc("slow reader catch-ups verified")
            self.verify_session(h, sid)
            self.retired.add(sid)
            st, _ = h.request("DELETE", f"/sessions/{sid}")
            self.record("DELETE /sessions", st)
            time.sleep(rng.uniform(0.5, 1.5))
        h.close()

    def bad_requests(self):
        """A few deliberate bad requests; each must get exactly its status."""
        h = Http(self.host, self.port)
        rng = random.Random(99)
        cases = [
            ("invalid json", "POST", "/prompt", b"{nope", {"Content-Type": "application/json"}, 400),
            ("wrong content-type", "POST", "/prompt", b'{"session_id":"x","prompt":"y"}', {"Content-Type": "text/plain"}, 415),
            ("missing field", "POST", "/prompt", {"session_id": "soak-bad"}, None, 400),
            ("bad session_id", "GET", "/messages/bad%20id", None, None, 400),
            ("unknown session", "GET", "/prompts/soak-never-created?wait=false", None, None, 404),
            ("unknown path", "GET", "/nope", None, None, 404),
            ("wrong method", "DELETE", "/prompt", None, None, 405),
            ("bad timeout", "GET", "/prompts/soak-bad?timeout=-1", None, None, 400),
            ("oversized prompt", "POST", "/prompt", {"session_id": "soak-bad", "prompt": "x" * 131073}, None, 400),
        ]
        n = 0
        while self.running() and n < self.a.max_ops:
            n += 1
            name, method, path, body, hdrs, want = rng.choice(cases)
            try:
                st, _ = h.request(method, path, body, hdrs)
            except OSError as e:
                self.stats.violation(f"bad request {name}: transport error {e!r}")
                continue
            with self.stats.lock:
                self.stats.provoked[(name, st)] += 1
            if st != want:
                self.stats.violation(f"bad request {name}: got {st}, want {want}")
            # A response to an unknown prompt, and a conflicting resend.
            if rng.random() < 0.3:
                sid = rng.choice(self.sessions(self.gen()))
                st, _ = h.request("PUT", f"/sessions/{sid}")
                self.record("PUT /sessions", st, sid)
                st, _ = h.request("POST", "/response", {"session_id": sid, "client_msg_id": "no-such-prompt", "text": "t"})
                with self.stats.lock:
                    self.stats.provoked[("unknown prompt", st)] += 1
                if st != 404 and sid not in self.retired:
                    self.stats.violation(f"response to unknown prompt: got {st}, want 404")
            time.sleep(self.a.bad_interval)
        h.close()

    def conflict_probe(self):
        """Once per generation: a 409 from reusing an assistant_msg_id."""
        h = Http(self.host, self.port)
        done = set()
        while self.running():
            g = self.gen()
            if g not in done:
                done.add(g)
                sid = f"soak-g{g}-conflict"
                st, _ = h.request("POST", "/prompt", {"session_id": sid, "client_msg_id": "c1", "prompt": "p"})
                if self.record("POST /prompt", st, sid):
                    with self.lock:
                        self.acked_prompts[sid].add("c1")
                st, _ = h.request("POST", "/response", {"session_id": sid, "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "one"})
                if self.record("POST /response", st, sid):
                    with self.lock:
                        self.acked_responses[sid].add("a1")
                st, _ = h.request("POST", "/response", {"session_id": sid, "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "two"})
                with self.stats.lock:
                    self.stats.provoked[("assistant_msg_id conflict", st)] += 1
                if st != 409:
                    self.stats.violation(f"conflict: got {st}, want 409")
            time.sleep(0.5)
        h.close()

    def rss_sampler(self):
        while not self.stop.is_set():
            try:
                with open(f"/proc/{self.a.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.rss.append((time.monotonic() - self.t0, int(line.split()[1])))
            except OSError:
                self.stats.violation("server process gone")
                return
            self.stop.wait(self.a.rss_interval)

    # -- verification ------------------------------------------------------
    def fetch_history(self, h, sid):
        msgs, offset = [], 0
        for _ in range(10000):
            st, js = h.request("GET", f"/messages/{sid}?limit=1000&offset={offset}")
            if st == 404:
                return None
            if st != 200:
                self.stats.violation(f"GET /messages/{sid}: HTTP {st}")
                return None
            msgs.extend(js["messages"])
            offset += len(js["messages"])
            if not js["messages"] or offset >= js["total"]:
                break
        return msgs

    def verify_session(self, h, sid):
        with self.lock:
            prompts = set(self.acked_prompts.get(sid, ()))
            responses = set(self.acked_responses.get(sid, ()))
        if not prompts and not responses:
            return None
        msgs = self.fetch_history(h, sid)
        if msgs is None:
            self.stats.violation(f"{sid}: acknowledged writes but no history")
            return None
        seqs = [m["data"]["seq"] for m in msgs]
        if len(set(seqs)) != len(seqs):
            self.stats.violation(f"{sid}: duplicate seq in history")
        if any(b <= a for a, b in zip(seqs, seqs[1:])):
            self.stats.violation(f"{sid}: seq not strictly increasing")
        got_p = Counter(m["data"]["client_msg_id"] for m in msgs if m["type"] == "prompt")
        got_a = Counter(m["data"]["assistant_msg_id"] for m in msgs if m["type"] == "assistant")
        missing_p = prompts - set(got_p)
        missing_a = responses - set(got_a)
        if missing_p:
            self.stats.violation(f"{sid}: {len(missing_p)} acknowledged prompts missing, e.g. {sorted(missing_p)[:3]}")
        if missing_a:
            self.stats.violation(f"{sid}: {len(missing_a)} acknowledged responses missing, e.g. {sorted(missing_a)[:3]}")
        dup = [k for k, v in list(got_p.items()) + list(got_a.items()) if v > 1]
        if dup:
            self.stats.violation(f"{sid}: ids stored twice: {dup[:3]}")
        self.verified_msgs += len(msgs)
        self.stats.inc("prompts verified", len(prompts))
        self.stats.inc("responses verified", len(responses))
        return {m["data"]["seq"] for m in msgs if m["type"] == "assistant"}

    def verify_ws_segments(self, sid, assistant_seqs):
        with self.lock:
            segs = [s for s in self.ws_segments if s[0] == sid]
        for _, after, seen in segs:
            if not seen:
                continue
            want = sorted(s for s in assistant_seqs if after < s <= seen[-1])
            if seen != want:
                lost = sorted(set(want) - set(seen))
                self.stats.violation(f"WS {sid} after={after}: lost {len(lost)} answers, e.g. {lost[:3]}")
            self.stats.inc("ws segments verified")

    def retire_generation(self, h, g):
        names = self.sessions(g) + [f"soak-g{g}-conflict"]
        for sid in names:
            a_seqs = self.verify_session(h, sid)
            if a_seqs is not None:
                self.verify_ws_segments(sid, a_seqs)
            self.retired.add(sid)
            st, _ = h.request("DELETE", f"/sessions/{sid}")
            if st not in (200, 404):
                self.stats.violation(f"DELETE /sessions/{sid}: HTTP {st}")
            self.stats.inc("sessions deleted" if st == 200 else "sessions never created")
        self.verified_gens += 1

    def retirer(self):
        """Two generations after a generation ended, verify and delete it."""
        h = Http(self.host, self.port)
        nxt = 0
        while self.running():
            if self.gen() >= nxt + 2 and time.monotonic() - self.t0 >= (nxt + 2) * self.a.gen_seconds + 1.0:
                self.retire_generation(h, nxt)
                nxt += 1
            time.sleep(0.2)
        self.next_unretired = nxt
        h.close()

    # -- run ---------------------------------------------------------------
    def run(self):
        threads = []

        def spawn(fn, *args):
            t = threading.Thread(target=self.guard, args=(fn,) + args, daemon=True)
            t.start()
            threads.append(t)

        sampler = threading.Thread(target=self.rss_sampler, daemon=True)
        sampler.start()
        for i in range(self.a.posters):
            spawn(self.poster, i)
        for i in range(self.a.agents):
            spawn(self.agent, i, self.a.agents)
        for i in range(self.a.subscribers):
            spawn(self.subscriber, i)
        for i in range(self.a.slow_readers):
            spawn(self.slow_reader, i)
        spawn(self.bad_requests)
        spawn(self.conflict_probe)
        self.next_unretired = 0
        spawn(self.retirer)
        while time.monotonic() < self.deadline:
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=30)
            if t.is_alive():
                self.stats.violation(f"worker {t.name} did not stop")
        # Final verification of the generations still alive (not deleted).
        h = Http(self.host, self.port)
        for g in range(self.next_unretired, self.gen() + 1):
            names = self.sessions(g) + [f"soak-g{g}-conflict"]
            for sid in names:
                a_seqs = self.verify_session(h, sid)
                if a_seqs is not None:
                    self.verify_ws_segments(sid, a_seqs)
        st, health = h.request("GET", "/healthz")
        h.close()
        self.stop.set()
        sampler.join(timeout=5)
        return self.report(health)

    def guard(self, fn, *args):
        try:
            fn(*args)
        except Exception as e:
            self.stats.violation(f"{fn.__name__}{args}: crashed: {e!r}")

    def report(self, health):
        s = self.stats
        ok = True
        out = []
        out.append(f"soak: {self.a.seconds:.0f} s against {self.a.addr} (pid {self.a.pid})")
        out.append("counters:")
        for k in sorted(s.c):
            if k != "violations":
                out.append(f"  {k}: {s.c[k]}")
        out.append(f"  generations verified and deleted: {self.verified_gens}")
        out.append(f"  history messages checked: {self.verified_msgs}")
        out.append("unprovoked HTTP statuses:")
        for (ep, st), n in sorted(s.status.items()):
            out.append(f"  {ep} -> {st}: {n}")
        out.append("provoked (deliberate bad requests):")
        for (name, st), n in sorted(s.provoked.items()):
            out.append(f"  {name} -> {st}: {n}")
        out.append(f"final /healthz: {json.dumps(health)}")

        # RSS: flat after warm-up.
        warm = max(self.a.warmup, 0.25 * self.a.seconds)
        after = [(t, k) for t, k in self.rss if t >= warm]
        out.append(f"RSS samples (s: KiB), warm-up {warm:.0f} s:")
        out.append("  " + " ".join(f"{t:.0f}:{k}" for t, k in self.rss))
        if len(after) >= 3:
            third = len(after) // 3
            first = max(k for _, k in after[:third])
            last = max(k for _, k in after[-third:])
            limit = first * 1.2 + 2 * 1024
            verdict = "ok" if last <= limit else "GROWING"
            out.append(f"RSS first third max {first} KiB, last third max {last} KiB, limit {limit:.0f} KiB: {verdict}")
            if last > limit:
                s.violation(f"RSS grew: last-third max {last} KiB > {limit:.0f} KiB")
        else:
            s.violation("too few RSS samples after warm-up")

        if s.c["prompts acked"] == 0 or s.c["responses acked"] == 0:
            s.violation("no load was acknowledged")
        if self.a.slow_readers and s.c["slow reader catch-ups verified"] == 0:
            s.violation("no slow reader caught up")

        out.append(f"violations: {s.c['violations']}")
        for v in s.violations:
            out.append(f"  VIOLATION: {v}")
        ok = s.c["violations"] == 0
        out.append("soak: PASS" if ok else "soak: FAIL")
        print("\n".join(out), flush=True)
        return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", required=True, help="host:port of the server")
    p.add_argument("--pid", required=True, type=int, help="server pid, for VmRSS")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--sessions", type=int, default=24, help="sessions per generation")
    p.add_argument("--gen-seconds", type=float, default=10)
    p.add_argument("--posters", type=int, default=3)
    p.add_argument("--post-interval", type=float, default=0.05)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--poll-timeout", type=float, default=0.3)
    p.add_argument("--subscribers", type=int, default=4)
    p.add_argument("--ws-stay", type=float, default=6.0)
    p.add_argument("--slow-readers", type=int, default=2)
    p.add_argument("--hot-bytes", type=int, default=32768, help="answer size on slow readers' sessions")
    p.add_argument("--slow-rate", type=float, default=1.0e6, help="bytes/s posted to a slow reader's session")
    p.add_argument("--slow-max-bytes", type=int, default=12 * MiB, help="bytes posted to a slow reader while it does not read")
    p.add_argument("--bad-interval", type=float, default=1.0)
    p.add_argument("--rss-interval", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--max-ops", type=int, default=1_000_000, help="per-worker loop bound")
    args = p.parse_args()
    sys.exit(Soak(args).run())


if __name__ == "__main__":
    main()
