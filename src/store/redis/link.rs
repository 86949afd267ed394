//! The two links to Redis, set up and lost: what is sent when a socket
//! connects (`AUTH`, `SELECT`, then the script and the library loaded on
//! the command link; on the events link the instance's channel, and again
//! the channel of every session listened to), what a lost socket
//! means for what waited on it, and the bytes each link has to write.
//!
//! The script is loaded twice: as a library of functions (`FUNCTION
//! LOAD`, Redis 7 and later), called with `FCALL`, and as a script
//! (`SCRIPT LOAD`), called with `EVALSHA` until Redis confirmed the
//! library, and always on Redis 6.2, which has no functions. A library's
//! helpers are made once, where a script makes them again on every call.
//!
//! Invariants: a link is `up` from its socket's connection until it is
//! lost, and `ready` once Redis answered its set-up; calls go by `FCALL`
//! only while Redis holds the library it confirmed ([`Functions`]), by
//! `EVALSHA` otherwise; a lost command link answers everything that
//! waited on it, `504` for a write Redis may have run, `503` for the
//! rest.

use log::Level;

use super::calls::{Function, Op};
use super::codec::{push_channel_command, push_command};
use super::health::note;
use super::route::{Answered, Expect, Then};
use super::{RedisStore, base_in};
use crate::error::ApiError;

/// The script every instance loads (`SCRIPT LOAD`) and calls by its SHA-1
/// where Redis has no functions (6.2).
pub const SCRIPT: &str = include_str!("relay.lua");

/// The script's last line, which runs it as a script; the library has
/// the functions' registration in its place.
const ENTRY: &str = "return run(KEYS, ARGV)\n";

/// The functions of the library (Redis 7 and later), named after the
/// script's SHA-1 so that relays of different versions on one Redis each
/// call their own: one for writes (refused up front while Redis is out
/// of memory: nothing ran, nothing was published), one for reads
/// (`no-writes`: runs out of memory too, as reads did as a script), and
/// one for the writes that only delete (`allow-oom`: they ran out of
/// memory as a script too).
pub(super) struct Functions {
    write: String,
    read: String,
    delete: String,
    /// `FUNCTION LOAD`'s argument.
    pub(super) library: String,
}

impl Functions {
    pub(super) fn new(sha: &str) -> Functions {
        let v = &sha[..16];
        let (write, read, delete) = (
            format!("relay_{v}"),
            format!("relay_r_{v}"),
            format!("relay_d_{v}"),
        );
        let body = SCRIPT.strip_suffix(ENTRY).unwrap_or(SCRIPT);
        let library = format!(
            "#!lua name=relay_{v}\n{body}redis.register_function('{write}', run)\n\
             redis.register_function{{function_name = '{read}', callback = run, flags = {{ 'no-writes' }}}}\n\
             redis.register_function{{function_name = '{delete}', callback = run, flags = {{ 'allow-oom' }}}}\n"
        );
        Functions {
            write,
            read,
            delete,
            library,
        }
    }

    /// The function that runs `op`.
    pub(super) fn of(&self, op: Op) -> &str {
        match op.function() {
            Function::Read => &self.read,
            Function::Delete => &self.delete,
            Function::Write => &self.write,
        }
    }
}

/// One of the two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Script calls, pipelined; replies in order.
    Command,
    /// `SUBSCRIBE` to the channel of changes.
    Events,
}

#[derive(Default)]
pub(super) struct Side {
    /// The socket is connected: requests may be queued.
    pub(super) up: bool,
    /// Setup answered: scripts loaded, or the channel subscribed.
    pub(super) ready: bool,
    pub(super) out: Vec<u8>,
    pub(super) input: Vec<u8>,
}

impl RedisStore {
    pub(super) fn side(&mut self, link: Link) -> &mut Side {
        match link {
            Link::Command => &mut self.cmd,
            Link::Events => &mut self.ev,
        }
    }

    /// The socket connected: log in, select the database, and load the
    /// script or subscribe. Requests may follow at once (Redis answers in
    /// order).
    #[inline(never)]
    pub fn connected(&mut self, link: Link) {
        let mut setup = Vec::new();
        match (&self.url.user, &self.url.password) {
            (Some(u), Some(p)) => push_command(&mut setup, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
            (None, Some(p)) => push_command(&mut setup, &[b"AUTH", p.as_bytes()]),
            _ => {}
        }
        let mut replies = usize::from(self.url.password.is_some());
        if self.url.db != 0 {
            push_command(&mut setup, &[b"SELECT", self.url.db.to_string().as_bytes()]);
            replies += 1;
        }
        match link {
            Link::Command => {
                for _ in 0..replies {
                    self.expect.push_back(Expect::Setup);
                }
                if self.url.sentinel.is_some() {
                    // What a sentinel names may have been demoted since.
                    push_command(&mut setup, &[b"ROLE"]);
                    self.expect.push_back(Expect::Role);
                }
                push_command(&mut setup, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]);
                self.expect.push_back(Expect::Setup);
                // Calls go by EVALSHA until Redis confirms the library
                // (Redis 6.2 has no FUNCTION, and keeps them so).
                self.fcall = false;
                let library = self.functions.library.as_bytes();
                push_command(&mut setup, &[b"FUNCTION", b"LOAD", library]);
                self.expect.push_back(Expect::Library);
            }
            Link::Events => {
                let subscribe = self.verbs()[0];
                push_command(&mut setup, &[subscribe, self.channel.as_bytes()]);
                self.arrivals_again(&mut setup);
                for (sid, f) in &mut self.follow {
                    if f.listen.is_some() {
                        f.listen = Some(false);
                        // After a failover: once read whole (`copy.rs`).
                        if !f.rollback {
                            let base = base_in(&self.bases, &self.prefix, sid);
                            push_channel_command(&mut setup, subscribe, base.as_bytes(), sid);
                        }
                    }
                }
            }
        }
        let side = self.side(link);
        side.up = true;
        side.ready = false;
        side.input.clear();
        side.out = setup;
        if link == Link::Command {
            // The reads owed since the last link was lost.
            // And after a failover, every session followed (see
            // `master_moved`).
            // Unless the copies are to be renewed first: the renewal
            // reads them (`renew_copies`).
            let renew = self.renew_owed;
            let owed: Vec<_> = self
                .follow
                .iter_mut()
                .filter(|(_, f)| f.resyncs > 0 || f.rollback)
                .filter_map(|(sid, f)| {
                    f.resyncs = 0;
                    (!(renew && f.rollback)).then(|| sid.clone())
                })
                .collect();
            for sid in owed {
                self.sync(None, &sid, super::Known::default());
            }
        }
    }

    /// The socket is gone: every request waiting on it is answered `503`.
    /// The shell logs why.
    #[inline(never)]
    pub fn lost(&mut self, link: Link) {
        let side = self.side(link);
        *side = Side::default();
        if link == Link::Command {
            self.fcall = false;
            self.health.link_lost();
            // Writes answered whose `WAIT` will not be: may be stored.
            self.unhold(false);
            self.release_pages(false);
            self.waiting = false;
            self.unwaited = false;
            // A write sent is Redis's to run or not: whether it did is not
            // known now (a resend with the same id tells). A read changed
            // nothing.
            let uncertain = ApiError::storage_uncertain("the connection to Redis was lost");
            for e in std::mem::take(&mut self.expect) {
                // A read the relay asked for on its own stays owed: the
                // session is not followed until it is sent again on the
                // next link.
                self.answer_lost(e, &uncertain);
            }
            let unsent = std::mem::take(&mut self.batch);
            let waiting = unsent.into_iter().map(|g| (g.conn, g.sid, g.id)).collect();
            self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
        } else {
            // The reads waiting for a `PING` go back to the relay, which
            // finds their channels no longer listened to.
            let waiting: Vec<_> = self.pings.drain(..).flatten().collect();
            for (conn, sid) in waiting.into_iter().chain(self.barrier_next.drain(..)) {
                self.answered.push_back(Answered {
                    conn: Some(conn),
                    snapshot: None,
                    then: Then::Barrier(sid),
                    delivered: false,
                });
            }
        }
    }

    /// Bytes to write on `link` (appended by the caller to what it has not
    /// written yet).
    pub fn take_output(&mut self, link: Link) -> Vec<u8> {
        if link == Link::Command {
            self.send_batch();
            if self.unwaited && !self.waiting && self.cmd.up {
                // One `WAIT` covers every write sent before it; the writes
                // sent while it waits are covered by the next one, sent
                // once it is answered (Redis runs nothing else of this
                // link while a `WAIT` waits).
                self.unwaited = false;
                let (n, ms) = (self.replicas.to_string(), self.wait_ms.to_string());
                push_command(&mut self.cmd.out, &[b"WAIT", n.as_bytes(), ms.as_bytes()]);
                self.expect.push_back(Expect::Wait);
                self.waiting = true;
            }
        }
        if link == Link::Events && !self.barrier_next.is_empty() && self.ev.up {
            push_command(&mut self.ev.out, &[b"PING"]);
            self.pings.push_back(std::mem::take(&mut self.barrier_next));
        }
        std::mem::take(&mut self.side(link).out)
    }

    /// Redis answered a call with the error `e`: if it says Redis lost the
    /// script or the library, it is loaded again, ahead of the calls that
    /// follow. Called on every error reply, before it is routed.
    pub(super) fn reload(&mut self, e: &str) {
        if e.starts_with("NOSCRIPT") {
            // Redis lost its scripts (SCRIPT FLUSH): load it again.
            push_command(&mut self.cmd.out, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]);
            self.expect.push_back(Expect::Setup);
        }
        if self.fcall && e.contains("Function not found") {
            // Redis lost its functions (FUNCTION FLUSH): EVALSHA
            // until the library is loaded again.
            self.fcall = false;
            let library = self.functions.library.as_bytes();
            push_command(&mut self.cmd.out, &[b"FUNCTION", b"LOAD", library]);
            self.expect.push_back(Expect::Library);
        }
    }

    /// The `WAIT` owed for the held replies was answered (`confirmed`:
    /// by enough replicas) or will not be: they go to the relay, every
    /// write's success turned into `504` unless confirmed.
    pub(super) fn unhold(&mut self, confirmed: bool) {
        let Some(from) = self.hold.take() else {
            return;
        };
        if confirmed {
            return;
        }
        let why = "fewer replicas than RELAY_REDIS_REPLICAS confirmed it in time";
        for a in self.answered.iter_mut().skip(from) {
            if let Then::Reply(Ok(_)) = a.then {
                a.then = Then::Reply(Err(ApiError::storage_uncertain(why)));
            }
        }
    }

    /// A link finished its setup: once both have, the relay is connected
    /// (logged, and what the tests wait for before their first request).
    pub(super) fn set_up(&mut self) {
        if self.linked() {
            note(Level::Info, "connected to Redis", self.health.url(), "");
            self.every_linked();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_the_script_with_its_functions_in_place_of_its_last_line() {
        assert!(SCRIPT.ends_with(ENTRY));
        let f = Functions::new("0123456789abcdef0123");
        assert!(f.library.starts_with("#!lua name=relay_0123456789abcdef\n"));
        assert!(!f.library.contains(ENTRY));
        assert_eq!(f.of(Op::Prompt), "relay_0123456789abcdef");
        assert_eq!(f.of(Op::Sync), "relay_r_0123456789abcdef");
        assert_eq!(f.of(Op::Delete), "relay_d_0123456789abcdef");
    }
}
