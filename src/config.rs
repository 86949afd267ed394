//! Settings. Every setting is an environment variable and the same-named
//! command-line flag (`RELAY_PING_INTERVAL` is `--ping-interval`); flags win.
//! Parsing takes injected iterators so it is tested without touching the
//! process environment. An invalid value is an error that names the setting.

use std::net::IpAddr;
use std::time::Duration;

mod unknown;
pub use unknown::TOOL_VARIABLES;
use unknown::unknown_variables;

use crate::relay::{Limits, NEVER};

/// Allowed `Origin`s for CORS and WebSocket upgrades.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origins {
    /// `*`: every origin.
    Any,
    /// An explicit allow-list, compared byte for byte.
    List(Vec<String>),
}

impl Origins {
    /// Whether a request carrying `Origin: origin` may proceed.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            Origins::Any => true,
            Origins::List(list) => list.iter().any(|o| o == origin),
        }
    }
}

/// `RELAY_LOG_FORMAT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The server's settings, with the contract's defaults.
#[derive(Clone, Debug)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    pub ping_interval: Duration,
    pub max_body_bytes: usize,
    pub history_limit: usize,
    /// Idle time before a session is collected; `None`: never.
    pub session_ttl: Option<Duration>,
    pub client_token: Option<String>,
    pub agent_token: Option<String>,
    pub cors_origins: Origins,
    pub max_connections: usize,
    pub max_sessions: usize,
    pub max_pending: usize,
    pub max_waiters: usize,
    pub max_subscribers: usize,
    pub subscriber_buffer_bytes: usize,
    pub rate_limit: u32,
    pub trusted_proxies: Vec<IpAddr>,
    pub log_level: log::LevelFilter,
    pub log_format: LogFormat,
    /// A request whose head and body are not complete within this gets 408.
    pub request_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub keepalive_timeout: Duration,
    /// A write the storage has not taken within this is cancelled and
    /// answered `503`; one it has taken waits for the storage's answer.
    pub store_timeout: Duration,
    /// Whether `GET /` serves the chat page (else `404`).
    pub web: bool,
    /// Directory of the SQLite database; unset: state lives in memory.
    pub data_dir: Option<std::path::PathBuf>,
    /// How often persisted changes are fsynced.
    pub sync: crate::store::sqlite::Sync,
    /// Bearer token `/metrics` needs; unset: open.
    pub metrics_token: Option<String>,
    /// Redis shared by several instances; unset: one instance.
    pub redis: Option<crate::store::redis::RedisUrl>,
    /// What every key relay writes in Redis starts with.
    pub redis_prefix: String,
    /// Replicas that must hold a write before it is acknowledged
    /// (`WAIT`); 0: acknowledged once the master ran it.
    pub redis_replicas: u32,
    /// The certificate chain (`RELAY_TLS_CERT`) and key (`RELAY_TLS_KEY`)
    /// files; set: the port speaks TLS.
    pub tls: Option<crate::tls::CertFiles>,
    /// The CA a `rediss://` Redis is checked against; unset: the system's.
    pub redis_ca: Option<std::path::PathBuf>,
    /// Signs and checks tokens for one session; set: no role is open.
    pub token_secret: Option<crate::token::Secret>,
    /// A streamed answer with no new part for this long is dropped.
    pub draft_timeout: Duration,
    /// An agent counts as online this long after its last request ended.
    pub agent_grace: Duration,
    /// Bytes held for sessions (logs, drafts, ids, queued output) before
    /// writes are refused (in memory; see the book's Memory budget).
    pub max_memory: usize,
}

impl Config {
    /// The core's view of the server's settings.
    pub fn relay_limits(&self) -> Limits {
        Limits {
            history_limit: self.history_limit,
            max_sessions: self.max_sessions,
            max_pending: self.max_pending,
            max_waiters: self.max_waiters,
            max_subscribers: self.max_subscribers,
            session_ttl_ms: self
                .session_ttl
                .map_or(NEVER, |t| u64::try_from(t.as_millis()).unwrap_or(NEVER)),
            draft_timeout_ms: millis(self.draft_timeout),
            agent_grace_ms: millis(self.agent_grace),
            max_memory: self.max_memory,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: IpAddr::from([0, 0, 0, 0]),
            port: 8000,
            ping_interval: Duration::from_secs(30),
            max_body_bytes: 1 << 20,
            history_limit: 10_000,
            session_ttl: Some(Duration::from_secs(86_400)),
            client_token: None,
            agent_token: None,
            cors_origins: Origins::Any,
            max_connections: 10_000,
            max_sessions: 100_000,
            max_pending: 1000,
            max_waiters: 100,
            max_subscribers: 1000,
            subscriber_buffer_bytes: 1 << 20,
            rate_limit: 0,
            trusted_proxies: Vec::new(),
            log_level: log::LevelFilter::Info,
            log_format: LogFormat::Text,
            request_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(75),
            store_timeout: Duration::from_secs(30),
            web: true,
            metrics_token: None,
            data_dir: None,
            sync: crate::store::sqlite::Sync::Always,
            redis: None,
            redis_prefix: "relay:".to_string(),
            redis_replicas: 0,
            tls: None,
            redis_ca: None,
            token_secret: None,
            draft_timeout: Duration::from_secs(60),
            agent_grace: Duration::from_secs(30),
            max_memory: 256 << 20,
        }
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Command {
    /// Serve. `warnings` (one sentence each, e.g. an unknown `RELAY_*`
    /// variable) are logged by the caller once logging is up, since logging
    /// is configured by this very parse.
    Run {
        cfg: Box<Config>,
        warnings: Vec<String>,
    },
    Help,
    Version,
}

type Setter = fn(&mut Config, &str) -> Result<(), String>;

/// (environment variable, meaning, setter). The flag is derived from the name.
const SETTINGS: &[(&str, &str, Setter)] = &[
    (
        "RELAY_HOST",
        "listen address: IPv4, IPv6 or localhost (default 0.0.0.0)",
        |c, v| {
            c.host = host(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_PORT",
        "listen port, 0 picks a free one (default 8000; PORT also works)",
        |c, v| {
            c.port = v
                .parse()
                .map_err(|_| "expected a port number 0-65535".to_string())?;
            Ok(())
        },
    ),
    (
        "RELAY_PING_INTERVAL",
        "seconds between WebSocket pings (default 30)",
        |c, v| {
            c.ping_interval = seconds(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_DRAFT_TIMEOUT",
        "seconds an unfinished streamed answer waits for its next part (default 60)",
        |c, v| {
            c.draft_timeout = seconds(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_AGENT_GRACE",
        "seconds an agent counts as online after its last request (default 30)",
        |c, v| {
            c.agent_grace = seconds(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_BODY",
        "request body cap in bytes (default 1048576)",
        |c, v| {
            c.max_body_bytes = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_HISTORY_LIMIT",
        "messages kept per session (default 10000)",
        |c, v| {
            c.history_limit = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_SESSION_TTL",
        "seconds of inactivity before a session is collected, 0 for never (default 86400)",
        |c, v| {
            c.session_ttl = match v.trim().parse::<f64>() {
                Ok(0.0) => None,
                _ => Some(seconds(v).map_err(|e| format!("{e}, or 0 for never"))?),
            };
            Ok(())
        },
    ),
    (
        "RELAY_CLIENT_TOKEN",
        "bearer token for the client role (default unset: open)",
        |c, v| {
            c.client_token = token(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_AGENT_TOKEN",
        "bearer token for the agent role (default unset: open)",
        |c, v| {
            c.agent_token = token(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_CORS_ORIGINS",
        "comma-separated allowed origins (default *)",
        |c, v| {
            c.cors_origins = origins(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_CONNECTIONS",
        "open sockets before new ones get 503 (default 10000)",
        |c, v| {
            c.max_connections = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_SESSIONS",
        "sessions before new ones get 503 (default 100000)",
        |c, v| {
            c.max_sessions = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_PENDING",
        "unanswered prompts per session before 503 (default 1000)",
        |c, v| {
            c.max_pending = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_WAITERS",
        "parked long-polls per session before 503 (default 100)",
        |c, v| {
            c.max_waiters = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_SUBSCRIBERS",
        "WebSocket subscribers per session before 503 (default 1000)",
        |c, v| {
            c.max_subscribers = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_SUBSCRIBER_BUFFER",
        "bytes queued per subscriber; the rest waits in history (default 1048576)",
        |c, v| {
            c.subscriber_buffer_bytes = count(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_MAX_MEMORY",
        "bytes held for sessions, K/M/G suffixes, at least 1M (default 256M)",
        |c, v| {
            c.max_memory = bytes(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_RATE_LIMIT",
        "POST requests per second per client, 0 is off (default 0)",
        |c, v| {
            c.rate_limit = v
                .parse()
                .map_err(|_| "expected a whole number".to_string())?;
            Ok(())
        },
    ),
    (
        "RELAY_TRUSTED_PROXY",
        "comma-separated proxy addresses whose X-Forwarded-For is trusted",
        |c, v| {
            c.trusted_proxies = proxies(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_LOG",
        "error, warn, info or debug (default info)",
        |c, v| {
            c.log_level = match v {
                "error" => log::LevelFilter::Error,
                "warn" => log::LevelFilter::Warn,
                "info" => log::LevelFilter::Info,
                "debug" => log::LevelFilter::Debug,
                "trace" => log::LevelFilter::Trace,
                _ => return Err("expected error, warn, info or debug".into()),
            };
            Ok(())
        },
    ),
    ("RELAY_LOG_FORMAT", "text or json (default text)", |c, v| {
        c.log_format = match v {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err("expected text or json".into()),
        };
        Ok(())
    }),
    (
        "RELAY_DATA_DIR",
        "directory of the SQLite database (default unset: in memory)",
        |c, v| {
            c.data_dir = match v.trim() {
                "" => None,
                dir => Some(std::path::PathBuf::from(dir)),
            };
            Ok(())
        },
    ),
    (
        "RELAY_SYNC",
        "always (durable before any answer) or seconds between flushes (default always)",
        |c, v| {
            c.sync = match v.trim() {
                "always" => crate::store::sqlite::Sync::Always,
                s => crate::store::sqlite::Sync::Every(
                    seconds(s).map_err(|_| "expected always or a number of seconds".to_string())?,
                ),
            };
            Ok(())
        },
    ),
    (
        "RELAY_REDIS_URL",
        "Redis shared by several instances, redis[s]://[[user]:password@]host[:port][/db] redis-sentinel://[[user]:password@]host:port[,host:port…]/master[/db] or redis-cluster://[[user]:password@]host:port[,host:port…] (default unset)",
        |c, v| {
            c.redis = match v.trim() {
                "" => None,
                url => Some(crate::store::redis::RedisUrl::parse(url)?),
            };
            Ok(())
        },
    ),
    (
        "RELAY_REDIS_PREFIX",
        "what relay's Redis keys start with (default relay:)",
        |c, v| {
            if v.is_empty() || v.len() > 64 || v.chars().any(|ch| ch.is_control() || ch == ' ') {
                return Err("expected 1 to 64 characters, no spaces".into());
            }
            c.redis_prefix = v.to_string();
            Ok(())
        },
    ),
    (
        "RELAY_REDIS_REPLICAS",
        "replicas that must hold a write before it is acknowledged, by WAIT (default 0)",
        |c, v| {
            c.redis_replicas = match v.trim().parse::<u32>() {
                Ok(n) if n <= 100 => n,
                _ => return Err("expected a whole number from 0 to 100".into()),
            };
            Ok(())
        },
    ),
    (
        "RELAY_REDIS_CA",
        "PEM file of the CA a rediss:// Redis is checked against (default: the system's)",
        |c, v| {
            c.redis_ca = path(v);
            Ok(())
        },
    ),
    (
        "RELAY_TLS_CERT",
        "PEM certificate chain: serve TLS on the port, with RELAY_TLS_KEY (default unset)",
        |c, v| {
            let files = c.tls.get_or_insert_with(unset_files);
            files.cert = path(v).unwrap_or_default();
            Ok(())
        },
    ),
    (
        "RELAY_TLS_KEY",
        "PEM private key of RELAY_TLS_CERT (default unset); SIGHUP reloads both",
        |c, v| {
            let files = c.tls.get_or_insert_with(unset_files);
            files.key = path(v).unwrap_or_default();
            Ok(())
        },
    ),
    (
        "RELAY_METRICS_TOKEN",
        "bearer token for /metrics (default unset: open)",
        |c, v| {
            c.metrics_token = token(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_TOKEN_SECRET",
        "secret (at least 32 bytes) that signs tokens for one session; set, no role is open (default unset)",
        |c, v| {
            c.token_secret = match v {
                "" => None,
                s => Some(crate::token::Secret::new(s.as_bytes())?),
            };
            Ok(())
        },
    ),
    (
        "RELAY_WEB",
        "serve the chat page at /: true or false (default true)",
        |c, v| {
            c.web = boolean(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_REQUEST_TIMEOUT",
        "seconds to receive a whole request before 408 (default 10)",
        |c, v| {
            c.request_timeout = seconds(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_STORE_TIMEOUT",
        "seconds a write may wait for the storage to take it before 503 (default 30)",
        |c, v| {
            c.store_timeout = seconds(v)?;
            Ok(())
        },
    ),
    (
        "RELAY_KEEPALIVE_TIMEOUT",
        "seconds an idle keep-alive connection is kept (default 75)",
        |c, v| {
            c.keepalive_timeout = seconds(v)?;
            Ok(())
        },
    ),
];

/// A file name; empty means unset.
fn path(v: &str) -> Option<std::path::PathBuf> {
    match v.trim() {
        "" => None,
        p => Some(std::path::PathBuf::from(p)),
    }
}

/// Certificate files before either is named: the check after parsing
/// finds which one is missing.
fn unset_files() -> crate::tls::CertFiles {
    crate::tls::CertFiles {
        cert: std::path::PathBuf::new(),
        key: std::path::PathBuf::new(),
    }
}

/// `RELAY_HOST`: an IP address, or `localhost` for 127.0.0.1 (the name a
/// newcomer types first; resolving it would depend on /etc/hosts, and an
/// IPv6-only `localhost` would surprise the `curl 127.0.0.1` of the README).
fn host(v: &str) -> Result<IpAddr, String> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::from([127, 0, 0, 1]));
    }
    v.parse().map_err(|_| {
        "expected an IPv4 or IPv6 address (0.0.0.0, 127.0.0.1, ::, ::1, ...) or localhost"
            .to_string()
    })
}

/// `RELAY_TRUSTED_PROXY`: IP addresses separated by commas. The error names
/// the bad entry only when there are several; `apply` quotes the whole value.
fn proxies(v: &str) -> Result<Vec<IpAddr>, String> {
    let entries: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let expected = "expected IP addresses separated by commas";
    entries
        .iter()
        .map(|s| {
            s.parse().map_err(|_| match entries.len() {
                1 => expected.to_string(),
                _ => format!("{expected}; '{s}' is not one"),
            })
        })
        .collect()
}

/// A positive number of seconds, fractions allowed, at most a year.
/// A setting's duration in milliseconds (settings are at most a year).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn seconds(v: &str) -> Result<Duration, String> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 31_536_000.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err("expected a number of seconds greater than 0".into()),
    }
}

/// `true`/`false`, also `1`/`0`.
fn boolean(v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err("expected true, false, 1 or 0".into()),
    }
}

/// A positive whole number.
fn count(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number greater than 0".into()),
    }
}

/// A number of bytes, with an optional `K`, `M` or `G` suffix (powers of
/// 1024), at least 1 MiB: a smaller budget would hold no session worth
/// having.
fn bytes(v: &str) -> Result<usize, String> {
    const WHAT: &str = "expected bytes with an optional K, M or G suffix, at least 1M";
    let v = v.trim();
    let (digits, shift) = match v.as_bytes().last() {
        Some(b'K' | b'k') => (&v[..v.len() - 1], 10),
        Some(b'M' | b'm') => (&v[..v.len() - 1], 20),
        Some(b'G' | b'g') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: usize = digits.parse().map_err(|_| WHAT.to_string())?;
    match n.checked_mul(1 << shift) {
        Some(b) if b >= 1 << 20 => Ok(b),
        _ => Err(WHAT.into()),
    }
}

fn token(v: &str) -> Result<Option<String>, String> {
    if v.is_empty() {
        Ok(None)
    } else if v.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(Some(v.to_string()))
    } else {
        Err("a token must be printable ASCII without spaces".into())
    }
}

fn origins(v: &str) -> Result<Origins, String> {
    let list: Vec<String> = v
        .split(',')
        .map(|s| s.trim().trim_end_matches('/').to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() {
        Err("expected * or a comma-separated list of origins".into())
    } else if list.iter().any(|o| o == "*") {
        Ok(Origins::Any)
    } else {
        Ok(Origins::List(list))
    }
}

/// `RELAY_PING_INTERVAL` -> `--ping-interval`.
fn flag_name(env: &str) -> String {
    format!(
        "--{}",
        env.trim_start_matches("RELAY_")
            .to_ascii_lowercase()
            .replace('_', "-")
    )
}

fn apply(cfg: &mut Config, name: &str, value: &str) -> Result<(), String> {
    let (_, _, set) = SETTINGS
        .iter()
        .find(|(env, _, _)| *env == name)
        .ok_or_else(|| format!("unknown setting {name}"))?;
    set(cfg, value).map_err(|why| {
        // A secret or token is never echoed, not even a wrong one.
        if name.ends_with("_SECRET") || name.ends_with("_TOKEN") {
            format!("invalid {name} ({}): {why}", flag_name(name))
        } else {
            format!("invalid {name} ({}): {why}: '{value}'", flag_name(name))
        }
    })
}

/// Builds the configuration from the environment and the arguments (without
/// the program name). Called once at start; flags win over the environment.
pub fn parse<E, A>(env: E, args: A) -> Result<Command, String>
where
    E: IntoIterator<Item = (String, String)>,
    A: IntoIterator<Item = String>,
{
    let mut cfg = Config::default();
    let env: Vec<(String, String)> = env.into_iter().collect();
    // `PORT` is the platform convention; `RELAY_PORT` wins over it.
    if let Some((_, v)) = env.iter().find(|(k, _)| k == "PORT") {
        apply(&mut cfg, "RELAY_PORT", v).map_err(|e| e.replace("RELAY_PORT", "PORT"))?;
    }
    for (name, _, _) in SETTINGS {
        if let Some((_, v)) = env.iter().find(|(k, _)| k == name) {
            apply(&mut cfg, name, v)?;
        }
    }
    let mut args = args.into_iter().peekable();
    if args.peek().is_some_and(|a| a == "help") {
        return Ok(Command::Help);
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            _ => {}
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let Some((name, _, _)) = SETTINGS.iter().find(|(env, _, _)| flag_name(env) == flag) else {
            return Err(match unknown::closest_flag(&flag) {
                Some(near) => {
                    format!("unknown argument '{arg}'; did you mean {near}? (see --help)")
                }
                None => format!("unknown argument '{arg}' (see --help)"),
            });
        };
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| format!("{flag} needs a value (see --help)"))?,
        };
        apply(&mut cfg, name, &value)?;
    }
    if cfg.data_dir.is_some() && cfg.redis.is_some() {
        return Err(
            "RELAY_DATA_DIR and RELAY_REDIS_URL cannot be used together: state lives in one of them"
                .into(),
        );
    }
    if cfg.redis.as_ref().is_some_and(|r| r.cluster.is_some())
        && cfg.redis_prefix.contains(['{', '}'])
    {
        // Each key's hash tag is the session's bucket (`{…}` after the
        // prefix); Redis would hash a brace of the prefix instead.
        return Err("RELAY_REDIS_PREFIX cannot hold { or } with redis-cluster://".into());
    }
    if let Some(e) = unknown::misspelled_security_setting(&env)
        .or_else(|| unknown::misspelled_storage_setting(&env))
    {
        return Err(e);
    }
    match &cfg.tls {
        Some(f) if f.cert.as_os_str().is_empty() && f.key.as_os_str().is_empty() => cfg.tls = None,
        Some(f) if f.cert.as_os_str().is_empty() => {
            return Err(
                "RELAY_TLS_KEY is set but RELAY_TLS_CERT (--tls-cert) is not: TLS needs both"
                    .into(),
            );
        }
        Some(f) if f.key.as_os_str().is_empty() => {
            return Err(
                "RELAY_TLS_CERT is set but RELAY_TLS_KEY (--tls-key) is not: TLS needs both".into(),
            );
        }
        _ => {}
    }
    if cfg.redis_replicas > 0 && cfg.redis.is_none() {
        return Err(
            "RELAY_REDIS_REPLICAS is set but RELAY_REDIS_URL is not: replicas are Redis's".into(),
        );
    }
    if cfg.redis_ca.is_some() && !cfg.redis.as_ref().is_some_and(|r| r.tls) {
        return Err("RELAY_REDIS_CA is set but RELAY_REDIS_URL is not a rediss:// URL".into());
    }
    Ok(Command::Run {
        cfg: Box::new(cfg),
        warnings: unknown_variables(&env),
    })
}

/// Whether `name` is one of the server's settings (`RELAY_PORT`), spelled
/// exactly.
pub fn is_setting(name: &str) -> bool {
    SETTINGS.iter().any(|(s, _, _)| *s == name)
}

/// The tools' variables set in `env` (see [`TOOL_VARIABLES`]): the server
/// reads none of them and says so at debug level only.
pub fn tool_variables_in(env: &[(String, String)]) -> Vec<&str> {
    env.iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| unknown::tool_variable(k))
        .collect()
}

/// Whether anyone who can reach the listen address may use every endpoint:
/// a non-loopback host and no token at all. Checked once at start, for the
/// warning `main` logs.
pub fn open_to_the_network(cfg: &Config) -> bool {
    !cfg.host.to_canonical().is_loopback()
        && cfg.client_token.is_none()
        && cfg.agent_token.is_none()
        && cfg.token_secret.is_none()
}

/// The `--help` text: every setting with its flag and meaning.
pub fn help() -> String {
    let mut out = format!(
        "relay {}: a relay between web clients and an AI agent\n\n\
         usage: relay [--flag value]...\n\n\
         Every setting is an environment variable and the same-named flag; flags win.\n\n",
        env!("CARGO_PKG_VERSION")
    );
    for (env, meaning, _) in SETTINGS {
        out.push_str(&format!(
            "  {:<26} {:<26} {}\n",
            flag_name(env),
            env,
            meaning
        ));
    }
    out.push_str("\n  -h, --help                 print this help\n  -V, --version              print the version\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(env: &[(&str, &str)], args: &[&str]) -> Result<Config, String> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        match parse(env, args.iter().map(|s| s.to_string()))? {
            Command::Run { cfg, .. } => Ok(*cfg),
            other => panic!("expected a config, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.port, 8000);
        assert_eq!(c.ping_interval, Duration::from_secs(30));
        assert_eq!(c.max_body_bytes, 1_048_576);
        assert_eq!(c.history_limit, 10_000);
        assert_eq!(c.cors_origins, Origins::Any);
        assert!(c.web);
        assert_eq!(c.max_memory, 256 << 20);
    }

    #[test]
    fn max_memory_takes_k_m_g_in_powers_of_1024_from_1m() {
        let m = |v: &str| run(&[("RELAY_MAX_MEMORY", v)], &[]).map(|c| c.max_memory);
        assert_eq!(m("1M").unwrap(), 1 << 20);
        assert_eq!(m("2048K").unwrap(), 2 << 20);
        assert_eq!(m("3G").unwrap(), 3 << 30);
        assert_eq!(m("1048576").unwrap(), 1 << 20);
        assert_eq!(m(" 64m ").unwrap(), 64 << 20);
        for bad in [
            "1023K",
            "0",
            "",
            "M",
            "1.5M",
            "-1M",
            "1T",
            "99999999999999999999G",
        ] {
            let e = m(bad).unwrap_err();
            assert!(
                e.contains("RELAY_MAX_MEMORY") && e.contains("at least 1M"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_session_ttl_of_0_keeps_sessions_forever() {
        assert_eq!(
            run(&[("RELAY_SESSION_TTL", "0")], &[]).unwrap().session_ttl,
            None
        );
        let limits = run(&[], &["--session-ttl", "0"]).unwrap().relay_limits();
        assert_eq!(limits.session_ttl_ms, NEVER);
        let c = run(&[("RELAY_SESSION_TTL", "1.5")], &[]).unwrap();
        assert_eq!(c.session_ttl, Some(Duration::from_millis(1500)));
        let e = run(&[("RELAY_SESSION_TTL", "-1")], &[]).unwrap_err();
        assert!(e.contains("0 for never"), "{e}");
    }

    #[test]
    fn web_takes_true_false_1_0() {
        assert!(!run(&[("RELAY_WEB", "false")], &[]).unwrap().web);
        assert!(!run(&[], &["--web", "0"]).unwrap().web);
        assert!(run(&[("RELAY_WEB", "0")], &["--web=1"]).unwrap().web);
        assert!(run(&[("RELAY_WEB", "true")], &[]).unwrap().web);
        let e = run(&[("RELAY_WEB", "yes")], &[]).unwrap_err();
        assert!(e.contains("RELAY_WEB") && e.contains("--web"), "{e}");
    }

    #[test]
    fn flags_win_over_environment() {
        let c = run(
            &[("RELAY_PORT", "9000"), ("PORT", "7000")],
            &["--port", "9100"],
        )
        .unwrap();
        assert_eq!(c.port, 9100);
        let c = run(&[("RELAY_PORT", "9000"), ("PORT", "7000")], &[]).unwrap();
        assert_eq!(c.port, 9000);
        let c = run(&[("PORT", "7000")], &["--ping-interval=0.25"]).unwrap();
        assert_eq!(
            (c.port, c.ping_interval),
            (7000, Duration::from_millis(250))
        );
    }

    #[test]
    fn tls_needs_both_files_and_redis_ca_needs_rediss() {
        let c = run(&[("RELAY_TLS_CERT", "c.pem")], &["--tls-key", "k.pem"]).unwrap();
        let files = c.tls.unwrap();
        assert_eq!(
            (files.cert.to_str(), files.key.to_str()),
            (Some("c.pem"), Some("k.pem"))
        );
        let e = run(&[("RELAY_TLS_CERT", "c.pem")], &[]).unwrap_err();
        assert!(e.contains("RELAY_TLS_KEY"), "{e}");
        let e = run(&[], &["--tls-key=k.pem"]).unwrap_err();
        assert!(e.contains("RELAY_TLS_CERT"), "{e}");
        assert!(
            run(&[("RELAY_TLS_CERT", ""), ("RELAY_TLS_KEY", "")], &[])
                .unwrap()
                .tls
                .is_none()
        );
        let e = run(&[("RELAY_REDIS_CA", "ca.pem")], &[]).unwrap_err();
        assert!(e.contains("rediss://"), "{e}");
        let c = run(
            &[
                ("RELAY_REDIS_URL", "rediss://r"),
                ("RELAY_REDIS_CA", "ca.pem"),
            ],
            &[],
        )
        .unwrap();
        assert!(c.redis.is_some_and(|r| r.tls) && c.redis_ca.is_some());
    }

    #[test]
    fn invalid_values_name_the_setting() {
        let e = run(&[("RELAY_PING_INTERVAL", "-1")], &[]).unwrap_err();
        assert!(e.contains("RELAY_PING_INTERVAL"), "{e}");
        let e = run(&[], &["--max-body", "lots"]).unwrap_err();
        assert!(
            e.contains("RELAY_MAX_BODY") && e.contains("--max-body"),
            "{e}"
        );
        let e = run(&[], &["--nope"]).unwrap_err();
        assert!(e.contains("--nope"), "{e}");
    }

    #[test]
    fn a_short_token_secret_is_refused_without_echoing_it() {
        let e = run(&[("RELAY_TOKEN_SECRET", "short-secret")], &[]).unwrap_err();
        assert!(
            e.contains("RELAY_TOKEN_SECRET") && e.contains("--token-secret"),
            "{e}"
        );
        assert!(e.contains("32 bytes") && !e.contains("short-secret"), "{e}");
        let long = "s".repeat(32);
        let c = run(&[], &["--token-secret", &long]).unwrap();
        assert!(c.token_secret.is_some());
        assert!(!open_to_the_network(&c));
        assert!(!format!("{c:?}").contains(&long), "Debug hides the secret");
    }

    #[test]
    fn host_accepts_addresses_and_localhost_and_says_what_it_accepts() {
        let c = run(&[("RELAY_HOST", "localhost")], &[]).unwrap();
        assert_eq!(c.host, IpAddr::from([127, 0, 0, 1]));
        let c = run(&[("RELAY_HOST", "::1")], &[]).unwrap();
        assert!(c.host.is_loopback() && c.host.is_ipv6());
        let e = run(&[("RELAY_HOST", "example.com")], &[]).unwrap_err();
        assert!(
            e.contains("IPv4 or IPv6 address") && e.contains("localhost"),
            "{e}"
        );
    }

    #[test]
    fn trusted_proxy_error_quotes_its_value_once() {
        let e = run(&[("RELAY_TRUSTED_PROXY", "bogus")], &[]).unwrap_err();
        assert_eq!(e.matches("bogus").count(), 1, "{e}");
        let e = run(&[("RELAY_TRUSTED_PROXY", "10.0.0.1,bogus")], &[]).unwrap_err();
        assert_eq!(e.matches("10.0.0.1").count(), 1, "{e}");
        assert!(e.contains("'bogus' is not one"), "{e}");
        let c = run(&[("RELAY_TRUSTED_PROXY", "10.0.0.1, ::1")], &[]).unwrap();
        assert_eq!(c.trusted_proxies.len(), 2);
    }

    #[test]
    fn open_to_the_network_means_not_loopback_and_no_token() {
        let open = |env: &[(&str, &str)]| open_to_the_network(&run(env, &[]).unwrap());
        assert!(open(&[]));
        assert!(open(&[("RELAY_HOST", "::")]));
        assert!(!open(&[("RELAY_HOST", "127.0.0.1")]));
        assert!(!open(&[("RELAY_HOST", "::ffff:127.0.0.1")]));
        assert!(!open(&[("RELAY_AGENT_TOKEN", "a")]));
        assert!(!open(&[("RELAY_CLIENT_TOKEN", "c")]));
    }

    #[test]
    fn origins_parse_to_a_list_or_any() {
        let c = run(
            &[(
                "RELAY_CORS_ORIGINS",
                "https://a.example, https://b.example/",
            )],
            &[],
        )
        .unwrap();
        assert!(c.cors_origins.allows("https://b.example"));
        assert!(!c.cors_origins.allows("https://c.example"));
    }
}
