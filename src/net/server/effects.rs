//! The relay's effects applied to other connections: wake a parked poll,
//! deliver an answer to subscribers, close a deleted session's
//! subscribers, give a write its committed result.

use super::*;

impl Server {
    /// Applies the relay's queued effects to other connections.
    pub(super) fn apply_effects(&mut self) {
        self.cx.relay.take_effects(&mut self.effects);
        while !self.effects.is_empty() {
            for effect in std::mem::take(&mut self.effects) {
                self.apply(effect);
            }
            self.cx.relay.take_effects(&mut self.effects);
        }
    }

    pub(super) fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Deliver {
                sid,
                seq,
                prev,
                frame,
            } => subscriber::deliver(&mut self.conns, &mut self.cx, &sid, seq, prev, frame),
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
                subscriber::broadcast(&mut self.conns, &mut self.cx, &sid, frame)
            }
            Effect::Refill { sid, resync } => {
                subscriber::refill_all(&mut self.conns, &mut self.cx, &sid, resync)
            }
            Effect::Retry { to } => {
                if let Some(conn) = lookup(&mut self.conns, to.conn) {
                    parked::retry(to, conn, &mut self.cx);
                }
            }
        }
    }
}
