//! Several relays sharing sessions through Redis, against real relay
//! processes and a real `redis-server`: every flow across instances
//! (instances), a cancel across instances (cancels), one agent for every
//! session across instances (every), each copy under the memory budget
//! (budget), a reply waking an ask
//! parked on another instance (asks), faults injected into
//! the shared Redis (faults, counted by the writers of writers), and what
//! waits on a relay while Redis restarts empty (restart), and a Sentinel
//! failover under traffic, writes confirmed by replicas (sentinel), a
//! Redis Cluster: sessions spread over its masters, a master killed and
//! slots moved under traffic (cluster), and the cluster router against a
//! real cluster (router).

#[path = "../common/mod.rs"]
mod common;

mod asks;
mod budget;
mod cancels;
mod cluster;
mod every;
mod faults;
mod instances;
mod restart;
mod router;
mod sentinel;
mod writers;
