//! The memory budget (`RELAY_MAX_MEMORY`) as the relay keeps it. Where
//! the loop's log is the whole state (the memory engine), a write whose
//! records would pass the budget is refused `503` before anything of it
//! is applied, and `/readyz` reports `memory` from that refusal until
//! space is freed; deletions and the idle sweep always go on. Where the
//! engine reads a session back on its next use (a data directory), the
//! budget is kept by dropping the least recently used sessions nothing
//! holds (`resident.rs`), and a write is refused only when the count is
//! past the budget and nothing more can be dropped. With Redis the bytes
//! are counted and reported, and nothing is refused.

use super::{ApiError, Relay};
use crate::store::engine::Engine;
use crate::store::log::weight::Meter;
use crate::store::record::Record;

/// The budget and what the relay made of it.
#[derive(Debug)]
pub(super) struct Budget {
    /// The budget in bytes (`RELAY_MAX_MEMORY`).
    bytes: usize,
    /// Whether writes past it are refused.
    refuses: bool,
    /// The count when a write was last refused; `/readyz` reports
    /// `memory` while the count has not fallen below it.
    refused_at: Option<usize>,
}

impl Budget {
    pub(super) fn new(bytes: usize, engine: &Engine) -> Budget {
        Budget {
            bytes,
            refuses: engine.refuses_at_memory_budget(),
            refused_at: None,
        }
    }
}

impl Relay {
    /// Bytes held for sessions, as counted (`relay_memory_bytes`): the
    /// loop's log, the ids of the sessions it knows by id only, and what
    /// the engine holds beside (the storage thread's cache).
    pub fn memory_bytes(&self) -> usize {
        self.loop_bytes() + self.engine.held_bytes()
    }

    /// Bytes the loop holds for sessions: the log's, and the ids of the
    /// sessions known by id only (the storage thread's cache takes what
    /// they leave of the budget).
    pub fn loop_bytes(&self) -> usize {
        self.store.memory() + self.resident.bytes()
    }

    /// What the loop weighs against the budget when it drops sessions or
    /// refuses a write ([`evict`](Relay::evict)): its own bytes, and what
    /// the storage thread's cache holds up to the quarter of the budget
    /// it keeps whatever the loop holds. The cache gives back what it
    /// holds past the rest at its next transaction or read, so the loop
    /// holds up to three quarters of the budget before it drops a
    /// session, and the two together stay within it.
    pub(super) fn claimed_bytes(&self) -> usize {
        let cache = self.engine.held_bytes().min(self.budget.bytes / 4);
        self.loop_bytes() + cache
    }

    /// The budget, in bytes (`relay_memory_budget_bytes`).
    pub fn budget_bytes(&self) -> usize {
        self.budget.bytes
    }

    /// Where the output queues count their bytes.
    pub fn memory_meter(&self) -> &Meter {
        self.store.beside()
    }

    /// In debug builds, the kept count of the logs and of the sessions
    /// known by id only, and a recount that walks every one of them,
    /// which the tests compare over the real binary (`/metrics`); release
    /// builds never walk and give nothing.
    pub fn memory_recount(&self) -> Option<(usize, usize)> {
        cfg!(debug_assertions).then(|| {
            (
                self.store.logs_memory() + self.resident.bytes(),
                self.store.recount() + self.resident.recount(),
            )
        })
    }

    /// Whether a write was refused at the budget and no space was freed
    /// since (`/readyz` answers `503` with reason `memory`).
    pub fn memory_full(&self) -> bool {
        self.budget
            .refused_at
            .is_some_and(|at| self.memory_bytes() >= at)
    }

    /// Admits the records of a write decided on the loop's log, or
    /// refuses it `503` when they would pass the budget.
    pub(super) fn admit(&mut self, records: &[Record]) -> Result<(), ApiError> {
        if !self.budget.refuses || records.is_empty() {
            return Ok(());
        }
        if self.store.admits(records, self.budget.bytes) {
            self.budget.refused_at = None;
            return Ok(());
        }
        Err(self.refuse())
    }

    /// Admits a part of `bytes` to a draft, or refuses it `503` at the
    /// budget.
    pub(super) fn admit_bytes(&mut self, bytes: usize) -> Result<(), ApiError> {
        if !self.budget.refuses || self.store.memory().saturating_add(bytes) <= self.budget.bytes {
            return Ok(());
        }
        Err(self.refuse())
    }

    /// Where sessions leave memory to make room: whether `w` is refused
    /// because the count is past the budget and the last eviction found
    /// nothing more to drop (every session held here is in use). A
    /// deletion always goes through, and so does a final answer or a
    /// cancel of a prompt pending in a session held here: pending
    /// prompts hold their sessions in memory, so refusing what ends them
    /// would keep the budget full until the TTL (one message each, at
    /// most `max_pending` per session).
    pub(super) fn budget_full_for(&self, w: &super::Write) -> bool {
        use super::Write;
        let frees = match w {
            Write::Delete { .. } => true,
            Write::Response(r) => self.ends_pending(&r.session_id, &r.client_msg_id),
            Write::Cancel(c) => self.ends_pending(&c.session_id, &c.client_msg_id),
            _ => false,
        };
        !self.budget.refuses
            && self.resident.stuck()
            && !frees
            && self.claimed_bytes() > self.budget.bytes
    }

    /// Whether the prompt `client_msg_id` of `sid` is pending in the log.
    fn ends_pending(&self, sid: &str, client_msg_id: &str) -> bool {
        self.store.get(sid).is_some_and(|log| {
            matches!(
                log.prompt_state(client_msg_id),
                crate::store::log::PromptState::Pending
            )
        })
    }

    pub(super) fn refuse(&mut self) -> ApiError {
        let at = self.memory_bytes();
        if self.budget.refused_at.is_none() {
            log::warn!(bytes = at, budget = self.budget.bytes; "memory budget reached: writes refused until space is freed");
        }
        self.budget.refused_at = Some(at);
        ApiError::memory_budget()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Limits, Reply};
    use super::*;
    use crate::relay::ConnId;
    use crate::store::SessionId;
    use crate::store::model::{NewAsk, NewPrompt, NewResponse, Write};
    use crate::time::Millis;

    const BUDGET: usize = 1 << 20;

    fn relay() -> Relay {
        Relay::in_memory(Limits {
            history_limit: 1000,
            max_sessions: 10_000,
            max_pending: 1000,
            max_waiters: 10,
            max_subscribers: 10,
            session_ttl_ms: 60_000,
            draft_timeout_ms: 60_000,
            agent_grace_ms: 30_000,
            max_memory: BUDGET,
        })
    }

    const C: ConnId = ConnId {
        key: 0,
        generation: 0,
    };

    fn write(r: &mut Relay, body: &str) -> Result<Vec<u8>, ApiError> {
        let b = body.as_bytes();
        let w = if body.contains("\"prompt\"") {
            Write::Prompt(NewPrompt::parse(b)?)
        } else if body.contains("\"ask_id\"") {
            Write::Ask(NewAsk::parse(b)?)
        } else {
            Write::answer(NewResponse::parse(b)?)
        };
        match r.write(Millis(0), 1_000, C, w)? {
            Reply::Now(body) => Ok(body),
            Reply::Wait => panic!("the memory engine answers at once"),
        }
    }

    /// Every kind of write is refused at the budget with the contract's
    /// error and leaves nothing behind; a resend of a stored prompt and a
    /// deletion still go through; the deletion makes room.
    #[test]
    fn every_write_past_the_budget_is_refused_and_a_deletion_makes_room() {
        // Where each map grows, and so where the 8 KiB prompts stop
        // fitting, follows from its hash keys: fixed, every run checks
        // the same fill (with random ones, about 1 run in 25 left room
        // for a part but not for an answer).
        #[cfg(feature = "fixed-hash-keys")]
        crate::store::idmap::fix_keys_on_this_thread();
        let mut r = relay();
        let big = "b".repeat(8 * 1024);
        let mut n = 0;
        let refused = loop {
            let body = format!(
                r#"{{"session_id":"s{}","client_msg_id":"p{n}","prompt":"{big}"}}"#,
                n / 10
            );
            match write(&mut r, &body) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 1000, "never refused");
        };
        assert_eq!(refused, ApiError::memory_budget());
        assert_eq!(refused.status, 503);
        assert!(r.memory_full());
        let held = r.memory_bytes();
        assert!(held <= BUDGET && held > BUDGET / 2, "{held}");
        assert_eq!(r.store.logs_memory(), r.store.recount(), "kept = recount");

        // An answer, a part, an ask, a new session: refused, nothing kept.
        let stats = r.stats();
        let answer = format!(
            r#"{{"session_id":"s0","client_msg_id":"p0","assistant_msg_id":"a","text":"{big}"}}"#
        );
        assert_eq!(write(&mut r, &answer), Err(ApiError::memory_budget()));
        let part = answer.replace("\"text\"", "\"partial\":true,\"text\"");
        assert_eq!(write(&mut r, &part), Err(ApiError::memory_budget()));
        let ask = format!(r#"{{"session_id":"s0","ask_id":"k","text":"{big}"}}"#);
        assert_eq!(write(&mut r, &ask), Err(ApiError::memory_budget()));
        assert_eq!(r.stats(), stats, "nothing stored");
        assert_eq!(r.memory_bytes(), held, "nothing held");
        let mut fx = Vec::new();
        r.take_effects(&mut fx);
        assert!(fx.is_empty(), "nothing sent: {fx:?}");
        // New sessions fill what is left, and the one that would pass
        // the budget is not created.
        let mut i = 0;
        let put = loop {
            let sid = SessionId::new(&format!("fresh{i}")).expect("an id");
            match r.put_session(Millis(0), C, &sid) {
                Ok(_) => i += 1,
                Err(e) => break e,
            }
            assert!(i < 100, "new sessions were never refused");
        };
        assert_eq!(put, ApiError::memory_budget());
        assert!(!r.has_session(&format!("fresh{i}")));
        let held = r.memory_bytes();
        assert!(held <= BUDGET);

        // A resend of a stored prompt changes nothing: answered as before.
        let resend = format!(r#"{{"session_id":"s0","client_msg_id":"p0","prompt":"{big}"}}"#);
        let ack = write(&mut r, &resend).expect("a duplicate");
        assert!(String::from_utf8_lossy(&ack).contains("\"duplicate\":true"));

        // Deleting a session frees its bytes: writes are taken again.
        r.delete_session(Millis(0), C, "s0").expect("deleted");
        assert!(r.memory_bytes() < held);
        assert!(!r.memory_full());
        let again = format!(r#"{{"session_id":"s1","client_msg_id":"again","prompt":"{big}"}}"#);
        write(&mut r, &again).expect("taken again");
        assert_eq!(r.store.logs_memory(), r.store.recount());
    }
}
