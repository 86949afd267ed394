//! Each write as one call of the script, and the script's answer read
//! back as the requester's outcome: what an operation adds on Redis's
//! side, beside its rule in `relay.lua`. Redis decides; the reply carries
//! a status (`ok`, `dup`, or a refusal's code) and what the caller's copy
//! of the session lacks.

use redis_protocol::resp2::types::OwnedFrame;

use super::pipeline::{Gathered, MAX_BATCH};
use super::reply::parse_snapshot;
use super::route::{Answered, Expect, Then};
use super::{Known, RedisStore};
use crate::error::ApiError;
use crate::store::asks::{AskParts, reply_data};
use crate::store::mem::id_and_literal;
use crate::store::message::{Parts, cancel_data};
use crate::store::model::{NewAsk, NewCancel, NewReply, NewResponse, Write as Change};
use crate::store::record::Outcome;
use crate::store::types::{MAX_TEXT_BYTES, Seq, SessionId, Ticket};
use crate::wire::decoded_len;

/// The script's operations (its `op` argument), and what each needs of
/// its call: a new operation is one more line in each match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Prompt,
    /// Several prompts of one turn, in one call (see `send_batch`).
    Prompts,
    Response,
    Part,
    Cancel,
    Create,
    Delete,
    Sync,
    /// A read after a failover that gives the session a new epoch where
    /// the caller's copy holds more than Redis (`relay.lua`).
    Renew,
    Agent,
    Watch,
    Touch,
    Collect,
    Probe,
    Ask,
    Reply,
    /// An all-sessions read (`every.rs`).
    Every,
    /// This instance's agent of every session a scope covers.
    EveryAgent,
}

/// Which of the library's functions runs an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Function {
    /// Refused up front while Redis is out of memory.
    Write,
    /// `no-writes`: runs out of memory too.
    Read,
    /// `allow-oom`: only deletes (or, `renew`, sets two short fields), so
    /// it runs out of memory too.
    Delete,
}

/// A key a call may touch in cluster mode, after the bucket's base
/// (`<prefix>{<tag>}`): the session's own keys, then the bucket's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Key {
    /// `s:<sid>`, the session.
    S,
    /// `w:<sid>`, its instances with subscribers.
    W,
    /// `d:<sid>`, its drafts.
    D,
    /// `g:<sid>`, its agent states.
    G,
    Sessions,
    Pending,
    Arrived,
    Generation,
    /// The agents of every session (bucket 0's).
    Agents,
}

impl Key {
    /// What follows the base; a session's keys end with its id.
    pub(super) fn suffix(self) -> (&'static [u8], bool) {
        match self {
            Key::S => (b"s:", true),
            Key::W => (b"w:", true),
            Key::D => (b"d:", true),
            Key::G => (b"g:", true),
            Key::Sessions => (b"sessions", false),
            Key::Pending => (b"pending", false),
            Key::Arrived => (b"arrived", false),
            Key::Generation => (b"generation", false),
            Key::Agents => (b"agents", false),
        }
    }
}

impl Op {
    /// In cluster mode, every key a call of this op may read or write,
    /// declared so that Redis Cluster can tell, while the bucket's slot
    /// migrates, whether the call runs where the slot was or where it
    /// goes; the first routes it. The script reads a session's hash, the
    /// bucket's sessions and the session's watchers at positions 1 to 3
    /// (`s`, `all`, `w`), so an op that reads the watchers names them
    /// third; the others put there a key they touch anyway. `prompts`
    /// names its keys itself (`send_batch`).
    pub(super) fn cluster_keys(self) -> &'static [Key] {
        use Key::*;
        match self {
            Op::Prompt | Op::Prompts => &[S, Sessions, Pending, Arrived, Generation],
            Op::Response | Op::Cancel => &[S, Sessions, W, Pending, D, Generation],
            Op::Part => &[S, Sessions, W, D, Generation],
            Op::Ask | Op::Reply | Op::Create => &[S, Sessions, Generation],
            Op::Agent => &[G],
            Op::Delete => &[S, Sessions, W, Pending, D, G, Generation],
            Op::Sync | Op::Renew => &[S, Sessions, D, G, Generation],
            Op::Watch => &[S, Sessions, W],
            Op::Touch => &[Sessions],
            // And the keys of the idle sessions it finds, which no call
            // can name before: it reads them all before it deletes any.
            Op::Collect => &[Sessions, Pending],
            Op::Probe => &[Generation],
            // And the hashes of the sessions it lists (read only).
            Op::Every => &[Pending, Arrived],
            Op::EveryAgent => &[Agents],
        }
    }

    /// The name the script dispatches on.
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Prompt => "prompt",
            Op::Prompts => "prompts",
            Op::Response => "response",
            Op::Part => "part",
            Op::Cancel => "cancel",
            Op::Create => "create",
            Op::Delete => "delete",
            Op::Sync => "sync",
            Op::Renew => "renew",
            Op::Agent => "agent",
            Op::Watch => "watch",
            Op::Touch => "touch",
            Op::Collect => "collect",
            Op::Probe => "probe",
            Op::Ask => "ask",
            Op::Reply => "reply",
            Op::Every => "every",
            Op::EveryAgent => "everyagent",
        }
    }

    pub(super) fn function(self) -> Function {
        match self {
            Op::Sync => Function::Read,
            // A read that drops the entries it finds stale: it only
            // deletes.
            Op::Delete | Op::Collect | Op::Every => Function::Delete,
            // A read after a failover that may set the epoch (two short
            // fields): run out of memory too, or the session would not
            // be read again.
            Op::Renew => Function::Delete,
            _ => Function::Write,
        }
    }

    /// Whether it may create a session (or the store's generation): its
    /// call then carries a new epoch (`prompts`: one per prompt).
    pub(super) fn creates(self) -> bool {
        matches!(
            self,
            Op::Prompt | Op::Prompts | Op::Create | Op::Probe | Op::Renew
        )
    }
}

/// What a write's answer is read as (see [`RedisStore::written`]).
#[derive(Debug)]
pub(super) enum Write {
    Prompt {
        id: String,
    },
    Response {
        id: String,
    },
    Part {
        id: String,
    },
    /// A cancel of the prompt `id`.
    Cancel {
        id: String,
    },
    Create {
        put: bool,
    },
    Delete,
    /// An ask: its id, and its `expires_ts` when stored now.
    Ask {
        id: String,
        expires_ts: u64,
    },
    Reply {
        ask_id: String,
    },
}

impl RedisStore {
    /// Sends `w` as its script call under the ticket `ticket` issues, with
    /// what the copy holds of its session (`known`). A deletion of an
    /// invalid session id is refused `404` here, before any ticket.
    pub(super) fn send(
        &mut self,
        ticket: impl FnOnce() -> Ticket,
        w: &Change,
        known: Known,
        unix_ms: u64,
    ) -> Result<(), ApiError> {
        match w {
            Change::Prompt(p) => {
                let (id, literal) = id_and_literal(p.client_msg_id.clone(), &mut self.ids);
                let ts = p.ts.unwrap_or(unix_ms);
                let head = head_of(&Parts {
                    session_id: &p.session_id,
                    id_literal: &literal,
                    prompt_id: None,
                    text: &p.prompt,
                    metadata: p.metadata.as_deref(),
                    ts,
                    seq: Seq(0),
                });
                self.prompt(ticket(), &p.session_id, id, head, ts, known);
            }
            Change::Response(r) => self.response(ticket(), r, known, unix_ms),
            Change::Part(r) => self.part(ticket(), r, known),
            Change::Cancel(c) => self.cancel(ticket(), c, known, unix_ms),
            Change::Ask(a) => self.ask(ticket(), a, known, unix_ms),
            Change::Reply(r) => self.reply(ticket(), r, known, unix_ms),
            Change::Create { sid, put } => {
                let expect = Expect::Write {
                    conn: ticket(),
                    sid: sid.clone().into_owned(),
                    write: Write::Create { put: *put },
                };
                self.call(sid, Op::Create, known, &[], expect);
            }
            Change::Delete { sid } => {
                let sid = SessionId::new(sid).ok_or_else(ApiError::session_not_found)?;
                let expect = Expect::Write {
                    conn: ticket(),
                    sid: sid.clone(),
                    write: Write::Delete,
                };
                self.call(&sid, Op::Delete, Known::default(), &[], expect);
            }
        }
        Ok(())
    }

    /// `POST /prompt`: `head` is the message's `data` up to its `seq`.
    /// Gathered with the turn's other prompts into one call, sent at the
    /// end of the turn, before any other call, or when full.
    #[inline(never)]
    fn prompt(
        &mut self,
        conn: Ticket,
        sid: &SessionId,
        id: String,
        head: String,
        ts: u64,
        known: Known,
    ) {
        if !self.cmd.up {
            let expect = Expect::Write {
                conn,
                sid: sid.clone(),
                write: Write::Prompt { id },
            };
            self.fail(expect, ApiError::storage_unavailable());
            return;
        }
        let record = record("P", &id, "", ts, &head);
        self.batch.push(Gathered {
            conn,
            sid: sid.clone(),
            id,
            record,
            known_epoch: known.epoch.to_string(),
            known_next: known.next,
        });
        if self.batch.len() >= MAX_BATCH {
            self.send_batch();
        }
    }

    /// `POST /response`.
    #[inline(never)]
    fn response(&mut self, conn: Ticket, r: &NewResponse, known: Known, unix_ms: u64) {
        let given = r.assistant_msg_id.is_some();
        let (id, literal) = id_and_literal(r.assistant_msg_id.clone(), &mut self.ids);
        let ts = r.ts.unwrap_or(unix_ms);
        let text = &*r.text;
        let head = head_of(&Parts {
            session_id: &r.session_id,
            id_literal: &literal,
            prompt_id: Some(&r.client_msg_id),
            text,
            metadata: r.metadata.as_deref(),
            ts,
            seq: Seq(0),
        });
        let record = record("A", &r.client_msg_id, &id, ts, &head);
        let given: &[u8] = if given { b"1" } else { b"0" };
        let extra: [&[u8]; 5] = [
            r.client_msg_id.as_bytes(),
            id.as_bytes(),
            given,
            text.as_bytes(),
            record.as_bytes(),
        ];
        let expect = Expect::Write {
            conn,
            sid: r.session_id.clone(),
            write: Write::Response { id: id.clone() },
        };
        self.call(&r.session_id, Op::Response, known, &extra, expect);
    }

    /// A part of a streamed answer (`"partial": true`): appended to its
    /// draft in Redis and published to every instance.
    fn part(&mut self, conn: Ticket, r: &NewResponse, known: Known) {
        let id = r.assistant_msg_id.as_ref().map_or("", |(id, _)| &**id);
        let text = &*r.text;
        let bytes = decoded_len(text).to_string();
        let timeout = self.limits.draft_timeout_ms.to_string();
        let max = MAX_TEXT_BYTES.to_string();
        let extra: [&[u8]; 6] = [
            r.client_msg_id.as_bytes(),
            id.as_bytes(),
            text.as_bytes(),
            bytes.as_bytes(),
            timeout.as_bytes(),
            max.as_bytes(),
        ];
        let expect = Expect::Write {
            conn,
            sid: r.session_id.clone(),
            write: Write::Part { id: id.to_string() },
        };
        self.call(&r.session_id, Op::Part, known, &extra, expect);
    }

    /// `POST /cancel`: the script decides it, stores the record and
    /// ends the prompt's drafts.
    fn cancel(&mut self, conn: Ticket, c: &NewCancel, known: Known, unix_ms: u64) {
        let ts = c.ts.unwrap_or(unix_ms);
        let mut head = cancel_data(
            &c.session_id,
            &c.client_msg_id,
            c.reason.as_deref(),
            ts,
            Seq(0),
        );
        head.truncate(head.len() - 2); // ends in `"seq":0}`
        let record = record("X", &c.client_msg_id, "", ts, &head);
        let extra: [&[u8]; 2] = [c.client_msg_id.as_bytes(), record.as_bytes()];
        let expect = Expect::Write {
            conn,
            sid: c.session_id.clone(),
            write: Write::Cancel {
                id: c.client_msg_id.to_string(),
            },
        };
        self.call(&c.session_id, Op::Cancel, known, &extra, expect);
    }

    /// The answer to a write: the requester's reply and the session.
    #[inline(never)]
    pub(super) fn written(
        &mut self,
        conn: Ticket,
        sid: SessionId,
        write: Write,
        frame: OwnedFrame,
    ) -> Result<(), String> {
        let bucket = self.bucket(&sid);
        let parsed = parse_snapshot(sid.clone(), frame, bucket, &mut self.health);
        let ((status, extra), snapshot) = match parsed {
            Ok(s) => s,
            Err(e) => {
                let expect = Expect::Write { conn, sid, write };
                self.fail(expect, ApiError::storage_unavailable());
                return Err(e);
            }
        };
        let dup = status == "dup";
        // Redis ran the write alone: a new message's seq is the last the
        // answer's session holds.
        let seq = match &snapshot.head {
            Some(h) if !dup => h.next.before(),
            _ => Seq(0),
        };
        let then = match status.as_str() {
            "ok" | "dup" => match write {
                Write::Prompt { id } => Then::Reply(Ok(Outcome::Prompt {
                    sid,
                    id,
                    seq,
                    duplicate: dup,
                })),
                Write::Response { id } => Then::Reply(Ok(Outcome::Response {
                    sid,
                    id,
                    seq,
                    duplicate: dup,
                })),
                Write::Part { id } => Then::Reply(Ok(Outcome::Part { id })),
                // A resend's answer carries the stored cancel's seq.
                Write::Cancel { id } => Then::Reply(Ok(Outcome::Cancel {
                    sid,
                    id,
                    seq: if dup {
                        Seq(extra.parse().unwrap_or(0))
                    } else {
                        seq
                    },
                    duplicate: dup,
                })),
                Write::Create { put: false } => Then::Retry,
                Write::Create { put: true } => Then::Reply(Ok(Outcome::Session {
                    epoch: snapshot
                        .head
                        .as_ref()
                        .map_or_else(String::new, |h| h.epoch.clone()),
                    sid,
                    created: extra == "1",
                    put: true,
                })),
                Write::Delete => Then::Reply(Ok(Outcome::Deleted { sid })),
                w @ (Write::Ask { .. } | Write::Reply { .. }) => {
                    Then::Reply(Ok(asked(sid, w, seq, dup, &extra)))
                }
            },
            "e404k" => Then::Reply(Err(ApiError::ask_not_found())),
            "e409k" => Then::Reply(Err(ApiError::ask_conflict())),
            "e409r" => Then::Reply(Err(ApiError::ask_answered())),
            "e409e" => Then::Reply(Err(ApiError::ask_expired())),
            "e400r" => Then::Reply(Err(ApiError::invalid_reply())),
            "e503k" => Then::Reply(Err(ApiError::unavailable(
                "pending limit reached for this session (prompts and asks)",
            ))),
            "e404s" => Then::Reply(Err(ApiError::session_not_found())),
            "e404p" => Then::Reply(Err(ApiError::prompt_not_found())),
            "e409" => Then::Reply(Err(ApiError::conflict())),
            "e409c" => Then::Reply(Err(ApiError::prompt_conflict())),
            "e409a" => Then::Reply(Err(ApiError::prompt_answered())),
            "e409x" => Then::Reply(Err(ApiError::prompt_cancelled())),
            "e503s" => Then::Reply(Err(ApiError::unavailable("session limit reached"))),
            "e503p" => Then::Reply(Err(ApiError::unavailable(
                "pending prompt limit reached for this session",
            ))),
            "e503d" => Then::Reply(Err(ApiError::unavailable(
                "draft limit reached for this session",
            ))),
            "e400t" => Then::Reply(Err(ApiError::too_large_field())),
            other => {
                self.answered.push_back(Answered {
                    conn: Some(conn),
                    snapshot: None,
                    then: Then::Reply(Err(ApiError::storage_unavailable())),
                    delivered: false,
                });
                return Err(format!("unknown status {other}"));
            }
        };
        self.answered.push_back(Answered {
            conn: Some(conn),
            snapshot: Some(snapshot),
            then,
            delivered: extra == "1",
        });
        Ok(())
    }
}

/// Asks and replies: the calls, and their answers read back.
impl RedisStore {
    /// `POST /ask`: the record is `K\nask_id\nexpires_ts\nts\nhead`, so
    /// the script reads an ask's expiry without parsing its message.
    fn ask(&mut self, conn: Ticket, a: &NewAsk, known: Known, unix_ms: u64) {
        let (id, literal) = id_and_literal(a.ask_id.clone(), &mut self.ids);
        let expires_ts = unix_ms.saturating_add(a.timeout_ms);
        let mut head = AskParts {
            session_id: &a.session_id,
            id_literal: &literal,
            client_msg_id: a.client_msg_id.as_deref(),
            text: &a.text,
            choices: a.choices.as_deref(),
            default: a.default.as_deref(),
            expires_ts,
            metadata: a.metadata.as_deref(),
            ts: unix_ms,
            seq: Seq(0),
        }
        .data(); // ends in `"seq":0}`
        head.truncate(head.len() - 2);
        let expires = expires_ts.to_string();
        let record = record("K", &id, &expires, unix_ms, &head);
        let choices = a.choices.as_ref().map_or_else(String::new, |c| {
            serde_json::to_string(c).unwrap_or_default()
        });
        let extra: [&[u8]; 5] = [
            id.as_bytes(),
            a.client_msg_id.as_deref().unwrap_or("").as_bytes(),
            a.text.as_bytes(),
            choices.as_bytes(),
            record.as_bytes(),
        ];
        let expect = Expect::Write {
            conn,
            sid: a.session_id.clone(),
            write: Write::Ask {
                id: id.clone(),
                expires_ts,
            },
        };
        self.call(&a.session_id, Op::Ask, known, &extra, expect);
    }

    /// `POST /reply`: the record is `Y\nask_id\n\nts\nhead`.
    fn reply(&mut self, conn: Ticket, r: &NewReply, known: Known, unix_ms: u64) {
        let mut head = reply_data(&r.session_id, &r.ask_id, &r.text, unix_ms, Seq(0));
        head.truncate(head.len() - 2);
        let record = record("Y", &r.ask_id, "", unix_ms, &head);
        let extra: [&[u8]; 3] = [r.ask_id.as_bytes(), r.text.as_bytes(), record.as_bytes()];
        let expect = Expect::Write {
            conn,
            sid: r.session_id.clone(),
            write: Write::Reply {
                ask_id: r.ask_id.to_string(),
            },
        };
        self.call(&r.session_id, Op::Reply, known, &extra, expect);
    }
}

/// An ask's or a reply's outcome from the script's answer: a new one's
/// `seq` is the session's last; a duplicate's comes in `extra`
/// (`seq\nexpires_ts` for an ask, `seq` for a reply).
fn asked(sid: SessionId, w: Write, seq: Seq, dup: bool, extra: &str) -> Outcome {
    let mut stored = extra.split('\n').map(|n| n.parse::<u64>().unwrap_or(0));
    let (seq, stored_expires) = if dup {
        (Seq(stored.next().unwrap_or(0)), stored.next())
    } else {
        (seq, None)
    };
    match w {
        Write::Ask { id, expires_ts } => Outcome::Ask {
            sid,
            id,
            seq,
            expires_ts: stored_expires.unwrap_or(expires_ts),
            duplicate: dup,
        },
        Write::Reply { ask_id } => Outcome::Reply {
            sid,
            ask_id,
            seq,
            duplicate: dup,
        },
        // Only asks and replies come here.
        _ => Outcome::Collected,
    }
}

/// A message as the script stores it (`kind\ncid\naid\nts\nhead`, the
/// message being `head`, its seq and `}`): Redis stores, publishes and
/// answers these bytes as they are, and only the relays parse them.
fn record(kind: &str, cid: &str, aid: &str, ts: u64, head: &str) -> String {
    let mut r = String::with_capacity(kind.len() + cid.len() + aid.len() + head.len() + 24);
    for part in [kind, "\n", cid, "\n", aid, "\n"] {
        r.push_str(part);
    }
    crate::wire::push_decimal_str(&mut r, ts);
    r.push('\n');
    r.push_str(head);
    r
}

/// A new message's `data` up to its `seq`, which the script appends.
fn head_of(parts: &Parts) -> String {
    let mut d = parts.data(); // ends in `"seq":0}`
    d.truncate(d.len() - 2);
    d
}
