//! The events link over every master's events socket: the engine's
//! subscriptions routed (`SSUBSCRIBE`/`SUNSUBSCRIBE` by the channel's
//! slot, any other to one master), its `PING` answered once every master
//! answered, frames given to it whole, and the link started again when a
//! socket is lost, a subscribed channel's slot moves, or a master is new.

use super::resp::{Args, first_word};
use super::{Half, Notice, Router};
use crate::store::redis::link::Link;
use crate::store::redis::slot::slot_of;
use crate::time::Millis;

/// What a reply on an events socket is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EvWait {
    /// Given to the engine.
    Pass,
    Swallow,
    /// Part of the `PING` barrier `n`.
    Ping(u64),
    /// `SUNSUBSCRIBE`: its confirmation is the engine's.
    Unsub,
}

impl Router {
    /// The engine's events link is lost: every events socket starts
    /// again, so no subscription outlives it.
    pub(super) fn events_lost(&mut self) {
        if self.ev_linked {
            self.ev_linked = false;
            self.notices.push(Notice::Lost(Link::Events));
        }
        self.pings.clear();
        self.to_engine[1].clear();
        for n in &mut self.nodes {
            if n.ev.open {
                n.drop_ev = true;
                n.ev = Half::default();
                n.ev_waits.clear();
            }
        }
    }

    pub(super) fn event_command(&mut self, cmd: &[u8], count: usize, a: Args) {
        let arg = |k: usize| &cmd[a[k].0..a[k].1];
        let name = arg(0);
        let up = |n: &[u8]| name.eq_ignore_ascii_case(n);
        if !self.ev_linked {
            return;
        }
        if up(b"PING") {
            let id = self.ping_next;
            self.ping_next += 1;
            let mut k = 0;
            for n in self.nodes.iter_mut().filter(|n| n.master && n.ev.open) {
                n.ev.out.extend_from_slice(cmd);
                n.ev_waits.push_back(EvWait::Ping(id));
                k += 1;
            }
            self.pings.push_back((id, k));
            return;
        }
        let every = up(b"AUTH") || up(b"HELLO") || up(b"CLIENT") || up(b"SELECT");
        let sharded = (up(b"SSUBSCRIBE") || up(b"SUNSUBSCRIBE")) && count > 1;
        let to = if sharded {
            usize::from(self.owner[usize::from(slot_of(arg(1)))])
        } else {
            self.home
        };
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !(n.master && n.ev.open) || !(every || i == to) {
                continue;
            }
            n.ev.out.extend_from_slice(cmd);
            n.ev_waits.push_back(match () {
                _ if i != to => EvWait::Swallow,
                _ if up(b"SUNSUBSCRIBE") => EvWait::Unsub,
                _ => EvWait::Pass,
            });
        }
    }

    /// One frame on node `i`'s events socket.
    pub(super) fn on_event(&mut self, i: usize, frame: &[u8], now: Millis) -> Result<(), String> {
        let kind = first_word(frame);
        let push = matches!(kind, Some(b"message" | b"smessage" | b"pmessage"));
        if push {
            self.to_engine[1].extend_from_slice(frame);
            return Ok(());
        }
        let n = &mut self.nodes[i];
        if kind == Some(b"sunsubscribe") && n.ev_waits.front() != Some(&EvWait::Unsub) {
            // The slot of a subscribed channel moved.
            self.events_lost();
            self.refresh_soon(now);
            return Ok(());
        }
        let Some(w) = n.ev_waits.pop_front() else {
            return Err("an event nobody asked for".into());
        };
        match w {
            EvWait::Swallow => {}
            EvWait::Pass | EvWait::Unsub => {
                if frame.starts_with(b"-MOVED") || frame.starts_with(b"-ASK") {
                    self.events_lost();
                    self.refresh_soon(now);
                } else {
                    self.to_engine[1].extend_from_slice(frame);
                }
            }
            EvWait::Ping(id) => {
                let Some(p) = self.pings.iter_mut().find(|p| p.0 == id) else {
                    return Ok(());
                };
                p.1 = p.1.saturating_sub(1);
                while self.pings.front().is_some_and(|p| p.1 == 0) {
                    self.pings.pop_front();
                    self.to_engine[1].extend_from_slice(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
                }
            }
        }
        Ok(())
    }
}
