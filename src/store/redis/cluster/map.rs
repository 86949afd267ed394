//! The slot map: `CLUSTER SLOTS` asked and read into the node table and
//! each slot's master; read again (at most every `REFRESH_MS`) when a
//! master is lost, a `MOVED` or an unsolicited `SUNSUBSCRIBE` says a slot
//! moved, or a slot has no master; a node that becomes a master gets the
//! set-up the others had.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

use super::resp::args;
use super::{MAX_NODES, NO_NODE, Router, SLOTS, Wait};
use crate::store::redis::codec::push_command;
use crate::time::Millis;

/// The map is read again at most this often (ms).
const REFRESH_MS: u64 = 150;

impl Router {
    /// Node `i` is a master now: one connected already gets the set-up
    /// the others had (replies swallowed).
    pub(super) fn became_master(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.master = true;
        if n.cmd.open {
            for r in &self.replay {
                n.cmd.out.extend_from_slice(r);
                n.waits.push_back(Wait::Swallow);
            }
        }
    }

    pub(super) fn refresh_soon(&mut self, now: Millis) {
        let at = Millis(now.0.max(self.last_refresh.0 + REFRESH_MS));
        self.refresh_at = Some(self.refresh_at.map_or(at, |a| a.min(at)));
    }

    pub(super) fn ask_map(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        push_command(&mut n.cmd.out, &[b"CLUSTER", b"SLOTS"]);
        n.waits.push_back(Wait::Slots);
        self.asking_map = true;
    }

    /// `CLUSTER SLOTS` answered by node `i`.
    #[inline(never)]
    pub(super) fn map_read(&mut self, i: usize, frame: &[u8], now: Millis) {
        if frame.starts_with(b"-ERR This instance has cluster support disabled") {
            self.map_set(
                &[(0, SLOTS - 1, self.nodes[i].host.clone(), self.nodes[i].port)],
                now,
            );
            return;
        }
        let Ok(Some((OwnedFrame::Array(ranges), _))) = decode(frame) else {
            self.refresh_soon(now);
            return;
        };
        let mut map = Vec::new();
        for r in ranges {
            let OwnedFrame::Array(r) = r else { continue };
            let (
                Some(OwnedFrame::Integer(a)),
                Some(OwnedFrame::Integer(b)),
                Some(OwnedFrame::Array(m)),
            ) = (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            let (Some(host), Some(OwnedFrame::Integer(port))) = (m.first(), m.get(1)) else {
                continue;
            };
            let host = match host {
                OwnedFrame::BulkString(h) | OwnedFrame::SimpleString(h) => {
                    String::from_utf8_lossy(h).into_owned()
                }
                _ => continue,
            };
            // An empty host is the node asked.
            let host = if host.is_empty() || host == "?" {
                self.nodes[i].host.clone()
            } else {
                host
            };
            let (Ok(a), Ok(b), Ok(port)) = (
                usize::try_from(*a),
                usize::try_from(*b),
                u16::try_from(*port),
            ) else {
                continue;
            };
            if a <= b && b < SLOTS {
                map.push((a, b, host, port));
            }
        }
        if map.is_empty() {
            self.refresh_soon(now);
            return;
        }
        self.map_set(&map, now);
    }

    fn map_set(&mut self, map: &[(usize, usize, String, u16)], now: Millis) {
        let mut owner = vec![NO_NODE; SLOTS];
        let mut masters = [false; MAX_NODES];
        for (a, b, host, port) in map {
            let Some(n) = self.node_of(host, *port) else {
                continue;
            };
            masters[n] = true;
            owner[*a..=*b].fill(n as u8);
        }
        let mut news = false;
        for (k, &master) in masters.iter().enumerate().take(self.nodes.len()) {
            if master && !self.nodes[k].master {
                news = true;
                self.became_master(k);
            }
            self.nodes[k].master = master;
        }
        for (s, (new, old)) in owner.iter().zip(&self.owner).enumerate() {
            if new != old && self.inflight[s] > 0 {
                self.held_slot[s] = true;
            }
        }
        self.gaps = owner.contains(&NO_NODE);
        self.owner = owner;
        self.map_known = true;
        if news {
            self.events_lost();
        }
        // What the engine sent while the map was read goes where it says,
        // in the engine's order (a master still connecting keeps it).
        for c in std::mem::take(&mut self.early) {
            if let Some((len, count, a)) = args(&c) {
                self.command(&c[..len], count, a, now);
            }
        }
        self.link_check(now);
    }
}
