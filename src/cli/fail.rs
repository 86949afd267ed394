//! What goes wrong for an agent, sorted by what retrying can do: a step
//! worth retrying (after a capped exponential backoff, at least the
//! server's `Retry-After`), one that cannot succeed (the agent exits 1),
//! and a stop signal; and the goodbye a stopping agent says.

use std::time::Duration;

use super::client::{self, Client, Limit, Response};

/// The first retry delay; it doubles on each failure in a row.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The longest `Retry-After` honoured.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// How long saying goodbye (`DELETE /agent`) may take when stopping.
const GONE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a step did not complete.
#[derive(Debug)]
pub(super) enum Fail {
    /// Worth retrying after a delay (at least `wait` when the server said);
    /// `unreachable` when no connection could be made at all.
    Retry {
        why: String,
        wait: Option<Duration>,
        unreachable: bool,
    },
    /// Retrying cannot help: the agent exits 1.
    Fatal(String),
    /// A stop signal ended the wait.
    Stopped,
}

pub(super) fn retry(why: impl Into<String>) -> Fail {
    Fail::Retry {
        why: why.into(),
        wait: None,
        unreachable: false,
    }
}

/// Sorts a request's result into an answer to look at and failures.
pub(super) fn classify(result: Result<Response, client::Error>) -> Result<Response, Fail> {
    match result {
        Err(client::Error::Cancelled) => Err(Fail::Stopped),
        Err(client::Error::Tls(why)) => Err(Fail::Fatal(why)),
        Err(e @ client::Error::Connect(_)) => Err(Fail::Retry {
            why: e.to_string(),
            wait: None,
            unreachable: true,
        }),
        Err(e) => Err(retry(e.to_string())),
        Ok(r) if r.status >= 500 || r.status == 429 || r.status == 408 => Err(Fail::Retry {
            why: r.describe(),
            wait: r.retry_after.map(Duration::from_secs),
            unreachable: false,
        }),
        // The server's reason as it gave it (expired, another session,
        // which role): what the token was and where it came from is the
        // operator's to check.
        Ok(r) if r.status == 401 || r.status == 403 => Err(Fail::Fatal(format!(
            "{} (the agent token: --token, --token-file or RELAY_AGENT_TOKEN)",
            r.describe()
        ))),
        Ok(r) => Ok(r),
    }
}

/// Tells the server the agent stopped cleanly (`DELETE /agent/{id}` or
/// `DELETE /agent`), so its presence ends at once rather than after the
/// grace. Once, briefly: the agent is leaving either way, and a server
/// without the endpoint answers `404`.
pub(super) fn gone(client: &mut Client, path: &str) {
    match client.request("DELETE", path, None, Limit::within(GONE_TIMEOUT)) {
        Ok(resp) if resp.status == 200 => log::debug!(path = path; "presence ended"),
        Ok(resp) => {
            log::debug!(path = path, error = resp.describe().as_str(); "presence not ended")
        }
        Err(e) => log::debug!(path = path, error = e.to_string().as_str(); "presence not ended"),
    }
}

/// Capped exponential backoff.
#[derive(Debug)]
pub(super) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }

    /// The delay before the next attempt, at least the server's `wait`.
    pub(super) fn delay(&mut self, wait: Option<Duration>) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(BACKOFF_MAX);
        d.max(wait.unwrap_or_default().min(RETRY_AFTER_MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_honours_retry_after() {
        let mut b = Backoff::new();
        let delays: Vec<u128> = (0..8).map(|_| b.delay(None).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        let mut b = Backoff::new();
        assert_eq!(
            b.delay(Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(b.delay(Some(Duration::from_secs(600))), RETRY_AFTER_MAX);
    }

    #[test]
    fn failures_are_sorted_by_what_retrying_can_do() {
        let resp = |status| {
            Ok(Response {
                status,
                body: br#"{"error":"x"}"#.to_vec(),
                retry_after: None,
            })
        };
        assert!(matches!(classify(resp(503)), Err(Fail::Retry { .. })));
        assert!(matches!(classify(resp(429)), Err(Fail::Retry { .. })));
        assert!(matches!(classify(resp(401)), Err(Fail::Fatal(_))));
        assert!(classify(resp(409)).is_ok());
        assert!(matches!(
            classify(Err(client::Error::Cancelled)),
            Err(Fail::Stopped)
        ));
        assert!(matches!(
            classify(Err(client::Error::TimedOut)),
            Err(Fail::Retry { .. })
        ));
    }
}
