"""The static binary's start-up path, traced under qemu-user (scripts/symbol-order.sh).

  symbol-order.py write TARGET BINARY OUT   BINARY must keep its symbol table
  symbol-order.py check TARGET BINARY [MAX] BINARY may be stripped

Both run BINARY under `qemu-<arch> -d exec,nochain`, which logs the address
of every block of code it runs, through the start and the first requests:
`GET /healthz` until it answers 200, `GET /healthz` again in two parts and
`GET /readyz` after it on the same connection, a WebSocket subscribe, a
prompt, the long-poll that gets it, the response and its WebSocket frame.

`write` maps those addresses to the functions that hold them and writes them,
in the order they first ran, as a symbol ordering file for lld
(`--symbol-ordering-file`): lld places those functions first in `.text`, in
that order, so the start runs through a few adjacent pages instead of pages
spread over the whole binary. A name defined more than once (musl's local
`dummy`) orders every function of that name.

`check` counts the 64 KiB windows of code that path touches (the kernel
maps 64 KiB around each page a fault touches, so these windows are what
the code costs in RSS) and fails if there are more than MAX: the ordering
has gone stale (Rust's symbol names carry a hash of the crate's version,
its dependencies and the compiler) and wants `scripts/symbol-order.sh`.
"""

import base64
import bisect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

WINDOW = 64 * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(port, method, path, body=b""):
    c = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: r\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    c.sendall(head.encode() + body)
    out = b""
    while chunk := c.recv(65536):
        out += chunk
    c.close()
    return out


def expect(what, answer, needle):
    if needle not in answer:
        sys.exit(f"symbol-order: {what}: unexpected answer {answer[:200]!r}")


def run_traced(target, binary, log):
    """Runs BINARY under qemu-user through the start, the first requests of
    each kind and a SIGTERM; qemu logs every block it runs to `log`."""
    arch = target.split("-")[0]
    # The emulated x86_64 CPU offers what today's servers have, so the
    # start takes the same CPU-feature branches as it does natively.
    cpu = ["-cpu", "max"] if arch == "x86_64" else []
    port = free_port()
    env = dict(os.environ, RELAY_HOST="127.0.0.1", RELAY_PORT=str(port), RELAY_LOG="warn")
    cmd = [f"qemu-{arch}", *cpu, "-d", "exec,nochain", "-D", log, binary]
    p = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 120
    while True:
        if p.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"symbol-order: {binary} did not answer /healthz")
        c = socket.socket()
        try:
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
            if c.recv(64).startswith(b"HTTP/1.1 200"):
                break
        except OSError:
            time.sleep(0.01)
        finally:
            c.close()
    # A request whose head arrives in two reads, on a connection kept open
    # for a second one: natively the server often reads a connection
    # before its bytes are there, which the slower emulated server never
    # does.
    c = socket.create_connection(("127.0.0.1", port), timeout=60)
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: r\r\n")
    time.sleep(0.2)
    c.sendall(b"\r\n")
    seen = b""
    while b"\r\n\r\n" not in seen:
        seen += c.recv(4096)
    expect("GET /healthz in two parts", seen, b"HTTP/1.1 200")
    c.sendall(b"GET /readyz HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    while chunk := c.recv(65536):
        seen += chunk
    c.close()
    expect("GET /readyz", seen, b'"ready":true')
    ws = socket.create_connection(("127.0.0.1", port), timeout=60)
    key = base64.b64encode(os.urandom(16)).decode()
    ws.sendall(
        (
            "GET /ws/order HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    seen = b""
    while b"\r\n\r\n" not in seen:
        seen += ws.recv(4096)
    expect("WebSocket upgrade", seen, b"HTTP/1.1 101")
    prompt = b'{"session_id":"order","client_msg_id":"p1","prompt":"ping"}'
    expect("POST /prompt", http(port, "POST", "/prompt", prompt), b'"stored":true')
    expect("long-poll", http(port, "GET", "/prompts/order?timeout=10"), b'"prompt":"ping"')
    answer = b'{"session_id":"order","client_msg_id":"p1","text":"pong"}'
    expect("POST /response", http(port, "POST", "/response", answer), b'"delivered":true')
    while b'"type":"message"' not in seen:
        chunk = ws.recv(4096)
        if not chunk:
            sys.exit("symbol-order: the WebSocket closed before the response's frame")
        seen += chunk
    ws.close()
    p.send_signal(signal.SIGTERM)
    p.wait()


def block_addresses(log):
    """The guest address of every block qemu ran, in order
    (`Trace 0: 0xHOST [CS/PC/FLAGS/...]`)."""
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("Trace "):
                fields = line.split("[", 1)[1].split("/")
                yield int(fields[1], 16)


def text_segment(binary):
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            start = int(f[2], 16)
            return start, start + int(f[5], 16)
    sys.exit(f"symbol-order: no executable segment in {binary}")


def functions(binary):
    """(start, end, name) of every function in BINARY's symbol table, by
    address. A symbol without a size (musl's memcpy, written in assembly)
    ends where the next one starts."""
    out = subprocess.run(
        ["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True
    )
    syms = []
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwW":
            syms.append((int(f[0], 16), int(f[1], 16), f[3]))
        elif len(f) == 3 and f[1] in "tTwW":
            syms.append((int(f[0], 16), None, f[2]))
    if not syms:
        sys.exit(f"symbol-order: {binary} has no symbol table (build it unstripped)")
    syms.sort(key=lambda s: s[0])
    starts = sorted({s[0] for s in syms})
    funcs = []
    for start, size, name in syms:
        if size is None:
            later = bisect.bisect_right(starts, start)
            size = starts[later] - start if later < len(starts) else 0
        funcs.append((start, start + size, name))
    return funcs


def companions(name, funcs):
    """Functions placed with `name` though the emulated run may not reach
    them: which of the allocator's paths run depends on where the kernel
    puts its memory (natively its segments are adjacent and merge), so the
    whole allocator goes where it first runs; musl compares names with
    strcmp when it finds clock_gettime in the vDSO, which qemu-user does
    not map."""
    if "dlmalloc" in name:
        return [f[2] for f in funcs if "dlmalloc" in f[2]]
    if name == "__vdsosym":
        return ["strcmp"]
    return []


def write(target, binary, out):
    funcs = functions(binary)
    starts = [f[0] for f in funcs]
    order, seen = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        run_traced(target, binary, log)
        for pc in block_addresses(log):
            i = bisect.bisect_right(starts, pc) - 1
            if i < 0 or pc >= funcs[i][1] or funcs[i][2] in seen:
                continue
            for name in [funcs[i][2], *companions(funcs[i][2], funcs)]:
                if name not in seen:
                    seen.add(name)
                    order.append(name)
    with open(out, "w") as f:
        f.write(
            f"# The functions relay's {target} static binary runs from exec\n"
            "# through its first requests, in the order they first run: lld\n"
            "# places them first in .text (.cargo/config.toml). Written by\n"
            "# scripts/symbol-order.sh; names no longer defined are skipped.\n"
        )
        f.writelines(name + "\n" for name in order)
    print(f"symbol-order: {out}: {len(order)} functions")


def check(target, binary, most):
    lo, hi = text_segment(binary)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        run_traced(target, binary, log)
        windows = {pc // WINDOW for pc in block_addresses(log) if lo <= pc < hi}
    spread = most is not None and len(windows) > most
    print(
        f"{'FAIL' if spread else 'ok  '} {os.path.basename(binary)}: the start and the "
        f"first requests run code in {len(windows)} 64 KiB windows"
        + ("" if most is None else f" (at most {most})")
    )
    if spread:
        sys.exit("symbol-order: the start's functions are spread: run scripts/symbol-order.sh")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else None)
    else:
        sys.exit(__doc__)
