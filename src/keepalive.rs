//! The WebSocket keep-alive schedule, sans-IO: a JSON `ping` frame and a
//! protocol Ping every interval, and a close when nothing at all (data, Pong)
//! has arrived for two intervals. The shell arms one timer at [`deadline`]
//! and calls [`on_timer`] when it fires.
//!
//! [`deadline`]: Keepalive::deadline
//! [`on_timer`]: Keepalive::on_timer

use crate::time::Millis;

/// What the connection must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Send `{"type":"ping"}` and a protocol Ping.
    SendPing,
    /// The peer is silent for two intervals: close it.
    Close,
}

/// One subscriber's schedule.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    interval_ms: u64,
    last_rx: Millis,
    next_ping: Millis,
}

impl Keepalive {
    /// Starts the schedule at `now` (the upgrade).
    pub fn new(now: Millis, interval_ms: u64) -> Keepalive {
        let interval_ms = interval_ms.max(1);
        Keepalive {
            interval_ms,
            last_rx: now,
            next_ping: Millis(now.0 + interval_ms),
        }
    }

    /// Anything arrived from the peer.
    pub fn on_receive(&mut self, now: Millis) {
        self.last_rx = now;
    }

    /// When [`on_timer`](Self::on_timer) must next run.
    pub fn deadline(&self) -> Millis {
        self.next_ping.min(self.dead_at())
    }

    fn dead_at(&self) -> Millis {
        Millis(self.last_rx.0.saturating_add(2 * self.interval_ms))
    }

    /// Decides what is due at `now`.
    pub fn on_timer(&mut self, now: Millis) -> Action {
        if now >= self.dead_at() {
            Action::Close
        } else if now >= self.next_ping {
            self.next_ping = Millis(now.0 + self.interval_ms);
            Action::SendPing
        } else {
            Action::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_every_interval_while_the_peer_answers() {
        let mut k = Keepalive::new(Millis(0), 1000);
        assert_eq!(k.deadline(), Millis(1000));
        assert_eq!(k.on_timer(Millis(999)), Action::Nothing);
        assert_eq!(k.on_timer(Millis(1000)), Action::SendPing);
        k.on_receive(Millis(1100));
        assert_eq!(k.deadline(), Millis(2000));
        assert_eq!(k.on_timer(Millis(2000)), Action::SendPing);
        k.on_receive(Millis(2050));
        assert_eq!(k.on_timer(Millis(3000)), Action::SendPing);
    }

    #[test]
    fn closes_after_two_silent_intervals() {
        let mut k = Keepalive::new(Millis(0), 1000);
        assert_eq!(k.on_timer(Millis(1000)), Action::SendPing);
        assert_eq!(k.deadline(), Millis(2000));
        assert_eq!(k.on_timer(Millis(1999)), Action::Nothing);
        assert_eq!(k.on_timer(Millis(2000)), Action::Close);
    }

    #[test]
    fn a_late_timer_still_closes_a_silent_peer() {
        let mut k = Keepalive::new(Millis(0), 1000);
        assert_eq!(k.on_timer(Millis(5000)), Action::Close);
    }
}
