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
//!
//! The texts of a question from the agent (its text, choices, default and
//! the person's reply) are sealed deterministically instead
//! ([`Key::seal_fixed`]): the nonce is an HMAC of the associated data and
//! the text, under a key derived from the shared one. The same choice of
//! the same ask is then the same ciphertext wherever it is sealed, so the
//! server can check a reply against the choices byte for byte, and a retry
//! sends the very bytes of the first attempt (a duplicate, not a
//! conflict). Different texts get different nonces; equal ciphertexts
//! reveal only that the texts are equal, within one ask and one role.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
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

/// What the deterministic nonces' key is derived with (see
/// [`Key::seal_fixed`]): HMAC-SHA256 of this label under the shared key.
const FIXED_NONCE_LABEL: &[u8] = b"relay e2e1 fixed nonce";

/// The longest clear text whose encrypted form fits in `limit` bytes
/// (an ask's choice, at most 256 bytes on the wire, holds 160 in clear).
pub const fn max_clear_within(limit: usize) -> usize {
    ((limit - PREFIX.len()) * 3 / 4).saturating_sub(NONCE_LEN + TAG_BYTES)
}

/// A shared key, from `--e2e-key` or `RELAY_E2E_KEY`.
#[derive(Clone)]
pub struct Key {
    aead: LessSafeKey,
    /// Derives the nonces of [`Key::seal_fixed`]: a key of its own, so
    /// that the nonces tell nothing about the AES key.
    nonces: hmac::Key,
    /// The key as given, for a command that needs it too (`relay agent`
    /// hands it to its command for `relay ask`).
    text: String,
}

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
    /// The text of a question from the agent.
    Ask { session: &'a str, ask_id: &'a str },
    /// One of an ask's choices; the reply that picks it is the same bytes.
    Choice { session: &'a str, ask_id: &'a str },
    /// The default of an ask without choices.
    Default { session: &'a str, ask_id: &'a str },
    /// The person's reply to an ask without choices.
    Reply { session: &'a str, ask_id: &'a str },
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
            Message::Ask { session, ask_id } => (b'q', &[session, ask_id]),
            Message::Choice { session, ask_id } => (b'c', &[session, ask_id]),
            Message::Default { session, ask_id } => (b'd', &[session, ask_id]),
            Message::Reply { session, ask_id } => (b'r', &[session, ask_id]),
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
        let shared = hmac::Key::new(hmac::HMAC_SHA256, &bytes);
        let derived = hmac::sign(&shared, FIXED_NONCE_LABEL);
        Ok(Key {
            aead: LessSafeKey::new(key),
            nonces: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
            text: text.trim().to_string(),
        })
    }

    /// The key as it was given (base64url), to hand on to a command.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// `text` encrypted for `message` with a random nonce; `Err` when the
    /// encrypted form would not fit the server's text limit.
    pub fn seal(&self, text: &str, message: Message) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| "no randomness available".to_string())?;
        self.seal_with(nonce, text, &message.aad())
    }

    /// `text` encrypted for `message` with a nonce derived from both (a
    /// synthetic nonce, as in SIV modes): the first 96 bits of
    /// HMAC-SHA256, under a key derived from the shared one, of the
    /// associated data's length, the associated data and the text. Sealing
    /// the same text for the same message again gives the same bytes, so
    /// it is used for the texts of an ask, which the server compares (the
    /// choices and the reply that picks one) or takes again on a retry
    /// only if unchanged. Two different texts would share a nonce only if
    /// their HMACs collided in 96 bits.
    pub fn seal_fixed(&self, text: &str, message: Message) -> Result<String, String> {
        let aad = message.aad();
        let mut ctx = hmac::Context::with_key(&self.nonces);
        ctx.update(&(aad.len() as u32).to_be_bytes());
        ctx.update(&aad);
        ctx.update(text.as_bytes());
        let tag = ctx.sign();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&tag.as_ref()[..NONCE_LEN]);
        self.seal_with(nonce, text, &aad)
    }

    fn seal_with(&self, nonce: [u8; NONCE_LEN], text: &str, aad: &[u8]) -> Result<String, String> {
        if text.len() > MAX_CLEAR_BYTES {
            return Err(format!(
                "encrypted, a text may hold at most {MAX_CLEAR_BYTES} bytes"
            ));
        }
        let mut body = text.as_bytes().to_vec();
        self.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
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
            .aead
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
    fn the_texts_of_an_ask_seal_to_the_same_bytes_each_time() {
        let key = Key::parse(&new_key().unwrap()).unwrap();
        let choice = |ask_id| Message::Choice {
            session: "s",
            ask_id,
        };
        let yes = key.seal_fixed("yes", choice("k1")).unwrap();
        assert_eq!(yes, key.seal_fixed("yes", choice("k1")).unwrap());
        assert_eq!(key.open(&yes, choice("k1")).as_deref(), Some("yes"));
        assert_ne!(yes, key.seal_fixed("no", choice("k1")).unwrap());
        // Another ask, role or key: other bytes, and it opens only as its own.
        assert_ne!(yes, key.seal_fixed("yes", choice("k2")).unwrap());
        assert_eq!(key.open(&yes, choice("k2")), None);
        let reply = Message::Reply {
            session: "s",
            ask_id: "k1",
        };
        assert_ne!(yes, key.seal_fixed("yes", reply).unwrap());
        assert_eq!(key.open(&yes, reply), None, "a choice is no free reply");
        let other = Key::parse(&new_key().unwrap()).unwrap();
        assert_ne!(yes, other.seal_fixed("yes", choice("k1")).unwrap());
        // Different texts never share a nonce (the first 12 bytes).
        let nonce =
            |sealed: &str| decode_vec(&sealed.as_bytes()[PREFIX.len()..]).unwrap()[..12].to_vec();
        assert_ne!(
            nonce(&yes),
            nonce(&key.seal_fixed("no", choice("k1")).unwrap())
        );
    }

    #[test]
    fn the_longest_choice_fits_its_limit_sealed() {
        let key = Key::parse(&new_key().unwrap()).unwrap();
        let max = max_clear_within(256);
        assert_eq!(max, 160);
        let choice = Message::Choice {
            session: "s",
            ask_id: "k",
        };
        assert!(key.seal_fixed(&"x".repeat(max), choice).unwrap().len() <= 256);
        assert!(key.seal_fixed(&"x".repeat(max + 1), choice).unwrap().len() > 256);
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
