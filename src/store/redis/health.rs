//! Whether Redis takes writes now, and whether it still holds what it
//! held. Readiness follows Redis both ways without waiting for a client's
//! write: a probe (one small growing write through the script) goes out
//! once a second on the command link; a refused probe or write (out of
//! memory) or a probe unanswered for [`PROBE_STALL`] makes the store
//! unhealthy, and the next answered probe makes it healthy again. The
//! probe also reads the store's generation (see `relay.lua`): a different
//! one means Redis restarted empty or was flushed, and every session a
//! relay holds was lost, not deleted.
//!
//! [`Trouble`] keeps a fault that persists to one log line when it starts,
//! one every [`LOG_EVERY_MS`] while it lasts, and one when it ends.

use std::time::Duration;

use log::Level;

use crate::time::Millis;

/// How often the command link is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a probe may go unanswered before Redis counts as hung.
pub const PROBE_STALL: Duration = Duration::from_secs(3);

/// At most one log line per fault in this many milliseconds.
pub const LOG_EVERY_MS: u64 = 30_000;

/// One line about how Redis is doing, with its URL (never the password)
/// and the cause when there is one. Every such line of the engine and of
/// the shell goes through here: one call of the logger instead of one per
/// line keeps the static binary inside its size budget (`MAX_IMAGE_BYTES`
/// in `scripts/image.sh`).
#[inline(never)]
pub fn note(level: Level, event: &str, url: &str, cause: &str) {
    if cause.is_empty() {
        log::log!(level, url = url; "{event}");
    } else {
        log::log!(level, url = url, cause = cause; "{event}");
    }
}

/// A fault that may last: when it began and when it was last logged.
#[derive(Debug, Default)]
pub struct Trouble {
    since: Option<u64>,
    logged_at: u64,
    /// Occurrences since the last line.
    unlogged: u64,
}

impl Trouble {
    /// The fault happened (again) at `now_ms`: `Some(occurrences since
    /// the last line)` when this one is to be logged, the first and then
    /// one every [`LOG_EVERY_MS`].
    pub fn report(&mut self, now_ms: u64) -> Option<u64> {
        self.unlogged += 1;
        let due = match self.since {
            None => {
                self.since = Some(now_ms);
                true
            }
            Some(_) => now_ms.saturating_sub(self.logged_at) >= LOG_EVERY_MS,
        };
        if !due {
            return None;
        }
        self.logged_at = now_ms;
        Some(std::mem::take(&mut self.unlogged))
    }

    /// Whether the fault is going on.
    pub fn active(&self) -> bool {
        self.since.is_some()
    }

    /// The fault is over: `Some(how long it lasted, ms)` if it was on.
    pub fn end(&mut self, now_ms: u64) -> Option<u64> {
        let since = self.since.take()?;
        self.unlogged = 0;
        Some(now_ms.saturating_sub(since))
    }
}

/// The probe's state and what Redis answered lately.
#[derive(Debug, Default)]
pub struct Health {
    /// Where Redis is, for the logs.
    url: String,
    next_probe: Millis,
    /// When the probe in flight was sent.
    probe_sent: Option<Millis>,
    /// Its calls not answered yet (in a cluster, one per bucket probed),
    /// and whether one of them was refused.
    probes_owed: usize,
    probe_refused: bool,
    /// The last probe or write was refused: writes fail (out of memory).
    refusing: Trouble,
    /// The probe in flight is older than [`PROBE_STALL`].
    stalled: bool,
    /// The store's generation as last read, for each bucket (one without
    /// buckets); empty while it has none.
    generation: Vec<Option<Vec<u8>>>,
    /// The generation changed: every session held is stale.
    lost: bool,
}

impl Health {
    /// Redis at `url` (as the logs show it), not probed yet.
    pub fn new(url: String) -> Health {
        Health {
            url,
            ..Health::default()
        }
    }

    /// Where Redis is, as the logs show it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes are neither refused nor hanging.
    pub fn ok(&self) -> bool {
        !self.refusing.active() && !self.stalled
    }

    /// Called once a turn while the command link is set up: whether a
    /// probe goes out now (one at a time, once a second), and whether the
    /// one in flight has been waited for too long.
    pub fn tick(&mut self, now: Millis) -> bool {
        match self.probe_sent {
            Some(sent) => {
                if !self.stalled && now.since(sent) >= PROBE_STALL.as_millis() as u64 {
                    self.stalled = true;
                    note(Level::Warn, "Redis does not answer", &self.url, "");
                }
                false
            }
            None if now >= self.next_probe => {
                self.probe_sent = Some(now);
                self.next_probe = now.after(PROBE_EVERY);
                true
            }
            None => false,
        }
    }

    /// When [`tick`](Self::tick) has something to do next.
    pub fn next_deadline(&self) -> Millis {
        match self.probe_sent {
            Some(sent) if !self.stalled => sent.after(PROBE_STALL),
            Some(_) => Millis(u64::MAX),
            None => self.next_probe,
        }
    }

    /// A probe goes out as `calls` calls (one per bucket probed).
    pub fn probing(&mut self, calls: usize) {
        self.probes_owed = calls;
        self.probe_refused = false;
    }

    /// One call of the probe was answered (`generation`: bucket
    /// `bucket`'s) or not (`None`: refused, or its connection lost); once
    /// every call is, the probe is over, and writes work if none was
    /// refused.
    pub fn probed(&mut self, unix_ms: u64, bucket: usize, generation: Option<&[u8]>) {
        match generation {
            Some(g) => self.saw_generation(bucket, g),
            None => self.probe_refused = true,
        }
        self.probes_owed = self.probes_owed.saturating_sub(1);
        if self.probes_owed > 0 {
            return;
        }
        self.probe_sent = None;
        if std::mem::take(&mut self.stalled) {
            note(Level::Info, "Redis answers again", &self.url, "");
        }
        if !self.probe_refused && self.refusing.end(unix_ms).is_some() {
            note(Level::Info, "Redis takes writes again", &self.url, "");
        }
    }

    /// Redis refused the probe or a write with `error` (out of memory,
    /// most often): unhealthy until a probe is answered. Logged once, then
    /// at most every 30 s while it lasts.
    pub fn refused(&mut self, unix_ms: u64, error: &str) {
        if self.refusing.report(unix_ms).is_some() {
            note(Level::Warn, "Redis refuses writes", &self.url, error);
        }
    }

    /// The command link is gone: the probe in flight will not be answered
    /// (a link that is down makes the store unhealthy by itself).
    pub fn link_lost(&mut self) {
        self.probe_sent = None;
        self.probes_owed = 0;
        self.stalled = false;
        self.next_probe = Millis(0);
    }

    /// Bucket `bucket`'s generation (the store's, without buckets), as
    /// an answer gave it. A bucket without one gets one from the next
    /// probe, sent at once: until then, a loss could not be told from a
    /// deletion. A change of any bucket's is taken as the store lost:
    /// every session a relay holds may be stale.
    pub fn saw_generation(&mut self, bucket: usize, generation: &[u8]) {
        if generation.is_empty() {
            self.next_probe = Millis(0);
        }
        if self.generation.len() <= bucket {
            self.generation.resize(bucket + 1, None);
        }
        match self.generation[bucket].as_deref() {
            Some(known) if known == generation => return,
            // A store that had none gets one: nothing was lost.
            Some(known) if !known.is_empty() => {
                let event = "Redis lost its data (restarted empty or flushed)";
                note(Level::Warn, event, &self.url, "");
                self.lost = true;
                // One loss, however many buckets tell of it: the others
                // are learnt again (every session held is read again).
                self.generation.iter_mut().for_each(|g| *g = None);
            }
            _ => {}
        }
        self.generation[bucket] = Some(generation.to_vec());
    }

    /// Whether the store was found lost since the last call.
    pub fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lasting_fault_is_logged_once_then_every_thirty_seconds() {
        let mut t = Trouble::default();
        assert_eq!(t.report(1_000), Some(1));
        assert_eq!(t.report(2_000), None);
        assert_eq!(t.report(30_999), None);
        assert_eq!(t.report(31_000), Some(3));
        assert_eq!(t.end(41_000), Some(40_000));
        assert_eq!(t.end(42_000), None);
        assert_eq!(t.report(50_000), Some(1));
    }

    #[test]
    fn probes_go_out_once_a_second_and_a_silent_one_stalls() {
        let mut h = Health::default();
        assert!(h.tick(Millis(0)));
        assert!(!h.tick(Millis(10)), "one in flight at a time");
        h.probed(0, 0, Some(b"g1"));
        assert!(!h.tick(Millis(999)));
        assert!(h.tick(Millis(1_000)));
        assert_eq!(h.next_deadline(), Millis(4_000));
        assert!(h.ok());
        h.tick(Millis(4_000));
        assert!(!h.ok(), "unanswered for 3 s");
        h.probed(0, 0, Some(b"g1"));
        assert!(h.ok());
        h.refused(0, "OOM");
        assert!(!h.ok());
        h.probed(0, 0, Some(b"g1"));
        assert!(h.ok());
    }

    #[test]
    fn a_new_generation_means_the_store_was_lost() {
        let mut h = Health::default();
        h.saw_generation(0, b"");
        h.saw_generation(0, b"g1");
        assert!(!h.take_lost(), "a store that had none gets one");
        h.saw_generation(0, b"g1");
        assert!(!h.take_lost());
        h.saw_generation(0, b"");
        assert!(h.take_lost(), "flushed");
        h.saw_generation(0, b"g2");
        assert!(!h.take_lost());
        h.saw_generation(0, b"g3");
        assert!(h.take_lost());
    }

    #[test]
    fn a_cluster_s_buckets_each_keep_a_generation_and_a_loss_counts_once() {
        let mut h = Health::default();
        for b in 0..4 {
            h.saw_generation(b, format!("g{b}").as_bytes());
        }
        h.saw_generation(3, b"g3");
        assert!(!h.take_lost(), "each bucket its own");
        // A master lost its data: its buckets tell one by one.
        h.saw_generation(1, b"n1");
        h.saw_generation(2, b"n2");
        assert!(h.take_lost());
        assert!(!h.take_lost(), "one loss");
        h.saw_generation(0, b"g0");
        h.saw_generation(2, b"n2");
        assert!(!h.take_lost());
    }
}
