//! What the memory budget counts: each thing a session holds weighs its
//! bytes plus the fixed cost of the structures that hold it, as laid out
//! in memory (the struct, its heap block with the allocator's header and
//! rounding, a hash table's slack). A [`Meter`] is the running total of
//! one store's logs; each log adds or takes back the difference when it
//! changes, so the total is kept without walking anything.

use std::cell::Cell;
use std::mem::size_of;
use std::rc::Rc;

use super::super::message::{Kind, Message};

/// The bytes counted for a store's sessions, shared by its logs (one
/// loop, one thread: a cell is enough). A log's share leaves with it.
#[derive(Clone, Debug, Default)]
pub struct Meter(Rc<Cell<usize>>);

impl Meter {
    /// Bytes counted now.
    pub fn get(&self) -> usize {
        self.0.get()
    }

    /// A change from `was` bytes to `now` bytes.
    pub fn change(&self, was: usize, now: usize) {
        self.0.set(self.0.get().wrapping_sub(was).wrapping_add(now));
    }
}

/// A heap block of `n` bytes as the allocator hands it out: an 8-byte
/// header, rounded up to 16, at least 32 (dlmalloc's chunks; glibc's are
/// the same shape).
pub const fn alloc(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let c = (n + 8 + 15) & !15;
    if c < 32 { 32 } else { c }
}

/// An `Rc<str>` or `Rc<[u8]>` of `len` bytes: the two counts, the bytes.
pub const fn rc_bytes(len: usize) -> usize {
    alloc(16 + len)
}

/// A hash table of `cap` entries of `slot` bytes: buckets are a power of
/// two kept at most 7/8 full, each with one control byte.
pub fn table(cap: usize, slot: usize) -> usize {
    if cap == 0 {
        return 0;
    }
    let buckets = (cap * 8 / 7).next_power_of_two();
    alloc(buckets * (slot + 1) + 16)
}

/// One stored message: its `Rc<Message>` block, its bytes (a prompt's
/// `data`, an answer's frame shared with the subscribers' queues), and
/// the ids it alone holds (a prompt's or an ask's own id, an answer's
/// id; an answer or a cancel shares its prompt's id).
pub fn message(m: &Message) -> usize {
    let own_id = match m.kind {
        Kind::Prompt | Kind::Ask | Kind::Reply => Some(m.client_msg_id.len()),
        Kind::Assistant | Kind::Cancel => None,
    };
    let answer_id = m.assistant_msg_id.as_ref().map(|a| a.len());
    message_of(own_id, answer_id, m.stored_len())
}

/// [`message`] by its parts' lengths: its own id's, its answer id's,
/// and its stored bytes' with whether they are shared (a frame). What a
/// write's message will weigh, read off its record before it is built.
pub fn message_of(own_id: Option<usize>, answer_id: Option<usize>, stored: (usize, bool)) -> usize {
    let bytes = match stored {
        (len, true) => rc_bytes(len),
        (len, false) => alloc(len),
    };
    alloc(16 + size_of::<Message>())
        + bytes
        + own_id.map_or(0, rc_bytes)
        + answer_id.map_or(0, rc_bytes)
}

/// A session's place in the store's map and its id: the slot holds the
/// key and the log inline, the id is an `Arc<str>`.
pub fn session_slot(log_size: usize, id_len: usize) -> usize {
    (16 + log_size + 1) * 8 / 7 + rc_bytes(id_len)
}

/// One entry of the store's arrival order (every session's pending
/// prompts): a B-tree entry of number, session and `seq`, nodes about
/// two-thirds full.
pub const ARRIVAL: usize = (8 + 16 + 8) * 3 / 2;

/// One entry of a kept scope of the arrival order: a B-tree entry of a
/// number, nodes about two-thirds full.
pub const KEPT_ARRIVAL: usize = 8 * 3 / 2;

/// One thing's share of a meter (a draft, a connection's output queue),
/// set as the thing changes and taken back when it is dropped. Without a
/// meter it counts nowhere.
#[derive(Debug, Default)]
pub struct Share {
    meter: Option<Meter>,
    bytes: usize,
}

impl Share {
    /// A share of nothing yet, counted on `meter`.
    pub fn on(meter: &Meter) -> Share {
        Share {
            meter: Some(meter.clone()),
            bytes: 0,
        }
    }

    /// The thing now holds `bytes`.
    #[inline]
    pub fn set(&mut self, bytes: usize) {
        if bytes != self.bytes {
            if let Some(m) = &self.meter {
                m.change(self.bytes, bytes);
            }
            self.bytes = bytes;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.set(0);
    }
}
