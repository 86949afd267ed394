//! Several relays sharing sessions through Redis, against real relay
//! processes and a real `redis-server`: every flow across instances
//! (instances), and faults injected into the shared Redis (faults).

#[path = "../common/mod.rs"]
mod common;

mod asks;
mod faults;
mod instances;
