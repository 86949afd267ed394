//! Time as values. `Millis` is a monotonic instant in milliseconds since the
//! process started; `UnixMillis` is wall-clock time for `ts` stamps. This is
//! the only file that reads the clock: the cores take both as parameters, so
//! their tests run on a virtual clock.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic instant, in milliseconds since the clock was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    /// `self + d`, saturating (a deadline of "never" stays representable).
    pub fn after(self, d: Duration) -> Millis {
        Millis(
            self.0
                .saturating_add(d.as_millis().min(u64::MAX as u128) as u64),
        )
    }

    /// `self + ms`, saturating.
    pub fn after_ms(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub type UnixMillis = u64;

/// The process clock: created once in the I/O shell, read once per loop turn.
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// Starts the monotonic clock at zero.
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// The current monotonic time.
    pub fn now(&self) -> Millis {
        Millis(self.start.elapsed().as_millis() as u64)
    }

    /// The current monotonic time in microseconds, for measuring how long
    /// a loop turn took.
    pub fn micros(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// The current wall-clock time; 0 if the system clock is before 1970.
    pub fn unix_now(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// The clock as read once at the start of a loop turn: every core call in
/// the turn gets these, so one turn sees one time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    pub now: Millis,
    pub unix_ms: UnixMillis,
}

impl Clock {
    /// Reads both clocks for a new loop turn.
    pub fn turn(&self) -> Turn {
        Turn {
            now: self.now(),
            unix_ms: self.unix_now(),
        }
    }
}
