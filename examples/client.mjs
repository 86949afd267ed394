// A client for relay in JavaScript, for the browser and for Node (22 or
// newer; Node 20 with --experimental-websocket): asks a question and
// resolves with the agent's answer, read from the session's WebSocket.
//
//   import { ask } from "./client.mjs";
//   const text = await ask("http://127.0.0.1:8000", "demo", "hello");
//
// From a shell: node examples/client.mjs http://127.0.0.1:8000 demo hello
// A client token (RELAY_CLIENT_TOKEN in Node, or the `token` option) is sent
// as a bearer token and, for the WebSocket, as `?token=`.

export async function ask(base, session, prompt, { token, timeoutMs = 60_000 } = {}) {
  base = base.replace(/\/$/, "");
  // randomUUID needs a secure context in a browser (https:// or localhost).
  const id = crypto.randomUUID?.() ??
    Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
  const ws = new WebSocket(
    base.replace(/^http/, "ws") + `/ws/${encodeURIComponent(session)}` +
      (token ? `?token=${encodeURIComponent(token)}` : ""),
  );
  // Subscribed before the prompt is posted, so the answer cannot be missed.
  const answer = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no answer in time")), timeoutMs);
    ws.onmessage = (e) => {
      const frame = JSON.parse(e.data);
      if (frame.type === "message" && frame.data.client_msg_id === id) {
        clearTimeout(timer);
        resolve(frame.data.text);
      }
    };
    ws.onerror = () => reject(new Error("WebSocket failed"));
  });
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = () => reject(new Error("WebSocket failed"));
  });
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const resp = await fetch(`${base}/prompt`, {
    method: "POST",
    headers,
    body: JSON.stringify({ session_id: session, prompt, client_msg_id: id }),
  });
  if (!resp.ok) {
    ws.close();
    throw new Error(`POST /prompt: ${resp.status} ${await resp.text()}`);
  }
  try {
    return await answer;
  } finally {
    ws.close();
  }
}

// Run from a shell: print the answer.
if (typeof process !== "undefined" && import.meta.url === `file://${process.argv[1]}`) {
  const [base, session, ...words] = process.argv.slice(2);
  const token = process.env.RELAY_CLIENT_TOKEN;
  ask(base, session, words.join(" "), { token }).then(
    (text) => console.log(text),
    (e) => {
      console.error(e.message);
      process.exit(1);
    },
  );
}
