"""Opens the link `relay pair` printed in headless Chromium, as a phone
would after scanning it; run by tests/clients/pair.rs.

A `relay agent` started from the command line `relay pair` printed serves
the session. The page must take the token and the key from the link (kept
in the tab, dropped from the address), connect with the token, show the
conversation as encrypted end to end, send a prompt that leaves the page as
ciphertext only, and show the agent's answer decrypted. Prints
`PROMPTED <client_msg_id>` once the prompt is sent, then `DONE`; any failed
check raises, prints a traceback on stderr and exits non-zero.
"""

import argparse
import json
import os
import re
import tempfile

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


def say(line):
    print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--link", required=True, help="the link relay pair printed")
    ap.add_argument("--prompt", required=True, help="what the person types")
    ap.add_argument("--answer", required=True, help="what the agent answers")
    ap.add_argument("--out", required=True, help="where the screenshot goes")
    args = ap.parse_args()
    fragment = args.link.split("#", 1)[1]
    fields = dict(part.split("=", 1) for part in fragment.split("&")[1:])
    session = fragment.split("&", 1)[0]
    token, key = fields["token"], fields["key"]

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, viewport=PHONE,
        )
        try:
            ctx.set_default_timeout(WAIT_MS)
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            errors, requests, sockets = [], [], []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append((r.method, r.url, r.post_data)))
            page.on("websocket", lambda ws: sockets.append(ws.url))
            page.goto(args.link)

            # Token and key in effect: connected with the token, encrypted
            # with the key, both gone from the address.
            status = page.locator("#status")
            expect(status).to_have_attribute("data-state", "ok", timeout=WAIT_MS)
            expect(page.locator("#token-form")).to_be_hidden()
            expect(page.locator("#e2e")).to_have_text("End-to-end encrypted")
            assert page.evaluate("location.hash") == f"#{session}", page.evaluate("location.href")
            chats = page.evaluate("JSON.parse(localStorage.getItem('relay.chats') || '[]')")
            kept = next((c for c in chats if c.get("id") == session), {})
            assert kept.get("token") == token, f"token not kept on the device: {kept!r}"
            assert kept.get("key") == key, "key not kept on the device"

            page.get_by_label("Prompt").fill(args.prompt)
            page.get_by_role("button", name="Send").click()
            prompt = page.locator("article.prompt").first
            expect(prompt).to_have_attribute("data-cmid", re.compile("."))
            say(f"PROMPTED {prompt.get_attribute('data-cmid')}")
            answer = page.locator("article.answer .text")
            expect(answer).to_have_text([args.answer], timeout=WAIT_MS)

            posts = [json.loads(b) for m, u, b in requests if m == "POST" and u.endswith("/prompt")]
            assert len(posts) == 1, posts
            assert posts[0]["prompt"].startswith("e2e1:"), posts[0]
            assert args.prompt not in json.dumps(posts), posts
            for _, url, body in requests:
                assert token not in url and key not in url, url
                assert key not in (body or ""), body
            assert not any(token in u or key in u for u in sockets), sockets
            assert not errors, f"uncaught errors in the page: {errors}"

            os.makedirs(args.out, exist_ok=True)
            shot = os.path.join(args.out, "pair-phone.png")
            page.screenshot(path=shot)
            say(f"SCREENSHOT {shot}")
        finally:
            ctx.close()
    say("DONE")


if __name__ == "__main__":
    main()
