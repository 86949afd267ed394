//! `relay token`: prints a token for one session (or every session under
//! a prefix) and one role, signed with
//! the server's `RELAY_TOKEN_SECRET` (src/token.rs has the format). The
//! secret is read from the environment only, so it never shows in a
//! process list or a shell history.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Parsed, Spec};
use crate::token::{Role, Secret};

const HELP: &str =
    "usage: relay token --role client|agent (--session ID | --prefix P) [--expires S]

Prints a token that opens the role's endpoints in one session only (or in
every session whose id starts with P, which a client may create), signed
with RELAY_TOKEN_SECRET (read from the environment; the server must have
the same secret). The server checks it without any lookup; it cannot be
revoked before it expires, except by changing the secret (which revokes
every token).

  --role ROLE      client (POST /prompt, /ws, /messages, DELETE /sessions)
                   or agent (GET /prompts, POST /response); both may PUT
                   /sessions
  --session ID     the session the token is for
  --prefix P       every session whose id starts with P (an agent polls
                   them all with GET /prompts)
  --expires S      the token stops working S seconds from now (default:
                   never)

Give the client token to the page in the URL fragment, which browsers never
send: https://relay.example/#SESSION&token=TOKEN

exit codes: 0 printed, 2 bad usage (no or short secret, bad role or session)
";

const SPEC: Spec = Spec {
    valued: &["--role", "--session", "--prefix", "--expires"],
    switches: &[],
    interleaved: false,
};

/// `relay token ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let parsed = match super::flags_only("token", args, &SPEC, HELP) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    match mint(&parsed, env, now) {
        Ok(token) => {
            println!("{token}");
            0
        }
        Err(e) => super::usage_error("token", &e),
    }
}

/// The token the flags and environment ask for, at `now` (since the epoch).
fn mint(parsed: &Parsed, env: &[(String, String)], now: Duration) -> Result<String, String> {
    let secret = super::env_value(env, "RELAY_TOKEN_SECRET")
        .ok_or("RELAY_TOKEN_SECRET is not set: it must hold the server's secret")?;
    let secret = Secret::new(secret.as_bytes()).map_err(|e| format!("RELAY_TOKEN_SECRET: {e}"))?;
    let role = parsed
        .value("--role")
        .ok_or("--role client|agent is required")?;
    let role =
        Role::parse(role).ok_or_else(|| format!("invalid --role '{role}': client or agent"))?;
    let prefix = match (parsed.value("--prefix"), parsed.value("--session")) {
        (Some(_), Some(_)) => return Err("--session and --prefix: give one".to_string()),
        (Some(p), None) if crate::store::model::valid_session_id(p) => Some(p.to_string()),
        (Some(p), None) => {
            return Err(format!(
                "invalid --prefix '{p}': 1 to 128 characters from A-Z a-z 0-9 . _ ~ -"
            ));
        }
        (None, _) => None,
    };
    let session = match &prefix {
        Some(p) => p.clone(),
        None => super::session_of(parsed)?,
    };
    let expires = match parsed.value("--expires") {
        None => None,
        Some(_) => Some(expiry(
            now,
            super::seconds_of(parsed, "--expires", Duration::ZERO)?,
        )),
    };
    Ok(match prefix {
        Some(_) => secret.mint_prefix(role, &session, expires),
        None => secret.mint(role, &session, expires),
    })
}

/// The expiry of a token that lasts `ttl` from `now` (since the epoch), in
/// Unix seconds: whole seconds, rounded up, so a token never ends early.
/// `relay pair` mints its tokens with it too.
pub(super) fn expiry(now: Duration, ttl: Duration) -> u64 {
    now.as_secs() + ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn run(args: &[&str], secret: Option<&str>) -> Result<String, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let parsed = super::super::parse_flags(&args, &SPEC)?;
        let env: Vec<(String, String)> = secret
            .map(|s| ("RELAY_TOKEN_SECRET".to_string(), s.to_string()))
            .into_iter()
            .collect();
        mint(&parsed, &env, Duration::from_millis(1_700_000_000_500))
    }

    #[test]
    fn prints_a_token_the_server_opens() {
        let t = run(
            &["--role", "agent", "--session", "s1", "--expires", "60"],
            Some(SECRET),
        )
        .unwrap();
        let c = Secret::new(SECRET.as_bytes()).unwrap().open(&t).unwrap();
        assert_eq!(
            (c.role, c.session(), c.expires),
            (Role::Agent, "s1", Some(1_700_000_060))
        );
        let t = run(&["--role=client", "--session=s1"], Some(SECRET)).unwrap();
        let c = Secret::new(SECRET.as_bytes()).unwrap().open(&t).unwrap();
        assert_eq!((c.role, c.expires, c.prefix), (Role::Client, None, false));
        let t = run(&["--role=agent", "--prefix=team-"], Some(SECRET)).unwrap();
        let c = Secret::new(SECRET.as_bytes()).unwrap().open(&t).unwrap();
        assert_eq!(
            (c.role, c.session(), c.prefix),
            (Role::Agent, "team-", true)
        );
    }

    #[test]
    fn bad_usage_is_named() {
        let ok = ["--role", "client", "--session", "s"];
        for (args, secret, needle) in [
            (&ok[..], None, "RELAY_TOKEN_SECRET is not set"),
            (&ok[..], Some("short"), "32 bytes"),
            (&["--session", "s"][..], Some(SECRET), "--role"),
            (
                &["--role", "admin", "--session", "s"][..],
                Some(SECRET),
                "admin",
            ),
            (&["--role", "client"][..], Some(SECRET), "--session"),
            (
                &["--role", "client", "--session", "s", "--prefix", "p"][..],
                Some(SECRET),
                "give one",
            ),
            (
                &["--role", "client", "--prefix", "a/"][..],
                Some(SECRET),
                "a/",
            ),
            (
                &["--role", "client", "--session", "a/b"][..],
                Some(SECRET),
                "a/b",
            ),
            (
                &["--role", "client", "--session", "s", "--expires", "-1"][..],
                Some(SECRET),
                "--expires",
            ),
        ] {
            let e = run(args, secret).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
            assert!(!e.contains(SECRET), "the secret is never printed: {e}");
        }
    }
}
