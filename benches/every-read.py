"""What the read of an all-sessions poll costs Redis with few and with many
sessions pending: a relay on a Redis of its own, one pending prompt in
each of N sessions, then 2,000 reads after the newest cursor (the read a
parked `GET /prompts` with no session makes when a prompt arrives), and
Redis's own time per `FCALL` (`INFO commandstats`; the one-a-second probe
is among them). Runs N = 10 and 10,000 twice, alternating, or the Ns
SESSIONS lists.

    python3 benches/every-read.py [path/to/relay]
    SESSIONS="100000 1000" python3 benches/every-read.py target/debug/relay

Needs redis-server and redis-cli (Redis 7, for FCALL)."""
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from ready import free_port  # noqa: E402

RELAY = sys.argv[1] if len(sys.argv) > 1 else "target/release/relay"
READS = 2000


def cli(port, *args):
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True
    ).stdout


def run(sessions):
    rport, hport = free_port(), free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    while "PONG" not in cli(rport, "ping"):
        time.sleep(0.05)
    env = dict(
        os.environ,
        RELAY_PORT=str(hport),
        RELAY_HOST="127.0.0.1",
        RELAY_REDIS_URL=f"redis://127.0.0.1:{rport}",
        RELAY_LOG="warn",
    )
    relay = subprocess.Popen([RELAY], env=env, stderr=subprocess.DEVNULL)
    try:
        c = None
        while c is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", hport)
                c.request("GET", "/readyz")
                resp = c.getresponse()
                resp.read()
                if resp.status != 200:
                    c = None
                    time.sleep(0.05)
            except OSError:
                c = None
                time.sleep(0.05)
        for i in range(sessions):
            body = json.dumps({"session_id": f"s{i}", "client_msg_id": "c", "prompt": "x" * 64})
            c.request("POST", "/prompt", body, {"Content-Type": "application/json"})
            c.getresponse().read()
        newest = cli(rport, "zrange", "relay:pending", "-1", "-1", "withscores").split()[-1]
        cli(rport, "config", "resetstat")
        for _ in range(READS):
            c.request("GET", f"/prompts?wait=false&after={newest}")
            c.getresponse().read()
        stats = cli(rport, "info", "commandstats")
        per_call = next(
            line.split("usec_per_call=")[1].split(",")[0]
            for line in stats.splitlines()
            if line.startswith("cmdstat_fcall")
        )
        print(f"{sessions:>6} sessions pending: {per_call} us of Redis per read")
    finally:
        relay.terminate()
        redis.terminate()
        relay.wait()
        redis.wait()


for n in [int(a) for a in os.environ.get("SESSIONS", "10 10000 10 10000").split()]:
    run(n)
