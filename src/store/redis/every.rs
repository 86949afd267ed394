//! One agent for every session, across instances. Redis keeps the order
//! of every pending prompt (`P pending`, by the arrival number the script
//! gives each one, `P arrived`), and an all-sessions poll reads it with
//! one call (`every`), whichever instance stored the prompts.
//!
//! An instance hears of arrivals on one channel (`P arrivals`, a session
//! id and a number per prompt), which it listens to only while an
//! all-sessions poll is parked there, until the sweep after the last one
//! left: an instance that serves no such agent gets nothing, and a
//! prompt costs Redis one `PUBLISH` to nobody. Each arrival heard makes
//! the polls that cover its session read again (never a walk over
//! sessions). A poll reads only once the channel is confirmed, and reads
//! again when it is confirmed again (after a reconnect), so no arrival
//! falls between a read and the channel.
//!
//! The agents of every session are announced on the channel every
//! instance listens to from the start (`P events`), with a lease as for
//! one session (`lease.rs`), and kept in `P agents` for instances that
//! start later, which read it once their links are set up; so is an
//! agent that stopped (`DELETE /agent`), published only.

use redis_protocol::resp2::types::OwnedFrame;

use super::codec::push_command;
use super::reply::{bytes_of, parse_record, text_of};
use super::route::Expect;
use super::{Known, Op, RedisStore};
use crate::error::ApiError;
use crate::store::seam::{EveryAgentState, EveryRead, Listed, Scope, StoreEvent};
use crate::store::types::{SessionId, Ticket};

impl RedisStore {
    /// An all-sessions poll is parked here (`on`), or the last one left
    /// (the channel is left at the next sweep). Returns whether arrivals
    /// are heard now, so a read may go; otherwise
    /// [`StoreEvent::EveryAgain`] comes once they are.
    pub fn every_listen(&mut self, on: bool) -> bool {
        self.arrivals_wanted = on;
        if on && self.arrivals.is_none() {
            self.arrivals = Some(false);
            if self.ev.up {
                push_command(
                    &mut self.ev.out,
                    &[b"SUBSCRIBE", self.arrivals_channel.as_bytes()],
                );
            }
        }
        self.arrivals == Some(true) && self.linked()
    }

    /// Reads the pending prompts `scope` covers that arrived after
    /// `after`, at most `limit`; the answer comes as
    /// [`StoreEvent::EveryPage`] for `to`.
    pub fn read_every(&mut self, to: Ticket, scope: &Scope, after: Option<u64>, limit: usize) {
        let after = after.map_or_else(String::new, |a| a.to_string());
        let limit = limit.to_string();
        let (kind, value): (&[u8], &str) = match scope {
            Scope::Every => (b"*", ""),
            Scope::Prefix(p) => (b"p", p),
            Scope::Session(s) => (b"s", s.as_str()),
        };
        let extra: [&[u8]; 4] = [after.as_bytes(), limit.as_bytes(), kind, value.as_bytes()];
        self.call("", Op::Every, Known::default(), &extra, Expect::Every(to));
    }

    /// Stores and publishes this instance's agent of every session
    /// `scope` covers: online until `until` (0: offline), `parked` or in
    /// its grace.
    pub(super) fn every_agent(&mut self, scope: &Scope, until: u64, seen: u64, parked: bool) {
        let (until, seen) = (until.to_string(), seen.to_string());
        let (instance, name) = (self.instance.clone(), scope.name());
        let parked: &[u8] = if parked { b"1" } else { b"0" };
        let extra: [&[u8]; 5] = [
            instance.as_bytes(),
            name.as_bytes(),
            until.as_bytes(),
            seen.as_bytes(),
            parked,
        ];
        self.call("", Op::EveryAgent, Known::default(), &extra, Expect::Quiet);
    }

    /// An agent stopped in every session `scope` covers (`DELETE
    /// /agent`): the other instances end its graces there too.
    pub fn agent_stopped(&mut self, scope: &Scope) {
        if !self.cmd.up {
            return;
        }
        self.send_batch();
        let msg = format!("S\n{}\n{}", self.instance, scope.name());
        let channel = self.channel.clone();
        push_command(
            &mut self.cmd.out,
            &[b"PUBLISH", channel.as_bytes(), msg.as_bytes()],
        );
        self.expect.push_back(Expect::Quiet);
    }

    /// Both links are set up (again): the agents of every session are
    /// read whole, and the parked all-sessions polls read again if
    /// arrivals are heard.
    pub(super) fn every_linked(&mut self) {
        let key = format!("{}agents", self.prefix);
        push_command(&mut self.cmd.out, &[b"HGETALL", key.as_bytes()]);
        self.expect.push_back(Expect::Agents);
        if self.arrivals == Some(true) {
            self.ready.push_back(StoreEvent::EveryAgain);
        }
    }

    /// Redis confirmed the arrivals channel.
    pub(super) fn arrivals_listened(&mut self) {
        if self.arrivals.is_some() {
            self.arrivals = Some(true);
            if self.linked() {
                self.ready.push_back(StoreEvent::EveryAgain);
            }
        }
    }

    /// The events link connected: the arrivals channel is asked for
    /// again, if it was listened to.
    pub(super) fn arrivals_again(&mut self, setup: &mut Vec<u8>) {
        if self.arrivals.is_some() {
            self.arrivals = Some(false);
            push_command(setup, &[b"SUBSCRIBE", self.arrivals_channel.as_bytes()]);
        }
    }

    /// The sweep: the arrivals channel is left once no all-sessions poll
    /// was parked here since the last one left.
    pub(super) fn arrivals_sweep(&mut self) {
        if !self.arrivals_wanted && self.arrivals.take().is_some() && self.ev.up {
            let (out, channel) = (&mut self.ev.out, self.arrivals_channel.as_bytes());
            push_command(out, &[b"UNSUBSCRIBE", channel]);
        }
    }

    /// A message on the arrivals channel or on the instances' channel;
    /// false when `channel` is neither.
    pub(super) fn every_message(&mut self, channel: &[u8], payload: &[u8]) -> bool {
        let text = std::str::from_utf8(payload).unwrap_or("");
        if channel == self.arrivals_channel.as_bytes() {
            let sid = text.split('\n').next().and_then(SessionId::new);
            if let Some(sid) = sid {
                self.ready.push_back(StoreEvent::Arrived { sid });
            }
            return true;
        }
        if channel != self.channel.as_bytes() {
            return false;
        }
        let mut it = text.splitn(3, '\n');
        let (kind, instance) = (it.next(), it.next().unwrap_or(""));
        // This instance's own messages are known here already, but for a
        // stop: heard back in Redis's order, it is applied again, after
        // every announcement another instance published before it (a
        // grace told while the stop was on its way, whose start this
        // instance's clock may place a millisecond after the stop's).
        if instance == self.instance && kind != Some("S") {
            return true;
        }
        let rest = it.next().unwrap_or("");
        let event = match kind {
            Some("E") => parse_agent(instance, rest).map(StoreEvent::EveryAgent),
            Some("S") => Scope::from_name(rest).map(StoreEvent::AgentStopped),
            _ => None,
        };
        self.ready.extend(event);
        true
    }

    /// The answer to an all-sessions read.
    pub(super) fn every_read(&mut self, to: Ticket, frame: OwnedFrame) -> Result<(), String> {
        let listed = match frame {
            OwnedFrame::Array(parts) => parse_listed(&parts),
            _ => Err("the script answered something else than an array".into()),
        };
        let (result, broken) = match listed {
            Ok(read) => (Ok(read), Ok(())),
            Err(e) => (Err(ApiError::storage_unavailable()), Err(e)),
        };
        self.ready.push_back(StoreEvent::EveryPage { to, result });
        broken
    }

    /// `HGETALL P agents`: the other instances' agents of every session.
    pub(super) fn every_agents(&mut self, frame: OwnedFrame) {
        let OwnedFrame::Array(parts) = frame else {
            return;
        };
        let agents = parts
            .chunks(2)
            .filter_map(|kv| {
                let field = std::str::from_utf8(bytes_of(kv.first()?)).ok()?;
                let value = std::str::from_utf8(bytes_of(kv.get(1)?)).ok()?;
                let (instance, scope) = field.split_once('\n')?;
                if instance == self.instance {
                    return None;
                }
                parse_agent(instance, &format!("{value}\n{scope}"))
            })
            .collect();
        self.ready.push_back(StoreEvent::EveryAgents(agents));
    }
}

/// `until\nseen\nparked\nscope` of `instance`.
fn parse_agent(instance: &str, s: &str) -> Option<EveryAgentState> {
    let mut it = s.splitn(4, '\n');
    Some(EveryAgentState {
        instance: instance.to_string(),
        until: it.next()?.parse().ok()?,
        seen: it.next()?.parse().ok()?,
        parked: it.next()? == "1",
        scope: Scope::from_name(it.next()?)?,
    })
}

/// `ok`, where to resume (or `''`), then number, sid, seq and record of
/// each prompt listed. A record that does not parse is left out (a
/// damaged prompt is not offered to an agent).
fn parse_listed(parts: &[OwnedFrame]) -> Result<EveryRead, String> {
    let resume = match parts.get(1).map(text_of).transpose()?.as_deref() {
        None | Some("") => None,
        Some(n) => Some(n.parse().map_err(|_| "a resume number")?),
    };
    let mut out = Vec::with_capacity(parts.len().saturating_sub(2) / 4);
    for p in parts.get(2..).unwrap_or(&[]).chunks(4) {
        let [n, sid, seq, record] = p else {
            return Err("an all-sessions read answered a partial prompt".into());
        };
        let n = text_of(n)?.parse().map_err(|_| "an arrival number")?;
        let Some(sid) = SessionId::new(&text_of(sid)?) else {
            continue;
        };
        let Some(msg) = parse_record(&text_of(seq)?, &text_of(record)?) else {
            log::error!(session_id = sid.as_str(); "stored prompt damaged; left out of a page");
            continue;
        };
        out.push(Listed {
            n,
            sid,
            seq: msg.seq,
            client_msg_id: msg.client_msg_id,
            data: msg.data,
        });
    }
    Ok(EveryRead {
        listed: out,
        resume,
    })
}
