"""Start the relay on a free loopback port and time it from exec until it
answers `GET /healthz` with 200. Shared by benches/footprint.sh (a
sub-millisecond start, probed without pause) and benches/restart.sh (a
restore of seconds, probed every few milliseconds)."""
import os
import socket
import subprocess
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_until_ready(cmd, env, pause=0.0):
    """Runs `cmd` with `env` added, on a free port; returns the process, the
    port and the seconds from exec until the first 200. `pause` is the wait
    after a refused connection."""
    port = free_port()
    env = dict(os.environ, RELAY_HOST="127.0.0.1", RELAY_PORT=str(port), **env)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env)
    while True:
        c = socket.socket()
        try:
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
            if c.recv(64).startswith(b"HTTP/1.1 200"):
                break
        except OSError:
            if pause:
                time.sleep(pause)
        finally:
            c.close()
    return p, port, time.perf_counter() - t0


def rss_kib(pid):
    """The process's resident set, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
