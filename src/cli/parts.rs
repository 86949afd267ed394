//! `relay agent`'s streamed parts: while the command for one prompt runs,
//! each batch of its stdout is posted as a part of the answer's draft
//! (`POST /response` with `"partial": true`, the answer's own
//! `assistant_msg_id`), so the person waiting sees it appear.
//!
//! Parts are a preview; the final answer, posted whole when the command
//! exits, is what counts. So a part is posted once, never retried: the
//! first refusal or network error ends the streaming of that answer (the
//! final answer, with its own retries, still goes out), and so does a
//! draft that would pass the server's text limit.

use std::time::Duration;

use serde_json::json;

use super::client::{Client, Limit};
use super::e2e;
use super::stream::Decoder;
use crate::store::model::MAX_TEXT_BYTES;

/// How long one part may take: a part held up longer is not worth the
/// wait, the final answer follows anyway.
const PART_TIMEOUT: Duration = Duration::from_secs(5);

/// Which answer the parts belong to.
#[derive(Clone, Copy)]
pub struct Answer<'a> {
    pub session: &'a str,
    pub client_msg_id: &'a str,
    pub assistant_msg_id: &'a str,
}

/// One answer's parts on their way. Made before its command starts, fed
/// every batch of output, dropped when the command has exited.
pub struct Parts<'a> {
    client: &'a mut Client,
    answer: Answer<'a>,
    /// With end-to-end encryption, each part is sealed on its own.
    key: Option<&'a e2e::Key>,
    decoder: Decoder,
    /// Parts the server took.
    posted: u64,
    /// Bytes of the draft on the server (sealed, with a key).
    draft_bytes: usize,
    /// Whether streaming ended for this answer.
    stopped: bool,
}

impl<'a> Parts<'a> {
    pub fn new(client: &'a mut Client, answer: Answer<'a>, key: Option<&'a e2e::Key>) -> Self {
        Parts {
            client,
            answer,
            key,
            decoder: Decoder::default(),
            posted: 0,
            draft_bytes: 0,
            stopped: false,
        }
    }

    /// Posts what `batch` adds to the answer as its next part, if it adds
    /// anything that can be shown yet. Called by `command::run` for every
    /// batch of output.
    pub fn output(&mut self, batch: &[u8]) {
        if self.stopped {
            return;
        }
        let clear = self.decoder.push(batch);
        if clear.is_empty() {
            return;
        }
        let text = match self.key {
            None => clear,
            Some(key) => {
                let message = e2e::Message::Answer {
                    session: self.answer.session,
                    client_msg_id: self.answer.client_msg_id,
                    assistant_msg_id: self.answer.assistant_msg_id,
                };
                match key.seal(&clear, message) {
                    Ok(sealed) => sealed,
                    Err(why) => return self.stop_at_limit(&why),
                }
            }
        };
        if self.draft_bytes + text.len() > MAX_TEXT_BYTES {
            return self.stop_at_limit("the draft would pass the server's text limit");
        }
        let body = json!({
            "session_id": self.answer.session,
            "client_msg_id": self.answer.client_msg_id,
            "assistant_msg_id": self.answer.assistant_msg_id,
            "text": text,
            "partial": true,
        });
        let body = body.to_string().into_bytes();
        let result = self.client.request(
            "POST",
            "/response",
            Some(&body),
            Limit::within(PART_TIMEOUT),
        );
        match result {
            Ok(resp) if resp.status == 200 && resp.json().is_some_and(|v| v["partial"] == true) => {
                self.posted += 1;
                self.draft_bytes += text.len();
            }
            // A server without streamed answers ignores `partial` and
            // stores the part as the answer: nothing to do but say so.
            Ok(resp) if resp.status == 200 => {
                self.stopped = true;
                log::error!(client_msg_id = self.answer.client_msg_id; "the server stored a part as the whole answer: it does not take streamed parts (use --no-stream with it)");
            }
            Ok(resp) => self.stop_on_failure(&resp.describe()),
            Err(e) => self.stop_on_failure(&e.to_string()),
        }
    }

    /// The number of parts the server took.
    pub fn posted(&self) -> u64 {
        self.posted
    }

    fn stop_at_limit(&mut self, why: &str) {
        self.stopped = true;
        log::info!(client_msg_id = self.answer.client_msg_id, parts = self.posted, reason = why; "streaming stopped: the answer is posted whole when the command exits");
    }

    fn stop_on_failure(&mut self, why: &str) {
        self.stopped = true;
        log::warn!(client_msg_id = self.answer.client_msg_id, parts = self.posted, error = why; "a part was not posted: streaming stopped, the answer is posted whole when the command exits");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::client::Url;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// A server on one keep-alive connection that answers each request
    /// with the next of `replies` (status, body) and reports the bodies
    /// it got; the connection closes after the last reply.
    fn server(replies: Vec<(u16, &'static str)>) -> (Url, mpsc::Receiver<serde_json::Value>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (peer, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(peer.try_clone().unwrap());
            let mut writer = peer;
            for (status, body) in replies {
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                }
                let mut got = vec![0; length];
                reader.read_exact(&mut got).unwrap();
                tx.send(serde_json::from_slice(&got).unwrap()).unwrap();
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                writer.write_all(reply.as_bytes()).unwrap();
            }
        });
        (url, rx)
    }

    const TAKEN: &str = r#"{"ok":true,"assistant_msg_id":"a1","delivered":true,"partial":true}"#;
    const ANSWER: Answer = Answer {
        session: "s",
        client_msg_id: "m1",
        assistant_msg_id: "a1",
    };

    #[test]
    fn parts_are_posted_until_one_is_refused() {
        let (url, bodies) = server(vec![(200, TAKEN), (503, r#"{"error":"busy"}"#)]);
        let mut client = Client::new(url, None, None);
        let mut parts = Parts::new(&mut client, ANSWER, None);
        parts.output(b"Hello\n");
        parts.output(b"\n");
        parts.output(b"world");
        parts.output(b", again");
        assert_eq!(parts.posted(), 1);
        let first = bodies.recv().unwrap();
        assert_eq!(
            first,
            json!({"session_id": "s", "client_msg_id": "m1", "assistant_msg_id": "a1",
                   "text": "Hello", "partial": true})
        );
        assert_eq!(bodies.recv().unwrap()["text"], "\n\nworld");
        assert!(bodies.recv().is_err(), "nothing after the refusal");
    }

    #[test]
    fn a_server_that_stores_a_part_as_the_answer_gets_no_more() {
        let stored = r#"{"ok":true,"assistant_msg_id":"a1","delivered":true}"#;
        let (url, bodies) = server(vec![(200, stored)]);
        let mut client = Client::new(url, None, None);
        let mut parts = Parts::new(&mut client, ANSWER, None);
        parts.output(b"Hel");
        parts.output(b"lo");
        assert_eq!(parts.posted(), 0);
        assert_eq!(bodies.recv().unwrap()["text"], "Hel");
        assert!(bodies.recv().is_err());
    }

    #[test]
    fn a_draft_stops_before_the_text_limit() {
        let (url, bodies) = server(vec![(200, TAKEN), (200, TAKEN)]);
        let mut client = Client::new(url, None, None);
        let mut parts = Parts::new(&mut client, ANSWER, None);
        let half = "x".repeat(MAX_TEXT_BYTES / 2);
        parts.output(half.as_bytes());
        parts.output(half.as_bytes());
        parts.output(b"y");
        parts.output(b"z");
        assert_eq!(parts.posted(), 2);
        assert_eq!(bodies.iter().count(), 2);
    }

    #[test]
    fn encrypted_parts_are_one_token_each() {
        let (url, bodies) = server(vec![(200, TAKEN), (200, TAKEN)]);
        let key = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let mut client = Client::new(url, None, None);
        let mut parts = Parts::new(&mut client, ANSWER, Some(&key));
        parts.output(b"secret ");
        parts.output(b"words");
        let texts: Vec<String> = bodies
            .iter()
            .map(|b| b["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(texts.len(), 2);
        let message = e2e::Message::Answer {
            session: "s",
            client_msg_id: "m1",
            assistant_msg_id: "a1",
        };
        assert!(texts.iter().all(|t| !t.contains("secret")));
        let draft = texts.concat();
        assert_eq!(
            e2e::open_parts(&key, &draft, message).as_deref(),
            Some("secret words")
        );
    }
}
