//! Several relays sharing sessions through Redis, against real relay
//! processes and a real `redis-server`: every flow across instances
//! (instances), faults injected into the shared Redis (faults), and what
//! waits on a relay while Redis restarts empty (restart).

#[path = "../common/mod.rs"]
mod common;

mod asks;
mod faults;
mod instances;
mod restart;
