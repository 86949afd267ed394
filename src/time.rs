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
    /// Built for tests only (the `test-clock` feature): the file named by
    /// `RELAY_TEST_CLOCK_FILE`, and the offset last read from it.
    #[cfg(feature = "test-clock")]
    test: test_clock::TestClock,
}

impl Clock {
    /// Starts the monotonic clock at zero.
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
            #[cfg(feature = "test-clock")]
            test: test_clock::TestClock::from_env(),
        }
    }

    /// Milliseconds both clocks are moved on by: always 0, but in a build
    /// for tests told to read an offset from a file.
    fn offset_ms(&self) -> u64 {
        #[cfg(feature = "test-clock")]
        return self.test.offset_ms();
        #[cfg(not(feature = "test-clock"))]
        0
    }

    /// The current monotonic time.
    pub fn now(&self) -> Millis {
        Millis(self.start.elapsed().as_millis() as u64 + self.offset_ms())
    }

    /// The current monotonic time in microseconds, for measuring how long
    /// a loop turn took.
    pub fn micros(&self) -> u64 {
        self.start.elapsed().as_micros() as u64 + self.offset_ms() * 1000
    }

    /// The current wall-clock time; 0 if the system clock is before 1970.
    pub fn unix_now(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64 + self.offset_ms())
            .unwrap_or(0)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A clock the tests move on: with the `test-clock` feature (on for the
/// test targets only, through the package's dev-dependency on itself;
/// never in a release build), `RELAY_TEST_CLOCK_FILE` names a file holding
/// a number of milliseconds, read at the start of every loop turn and
/// added to both clocks, so a test over the wire can let a session's TTL
/// or an ask's `expires_ts` pass without waiting. The offset only grows:
/// a smaller number, an unreadable file or a missing one leaves it as it
/// was, so the monotonic clock stays monotonic.
#[cfg(feature = "test-clock")]
mod test_clock {
    use std::cell::Cell;
    use std::path::PathBuf;

    pub(super) struct TestClock {
        file: Option<PathBuf>,
        offset_ms: Cell<u64>,
    }

    impl TestClock {
        pub(super) fn from_env() -> TestClock {
            TestClock::reading(std::env::var_os("RELAY_TEST_CLOCK_FILE").map(PathBuf::from))
        }

        fn reading(file: Option<PathBuf>) -> TestClock {
            TestClock {
                file,
                offset_ms: Cell::new(0),
            }
        }

        pub(super) fn offset_ms(&self) -> u64 {
            self.offset_ms.get()
        }

        /// Reads the file again (at the start of a turn).
        pub(super) fn refresh(&self) {
            let Some(file) = &self.file else {
                return;
            };
            let read = std::fs::read_to_string(file)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let Some(ms) = read
                && ms > self.offset_ms.get()
            {
                self.offset_ms.set(ms);
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The offset follows the file forward only: a smaller number, a
        /// word or a missing file leave it where it was.
        #[test]
        fn the_offset_follows_the_file_forward_only() {
            let file = std::env::temp_dir().join(format!("relay-clock-{}", std::process::id()));
            let clock = TestClock::reading(Some(file.clone()));
            clock.refresh();
            assert_eq!(clock.offset_ms(), 0, "no file yet");
            for (text, want) in [
                ("5000", 5000),
                ("4000", 5000),
                ("soon", 5000),
                (" 7000\n", 7000),
            ] {
                std::fs::write(&file, text).expect("the clock file");
                clock.refresh();
                assert_eq!(clock.offset_ms(), want, "after {text:?}");
            }
            std::fs::remove_file(&file).expect("removed");
            clock.refresh();
            assert_eq!(clock.offset_ms(), 7000, "file gone");
            assert_eq!(TestClock::reading(None).offset_ms(), 0);
        }
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
        #[cfg(feature = "test-clock")]
        self.test.refresh();
        Turn {
            now: self.now(),
            unix_ms: self.unix_now(),
        }
    }
}
