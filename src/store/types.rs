//! The keys of the log: [`SessionId`], which session, and [`Seq`], a
//! message's place in its session's history; the queries of the reads;
//! the [`Ticket`] a write carries back to the request that asked. (The
//! writes are in `model.rs`.)

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

/// A session id that passed the contract's rule (1 to 128 characters from
/// `A-Z a-z 0-9 . _ ~ -`, see [`valid_session_id`]): the one way the server
/// holds a session id. Built only by [`SessionId::new`], where a route's
/// path or a body's `session_id` is checked, so every map key, record,
/// effect and connection holding one holds a valid id.
///
/// Inside is an `Arc<str>`. The same id is the key of the log and of local
/// presence, travels in effects, parked polls and subscribers, and crosses
/// to the storage thread in commands and records: a clone must not
/// allocate (`Box<str>` or `String` would copy the text each time) and the
/// value must be `Send` for the storage thread (which rules out `Rc`). An
/// uncontended atomic increment per clone is the price. It borrows as `str`
/// (hashing and comparing as its text), so maps keyed by it are looked up by
/// `&str`, and it derefs to `str` wherever text is wanted.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// The id, if `sid` is a valid one.
    pub fn new(sid: &str) -> Option<SessionId> {
        valid_session_id(sid).then(|| SessionId(Arc::from(sid)))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for SessionId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SessionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A message's place in its session's history: 1, 2, 3, … in the order the
/// session's messages were stored, never reused. `Seq(0)` stands before the
/// first message: it is "nothing yet" for a cursor, an `after`, or the
/// previous assistant message of the first one.
///
/// Numbers come in and go out as plain `u64` only at the edges: query
/// strings, JSON, SQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl Seq {
    /// The first message of a session.
    pub const FIRST: Seq = Seq(1);

    /// The number, for the edges (JSON, SQL, logs).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The place after this one. Saturates: an `after` from a query string
    /// may be `u64::MAX`, past anything stored.
    pub fn next(self) -> Seq {
        Seq(self.0.saturating_add(1))
    }

    /// The place before this one (`Seq(0)` stays put): where a cursor stands
    /// to read from `self` on.
    pub fn before(self) -> Seq {
        Seq(self.0.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_session_id_is_built_only_from_a_valid_id() {
        assert_eq!(SessionId::new("Ab0.-_~").as_deref(), Some("Ab0.-_~"));
        for bad in ["", "a b", "a/b", "é", &"a".repeat(129)] {
            assert!(SessionId::new(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_map_keyed_by_session_id_is_looked_up_by_str() {
        let sid = SessionId::new("s").unwrap();
        let mut m = HashMap::new();
        m.insert(sid.clone(), 1);
        assert_eq!(m.get("s"), Some(&1));
        assert_eq!(format!("{sid} {sid:?}"), "s \"s\"");
    }
}

/// Largest `prompt` or `text`, in bytes (and largest draft of a streamed
/// answer).
pub const MAX_TEXT_BYTES: usize = 128 * 1024;

/// Longest `session_id`.
pub const MAX_SESSION_ID: usize = 128;

/// Whether `sid` is 1 to 128 URL-unreserved characters.
pub fn valid_session_id(sid: &str) -> bool {
    !sid.is_empty()
        && sid.len() <= MAX_SESSION_ID
        && sid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

/// A connection's identity: slab key plus a generation, so a stale reference
/// to a reused slot never reaches the next connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub key: u32,
    pub generation: u32,
}

/// One request's claim on the result of its write: the connection it came
/// on and a number no other request shares. A result reaches the
/// connection only while it still waits under the same number, so a result
/// that comes after its request was answered (a storage timeout, a
/// shutdown) never becomes the answer to the next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub conn: ConnId,
    pub n: u64,
}

/// `GET /prompts` parameters, already validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptsQuery {
    pub timeout_ms: u64,
    pub wait: bool,
    pub after: Option<Seq>,
}

/// `GET /prompts` with no session (every session a token opens): the
/// parameters of one session's, with `after` a cursor (an arrival
/// number) and a page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EveryQuery {
    pub timeout_ms: u64,
    pub wait: bool,
    pub after: Option<u64>,
    pub limit: usize,
}

/// `GET /messages` parameters, already validated and clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessagesQuery {
    pub limit: usize,
    pub offset: usize,
    pub since: Option<u64>,
    pub after: Option<Seq>,
}

/// The sessions an all-sessions poll covers: what its token opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A server-wide token, or an open server.
    Every,
    /// A token for the sessions whose id starts with this.
    Prefix(Rc<str>),
    /// A token for one session.
    Session(SessionId),
}

impl Scope {
    /// Whether every session `other` covers, this one covers too.
    pub fn includes(&self, other: &Scope) -> bool {
        match (self, other) {
            (Scope::Every, _) => true,
            (Scope::Prefix(p), Scope::Prefix(q)) => q.starts_with(&**p),
            (_, Scope::Session(s)) => self.covers(s),
            _ => false,
        }
    }

    /// Whether the poll covers session `sid`.
    pub fn covers(&self, sid: &str) -> bool {
        match self {
            Scope::Every => true,
            Scope::Prefix(p) => sid.starts_with(&**p),
            Scope::Session(s) => s.as_str() == sid,
        }
    }
}

impl Scope {
    /// The scope as the engine names it to other instances: `*`, `p`
    /// and the prefix, or `s` and the session id.
    pub fn name(&self) -> String {
        match self {
            Scope::Every => "*".to_string(),
            Scope::Prefix(p) => format!("p{p}"),
            Scope::Session(s) => format!("s{s}"),
        }
    }

    /// A scope from its [`name`](Self::name).
    pub fn from_name(name: &str) -> Option<Scope> {
        match name.split_at_checked(1)? {
            ("*", "") => Some(Scope::Every),
            ("p", p) => Some(Scope::Prefix(Rc::from(p))),
            ("s", s) => SessionId::new(s).map(Scope::Session),
            _ => None,
        }
    }
}
