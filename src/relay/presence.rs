//! Local presence in a session: the parked long-polls and the WebSocket
//! subscribers this instance holds. Not durable: it lives as long as the
//! connections do, and an entry goes when both lists are empty. (The
//! agent's presence, online or offline, is `agent.rs`.) Invariant: a
//! connection appears at most once in each list.

use std::rc::Rc;

use super::ConnId;
use crate::store::Seq;

/// A parked `GET /prompts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub conn: ConnId,
    pub after: Option<Seq>,
}

/// A parked `GET /asks`: woken by a reply to its ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskWaiter {
    pub conn: ConnId,
    pub ask_id: Rc<str>,
}

/// Who waits on one session here.
#[derive(Debug, Default)]
pub struct Presence {
    pub waiters: Vec<Waiter>,
    pub subscribers: Vec<ConnId>,
    /// Parked `GET /asks`, each on one ask. Boxed: few sessions have
    /// one, and every session with a poll or a subscriber has this entry:
    /// the box is one word where the list's own head is three.
    #[allow(clippy::box_collection)]
    asks: Option<Box<Vec<AskWaiter>>>,
}

/// Pushes onto one of a session's lists, the first entry into room for
/// one: most sessions have one poll or one subscriber, and a list grown by
/// the usual rule holds room for four (72 bytes unused per parked poll).
/// The lists grow as usual from the second entry on.
pub fn push_one<T>(list: &mut Vec<T>, item: T) {
    if list.capacity() == 0 {
        list.reserve_exact(1);
    }
    list.push(item);
}

impl Presence {
    /// Whether nobody waits or listens (the entry can go).
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.subscribers.is_empty() && self.asks().is_empty()
    }

    /// The parked `GET /asks`.
    pub fn asks(&self) -> &[AskWaiter] {
        self.asks.as_deref().map_or(&[], |a| a)
    }

    /// The parked `GET /asks`, to change.
    pub fn asks_mut(&mut self) -> &mut Vec<AskWaiter> {
        self.asks.get_or_insert_with(Box::default)
    }

    /// Removes `conn` from the parked asks; true if it was there.
    pub fn remove_ask_waiter(&mut self, conn: ConnId) -> bool {
        match self.asks().iter().position(|w| w.conn == conn) {
            Some(i) => {
                self.asks_mut().swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// The session went on under a new epoch (its store was lost and it
    /// was created again): the `after` each parked poll gave is a `seq`
    /// of the old one, and every prompt of the new one came after it, so
    /// each poll now takes them all, as a subscriber's `resync` starts it
    /// over.
    pub fn new_epoch(&mut self) {
        for w in &mut self.waiters {
            w.after = None;
        }
    }

    /// Removes `conn` from the waiter list; true if it was there.
    pub fn remove_waiter(&mut self, conn: ConnId) -> bool {
        match self.waiters.iter().position(|w| w.conn == conn) {
            Some(i) => {
                self.waiters.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes `conn` from the subscriber list; true if it was there.
    pub fn remove_subscriber(&mut self, conn: ConnId) -> bool {
        match self.subscribers.iter().position(|c| *c == conn) {
            Some(i) => {
                self.subscribers.swap_remove(i);
                true
            }
            None => false,
        }
    }
}
