//! Which sessions' channels this instance listens to, and the reads it
//! asked for on its own: the bookkeeping that decides whether a copy of a
//! session is up to date (a barrier `PING` suffices) or must be read.

use super::codec::push_channel_command;
use super::route::Expect;
use super::{Known, Op, RedisStore, base_in};
use crate::store::types::{SessionId, Ticket};

/// What this instance does about one session's channel.
#[derive(Debug, Default)]
pub struct Follow {
    /// `Some` while listened to: true once Redis confirmed it.
    pub listen: Option<bool>,
    /// Reads of the session the relay asked for on its own (a gap, a new
    /// subscription) not yet applied: the copy may lag the channel.
    pub resyncs: u32,
    /// The master changed since the copy was read: the next whole read
    /// replaces a copy that holds more than Redis (what the promoted
    /// replica lacked is gone).
    pub rollback: bool,
}

impl RedisStore {
    /// This instance has subscribers of `sid` until `until_ms` (unix ms;
    /// 0: no longer): answers stored elsewhere then say `delivered`.
    pub fn watch(&mut self, sid: &str, until_ms: u64) {
        if !self.cmd.up {
            return;
        }
        let until = until_ms.to_string();
        let instance = self.instance.clone();
        let extra: [&[u8]; 2] = [instance.as_bytes(), until.as_bytes()];
        self.call(sid, Op::Watch, Known::default(), &extra, Expect::Quiet);
    }

    /// The session whose channel `channel` is (`<base>e:<sid>`).
    pub(super) fn sid_of_channel(&self, channel: &[u8]) -> Option<SessionId> {
        let mut rest = channel.strip_prefix(self.prefix.as_bytes())?;
        if self.cluster() {
            // `{tag}`: checked below against the session's bucket.
            let close = rest.iter().position(|&b| b == b'}')?;
            rest = rest.get(close + 1..)?;
        }
        let sid = SessionId::new(std::str::from_utf8(rest.strip_prefix(b"e:")?).ok()?)?;
        channel
            .starts_with(self.base(&sid).as_bytes())
            .then_some(sid)
    }

    /// Someone waits on `sid` here: its channel is listened to, and once
    /// Redis confirms that, [`Event::Listening`] asks for a read.
    pub fn listen(&mut self, sid: &SessionId) {
        let f = self.follow.entry(sid.clone()).or_default();
        if f.listen.is_some() {
            return;
        }
        f.listen = Some(false);
        self.listened += 1;
        if self.ev.up {
            let subscribe = self.verbs()[0];
            let base = base_in(&self.bases, &self.prefix, sid);
            push_channel_command(&mut self.ev.out, subscribe, base.as_bytes(), sid);
        }
    }

    /// Whether the copy of `sid` holds everything published on its
    /// channel that this instance has read: the channel is listened to
    /// (confirmed) and no read of the session the relay asked for on its
    /// own (after a gap) is outstanding.
    pub fn follows(&self, sid: &str) -> bool {
        self.ev.ready
            && self
                .follow
                .get(sid)
                .is_some_and(|f| f.listen == Some(true) && f.resyncs == 0)
    }

    /// A read of a session that [`follows`](Self::follows) its channel:
    /// it runs again once Redis answers the turn's `PING`.
    pub fn barrier(&mut self, conn: Ticket, sid: &SessionId) {
        self.barrier_next.push((conn, sid.clone()));
    }

    /// Whether a read of `sid` the relay asked for on its own is on its
    /// way (another would tell nothing new).
    pub fn resyncing(&self, sid: &str) -> bool {
        self.follow.get(sid).is_some_and(|f| f.resyncs > 0)
    }

    /// The relay applied the answer to one of its own reads of `sid`.
    pub fn resynced(&mut self, sid: &SessionId) {
        if let Some(f) = self.follow.get_mut(sid) {
            f.resyncs = f.resyncs.saturating_sub(1);
            if f.resyncs == 0 && f.listen.is_none() {
                self.follow.remove(sid);
            }
        }
    }

    /// How many channels are listened to (or asked for).
    pub fn listened(&self) -> usize {
        self.listened
    }

    /// Stops listening to the channels of the sessions nobody waits on
    /// here any more.
    pub fn unlisten_unless(&mut self, waited_on: &dyn Fn(&str) -> bool) {
        let unsubscribe = self.verbs()[1];
        let (up, bases, prefix) = (self.ev.up, &self.bases, &self.prefix);
        let out = &mut self.ev.out;
        let mut dropped = 0;
        self.follow.retain(|sid, f| {
            if f.listen.is_none() || waited_on(sid) {
                return true;
            }
            f.listen = None;
            dropped += 1;
            if up {
                let base = base_in(bases, prefix, sid);
                push_channel_command(out, unsubscribe, base.as_bytes(), sid);
            }
            f.resyncs > 0
        });
        self.listened -= dropped;
    }
}
