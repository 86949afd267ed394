#!/usr/bin/env python3
"""An agent for relay in Python, standard library only: long-polls a session
for prompts and answers each one. Replace `answer` with a call to your model.

    python3 examples/agent.py --url http://127.0.0.1:8000 --session demo

A token (RELAY_AGENT_TOKEN) is sent as a bearer token; for https:// with a
private CA, point RELAY_CA at its PEM file. Answer ids are derived from the
prompt's id, so an answer resent after a lost connection is a duplicate, never
a second answer.
"""
import argparse, json, os, ssl, urllib.error, urllib.request, uuid


def answer(prompt: str) -> str:
    return prompt.upper()


def call(url, method="GET", body=None, timeout=40):
    headers = {"Content-Type": "application/json"}
    if os.environ.get("RELAY_AGENT_TOKEN"):
        headers["Authorization"] = "Bearer " + os.environ["RELAY_AGENT_TOKEN"]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    ctx = ssl.create_default_context(cafile=os.environ.get("RELAY_CA") or None)
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        return json.load(resp)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default=os.environ.get("RELAY_URL", "http://127.0.0.1:8000"))
    p.add_argument("--session", required=True)
    p.add_argument("--max", type=int, default=0, help="exit after this many answers")
    a = p.parse_args()
    base = a.url.rstrip("/")
    call(f"{base}/sessions/{a.session}", "PUT")  # so the first poll finds it
    after, answered = 0, 0
    while not a.max or answered < a.max:
        try:
            prompts = call(f"{base}/prompts/{a.session}?after={after}&timeout=30")
        except (urllib.error.URLError, TimeoutError) as e:
            print(f"poll failed: {e}; polling again", flush=True)
            continue
        for m in prompts:
            aid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{a.session}/{m['client_msg_id']}"))
            call(f"{base}/response", "POST", {
                "session_id": a.session, "client_msg_id": m["client_msg_id"],
                "assistant_msg_id": aid, "text": answer(m["prompt"]),
            })
            after, answered = max(after, m["seq"]), answered + 1


if __name__ == "__main__":
    main()
