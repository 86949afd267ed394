//! End-to-end encryption in the tools: prompt and answer texts travel and
//! are stored as `e2e1:<base64url(nonce, AES-256-GCM ciphertext and tag)>`,
//! so the server (and whoever runs it) never holds the clear text. The
//! associated data binds each ciphertext to its session and message ids:
//! moved into another session or message, it fails to decrypt. Metadata,
//! ids, timing and sizes stay in clear; `metadata.e2e` is `1`.
//!
//! The key is 32 random bytes in base64url (`relay key`). Nonces are 96
//! random bits per message, safe for far more messages than one key will
//! ever carry (the birthday bound is about 2^32 messages).

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::store::model::MAX_TEXT_BYTES;
use crate::token::{decode_vec, encode};

/// What an encrypted text starts with.
pub const PREFIX: &str = "e2e1:";
const KEY_BYTES: usize = 32;
const TAG_BYTES: usize = 16;
/// The longest clear text whose encrypted form still fits the server's
/// text limit: base64url of nonce, text and tag, after the prefix.
pub const MAX_CLEAR_BYTES: usize = (MAX_TEXT_BYTES - PREFIX.len()) / 4 * 3 - NONCE_LEN - TAG_BYTES;

/// A shared key, from `--e2e-key` or `RELAY_E2E_KEY`.
#[derive(Clone)]
pub struct Key(LessSafeKey);

/// Which message a text belongs to: its associated data.
#[derive(Clone, Copy, Debug)]
pub enum Message<'a> {
    Prompt {
        session: &'a str,
        client_msg_id: &'a str,
    },
    Answer {
        session: &'a str,
        client_msg_id: &'a str,
        assistant_msg_id: &'a str,
    },
}

impl Message<'_> {
    /// The associated data: a label, the kind, then each id with its
    /// length, so no two messages' data are the same bytes.
    fn aad(&self) -> Vec<u8> {
        let (kind, ids): (u8, &[&str]) = match self {
            Message::Prompt {
                session,
                client_msg_id,
            } => (b'p', &[session, client_msg_id]),
            Message::Answer {
                session,
                client_msg_id,
                assistant_msg_id,
            } => (b'a', &[session, client_msg_id, assistant_msg_id]),
        };
        let mut aad = b"relay e2e1 ".to_vec();
        aad.push(kind);
        for id in ids {
            aad.extend_from_slice(&(id.len() as u32).to_be_bytes());
            aad.extend_from_slice(id.as_bytes());
        }
        aad
    }
}

/// A new random key, as `relay key` prints it.
pub fn new_key() -> Result<String, String> {
    let mut bytes = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness available".to_string())?;
    Ok(encode(&bytes))
}

impl Key {
    /// The key in `text` (what `relay key` printed).
    pub fn parse(text: &str) -> Result<Key, String> {
        let bytes = decode_vec(text.trim().as_bytes())
            .filter(|b| b.len() == KEY_BYTES)
            .ok_or("the key must be 32 bytes in base64url, as relay key prints it")?;
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| "unusable key".to_string())?;
        Ok(Key(LessSafeKey::new(key)))
    }

    /// `text` encrypted for `message`; `Err` when the encrypted form would
    /// not fit the server's text limit.
    pub fn seal(&self, text: &str, message: Message) -> Result<String, String> {
        if text.len() > MAX_CLEAR_BYTES {
            return Err(format!(
                "encrypted, a text may hold at most {MAX_CLEAR_BYTES} bytes"
            ));
        }
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| "no randomness available".to_string())?;
        let mut body = text.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(message.aad()),
                &mut body,
            )
            .map_err(|_| "encryption failed".to_string())?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&body);
        Ok(format!("{PREFIX}{}", encode(&sealed)))
    }

    /// The clear text of `stored` for `message`; `None` when it is not an
    /// `e2e1:` text, was made with another key or for another message, or
    /// was altered.
    pub fn open(&self, stored: &str, message: Message) -> Option<String> {
        let raw = decode_vec(stored.strip_prefix(PREFIX)?.as_bytes())?;
        if raw.len() < NONCE_LEN + TAG_BYTES {
            return None;
        }
        let (nonce, body) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = body.to_vec();
        let clear = self
            .0
            .open_in_place(nonce, Aad::from(message.aad()), &mut body)
            .ok()?;
        String::from_utf8(clear.to_vec()).ok()
    }
}

/// The clear text of a streamed answer's draft: each part is sealed on
/// its own, with the answer's associated data, so a draft (a snapshot) is
/// their tokens one after the other. It is split before each `e2e1:`
/// (base64url has no `:`, so a `:` only ever ends the prefix) and every
/// token opened; `None` when one does not open, or the text does not start
/// with a token. An empty draft is an empty text.
pub fn open_parts(key: &Key, draft: &str, message: Message) -> Option<String> {
    if !draft.is_empty() && !draft.starts_with(PREFIX) {
        return None;
    }
    let mut clear = String::new();
    let mut rest = draft;
    while !rest.is_empty() {
        let end = rest[PREFIX.len()..]
            .find(PREFIX)
            .map_or(rest.len(), |at| at + PREFIX.len());
        clear.push_str(&key.open(&rest[..end], message)?);
        rest = &rest[end..];
    }
    Some(clear)
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
pub fn cut(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt<'a>(session: &'a str, id: &'a str) -> Message<'a> {
        Message::Prompt {
            session,
            client_msg_id: id,
        }
    }

    #[test]
    fn a_text_round_trips_and_only_for_its_own_message() {
        let key = Key::parse(&new_key().unwrap()).unwrap();
        let sealed = key.seal("hello, ünïcode", prompt("s", "m1")).unwrap();
        assert!(sealed.starts_with(PREFIX) && !sealed.contains("hello"));
        assert_eq!(
            key.open(&sealed, prompt("s", "m1")).as_deref(),
            Some("hello, ünïcode")
        );
        assert_eq!(key.open(&sealed, prompt("s2", "m1")), None, "other session");
        assert_eq!(key.open(&sealed, prompt("s", "m2")), None, "other message");
        let answer = Message::Answer {
            session: "s",
            client_msg_id: "m1",
            assistant_msg_id: "",
        };
        assert_eq!(key.open(&sealed, answer), None, "a prompt is no answer");
        let other = Key::parse(&new_key().unwrap()).unwrap();
        assert_eq!(other.open(&sealed, prompt("s", "m1")), None, "other key");
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 2;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(key.open(&altered, prompt("s", "m1")), None, "altered");
        assert_eq!(key.open("hello", prompt("s", "m1")), None, "clear text");
        assert_ne!(
            sealed,
            key.seal("hello, ünïcode", prompt("s", "m1")).unwrap(),
            "a fresh nonce each time"
        );
    }

    #[test]
    fn the_longest_clear_text_fits_the_servers_limit() {
        let key = Key::parse(&new_key().unwrap()).unwrap();
        let text = "x".repeat(MAX_CLEAR_BYTES);
        assert!(key.seal(&text, prompt("s", "m")).unwrap().len() <= MAX_TEXT_BYTES);
        assert!(key.seal(&format!("{text}x"), prompt("s", "m")).is_err());
    }

    #[test]
    fn keys_are_32_bytes_of_base64url() {
        let k = new_key().unwrap();
        assert_eq!(k.len(), 43);
        assert!(Key::parse(&k).is_ok());
        for bad in ["", "short", &k[..42], &format!("{k}A"), "+/+/"] {
            assert!(Key::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_draft_of_sealed_parts_opens_token_by_token() {
        let key = Key::parse(&new_key().unwrap()).unwrap();
        let answer = Message::Answer {
            session: "s",
            client_msg_id: "m1",
            assistant_msg_id: "a1",
        };
        let parts = ["Hel", "lo, ", "wörld"];
        let draft: String = parts.iter().map(|p| key.seal(p, answer).unwrap()).collect();
        assert_eq!(
            open_parts(&key, &draft, answer).as_deref(),
            Some("Hello, wörld")
        );
        let one = key.seal("Hello", answer).unwrap();
        assert_eq!(open_parts(&key, &one, answer).as_deref(), Some("Hello"));
        let other = Message::Answer {
            session: "s",
            client_msg_id: "m1",
            assistant_msg_id: "a2",
        };
        assert_eq!(open_parts(&key, &draft, other), None, "other answer");
        assert_eq!(open_parts(&key, &format!("x{draft}"), answer), None);
        assert_eq!(open_parts(&key, &format!("{draft}e2e1:"), answer), None);
        assert_eq!(open_parts(&key, "", answer).as_deref(), Some(""));
    }

    #[test]
    fn cut_keeps_whole_characters() {
        let mut s = "aé".to_string();
        assert!(cut(&mut s, 2));
        assert_eq!(s, "a");
        assert!(!cut(&mut s, 5));
    }
}
