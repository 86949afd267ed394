//! The parked stage: a `GET /prompts` waiting for a prompt. It costs nothing
//! until its deadline or a wake; later pipelined requests stay buffered,
//! unparsed, and are answered in order once it is. Invariant: a `Parked`
//! connection has exactly one waiter entry in the relay.

use std::rc::Rc;

use super::conn::{Parked, Phase};
use super::server::Server;
use crate::http::response;
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
    /// buffered pipelined requests are handled in this same turn. Its
    /// headers come from the one place every answer's do (`meta`).
    pub(super) fn answer_parked(&mut self, id: ConnId, status: u16, body: Rc<[u8]>, now: Millis) {
        let Some(conn) = self.conn(id) else { return };
        let phase = std::mem::replace(&mut conn.phase, Phase::Closing { shut: false });
        let Phase::Parked(http, parked) = phase else {
            conn.phase = phase;
            return;
        };
        conn.phase = Phase::Http(http);
        self.relay.cancel_wait(id, &parked.sid, now);
        let mut meta = self.meta(parked.origin.as_deref(), parked.keep_alive);
        meta.http10 = parked.http10;
        let keep_alive = meta.keep_alive;
        let bytes = response::encode(status, &[], &body, &meta);
        let Some(conn) = self.conn(id) else { return };
        conn.out.push_owned(bytes);
        if keep_alive {
            self.set_deadline(id, now.after(self.cfg.keepalive_timeout));
            self.reprocess.push(id);
            self.mark_write(id);
        } else {
            self.begin_closing(id, now);
        }
    }
}
