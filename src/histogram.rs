//! A histogram of durations (the loop's turns, the storage thread's
//! commits), rendered by `metrics`.

/// Upper bounds of the buckets, in seconds.
pub const BOUNDS: [f64; 9] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];

/// A histogram of durations with fixed buckets (100 µs to 1 s).
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Observations at most each bound (not cumulative; rendered cumulative).
    buckets: [u64; BOUNDS.len()],
    count: u64,
    sum_us: u64,
}

impl Histogram {
    /// Records one observation of `us` microseconds.
    pub fn observe_us(&mut self, us: u64) {
        let secs = us as f64 / 1e6;
        if let Some(i) = BOUNDS.iter().position(|b| secs <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    /// Observations at most each bound of [`BOUNDS`], not cumulative.
    pub fn buckets(&self) -> [u64; BOUNDS.len()] {
        self.buckets
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of every observation, in microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us
    }
}
