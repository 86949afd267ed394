//! This instance's agent, as the other instances hear of it: an online
//! agent is announced with a lease (online until a time), so an instance
//! that dies stops counting once its lease runs out, and a parked poll,
//! which may last any time, renews its lease before it does.

use super::route::Expect;
use super::{Known, Op, RedisStore};
use crate::store::seam::{AgentHere, Announced, Scope};
use crate::store::types::SessionId;

/// How long an instance's parked poll counts as an online agent for the
/// other instances without being announced again (it is, halfway).
const LEASE: u64 = 60_000;

/// What to announce of an agent that is `here` at `unix_ms`, when the
/// other instances were last told `told` (updated): `Some(until)` to
/// announce (0: offline), and in how many ms to look again while nothing
/// changes (a parked poll's lease to renew).
///
/// An online agent is announced as online until a little later than it
/// will be (by `slack`, half the grace), and again only once that is
/// passed: the other instances never see it offline early, and hear of
/// it at most once per `slack` however often the agent asks. Going
/// offline is announced at once.
fn lease(
    told: &mut Announced,
    here: AgentHere,
    unix_ms: u64,
    grace_ms: u64,
) -> (Option<u64>, Option<u64>) {
    let slack = grace_ms.min(LEASE) / 2;
    let want = match here {
        AgentHere::Parked => unix_ms + LEASE,
        AgentHere::Until(until) => until,
        AgentHere::Away => 0,
    };
    let mut tell = None;
    if want == 0 && told.until != 0 {
        told.until = 0;
        tell = Some(0);
    } else if want > told.until {
        told.until = want + slack;
        tell = Some(told.until);
    }
    // Announced again before the lease runs out.
    let again =
        (here == AgentHere::Parked).then(|| told.until.saturating_sub(LEASE + unix_ms).max(1));
    (tell, again)
}

impl RedisStore {
    /// This instance's agent in `sid` is `here` at `unix_ms` (wall clock),
    /// last seen at `seen`; `told` is what the other instances were told
    /// before. Returns in how many ms to call again while nothing
    /// changes (a parked poll's lease to renew); see [`lease`].
    pub fn announce_agent(
        &mut self,
        sid: &SessionId,
        told: &mut Announced,
        here: AgentHere,
        seen: u64,
        unix_ms: u64,
        grace_ms: u64,
    ) -> Option<u64> {
        let (tell, again) = lease(told, here, unix_ms, grace_ms);
        if let Some(until) = tell {
            self.agent(sid, until, seen);
        }
        again
    }

    /// [`announce_agent`](Self::announce_agent) for this instance's
    /// agent of every session `scope` covers (an all-sessions poll).
    pub fn announce_every(
        &mut self,
        scope: &Scope,
        told: &mut Announced,
        here: AgentHere,
        seen: u64,
        unix_ms: u64,
        grace_ms: u64,
    ) -> Option<u64> {
        let (tell, again) = lease(told, here, unix_ms, grace_ms);
        if let Some(until) = tell {
            self.every_agent(scope, until, seen, here == AgentHere::Parked);
        }
        again
    }

    /// Stores this instance's agent state in `sid` (online until `until`,
    /// unix ms; 0: offline; last seen at `seen`) for instances that start
    /// serving the session later, and publishes it to the others.
    fn agent(&mut self, sid: &SessionId, until: u64, seen: u64) {
        let (until, seen) = (until.to_string(), seen.to_string());
        let instance = self.instance.clone();
        let extra: [&[u8]; 3] = [instance.as_bytes(), until.as_bytes(), seen.as_bytes()];
        self.call(sid, Op::Agent, Known::default(), &extra, Expect::Quiet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::StoreLimits;
    use crate::store::redis::RedisUrl;

    fn store() -> RedisStore {
        let url = RedisUrl::parse("redis://127.0.0.1:6379/0").unwrap();
        let limits = StoreLimits {
            history_limit: 10,
            max_sessions: 10,
            max_pending: 10,
            draft_timeout_ms: 60_000,
        };
        RedisStore::new(url, "t:", limits)
    }

    #[test]
    fn a_parked_poll_is_announced_once_per_slack_and_renewed_before_its_lease_ends() {
        let (mut r, mut told) = (store(), Announced::default());
        let sid = SessionId::new("s").unwrap();
        let grace = 10_000;
        let again = r.announce_agent(&sid, &mut told, AgentHere::Parked, 0, 1_000, grace);
        assert_eq!(told.until, 1_000 + LEASE + grace / 2);
        assert_eq!(again, Some(grace / 2), "renewed as the slack runs out");
        let before = told;
        let again = r.announce_agent(&sid, &mut told, AgentHere::Parked, 0, 2_000, grace);
        assert_eq!(told, before, "within the slack: not announced again");
        assert_eq!(again, Some(grace / 2 - 1_000));
    }

    #[test]
    fn the_grace_is_announced_and_going_offline_at_once() {
        let (mut r, mut told) = (store(), Announced::default());
        let sid = SessionId::new("s").unwrap();
        let again = r.announce_agent(&sid, &mut told, AgentHere::Until(5_000), 0, 1_000, 4_000);
        assert_eq!((told.until, again), (7_000, None));
        r.announce_agent(&sid, &mut told, AgentHere::Away, 0, 6_000, 4_000);
        assert_eq!(told.until, 0);
    }
}
