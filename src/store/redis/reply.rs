//! Replies from Redis: the script's answer (a session's counters and the
//! messages the caller's copy lacks) and the changes published on a
//! session's channel, decoded from `redis-protocol`'s frames.

use redis_protocol::resp2::types::OwnedFrame;

use super::health::Health;
use crate::store::message::Kind;
use crate::store::seam::{AgentState, DraftState};
use crate::store::types::{Seq, SessionId};

/// A session as Redis holds it after a call: what the caller's copy lacks.
#[derive(Debug)]
pub struct Snapshot {
    pub sid: SessionId,
    /// `None`: the session does not exist.
    pub head: Option<Head>,
    /// Oldest first: the whole session when `head.full`, else what
    /// follows the `seq` the caller holds.
    pub msgs: Vec<Msg>,
    /// A read (`sync`) also brings the open drafts and the instances'
    /// agent states; `None` for a write's answer.
    pub live: Option<(Vec<DraftState>, Vec<AgentState>)>,
}

/// A session's counters.
#[derive(Debug)]
pub struct Head {
    pub epoch: String,
    /// In a whole session's answer: the epoch a failover's renewal
    /// replaced (`renew` in `relay.lua`).
    pub prev: Option<String>,
    pub next: Seq,
    pub last_assistant: Seq,
    pub dropped_assistant: Seq,
    pub full: bool,
}

/// A stored message.
#[derive(Debug)]
pub struct Msg {
    pub seq: Seq,
    /// A prompt, an answer, a cancel (whose `client_msg_id` is the prompt
    /// it stopped), an ask or a reply (whose `client_msg_id` is the
    /// `ask_id`).
    pub kind: Kind,
    pub client_msg_id: String,
    pub assistant_msg_id: String,
    pub ts: u64,
    pub data: String,
}

/// A change another instance (or this one) published.
#[derive(Debug)]
pub enum Event {
    Created {
        sid: SessionId,
        epoch: String,
    },
    Message {
        sid: SessionId,
        epoch: String,
        msg: Msg,
    },
    Deleted {
        sid: SessionId,
        epoch: String,
    },
    /// A part of a streamed answer (`lit`: its text's JSON literal).
    Part {
        sid: SessionId,
        epoch: String,
        assistant_msg_id: String,
        client_msg_id: String,
        part: u32,
        lit: String,
    },
    /// An instance's agent state changed.
    Agent {
        sid: SessionId,
        state: AgentState,
    },
    /// Prompts an agent fetched through `instance` for the first time.
    Receipts {
        sid: SessionId,
        instance: String,
        ts: u64,
        ids: Vec<String>,
    },
    /// The session's channel is listened to (first, or again after a
    /// loss): what was published before is unknown, so the session is
    /// read again.
    Listening {
        sid: SessionId,
    },
    /// Redis refused a write of the session: the copy is read again, so
    /// that it holds nothing Redis does not.
    Refused {
        sid: SessionId,
    },
}

pub fn bytes_of(f: &OwnedFrame) -> &[u8] {
    match f {
        OwnedFrame::BulkString(b) | OwnedFrame::SimpleString(b) => b,
        _ => b"",
    }
}

pub fn text_of(f: &OwnedFrame) -> Result<std::borrow::Cow<'_, str>, String> {
    if let OwnedFrame::Integer(i) = f {
        return Ok(i.to_string().into());
    }
    std::str::from_utf8(bytes_of(f))
        .map(Into::into)
        .map_err(|_| "reply is not UTF-8".to_string())
}

/// The script's answer: `(status, extra)` and the session; the store's
/// generation (that of the session's bucket, `bucket`, in a cluster),
/// when the answer carries it (a whole session, or none), goes to
/// `health`.
#[inline(never)]
pub fn parse_snapshot(
    sid: SessionId,
    frame: OwnedFrame,
    bucket: usize,
    health: &mut Health,
) -> Result<((String, String), Snapshot), String> {
    let OwnedFrame::Array(parts) = frame else {
        return Err("the script answered something else than an array".into());
    };
    let field = |i: usize| parts.get(i).map_or(Ok("".into()), text_of);
    let num = |i: usize| -> Result<u64, String> {
        field(i)?
            .parse()
            .map_err(|_| format!("field {i} is not a number"))
    };
    let status = (field(0)?.to_string(), field(1)?.to_string());
    let epoch = field(2)?.into_owned();
    let full = field(6)? == "1";
    if epoch.is_empty() || full {
        health.saw_generation(bucket, parts.get(7).map_or(b"", bytes_of));
    }
    if epoch.is_empty() {
        return Ok((
            status,
            Snapshot {
                sid,
                head: None,
                msgs: Vec::new(),
                live: None,
            },
        ));
    }
    let (epoch, prev) = match epoch.split_once('\n') {
        Some((e, p)) => (e.to_string(), Some(p.to_string())),
        None => (epoch, None),
    };
    let head = Head {
        epoch,
        prev,
        next: Seq(num(3)?),
        last_assistant: Seq(num(4)?),
        dropped_assistant: Seq(num(5)?),
        full,
    };
    // The records, each as two elements (its seq, then the record), and
    // after them a read's drafts and agent states, one element each,
    // starting "d\n" or "g\n" (where a seq has digits).
    let mut msgs = Vec::with_capacity(parts.len().saturating_sub(8) / 2);
    let mut live: Option<(Vec<DraftState>, Vec<AgentState>)> = None;
    let mut rest = parts.iter().skip(8);
    while let Some(p) = rest.next() {
        let text = text_of(p)?;
        if let Some(d) = text.strip_prefix("d\n") {
            let draft = parse_draft(d).ok_or("a stored draft is malformed")?;
            live.get_or_insert_default().0.push(draft);
        } else if let Some(g) = text.strip_prefix("g\n") {
            let (instance, state) = g.split_once('\n').ok_or("an agent state is malformed")?;
            let state = parse_agent(instance, state).ok_or("an agent state is malformed")?;
            live.get_or_insert_default().1.push(state);
        } else {
            let record = rest.next().ok_or("a stored message is missing")?;
            let msg = parse_record(&text, &text_of(record)?);
            msgs.push(msg.ok_or("a stored message is malformed")?);
        }
    }
    if live.is_none() && full_read(&status) {
        live = Some(Default::default());
    }
    Ok((
        status,
        Snapshot {
            sid,
            head: Some(head),
            msgs,
            live,
        },
    ))
}

/// Whether an answer is a read's (`sync`), which carries the live state
/// (possibly none of it).
fn full_read(status: &(String, String)) -> bool {
    status.1 == "sync"
}

/// `aid\ncid\nparts\nbytes\ndeadline\ntext`.
fn parse_draft(s: &str) -> Option<DraftState> {
    let mut it = s.splitn(6, '\n');
    Some(DraftState {
        assistant_msg_id: it.next()?.to_string(),
        client_msg_id: it.next()?.to_string(),
        parts: it.next()?.parse().ok()?,
        bytes: it.next()?.parse().ok()?,
        deadline: it.next()?.parse().ok()?,
        escaped: it.next()?.to_string(),
    })
}

/// `until\nseen` of `instance`.
fn parse_agent(instance: &str, s: &str) -> Option<AgentState> {
    let (until, seen) = s.split_once('\n')?;
    Some(AgentState {
        instance: instance.to_string(),
        until: until.parse().ok()?,
        seen: seen.parse().ok()?,
    })
}

/// `seq\n` and a record.
pub fn parse_msg(s: &str) -> Option<Msg> {
    let (seq, record) = s.split_once('\n')?;
    parse_record(seq, record)
}

/// A stored record of the message `seq`:
/// `kind\nclient_msg_id\nassistant_msg_id\nts\nhead` where the message
/// is `head` then its seq then `}` (kind `P`, `A` or `X` for a cancel,
/// as the relay sends them), or `kind\n...\ndata` with the whole message
/// (kind `p` or `a`, as earlier versions stored them).
pub fn parse_record(seq: &str, record: &str) -> Option<Msg> {
    let seq: u64 = seq.parse().ok()?;
    let mut it = record.splitn(5, '\n');
    let (kind, whole) = match it.next()? {
        "P" => (Kind::Prompt, false),
        "A" => (Kind::Assistant, false),
        "X" => (Kind::Cancel, false),
        "p" => (Kind::Prompt, true),
        "a" => (Kind::Assistant, true),
        "K" => (Kind::Ask, false),
        "Y" => (Kind::Reply, false),
        _ => return None,
    };
    let client_msg_id = it.next()?.to_string();
    let assistant_msg_id = it.next()?.to_string();
    let ts = it.next()?.parse().ok()?;
    let rest = it.next()?;
    let data = if whole {
        rest.to_string()
    } else {
        let mut d = String::with_capacity(rest.len() + 21);
        d.push_str(rest);
        crate::wire::push_decimal_str(&mut d, seq);
        d.push('}');
        d
    };
    Some(Msg {
        seq: Seq(seq),
        kind,
        client_msg_id,
        assistant_msg_id,
        ts,
        data,
    })
}

/// `C\nsid\nepoch`, `D\nsid\nepoch`, `M\nsid\nepoch\n<message>`.
pub fn parse_event(payload: &[u8]) -> Option<Event> {
    let s = std::str::from_utf8(payload).ok()?;
    if let Some(rest) = s.strip_prefix("P\n") {
        let mut it = rest.splitn(6, '\n');
        return Some(Event::Part {
            sid: SessionId::new(it.next()?)?,
            epoch: it.next()?.to_string(),
            assistant_msg_id: it.next()?.to_string(),
            client_msg_id: it.next()?.to_string(),
            part: it.next()?.parse().ok()?,
            lit: it.next()?.to_string(),
        });
    }
    if let Some(rest) = s.strip_prefix("A\n") {
        let mut it = rest.splitn(3, '\n');
        let sid = SessionId::new(it.next()?)?;
        let instance = it.next()?;
        let state = parse_agent(instance, it.next()?)?;
        return Some(Event::Agent { sid, state });
    }
    if let Some(rest) = s.strip_prefix("R\n") {
        let mut it = rest.split('\n');
        return Some(Event::Receipts {
            sid: SessionId::new(it.next()?)?,
            instance: it.next()?.to_string(),
            ts: it.next()?.parse().ok()?,
            ids: it.map(str::to_string).collect(),
        });
    }
    let mut it = s.splitn(4, '\n');
    let kind = it.next()?;
    let sid = SessionId::new(it.next()?)?;
    let epoch = it.next()?.to_string();
    Some(match kind {
        "C" => Event::Created { sid, epoch },
        "D" => Event::Deleted { sid, epoch },
        "M" => Event::Message {
            sid,
            epoch,
            msg: parse_msg(it.next()?)?,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_events_parse() {
        let m = parse_msg("7\na\nc1\na1\n12\n{\"x\":\"a\nb\"}").unwrap();
        assert_eq!((m.seq, m.kind, m.ts), (Seq(7), Kind::Assistant, 12));
        assert_eq!(m.data, "{\"x\":\"a\nb\"}");
        assert!(parse_msg("7\nq\nc\n\n1\n{}").is_none());
        let m = parse_record("12", "P\nc1\n\n5\n{\"x\":\"a\nb\",\"seq\":").unwrap();
        assert_eq!((m.seq, m.kind, m.ts), (Seq(12), Kind::Prompt, 5));
        assert_eq!(m.data, "{\"x\":\"a\nb\",\"seq\":12}");
        let m = parse_record("4", "X\nc1\n\n5\n{\"client_msg_id\":\"c1\",\"seq\":").unwrap();
        assert_eq!(
            (m.seq, m.kind, &*m.client_msg_id),
            (Seq(4), Kind::Cancel, "c1")
        );
        assert_eq!(m.data, "{\"client_msg_id\":\"c1\",\"seq\":4}");
        match parse_event(b"D\ns1\nE") {
            Some(Event::Deleted { sid, epoch }) => assert_eq!((&*sid, &*epoch), ("s1", "E")),
            other => panic!("{other:?}"),
        }
        assert!(parse_event(b"M\ns1\nE\nnot a message").is_none());
        assert!(parse_event(b"C\nbad id!\nE").is_none());
    }
}
