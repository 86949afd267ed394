//! `relay pair`: what a phone needs to join a session, in one scan. It
//! prints the page's link (the session, a client token for it when
//! `RELAY_TOKEN_SECRET` is set, a new end-to-end key with `--e2e`, all in
//! the fragment, which browsers never send), the same link as a QR code
//! drawn in the terminal, and the `relay agent` command line for this
//! machine with the matching agent token and key. It talks to no server:
//! the tokens are minted with the secret, as `relay token` does.
//!
//! The QR code is drawn with half blocks, two modules a character, in
//! explicit colours (black on white, from the 256-colour palette, whose
//! first entries terminal themes leave alone), so it reads the same on a
//! light and a dark terminal; it keeps the 4-module quiet zone that
//! readers need around it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qrcodegen::{QrCode, QrCodeEcc};

use super::client::Url;
use super::{Parsed, Spec, e2e};
use crate::token::{Role, Secret};

const HELP: &str =
    "usage: relay pair --url PUBLIC_URL --session ID [--e2e | --e2e-key-file FILE] [--expires S] [-- CMD [ARGS...]]

Prints what a phone needs to join the session, in one scan:
  - the page's link, PUBLIC_URL/#ID&token=TOKEN&key=KEY: with a client
    token for this session when RELAY_TOKEN_SECRET is set (the server's
    secret, read from the environment), and a new end-to-end key with
    --e2e. Both travel in the fragment, which the browser never sends;
  - the same link as a QR code drawn in the terminal (black on white, for
    light and dark terminals alike), for the phone's camera;
  - the relay agent command line for this machine, with the matching agent
    token and key in its environment (RELAY_AGENT_TOKEN, RELAY_E2E_KEY),
    running CMD (the words after --; CMD when none are given).
Without RELAY_TOKEN_SECRET the link has no token and a warning says the
session is open to anyone who can reach the server. With --e2e the page
needs an https:// PUBLIC_URL (browsers encrypt only on secure pages). The
link and the command line hold the session's secrets: show them to nobody
else. Nothing is sent to the server.

  --url PUBLIC_URL  the server's address as the phone reaches it, http:// or
                    https:// (default RELAY_URL)
  --session ID      the session to pair
  --e2e             encrypt the conversation end to end with a new key
                    (relay key): the server sees only ciphertext
  --e2e-key-file FILE
                    the conversation's key already in use (another phone
                    joining an encrypted conversation), read from FILE
  --expires S       the tokens stop working S seconds from now (default:
                    never); needs RELAY_TOKEN_SECRET

exit codes: 0 printed, 1 no randomness available, 2 bad usage
";

const SPEC: Spec = Spec {
    valued: &["--url", "--session", "--expires", "--e2e-key-file"],
    switches: &["--e2e"],
    interleaved: false,
};

/// Modules of light around the code, as ISO/IEC 18004 asks of a reader.
const QUIET_ZONE: usize = 4;
/// Black on white from the 256-colour palette (16 and 231 are the corners
/// of its colour cube, fixed where the first 16 follow the theme).
const INK_ON_PAPER: &str = "\x1b[38;5;16;48;5;231m";
const RESET: &str = "\x1b[0m";

/// What `relay pair` was asked for.
#[derive(Debug)]
struct Options {
    /// The server as the phone reaches it, as given.
    url: String,
    /// The page: `scheme://host[:port][/prefix]/`.
    page: String,
    session: String,
    e2e: bool,
    /// `--e2e-key-file`: the key in use, rather than a new one.
    key: Option<String>,
    /// How long the tokens last; `None`: for ever.
    expires: Option<Duration>,
    /// The agent's command; empty: the placeholder `CMD`.
    command: Vec<String>,
}

/// What `relay pair` prints, made from the options and the environment.
#[derive(Debug, PartialEq)]
struct Pairing {
    link: String,
    /// The `relay agent` line for this machine, ready for a shell.
    agent: String,
    /// Whether the link carries a token (`RELAY_TOKEN_SECRET` was set).
    tokens: bool,
}

/// `relay pair ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let options = match super::tool_options("pair", args, env, &SPEC, HELP, options) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let new_key = || match &options.key {
        Some(k) => Ok(k.clone()),
        None => e2e::new_key(),
    };
    let key = match options.e2e.then(new_key).transpose() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("relay pair: {e}");
            return 1;
        }
    };
    let pairing = match pair(&options, env, now, key.as_deref()) {
        Ok(p) => p,
        Err(e) => return super::usage_error("pair", &e),
    };
    let qr = match draw(&pairing.link) {
        Ok(lines) => lines,
        Err(e) => return super::usage_error("pair", &e),
    };
    for warning in warnings(&options, &pairing) {
        eprintln!("relay pair: {warning}");
    }
    // The colour sequences take no column.
    let columns = qr.first().map_or(0, |l| {
        l.chars()
            .count()
            .saturating_sub(INK_ON_PAPER.len() + RESET.len())
    });
    if let Some(have) = terminal_columns().filter(|have| *have < columns) {
        eprintln!(
            "relay pair: the code is {columns} columns wide and this terminal {have}: widen \
             it, or its lines wrap and the code cannot be read"
        );
    }
    println!("Scan this with the phone's camera, or open the link on the phone:");
    println!();
    println!("{}", pairing.link);
    println!();
    for line in qr {
        println!("{line}");
    }
    println!();
    if options.command.is_empty() {
        println!("Then, on this machine, the agent (CMD: the command that answers):");
    } else {
        println!("Then, on this machine, the agent:");
    }
    println!();
    println!("{}", pairing.agent);
    0
}

/// What the person should know before scanning: a session open to all,
/// an address the phone cannot reach, a page that cannot encrypt.
fn warnings(options: &Options, pairing: &Pairing) -> Vec<String> {
    let mut out = Vec::new();
    if !pairing.tokens {
        out.push(format!(
            "RELAY_TOKEN_SECRET is not set, so the link carries no token: session {} is open \
             to anyone who can reach the server (unless the server requires \
             RELAY_CLIENT_TOKEN, which the page then asks for). To close it, give the server \
             and relay pair the same RELAY_TOKEN_SECRET (32 bytes or more): see \"Tokens for \
             one session\" in the book's security chapter.",
            options.session
        ));
    }
    let own = is_loopback(&options.page);
    if own {
        out.push(format!(
            "{} is this machine's own address, which a phone cannot reach: give --url the \
             address the phone reaches the server at",
            options.url
        ));
    }
    if options.e2e && options.page.starts_with("http://") && !own {
        out.push(format!(
            "browsers encrypt only on https:// pages (and on localhost): over {} the page will \
             refuse to send; serve it over TLS (see the book's TLS chapter)",
            options.url
        ));
    }
    out
}

/// The width of the terminal on stdout; `None` when stdout is no
/// terminal (a pipe, a file), whose lines do not wrap.
fn terminal_columns() -> Option<usize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given,
    // which lives for the call; on a descriptor that is no terminal it
    // fails and writes nothing.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// Checks the flags; called by `tool_options`.
fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let (url, name) = match (parsed.value("--url"), super::env_value(env, "RELAY_URL")) {
        (Some(u), _) => (u, "--url"),
        (None, Some(u)) => (u, "RELAY_URL"),
        (None, None) => {
            return Err(
                "--url PUBLIC_URL is required: the server's address as the phone \
                        reaches it"
                    .into(),
            );
        }
    };
    // The phone needs a whole address; the tools' default scheme is for
    // typing less at the laptop.
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(format!(
            "invalid {name} '{url}': the phone needs http:// or https://"
        ));
    }
    let page = Url::parse(url)
        .map_err(|e| format!("invalid {name} {e}"))?
        .http("/");
    let expires = match parsed.value("--expires") {
        None => None,
        Some(_) => Some(super::seconds_of(parsed, "--expires", Duration::ZERO)?),
    };
    // The file alone, never RELAY_E2E_KEY: a key in the environment is
    // not a request to hand it to a phone.
    let key = match parsed.value("--e2e-key-file") {
        None => None,
        Some(_) if parsed.switch("--e2e") => {
            return Err(
                "--e2e makes a new key and --e2e-key-file gives the one in use: give one of them"
                    .into(),
            );
        }
        Some(_) => {
            let k = super::secret_of(parsed, &[], "--e2e-key", "")?.unwrap_or_default();
            e2e::Key::parse(&k).map_err(|e| format!("--e2e-key-file: {e}"))?;
            Some(k)
        }
    };
    Ok(Options {
        url: url.to_string(),
        page,
        session: super::session_of(parsed)?,
        e2e: parsed.switch("--e2e") || key.is_some(),
        key,
        expires,
        command: parsed.rest.clone(),
    })
}

/// The link and the agent's line at `now` (since the epoch), with `key`
/// (a new one, for `--e2e`).
fn pair(
    options: &Options,
    env: &[(String, String)],
    now: Duration,
    key: Option<&str>,
) -> Result<Pairing, String> {
    let secret = match super::env_value(env, "RELAY_TOKEN_SECRET") {
        Some(s) => Some(Secret::new(s.as_bytes()).map_err(|e| format!("RELAY_TOKEN_SECRET: {e}"))?),
        None if options.expires.is_some() => {
            return Err(
                "--expires needs RELAY_TOKEN_SECRET: without it there is no token to expire".into(),
            );
        }
        None => None,
    };
    let expires = options.expires.map(|ttl| super::token::expiry(now, ttl));
    let token = |role| {
        secret
            .as_ref()
            .map(|s| s.mint(role, &options.session, expires))
    };
    let mut link = format!("{}#{}", options.page, options.session);
    let mut agent = String::new();
    if let Some(t) = token(Role::Client) {
        link.push_str(&format!("&token={t}"));
    }
    if let Some(t) = token(Role::Agent) {
        agent.push_str(&format!("RELAY_AGENT_TOKEN={t} "));
    }
    if let Some(k) = key {
        link.push_str(&format!("&key={k}"));
        agent.push_str(&format!("RELAY_E2E_KEY={k} "));
    }
    agent.push_str(&format!(
        "relay agent --url {} --session {} --",
        shell_word(&options.url),
        shell_word(&options.session)
    ));
    if options.command.is_empty() {
        agent.push_str(" CMD");
    }
    for word in &options.command {
        agent.push(' ');
        agent.push_str(&shell_word(word));
    }
    Ok(Pairing {
        link,
        agent,
        tokens: secret.is_some(),
    })
}

/// `word` as one word for a POSIX shell: as is when nothing in it is
/// special, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Whether the page's address names this machine (a phone reaching it
/// would reach itself).
fn is_loopback(page: &str) -> bool {
    let rest = page.split_once("://").map_or(page, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.split(':').next().unwrap_or(authority),
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The QR code of `text` as terminal lines: each character two modules,
/// one above the other, black on white, the quiet zone included. The
/// smallest version that holds the text at error correction level L
/// (raised when the same version holds a higher one): a screen is clean,
/// and the fewest modules make the largest ones, which a camera reads from
/// further away and a terminal fits in fewer columns.
fn draw(text: &str) -> Result<Vec<String>, String> {
    let code = QrCode::encode_text(text, QrCodeEcc::Low)
        .map_err(|e| format!("the link is too long for a QR code ({e})"))?;
    let side = usize::try_from(code.size()).unwrap_or(0) + 2 * QUIET_ZONE;
    // Outside the code (the quiet zone) `get_module` answers light.
    let dark = |x: usize, y: usize| {
        let at = |v: usize| i32::try_from(v).unwrap_or(i32::MAX) - QUIET_ZONE as i32;
        code.get_module(at(x), at(y))
    };
    // The last row of characters has a light lower half when the side is
    // odd: one more module of quiet zone.
    Ok((0..side.div_ceil(2))
        .map(|row| {
            let mut line = String::from(INK_ON_PAPER);
            line.extend(
                (0..side).map(|x| match (dark(x, 2 * row), dark(x, 2 * row + 1)) {
                    (false, false) => ' ',
                    (true, false) => '▀',
                    (false, true) => '▄',
                    (true, true) => '█',
                }),
            );
            line.push_str(RESET);
            line
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    const NOW: Duration = Duration::from_secs(1_700_000_000);

    fn run(args: &[&str], env: &[(&str, &str)], key: Option<&str>) -> Result<Pairing, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let parsed = super::super::parse_flags(&args, &SPEC)?;
        pair(&options(&parsed, &env)?, &env, NOW, key)
    }

    #[test]
    fn the_link_carries_a_client_token_and_the_agent_its_own() {
        let key = e2e::new_key().unwrap();
        let p = run(
            &["--url", "https://relay.example.org/r/", "--session", "demo"],
            &[("RELAY_TOKEN_SECRET", SECRET)],
            Some(&key),
        )
        .unwrap();
        let secret = Secret::new(SECRET.as_bytes()).unwrap();
        let (head, token) = p.link.split_once("&token=").unwrap();
        assert_eq!(head, "https://relay.example.org/r/#demo");
        let (token, k) = token.split_once("&key=").unwrap();
        assert_eq!(k, key);
        let c = secret.open(token).unwrap();
        assert_eq!(
            (c.role, c.session(), c.expires),
            (Role::Client, "demo", None)
        );
        let agent_token = p
            .agent
            .strip_prefix("RELAY_AGENT_TOKEN=")
            .and_then(|a| a.split(' ').next())
            .unwrap();
        let a = secret.open(agent_token).unwrap();
        assert_eq!((a.role, a.session()), (Role::Agent, "demo"));
        assert!(
            p.agent.ends_with(&format!(
                " RELAY_E2E_KEY={key} relay agent --url https://relay.example.org/r/ --session demo -- CMD"
            )),
            "{}",
            p.agent
        );
        assert!(p.tokens);
    }

    #[test]
    fn without_a_secret_the_link_is_the_session_alone() {
        let p = run(
            &["--session=s1", "--", "sh", "-c", "tr a-z A-Z"],
            &[("RELAY_URL", "http://192.0.2.1:8000")],
            None,
        )
        .unwrap();
        assert_eq!(p.link, "http://192.0.2.1:8000/#s1");
        assert_eq!(
            p.agent,
            "relay agent --url http://192.0.2.1:8000 --session s1 -- sh -c 'tr a-z A-Z'"
        );
        assert!(!p.tokens);
    }

    #[test]
    fn tokens_expire_together() {
        let p = run(
            &["--url", "http://h", "--session", "s", "--expires", "1.5"],
            &[("RELAY_TOKEN_SECRET", SECRET)],
            None,
        )
        .unwrap();
        let secret = Secret::new(SECRET.as_bytes()).unwrap();
        let token = p.link.split_once("&token=").unwrap().1;
        assert_eq!(secret.open(token).unwrap().expires, Some(1_700_000_002));
    }

    #[test]
    fn bad_usage_is_named() {
        for (args, env, needle) in [
            (
                &["--session", "s"][..],
                &[][..],
                "--url PUBLIC_URL is required",
            ),
            (&["--url", "h:1", "--session", "s"][..], &[][..], "http://"),
            (
                &["--url", "http://h/?q", "--session", "s"][..],
                &[][..],
                "no query",
            ),
            (&["--url", "http://h"][..], &[][..], "--session"),
            (
                &["--url", "http://h", "--session", "a/b"][..],
                &[][..],
                "a/b",
            ),
            (
                &["--url", "http://h", "--session", "s", "--expires", "60"][..],
                &[][..],
                "needs RELAY_TOKEN_SECRET",
            ),
            (
                &["--url", "http://h", "--session", "s", "--expires", "0"][..],
                &[("RELAY_TOKEN_SECRET", SECRET)][..],
                "--expires",
            ),
            (
                &["--url", "http://h", "--session", "s"][..],
                &[("RELAY_TOKEN_SECRET", "short")][..],
                "32 bytes",
            ),
        ] {
            let e = run(args, env, None).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(shell_word("cat"), "cat");
        assert_eq!(shell_word("~s"), "'~s'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn loopback_pages_are_recognised() {
        for (page, own) in [
            ("http://127.0.0.1:8000/", true),
            ("http://localhost/", true),
            ("http://[::1]:80/", true),
            ("https://relay.example.org/", false),
            ("http://192.168.1.5:8000/", false),
        ] {
            assert_eq!(is_loopback(page), own, "{page}");
        }
    }

    #[test]
    fn the_code_is_square_with_its_quiet_zone() {
        let lines = draw("https://relay.example.org/#demo").unwrap();
        let code = QrCode::encode_text("https://relay.example.org/#demo", QrCodeEcc::Low).unwrap();
        let side = code.size() as usize + 2 * QUIET_ZONE;
        assert_eq!(lines.len(), side.div_ceil(2));
        for line in &lines {
            let cells = line
                .strip_prefix(INK_ON_PAPER)
                .and_then(|l| l.strip_suffix(RESET))
                .unwrap();
            assert_eq!(cells.chars().count(), side);
        }
        // The quiet zone: two light rows of characters above, two columns on
        // each side; the finder pattern's corner is dark.
        let cells: Vec<Vec<char>> = lines
            .iter()
            .map(|l| {
                l[INK_ON_PAPER.len()..l.len() - RESET.len()]
                    .chars()
                    .collect()
            })
            .collect();
        assert!(cells[..2].iter().all(|r| r.iter().all(|c| *c == ' ')));
        assert!(
            cells
                .iter()
                .all(|r| r[..QUIET_ZONE].iter().all(|c| *c == ' '))
        );
        assert_eq!(cells[2][QUIET_ZONE], '█');
    }
}
