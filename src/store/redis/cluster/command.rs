//! The command link: the engine's commands routed (by the slot of their
//! key, set-up to every master, `WAIT` to the masters written to),
//! `-MOVED`, `-ASK` and `-TRYAGAIN` followed while the slot's later
//! commands wait behind the one sent again (`held`), and the replies given
//! to the engine in the order it sent the commands (`order`), whatever
//! order the masters answer in.

use super::resp::{Args, find, int};
use super::{Entry, Held, Router, SLOTS, Wait};
use crate::store::redis::MAX_INFLIGHT;
use crate::store::redis::codec::push_command;
use crate::store::redis::slot::slot_of;
use crate::time::Millis;

/// Engine commands waiting for their reply at most (beyond: refused in
/// place); the engine keeps far fewer in flight.
const MAX_ORDER: usize = MAX_INFLIGHT * 2 + 1024;
/// Redirections of one command before its error goes to the engine.
const MAX_REDIRECTS: u8 = 8;
/// Set-up commands kept for nodes connected later.
const MAX_REPLAY: usize = 16;
/// Engine commands without a slot (`PING`) count against no slot.
const NO_SLOT: u16 = u16::MAX;

impl Router {
    /// One reply on node `i`'s command socket.
    pub(super) fn on_reply(&mut self, i: usize, frame: &[u8], now: Millis) -> Result<(), String> {
        let n = &mut self.nodes[i];
        let Some(w) = n.waits.pop_front() else {
            return Err("a reply nobody asked for".into());
        };
        match w {
            Wait::Swallow => Ok(()),
            Wait::Slots => {
                self.asking_map = false;
                self.map_read(i, frame, now);
                Ok(())
            }
            Wait::Part { seq } => {
                self.part(seq, Some(frame));
                Ok(())
            }
            Wait::Engine {
                seq,
                slot,
                len,
                tries,
            } => {
                let len = len as usize;
                if n.kept.len() < len {
                    return Err("lost track of a command".into());
                }
                if frame.first() == Some(&b'-') && tries < MAX_REDIRECTS {
                    let redirect = self.redirect(frame, now);
                    if let Some((ask, at)) = redirect {
                        let bytes: Vec<u8> = self.nodes[i].kept.drain(..len).collect();
                        self.slot_done(slot);
                        self.hold(Held {
                            seq,
                            slot,
                            tries: tries + 1,
                            bytes,
                            ask,
                            at,
                        });
                        return Ok(());
                    }
                }
                self.nodes[i].kept.drain(..len);
                self.slot_done(slot);
                self.deliver(seq, frame);
                Ok(())
            }
        }
    }

    /// An error reply: `Some((ask target, not before))` when it is a
    /// redirection or a retry (the map updated by a `MOVED`).
    fn redirect(&mut self, frame: &[u8], now: Millis) -> Option<(Option<usize>, Millis)> {
        let text = std::str::from_utf8(frame.get(1..frame.len().saturating_sub(2))?).ok()?;
        let mut words = text.split(' ');
        let kind = words.next()?;
        if kind == "TRYAGAIN" {
            return Some((None, Millis(now.0 + 25)));
        }
        if kind != "MOVED" && kind != "ASK" {
            return None;
        }
        let slot: usize = words.next()?.parse().ok().filter(|s| *s < SLOTS)?;
        let (host, port) = words.next()?.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let to = self.node_of(host, port)?;
        if kind == "ASK" {
            return Some((Some(to), now));
        }
        if !self.nodes[to].master {
            self.became_master(to);
            self.events_lost();
        }
        self.owner[slot] = to as u8;
        self.refresh_soon(now);
        Some((None, now))
    }

    fn hold(&mut self, h: Held) {
        self.held_slot[usize::from(h.slot)] = true;
        let at = self
            .held
            .iter()
            .position(|o| o.seq > h.seq)
            .unwrap_or(self.held.len());
        self.held.insert(at, h);
    }

    pub(super) fn slot_done(&mut self, slot: u16) {
        let s = usize::from(slot);
        if let Some(c) = self.inflight.get_mut(s) {
            *c = c.saturating_sub(1);
            // Held for a map change only: nothing waits behind it now.
            if *c == 0 && self.held_slot[s] && !self.held.iter().any(|h| h.slot == slot) {
                self.held_slot[s] = false;
            }
        }
    }

    /// Sends the held commands of every slot nothing is in flight for.
    pub(super) fn release(&mut self, now: Millis) {
        if self.held.is_empty() {
            return;
        }
        let mut k = 0;
        // Slots whose held commands go out in this pass: the ones sent
        // before in it are in flight, and the rest follow them.
        let mut going: Vec<u16> = Vec::new();
        while k < self.held.len() {
            let h = &self.held[k];
            let slot = usize::from(h.slot);
            let blocked = self.held.iter().take(k).any(|o| o.slot == h.slot);
            let free = going.contains(&h.slot) || self.inflight[slot] == 0;
            if blocked || !free || h.at > now {
                k += 1;
                continue;
            }
            going.push(h.slot);
            let Some(h) = self.held.remove(k) else {
                break;
            };
            if !self.held.iter().any(|o| o.slot == h.slot) {
                self.held_slot[slot] = false;
            }
            let to = h.ask.unwrap_or(usize::from(self.owner[slot]));
            self.send_to(to, h.seq, h.slot, h.tries, &h.bytes, h.ask.is_some());
        }
    }

    /// Gives the engine `reply` for its command `seq`, in order.
    pub(super) fn deliver(&mut self, seq: u64, reply: &[u8]) {
        if seq < self.base {
            return;
        }
        let k = (seq - self.base) as usize;
        if k == 0 {
            self.to_engine[0].extend_from_slice(reply);
            self.order.pop_front();
            self.base += 1;
            while let Some(Entry::Done(_)) = self.order.front() {
                if let Some(Entry::Done(r)) = self.order.pop_front() {
                    self.to_engine[0].extend_from_slice(&r);
                }
                self.base += 1;
            }
        } else if let Some(e) = self.order.get_mut(k) {
            // Out of order: kept until the replies before it came.
            *e = Entry::Done(reply.to_vec());
        }
    }

    /// A master answered (or, `None`, lost) its part of command `seq`.
    pub(super) fn part(&mut self, seq: u64, frame: Option<&[u8]>) {
        if seq < self.base {
            return;
        }
        let Some(Entry::Group {
            left,
            wait,
            min,
            first,
        }) = self.order.get_mut((seq - self.base) as usize)
        else {
            return;
        };
        *left = left.saturating_sub(1);
        if *wait {
            let n = frame
                .and_then(|f| f.strip_prefix(b":"))
                .and_then(|f| f.strip_suffix(b"\r\n"))
                .and_then(|f| int(f).ok())
                .unwrap_or(0);
            *min = (*min).min(n);
        } else if let Some(f) = frame
            && (first.is_none()
                || (f.first() == Some(&b'-')
                    && first.as_ref().is_some_and(|p| p.first() != Some(&b'-'))))
        {
            *first = Some(f.to_vec());
        }
        if *left == 0 {
            let reply = if *wait {
                format!(":{}\r\n", (*min).max(0)).into_bytes()
            } else {
                first
                    .take()
                    .unwrap_or_else(|| b"-RELAYLOST no master answered\r\n".to_vec())
            };
            self.deliver(seq, &reply);
        }
    }

    pub(super) fn command(&mut self, cmd: &[u8], count: usize, a: Args, now: Millis) {
        let arg = |k: usize| &cmd[a[k].0..a[k].1];
        let seq = self.next;
        self.next += 1;
        let name = arg(0);
        let up = |n: &[u8]| name.eq_ignore_ascii_case(n);
        let wait = up(b"WAIT");
        let every =
            up(b"AUTH") || up(b"HELLO") || up(b"CLIENT") || up(b"SCRIPT") || up(b"FUNCTION");
        if self.order.len() >= MAX_ORDER {
            self.order.push_back(Entry::Waiting);
            self.deliver(seq, b"-CLUSTERDOWN relay: too many commands in flight\r\n");
            return;
        }
        if wait || every {
            let targets: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| {
                    let n = &self.nodes[i];
                    n.master && !n.cmd.down && (!wait || n.wrote)
                })
                .collect();
            if every && self.replay.len() < MAX_REPLAY && !self.replay.iter().any(|r| r == cmd) {
                self.replay.push(cmd.to_vec());
            }
            self.order.push_back(Entry::Group {
                left: targets.len() as u16,
                wait,
                min: i64::MAX,
                first: None,
            });
            if targets.is_empty() {
                let reply = if wait {
                    let mut r = b":".to_vec();
                    r.extend_from_slice(arg(1));
                    r.extend_from_slice(b"\r\n");
                    r
                } else {
                    b"-CLUSTERDOWN relay: no master\r\n".to_vec()
                };
                self.deliver(seq, &reply);
            }
            for i in targets {
                let n = &mut self.nodes[i];
                n.wrote &= !wait;
                n.cmd.out.extend_from_slice(cmd);
                n.waits.push_back(Wait::Part { seq });
            }
            return;
        }
        self.order.push_back(Entry::Waiting);
        let key = if (up(b"FCALL") || up(b"FCALL_RO") || up(b"EVALSHA")) && count > 3 {
            Some(arg(3))
        } else if (up(b"SPUBLISH") || up(b"HGETALL")) && count > 1 {
            Some(arg(1))
        } else {
            None
        };
        let Some(key) = key else {
            // PING and the like: any master.
            let to = self.nodes.iter().position(|n| n.master && n.cmd.open);
            let to = to.or_else(|| self.nodes.iter().position(|n| n.master && !n.cmd.down));
            self.send_to(to.unwrap_or(usize::MAX), seq, NO_SLOT, 0, cmd, false);
            return;
        };
        let slot = slot_of(key);
        if self.held_slot[usize::from(slot)] {
            self.hold(Held {
                seq,
                slot,
                tries: 0,
                bytes: cmd.to_vec(),
                ask: None,
                at: now,
            });
            return;
        }
        let to = usize::from(self.owner[usize::from(slot)]);
        self.send_to(to, seq, slot, 0, cmd, false);
    }

    /// Writes the engine's command `seq` to node `to` (refused in place
    /// when `to` is no master that can be reached).
    fn send_to(&mut self, to: usize, seq: u64, slot: u16, tries: u8, cmd: &[u8], asking: bool) {
        let Some(n) = self
            .nodes
            .get_mut(to)
            .filter(|n| !n.cmd.down && (n.master || asking))
        else {
            self.deliver(seq, b"-CLUSTERDOWN relay: no master for the slot\r\n");
            return;
        };
        if asking {
            push_command(&mut n.cmd.out, &[b"ASKING"]);
            n.waits.push_back(Wait::Swallow);
        }
        // A write's master owes it a `WAIT` (a script call may write; a
        // read goes by `FCALL_RO`).
        n.wrote |= cmd.get(..cmd.len().min(24)).is_some_and(|h| {
            h.starts_with(b"*")
                && (find(h, b"\n$5\r\nFCALL\r\n") || find(h, b"\n$7\r\nEVALSHA\r\n"))
        });
        n.cmd.out.extend_from_slice(cmd);
        n.kept.extend(cmd);
        n.waits.push_back(Wait::Engine {
            seq,
            slot,
            len: cmd.len() as u32,
            tries,
        });
        if let Some(c) = self.inflight.get_mut(usize::from(slot)) {
            *c += 1;
        }
    }
}
