//! `relay agent --context N`: the conversation a command is run for, as a
//! file of JSON lines, so a model gets it without calling the server.
//!
//! The agent reads the last `N` messages of the session up to and
//! including the prompt in hand (`GET /messages/{id}?after=…&limit=N`:
//! every stored message takes the next `seq`, so the `N` messages before a
//! prompt of `seq` s are exactly those above `s - N`), opens the texts it
//! has the key for, and writes one `/messages` entry (`{"type", "data"}`)
//! per line into a file only its user can read. The file is removed when
//! the command ends (dropping [`ContextFile`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::e2e;

/// The most messages `--context` takes: what one `GET /messages` returns.
pub const MAX_MESSAGES: u64 = 1000;

/// What a text that does not open with the key becomes, as the page shows it.
const CANNOT_DECRYPT: &str = "cannot decrypt";

/// The request for the `n` messages up to and including the prompt of
/// `seq`.
pub fn path(session: &str, seq: u64, n: u64) -> String {
    format!(
        "/messages/{session}?after={}&limit={n}",
        seq.saturating_sub(n)
    )
}

/// The JSON lines for a `GET /messages` answer: the entries up to `seq`
/// (a later one may have arrived since the prompt), with prompt and
/// answer texts opened when there is a key. Every other kind is kept as
/// it is.
pub fn lines(
    body: &[u8],
    session: &str,
    seq: u64,
    key: Option<&e2e::Key>,
) -> Result<String, String> {
    let page: Value =
        serde_json::from_slice(body).map_err(|e| format!("unreadable messages: {e}"))?;
    let messages = page["messages"]
        .as_array()
        .ok_or("unreadable messages: no \"messages\" list")?;
    let mut out = String::new();
    for message in messages {
        if message["data"]["seq"].as_u64().is_some_and(|s| s > seq) {
            continue;
        }
        let mut message = message.clone();
        if let Some(key) = key {
            open(&mut message, session, key);
        }
        out.push_str(&message.to_string());
        out.push('\n');
    }
    Ok(out)
}

/// Replaces an entry's sealed text by its clear text, or by "cannot
/// decrypt" when it was sealed with another key or for another message.
fn open(message: &mut Value, session: &str, key: &e2e::Key) {
    let kind = message["type"].as_str().unwrap_or_default().to_string();
    let data = &mut message["data"];
    let client_msg_id = data["client_msg_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let assistant_msg_id = data["assistant_msg_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (field, sealed_for) = match kind.as_str() {
        "prompt" => (
            "prompt",
            e2e::Message::Prompt {
                session,
                client_msg_id: &client_msg_id,
            },
        ),
        "assistant" => (
            "text",
            e2e::Message::Answer {
                session,
                client_msg_id: &client_msg_id,
                assistant_msg_id: &assistant_msg_id,
            },
        ),
        _ => return,
    };
    let Some(text) = data[field].as_str().filter(|t| t.starts_with(e2e::PREFIX)) else {
        return;
    };
    let clear = key
        .open(text, sealed_for)
        .unwrap_or_else(|| CANNOT_DECRYPT.to_string());
    data[field] = Value::String(clear);
}

/// The file `RELAY_CONTEXT_FILE` names while the command runs; removed on
/// drop. Created new (never an existing file or link) and readable by its
/// owner only: it may hold the clear text of an encrypted conversation.
pub struct ContextFile(PathBuf);

impl ContextFile {
    /// Writes `text` to a new file in the temporary directory.
    pub fn create(text: &str) -> std::io::Result<ContextFile> {
        let path = std::env::temp_dir().join(format!(
            "relay-context-{}.jsonl",
            uuid::Uuid::new_v4().simple()
        ));
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        // Removed again should the write fail.
        let file = ContextFile(path);
        out.write_all(text.as_bytes())?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ContextFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_window_ends_at_the_prompt() {
        assert_eq!(path("s", 7, 3), "/messages/s?after=4&limit=3");
        assert_eq!(path("s", 2, 20), "/messages/s?after=0&limit=20");
    }

    #[test]
    fn texts_open_with_the_key_and_later_messages_are_left_out() {
        let key = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let other = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let prompt = e2e::Message::Prompt {
            session: "s",
            client_msg_id: "p1",
        };
        let answer = e2e::Message::Answer {
            session: "s",
            client_msg_id: "p1",
            assistant_msg_id: "a1",
        };
        let page = json!({"messages": [
            {"type": "prompt", "data": {"client_msg_id": "p1", "seq": 1,
                "prompt": key.seal("hello", prompt).unwrap()}},
            {"type": "assistant", "data": {"client_msg_id": "p1", "assistant_msg_id": "a1",
                "seq": 2, "text": other.seal("hi", answer).unwrap()}},
            {"type": "cancel", "data": {"client_msg_id": "p1", "seq": 3}},
            {"type": "prompt", "data": {"client_msg_id": "p2", "seq": 4, "prompt": "later"}},
        ]});
        let body = page.to_string();
        let text = lines(body.as_bytes(), "s", 3, Some(&key)).unwrap();
        let got: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(got.len(), 3, "{text}");
        assert_eq!(got[0]["data"]["prompt"], "hello");
        assert_eq!(got[1]["data"]["text"], CANNOT_DECRYPT);
        assert_eq!(got[2], page["messages"][2]);
        let plain = lines(body.as_bytes(), "s", 4, None).unwrap();
        assert_eq!(plain.lines().count(), 4);
        assert!(plain.contains(e2e::PREFIX));
    }

    #[test]
    fn the_file_is_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let file = ContextFile::create("{}\n").unwrap();
        let path = file.path().to_path_buf();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(file);
        assert!(!path.exists());
    }
}
