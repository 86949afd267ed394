"""Drives the chat page in headless Chromium; run by tests/web_page.rs.

The Rust test owns the relay processes and plays the agent; this script owns
the browser. They talk in lines: this script prints `PROMPTED <client_msg_id>`
when a prompt it sent shows as pending, `RESTART` when the relay may be
restarted (it then waits for a line on stdin), `SCREENSHOT <path>` for each
picture and `DONE` at the end. Any failed check raises, prints a traceback on
stderr and exits non-zero.

Scenarios:
  restart  send a prompt, see its answer; the relay restarts (new epoch); the
           page reconnects by itself and shows the resync notice; a second
           prompt and answer go through; every answer is shown exactly once.
  token    the relay has a client token: the page asks for it, then works.
  fragment the page is opened with `#SESSION&token=TOKEN` (a token for one
           session): it keeps the token, drops it from the address, sends
           it as the WebSocket subprotocol (never in a URL), and works.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time

from playwright.sync_api import expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 20_000
PHONE = {"width": 390, "height": 760}
PENDING = re.compile(r"\bpending\b")
LABELS = {"pending": "Waiting for an answer", "unsent": "Not sent yet"}


def say(line):
    print(line, flush=True)


class Watch:
    """What the page did that the DOM does not show: frames, errors."""

    def __init__(self, page):
        self.sent, self.received, self.urls = [], [], []
        self.errors, self.csp = [], []
        self.history_loads = 0
        page.on("requestfinished", self.on_request)
        page.on("websocket", self.on_socket)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", self.on_console)

    def on_socket(self, ws):
        self.urls.append(ws.url)
        ws.on("framesent", lambda p: self.sent.append(p))
        ws.on("framereceived", lambda p: self.received.append(p))

    def on_request(self, req):
        if "/messages/" in req.url:
            self.history_loads += 1

    def on_console(self, msg):
        if "Content Security Policy" in msg.text or "Content-Security-Policy" in msg.text:
            self.csp.append(msg.text)

    def frames(self, frames, kind):
        out = []
        for f in frames:
            try:
                v = json.loads(f)
            except (TypeError, ValueError):
                continue
            if isinstance(v, dict) and v.get("type") == kind:
                out.append(v)
        return out

    def check_clean(self):
        assert not self.errors, f"uncaught errors in the page: {self.errors}"
        assert not self.csp, f"Content-Security-Policy violations: {self.csp}"


def send_prompt(page, text, state="pending"):
    """Types a prompt, sends it, waits until it shows in `state`; returns
    its node and id."""
    before = page.locator("article.prompt").count()
    page.get_by_label("Prompt").fill(text)
    page.get_by_role("button", name="Send").click()
    prompt = page.locator("article.prompt").nth(before)
    expect(prompt.locator(".text")).to_have_text(text, timeout=WAIT_MS)
    expect(prompt).to_have_class(re.compile(rf"\b{state}\b"), timeout=WAIT_MS)
    expect(prompt.locator(".state")).to_contain_text(LABELS[state])
    cmid = prompt.get_attribute("data-cmid")
    assert cmid and len(cmid) == 36, f"client_msg_id is not a UUID: {cmid!r}"
    return prompt, cmid


def wait_answer(page, prompt, amid, text):
    answer = page.locator(f'article.answer[data-amid="{amid}"]')
    expect(answer.locator(".text")).to_have_text(text, timeout=WAIT_MS)
    expect(prompt).not_to_have_class(PENDING, timeout=WAIT_MS)
    expect(prompt.locator(".state")).to_have_text("")
    expect(page.locator("#pending")).to_have_text("")


def expect_stdin(word):
    line = sys.stdin.readline().strip()
    assert line == word, f"expected {word} on stdin, got {line!r}"


def wait_until(page, cond, what):
    """Lets the page run until cond() holds (Playwright delivers events only
    while it waits), at most WAIT_MS."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.wait_for_timeout(50)


def connected(page):
    expect(page.locator("#status")).to_have_attribute("data-state", "ok", timeout=WAIT_MS)
    expect(page.locator("#status")).to_have_text("Connected")


def screenshots(page, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    phone = os.path.join(out_dir, "page-phone.png")
    page.screenshot(path=phone)
    say(f"SCREENSHOT {phone}")
    page.set_viewport_size({"width": 1100, "height": 700})
    desktop = os.path.join(out_dir, "page-desktop.png")
    page.screenshot(path=desktop)
    say(f"SCREENSHOT {desktop}")
    page.set_viewport_size(PHONE)


def restart(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    expect(page.get_by_label("Session")).to_have_value(args.session)
    connected(page)
    expect(page.locator("#empty")).to_be_visible()

    first, cmid = send_prompt(page, "What is 6 times 7?")
    expect(page.locator("#pending")).to_have_text("1 waiting for an answer")
    say(f"PROMPTED {cmid}")
    wait_answer(page, first, "a-1", "42, as always.")

    say("RESTART")
    expect_stdin("STOPPED")
    # Sent while the relay is down: kept, and sent once it is back.
    queued, qid = send_prompt(page, "Sent while the relay was down", "unsent")
    say(f"QUEUED {qid}")
    expect_stdin("RESTARTED")

    if args.persistent:
        # A relay with a data directory keeps the session's epoch: the page
        # resumes where it was, with no resync and no notice.
        connected(page)
        resyncs = watch.frames(watch.received, "resync")
        assert not resyncs, f"a persistent relay sent a resync: {resyncs}"
        expect(page.locator("#notice")).to_be_hidden()
    else:
        # The page finds the new relay by itself and is told the history was reset.
        expect(page.locator("#notice")).to_be_visible(timeout=WAIT_MS)
        expect(page.locator("#notice-text")).to_contain_text("history was reset")
        connected(page)
        resyncs = watch.frames(watch.received, "resync")
        assert len(resyncs) == 1, f"expected one resync frame, got {resyncs}"
    # It resumed where it was: `after` and `epoch` on the reconnect.
    last = watch.urls[-1]
    assert "after=" in last and "epoch=" in last, f"reconnect URL lacks after/epoch: {last}"

    wait_answer(page, queued, "a-2", "Got it once.")

    third, cmid3 = send_prompt(page, "And the answer\nover two lines?")
    say(f"PROMPTED {cmid3}")
    wait_answer(page, third, "a-3", "Still 42.\n<b>not bold</b>")
    # Text is shown as text, never parsed as markup.
    assert page.locator("article.answer b").count() == 0

    for amid in ("a-1", "a-2", "a-3"):
        n = page.locator(f'article.answer[data-amid="{amid}"]').count()
        assert n == 1, f"answer {amid} shown {n} times"
    assert page.locator("article.prompt").count() == 3
    assert page.locator("article.answer").count() == 3

    # The server pings every half second: the page answers with pongs.
    wait_until(page, lambda: watch.frames(watch.sent, "pong"), "a pong frame")
    pings = watch.frames(watch.received, "ping")
    pongs = watch.frames(watch.sent, "pong")
    assert pings, "no ping frame arrived"
    assert pongs and all(isinstance(p.get("ts"), int) for p in pongs), f"pongs: {pongs}"
    assert len(pongs) >= len(pings) - 1, f"{len(pings)} pings, {len(pongs)} pongs"

    screenshots(page, args.out)
    watch.check_clean()

    # A fresh load reads the history and then goes live from its end: the
    # answer is still there once.
    loads = watch.history_loads
    page.reload()
    connected(page)
    # In memory the restarted relay kept only what came after the restart;
    # with a data directory it kept everything.
    kept = ("a-1", "a-2", "a-3") if args.persistent else ("a-2", "a-3")
    expect(page.locator("article.answer")).to_have_count(len(kept), timeout=WAIT_MS)
    expect(page.locator("article.prompt")).to_have_count(len(kept))
    expect(page.locator("#notice")).to_be_hidden()
    # The history load, then the catch-up once the socket is open: both
    # answered, count again.
    wait_until(page, lambda: watch.history_loads >= loads + 2, "two history loads")
    for amid in kept:
        expect(page.locator(f'article.answer[data-amid="{amid}"]')).to_have_count(1)


def token(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    form = page.locator("#token-form")
    expect(form).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#status")).to_have_text("Needs a client token")
    page.get_by_label("Client token").fill("wrong")
    page.get_by_role("button", name="Use").click()
    expect(page.locator("#token-why")).to_contain_text("refused", timeout=WAIT_MS)
    page.get_by_label("Client token").fill(args.token)
    page.get_by_role("button", name="Use").click()
    expect(form).to_be_hidden()
    connected(page)
    stored = page.evaluate("sessionStorage.getItem('relay.client_token')")
    assert stored == args.token, f"token not kept in sessionStorage: {stored!r}"
    # A token that is an HTTP token travels as the subprotocol, not in the URL.
    assert watch.urls and not any("token=" in u for u in watch.urls), f"token in {watch.urls}"

    prompt, cmid = send_prompt(page, "Behind a token")
    say(f"PROMPTED {cmid}")
    wait_answer(page, prompt, "a-t", "Token accepted")
    watch.check_clean()


def fragment(page, watch, args):
    page.goto(f"{args.url}#{args.session}&token={args.token}")
    connected(page)
    expect(page.locator("#token-form")).to_be_hidden()
    stored = page.evaluate("sessionStorage.getItem('relay.client_token')")
    assert stored == args.token, f"token not kept in sessionStorage: {stored!r}"
    address = page.evaluate("location.href")
    assert args.token not in address, f"the token stays in the address: {address}"
    assert page.evaluate("location.hash") == f"#{args.session}", address
    assert watch.urls, "no WebSocket opened"
    assert not any(args.token in u or "token=" in u for u in watch.urls), watch.urls

    prompt, cmid = send_prompt(page, "Behind a session token")
    say(f"PROMPTED {cmid}")
    wait_answer(page, prompt, "a-f", "Fragment token accepted")
    watch.check_clean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=["restart", "token", "fragment"], required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--persistent", action="store_true",
                    help="the relay keeps its data across the restart: no resync expected")
    args = ap.parse_args()
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport=PHONE,
        )
        try:
            ctx.set_default_timeout(WAIT_MS)
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            watch = Watch(page)
            {"restart": restart, "token": token, "fragment": fragment}[args.scenario](page, watch, args)
        finally:
            ctx.close()
    say("DONE")


if __name__ == "__main__":
    main()
