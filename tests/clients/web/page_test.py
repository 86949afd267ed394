"""Drives the chat page in headless Chromium; run by tests/clients/web_page.rs.

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
  e2e      the page is opened with `#SESSION&key=KEY` while a real `relay
           agent` with that key serves the session: the prompt leaves the
           page encrypted and the answer is shown decrypted; it prints
           `READY`, waits for `SENT` (the test ran `relay send` with the
           key) and shows that conversation too; a reload decrypts the
           history. A page with another key shows "cannot decrypt" for every
           text (its own prompt gets the agent's error answer, `WRONG
           <client_msg_id>`), one without a key too, never the ciphertext;
           a key that is no key stops the page from sending.
  ask-key  a conversation in which a prompt and its answer arrive encrypted
           (after `OPEN`): without a key the page asks for it and sends
           nothing, keeping the typed text; a wrong key and a non-key are
           refused with a reason; the right key decrypts what is shown and
           the typed prompt goes encrypted; a reload keeps the key; a tab
           without it asks at once.
  markdown an answer in Markdown (heading, emphasis, code span, nested
           list, ordered list, link, fenced code with a copy button) shows
           as elements; raw HTML and javascript: links in it show as text
           and make no element; a second prompt gets an error answer
           (`metadata.error`, no text), shown as an error.
  tables   an answer with GitHub tables shows them as tables (inline
           Markdown in cells, alignment from the delimiter row, an escaped
           pipe, a short row); a wide one scrolls sideways in its box on a
           phone-sized viewport while the page does not.
  stream   a prompt gets a "fetched" mark and the agent shows online once
           the agent fetched it (`FETCHED`); the answer streams in as one
           draft bubble that grows part by part (`PART <n>` after each
           part seen), rendered as Markdown with hostile HTML left as text;
           a reload mid-stream shows the draft again from the relay's
           snapshot (`RELOADED`); the final answer replaces the draft in
           the same element, one bubble, not two. A second prompt's draft
           ends as an error answer.
  presence the agent shows offline (`OFFLINE`), online while the test
           parks a long-poll (`ONLINE`), offline again once the poll ended
           and the relay's short grace passed (`GONE`); a draft the relay
           drops (short draft timeout) shows as interrupted, keeping its
           text (`INTERRUPTED`); a new part 1 starts it anew (`RESUMED`)
           and the final answer takes the bubble over.
  e2e-stream with `key=`, parts sealed one by one show decrypted as they
           arrive, a reload decrypts the snapshot (the parts' tokens
           concatenated, `RELOADED`), a part sealed for another message
           makes the draft read "cannot decrypt" (`PART 3`), and the sealed
           final answer replaces it.
  frames   the relay's socket passes through Playwright, which adds frames
           of its own for the page's prompt: a part out of order is
           ignored, a snapshot replaces the draft, a receipt marks the
           prompt; after a reconnect whose snapshots do not name the
           draft, it shows as interrupted; a new part 1 restarts it, the
           final answer replaces it, and a late part changes nothing.
  stop     a prompt awaiting its answer shows Stop (a draft streaming); a
           second page (another device) opens the conversation; Stop,
           reached with Tab and pressed with Enter, stops it: both pages
           mark the prompt and its draft "Stopped" from the relay's frames
           (the second never posts), Stop goes away (`STOPPED`); after the
           test checked the stored cancel (`CHECKED`), a reload shows it
           from the history.
  ask      questions from the agent posted by the test (after `OPEN`) show
           as cards on three pages: Markdown text, a button per choice,
           a countdown (said aloud politely, not each second); a tap
           answers it on this page and another (`ANSWERED`), and the third,
           whose socket loses reply frames, taps late: refused (409), its
           card shows the answer all the same. A question with a one
           second timeout shows "Expired" and its default (`EXPIRED`); one
           without choices is answered in its text field with Enter
           (`REPLIED`); a reload shows every card as it ended.
  ask-e2e  with `key=`, a sealed question shows decrypted; a tap posts the
           choice's own ciphertext (`ANSWERED`), a typed reply goes sealed
           (`REPLIED`); a page without the key reads "cannot decrypt".
  status   on a phone-sized screen, with the end-to-end mark shown, the
           status row's labels change (a prompt waiting, the agent online,
           a long server error, the socket dropped and reopened): the row,
           the header and the conversation keep their boxes throughout,
           and no label spills out of the row.
  new-prefix the page is opened with `#token=TOKEN` (a client token for the
           sessions under `--prefix`): it starts a conversation under the
           prefix, "New" another; a real `relay agent --prefix` answers
           both at once (its command waits until it runs for both);
           `SESSIONS <first> <second>`; the list of conversations shows
           both (screenshot), switches back to the first and forgets one.
  one-session a client token for one session: "New" is not offered and
           the list says why; opening another session is refused (403)
           with the relay's reason, and the page stops reconnecting; an
           expired token (`--other-token`) is explained as expired; a
           token that expires while connected (`--soon-token`; `CONNECTED`,
           then the test waits for its expiry and drops the socket,
           `EXPIRED`) is refused on the WebSocket's reconnect and
           explained, not retried.
  app      installability: Chromium reports no installability error, the
           manifest keeps the session in its start URL, the service worker
           keeps only the shell (screenshot); notifications are asked for
           only by the button; while the page is hidden (`HIDDEN`) an
           answer and a question from the agent count in the title and
           show one notification (`NOTIFIED`, `ASKED`; screenshot); its
           click (the worker's handler) brings the conversation forward;
           seen again the count and the notification go, and an answer
           while visible (`VISIBLE`) shows none (`QUIET`); offline, a
           reload still opens the page from the worker's copy.
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
# Waiting for an answer, fetched by an agent or not.
PENDING = re.compile(r"\b(pending|fetched)\b")
LABELS = {"pending": "Waiting for an answer", "fetched": "Fetched by the agent", "unsent": "Not sent yet"}
# Stored and not answered: an agent already parked on the session fetches
# it at once, and the page marks it so.
WAITING = ("pending", "fetched")


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
    """Types a prompt, sends it, waits until it shows in `state` (a tuple:
    one of them; None: any, for a real agent that may answer before the
    state is seen); returns its node and id."""
    before = page.locator("article.prompt").count()
    page.get_by_label("Prompt").fill(text)
    page.get_by_role("button", name="Send").click()
    prompt = page.locator("article.prompt").nth(before)
    expect(prompt.locator(".text")).to_have_text(text, timeout=WAIT_MS)
    if state:
        states = state if isinstance(state, tuple) else (state,)
        expect(prompt).to_have_class(re.compile(rf"\b({'|'.join(states)})\b"), timeout=WAIT_MS)
        labels = "|".join(re.escape(LABELS[s]) for s in states)
        expect(prompt.locator(".state")).to_contain_text(re.compile(labels))
    expect(prompt).to_have_attribute("data-cmid", re.compile("."))
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


def kept(page, sid):
    """What this device keeps of conversation `sid` (localStorage)."""
    chats = page.evaluate("JSON.parse(localStorage.getItem('relay.chats') || '[]')")
    return next((c for c in chats if c.get("id") == sid), {})


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

    first, cmid = send_prompt(page, "What is 6 times 7?", WAITING)
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

    third, cmid3 = send_prompt(page, "And the answer\nover two lines?", WAITING)
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
    stored = kept(page, args.session)
    assert stored.get("token") == args.token, f"token not kept with the conversation: {stored!r}"
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
    stored = kept(page, args.session)
    assert stored.get("token") == args.token, f"token not kept with the conversation: {stored!r}"
    address = page.evaluate("location.href")
    assert args.token not in address, f"the token stays in the address: {address}"
    assert page.evaluate("location.hash") == f"#{args.session}", address
    assert watch.urls, "no WebSocket opened"
    assert not any(args.token in u or "token=" in u for u in watch.urls), watch.urls

    prompt, cmid = send_prompt(page, "Behind a session token")
    say(f"PROMPTED {cmid}")
    wait_answer(page, prompt, "a-f", "Fragment token accepted")
    watch.check_clean()


def e2e(page, watch, args):
    requests = []
    page.on("request", lambda r: requests.append((r.method, r.url, r.post_data)))
    page.goto(f"{args.url}#{args.session}&key={args.key}")
    connected(page)
    expect(page.locator("#e2e")).to_have_text("End-to-end encrypted")
    address = page.evaluate("location.href")
    assert args.key not in address, f"the key stays in the address: {address}"
    assert page.evaluate("location.hash") == f"#{args.session}", address

    prompt, cmid = send_prompt(page, "attack at dawn", None)
    say(f"PROMPTED {cmid}")
    answer = page.locator("article.answer")
    expect(answer.locator(".text")).to_have_text(["ATTACK AT DAWN"], timeout=WAIT_MS)
    expect(answer.locator(".text > p")).to_have_text(["ATTACK AT DAWN"])  # decrypted, then rendered
    expect(prompt).not_to_have_class(PENDING, timeout=WAIT_MS)

    # Only ciphertext left the page and came back to it; the key went nowhere.
    posts = [json.loads(body) for method, url, body in requests if method == "POST" and url.endswith("/prompt")]
    assert len(posts) == 1, f"one POST /prompt expected: {posts}"
    assert posts[0]["prompt"].startswith("e2e1:"), posts[0]
    assert posts[0]["metadata"] == {"e2e": 1}, posts[0]
    assert "attack" not in json.dumps(posts), posts
    answers = watch.frames(watch.received, "message")
    assert answers and all(a["data"]["text"].startswith("e2e1:") for a in answers), answers
    assert not any("ATTACK" in str(f) for f in watch.received), watch.received
    assert not any(args.key in url or args.key in (body or "") for _, url, body in requests), requests
    assert not any(args.key in u for u in watch.urls), watch.urls

    # `relay send` with the key: its prompt (from the history) and answer
    # (live) are read here too.
    say("READY")
    expect_stdin("SENT")
    texts = ["attack at dawn", "from the command line"]
    expect(page.locator("article.prompt .text")).to_have_text(texts, timeout=WAIT_MS)
    expect(answer.locator(".text")).to_have_text([t.upper() for t in texts], timeout=WAIT_MS)

    # A reload keeps the key (not the address): the history is decrypted.
    page.reload()
    connected(page)
    expect(page.locator("#e2e")).to_be_visible()
    expect(page.locator("article.prompt .text")).to_have_text(texts, timeout=WAIT_MS)
    expect(answer.locator(".text")).to_have_text([t.upper() for t in texts], timeout=WAIT_MS)
    expect(page.locator(".undecryptable")).to_have_count(0)
    watch.check_clean()

    # Another key: nothing opens, nothing crashes; its own prompt is shown
    # as typed and the agent, which cannot read it, answers with an error.
    wrong = page.context.new_page()
    wrong_watch = Watch(wrong)
    wrong.goto(f"{args.url}#{args.session}&key={args.other_key}")
    connected(wrong)
    texts_of = wrong.locator("article .text")
    expect(texts_of).to_have_text(["cannot decrypt"] * 4, timeout=WAIT_MS)
    expect(wrong.locator(".undecryptable")).to_have_count(4)
    mine, wrong_cmid = send_prompt(wrong, "with the wrong key", None)
    say(f"WRONG {wrong_cmid}")
    reply = wrong.locator(f'article.answer[data-for="{wrong_cmid}"] .text')
    expect(reply).to_have_text("cannot decrypt", timeout=WAIT_MS)
    expect(reply).to_have_class(re.compile(r"\bundecryptable\b"))
    expect(mine).not_to_have_class(PENDING, timeout=WAIT_MS)
    wrong_watch.check_clean()

    # No key (an empty `key=`: this device keeps the last key given for
    # the conversation): encrypted texts read "cannot decrypt", never e2e1:...
    bare = page.context.new_page()
    bare_watch = Watch(bare)
    bare.goto(f"{args.url}#{args.session}&key=")
    connected(bare)
    expect(bare.locator("#e2e")).to_be_hidden()
    expect(bare.locator("article .text")).to_have_text(["cannot decrypt"] * 6, timeout=WAIT_MS)
    assert "e2e1:" not in bare.locator("#log").inner_text()
    bare_watch.check_clean()

    # A key that is no key: the page says so and sends nothing.
    bare_posts = []
    bare.on("request", lambda r: bare_posts.append(r.url) if r.method == "POST" else None)
    bare.evaluate(f"location.hash = '#{args.session}&key=not-a-key'")
    expect(bare.locator("#notice-text")).to_contain_text("not a relay key", timeout=WAIT_MS)
    expect(bare.locator("#e2e")).to_have_text("End-to-end key unusable")
    assert "not-a-key" not in bare.evaluate("location.href")
    connected(bare)
    before = bare.locator("article.prompt").count()
    bare.get_by_label("Prompt").fill("never sent")
    bare.get_by_role("button", name="Send").click()
    refused = bare.locator("article.prompt").nth(before)
    expect(refused).to_have_class(re.compile(r"\brejected\b"), timeout=WAIT_MS)
    expect(refused.locator(".state")).to_contain_text("cannot encrypt")
    assert not bare_posts, f"a prompt was posted without a usable key: {bare_posts}"
    bare_watch.check_clean()


def ask_key(page, watch, args):
    posts = []
    page.on("request", lambda r: posts.append(r.post_data) if r.method == "POST" and r.url.endswith("/prompt") else None)
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    form, why, key_input = page.locator("#key-form"), page.locator("#key-why"), page.get_by_label("End-to-end key")
    expect(form).to_be_hidden()  # nothing is encrypted yet
    say("OPEN")
    # An encrypted prompt and answer arrive from elsewhere: the key is asked for.
    expect(form).to_be_visible(timeout=WAIT_MS)
    expect(why).to_contain_text("end-to-end encrypted")
    texts = page.locator("article .text")
    expect(texts).to_have_text(["cannot decrypt"] * 2, timeout=WAIT_MS)
    os.makedirs(args.out, exist_ok=True)
    shot = os.path.join(args.out, "page-key.png")
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")

    # Nothing goes in clear: the text stays typed, the key is asked for.
    page.get_by_label("Prompt").fill("typed before the key")
    page.get_by_role("button", name="Send").click()
    expect(why).to_contain_text("Nothing is sent in clear")
    expect(key_input).to_be_focused()
    expect(page.get_by_label("Prompt")).to_have_value("typed before the key")
    expect(page.locator("article.prompt")).to_have_count(1)

    # A wrong key, then no key at all: said so, asked again.
    use = form.get_by_role("button", name="Use")
    key_input.fill(args.other_key)
    use.click()
    expect(why).to_contain_text("does not open this conversation", timeout=WAIT_MS)
    expect(form).to_be_visible()
    key_input.fill("not-a-key")
    use.click()
    expect(why).to_contain_text("not a relay key", timeout=WAIT_MS)
    expect(form).to_be_visible()
    assert not kept(page, args.session).get("key")
    expect(texts).to_have_text(["cannot decrypt"] * 2)

    # The right key: what is shown is decrypted, the key kept as the token is.
    key_input.fill(args.key)
    use.click()
    expect(form).to_be_hidden(timeout=WAIT_MS)
    expect(texts).to_have_text(["the plan", "THE PLAN"], timeout=WAIT_MS)
    expect(page.locator(".undecryptable")).to_have_count(0)
    expect(page.locator("#e2e")).to_have_text("End-to-end encrypted")
    assert kept(page, args.session).get("key") == args.key
    assert args.key not in page.evaluate("location.href")
    assert not posts, f"a prompt was posted before the key was entered: {posts}"

    # The prompt typed before goes now, encrypted.
    expect(page.get_by_label("Prompt")).to_have_value("typed before the key")
    prompt, cmid = send_prompt(page, "typed before the key", WAITING)
    say(f"PROMPTED {cmid}")
    wait_answer(page, prompt, "a-2", "TYPED BEFORE THE KEY")
    sent = [json.loads(b) for b in posts]
    assert len(sent) == 1, sent
    assert sent[0]["prompt"].startswith("e2e1:") and sent[0]["metadata"] == {"e2e": 1}, sent
    everything = ["the plan", "THE PLAN", "typed before the key", "TYPED BEFORE THE KEY"]
    page.reload()
    connected(page)
    expect(texts).to_have_text(everything, timeout=WAIT_MS)
    expect(form).to_be_hidden()
    watch.check_clean()

    # Another tab opened with no key (an empty `key=`): asked for at once,
    # from the history.
    bare = page.context.new_page()
    bare_watch = Watch(bare)
    bare.goto(f"{args.url}#{args.session}&key=")
    connected(bare)
    expect(bare.locator("#key-form")).to_be_visible(timeout=WAIT_MS)
    expect(bare.locator("article .text")).to_have_text(["cannot decrypt"] * 4, timeout=WAIT_MS)
    bare_watch.check_clean()


def markdown(page, watch, args):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=args.url.rstrip("/"))
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    _, cmid = send_prompt(page, "Show me some Markdown")
    say(f"PROMPTED {cmid}")
    answer = page.locator(f'article.answer[data-for="{cmid}"] .text')
    expect(answer.locator("h1")).to_have_text("Plan", timeout=WAIT_MS)
    expect(answer.locator("em")).to_have_text(["emphasis"])
    expect(answer.locator("strong")).to_have_text(["strong"])
    expect(answer.locator(":not(pre) > code")).to_have_text(["code <i>"])
    expect(answer.locator("p").first).to_contain_text("snake_case_name stays")
    expect(answer.locator("> ul > li")).to_have_count(2)
    expect(answer.locator("> ul > li > ul > li")).to_have_text(["nested"])
    expect(answer.locator("> ol > li")).to_have_text(["first", "second"])
    expect(answer.locator("> ol")).to_have_attribute("start", "3")
    links = answer.locator("a")
    expect(links).to_have_count(2)
    expect(links.first).to_have_text("a link")
    expect(links.first).to_have_attribute("href", "https://example.com/docs")
    for i in range(2):
        expect(links.nth(i)).to_have_attribute("target", "_blank")
        expect(links.nth(i)).to_have_attribute("rel", "noopener noreferrer")
    expect(links.nth(1)).to_have_attribute("href", "https://example.com/a_b")
    code = answer.locator("pre > code")
    expect(code).to_have_text('echo "<b>hi</b>"\necho *not emphasis*')
    expect(code).to_have_attribute("data-lang", "sh")
    copy = answer.get_by_role("button", name="Copy")
    # The label says "Copied" for a moment: watched, not polled for.
    page.evaluate("""b => { window.labels = []; new MutationObserver(() => labels.push(b.textContent))
        .observe(b, { childList: true, subtree: true }); }""", copy.element_handle())
    copy.click()
    source = 'echo "<b>hi</b>"\necho *not emphasis*'
    wait_until(page, lambda: page.evaluate("navigator.clipboard.readText()") == source, "the code in the clipboard")
    wait_until(page, lambda: "Copied" in page.evaluate("labels"), "the Copied label")
    # Hostile parts are text, not elements, and nothing ran.
    expect(answer.locator("img, script, b, i, iframe")).to_have_count(0)
    whole = answer.inner_text()
    for raw in ["<img src=x onerror=", "<script>window.pwned=2</script>", "[bad](javascript:alert(1))", "bad2"]:
        assert raw in whole, f"{raw!r} not shown as text in {whole!r}"
    assert page.evaluate("window.pwned") is None, "an answer ran code"

    failing, fid = send_prompt(page, "Now fail")
    say(f"PROMPTED {fid}")
    failed = page.locator(f'article.answer[data-for="{fid}"]')
    expect(failed).to_have_class(re.compile(r"\bfailed\b"), timeout=WAIT_MS)
    expect(failed.locator(".err")).to_have_text("Error (exit code 3): loading\nmodel not found: tiny")
    expect(failed.locator(".text")).to_have_count(0)
    expect(failing).not_to_have_class(PENDING)
    os.makedirs(args.out, exist_ok=True)
    shot = os.path.join(args.out, "page-markdown.png")
    page.screenshot(path=shot, full_page=True)
    say(f"SCREENSHOT {shot}")
    watch.check_clean()


def tables(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    _, cmid = send_prompt(page, "Tabulate it")
    say(f"PROMPTED {cmid}")
    answer = page.locator(f'article.answer[data-for="{cmid}"] .text')
    expect(answer.locator("table")).to_have_count(2, timeout=WAIT_MS)
    expect(answer.locator("> div.table > table")).to_have_count(2)  # each in its scrolling box
    expect(answer.locator("> p")).to_have_text(["Stock:", "after the table", "| not | a table |\n|---|"])
    small = answer.locator("table").first
    expect(small.locator("thead th")).to_have_text(["Fruit", "Count", "Note"])
    expect(small.locator("tbody tr")).to_have_count(3)
    # Inline Markdown in cells, an escaped pipe kept, a short row filled.
    expect(small.locator("tbody td")).to_have_text(["apple", "3", "red | green", "pear", "10", "site", "plum", "", ""])
    expect(small.locator("td strong")).to_have_text("apple")
    expect(small.locator("td code")).to_have_text("red | green")
    expect(small.locator("td a")).to_have_attribute("href", "https://example.com/pear")
    expect(small.locator("td a")).to_have_attribute("rel", "noopener noreferrer")
    aligns = small.evaluate("""t => [...t.rows].map(r => [...r.cells].map(c => getComputedStyle(c).textAlign))""")
    assert all(row == ["left", "right", "center"] for row in aligns), aligns

    # The wide one scrolls sideways in its box; the page does not.
    assert page.viewport_size == PHONE, page.viewport_size
    wide = answer.locator("div.table").nth(1)
    expect(wide.locator("th")).to_have_count(8)
    box = wide.evaluate("""b => ({overflow: getComputedStyle(b).overflowX, scroll: b.scrollWidth, client: b.clientWidth,
        right: b.getBoundingClientRect().right, bubble: b.closest('.text').getBoundingClientRect().right})""")
    assert box["overflow"] == "auto", box
    assert box["scroll"] > box["client"] + 50, f"the wide table does not overflow its box: {box}"
    assert box["right"] <= box["bubble"] + 0.5 <= PHONE["width"], f"the box leaves its bubble: {box}"
    page_width = page.evaluate("""() => ({doc: document.documentElement.scrollWidth, log: document.getElementById('log').scrollWidth,
        logClient: document.getElementById('log').clientWidth, inner: innerWidth})""")
    assert page_width["doc"] <= page_width["inner"], f"the page scrolls sideways: {page_width}"
    assert page_width["log"] <= page_width["logClient"], f"the conversation scrolls sideways: {page_width}"
    moved = wide.evaluate("b => { b.scrollLeft = 120; return b.scrollLeft; }")
    assert moved > 0, "the wide table's box does not scroll"
    os.makedirs(args.out, exist_ok=True)
    shot = os.path.join(args.out, "page-tables.png")
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    watch.check_clean()


def answer_of(page, amid):
    return page.locator(f'article.answer[data-amid="{amid}"]')


def mark(page, amid):
    """Remembers the answer's element, to check later that it is the same."""
    page.evaluate(f"""window.marked = document.querySelector('article.answer[data-amid="{amid}"]')""")


def same_element(page, amid):
    return page.evaluate(f"""document.querySelector('article.answer[data-amid="{amid}"]') === window.marked""")


def expect_agent(page, state):
    agent = page.locator("#agent")
    expect(agent).to_have_attribute("data-state", state, timeout=WAIT_MS)
    expect(agent).to_have_text(f"Agent {state}")
    expect(agent).to_have_attribute("title", re.compile(rf"^{state.capitalize()} since "))


def stream(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    expect_agent(page, "offline")
    prompt, cmid = send_prompt(page, "Stream me an answer")
    say(f"PROMPTED {cmid}")
    # The agent fetched it: a mark on the prompt, and the agent is online.
    expect(prompt).to_have_class(re.compile(r"\bfetched\b"), timeout=WAIT_MS)
    expect(prompt.locator(".state")).to_have_text("Fetched by the agent")
    expect(page.locator("#pending")).to_have_text("1 waiting for an answer")
    expect_agent(page, "online")
    say("FETCHED")

    draft = answer_of(page, "a-s")
    expect(draft.locator(".text")).to_have_text("Hello", timeout=WAIT_MS)
    expect(draft).to_have_class(re.compile(r"\bdraft\b"))
    expect(draft.locator(".state")).to_have_text("Writing…")
    mark(page, "a-s")
    say("PART 1")
    expect(draft.locator(".text")).to_have_text("Hello, world", timeout=WAIT_MS)
    expect(draft.locator(".text strong")).to_have_text("world")
    assert same_element(page, "a-s"), "the draft was redrawn in another bubble"
    expect(page.locator("article.answer")).to_have_count(1)
    expect(prompt).to_have_class(re.compile(r"\bfetched\b"))
    shot = os.path.join(args.out, "page-draft.png")
    os.makedirs(args.out, exist_ok=True)
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")

    # A reload mid-stream: the history has no draft, the snapshot brings it.
    page.reload()
    connected(page)
    expect(draft.locator(".text")).to_have_text("Hello, world", timeout=WAIT_MS)
    expect(draft.locator(".text strong")).to_have_text("world")
    expect(draft).to_have_class(re.compile(r"\bdraft\b"))
    snapshots = [f for f in watch.frames(watch.received, "delta") if f["data"].get("snapshot")]
    assert snapshots and snapshots[-1]["data"]["text"] == "Hello, **world**", snapshots
    mark(page, "a-s")
    say("RELOADED")

    # Hostile HTML in a part is text, and nothing runs.
    expect(draft.locator(".text")).to_contain_text("<script>window.pwned=1</script>", timeout=WAIT_MS)
    expect(draft.locator(".text img, .text script, .text a")).to_have_count(0)
    whole = draft.locator(".text").inner_text()
    for raw in ['<img src=x onerror="window.pwned=2">', "[x](javascript:alert(3))", "y"]:
        assert raw in whole, f"{raw!r} not shown as text in {whole!r}"
    assert page.evaluate("window.pwned") is None, "a draft ran code"
    say("PART 3")

    # The final answer takes over the draft's element: one bubble.
    expect(draft.locator(".text")).to_have_text("Hello, world. Done.", timeout=WAIT_MS)
    expect(draft).not_to_have_class(re.compile(r"\bdraft\b"))
    expect(draft.locator(".state")).to_have_count(0)
    expect(page.locator("article.answer")).to_have_count(1)
    assert same_element(page, "a-s"), "the final answer is another bubble than the draft"
    prompt = page.locator(f'article.prompt[data-cmid="{cmid}"]')
    expect(prompt).not_to_have_class(PENDING)
    expect(page.locator("#pending")).to_have_text("")

    # A draft whose final answer is an error answer.
    failing, fid = send_prompt(page, "Now fail while streaming")
    say(f"PROMPTED {fid}")
    failed = answer_of(page, "a-sf")
    expect(failed.locator(".text")).to_have_text("partial output", timeout=WAIT_MS)
    mark(page, "a-sf")
    say("PART 1")
    expect(failed).to_have_class(re.compile(r"\bfailed\b"), timeout=WAIT_MS)
    expect(failed.locator(".err")).to_have_text("Error (exit code 1): it broke")
    expect(failed.locator(".text")).to_have_text("partial output")
    assert same_element(page, "a-sf")
    expect(page.locator("article.answer")).to_have_count(2)
    expect(failing).not_to_have_class(PENDING)
    shot = os.path.join(args.out, "page-stream.png")
    page.screenshot(path=shot, full_page=True)
    say(f"SCREENSHOT {shot}")
    watch.check_clean()


def presence(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    expect_agent(page, "offline")
    say("OFFLINE")
    expect_agent(page, "online")
    say("ONLINE")
    # The poll ends and the short grace passes: offline again, by itself.
    expect_agent(page, "offline")
    states = [f["data"]["agent"] for f in watch.frames(watch.received, "presence")]
    changes = [a for i, a in enumerate(states) if i == 0 or states[i - 1] != a]
    assert changes == ["offline", "online", "offline"], states
    say("GONE")

    prompt, cmid = send_prompt(page, "Answer slowly")
    say(f"PROMPTED {cmid}")
    draft = answer_of(page, "a-p")
    expect(draft.locator(".text")).to_have_text("Half an answer", timeout=WAIT_MS)
    mark(page, "a-p")
    # The relay drops the draft after its short timeout: the text stays,
    # marked as interrupted, and the prompt still waits.
    expect(draft).to_have_class(re.compile(r"\binterrupted\b"), timeout=WAIT_MS)
    expect(draft.locator(".state")).to_have_text("Interrupted: the agent stopped sending")
    expect(draft.locator(".text")).to_have_text("Half an answer")
    ends = watch.frames(watch.received, "delta_end")
    assert [e["data"]["reason"] for e in ends] == ["timeout"], ends
    expect(prompt).to_have_class(re.compile(r"\bfetched\b"))
    shot = os.path.join(args.out, "page-interrupted.png")
    os.makedirs(args.out, exist_ok=True)
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    say("INTERRUPTED")
    # A new part 1 starts the draft anew in the same bubble.
    resumed = page.locator('article.answer.draft:not(.interrupted)[data-amid="a-p"] .text')
    expect(resumed).to_have_text("Resumed", timeout=WAIT_MS)
    assert same_element(page, "a-p")
    say("RESUMED")
    expect(draft.locator(".text")).to_have_text("The whole answer", timeout=WAIT_MS)
    expect(draft).not_to_have_class(re.compile(r"\b(draft|interrupted)\b"))
    expect(page.locator("article.answer")).to_have_count(1)
    assert same_element(page, "a-p")
    expect(prompt).not_to_have_class(PENDING)
    watch.check_clean()


def e2e_stream(page, watch, args):
    page.goto(f"{args.url}#{args.session}&key={args.key}")
    connected(page)
    expect(page.locator("#e2e")).to_have_text("End-to-end encrypted")
    _, cmid = send_prompt(page, "a secret, slowly")
    say(f"PROMPTED {cmid}")
    draft = answer_of(page, "a-e")
    expect(draft.locator(".text")).to_have_text("Top", timeout=WAIT_MS)
    say("PART 1")
    expect(draft.locator(".text")).to_have_text("Top secret", timeout=WAIT_MS)
    expect(draft.locator(".text strong")).to_have_text("secret")
    page.reload()
    connected(page)
    expect(draft.locator(".text")).to_have_text("Top secret", timeout=WAIT_MS)
    expect(draft.locator(".text strong")).to_have_text("secret")
    snapshots = [f for f in watch.frames(watch.received, "delta") if f["data"].get("snapshot")]
    assert snapshots and snapshots[-1]["data"]["text"].count("e2e1:") == 2, snapshots
    mark(page, "a-e")
    say("RELOADED")
    expect(draft.locator(".text")).to_have_text("cannot decrypt", timeout=WAIT_MS)
    expect(draft.locator(".text")).to_have_class(re.compile(r"\bundecryptable\b"))
    say("PART 3")
    expect(draft.locator(".text")).to_have_text("Top secret, all of it.", timeout=WAIT_MS)
    expect(draft.locator(".text")).not_to_have_class(re.compile(r"\bundecryptable\b"))
    expect(draft).not_to_have_class(re.compile(r"\bdraft\b"))
    expect(page.locator("article.answer")).to_have_count(1)
    assert same_element(page, "a-e")
    assert not any("secret" in str(f) for f in watch.received), "clear text came over the WebSocket"
    watch.check_clean()


def frames(page, watch, args):
    sockets = []

    def through(ws):
        ws.connect_to_server()  # frames pass both ways, and ws.send adds some
        sockets.append(ws)

    page.route_web_socket(re.compile(r"/ws/"), through)
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    expect_agent(page, "offline")
    prompt, cmid = send_prompt(page, "Frames by hand")
    ids = {"session_id": args.session, "client_msg_id": cmid, "assistant_msg_id": "a-x"}

    def inject(kind, **data):
        sockets[-1].send(json.dumps({"type": kind, "data": {**ids, **data}}))

    draft = answer_of(page, "a-x")
    inject("delta", part=1, text="One")
    expect(draft.locator(".text")).to_have_text("One", timeout=WAIT_MS)
    mark(page, "a-x")
    inject("delta", part=3, text=" IGNORED")
    inject("delta", part=2, text=" two")
    expect(draft.locator(".text")).to_have_text("One two", timeout=WAIT_MS)
    inject("delta", part=4, text="Replaced *whole*", snapshot=True)
    inject("delta", part=5, text=" and on")
    expect(draft.locator(".text")).to_have_text("Replaced whole and on", timeout=WAIT_MS)
    expect(draft.locator(".text em")).to_have_text("whole")
    inject("receipt", state="fetched", ts=1)
    expect(prompt.locator(".state")).to_have_text("Fetched by the agent", timeout=WAIT_MS)

    # The socket drops; the relay's snapshots on the new one do not name
    # the draft (it never knew it): once the presence frame that follows
    # them arrives, the draft shows as interrupted, text kept.
    n = len(sockets)
    sockets[-1].close()
    expect(page.locator("#agent")).to_be_hidden(timeout=WAIT_MS)
    wait_until(page, lambda: len(sockets) > n, "the page reconnecting")
    connected(page)
    expect_agent(page, "offline")
    expect(draft).to_have_class(re.compile(r"\binterrupted\b"), timeout=WAIT_MS)
    expect(draft.locator(".text")).to_have_text("Replaced whole and on")
    inject("delta", part=2, text="not next")
    inject("delta", part=1, text="Anew")
    expect(draft.locator(".text")).to_have_text("Anew", timeout=WAIT_MS)
    expect(draft).not_to_have_class(re.compile(r"\binterrupted\b"))
    inject("message", text="Final", seq=2, ts=2)
    expect(draft.locator(".text")).to_have_text("Final", timeout=WAIT_MS)
    expect(draft).not_to_have_class(re.compile(r"\bdraft\b"))
    inject("delta", part=2, text=" late")
    inject("presence", agent="online", since=1)  # a frame to wait for
    expect_agent(page, "online")
    expect(draft.locator(".text")).to_have_text("Final")
    expect(page.locator("article.answer")).to_have_count(1)
    assert same_element(page, "a-x")
    expect(prompt).not_to_have_class(PENDING)
    watch.check_clean()


def stop_button(page):
    return page.get_by_role("button", name="Stop the answer", exact=True)


def fits_phone(page, *nodes):
    """Each node lies inside the phone-sized viewport, and the page does not
    scroll sideways."""
    for node in nodes:
        box = node.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], f"{node} off screen: {box}"
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width}px wide"


def stop(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    expect(stop_button(page)).to_be_hidden()
    prompt, cmid = send_prompt(page, "Take your time", WAITING)
    say(f"PROMPTED {cmid}")
    expect(stop_button(page)).to_be_visible()
    draft = answer_of(page, "a-stop")
    expect(draft.locator(".text")).to_have_text("Working on it", timeout=WAIT_MS)
    expect(prompt).to_have_class(re.compile(r"\bfetched\b"))

    # Another device watches the same conversation, and never clicks.
    other = page.context.new_page()
    other_watch = Watch(other)
    other_posts = []
    other.on("request", lambda r: other_posts.append(r.url) if r.method == "POST" else None)
    other.goto(f"{args.url}#{args.session}")
    connected(other)
    expect(answer_of(other, "a-stop").locator(".text")).to_have_text("Working on it", timeout=WAIT_MS)
    expect(stop_button(other)).to_be_visible()

    # Reached from the prompt box with Tab, pressed with Enter; it fits
    # beside Send on a phone.
    page.bring_to_front()
    fits_phone(page, stop_button(page), page.get_by_role("button", name="Send", exact=True))
    page.get_by_label("Prompt").focus()
    page.keyboard.press("Tab")
    expect(stop_button(page)).to_be_focused()
    expect(stop_button(page)).to_have_text("Stop")
    shot = os.path.join(args.out, "page-stop.png")
    os.makedirs(args.out, exist_ok=True)
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    page.keyboard.press("Enter")

    for p in (page, other):
        mine = p.locator(f'article.prompt[data-cmid="{cmid}"]')
        expect(mine).to_have_class(re.compile(r"\bstopped\b"), timeout=WAIT_MS)
        expect(mine.locator(".state")).to_have_text("Stopped")
        ended = answer_of(p, "a-stop")
        expect(ended).to_have_class(re.compile(r"\bstopped\b"))
        expect(ended.locator(".state")).to_have_text("Stopped")
        expect(ended).to_have_attribute("aria-busy", "false")
        expect(ended.locator(".text")).to_have_text("Working on it")
        expect(stop_button(p)).to_be_hidden()
        expect(p.locator("#pending")).to_have_text("")
        # The draft stays below its prompt.
        order = p.evaluate("[...document.querySelectorAll('article')].map((a) => a.dataset.cmid || a.dataset.amid)")
        assert order == [cmid, "a-stop"], order
    # The focus, on a button that went away, is back in the prompt box.
    expect(page.get_by_label("Prompt")).to_be_focused()
    for w in (watch, other_watch):
        assert [f["data"]["client_msg_id"] for f in w.frames(w.received, "cancel")] == [cmid], w.received
        ends = w.frames(w.received, "delta_end")
        assert [e["data"]["reason"] for e in ends] == ["cancelled"], ends
    assert not other_posts, f"the other page posted: {other_posts}"
    shot = os.path.join(args.out, "page-stopped.png")
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    say("STOPPED")

    # The test's part for the stopped prompt was refused; a reload shows the
    # stop from the history.
    expect_stdin("CHECKED")
    other.reload()
    connected(other)
    mine = other.locator(f'article.prompt[data-cmid="{cmid}"]')
    expect(mine.locator(".state")).to_have_text("Stopped", timeout=WAIT_MS)
    expect(stop_button(other)).to_be_hidden()
    expect(answer_of(other, "a-stop")).to_have_count(0)  # drafts are not history
    watch.check_clean()
    other_watch.check_clean()


def ask_card(page, ask_id):
    return page.locator(f'article.question[data-ask="{ask_id}"]')


def drop_replies(ws):
    """Passes the relay's frames to the page, except `reply` frames."""
    server = ws.connect_to_server()

    def down(message):
        if not (isinstance(message, str) and json.loads(message).get("type") == "reply"):
            ws.send(message)

    server.on_message(down)


def ask(page, watch, args):
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    # Another device; and a third whose socket loses the reply frames, so
    # that its tap comes after the question was answered.
    other, late = page.context.new_page(), page.context.new_page()
    other_watch, late_watch = Watch(other), Watch(late)
    late_replies = []
    late.on("response", lambda r: late_replies.append(r.status) if r.url.endswith("/reply") else None)
    late.route_web_socket(re.compile(r"/ws/"), drop_replies)
    for p in (other, late):
        p.goto(f"{args.url}#{args.session}")
        connected(p)
    page.bring_to_front()
    say("OPEN")

    for p in (page, other, late):
        card = ask_card(p, "k-deploy")
        expect(card.locator(".text strong")).to_have_text("make deploy", timeout=WAIT_MS)
        expect(card.locator(".text")).to_have_text("Run make deploy?")
        expect(card.get_by_role("button")).to_have_text(["yes", "no"])
        expect(card.locator(".state")).to_have_text(re.compile(r"^(10:00|9:[45]\d) left$"))
    card = ask_card(page, "k-deploy")
    expect(card).to_have_attribute("aria-label", "Question from the agent")
    # Said once, politely, not every second.
    said = card.locator(".sr-only")
    expect(said).to_have_attribute("aria-live", "polite")
    expect(said).to_have_text("10 minutes left to answer")
    expect(card.locator(".state")).to_have_attribute("aria-live", "off")
    # It counts down.
    shown = card.locator(".state").text_content()
    wait_until(page, lambda: card.locator(".state").text_content() != shown, "the countdown to move")
    fits_phone(page, *card.get_by_role("button").all())
    shot = os.path.join(args.out, "page-ask.png")
    os.makedirs(args.out, exist_ok=True)
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")

    card.get_by_role("button", name="yes", exact=True).click()
    for p in (page, other):
        c = ask_card(p, "k-deploy")
        expect(c.locator(".out")).to_have_text("Answer: yes", timeout=WAIT_MS)
        expect(c.locator(".state")).to_have_text("Answered")
        expect(c).to_have_class(re.compile(r"\banswered\b"))
        expect(c.get_by_role("button")).to_have_count(0)
    # The late page still offers the choices: its tap is refused (409) and
    # the card shows the answer given elsewhere, quietly.
    c = ask_card(late, "k-deploy")
    expect(c.get_by_role("button")).to_have_count(2)
    c.get_by_role("button", name="no", exact=True).click()
    expect(c.locator(".out")).to_have_text("Answer: yes", timeout=WAIT_MS)
    expect(c.get_by_role("button")).to_have_count(0)
    expect(late.locator("#notice")).to_be_hidden()
    assert late_replies == [409], late_replies
    say("ANSWERED")

    # Past its time with no reply: expired, with the default the agent takes.
    c = ask_card(page, "k-late")
    expect(c.locator(".state")).to_have_text("Expired", timeout=WAIT_MS)
    expect(c.locator(".out")).to_have_text("Default: stop")
    expect(c.locator(".sr-only")).to_have_text("Expired")
    expect(c.get_by_role("button")).to_have_count(0)
    expect(ask_card(other, "k-late").locator(".state")).to_have_text("Expired", timeout=WAIT_MS)
    say("EXPIRED")

    # No choices: a text field, answered with the keyboard.
    c = ask_card(page, "k-branch")
    field = c.get_by_label("Your answer")
    expect(field).to_be_visible(timeout=WAIT_MS)
    expect(c.locator(".text em")).to_have_text("branch")
    fits_phone(page, field, c.get_by_role("button", name="Reply", exact=True))
    field.fill("main")
    field.press("Enter")
    for p in (page, other):
        expect(ask_card(p, "k-branch").locator(".out")).to_have_text("Answer: main", timeout=WAIT_MS)
    expect(c.get_by_label("Your answer")).to_have_count(0)
    expect(c.locator(".out")).to_be_focused()  # where the focus went with the field
    shot = os.path.join(args.out, "page-asked.png")
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    say("REPLIED")

    # A reload shows every card as it ended, from the history.
    other.reload()
    connected(other)
    for ask_id, out in [("k-deploy", "Answer: yes"), ("k-late", "Default: stop"), ("k-branch", "Answer: main")]:
        expect(ask_card(other, ask_id).locator(".out")).to_have_text(out, timeout=WAIT_MS)
    expect(other.locator("article.question button, article.question input")).to_have_count(0)
    for w in (watch, other_watch, late_watch):
        w.check_clean()


def ask_e2e(page, watch, args):
    posts = []
    page.on("request", lambda r: posts.append(json.loads(r.post_data)) if r.url.endswith("/reply") else None)
    page.goto(f"{args.url}#{args.session}&key={args.key}")
    connected(page)
    say("OPEN")
    c = ask_card(page, "k-e")
    expect(c.locator(".text strong")).to_have_text("it", timeout=WAIT_MS)
    expect(c.locator(".text")).to_have_text("Ship it?")
    expect(c.get_by_role("button")).to_have_text(["deploy", "wait"])
    c.get_by_role("button", name="deploy", exact=True).click()
    expect(c.locator(".out")).to_have_text("Answer: deploy", timeout=WAIT_MS)
    say("ANSWERED")

    c = ask_card(page, "k-f")
    expect(c.locator(".text")).to_have_text("Which branch?", timeout=WAIT_MS)
    c.get_by_label("Your answer").fill("feature/x")
    c.get_by_role("button", name="Reply", exact=True).click()
    expect(c.locator(".out")).to_have_text("Answer: feature/x", timeout=WAIT_MS)
    assert len(posts) == 2 and all(p["text"].startswith("e2e1:") for p in posts), posts
    for clear in ("deploy", "feature/x", "Ship", "branch"):
        assert clear not in json.dumps(posts), posts
        assert not any(clear in str(f) for f in watch.received), f"{clear} came over the WebSocket"

    # Without the key (an empty `key=`): the texts read "cannot decrypt",
    # the choices too, and nothing can be picked.
    bare = page.context.new_page()
    bare_watch = Watch(bare)
    bare.goto(f"{args.url}#{args.session}&key=")
    connected(bare)
    expect(ask_card(bare, "k-e").locator(".text")).to_have_text("cannot decrypt", timeout=WAIT_MS)
    expect(ask_card(bare, "k-e").locator(".out")).to_have_text("Answer: cannot decrypt")
    assert "e2e1:" not in bare.locator("#log").inner_text()
    say("REPLIED")
    watch.check_clean()
    bare_watch.check_clean()


# Called at every change of the status row (a MutationObserver): its
# labels, and the boxes of the row and of what is around it.
MEASURE_ROW = """() => {
    const $ = (id) => document.getElementById(id);
    const box = (node) => { const r = node.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
    const bar = $("bar");
    window.rows = [];
    const take = () => {
        const shown = [...bar.children].filter((c) => !c.hidden);
        rows.push({
            status: $("status").textContent,
            others: shown.filter((c) => c.id !== "status").map((c) => c.id + ":" + c.textContent).join("|"),
            around: [bar, $("status"), document.querySelector("header"), $("session-form"), $("log"), $("compose")].map(box),
            spills: shown.filter((c) => c.getBoundingClientRect().right > bar.getBoundingClientRect().right + 0.5).map((c) => c.id),
        });
    };
    take();
    new MutationObserver(take).observe(bar, { subtree: true, childList: true, characterData: true, attributes: true });
}"""


def status(page, watch, args):
    sockets = []

    def through(ws):
        ws.connect_to_server()
        sockets.append(ws)

    page.route_web_socket(re.compile(r"/ws/"), through)
    page.goto(f"{args.url}#{args.session}&key={args.key}")
    connected(page)
    expect_agent(page, "offline")
    expect(page.locator("#e2e")).to_be_visible()
    page.evaluate(MEASURE_ROW)

    # A prompt waits; the agent comes online; the server says something long.
    send_prompt(page, "Keep your place", "pending")
    sockets[-1].send(json.dumps({"type": "presence", "data": {"agent": "online", "since": 1}}))
    expect_agent(page, "online")
    long_error = "Server: " + "a very long complaint from the relay that no phone could show on one line " * 2
    sockets[-1].send(json.dumps({"type": "error", "error": long_error[len("Server: "):].strip()}))
    expect(page.locator("#status")).to_have_text(long_error.strip(), timeout=WAIT_MS)
    expect(page.locator("#status")).to_have_attribute("title", long_error.strip())
    # The socket drops: disconnected and retrying, then connected again.
    n = len(sockets)
    sockets[-1].close()
    expect(page.locator("#status")).to_contain_text("Disconnected; retrying", timeout=WAIT_MS)
    wait_until(page, lambda: len(sockets) > n, "the page reconnecting")
    connected(page)
    expect_agent(page, "offline")

    rows = page.evaluate("rows")
    labels = {r["status"] for r in rows}
    for want in ["Connected", "Disconnected; retrying", "Server: a very long"]:
        assert any(label.startswith(want) for label in labels), f"{want!r} never shown: {labels}"
    assert any("agent:Agent online" in r["others"] for r in rows), rows
    assert any("pending:1 waiting" in r["others"] for r in rows), rows
    assert any(r["others"] == "" or "agent" not in r["others"] for r in rows), "the agent label never hid"
    first = rows[0]["around"]
    names = ["the status row", "the connection label", "the header", "the session form", "the conversation",
             "the prompt box"]
    for r in rows:
        for name, want, got in zip(names, first, r["around"]):
            if name == "the connection label":
                want, got = want[1::2], got[1::2]  # its top and height; its width follows the other labels
            assert got == want, f"{name} moved when the row said {r['status']!r} / {r['others']!r}: {want} -> {got}"
        assert not r["spills"], f"{r['spills']} overflow the row: {r}"
    # With the other labels the same, the connection's label keeps its box too.
    by_others = {}
    for r in rows:
        by_others.setdefault(r["others"], set()).add(tuple(r["around"][1]))
    assert all(len(boxes) == 1 for boxes in by_others.values()), by_others
    assert len(rows) >= 8, f"few changes seen: {[r['status'] for r in rows]}"
    os.makedirs(args.out, exist_ok=True)
    shot = os.path.join(args.out, "page-status.png")
    page.screenshot(path=shot)
    say(f"SCREENSHOT {shot}")
    watch.check_clean()


def shot(page, args, name):
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, name)
    page.screenshot(path=path)
    say(f"SCREENSHOT {path}")


def open_chats(page):
    if page.locator("#chats").is_hidden():
        page.get_by_role("button", name="Chats").click()
    expect(page.locator("#chats")).to_be_visible()


def new_prefix(page, watch, args):
    page.goto(f"{args.url}#token={args.token}")
    connected(page)
    first = page.evaluate("location.hash")[1:]
    assert first.startswith(args.prefix), f"{first} is not under {args.prefix}"
    assert args.token not in page.evaluate("location.href")
    send_prompt(page, "first", None)
    page.get_by_role("button", name="New").click()
    expect(page.get_by_label("Session")).not_to_have_value(first)
    connected(page)
    second = page.evaluate("location.hash")[1:]
    assert second.startswith(args.prefix) and second != first, (first, second)
    expect(page.locator("article")).to_have_count(0)
    send_prompt(page, "second", None)
    # The agent's command answers only once it runs for both at once.
    expect(page.locator("article.answer .text")).to_have_text("SECOND (2 AT ONCE)", timeout=WAIT_MS)
    say(f"SESSIONS {first} {second}")
    for sid in (first, second):
        assert kept(page, sid).get("token") == args.token, kept(page, sid)

    open_chats(page)
    expect(page.locator("#chat-list .go")).to_have_text([second, first])
    expect(page.locator("#chat-list .go[aria-current]")).to_have_text(second)
    expect(page.locator("#new-why")).to_be_hidden()
    shot(page, args, "page-chats.png")
    page.get_by_role("button", name=first, exact=True).click()
    expect(page.locator("#chats")).to_be_hidden()
    connected(page)
    expect(page.locator("article.answer .text")).to_have_text("FIRST (2 AT ONCE)", timeout=WAIT_MS)
    expect(page.locator("article.prompt .text")).to_have_text("first")
    open_chats(page)
    page.get_by_role("button", name=f"Forget {second}").click()
    expect(page.locator("#chat-list .go")).to_have_text([first])
    assert not kept(page, second), "a forgotten conversation stays on the device"
    watch.check_clean()


def one_session(page, watch, args):
    page.goto(f"{args.url}#{args.session}&token={args.token}")
    connected(page)
    expect(page.locator("#new")).to_be_hidden()
    open_chats(page)
    why = page.locator("#new-why")
    expect(why).to_be_visible()
    expect(why).to_contain_text(f"opens only the conversation {args.session}")
    shot(page, args, "page-one-session.png")

    # Another session with this token: the relay's reason, and no retrying.
    sockets = len(watch.urls)
    page.get_by_label("Session").fill(args.session + "-other")
    page.get_by_role("button", name="Open", exact=True).click()
    expect(page.locator("#token-form")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#token-why")).to_contain_text("token is for another session")
    expect(page.locator("#status")).to_have_text("Refused: token is for another session")
    # Backoff starts at half a second: two seconds would see retries.
    page.wait_for_timeout(2000)
    expect(page.locator("#status")).to_have_text("Refused: token is for another session")
    assert len(watch.urls) == sockets, f"the page kept reconnecting: {watch.urls[sockets:]}"

    # An expired token: said so.
    page.evaluate(f"location.hash = '#{args.session}&token={args.other_token}'")
    expect(page.locator("#token-why")).to_contain_text("token expired", timeout=WAIT_MS)
    expect(page.locator("#status")).to_have_text("Refused: token expired")
    expect(page.locator("#new")).to_be_hidden()
    expect(page.locator("#new-why")).to_have_text('No "New" here: the relay says "token expired".')
    shot(page, args, "page-refused.png")

    # A token that expires while the page is connected: once the socket
    # drops (the test deletes the session), the reconnect's upgrade is
    # refused, the page asks /messages why, says so, and stops.
    page.evaluate(f"location.hash = '#{args.session}&token={args.soon_token}'")
    connected(page)
    say("CONNECTED")
    expect_stdin("EXPIRED")
    expect(page.locator("#status")).to_have_text("Refused: token expired", timeout=WAIT_MS)
    expect(page.locator("#token-why")).to_contain_text("token expired")
    sockets = len(watch.urls)
    page.wait_for_timeout(2000)
    assert len(watch.urls) == sockets, f"the page kept reconnecting: {watch.urls[sockets:]}"
    watch.check_clean()


SET_HIDDEN = """(hidden) => {
  for (const [name, value] of [["hidden", hidden], ["visibilityState", hidden ? "hidden" : "visible"]])
    Object.defineProperty(document, name, { configurable: true, get: () => value });
  document.dispatchEvent(new Event("visibilitychange"));
}"""
# Every notification the page had shown (the promise resolved): headless
# Chromium's own list (getNotifications) may drop one shown from a page.
RECORD_SHOWN = """(() => {
  window.shown = [];
  const show = ServiceWorkerRegistration.prototype.showNotification;
  ServiceWorkerRegistration.prototype.showNotification = function (title, o) {
    return show.call(this, title, o).then((v) => {
      window.shown.push({ title, body: o.body, tag: o.tag, data: o.data });
      return v;
    });
  };
})()"""
NOTIFICATIONS = """navigator.serviceWorker.ready.then((r) => r.getNotifications())
  .then((ns) => ns.map((n) => ({ title: n.title, body: n.body, tag: n.tag, data: n.data })))"""


# A card the test draws over the page before a screenshot, for what the
# page itself does not show: what the browser reported, the icons as a
# home screen would crop them, a notification and the title.
OVERLAY = """([lines, icons]) => {
  const box = document.createElement("div");
  box.id = "test-overlay";
  Object.assign(box.style, { position: "fixed", left: "8px", right: "8px", bottom: "90px", padding: "10px",
    background: "#fff", color: "#111", border: "2px dashed #b91c1c", borderRadius: "10px", font: "13px system-ui" });
  const head = document.createElement("strong");
  head.textContent = "Drawn by the test:";
  box.append(head);
  for (const line of lines) {
    const p = document.createElement("div");
    p.textContent = line;
    box.append(p);
  }
  if (icons) {
    const row = document.createElement("div");
    Object.assign(row.style, { display: "flex", gap: "12px", marginTop: "8px" });
    for (const [src, radius] of [["icon.svg", "0"], ["icon.png", "50%"], ["icon.png", "22%"]]) {
      const img = document.createElement("img");
      img.src = src;
      Object.assign(img.style, { width: "64px", height: "64px", borderRadius: radius });
      row.append(img);
    }
    box.append(row);
  }
  document.body.append(box);
  return Promise.all([...box.querySelectorAll("img")].map((i) => i.decode()));
}"""


def overlaid(page, args, name, lines, icons=False):
    page.evaluate(OVERLAY, [lines, icons])
    shot(page, args, name)
    page.evaluate("document.getElementById('test-overlay').remove()")


def app(page, watch, args):
    page.add_init_script("""(() => {
      window.permissionAsks = 0;
      const ask = Notification.requestPermission.bind(Notification);
      Notification.requestPermission = (...a) => { window.permissionAsks++; return ask(...a); };
    })()""")
    page.add_init_script(RECORD_SHOWN)
    page.goto(f"{args.url}#{args.session}")
    connected(page)
    page.wait_for_function("navigator.serviceWorker.controller !== null", timeout=WAIT_MS)
    cdp = page.context.new_cdp_session(page)
    errors = None
    deadline = time.monotonic() + WAIT_MS / 1000
    while errors != []:
        assert time.monotonic() < deadline, f"installability errors: {errors}"
        errors = cdp.send("Page.getInstallabilityErrors")["installabilityErrors"]
        if errors:
            page.wait_for_timeout(200)
    manifest = cdp.send("Page.getAppManifest")
    assert not manifest["errors"], manifest["errors"]
    assert manifest["url"].endswith(f"manifest.webmanifest?session={args.session}"), manifest["url"]
    data = json.loads(manifest["data"])
    assert data["start_url"] == f"./#{args.session}" and data["display"] == "standalone", data
    # The worker keeps the shell only: no answer of the API.
    kept_urls = page.evaluate("""caches.keys().then((ks) => Promise.all(ks.map((k) =>
      caches.open(k).then((c) => c.keys()).then((rs) => rs.map((r) => r.url))))).then((l) => l.flat().sort())""")
    base = args.url
    assert kept_urls == sorted([base, base + "icon.png", base + "icon.svg"]), kept_urls
    overlaid(page, args, "page-install.png", [
        "Page.getInstallabilityErrors: none",
        f"manifest: {data['name']}, {data['display']}, start_url {data['start_url']}",
        "icons: icon.svg (any); icon.png (maskable) cropped round and squircle:"], icons=True)

    # Notifications are asked for by the button only.
    assert page.evaluate("Notification.permission") == "default"
    assert page.evaluate("window.permissionAsks") == 0, "permission asked on load"
    open_chats(page)
    button = page.get_by_role("button", name="Notify me of answers")
    expect(button).to_be_visible()
    origin = args.url.split("/", 3)
    page.context.grant_permissions(["notifications"], origin="/".join(origin[:3]))
    button.click()
    expect(button).to_be_hidden()
    expect(page.locator("#notify-state")).to_contain_text("Notifications on")
    assert page.evaluate("window.permissionAsks") == 1
    page.get_by_role("button", name="Chats").click()

    page.evaluate(SET_HIDDEN, True)
    say("HIDDEN")
    answer = page.locator('article.answer[data-amid="a-hidden"]')
    expect(answer.locator(".text")).to_have_text("Built, all green.", timeout=WAIT_MS)
    wait_until(page, lambda: page.evaluate("shown.length"), "a notification")
    shown = page.evaluate("shown")
    assert len(shown) == 1, shown
    n = shown[0]
    assert n["title"] == args.session and n["body"] == "Answer: Built, all green.", n
    assert n["data"] == {"session": args.session}, n
    assert page.title() == f"(1) {args.session} · relay", page.title()
    say(f"NOTIFIED {n['body']}")
    expect(page.locator('article[data-ask="k-hidden"]')).to_be_visible(timeout=WAIT_MS)
    wait_until(page, lambda: page.title().startswith("(2) "), "the count at two")
    # The conversation's one notification now tells of the question.
    asked = [{"title": f"{args.session}: 2 new", "body": "The agent asks: Deploy now?",
              "tag": f"relay:{args.session}", "data": {"session": args.session}}]
    wait_until(page, lambda: page.evaluate("shown").count(asked[0]) == 1, f"the notification {asked}")
    overlaid(page, args, "page-hidden.png", [
        f"document.title: {page.title()}",
        *(f"notification: {n['title']} / {n['body']}" for n in page.evaluate("shown"))])
    say("ASKED")

    # The notification's click, while another conversation shows: the
    # worker's handler brings this one forward.
    page.get_by_label("Session").fill(args.session + "-else")
    page.get_by_role("button", name="Open", exact=True).click()
    connected(page)
    worker = page.context.service_workers[0]
    worker.evaluate("(sid) => bring(sid)", shown[0]["data"]["session"])
    expect(page.get_by_label("Session")).to_have_value(args.session, timeout=WAIT_MS)
    connected(page)
    expect(answer.locator(".text")).to_have_text("Built, all green.")

    # Seen again: no count, no notification left.
    page.evaluate(SET_HIDDEN, False)
    expect(page).to_have_title(f"{args.session} · relay")
    wait_until(page, lambda: not page.evaluate(NOTIFICATIONS), "the notification closed")
    say("VISIBLE")
    expect(page.locator('article.answer[data-amid="a-visible"] .text')).to_have_text("Seen here.", timeout=WAIT_MS)
    page.wait_for_timeout(300)  # a notification would be shown by now
    assert len(page.evaluate("shown")) == 2, page.evaluate("shown")
    assert not page.evaluate(NOTIFICATIONS), page.evaluate(NOTIFICATIONS)
    expect(page).to_have_title(f"{args.session} · relay")
    say("QUIET")

    # Offline: the page still opens, from the worker's copy.
    page.context.set_offline(True)
    page.reload()
    expect(page.get_by_label("Session")).to_have_value(args.session, timeout=WAIT_MS)
    expect(page.get_by_role("button", name="Send")).to_be_visible()
    page.context.set_offline(False)
    connected(page)
    watch.check_clean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", required=True,
                    choices=["restart", "token", "fragment", "e2e", "ask-key", "markdown", "tables", "stream",
                             "presence", "e2e-stream", "frames", "status", "stop", "ask", "ask-e2e",
                             "new-prefix", "one-session", "app"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--other-token", default="", help="an expired token (one-session)")
    ap.add_argument("--soon-token", default="", help="a token that expires during the test (one-session)")
    ap.add_argument("--prefix", default="", help="the prefix the token opens (new-prefix)")
    ap.add_argument("--key", default="", help="the end-to-end key (e2e)")
    ap.add_argument("--other-key", default="", help="a key the agent does not have (e2e)")
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
            scenarios = {"restart": restart, "token": token, "fragment": fragment, "e2e": e2e, "ask-key": ask_key,
                         "markdown": markdown, "tables": tables,
                         "stream": stream, "presence": presence, "e2e-stream": e2e_stream, "frames": frames,
                         "status": status, "stop": stop,
                         "ask": ask, "ask-e2e": ask_e2e,
                         "new-prefix": new_prefix, "one-session": one_session, "app": app}
            scenarios[args.scenario](page, watch, args)
        finally:
            ctx.close()
    say("DONE")


if __name__ == "__main__":
    main()
