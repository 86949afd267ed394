//! Refused token checks, logged for the operator: a client or agent with a
//! stale token otherwise fails without a trace in the server's log (the
//! per-request line is at debug level). At `info`, with the route, the
//! role it needs and the client's address, never the token presented; at
//! most one line a second, so a client retrying in a loop (or someone
//! guessing) cannot flood the log: the next line counts what was left out.

use std::net::IpAddr;

use log::info;

use crate::time::Millis;

/// The shortest time between two lines.
const INTERVAL_MS: u64 = 1000;

/// The log's limiter: when the next line may be written, and how many
/// refusals were left out since the last one.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    next: Millis,
    suppressed: u64,
}

impl Refusals {
    /// Called for every refused token check, at `now`.
    pub(super) fn note(
        &mut self,
        now: Millis,
        route: &str,
        role: &str,
        status: u16,
        client: IpAddr,
    ) {
        if now < self.next {
            self.suppressed += 1;
            return;
        }
        let client = client.to_string();
        info!(route = route, role = role, status = status, client = client.as_str(),
            suppressed = self.suppressed; "token refused");
        self.suppressed = 0;
        self.next = now.after_ms(INTERVAL_MS);
    }

    /// Called by the periodic sweep: says how many refusals were left out
    /// since the last line, once the interval has passed, so a burst that
    /// stopped is still counted.
    pub(super) fn flush(&mut self, now: Millis) {
        if self.suppressed > 0 && now >= self.next {
            info!(suppressed = self.suppressed; "token refused (more, not logged one by one)");
            self.suppressed = 0;
            self.next = now.after_ms(INTERVAL_MS);
        }
    }

    /// Refusals not logged yet.
    #[cfg(test)]
    pub(super) fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_one_line_a_second_counting_the_rest() {
        let mut r = Refusals::default();
        let ip = IpAddr::from([127, 0, 0, 1]);
        r.note(Millis(5000), "prompt", "client", 401, ip);
        assert_eq!(r.suppressed(), 0, "the first is logged");
        for t in 5001..5010 {
            r.note(Millis(t), "prompt", "client", 401, ip);
        }
        assert_eq!(r.suppressed(), 9);
        r.flush(Millis(5500));
        assert_eq!(r.suppressed(), 9, "not before the interval");
        r.note(Millis(6000), "prompt", "client", 401, ip);
        assert_eq!(r.suppressed(), 0, "logged with the count");
        r.note(Millis(6001), "prompt", "client", 401, ip);
        r.flush(Millis(7000));
        assert_eq!(r.suppressed(), 0, "the sweep counts a burst that stopped");
    }
}
