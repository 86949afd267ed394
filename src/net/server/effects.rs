//! The relay's effects applied to other connections: wake a parked poll,
//! deliver an answer to subscribers, close a deleted session's
//! subscribers, give a write its committed result.

use super::*;

impl Server {
    /// Applies the relay's queued effects to other connections.
    pub(super) fn apply_effects(&mut self) {
        self.cx.take_effects(&mut self.effects);
        while !self.effects.is_empty() {
            for effect in std::mem::take(&mut self.effects) {
                self.apply(effect);
            }
            self.cx.take_effects(&mut self.effects);
        }
    }

    pub(super) fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Deliver {
                sid,
                seq,
                prev,
                frame,
            } => {
                self.each_subscriber(&sid, |id, conn, cx| {
                    subscriber::deliver(id, conn, cx, seq, prev, &frame)
                });
            }
            Effect::Respond { to, status, body } => {
                if let Some(conn) = lookup(&mut self.conns, to) {
                    parked::answer(to, conn, &mut self.cx, status, body);
                }
            }
            Effect::CloseSubscriber { to, code } => {
                if let Some(conn) = lookup(&mut self.conns, to) {
                    subscriber::close(to, conn, &mut self.cx, code, "session deleted");
                }
            }
            Effect::Reply { to, result } => {
                if let Some(conn) = lookup(&mut self.conns, to.conn) {
                    parked::committed(to, conn, &mut self.cx, result);
                }
            }
            Effect::Broadcast { sid, frame } => {
                self.each_subscriber(&sid, |id, conn, cx| {
                    subscriber::broadcast(id, conn, cx, &frame)
                });
            }
            Effect::Refill { sid, resync } => {
                self.each_subscriber(&sid, |id, conn, cx| {
                    subscriber::refill(id, conn, cx, resync)
                });
            }
            Effect::Retry { to } => {
                if let Some(conn) = lookup(&mut self.conns, to.conn) {
                    parked::retry(to, conn, &mut self.cx);
                }
            }
        }
    }

    /// Runs a subscriber stage on every subscriber of `sid`, in the order
    /// the relay lists them: the slab is walked here, so a stage sees one
    /// connection at a time. The list is copied into a reused buffer first
    /// (the stage needs the context the relay lives in).
    fn each_subscriber(&mut self, sid: &str, mut stage: impl FnMut(ConnId, &mut Conn, &mut Ctx)) {
        let mut targets = std::mem::take(&mut self.targets);
        targets.extend_from_slice(self.cx.subscribers(sid));
        for &id in &targets {
            if let Some(conn) = lookup(&mut self.conns, id) {
                stage(id, conn, &mut self.cx);
            }
        }
        targets.clear();
        self.targets = targets;
    }
}
