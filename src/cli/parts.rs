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
use crate::relay::model::MAX_TEXT_BYTES;

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
