//! Script calls written into the command link's pipeline: any call's
//! command (`FCALL` of the library's function or `EVALSHA` of the
//! script's SHA-1, the session's keys, the arguments every call carries,
//! then its own), with the reply it expects queued behind it; and the
//! prompts of one loop turn gathered into one `prompts` call. Each
//! operation's own arguments, and the reading of its answer, are
//! `calls.rs`.
//!
//! Invariants: calls reach Redis in the order they were asked for (any
//! other call first sends the prompts gathered before it); a call asked
//! for while the command link is down is answered `503` at once; one call
//! carries at most [`MAX_BATCH`] prompts; in cluster mode every key a
//! call names shares its bucket's hash tag, and it names every key it
//! may touch but those it finds on its way (`Op::cluster_keys`).

use super::calls::{Op, Write};
use super::codec::{Common, push_array, push_bulk, push_common, push_number};
use super::route::Expect;
use super::slot::{bucket_cap, bucket_of};
use super::{Known, RedisStore};
use crate::error::ApiError;
use crate::store::types::{SessionId, Ticket};

/// A prompt gathered for the turn's call.
#[derive(Debug)]
pub(super) struct Gathered {
    pub(super) conn: Ticket,
    pub(super) sid: SessionId,
    pub(super) id: String,
    /// The record the script stores (see `record` in `calls.rs`).
    pub(super) record: String,
    pub(super) known_epoch: String,
    pub(super) known_next: u64,
}

/// Prompts one script call carries at most: Redis runs nothing else
/// while it stores them.
pub(super) const MAX_BATCH: usize = 64;

impl RedisStore {
    /// One script call: the session's keys, the common arguments, then
    /// `extra`. Without a connection the requester is answered `503` now.
    /// Written straight into the link's buffer: a prompt's call is about
    /// twenty arguments, and a turn may hold thousands of calls.
    #[inline(never)]
    pub(super) fn call(
        &mut self,
        sid: &str,
        op: Op,
        known: Known,
        extra: &[&[u8]],
        expect: Expect,
    ) {
        let bucket = self.bucket(sid);
        self.call_in(bucket, sid, op, known, extra, expect);
    }

    /// A call of `op` that names no session, on bucket `bucket` in a
    /// cluster (on the one Redis otherwise).
    pub(super) fn call_bucket(&mut self, bucket: usize, op: Op, extra: &[&[u8]], expect: Expect) {
        self.call_in(bucket, "", op, Known::default(), extra, expect);
    }

    fn call_in(
        &mut self,
        bucket: usize,
        sid: &str,
        op: Op,
        known: Known,
        extra: &[&[u8]],
        expect: Expect,
    ) {
        if !self.cmd.up {
            self.fail(expect, ApiError::storage_unavailable());
            return;
        }
        // Calls run in the order they were asked for.
        self.send_batch();
        let epoch = if op.creates() {
            self.ids.uuid()
        } else {
            String::new()
        };
        let cluster = self.cluster();
        let cap = self.cap();
        let (p, sid) = match cluster {
            true => (self.bases[bucket].as_bytes(), sid.as_bytes()),
            false => (self.prefix.as_bytes(), sid.as_bytes()),
        };
        let out = &mut self.cmd.out;
        let keys = op.cluster_keys();
        let nkeys = if cluster { keys.len() } else { 3 };
        push_array(out, 14 + nkeys + extra.len());
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(op).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_number(out, nkeys as u64);
        if cluster {
            for k in keys {
                let (suffix, own) = k.suffix();
                push_bulk(out, &[p, suffix, if own { sid } else { b"" }]);
            }
        } else {
            push_bulk(out, &[p, b"s:", sid]);
            push_bulk(out, &[self.sessions_key.as_bytes()]);
            push_bulk(out, &[p, b"w:", sid]);
        }
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: op.name().as_bytes(),
            sid,
            known,
            epoch: epoch.as_bytes(),
            channel: &[p, b"e:", sid],
            cap,
        };
        push_common(out, common);
        for a in extra {
            push_bulk(out, &[a]);
        }
        self.stats.commands += 1;
        if self.replicas > 0 && matches!(expect, Expect::Write { .. }) {
            self.unwaited = true;
        }
        self.expect.push_back(expect);
    }

    /// Sessions a call may find its keys' Redis holding before it
    /// creates none: the cap, or in a cluster its bucket's share, since
    /// no call can count the sessions of every bucket.
    fn cap(&self) -> u64 {
        let max = self.limits.max_sessions;
        match self.cluster() {
            true => bucket_cap(max) as u64,
            false => max as u64,
        }
    }

    /// The gathered prompts: one `prompt` call, or one `prompts` call for
    /// several; in a cluster, one per bucket (a call names one slot).
    #[inline(never)]
    pub(super) fn send_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if !self.cluster() || batch.len() <= 1 {
            self.send_gathered(0, batch);
            return;
        }
        // The first prompt's bucket, then the next left: a session's
        // prompts keep their order.
        while let Some(first) = batch.first() {
            let b = bucket_of(first.sid.as_bytes());
            let (this, rest): (Vec<_>, Vec<_>) =
                (batch.into_iter()).partition(|g| bucket_of(g.sid.as_bytes()) == b);
            self.send_gathered(b, this);
            batch = rest;
        }
    }

    /// The prompts of `batch`, all of bucket `bucket` in a cluster.
    fn send_gathered(&mut self, bucket: usize, mut batch: Vec<Gathered>) {
        if batch.len() <= 1 {
            if let Some(g) = batch.pop() {
                let extra: [&[u8]; 2] = [g.id.as_bytes(), g.record.as_bytes()];
                let known = Known {
                    epoch: &g.known_epoch,
                    next: g.known_next,
                };
                let expect = Expect::Write {
                    conn: g.conn,
                    sid: g.sid.clone(),
                    write: Write::Prompt { id: g.id.clone() },
                };
                self.call(&g.sid, Op::Prompt, known, &extra, expect);
            }
            return;
        }
        let n = batch.len();
        let cluster = self.cluster();
        let cap = self.cap();
        let p = match cluster {
            true => self.bases[bucket].as_bytes(),
            false => self.prefix.as_bytes(),
        };
        let out = &mut self.cmd.out;
        // In a cluster the bucket's generation follows the sessions.
        let nkeys = 3 + n + usize::from(cluster);
        push_array(out, 14 + nkeys + n * 6);
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(Op::Prompts).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_number(out, nkeys as u64);
        if cluster {
            // Every key the call may touch, the first routing it.
            push_bulk(out, &[p, b"pending"]);
            push_bulk(out, &[p, b"sessions"]);
            push_bulk(out, &[p, b"arrived"]);
        } else {
            push_bulk(out, &[]);
            push_bulk(out, &[self.sessions_key.as_bytes()]);
            push_bulk(out, &[]);
        }
        for g in &batch {
            push_bulk(out, &[p, b"s:", g.sid.as_bytes()]);
        }
        if cluster {
            push_bulk(out, &[p, b"generation"]);
        }
        // Each prompt brings its own session, cursor and epoch (below).
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: Op::Prompts.name().as_bytes(),
            sid: b"",
            known: Known::default(),
            epoch: b"",
            channel: &[],
            cap,
        };
        push_common(out, common);
        for g in &batch {
            let epoch = self.ids.uuid();
            push_bulk(out, &[g.sid.as_bytes()]);
            push_bulk(out, &[g.known_epoch.as_bytes()]);
            push_number(out, g.known_next);
            push_bulk(out, &[epoch.as_bytes()]);
            push_bulk(out, &[g.id.as_bytes()]);
            push_bulk(out, &[g.record.as_bytes()]);
        }
        self.stats.commands += 1;
        self.unwaited |= self.replicas > 0;
        let waiting = batch.drain(..).map(|g| (g.conn, g.sid, g.id)).collect();
        self.expect.push_back(Expect::Prompts(waiting));
    }
}

#[cfg(test)]
mod tests {
    use redis_protocol::resp2::decode::decode;
    use redis_protocol::resp2::types::OwnedFrame;

    use super::*;
    use crate::store::redis::reply::bytes_of;
    use crate::store::redis::slot::slot_of;
    use crate::store::types::ConnId;

    fn store(url: &str) -> RedisStore {
        RedisStore::for_test(url, 100_000)
    }

    /// A command's keys, and its arguments.
    type Command = (Vec<Vec<u8>>, Vec<Vec<u8>>);

    /// Each command written.
    fn commands(out: &[u8]) -> Vec<Command> {
        let (mut at, mut all) = (0, Vec::new());
        while let Ok(Some((OwnedFrame::Array(parts), used))) = decode(&out[at..]) {
            at += used;
            let parts: Vec<Vec<u8>> = parts.iter().map(|p| bytes_of(p).to_vec()).collect();
            let n: usize = std::str::from_utf8(&parts[2]).unwrap().parse().unwrap();
            all.push((parts[3..3 + n].to_vec(), parts[3 + n..].to_vec()));
        }
        all
    }

    const OPS: [Op; 14] = [
        Op::Prompt,
        Op::Response,
        Op::Part,
        Op::Cancel,
        Op::Create,
        Op::Delete,
        Op::Sync,
        Op::Renew,
        Op::Agent,
        Op::Watch,
        Op::Ask,
        Op::Reply,
        Op::Touch,
        Op::Collect,
    ];

    #[test]
    fn in_a_cluster_every_key_and_channel_of_a_call_is_in_its_session_s_slot() {
        let mut r = store("redis-cluster://127.0.0.1:7000");
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        for (i, sid) in ["a", "b", "c", "d"].iter().enumerate() {
            for op in OPS {
                r.call(sid, op, Known::default(), &[b"x"], Expect::Quiet);
            }
            // Two prompts of two sessions in one turn: one call each.
            for (k, s) in [sid.to_string(), format!("{sid}{i}")].iter().enumerate() {
                r.batch.push(Gathered {
                    conn: Ticket { conn, n: 1 },
                    sid: SessionId::new(s).unwrap(),
                    id: format!("c{k}"),
                    record: "r".into(),
                    known_epoch: String::new(),
                    known_next: 0,
                });
            }
            r.send_batch();
        }
        for b in 0..BUCKETS_PROBED {
            r.call_bucket(b, Op::Every, &[b"", b"1", b"*", b"", b"0"], Expect::Quiet);
            r.call_bucket(b, Op::Probe, &[], Expect::Quiet);
        }
        let all = commands(&r.cmd.out);
        assert_eq!(all.len(), 4 * (OPS.len() + 2) + 2 * BUCKETS_PROBED);
        for (keys, args) in all {
            let slot = slot_of(&keys[0]);
            for k in &keys {
                assert!(k.starts_with(b"t:{"), "{}", String::from_utf8_lossy(k));
                assert_eq!(slot_of(k), slot, "{}", String::from_utf8_lossy(k));
            }
            // The prefix the script builds keys from, and the channel.
            assert_eq!(slot_of(&args[10]), slot);
            if !args[9].is_empty() {
                assert_eq!(slot_of(&args[9]), slot);
            }
        }
    }

    const BUCKETS_PROBED: usize = 3;

    #[test]
    fn without_a_cluster_a_call_names_the_keys_it_always_did() {
        let mut r = store("redis://127.0.0.1:6379");
        r.call(
            "s",
            Op::Prompt,
            Known::default(),
            &[b"c", b"r"],
            Expect::Quiet,
        );
        let all = commands(&r.cmd.out);
        let (keys, args) = &all[0];
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        assert_eq!(keys, [&b"t:s:s"[..], b"t:sessions", b"t:w:s"]);
        assert_eq!(args[9], b"t:e:s");
        assert_eq!(args[10], b"t:");
        assert_eq!(args[6], b"100000", "the cap itself");
    }
}

/// Writes the calls a cluster relay makes, one of each kind, as RESP
/// into the file `RELAY_DUMP_CALLS` names, and the library to load into
/// `<file>.lua`: for trying them on a real cluster by hand
/// (`cargo test --lib dump_cluster_calls -- --ignored`).
#[cfg(test)]
#[test]
#[ignore]
fn dump_cluster_calls() {
    use crate::store::mem::StoreLimits;
    use crate::store::redis::{Link, RedisUrl};
    let Ok(path) = std::env::var("RELAY_DUMP_CALLS") else {
        return;
    };
    let limits = StoreLimits {
        history_limit: 2,
        max_sessions: 1000,
        max_pending: 10,
        draft_timeout_ms: 60_000,
    };
    let url = RedisUrl::parse("redis-cluster://127.0.0.1:7000").unwrap();
    let mut r = RedisStore::new(url, "t:", limits);
    r.connected(Link::Command);
    r.cmd.out.clear();
    r.fcall = true;
    r.unix_ms = 1_795_800_000_000;
    let ts = "1795800000000";
    let q = Expect::Quiet;
    for sid in ["a", "b", "c", "dd", "e"] {
        let k = Known::default();
        let rec = |kind: &str, cid: &str, aid: &str| {
            format!("{kind}\n{cid}\n{aid}\n{ts}\n{{\"session_id\":\"{sid}\",\"x\":1,\"seq\":")
        };
        let call = |r: &mut RedisStore, op: Op, extra: &[&str]| {
            let extra: Vec<&[u8]> = extra.iter().map(|a| a.as_bytes()).collect();
            r.call(sid, op, Known::default(), &extra, Expect::Quiet);
        };
        r.call(sid, Op::Create, k, &[], Expect::Quiet);
        for cid in ["c1", "c2", "c3"] {
            call(&mut r, Op::Prompt, &[cid, &rec("P", cid, "")]);
        }
        call(
            &mut r,
            Op::Part,
            &["c1", "a1", "\"p\"", "1", "60000", "1000"],
        );
        let a = rec("A", "c1", "a1");
        call(&mut r, Op::Response, &["c1", "a1", "0", "\"hi\"", &a]);
        call(&mut r, Op::Cancel, &["c2", &rec("X", "c2", "")]);
        let expires = "1795900000000";
        call(
            &mut r,
            Op::Ask,
            &["k1", "", "\"q\"", "", &rec("K", "k1", expires)],
        );
        call(&mut r, Op::Reply, &["k1", "\"a\"", &rec("Y", "k1", "")]);
        call(&mut r, Op::Agent, &["i1", "1795900000000", ts]);
        call(&mut r, Op::Watch, &["i1", "1795900000000"]);
        call(&mut r, Op::Sync, &[]);
        call(&mut r, Op::Renew, &[]);
        r.batch.clear();
    }
    // A turn's prompts of several sessions: one call per bucket.
    for (i, sid) in ["a", "f", "g", "a"].iter().enumerate() {
        r.batch.push(Gathered {
            conn: Ticket {
                conn: crate::store::types::ConnId {
                    key: 1,
                    generation: 1,
                },
                n: i as u64,
            },
            sid: SessionId::new(sid).unwrap(),
            id: format!("t{i}"),
            record: format!("P\nt{i}\n\n{ts}\n{{\"x\":1,\"seq\":"),
            known_epoch: String::new(),
            known_next: 0,
        });
    }
    r.send_batch();
    for b in 0..super::slot::BUCKETS {
        r.call_bucket(b, Op::Every, &[b"", b"10", b"*", b"", b"5"], Expect::Quiet);
        r.call_bucket(b, Op::Probe, &[], Expect::Quiet);
        r.call_bucket(b, Op::Touch, &[b"a", b"b"], Expect::Quiet);
    }
    let extra: [&[u8]; 5] = [b"i1", b"*", b"1795900000000", ts.as_bytes(), b"1"];
    r.call_bucket(0, Op::EveryAgent, &extra, Expect::Quiet);
    r.call("b", Op::Delete, Known::default(), &[], q);
    for b in 0..super::slot::BUCKETS {
        r.call_bucket(b, Op::Collect, &[b"0"], Expect::Quiet);
    }
    std::fs::write(&path, &r.cmd.out).unwrap();
    std::fs::write(format!("{path}.lua"), &r.functions.library).unwrap();
}
