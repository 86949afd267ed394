//! A map from client-chosen ids to values that keeps each key's hash.
//!
//! Keys are hashed with std's keyed SipHash (`RandomState`), so a client
//! cannot aim many ids at one bucket. SipHash is slow next to what a table
//! resize otherwise does, and a resize rehashes every key: std's `HashMap`
//! recomputes each one. Sessions that grow in step (a load spread evenly
//! over many sessions) resize their maps in the same loop turn, and
//! recomputing every key's hash in all of them stalls the loop, and every
//! request waiting on it, for that turn. Here each slot stores its hash, a
//! resize only moves slots, and a lookup hashes its key once.
//!
//! Moving the slots (and touching the new table's fresh pages) is still a
//! stall when a hundred maps do it in one turn. So each map grows at a
//! point of its own: when it holds between half and all of what its table
//! can take, chosen from its random keys, rather than when the table is
//! full. Maps that grow in step then resize over the span of a doubling
//! instead of in the same turn, at the cost of tables a little emptier
//! (half to seven eighths full just before they grow, instead of seven
//! eighths).

use std::hash::BuildHasher;
use std::rc::Rc;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

struct Slot<V> {
    hash: u64,
    key: Rc<str>,
    value: V,
}

/// A slot's stored hash: what a resize moves slots by (one function for
/// every resize, so the table's resize code is built once per map type).
fn slot_hash<V>(s: &Slot<V>) -> u64 {
    s.hash
}

/// Whether a slot holds `key`, whose hash is `hash`: the stored hash is
/// compared first, so a key is compared only on a full hash match.
fn holds<V>(hash: u64, key: &str) -> impl Fn(&Slot<V>) -> bool + '_ {
    move |s| s.hash == hash && *s.key == *key
}

/// The length at which a table (or deque) of capacity `cap` grows next:
/// between half and all of it, picked by `seed`, fixed per map (or per
/// session, for its deques: `store/pending.rs`).
pub fn growth_point(cap: usize, seed: usize) -> usize {
    cap / 2 + seed % (cap - cap / 2 + 1)
}

/// The room of a table of twice the buckets of one with room `full`
/// (none: the smallest, four buckets): a table of up to 8 buckets keeps
/// one empty, a larger one an eighth.
fn doubled_room(full: usize) -> usize {
    let buckets = match full {
        0 => 2,
        f if f < 7 => f + 1,
        f => f / 7 * 8,
    };
    let doubled = buckets * 2;
    if doubled <= 8 {
        doubled - 1
    } else {
        doubled / 8 * 7
    }
}

/// The keys ids are hashed with: std's random ones. Where each map grows,
/// and so the bytes the memory budget counts, follow from them.
#[cfg(not(feature = "fixed-hash-keys"))]
pub(crate) type Keys = std::hash::RandomState;
#[cfg(feature = "fixed-hash-keys")]
pub(crate) use fixed::Keys;
#[cfg(feature = "fixed-hash-keys")]
pub use fixed::fix_keys_on_this_thread;

/// Built for tests only (the `fixed-hash-keys` feature, on for the test
/// targets through the package's dev-dependency on itself): a thread
/// that asks for it gets maps hashing with fixed keys, so that a seeded
/// simulation replays to the byte. Other threads keep random keys.
#[cfg(feature = "fixed-hash-keys")]
mod fixed {
    use std::cell::Cell;
    use std::hash::{BuildHasher, DefaultHasher, RandomState};

    thread_local! {
        static FIXED: Cell<bool> = const { Cell::new(false) };
    }

    /// Maps made on this thread from now on hash with fixed keys.
    pub fn fix_keys_on_this_thread() {
        FIXED.with(|f| f.set(true));
    }

    #[derive(Clone)]
    pub(crate) enum Keys {
        Random(RandomState),
        Fixed,
    }

    impl Default for Keys {
        fn default() -> Keys {
            if FIXED.with(Cell::get) {
                Keys::Fixed
            } else {
                Keys::Random(RandomState::new())
            }
        }
    }

    impl BuildHasher for Keys {
        type Hasher = DefaultHasher;

        fn build_hasher(&self) -> DefaultHasher {
            match self {
                Keys::Random(r) => r.build_hasher(),
                Keys::Fixed => DefaultHasher::new(),
            }
        }
    }
}

/// A key's hash in one map ([`IdMap::hash_of`]).
#[derive(Clone, Copy, Debug)]
pub struct KeyHash(u64);

pub struct IdMap<V> {
    keys: Keys,
    table: HashTable<Slot<V>>,
    /// This map's own fraction of a table at which it grows. This and
    /// `grow_at` are 32 bits, so the two share a word (every session
    /// holds two maps).
    seed: u32,
    /// The length at which the next insert grows the table first.
    grow_at: u32,
    /// What the table holds when it has no deleted slots (its buckets'
    /// room): set only where this map grows it, so that what it weighs
    /// follows from this alone ([`room`](IdMap::room)).
    full: usize,
}

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap::new()
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for IdMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.table.iter().map(|s| (&s.key, &s.value)))
            .finish()
    }
}

impl<V> IdMap<V> {
    pub fn new() -> IdMap<V> {
        let keys = Keys::default();
        IdMap {
            seed: keys.hash_one(0x5eed_u64) as u32,
            keys,
            table: HashTable::new(),
            grow_at: 0,
            full: 0,
        }
    }

    fn hash(&self, key: &str) -> u64 {
        self.keys.hash_one(key)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// The table's room, counted without deleted slots: what the memory
    /// budget weighs it by (with [`SLOT_BYTES`](IdMap::SLOT_BYTES); the
    /// keys are the messages' own ids).
    pub fn room(&self) -> usize {
        self.full
    }

    /// The bytes of one slot of the table.
    pub const SLOT_BYTES: usize = std::mem::size_of::<Slot<V>>();

    /// What [`room`](IdMap::room) is after inserting a new key: the
    /// memory budget weighs a write by it before the write is applied.
    /// The table changes only where [`insert_hashed`](IdMap::insert_hashed)
    /// grows it: doubled at the map's growth point, and when deleted
    /// slots have taken its last free one, rehashed in place if it is at
    /// most half full afterwards, else doubled (as the table itself
    /// would).
    pub fn room_after_insert(&self) -> usize {
        let len = self.table.len();
        let doubles = len >= self.grow_at as usize
            || (self.table.capacity() == len && len + 1 > self.full / 2);
        if doubles {
            doubled_room(self.full)
        } else {
            self.full
        }
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.get_key_value(key).map(|(_, v)| v)
    }

    /// The stored key too, so a caller can share it instead of copying.
    pub fn get_key_value(&self, key: &str) -> Option<(&Rc<str>, &V)> {
        self.get_hashed(self.hash_of(key), key)
    }

    /// `key`'s hash in this map, for a lookup and an insert of the same
    /// key that hash it once ([`IdMap::get_hashed`], [`IdMap::insert_hashed`]).
    pub fn hash_of(&self, key: &str) -> KeyHash {
        KeyHash(self.hash(key))
    }

    /// [`IdMap::get_key_value`] with the key's hash from [`IdMap::hash_of`].
    pub fn get_hashed(&self, hash: KeyHash, key: &str) -> Option<(&Rc<str>, &V)> {
        debug_assert_eq!(hash.0, self.hash(key), "a hash of another map");
        let hash = hash.0;
        self.table
            .find(hash, holds(hash, key))
            .map(|s| (&s.key, &s.value))
    }

    /// Where `key` is: an index that [`IdMap::at`] and [`IdMap::at_mut`]
    /// read without hashing or comparing the key again, valid until the
    /// map's next insert or remove.
    pub fn index_of(&self, key: &str) -> Option<usize> {
        let hash = self.hash(key);
        self.table.find_bucket_index(hash, holds(hash, key))
    }

    pub fn at(&self, index: usize) -> Option<&V> {
        self.table.get_bucket(index).map(|s| &s.value)
    }

    pub fn at_mut(&mut self, index: usize) -> Option<&mut V> {
        self.table.get_bucket_mut(index).map(|s| &mut s.value)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let hash = self.hash(key);
        self.table
            .find_mut(hash, holds(hash, key))
            .map(|s| &mut s.value)
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: Rc<str>, value: V) -> Option<V> {
        let hash = self.hash_of(&key);
        self.insert_hashed(hash, key, value)
    }

    /// [`IdMap::insert`] with the key's hash from [`IdMap::hash_of`].
    pub fn insert_hashed(&mut self, hash: KeyHash, key: Rc<str>, value: V) -> Option<V> {
        debug_assert_eq!(hash.0, self.hash(&key), "a hash of another map");
        let len = self.table.len();
        if len >= self.grow_at as usize || self.table.capacity() == len {
            self.grow();
        }
        let hash = hash.0;
        match self.table.entry(hash, holds(hash, &key), slot_hash) {
            Entry::Occupied(mut slot) => Some(std::mem::replace(&mut slot.get_mut().value, value)),
            Entry::Vacant(slot) => {
                slot.insert(Slot { hash, key, value });
                None
            }
        }
    }

    /// Makes room for one more slot, as [`room_after_insert`](IdMap::room_after_insert)
    /// says: the table doubled, or rehashed in place to clear its deleted
    /// slots; then picks when it grows next, at a length between half
    /// and all of its room (see the module's notes).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let next = self.room_after_insert();
        let len = self.table.len();
        if next > self.full {
            // More than the table holds at half: it doubles.
            self.table.reserve(self.full + 1 - len, slot_hash);
        } else {
            // At most half full once one more is in: rehashed in place.
            self.table.reserve(1, slot_hash);
        }
        self.full = self.table.capacity();
        debug_assert_eq!(self.full, next, "the room grew as foretold");
        // A table past 2^32 slots cannot be in memory: the cap is never
        // reached.
        self.grow_at =
            u32::try_from(growth_point(self.full, self.seed as usize)).unwrap_or(u32::MAX);
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|s| &s.value)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        let hash = self.hash(key);
        match self.table.find_entry(hash, holds(hash, key)) {
            Ok(entry) => Some(entry.remove().0.value),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_replace_remove() {
        let mut m: IdMap<u32> = IdMap::new();
        assert!(m.is_empty());
        assert_eq!(m.insert(Rc::from("a"), 1), None);
        assert_eq!(m.insert(Rc::from("b"), 2), None);
        assert_eq!(m.insert(Rc::from("a"), 3), Some(1));
        assert_eq!(m.len(), 2);
        assert_eq!(m.get("a"), Some(&3));
        assert!(m.contains_key("b"));
        assert!(!m.contains_key("c"));
        let (k, v) = m.get_key_value("b").expect("b is stored");
        assert_eq!((&**k, *v), ("b", 2));
        if let Some(v) = m.get_mut("b") {
            *v = 20;
        }
        assert_eq!(m.get("b"), Some(&20));
        assert_eq!(m.remove("a"), Some(3));
        assert_eq!(m.remove("a"), None);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn maps_grow_at_points_of_their_own_and_keep_every_key() {
        let mut at = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let mut m: IdMap<usize> = IdMap::new();
            let mut grew = Vec::new();
            for i in 0..5000 {
                let cap = m.table.capacity();
                m.insert(Rc::from(i.to_string()), i);
                if m.table.capacity() != cap {
                    // Never later than a full table, never before half.
                    assert!(i >= cap / 2 && i <= cap, "grew at {i} of {cap}");
                    grew.push(i);
                }
            }
            assert!((0..5000).all(|i| m.get(&i.to_string()) == Some(&i)));
            at.insert(grew);
        }
        assert!(at.len() > 1, "every map grew at the same lengths: {at:?}");
    }

    #[test]
    fn survives_growth_and_keeps_every_key() {
        let mut m: IdMap<usize> = IdMap::new();
        for i in 0..10_000 {
            m.insert(Rc::from(format!("id-{i}")), i);
        }
        assert_eq!(m.len(), 10_000);
        for i in (0..10_000).step_by(2) {
            assert_eq!(m.remove(&format!("id-{i}")), Some(i));
        }
        for i in 0..10_000 {
            let want = (i % 2 == 1).then_some(i);
            assert_eq!(m.get(&format!("id-{i}")).copied(), want, "id-{i}");
        }
    }

    #[test]
    fn hashed_and_indexed_access_agree_with_keyed_access() {
        let mut m: IdMap<u32> = IdMap::new();
        let h = m.hash_of("a");
        assert!(m.get_hashed(h, "a").is_none());
        assert_eq!(m.insert_hashed(h, Rc::from("a"), 1), None);
        assert_eq!(m.insert_hashed(h, Rc::from("a"), 2), Some(1));
        m.insert(Rc::from("b"), 3);
        assert_eq!(
            m.get_hashed(h, "a").map(|(k, v)| (&**k, *v)),
            Some(("a", 2))
        );
        let i = m.index_of("b").expect("b is stored");
        assert_eq!(m.at(i), Some(&3));
        if let Some(v) = m.at_mut(i) {
            *v = 30;
        }
        assert_eq!(m.get("b"), Some(&30));
        assert_eq!(m.index_of("c"), None);
    }

    #[test]
    fn two_maps_hash_with_different_keys() {
        let a: IdMap<()> = IdMap::new();
        let b: IdMap<()> = IdMap::new();
        assert_ne!(a.hash("same id"), b.hash("same id"));
    }
}
