//! Per-client token buckets for the write endpoints, sans-IO. Each client
//! (peer address, or the forwarded address behind a trusted proxy) has a
//! bucket of `rate` tokens refilled at `rate` per second. Every request takes
//! a token, rejected ones included, so a client that keeps hammering stays
//! limited until it slows down; the balance floors at `-rate`, so it
//! recovers within two seconds of stopping. The map is capped: full buckets
//! are forgotten by a sweep, and past the cap new clients go unmetered rather
//! than grow memory.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::time::Millis;

/// Clients tracked at most.
pub const MAX_CLIENTS: usize = 65_536;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    last: Millis,
}

/// The limiter; `rate == 0` turns it off.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    buckets: HashMap<IpAddr, Bucket>,
}

impl RateLimiter {
    /// `rate` requests per second with a burst of the same size.
    pub fn new(rate: u32) -> RateLimiter {
        RateLimiter {
            rate: rate as f64,
            buckets: HashMap::new(),
        }
    }

    /// Whether limiting is on.
    pub fn enabled(&self) -> bool {
        self.rate > 0.0
    }

    /// Takes a token for `client` at `now`. `Err` carries the seconds to
    /// wait before a request will pass (`Retry-After`).
    pub fn check(&mut self, client: IpAddr, now: Millis) -> Result<(), u64> {
        if !self.enabled() {
            return Ok(());
        }
        if !self.buckets.contains_key(&client) && self.buckets.len() >= MAX_CLIENTS {
            self.sweep(now);
            if self.buckets.len() >= MAX_CLIENTS {
                return Ok(());
            }
        }
        let rate = self.rate;
        let b = self.buckets.entry(client).or_insert(Bucket {
            tokens: rate,
            last: now,
        });
        let elapsed_s = now.since(b.last) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed_s * rate).min(rate);
        b.last = now;
        let allowed = b.tokens >= 1.0;
        b.tokens = (b.tokens - 1.0).max(-rate);
        if allowed {
            Ok(())
        } else {
            Err(((1.0 - b.tokens) / rate).ceil().max(1.0) as u64)
        }
    }

    /// Forgets clients whose bucket has refilled: they are as if new.
    pub fn sweep(&mut self, now: Millis) {
        let rate = self.rate;
        self.buckets
            .retain(|_, b| b.tokens + now.since(b.last) as f64 / 1000.0 * rate < rate);
    }

    /// Clients tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

/// The client a request counts against: the peer, or behind a trusted proxy
/// the rightmost `X-Forwarded-For` entry (entries further left are supplied
/// by the client and can be forged).
pub fn client_addr(peer: IpAddr, forwarded_for: Option<&str>, trusted: &[IpAddr]) -> IpAddr {
    if !trusted.contains(&peer) {
        return peer;
    }
    forwarded_for
        .and_then(|v| v.rsplit(',').map(str::trim).find(|s| !s.is_empty()))
        .and_then(|s| s.parse().ok())
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_burst_passes_then_the_rest_waits() {
        let mut r = RateLimiter::new(5);
        for _ in 0..5 {
            assert_eq!(r.check(A, Millis(0)), Ok(()));
        }
        assert!(r.check(A, Millis(0)).is_err());
        assert_eq!(r.check(B, Millis(0)), Ok(()), "buckets are per client");
    }

    #[test]
    fn tokens_refill_at_the_rate() {
        let mut r = RateLimiter::new(10);
        for _ in 0..10 {
            r.check(A, Millis(0)).unwrap();
        }
        assert!(r.check(A, Millis(0)).is_err());
        // The rejected request counted: -1 now, so 200 ms gives one token.
        assert!(r.check(A, Millis(100)).is_err());
        assert_eq!(r.check(A, Millis(400)), Ok(()));
    }

    #[test]
    fn hammering_keeps_a_client_limited_and_retry_after_says_how_long() {
        let mut r = RateLimiter::new(2);
        for _ in 0..100 {
            let _ = r.check(A, Millis(0));
        }
        assert_eq!(r.check(A, Millis(0)), Err(2));
        assert!(r.check(A, Millis(1000)).is_err());
        assert_eq!(r.check(A, Millis(3000)), Ok(()));
    }

    #[test]
    fn the_map_is_capped_and_swept() {
        let mut r = RateLimiter::new(1);
        for i in 0..MAX_CLIENTS as u32 {
            r.check(IpAddr::from(i.to_be_bytes()), Millis(0)).unwrap();
        }
        assert_eq!(r.tracked(), MAX_CLIENTS);
        // Everyone refilled after a second: a new client sweeps them away.
        r.check(B, Millis(5000)).unwrap();
        assert_eq!(r.tracked(), 1);
        r.check(B, Millis(5000)).unwrap_err();
    }

    #[test]
    fn forwarded_for_is_trusted_only_from_a_listed_proxy() {
        let proxy: IpAddr = "127.0.0.1".parse().unwrap();
        let xff = Some("1.1.1.1, 2.2.2.2");
        assert_eq!(client_addr(A, xff, &[proxy]), A);
        assert_eq!(
            client_addr(proxy, xff, &[proxy]),
            "2.2.2.2".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_addr(proxy, Some("junk"), &[proxy]), proxy);
        assert_eq!(client_addr(proxy, None, &[proxy]), proxy);
    }
}
