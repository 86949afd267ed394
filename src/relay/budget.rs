//! The memory budget (`RELAY_MAX_MEMORY`) as the relay keeps it. Where
//! the loop's log is the whole state (the memory engine), a write whose
//! records would pass the budget is refused `503` before anything of it
//! is applied, and `/readyz` reports `memory` from that refusal until
//! space is freed; deletions and the idle sweep always go on. Where an
//! engine keeps the sessions elsewhere (a data directory, Redis), the
//! bytes are counted and reported, and nothing is refused: the loop's
//! copy of a data directory holds every session, so refusing at the
//! budget would refuse every write on a database larger than it.

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
    /// Bytes held for sessions, as counted (`relay_memory_bytes`).
    pub fn memory_bytes(&self) -> usize {
        self.store.memory()
    }

    /// The budget, in bytes (`relay_memory_budget_bytes`).
    pub fn budget_bytes(&self) -> usize {
        self.budget.bytes
    }

    /// Where the output queues count their bytes.
    pub fn memory_meter(&self) -> &Meter {
        self.store.meter()
    }

    /// Whether a write was refused at the budget and no space was freed
    /// since (`/readyz` answers `503` with reason `memory`).
    pub fn memory_full(&self) -> bool {
        self.budget
            .refused_at
            .is_some_and(|at| self.store.memory() >= at)
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

    fn refuse(&mut self) -> ApiError {
        let at = self.store.memory();
        if self.budget.refused_at.is_none() {
            log::warn!(bytes = at, budget = self.budget.bytes; "memory budget reached: writes refused until space is freed");
        }
        self.budget.refused_at = Some(at);
        ApiError::memory_budget()
    }
}
