//! Tokens for one session, or for every session whose id starts with a
//! prefix: a role, the session id or prefix and an optional expiry,
//! signed with HMAC-SHA256 under `RELAY_TOKEN_SECRET`. The server checks
//! one with the secret alone (no table, no lookup); `relay token` mints
//! them with the same code.
//!
//! Layout, before base64url without padding (RFC 4648 section 5):
//!
//! ```text
//! version (1 byte: 1 for a session, 2 for a prefix) | role (1 byte: 'c' or 'a') |
//! expiry (8 bytes, big-endian Unix seconds; 0: never) |
//! session id or prefix (1 to 128 bytes) | HMAC-SHA256 tag (32 bytes) of all before it
//! ```
//!
//! A prefix token is a version of its own rather than a flag beside the
//! session id, so every token minted before it keeps its bytes and
//! verifies as it did, and a server that knows only version 1 refuses a
//! prefix token instead of reading its prefix as a session.
//!
//! The alphabet (`A-Z a-z 0-9 - _`) is safe in a URL, a header and a
//! WebSocket subprotocol name (`bearer.<token>`). Any changed, missing or
//! added byte fails the tag, which `ring::hmac::verify` compares in
//! constant time; only then is the content read. Only one encoding of a
//! given token decodes (no padding, no stray bits), so a token cannot be
//! respelled. A leaf: it imports nothing of ours.

use ring::hmac;

/// Fewest bytes a secret may have: as many as the tag, so guessing the
/// secret is no easier than guessing a tag.
pub const MIN_SECRET_BYTES: usize = 32;

/// A token for one session.
const VERSION: u8 = 1;
/// A token for the sessions whose id starts with a prefix.
const VERSION_PREFIX: u8 = 2;
const TAG_BYTES: usize = 32;
/// Version, role and expiry.
const HEADER_BYTES: usize = 10;
/// The longest session id (the contract's rule).
const MAX_SESSION_BYTES: usize = 128;
/// The longest decoded token.
const MAX_RAW_BYTES: usize = HEADER_BYTES + MAX_SESSION_BYTES + TAG_BYTES;
/// The longest token, in characters.
pub const MAX_TOKEN_CHARS: usize = (MAX_RAW_BYTES * 4).div_ceil(3);

/// The role a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Agent,
}

impl Role {
    /// `client` or `agent`, as `relay token --role` spells it.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "client" => Some(Role::Client),
            "agent" => Some(Role::Agent),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Agent => "agent",
        }
    }

    fn byte(self) -> u8 {
        match self {
            Role::Client => b'c',
            Role::Agent => b'a',
        }
    }

    fn from_byte(b: u8) -> Option<Role> {
        match b {
            b'c' => Some(Role::Client),
            b'a' => Some(Role::Agent),
            _ => None,
        }
    }
}

/// The signing key made from `RELAY_TOKEN_SECRET`. Its `Debug` shows
/// nothing of the secret.
#[derive(Clone)]
pub struct Secret(hmac::Key);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What a token that verified says. The session id (or prefix) is kept
/// inline, so checking a token allocates nothing.
#[derive(Clone, Copy)]
pub struct Claims {
    pub role: Role,
    /// Unix seconds at which the token stops working; `None`: never.
    pub expires: Option<u64>,
    /// The token opens every session whose id starts with `session`.
    pub prefix: bool,
    session: [u8; MAX_SESSION_BYTES],
    session_len: u8,
}

impl Claims {
    /// The session the token is for, or the prefix of the sessions.
    pub fn session(&self) -> &str {
        // Only session-id characters (ASCII) are ever copied in (`open`).
        std::str::from_utf8(&self.session[..usize::from(self.session_len)]).unwrap_or("")
    }

    /// Whether the token opens session `sid`, compared in time that
    /// depends only on the lengths.
    pub fn opens(&self, sid: &str) -> bool {
        let mine = self.session().as_bytes();
        let sid = sid.as_bytes();
        if self.prefix {
            sid.len() >= mine.len() && same(mine, &sid[..mine.len()])
        } else {
            same(mine, sid)
        }
    }

    /// Whether the token no longer works at `unix_s`.
    pub fn expired(&self, unix_s: u64) -> bool {
        self.expires.is_some_and(|at| unix_s >= at)
    }
}

/// Equal bytes, in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claims")
            .field("role", &self.role)
            .field("prefix", &self.prefix)
            .field("session", &self.session())
            .field("expires", &self.expires)
            .finish()
    }
}

/// Not a token this secret signed: malformed, truncated, altered, or
/// signed with another secret. Deliberately says no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid;

impl Secret {
    /// The key for a secret of at least [`MIN_SECRET_BYTES`] bytes (used
    /// as given: any bytes, e.g. `openssl rand -base64 32`). Called once at
    /// start, and by `relay token`.
    pub fn new(secret: &[u8]) -> Result<Secret, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the secret must be at least {MIN_SECRET_BYTES} bytes (it has {}); \
                 `openssl rand -base64 32` makes one",
                secret.len()
            ));
        }
        Ok(Secret(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// A token for `role` in `session` (a valid session id), working until
    /// `expires` (Unix seconds) or forever.
    pub fn mint(&self, role: Role, session: &str, expires: Option<u64>) -> String {
        self.mint_scoped(VERSION, role, session, expires)
    }

    /// A token for `role` in every session whose id starts with `prefix`
    /// (1 to 128 session-id characters), working until `expires` or
    /// forever.
    pub fn mint_prefix(&self, role: Role, prefix: &str, expires: Option<u64>) -> String {
        self.mint_scoped(VERSION_PREFIX, role, prefix, expires)
    }

    fn mint_scoped(&self, version: u8, role: Role, session: &str, expires: Option<u64>) -> String {
        debug_assert!(valid_session(session.as_bytes()), "{session}");
        let mut raw = Vec::with_capacity(MAX_RAW_BYTES);
        raw.push(version);
        raw.push(role.byte());
        raw.extend_from_slice(&expires.unwrap_or(0).to_be_bytes());
        raw.extend_from_slice(session.as_bytes());
        let tag = hmac::sign(&self.0, &raw);
        raw.extend_from_slice(tag.as_ref());
        encode(&raw)
    }

    /// Verifies `token` and returns what it says. Nothing of its content
    /// is trusted, or even looked at, before its tag checked.
    pub fn open(&self, token: &str) -> Result<Claims, Invalid> {
        let mut buf = [0u8; MAX_RAW_BYTES];
        let raw = decode(token.as_bytes(), &mut buf).ok_or(Invalid)?;
        if raw.len() < HEADER_BYTES + 1 + TAG_BYTES {
            return Err(Invalid);
        }
        let (signed, tag) = raw.split_at(raw.len() - TAG_BYTES);
        hmac::verify(&self.0, signed, tag).map_err(|_| Invalid)?;
        let (header, session) = signed.split_at(HEADER_BYTES);
        let prefix = match header[0] {
            VERSION => false,
            VERSION_PREFIX => true,
            _ => return Err(Invalid),
        };
        if !valid_session(session) {
            return Err(Invalid);
        }
        let role = Role::from_byte(header[1]).ok_or(Invalid)?;
        let mut at = [0u8; 8];
        at.copy_from_slice(&header[2..HEADER_BYTES]);
        let expires = match u64::from_be_bytes(at) {
            0 => None,
            at => Some(at),
        };
        let mut claims = Claims {
            role,
            expires,
            prefix,
            session: [0; MAX_SESSION_BYTES],
            session_len: session.len() as u8,
        };
        claims.session[..session.len()].copy_from_slice(session);
        Ok(claims)
    }
}

/// The contract's session-id rule, on bytes.
fn valid_session(s: &[u8]) -> bool {
    (1..=MAX_SESSION_BYTES).contains(&s.len())
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64url without padding (also the end-to-end ciphertexts' encoding).
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity((bytes.len() * 4).div_ceil(3));
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// The value of one base64url character.
fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => return None,
    }))
}

/// Decodes a token's canonical base64url into `out`: `None` for anything
/// [`decode_each`] refuses, or more bytes than `out` holds.
fn decode<'a>(text: &[u8], out: &'a mut [u8; MAX_RAW_BYTES]) -> Option<&'a [u8]> {
    if text.len() > MAX_TOKEN_CHARS {
        return None;
    }
    let mut len = 0;
    decode_each(text, |b| {
        *out.get_mut(len)? = b;
        len += 1;
        Some(())
    })?;
    Some(&out[..len])
}

/// Decodes canonical base64url without padding, of any length.
pub fn decode_vec(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    decode_each(text, |b| {
        out.push(b);
        Some(())
    })?;
    Some(out)
}

/// Hands each byte of canonical base64url without padding to `push`:
/// `None` for any other character, a length no encoding has, bits left
/// over that are not zero (a second spelling), or when `push` refuses.
fn decode_each(text: &[u8], mut push: impl FnMut(u8) -> Option<()>) -> Option<()> {
    if text.len() % 4 == 1 {
        return None;
    }
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= sextet(c)? << (18 - 6 * i);
        }
        let bytes = chunk.len() - 1; // 2 characters: 1 byte, 3: 2, 4: 3
        if n & (0xff_ffff >> (8 * bytes)) != 0 {
            return None; // leftover bits set: a second spelling
        }
        for i in 0..bytes {
            push((n >> (16 - 8 * i)) as u8)?;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn secret() -> Secret {
        Secret::new(SECRET).unwrap()
    }

    #[test]
    fn a_secret_needs_32_bytes() {
        let e = Secret::new(&SECRET[..31]).unwrap_err();
        assert!(e.contains("32 bytes") && e.contains("31"), "{e}");
        assert!(Secret::new(SECRET).is_ok());
        assert_eq!(format!("{:?}", secret()), "Secret(..)");
    }

    #[test]
    fn a_minted_token_opens_with_its_claims() {
        let s = secret();
        for (role, sid, exp) in [
            (Role::Client, "demo", None),
            (Role::Agent, "a.b_c~d-e", Some(1_900_000_000)),
            (Role::Client, &"x".repeat(128)[..], Some(1)),
        ] {
            let t = s.mint(role, sid, exp);
            assert!(t.len() <= MAX_TOKEN_CHARS);
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t}"
            );
            let c = s.open(&t).unwrap();
            assert_eq!((c.role, c.session(), c.expires), (role, sid, exp));
        }
    }

    #[test]
    fn a_prefix_token_opens_the_sessions_under_its_prefix() {
        let s = secret();
        let t = s.mint_prefix(Role::Client, "team-", Some(7));
        let c = s.open(&t).unwrap();
        assert!(c.prefix);
        assert_eq!(
            (c.role, c.session(), c.expires),
            (Role::Client, "team-", Some(7))
        );
        assert!(c.opens("team-") && c.opens("team-a1"));
        assert!(!c.opens("team") && !c.opens("other") && !c.opens("xteam-a"));
        // A token for one session stays one: no prefix reading.
        let one = s.open(&s.mint(Role::Client, "team-", None)).unwrap();
        assert!(!one.prefix && one.opens("team-") && !one.opens("team-a1"));
        // A version 1 token minted before prefixes existed still opens.
        let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET);
        let raw = [&[1u8, b'a'][..], &[0; 8], b"demo"].concat();
        let old = encode(&[&raw[..], hmac::sign(&key, &raw).as_ref()].concat());
        assert_eq!(old, s.mint(Role::Agent, "demo", None));
    }

    #[test]
    fn expiry_is_exclusive() {
        let c = secret()
            .open(&secret().mint(Role::Agent, "s", Some(100)))
            .unwrap();
        assert!(!c.expired(99));
        assert!(c.expired(100));
        let c = secret()
            .open(&secret().mint(Role::Agent, "s", None))
            .unwrap();
        assert!(!c.expired(u64::MAX));
    }

    #[test]
    fn forged_truncated_extended_or_foreign_tokens_are_invalid() {
        let s = secret();
        let t = s.mint(Role::Client, "demo", Some(2_000_000_000));
        for i in 0..t.len() {
            let mut b = t.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let forged = String::from_utf8(b).unwrap();
            assert_eq!(s.open(&forged).unwrap_err(), Invalid, "changed at {i}");
        }
        for n in 0..t.len() {
            assert_eq!(s.open(&t[..n]).unwrap_err(), Invalid, "first {n} chars");
        }
        assert_eq!(s.open(&format!("{t}A")).unwrap_err(), Invalid);
        assert_eq!(s.open(&format!("{t}AA")).unwrap_err(), Invalid);
        let other = Secret::new(b"another secret of at least 32 bytes!").unwrap();
        assert_eq!(other.open(&t).unwrap_err(), Invalid);
        for junk in ["", "=", "abc=", "a+b/", &"A".repeat(10_000)] {
            assert_eq!(s.open(junk).unwrap_err(), Invalid, "{junk}");
        }
    }

    #[test]
    fn a_respelled_token_is_invalid() {
        // The last character carries bits past the end; setting them keeps
        // the bytes but changes the text: refused.
        let s = secret();
        let t = s.mint(Role::Client, "demo", None);
        assert_ne!(t.len() % 4, 0, "this session's token ends mid-group");
        let last = t.as_bytes()[t.len() - 1];
        let v = sextet(last).unwrap();
        let respelled = format!(
            "{}{}",
            &t[..t.len() - 1],
            char::from(ALPHABET[(v | 1) as usize])
        );
        assert_ne!(respelled, t);
        assert_eq!(s.open(&respelled).unwrap_err(), Invalid);
    }

    #[test]
    fn signed_content_that_breaks_the_rules_is_refused() {
        // A tag over a bad version, role or session id, as a holder of the
        // secret could make: still refused.
        let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET);
        let sign = |raw: &[u8]| {
            let mut v = raw.to_vec();
            v.extend_from_slice(hmac::sign(&key, raw).as_ref());
            encode(&v)
        };
        let s = secret();
        let ok = [&[1u8, b'c'][..], &[0; 8], b"demo"].concat();
        assert!(s.open(&sign(&ok)).is_ok());
        for bad in [
            [&[3u8, b'c'][..], &[0; 8], b"demo"].concat(),
            [&[2u8, b'c'][..], &[0; 8], b"de/mo"].concat(),
            [&[1u8, b'x'][..], &[0; 8], b"demo"].concat(),
            [&[1u8, b'c'][..], &[0; 8], b"de/mo"].concat(),
        ] {
            assert_eq!(s.open(&sign(&bad)).unwrap_err(), Invalid);
        }
    }

    #[test]
    fn base64url_round_trips_every_length() {
        let data: Vec<u8> = (0..=255u8).collect();
        let mut buf = [0u8; MAX_RAW_BYTES];
        for n in 0..MAX_RAW_BYTES {
            let e = encode(&data[..n]);
            assert_eq!(decode(e.as_bytes(), &mut buf), Some(&data[..n]), "{n}");
        }
        assert_eq!(encode(b"\xfb\xff"), "-_8");
    }
}
