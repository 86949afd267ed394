#!/usr/bin/env python3
"""A round trip through a TLS reverse proxy in front of relay (standard
library only): a WebSocket subscriber, a long-poll parked before the prompt
is posted, the prompt waking it, the response, and the WebSocket message.
Also checks that the proxy's plain HTTP port redirects to https.

    proxy_roundtrip.py HTTPS_PORT HTTP_PORT CA_FILE

Used by scripts/check-deploy.sh against deploy/nginx.conf and
deploy/Caddyfile, several times against one relay: each run has a session
of its own. Every socket has a timeout; exits 1 with the failing step on
stderr.
"""

import base64
import hashlib
import http.client
import json
import os
import socket
import ssl
import sys
import threading
import time

HOST = "127.0.0.1"
SESSION = "deploy-check-" + os.urandom(4).hex()
TIMEOUT = 20


def fail(what):
    print(f"FAIL {what}", file=sys.stderr)
    sys.exit(1)


def ok(what):
    print(f"ok   {what}")


def request(ctx, port, method, path, body=None):
    conn = http.client.HTTPSConnection(HOST, port, context=ctx, timeout=TIMEOUT)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    data = resp.read().decode()
    conn.close()
    return resp.status, data


def ws_open(ctx, port):
    raw = socket.create_connection((HOST, port), timeout=TIMEOUT)
    sock = ctx.wrap_socket(raw, server_hostname=HOST)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/{SESSION} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            fail(f"WebSocket upgrade: connection closed after {head!r}")
        head += chunk
    head, rest = head.split(b"\r\n\r\n", 1)
    accept = base64.b64encode(
        hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    ).decode()
    if not head.startswith(b"HTTP/1.1 101") or accept.encode() not in head:
        fail(f"WebSocket upgrade answered {head!r}")
    return sock, rest


def ws_text(sock, buf):
    """The next text frame's payload (server frames are unmasked)."""
    while True:
        while len(buf) < 2 or len(buf) < frame_len(buf):
            chunk = sock.recv(65536)
            if not chunk:
                fail("WebSocket closed before the message")
            buf += chunk
        n = frame_len(buf)
        frame, buf = buf[:n], buf[n:]
        opcode, payload = frame[0] & 0x0F, frame[n - payload_len(frame) :]
        if opcode == 1:
            return payload.decode(), buf


def payload_len(b):
    n = b[1] & 0x7F
    if n == 126:
        return int.from_bytes(b[2:4], "big")
    if n == 127:
        return int.from_bytes(b[2:10], "big")
    return n


def frame_len(b):
    n = b[1] & 0x7F
    extra = 2 if n == 126 else 8 if n == 127 else 0
    if len(b) < 2 + extra:
        return 2 + extra + 1
    return 2 + extra + payload_len(b)


def wait_parked(ctx, port):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        _, body = request(ctx, port, "GET", "/healthz")
        if json.loads(body).get("parked_polls", 0) >= 1:
            return
        time.sleep(0.05)
    fail("the long-poll never parked")


def main():
    https_port, http_port, ca_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    ctx = ssl.create_default_context(cafile=ca_file)

    plain = http.client.HTTPConnection(HOST, http_port, timeout=TIMEOUT)
    plain.request("GET", "/healthz")
    resp = plain.getresponse()
    # nginx answers 301, Caddy 308 (which keeps the method).
    if resp.status not in (301, 308) or not resp.getheader("Location", "").startswith("https://"):
        fail(f"plain HTTP answered {resp.status} {resp.getheader('Location')}")
    ok("plain HTTP redirects to https")

    status, body = request(ctx, https_port, "GET", "/healthz")
    if status != 200:
        fail(f"GET /healthz over TLS answered {status} {body}")
    ok("GET /healthz over TLS (certificate verified)")

    ws, buf = ws_open(ctx, https_port)
    ok("WebSocket upgrade through the proxy")
    request(ctx, https_port, "PUT", f"/sessions/{SESSION}")
    polled = {}

    def poll():
        polled["answer"] = request(ctx, https_port, "GET", f"/prompts/{SESSION}?timeout=15")

    poller = threading.Thread(target=poll)
    poller.start()
    wait_parked(ctx, https_port)
    status, body = request(
        ctx, https_port, "POST", "/prompt",
        {"session_id": SESSION, "client_msg_id": "c1", "prompt": "ping"},
    )
    if status != 200 or '"stored":true' not in body:
        fail(f"POST /prompt answered {status} {body}")
    poller.join(TIMEOUT)
    status, body = polled.get("answer", (0, "no answer"))
    if status != 200 or '"prompt":"ping"' not in body:
        fail(f"the parked long-poll answered {status} {body}")
    ok("a parked long-poll is woken by the prompt")

    status, body = request(
        ctx, https_port, "POST", "/response",
        {"session_id": SESSION, "client_msg_id": "c1", "text": "pong"},
    )
    if status != 200 or '"delivered":true' not in body:
        fail(f"POST /response answered {status} {body}")
    text, buf = ws_text(ws, buf)
    while '"type":"message"' not in text:  # a ping frame may come first
        text, buf = ws_text(ws, buf)
    if '"text":"pong"' not in text:
        fail(f"WebSocket frame {text}")
    ok("the answer arrives on the WebSocket")
    ws.close()


if __name__ == "__main__":
    main()
