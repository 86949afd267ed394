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
use super::slot::{BUCKETS, bucket_of};
use super::{Op, RedisStore};
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
            self.arrivals = Some(0);
            if self.ev.up {
                let subscribe = self.verbs()[0];
                for channel in &self.arrivals_channels {
                    push_command(&mut self.ev.out, &[subscribe, channel.as_bytes()]);
                }
            }
        }
        self.arrivals_heard() && self.linked()
    }

    /// Every arrivals channel is confirmed.
    fn arrivals_heard(&self) -> bool {
        let all = u64::MAX >> (64 - self.arrivals_channels.len());
        self.arrivals == Some(all)
    }

    /// Which of the arrivals channels `channel` is.
    pub(super) fn arrivals_bucket(&self, channel: &[u8]) -> Option<usize> {
        if !channel.ends_with(b"arrivals") {
            return None;
        }
        (self.arrivals_channels.iter()).position(|c| c.as_bytes() == channel)
    }

    /// Reads the pending prompts `scope` covers that arrived after
    /// `after`, at most `limit`; the answer comes as
    /// [`StoreEvent::EveryPage`] for `to`.
    pub fn read_every(&mut self, to: Ticket, scope: &Scope, after: Option<u64>, limit: usize) {
        if self.cluster() {
            let id = self.merge_ids;
            self.merge_ids += 1;
            // A number no client sends, kept below 2^52 so that the
            // floor stays exact in the script's numbers (doubles).
            let h = after.unwrap_or(0).min(1 << 52);
            self.every_floor = self.every_floor.max(h);
            let m = Merge {
                id,
                to,
                scope: scope.clone(),
                after,
                limit,
                rounds: 0,
                owed: 0,
                failed: false,
                floor: u64::MAX,
                cut: u64::MAX,
                listed: Vec::new(),
            };
            self.merges.push(m);
            self.merge_round(self.merges.len() - 1);
            return;
        }
        let extra = every_args(scope, after, limit, None);
        let extra: Vec<&[u8]> = extra.iter().map(|a| a.as_bytes()).collect();
        self.call_bucket(0, Op::Every, &extra, Expect::Every(to));
    }

    /// Sends the calls of one round of the merged read `i`: one per
    /// bucket (only its session's for a read of one session), each
    /// raising its bucket's counter to the highest number known here.
    fn merge_round(&mut self, i: usize) {
        // The floors this round raises hold a cursor only once replicas
        // hold them too: a `WAIT` follows the calls.
        self.unwaited |= self.replicas > 0;
        let m = &mut self.merges[i];
        m.rounds += 1;
        m.floor = u64::MAX;
        m.cut = u64::MAX;
        m.listed.clear();
        let buckets = match &m.scope {
            Scope::Session(s) => vec![bucket_of(s.as_bytes())],
            _ => (0..BUCKETS).collect(),
        };
        m.owed = buckets.len();
        let extra = every_args(&m.scope, m.after, m.limit, Some(self.every_floor));
        let extra: Vec<&[u8]> = extra.iter().map(|a| a.as_bytes()).collect();
        let id = m.id;
        for b in buckets {
            self.call_bucket(b, Op::Every, &extra, Expect::EveryPart(id, b));
        }
    }

    /// One bucket's answer to the merged read `id` (a cluster): merged
    /// once every bucket answered.
    pub(super) fn every_part(
        &mut self,
        id: u64,
        _bucket: usize,
        frame: OwnedFrame,
    ) -> Result<(), String> {
        let Some(i) = self.merges.iter().position(|m| m.id == id) else {
            return Ok(());
        };
        let part = match frame {
            OwnedFrame::Array(parts) if parts.len() >= 3 => {
                let floor = text_of(&parts[2])?.parse::<u64>();
                let floor = floor.map_err(|_| "a floor".to_string())?;
                parse_listed(&parts, 3).map(|r| (floor, r))
            }
            _ => Err("the script answered something else than an array".into()),
        };
        let m = &mut self.merges[i];
        m.owed = m.owed.saturating_sub(1);
        let broken = match part {
            Ok((floor, read)) => {
                self.every_floor = self.every_floor.max(floor);
                m.floor = m.floor.min(floor);
                if let Some(cut) = read.resume {
                    m.cut = m.cut.min(cut);
                }
                // Oldest first, as the bucket's order lists them.
                m.listed.push(read.listed);
                Ok(())
            }
            Err(e) => {
                m.failed = true;
                Err(e)
            }
        };
        if m.owed == 0 {
            self.merged(i);
        }
        broken
    }

    /// A part of the merged read `id` failed (refused, or its connection
    /// lost): the read fails once every bucket answered.
    pub(super) fn every_part_failed(&mut self, id: u64) {
        let Some(i) = self.merges.iter().position(|m| m.id == id) else {
            return;
        };
        let m = &mut self.merges[i];
        m.failed = true;
        m.owed = m.owed.saturating_sub(1);
        if m.owed == 0 {
            self.merged(i);
        }
    }

    /// Every bucket of the merged read `i` answered. Listed are only the
    /// prompts numbered at most B, the least of the buckets' floors and
    /// of where a bucket's listing stopped: every prompt that arrives
    /// later anywhere takes a number above its bucket's floor, so no
    /// cursor handed out can pass one. When prompts were left out for
    /// being above B and the page has room, the read goes again at once,
    /// with the highest floor as every counter's floor, which lists them
    /// (three rounds at most; then what is listed is the answer).
    fn merged(&mut self, i: usize) {
        let m = &mut self.merges[i];
        if m.failed {
            let m = self.merges.swap_remove(i);
            let result = Err(ApiError::storage_unavailable());
            self.ready
                .push_back(StoreEvent::EveryPage { to: m.to, result });
            // A parked poll whose read failed (a bucket's master down, or
            // its slot migrating under the call) reads again with the next
            // probe, not only at the next arrival.
            self.every_again_owed = true;
            return;
        }
        let bound = m.floor.min(m.cut);
        // The buckets' listings merged, the least number first.
        let mut parts: Vec<_> = (m.listed.drain(..))
            .map(|l| l.into_iter().peekable())
            .collect();
        let (mut listed, mut above) = (Vec::new(), false);
        while listed.len() < m.limit {
            let least = (parts.iter_mut().enumerate())
                .filter_map(|(i, p)| Some((p.peek()?.n, i)))
                .min();
            let Some((n, i)) = least else {
                break;
            };
            if n > bound {
                above = true;
                break;
            }
            listed.extend(parts[i].next());
        }
        if above && listed.len() < m.limit && m.rounds < 3 {
            self.merge_round(i);
            return;
        }
        let m = self.merges.swap_remove(i);
        // Nothing it covers up to B, where a bucket stopped early: the
        // caller reads on from B.
        let resume = (listed.is_empty() && !above && m.cut < u64::MAX && m.limit > 0)
            .then_some(bound)
            .filter(|b| m.after.is_none_or(|a| *b > a));
        let read = EveryRead { listed, resume };
        if self.replicas > 0 && (self.waiting || self.unwaited) {
            // Answered once the `WAIT` sent after its calls is.
            self.pages_held.push((m.to, read));
            return;
        }
        self.ready.push_back(StoreEvent::EveryPage {
            to: m.to,
            result: Ok(read),
        });
    }

    /// The `WAIT` after the held pages' calls was answered (`confirmed`:
    /// by enough replicas), or the link was lost: each page is answered,
    /// or refused (`503`) when its floors may not outlive a failover.
    pub(super) fn release_pages(&mut self, confirmed: bool) {
        for (to, read) in std::mem::take(&mut self.pages_held) {
            let result = match confirmed {
                true => Ok(read),
                false => Err(ApiError::storage_unavailable()),
            };
            self.ready.push_back(StoreEvent::EveryPage { to, result });
        }
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
        self.call_bucket(0, Op::EveryAgent, &extra, Expect::Quiet);
    }

    /// An agent stopped in every session `scope` covers (`DELETE
    /// /agent`): the other instances end its graces there too.
    pub fn agent_stopped(&mut self, scope: &Scope) {
        if !self.cmd.up {
            return;
        }
        self.send_batch();
        let msg = format!("S\n{}\n{}", self.instance, scope.name());
        let publish = self.verbs()[2];
        push_command(
            &mut self.cmd.out,
            &[publish, self.channel.as_bytes(), msg.as_bytes()],
        );
        self.expect.push_back(Expect::Quiet);
    }

    /// Both links are set up (again): the agents of every session are
    /// read whole, and the parked all-sessions polls read again if
    /// arrivals are heard.
    pub(super) fn every_linked(&mut self) {
        self.every_linked_agents();
        if self.arrivals_heard() {
            self.ready.push_back(StoreEvent::EveryAgain);
        }
    }

    /// Reads the agents of every session (`P agents`, bucket 0's in a
    /// cluster).
    pub(super) fn every_linked_agents(&mut self) {
        if !self.cmd.up {
            return;
        }
        self.send_batch();
        let base = self.bases.first().unwrap_or(&self.prefix);
        let key = format!("{base}agents");
        push_command(&mut self.cmd.out, &[b"HGETALL", key.as_bytes()]);
        self.expect.push_back(Expect::Agents);
    }

    /// Redis confirmed the arrivals channel `bucket` (0 without buckets):
    /// once every one is, arrivals are heard.
    pub(super) fn arrivals_listened(&mut self, bucket: usize) {
        if let Some(heard) = &mut self.arrivals {
            *heard |= 1 << bucket;
            if self.arrivals_heard() && self.linked() {
                self.ready.push_back(StoreEvent::EveryAgain);
            }
        }
    }

    /// The events link connected: the arrivals channels are asked for
    /// again, if they were listened to.
    pub(super) fn arrivals_again(&mut self, setup: &mut Vec<u8>) {
        if self.arrivals.is_some() {
            self.arrivals = Some(0);
            let subscribe = self.verbs()[0];
            for channel in &self.arrivals_channels {
                push_command(setup, &[subscribe, channel.as_bytes()]);
            }
        }
    }

    /// The sweep: the arrivals channels are left once no all-sessions
    /// poll was parked here since the last one left.
    pub(super) fn arrivals_sweep(&mut self) {
        if !self.arrivals_wanted && self.arrivals.take().is_some() && self.ev.up {
            let unsubscribe = self.verbs()[1];
            for channel in &self.arrivals_channels {
                push_command(&mut self.ev.out, &[unsubscribe, channel.as_bytes()]);
            }
        }
    }

    /// A message on the arrivals channel or on the instances' channel;
    /// false when `channel` is neither.
    pub(super) fn every_message(&mut self, channel: &[u8], payload: &[u8]) -> bool {
        let text = std::str::from_utf8(payload).unwrap_or("");
        if self.arrivals_bucket(channel).is_some() {
            let (sid, n) = text.split_once('\n').unwrap_or((text, ""));
            // The highest number heard: the floor of the next read.
            let n = n.parse::<u64>().unwrap_or(0).min(1 << 52);
            self.every_floor = self.every_floor.max(n);
            if let Some(sid) = SessionId::new(sid) {
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
            OwnedFrame::Array(parts) => parse_listed(&parts, 2),
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

/// A cluster's all-sessions read, merged from its buckets' answers.
pub(super) struct Merge {
    id: u64,
    to: Ticket,
    scope: Scope,
    after: Option<u64>,
    limit: usize,
    rounds: u8,
    /// Buckets not answered yet in this round.
    owed: usize,
    failed: bool,
    /// The least floor, and the least number a bucket's listing stopped
    /// at, of this round.
    floor: u64,
    cut: u64,
    /// Each bucket's listing of this round.
    listed: Vec<Vec<Listed>>,
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

/// The arguments of an all-sessions read: the cursor, the limit, the
/// scope, and in a cluster the floor.
fn every_args(scope: &Scope, after: Option<u64>, limit: usize, floor: Option<u64>) -> Vec<String> {
    let after = after.map_or_else(String::new, |a| a.to_string());
    let (kind, value) = match scope {
        Scope::Every => ("*", ""),
        Scope::Prefix(p) => ("p", &**p),
        Scope::Session(s) => ("s", s.as_str()),
    };
    let mut args = vec![after, limit.to_string(), kind.into(), value.into()];
    args.extend(floor.map(|f| f.to_string()));
    args
}

/// `ok`, where to resume (or `''`; in a cluster where the bucket's
/// listing stopped, and its floor), then from `head` on the number, sid,
/// seq and record of each prompt listed. A record that does not parse is
/// left out (a damaged prompt is not offered to an agent).
fn parse_listed(parts: &[OwnedFrame], head: usize) -> Result<EveryRead, String> {
    let resume = match parts.get(1).map(text_of).transpose()?.as_deref() {
        None | Some("") => None,
        Some(n) => Some(n.parse().map_err(|_| "a resume number")?),
    };
    let mut out = Vec::with_capacity(parts.len().saturating_sub(2) / 4);
    for p in parts.get(head..).unwrap_or(&[]).chunks(4) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::Link;
    use crate::store::redis::codec::{push_array, push_bulk};
    use crate::store::types::ConnId;

    fn store() -> RedisStore {
        RedisStore::for_test("redis-cluster://127.0.0.1:7000", 10)
    }

    /// One bucket's answer: `floor`, and prompts `(number, sid)`.
    fn answer(floor: u64, listed: &[(u64, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        push_array(&mut out, 3 + 4 * listed.len());
        push_bulk(&mut out, &[b"ok"]);
        push_bulk(&mut out, &[b""]);
        push_bulk(&mut out, &[floor.to_string().as_bytes()]);
        for (n, sid) in listed {
            push_bulk(&mut out, &[n.to_string().as_bytes()]);
            push_bulk(&mut out, &[sid.as_bytes()]);
            push_bulk(&mut out, &[b"1"]);
            push_bulk(&mut out, &[b"P\nc\n\n1\n{\"x\":1,\"seq\":"]);
        }
        out
    }

    fn listed(r: &mut RedisStore) -> Option<Vec<(u64, String)>> {
        match r.ready.pop_front()? {
            StoreEvent::EveryPage {
                result: Ok(read), ..
            } => Some(
                read.listed
                    .iter()
                    .map(|l| (l.n, l.sid.to_string()))
                    .collect(),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_merged_read_lists_nothing_above_the_least_floor_and_reads_again_for_it() {
        let mut r = store();
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        r.read_every(Ticket { conn, n: 1 }, &Scope::Every, Some(7), 10);
        let calls = String::from_utf8_lossy(&r.cmd.out).matches("every").count();
        assert_eq!(calls, BUCKETS);
        assert!(String::from_utf8_lossy(&r.cmd.out).contains("$1\r\n7\r\n"));
        r.cmd.out.clear();
        // Bucket 0 is behind: what bucket 1 holds above its floor waits.
        let mut replies = answer(1063, &[(1000, "a")]);
        replies.extend(answer(2063, &[(2001, "b")]));
        for _ in 2..BUCKETS {
            replies.extend(answer(5063, &[]));
        }
        r.input(Link::Command, &replies).unwrap();
        assert!(listed(&mut r).is_none(), "read again first");
        // Again, every counter raised to the highest floor heard.
        let again = String::from_utf8_lossy(&r.cmd.out).to_string();
        assert_eq!(again.matches("every").count(), BUCKETS);
        assert!(again.contains("$4\r\n5063\r\n"), "{again}");
        let mut replies = answer(5063 + 64, &[(1000, "a")]);
        replies.extend(answer(5063 + 1, &[(2001, "b"), (5002, "c")]));
        for _ in 2..BUCKETS {
            replies.extend(answer(5063, &[]));
        }
        r.input(Link::Command, &replies).unwrap();
        let got = listed(&mut r).unwrap();
        let want = [(1000, "a"), (2001, "b"), (5002, "c")];
        assert_eq!(got, want.map(|(n, s)| (n, s.to_string())));
        assert!(r.merges.is_empty());
    }

    #[test]
    fn a_merged_read_fails_when_a_bucket_does() {
        let mut r = store();
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        r.read_every(Ticket { conn, n: 1 }, &Scope::Every, None, 10);
        let mut replies = b"-CLUSTERDOWN relay: no master for the slot\r\n".to_vec();
        for _ in 1..BUCKETS {
            replies.extend(answer(5063, &[(5000, "a")]));
        }
        r.input(Link::Command, &replies).unwrap();
        let Some(StoreEvent::EveryPage { result, .. }) = r.ready.pop_front() else {
            panic!("no page");
        };
        assert_eq!(result.err().map(|e| e.status), Some(503));
        assert!(r.merges.is_empty());
        assert!(
            r.every_again_owed,
            "its poll reads again with the next probe"
        );
    }

    #[test]
    fn with_replicas_a_merged_page_waits_for_the_wait_after_its_calls() {
        for (confirmed, reply) in [(true, &b":1\r\n"[..]), (false, b":0\r\n")] {
            let mut r = store();
            r.replicas = 1;
            let conn = ConnId {
                key: 1,
                generation: 1,
            };
            r.read_every(Ticket { conn, n: 1 }, &Scope::Every, None, 10);
            let out = r.take_output(Link::Command);
            assert!(
                String::from_utf8_lossy(&out).contains("WAIT"),
                "a WAIT follows"
            );
            let mut replies = Vec::new();
            for _ in 0..BUCKETS {
                replies.extend(answer(5063, &[(5000, "a")]));
            }
            r.input(Link::Command, &replies).unwrap();
            assert!(r.ready.is_empty(), "held until the WAIT is answered");
            r.input(Link::Command, reply).unwrap();
            let Some(StoreEvent::EveryPage { result, .. }) = r.ready.pop_front() else {
                panic!("no page");
            };
            match confirmed {
                true => assert_eq!(result.map(|p| p.listed.len()).ok(), Some(10)),
                false => assert_eq!(result.err().map(|e| e.status), Some(503)),
            }
        }
    }
}
