//! The parked stage: a `GET /prompts` waiting for a prompt. It costs nothing
//! until its deadline or a wake; later pipelined requests stay buffered,
//! unparsed, and are answered in order once it is. Invariant: a `Parked`
//! connection has exactly one waiter entry in the relay.

use std::rc::Rc;

use super::conn::{Parked, Phase};
use super::server::{LINGER, Server};
use crate::http::response::{self, Meta};
use crate::relay::ConnId;
use crate::time::Millis;

impl Server {
    /// Parks a connection on a long-poll until `deadline`.
    pub(super) fn park(&mut self, id: ConnId, parked: Parked, deadline: Millis) {
        let Some(conn) = self.conn(id) else { return };
        let phase = std::mem::replace(&mut conn.phase, Phase::Closing { shut: false });
        conn.phase = match phase {
            Phase::Http(h) => Phase::Parked(h, parked),
            other => other,
        };
        self.set_deadline(id, deadline);
    }

    /// A parked poll keeps reading (up to the head cap) only to notice a
    /// hang-up; its buffered requests wait until it is answered.
    pub(super) fn read_parked(&mut self, id: ConnId) {
        let Some(conn) = self.conn(id) else { return };
        let Phase::Parked(h, _) = &conn.phase else {
            return;
        };
        let want = h.reader.want();
        self.fill(id, want);
    }

    /// Answers a parked poll and returns it to reading requests; its
    /// buffered pipelined requests are handled in this same turn.
    pub(super) fn answer_parked(&mut self, id: ConnId, status: u16, body: Rc<[u8]>, now: Millis) {
        let shutting_down = self.shutdown_deadline.is_some();
        let Some(conn) = self.conn(id) else { return };
        let phase = std::mem::replace(&mut conn.phase, Phase::Closing { shut: false });
        let Phase::Parked(http, parked) = phase else {
            conn.phase = phase;
            return;
        };
        let keep_alive = parked.keep_alive && !shutting_down;
        let meta = Meta {
            keep_alive,
            http10: parked.http10,
            allow_origin: parked.allow_origin.as_deref(),
            vary_origin: false,
            head_only: false,
        };
        conn.out
            .push_owned(response::encode(status, &[], &body, &meta));
        self.relay.cancel_wait(id, &parked.sid, now);
        let Some(conn) = self.conn(id) else { return };
        if keep_alive {
            conn.phase = Phase::Http(http);
            self.set_deadline(id, now.after(self.cfg.keepalive_timeout));
            self.reprocess.push(id);
        } else {
            self.set_deadline(id, now.after(LINGER));
        }
        self.mark_write(id);
    }
}
