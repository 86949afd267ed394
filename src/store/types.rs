//! The keys of the log: [`Seq`], a message's place in its session's
//! history.

/// A message's place in its session's history: 1, 2, 3, … in the order the
/// session's messages were stored, never reused. `Seq(0)` stands before the
/// first message: it is "nothing yet" for a cursor, an `after`, or the
/// previous assistant message of the first one.
///
/// Numbers come in and go out as plain `u64` only at the edges: query
/// strings, JSON, SQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl Seq {
    /// The first message of a session.
    pub const FIRST: Seq = Seq(1);

    /// The number, for the edges (JSON, SQL, logs).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The place after this one. Saturates: an `after` from a query string
    /// may be `u64::MAX`, past anything stored.
    pub fn next(self) -> Seq {
        Seq(self.0.saturating_add(1))
    }

    /// The place before this one (`Seq(0)` stays put): where a cursor stands
    /// to read from `self` on.
    pub fn before(self) -> Seq {
        Seq(self.0.saturating_sub(1))
    }
}
