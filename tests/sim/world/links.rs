//! The world's side of a shared-store run: which relay a step acts on,
//! what each relay writes to the simulated Redis (`shared.rs`) and reads
//! back from it and when, the faults (a link cut, Redis out of memory),
//! and each write's answer checked against its call's decision.

use super::shared::{Conn, LINKS, NODES, key_of_op};
use super::storage::Expect;
use super::*;

impl World {
    /// The relay `n` becomes [`World::node`].
    pub(super) fn enter(&mut self, n: usize) {
        if n == self.at {
            return;
        }
        let Some(next) = self.others.get_mut(n).and_then(Option::take) else {
            return;
        };
        let prev = std::mem::replace(&mut self.node, next);
        self.others[self.at] = Some(prev);
        self.at = n;
    }

    /// The end of every step: what each relay wrote to Redis is taken, as
    /// the shell writes it at the end of the loop's turn.
    pub(super) fn pump(&mut self) {
        if self.shared.is_none() {
            return;
        }
        for n in 0..NODES {
            self.enter(n);
            self.node.relay.set_clock(self.now, self.unix());
            for (l, link) in LINKS.into_iter().enumerate() {
                let Some(sh) = &self.shared else { return };
                if !sh.links[n][l].up {
                    continue;
                }
                let bytes = match self.node.relay.engine().redis() {
                    Some(r) => r.take_output(link),
                    None => Vec::new(),
                };
                if let Some(sh) = &mut self.shared {
                    sh.written(n, l, bytes);
                }
            }
        }
    }

    /// A `Storage` step of a shared-store run: links lost at the last
    /// fault connect again; then a fault strikes (`fail`), or up to `take`
    /// commands run and each relay reads some of what was sent to it.
    pub(super) fn redis(&mut self, take: u64, fail: bool) -> Check {
        let Some(sh) = &mut self.shared else {
            return Ok(());
        };
        let mut reconnect = Vec::new();
        for n in 0..NODES {
            for l in 0..2 {
                if !sh.links[n][l].up {
                    sh.links[n][l] = Conn {
                        up: true,
                        ..Conn::default()
                    };
                    reconnect.push((n, l));
                }
            }
        }
        for (n, l) in reconnect {
            self.enter(n);
            if let Some(r) = self.node.relay.engine().redis() {
                r.connected(LINKS[l]);
            }
        }
        self.pump();
        let Some(sh) = &mut self.shared else {
            return Ok(());
        };
        if fail {
            let pick = sh.rng.below(2 * NODES as u64 + 1) as usize;
            if pick == 2 * NODES {
                sh.oom = !sh.oom;
                self.seen.redis_oom += 1;
                return Ok(());
            }
            return self.cut(pick / 2, pick % 2);
        }
        // Out of memory for a while only: the next fault or a few steps
        // lift it, as an operator would.
        if sh.oom && sh.rng.below(8) == 0 {
            sh.oom = false;
        }
        let mut decided = Vec::new();
        for _ in 0..take.min(64) {
            let ready: Vec<(usize, usize)> = (0..NODES)
                .flat_map(|n| [(n, 0), (n, 1)])
                .filter(|&(n, l)| !sh.links[n][l].commands.is_empty())
                .collect();
            if ready.is_empty() {
                break;
            }
            let (n, l) = ready[sh.rng.below(ready.len() as u64) as usize];
            sh.run(n, l, &mut decided);
            self.ops += 1;
        }
        for (r, collect) in &decided {
            // The TTL counts from the activity each call brought, the
            // relay's clock when it sent it, which the model does not
            // see: a collection is counted, not timed.
            self.committed(r, false)?;
            self.seen.commits += 1;
            self.seen.collected += u64::from(*collect);
        }
        for n in 0..NODES {
            self.deliver(n)?;
        }
        Ok(())
    }

    /// Relay `n` reads some of what Redis sent it on each link, then
    /// takes it in as the shell does (`storage_done`, the effects).
    fn deliver(&mut self, n: usize) -> Check {
        self.enter(n);
        for (l, link) in LINKS.into_iter().enumerate() {
            let Some(sh) = &mut self.shared else {
                return Ok(());
            };
            let c = &mut sh.links[n][l];
            let len = c.output.len() as u64;
            let k = if sh.rng.below(3) == 0 {
                sh.rng.below(len + 1)
            } else {
                len
            };
            let bytes: Vec<u8> = c.output.drain(..k as usize).flatten().collect();
            if bytes.is_empty() {
                continue;
            }
            if crate::tracing() {
                let t = String::from_utf8_lossy(&bytes).replace("\r\n", " ");
                crate::strace!("deliver to {n}/{l}: {}", t.replace('\n', "|"));
            }
            let read = match self.node.relay.engine().redis() {
                Some(r) => r.input(link, &bytes),
                None => Ok(()),
            };
            if let Err(e) = read {
                return Err(format!("relay {n} dropped its {link:?} link: {e}"));
            }
        }
        self.node.relay.set_clock(self.now, self.unix());
        self.node.relay.storage_done(self.now);
        if crate::tracing() {
            for s in 0..SESSIONS {
                if let Some(log) = self.node.relay.peek(&sid_of(s)) {
                    crate::strace!(
                        "relay {n} copy s{s} {} next {}",
                        &log.epoch()[..4],
                        log.next_seq().get()
                    );
                }
            }
        }
        self.apply_effects()?;
        self.settle()
    }

    /// Link `l` of relay `n` is lost: what was on its way either side is
    /// gone, and the relay answers what waited on it.
    fn cut(&mut self, n: usize, l: usize) -> Check {
        if let Some(sh) = &mut self.shared {
            sh.links[n][l] = Conn::default();
            if l == 0 {
                sh.expected[n].clear();
            }
        }
        self.seen.links_cut += 1;
        crate::strace!("cut {n}/{l}");
        self.enter(n);
        // While Redis is unreachable the relay reads its copy as it is:
        // the reads under way need not reach what was stored before them.
        for c in &mut self.node.conns {
            if let State::Committing(w) = &mut c.state
                && let Waits::Read { since, .. } = &mut w.waits
            {
                *since = None;
            }
        }
        if let Some(r) = self.node.relay.engine().redis() {
            r.lost(LINKS[l]);
        }
        self.node.relay.storage_done(self.now);
        self.apply_effects()?;
        self.settle()
    }

    /// A write that waited on a ticket of relay `at` is answered
    /// `status`: the decision its own call got, or `503`/`504` when its
    /// link was lost or Redis refused it.
    pub(super) fn check_shared(&mut self, op: &Op, status: u16, body: &[u8]) -> Check {
        let Some(key) = key_of_op(op) else {
            return Ok(());
        };
        let at = self.at;
        let Some(sh) = &mut self.shared else {
            return Ok(());
        };
        let e = sh.expected[at].get_mut(&key).and_then(VecDeque::pop_front);
        match e {
            Some(Expect::Ok(seq)) if status == 200 => {
                if let Some(seq) = seq {
                    let got = json(body)?["seq"].as_u64();
                    if got != Some(seq) {
                        return Err(format!("{op} answered seq {got:?}, decided at {seq}"));
                    }
                }
                Ok(())
            }
            Some(Expect::Refused(s)) if s == status => Ok(()),
            None if status == 503 || status == 504 => Ok(()),
            e => Err(format!(
                "{op} answered {status}, its call was decided {e:?}"
            )),
        }
    }
}
