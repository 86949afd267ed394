//! Persistence with a data directory (SQLite), against the real binary and
//! real files: what survives a crash (persistence, asks), disks that stall or fail
//! (faults, write_timeouts), the memory, SQLite and Redis engines
//! deciding every write alike (engines_agree), sessions that leave
//! memory under the budget and come back whole (resident), and the
//! storage thread deciding alike on sessions it dropped from its cache
//! (cache).

#[path = "../common/mod.rs"]
mod common;

mod asks;
mod cache;
mod engines_agree;
mod faults;
mod persistence;
mod resident;
mod write_timeouts;
