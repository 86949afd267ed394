//! The command line tools in the same binary: `relay agent` (the laptop
//! side: long-poll, run a command per prompt, post its output), `relay send`
//! (post a prompt, print its answers), `relay ask` and `relay reply` (a
//! question from the agent and the person's answer), `relay health` (the container
//! health check), `relay token` (a token for one session) and `relay pair`
//! (a phone's link and QR code, and the agent's command line). The network
//! ones are blocking clients over `std::net`, sharing one small HTTP client
//! ([`client`]); the server's own code is reused for validation (session
//! ids, size limits), settings (logging, address) and the token format.

pub mod agent;
mod agent_all;
pub mod ask;
pub mod client;
mod command;
mod context;
pub mod e2e;
mod fail;
pub mod health;
pub mod pair;
mod parts;
pub mod reply;
pub mod send;
mod session;
mod stream;
pub mod token;
mod watch;

use std::time::Duration;

/// The subcommand lines of `relay --help`.
pub const SUMMARY: &str = "
commands (each has --help):
  relay agent --session ID [--url URL] [--token-file FILE] [--ca FILE] [--context N] -- CMD [ARGS...]
      run CMD once per prompt of the session, post its output as the answer
  relay agent --all | --prefix P [--jobs N] [...] -- CMD [ARGS...]
      the same for every session the token opens (or those under P)
  relay send --session ID [--url URL] [--token-file FILE] [--ca FILE] TEXT...
      post a prompt and print the answers to it
  relay ask [--choice C]... [--default C] [--timeout S] TEXT...
      ask the person (from a command under relay agent: no flags needed), print the reply
  relay reply --session ID --ask ASK_ID [--url URL] [--token-file FILE] TEXT...
      answer a question from the agent
  relay health [--url URL] [--ca FILE]
      GET /healthz: exit 0 on 200, 1 otherwise (the container health check)
  relay token --role client|agent --session ID [--expires S]
      print a token for one session, signed with RELAY_TOKEN_SECRET
  relay key
      print a new key for --e2e-key (end-to-end encryption)
  relay pair --url PUBLIC_URL --session ID [--e2e] [--expires S] [-- CMD [ARGS...]]
      print a phone's link to the session as a QR code, and the agent's command line
";

const KEY_HELP: &str = "usage: relay key

Prints a new random key for end-to-end encryption: give the same key to
relay send and relay agent (--e2e-key or RELAY_E2E_KEY). Prompt and answer
texts are then encrypted (AES-256-GCM) before they leave the tool, so the
server stores and forwards only ciphertext. Session ids, message ids,
metadata, timing and sizes stay in clear.

exit codes: 0 printed, 1 no randomness available, 2 bad usage
";

/// `relay key ARGS`: prints a new key; returns the exit code.
fn key_main(args: &[String]) -> u8 {
    match args {
        [] => match e2e::new_key() {
            Ok(key) => {
                println!("{key}");
                0
            }
            Err(e) => {
                eprintln!("relay key: {e}");
                1
            }
        },
        [h] if h == "-h" || h == "--help" => {
            print!("{KEY_HELP}");
            0
        }
        [other, ..] => usage_error("key", &format!("unexpected '{other}'")),
    }
}

/// The server the tools talk to when neither `--url` nor `RELAY_URL` says.
const DEFAULT_URL: &str = "http://127.0.0.1:8000";

/// Runs the subcommand `args[0]` names, returning its exit code; `None`
/// when `args` does not start with a subcommand (the server runs then).
/// Called once by `main`.
pub fn dispatch(args: &[String], env: &[(String, String)]) -> Option<u8> {
    let (name, rest) = args.split_first()?;
    match name.as_str() {
        "agent" => Some(agent::main(rest, env)),
        "send" => Some(send::main(rest, env)),
        "ask" => Some(ask::main(rest, env)),
        "reply" => Some(reply::main(rest, env)),
        "health" => Some(health::main(rest, env)),
        "token" => Some(token::main(rest, env)),
        "key" => Some(key_main(rest)),
        "pair" => Some(pair::main(rest, env)),
        // `relay help agent` is `relay agent --help`; `relay help` alone is
        // the server's help (config::parse).
        "help" => match rest.first() {
            Some(sub)
                if [
                    "agent", "send", "ask", "reply", "health", "token", "key", "pair",
                ]
                .contains(&sub.as_str()) =>
            {
                dispatch(&[sub.clone(), "--help".to_string()], env)
            }
            _ => None,
        },
        _ => None,
    }
}

/// A subcommand's flags and the arguments after them.
#[derive(Debug, Default)]
struct Parsed {
    values: Vec<(&'static str, String)>,
    switches: Vec<&'static str>,
    /// The words after the flags (the command, or the text).
    rest: Vec<String>,
    help: bool,
}

impl Parsed {
    fn value(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(f, _)| *f == flag)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a flag that may be repeated (`--choice`), in order.
    fn values<'a>(&'a self, flag: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.values
            .iter()
            .filter(move |(f, _)| *f == flag)
            .map(|(_, v)| v.as_str())
    }

    fn switch(&self, flag: &str) -> bool {
        self.switches.contains(&flag)
    }
}

/// Which flags a subcommand takes.
struct Spec {
    valued: &'static [&'static str],
    switches: &'static [&'static str],
    /// Whether flags may follow the first plain word (`send TEXT --all`);
    /// when not, the first plain word starts `rest` (the agent's command,
    /// whose own flags must stay its own).
    interleaved: bool,
}

/// Parses `--flag value`, `--flag=value` and switches; `--` ends the flags.
fn parse_flags(args: &[String], spec: &Spec) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            parsed.rest.extend(it.cloned());
            break;
        }
        if arg == "-h" || arg == "--help" {
            parsed.help = true;
            continue;
        }
        if !arg.starts_with('-') || arg == "-" {
            parsed.rest.push(arg.clone());
            if !spec.interleaved {
                parsed.rest.extend(it.cloned());
                break;
            }
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if let Some(name) = spec.valued.iter().find(|f| **f == flag) {
            let value = match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or(format!("{flag} needs a value"))?,
            };
            parsed.values.push((name, value));
        } else if let Some(name) = spec.switches.iter().find(|f| **f == flag) {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            parsed.switches.push(name);
        } else {
            return Err(format!("unknown flag '{arg}'"));
        }
    }
    Ok(parsed)
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// `--url`, else `RELAY_URL`, else the local default.
fn url_of(parsed: &Parsed, env: &[(String, String)]) -> Result<client::Url, String> {
    let raw = parsed
        .value("--url")
        .or_else(|| env_value(env, "RELAY_URL"))
        .unwrap_or(DEFAULT_URL);
    client::Url::parse(raw).map_err(|e| format!("invalid --url {e}"))
}

/// What an `https://` server's certificate is checked against: `--ca`
/// (else `RELAY_CA`) alone when given, else the system's bundle
/// (`SSL_CERT_FILE` first), else the Mozilla roots built in. `None` for an
/// `http://` URL. A `--ca` file that cannot be used is a usage error.
fn tls_of(
    parsed: &Parsed,
    env: &[(String, String)],
    url: &client::Url,
) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, String> {
    let flag = parsed.value("--ca");
    if !url.is_tls() {
        return match flag {
            Some(_) => Err("--ca is for https:// URLs".into()),
            None => Ok(None),
        };
    }
    let ca = flag.or_else(|| env_value(env, "RELAY_CA"));
    let system = env_value(env, "SSL_CERT_FILE");
    crate::tls::client_config(
        ca.map(std::path::Path::new),
        system.map(std::path::Path::new),
        Some(crate::tls::ALPN_HTTP11),
    )
    .map(Some)
    .map_err(|e| format!("--ca: {e}"))
}

/// A secret from `--FLAG VALUE`, `--FLAG-file FILE` or the environment
/// variable `env_name`, in that order. A value on the command line shows
/// in `ps` to every user of the machine; the file and the variable do not,
/// and the tools' help says to prefer them. A file's trailing newline (as
/// `echo` and editors leave) is not part of the secret; a file that cannot
/// be read, or is empty, is a usage error naming it.
fn secret_of(
    parsed: &Parsed,
    env: &[(String, String)],
    flag: &str,
    env_name: &str,
) -> Result<Option<String>, String> {
    let file_flag = format!("{flag}-file");
    match (parsed.value(flag), parsed.value(&file_flag)) {
        (Some(_), Some(_)) => Err(format!("give {flag} or {file_flag}, not both")),
        (Some(v), None) => Ok(Some(v.to_string())),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {file_flag} {path}: {e}"))?;
            let line = text.strip_suffix('\n').unwrap_or(&text);
            let secret = line.strip_suffix('\r').unwrap_or(line);
            if secret.is_empty() {
                return Err(format!("{file_flag} {path} is empty"));
            }
            Ok(Some(secret.to_string()))
        }
        (None, None) => Ok(env_value(env, env_name).map(str::to_string)),
    }
}

/// `--token`, `--token-file`, else the role's environment variable;
/// printable ASCII only, since it travels in a header.
fn token_of(
    parsed: &Parsed,
    env: &[(String, String)],
    env_name: &str,
) -> Result<Option<String>, String> {
    match secret_of(parsed, env, "--token", env_name)? {
        Some(t) if !t.bytes().all(|b| b.is_ascii_graphic()) => Err(format!(
            "the token (--token, --token-file or {env_name}) must be printable ASCII without spaces"
        )),
        t => Ok(t),
    }
}

/// The client of a tool that talks to the server as one role: `--url`,
/// `--ca` and the role's token (`--token`, `--token-file`, else
/// `token_env`), checked in that order.
fn client_of(
    parsed: &Parsed,
    env: &[(String, String)],
    token_env: &str,
) -> Result<client::Client, String> {
    let url = url_of(parsed, env)?;
    let tls = tls_of(parsed, env, &url)?;
    let token = token_of(parsed, env, token_env)?;
    Ok(client::Client::new(url, token, tls))
}

/// `--e2e-key`, `--e2e-key-file`, else `RELAY_E2E_KEY`: the end-to-end
/// key, if any.
fn e2e_key_of(parsed: &Parsed, env: &[(String, String)]) -> Result<Option<e2e::Key>, String> {
    match secret_of(parsed, env, "--e2e-key", "RELAY_E2E_KEY")? {
        None => Ok(None),
        Some(k) => e2e::Key::parse(&k)
            .map(Some)
            .map_err(|e| format!("--e2e-key (or --e2e-key-file, RELAY_E2E_KEY): {e}")),
    }
}

/// `--session`, checked with the server's own rule.
fn session_of(parsed: &Parsed) -> Result<String, String> {
    let sid = parsed
        .value("--session")
        .ok_or("--session ID is required")?;
    if crate::store::model::valid_session_id(sid) {
        Ok(sid.to_string())
    } else {
        Err(format!(
            "invalid --session '{sid}': 1 to 128 characters from A-Z a-z 0-9 . _ ~ -"
        ))
    }
}

/// `--session`, else `RELAY_SESSION_ID` (which `relay agent` gives its
/// command), checked with the server's own rule.
fn session_or_env(parsed: &Parsed, env: &[(String, String)]) -> Result<String, String> {
    match (
        parsed.value("--session"),
        env_value(env, "RELAY_SESSION_ID"),
    ) {
        (None, Some(sid)) if crate::store::model::valid_session_id(sid) => Ok(sid.to_string()),
        (None, Some(sid)) => Err(format!("invalid RELAY_SESSION_ID '{sid}'")),
        (None, None) => Err("--session ID (or RELAY_SESSION_ID) is required".into()),
        (Some(_), _) => session_of(parsed),
    }
}

/// A positive number of seconds (`--timeout 2.5`).
fn seconds_of(parsed: &Parsed, flag: &str, default: Duration) -> Result<Duration, String> {
    match parsed.value(flag) {
        None => Ok(default),
        Some(v) => seconds(flag, v),
    }
}

/// [`seconds_of`], else the environment variable `env_name`.
fn seconds_or_env(
    parsed: &Parsed,
    env: &[(String, String)],
    flag: &str,
    env_name: &str,
    default: Duration,
) -> Result<Duration, String> {
    match (parsed.value(flag), env_value(env, env_name)) {
        (Some(v), _) => seconds(flag, v),
        (None, Some(v)) => seconds(env_name, v),
        (None, None) => Ok(default),
    }
}

fn seconds(name: &str, v: &str) -> Result<Duration, String> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 31_536_000.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "invalid {name} '{v}': expected seconds greater than 0"
        )),
    }
}

/// The flags of `relay <command>`, a command that takes nothing else:
/// `Err(exit code)` once it printed its help (0) or a usage error (2).
fn flags_only(command: &str, args: &[String], spec: &Spec, help: &str) -> Result<Parsed, u8> {
    match parse_flags(args, spec) {
        Ok(p) if p.help => {
            print!("{help}");
            Err(0)
        }
        Ok(p) if !p.rest.is_empty() => {
            Err(usage_error(command, &format!("unexpected '{}'", p.rest[0])))
        }
        Ok(p) => Ok(p),
        Err(e) => Err(usage_error(command, &e)),
    }
}

/// The options of `relay <command>`: its flags parsed by `spec`, then
/// built by `options`; `Err(exit code)` once it printed its help (0) or a
/// usage error (2).
fn tool_options<O>(
    command: &str,
    args: &[String],
    env: &[(String, String)],
    spec: &Spec,
    help: &str,
    options: impl FnOnce(&Parsed, &[(String, String)]) -> Result<O, String>,
) -> Result<O, u8> {
    let parsed = match parse_flags(args, spec) {
        Ok(p) if p.help => {
            print!("{help}");
            return Err(0);
        }
        Ok(p) => p,
        Err(e) => return Err(usage_error(command, &e)),
    };
    options(&parsed, env).map_err(|e| usage_error(command, &e))
}

/// Prints a usage error the way the server does and returns exit code 2.
fn usage_error(command: &str, why: &str) -> u8 {
    eprintln!("relay {command}: {why} (see relay {command} --help)");
    2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    const SPEC: Spec = Spec {
        valued: &["--url", "--session"],
        switches: &["--all"],
        interleaved: false,
    };

    #[test]
    fn flags_stop_at_the_command() {
        let p = parse_flags(&args(&["--session=s", "--url", "u", "cat", "--all"]), &SPEC).unwrap();
        assert_eq!(
            (p.value("--session"), p.value("--url")),
            (Some("s"), Some("u"))
        );
        assert_eq!(p.rest, args(&["cat", "--all"]));
        assert!(!p.switch("--all"));
        let p = parse_flags(&args(&["--all", "--", "--url", "x"]), &SPEC).unwrap();
        assert!(p.switch("--all"));
        assert_eq!(p.rest, args(&["--url", "x"]));
    }

    #[test]
    fn interleaved_flags_may_follow_words() {
        let spec = Spec {
            interleaved: true,
            ..SPEC
        };
        let p = parse_flags(&args(&["hello", "--all", "world"]), &spec).unwrap();
        assert!(p.switch("--all"));
        assert_eq!(p.rest, args(&["hello", "world"]));
    }

    #[test]
    fn bad_flags_are_named() {
        let e = parse_flags(&args(&["--nope"]), &SPEC).unwrap_err();
        assert!(e.contains("--nope"), "{e}");
        let e = parse_flags(&args(&["--url"]), &SPEC).unwrap_err();
        assert!(e.contains("--url"), "{e}");
        let e = parse_flags(&args(&["--all=1"]), &SPEC).unwrap_err();
        assert!(e.contains("--all"), "{e}");
    }

    #[test]
    fn every_variable_the_tools_read_is_known_to_the_server() {
        // The server warns about `RELAY_*` variables it does not know; the
        // tools' own must be on its list, or exporting them warns.
        let sources = [
            include_str!("mod.rs"),
            include_str!("agent.rs"),
            include_str!("send.rs"),
            include_str!("ask.rs"),
            include_str!("reply.rs"),
            include_str!("health.rs"),
            include_str!("token.rs"),
            include_str!("pair.rs"),
            include_str!("command.rs"),
            include_str!("context.rs"),
            include_str!("e2e.rs"),
            include_str!("client.rs"),
            include_str!("parts.rs"),
            include_str!("stream.rs"),
            include_str!("watch.rs"),
        ];
        for source in sources {
            for (i, _) in source.match_indices("\"RELAY_") {
                let name: String = source[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name == "RELAY_" {
                    continue; // this test's own pattern
                }
                assert!(
                    crate::config::is_setting(&name)
                        || crate::config::TOOL_VARIABLES.contains(&name.as_str()),
                    "{name} is read by a tool but unknown to the server"
                );
            }
        }
    }

    #[test]
    fn secrets_come_from_a_flag_a_file_or_the_environment() {
        let spec = Spec {
            valued: &["--token", "--token-file"],
            switches: &[],
            interleaved: false,
        };
        let dir = std::env::temp_dir().join(format!("relay-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\r\n").unwrap();
        let env = vec![("RELAY_AGENT_TOKEN".to_string(), "from-env".to_string())];
        let of = |words: &[&str]| {
            let p = parse_flags(&args(words), &spec).unwrap();
            token_of(&p, &env, "RELAY_AGENT_TOKEN")
        };
        let path = file.to_str().unwrap();
        assert_eq!(of(&["--token", "t"]).unwrap().as_deref(), Some("t"));
        assert_eq!(
            of(&["--token-file", path]).unwrap().as_deref(),
            Some("from-file")
        );
        assert_eq!(of(&[]).unwrap().as_deref(), Some("from-env"));
        let e = of(&["--token", "t", "--token-file", path]).unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let missing = dir.join("missing");
        let e = of(&["--token-file", missing.to_str().unwrap()]).unwrap_err();
        assert!(
            e.starts_with(&format!("cannot read --token-file {}", missing.display())),
            "{e}"
        );
        std::fs::write(&file, "\n").unwrap();
        assert!(
            of(&["--token-file", path])
                .unwrap_err()
                .contains("is empty")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sessions_and_tokens_are_checked_before_any_request() {
        let p = parse_flags(&args(&["--session", "a/b"]), &SPEC).unwrap();
        assert!(session_of(&p).is_err());
        let env = vec![("RELAY_AGENT_TOKEN".to_string(), "two words".to_string())];
        assert!(token_of(&p, &env, "RELAY_AGENT_TOKEN").is_err());
        let env = vec![("RELAY_URL".to_string(), "http://h:1".to_string())];
        assert_eq!(
            url_of(&p, &env).unwrap(),
            client::Url::parse("h:1").unwrap()
        );
    }
}
