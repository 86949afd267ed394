"""Long-poll rounds against a relay on 127.0.0.1:PORT, for
benches/loop-callgrind.sh: per round an agent's GET /prompts parks (seen
on /healthz), a client's POST /prompt wakes it, the agent reads the
answer. Usage: loop-rounds.py PORT ROUNDS"""
import json
import re
import socket
import sys


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return [s, b""]


def response(c):
    while True:
        end = c[1].find(b"\r\n\r\n")
        if end >= 0:
            m = re.search(rb"content-length: *(\d+)", c[1][:end], re.I)
            size = int(m.group(1)) if m else 0
            if len(c[1]) >= end + 4 + size:
                body = c[1][end + 4:end + 4 + size]
                c[1] = c[1][end + 4 + size:]
                return body
        data = c[0].recv(65536)
        if not data:
            raise SystemExit("connection closed")
        c[1] += data


def main():
    port, rounds = int(sys.argv[1]), int(sys.argv[2])
    agent, client, probe = connect(port), connect(port), connect(port)
    client[0].sendall(b"PUT /sessions/cg HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    response(client)
    after = 0
    for i in range(rounds):
        agent[0].sendall(f"GET /prompts/cg?timeout=60&after={after} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        while True:
            probe[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            if b'"parked_polls":1' in response(probe):
                break
        body = json.dumps({"session_id": "cg", "prompt": "p" * 64, "client_msg_id": f"m{i}"}).encode()
        client[0].sendall(b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
        response(client)
        after = max(m["seq"] for m in json.loads(response(agent)))


main()
