"use strict";
// The chat page's service worker. It keeps the page's shell (the page and
// its icons) so the app opens offline, and brings a conversation forward
// when its notification is clicked. Every other request (the API, the
// WebSocket, the manifest) goes to the network untouched and is never
// cached: answers are always the relay's own.
const CACHE = "relay-shell-1";
const SHELL = ["./", "icon.svg", "icon.png"];
const SID_RE = /^[A-Za-z0-9._~-]{1,128}$/;
const scope = () => new URL(self.registration.scope);

self.addEventListener("install", (e) => {
  e.waitUntil(caches.open(CACHE).then((c) => c.addAll(SHELL)).then(() => self.skipWaiting()));
});
self.addEventListener("activate", (e) => {
  e.waitUntil(caches.keys()
    .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
    .then(() => self.clients.claim()));
});
// The shell from the network first, so a new relay's page shows at once;
// the kept copy when the network fails.
self.addEventListener("fetch", (e) => {
  const req = e.request, url = new URL(req.url), base = scope();
  if (req.method !== "GET" || url.origin !== base.origin || !url.pathname.startsWith(base.pathname)) return;
  const name = url.pathname.slice(base.pathname.length);
  const key = name === "" && req.mode === "navigate" ? "./" : SHELL.includes(name) && name ? name : "";
  if (!key) return;
  const kept = new URL(key, base).href;
  e.respondWith(fetch(req).then((res) => {
    if (res.ok) {
      const copy = res.clone();
      e.waitUntil(caches.open(CACHE).then((c) => c.put(kept, copy)));
    }
    return res;
  }, () => caches.match(kept).then((res) => res || Response.error())));
});
// A click on a notification: the page already open shows that
// conversation and comes forward; with none open, one opens on it.
self.addEventListener("notificationclick", (e) => {
  e.notification.close();
  e.waitUntil(bring(e.notification.data && e.notification.data.session));
});
async function bring(sid) {
  if (!SID_RE.test(String(sid))) return;
  const wins = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const win = wins.find((w) => w.focused) || wins[0];
  if (!win) return self.clients.openWindow(new URL("./#" + sid, scope()).href);
  win.postMessage({ type: "open", session: sid });
  try { await win.focus(); } catch (_) { /* focus needs the click itself */ }
}
