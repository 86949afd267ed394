//! Load generator for the relay's real paths, and for nginx + nchan mapped onto
//! the same paths (benches/load/nchan). One thread, one mio poll, hand-rolled
//! HTTP/1.1 keep-alive and WebSocket clients; run it on its own core.
//!
//! ```text
//! load roundtrip --sessions S [--agent own|external] [common]
//! load fanout    --subscribers N --rate R|max [--window W] [--publishers P] [common]
//! load catchup   --subscribers N --answers M [--publishers P] [common]   (relay only)
//! load idle      --connections N --kind ws|poll|sessions [--sessions existing|new] [--hold SECS] [common]
//! load ingest    --rate R [--connections C] [common]   (prompts at R/s, open loop)
//! load handshake [--connections C] [common]   (TLS: new connections, one request each)
//! load stream    --subscribers N [--window W] [common]   (relay only: one agent streams parts)
//! load wake      --sessions S --lanes C --agent own|every [common]   (relay only: an agent
//!                woken by prompts spread over S sessions, per-session polls or one for all)
//! load partcost  --subscribers N --posts M [--publishers P] [--window W] [common]
//!                (relay only: CPU per part, per answer, per prompt)
//! common: --target relay|base|nchan --addr HOST:PORT [--server-pid PID[,PID]] [--seconds T]
//!   [--redis-pid PID] (Redis's CPU apart) [--addr2 HOST:PORT] (fan-out: half the subscribers there)
//!         [--warmup SECS] [--size BYTES] [--figure NAME]
//!         [--ca FILE] (TLS to the server, trusting FILE; see `net::tls_config`)
//! ```
//!
//! `base` is a second relay binary measured beside `relay` (a before/after
//! comparison): the same protocol, its own name in the result line.
//!
//! Each run prints one `RESULT figure=… target=… key=value …` line on stdout
//! (benches/load/run.sh turns repeated runs into a table of medians) and its
//! first errors on stderr. With `--server-pid` the server's CPU over the
//! measured window is read from /proc (utime + stime), the generator's own
//! from /proc/self/stat.

mod catchup;
mod fanout;
mod handshake;
mod idle;
mod ingest;
mod net;
mod partcost;
mod roundtrip;
mod stats;
mod stream;
mod target;
mod wake;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use target::Target;

/// Settings every figure takes.
pub struct Common {
    /// The protocol spoken.
    pub target: Target,
    /// The `--target` name, for the result line.
    pub name: String,
    pub addr: SocketAddr,
    /// A second instance (`--addr2`): fan-out puts every other subscriber
    /// there.
    pub addr2: Option<SocketAddr>,
    pub host: String,
    pub server_pid: Option<String>,
    pub duration: Duration,
    pub warmup: Duration,
    /// Bytes of each prompt and response text.
    pub size: usize,
    pub figure: String,
}

impl Common {
    /// A tag that keeps this run's session ids apart from earlier runs'.
    pub fn run_tag(&self) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{}x{nanos}", std::process::id())
    }
}

/// Errors seen during a run: counted, the first few kept for the report.
#[derive(Default)]
pub struct Errors {
    pub count: u64,
    first: Vec<String>,
}

impl Errors {
    const KEEP: usize = 5;

    pub fn add(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < Self::KEEP {
            self.first.push(what);
        }
    }

    pub fn summary(&self) -> String {
        format!("{} errors: {}", self.count, self.first.join("; "))
    }

    /// Prints the first errors on stderr, if any.
    pub fn report(&self) {
        if self.count > 0 {
            eprintln!("{}", self.summary());
        }
    }
}

struct Args(HashMap<String, String>);

impl Args {
    fn parse(words: &[String]) -> Result<Args, String> {
        let mut map = HashMap::new();
        let mut it = words.iter();
        while let Some(key) = it.next() {
            let name = key
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {key}"))?;
            let value = it.next().ok_or_else(|| format!("{key} needs a value"))?;
            map.insert(name.to_owned(), value.clone());
        }
        Ok(Args(map))
    }

    fn get<T: std::str::FromStr>(&self, key: &str, default: Option<T>) -> Result<T, String> {
        match self.0.get(key) {
            Some(v) => v.parse().map_err(|_| format!("--{key}: bad value {v}")),
            None => default.ok_or_else(|| format!("--{key} is required")),
        }
    }

    fn common(&self, figure: String) -> Result<Common, String> {
        if let Some(pid) = self.0.get("redis-pid") {
            let _ = crate::stats::REDIS_PID.set(pid.clone());
        }
        if let Some(ca) = self.0.get("ca") {
            let _ = net::TLS.set(net::tls_config(std::path::Path::new(ca))?);
        }
        let name = self.0.get("target").map(String::as_str).unwrap_or("relay");
        let target =
            Target::parse(name).ok_or("--target must be relay, base, nginx-static or nchan")?;
        let addr: SocketAddr = self.get("addr", Some("127.0.0.1:8000".parse().map_err(|_| "")?))?;
        Ok(Common {
            target,
            name: name.to_owned(),
            addr,
            addr2: match self.0.get("addr2") {
                Some(a) => Some(a.parse().map_err(|_| format!("--addr2: bad value {a}"))?),
                None => None,
            },
            host: addr.to_string(),
            server_pid: self.0.get("server-pid").cloned(),
            duration: Duration::from_secs_f64(self.get("seconds", Some(5.0))?),
            warmup: Duration::from_secs_f64(self.get("warmup", Some(1.0))?),
            size: self.get("size", Some(256))?,
            figure: self.0.get("figure").cloned().unwrap_or(figure),
        })
    }
}

fn run(words: &[String]) -> Result<(), String> {
    let Some((mode, rest)) = words.split_first() else {
        // `cargo bench` and `cargo test --all-targets` run every bench binary
        // without arguments: nothing to measure, say how to use it.
        println!(
            "usage: load MODE [--key value …], MODE roundtrip|fanout|catchup|idle|ingest|handshake|stream|partcost|wake"
        );
        println!("(see benches/load/main.rs and benches/load/run.sh)");
        return Ok(());
    };
    let args = Args::parse(rest)?;
    stats::raise_nofile();
    match mode.as_str() {
        "roundtrip" => {
            let sessions: usize = args.get("sessions", Some(1))?;
            let agent: String = args.get("agent", Some("own".to_owned()))?;
            if agent != "own" && agent != "external" {
                return Err("--agent must be own or external".into());
            }
            let figure = match agent.as_str() {
                "own" => format!("roundtrip/S={sessions}"),
                _ => format!("roundtrip/external/S={sessions}"),
            };
            roundtrip::run(&args.common(figure)?, sessions, agent == "own")
        }
        "fanout" => fanout_mode(&args),
        "catchup" => {
            let subscribers: usize = args.get("subscribers", Some(1000))?;
            let answers: u64 = args.get("answers", Some(10_000))?;
            let publishers: usize = args.get("publishers", Some(4))?;
            let figure = format!("catchup/N={subscribers}/M={answers}");
            catchup::run(
                &args.common(figure)?,
                subscribers,
                answers,
                publishers.max(1),
            )
        }
        "idle" => {
            let connections: usize = args.get("connections", Some(1000))?;
            let kind_arg: String = args.get("kind", Some("ws".to_owned()))?;
            if kind_arg == "sessions" {
                let figure = format!("idle/sessions/N={connections}");
                return idle::sessions_only(&args.common(figure)?, connections);
            }
            let kind = idle::Kind::parse(&kind_arg).ok_or("--kind must be ws, poll or sessions")?;
            let sessions_arg: String = args.get("sessions", Some("existing".to_owned()))?;
            let sessions =
                idle::Sessions::parse(&sessions_arg).ok_or("--sessions must be existing or new")?;
            let hold = Duration::from_secs_f64(args.get("hold", Some(3.0))?);
            let figure = match sessions {
                idle::Sessions::Existing => format!("idle/{kind_arg}/N={connections}"),
                idle::Sessions::New => format!("idle/{kind_arg}/N={connections}/new-sessions"),
            };
            idle::run(&args.common(figure)?, connections, kind, sessions, hold)
        }
        "ingest" => {
            let rate: f64 = args.get("rate", None)?;
            let connections: usize = args.get("connections", Some(64))?;
            ingest::run(
                &args.common(format!("ingest/rate={rate}"))?,
                rate,
                connections,
            )
        }
        "handshake" => {
            let connections: usize = args.get("connections", Some(8))?;
            handshake::run(&args.common("handshake".to_owned())?, connections)
        }
        "stream" => {
            let subscribers: usize = args.get("subscribers", Some(1000))?;
            let window: u64 = args.get("window", Some(4))?;
            let figure = format!("stream/N={subscribers}/window={window}");
            stream::run(&args.common(figure)?, subscribers, window)
        }
        "partcost" => {
            let subscribers: usize = args.get("subscribers", Some(1))?;
            let posts: u64 = args.get("posts", Some(60_000))?;
            let publishers: usize = args.get("publishers", Some(8))?;
            let window: u64 = args.get("window", Some(16))?;
            let figure = format!("partcost/N={subscribers}/M={posts}");
            partcost::run(
                &args.common(figure)?,
                subscribers,
                posts,
                publishers,
                window,
            )
        }
        "wake" => {
            let sessions: usize = args.get("sessions", Some(10_000))?;
            let lanes: usize = args.get("lanes", Some(16))?;
            let agent_arg: String = args.get("agent", Some("every".to_owned()))?;
            let agent = wake::Agent::parse(&agent_arg).ok_or("--agent must be own or every")?;
            let figure = format!("wake/{agent_arg}/S={sessions}/C={lanes}");
            wake::run(&args.common(figure)?, sessions, lanes.max(1), agent)
        }
        other => Err(format!(
            "unknown mode {other}: roundtrip, fanout, catchup, idle, ingest, handshake, stream, partcost or wake"
        )),
    }
}

fn fanout_mode(args: &Args) -> Result<(), String> {
    let subscribers: usize = args.get("subscribers", Some(1000))?;
    let rate_arg: String = args.get("rate", Some("max".to_owned()))?;
    let (rate, publishers) = if rate_arg == "max" {
        let window: u64 = args.get("window", Some(4))?;
        (
            fanout::Rate::Max { window },
            args.get("publishers", Some(window.min(4) as usize))?,
        )
    } else {
        let r: f64 = rate_arg
            .parse()
            .map_err(|_| "--rate must be a number or max")?;
        (fanout::Rate::Fixed(r), args.get("publishers", Some(8))?)
    };
    let figure = format!("fanout/N={subscribers}/rate={rate_arg}");
    fanout::run(&args.common(figure)?, subscribers, rate, publishers.max(1))
}

fn main() -> ExitCode {
    // cargo passes --bench to every bench binary; it means nothing here.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|w| w != "--bench")
        .collect();
    match run(&words) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e}");
            ExitCode::FAILURE
        }
    }
}
