//! A `redis-server` of one test alone (Debian's, installed by
//! `scripts/install-test-deps.sh`): its own port and directory, killed and
//! its directory removed on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Server, Ws, unique_session};

const BIN: &str = "/usr/bin/redis-server";

/// Settings every test Redis gets unless it asks for persistence: no
/// snapshot, no append-only file.
const EPHEMERAL: [&str; 4] = ["--save", "", "--appendonly", "no"];

pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl Redis {
    /// No persistence: what most tests need.
    #[track_caller]
    pub fn start() -> Redis {
        Redis::start_with(&EPHEMERAL)
    }

    /// `appendonly yes` with `appendfsync always`: what a deployment that
    /// must not lose an acknowledged message runs.
    #[track_caller]
    pub fn start_durable() -> Redis {
        Redis::start_with(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
    }

    /// A replica of `master`, without persistence, on a free port.
    #[track_caller]
    pub fn replica_of(master: &Redis) -> Redis {
        let port = master.port.to_string();
        let mut args = EPHEMERAL.to_vec();
        args.extend(["--replicaof", "127.0.0.1", &port]);
        Redis::start_with(&args)
    }

    /// A Redis with these arguments on a free port.
    #[track_caller]
    pub fn start_with(args: &[&str]) -> Redis {
        let mut redis = Redis::unstarted(free_port(), args);
        // A port found free may be taken by another test before Redis
        // binds it: then Redis exits at once, and another port is tried.
        for _ in 0..3 {
            if redis.try_run() {
                return redis;
            }
            redis.port = free_port();
        }
        redis.run();
        redis
    }

    /// An ephemeral Redis (with `args` besides) on `port`, which the test
    /// chose earlier (a relay already points at it).
    #[track_caller]
    pub fn start_on(port: u16, args: &[&str]) -> Redis {
        let mut all = args.to_vec();
        all.extend(EPHEMERAL);
        let mut redis = Redis::unstarted(port, &all);
        redis.run();
        redis
    }

    /// An ephemeral Redis on `port`, not running until [`run`](Self::run).
    pub fn unstarted(port: u16, args: &[&str]) -> Redis {
        let dir = std::env::temp_dir().join(format!(
            "relay-redis-{}-{}",
            std::process::id(),
            unique_session()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("redis dir");
        Redis {
            child: None,
            port,
            dir,
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Starts (or starts again) the server on the same port and directory,
    /// and returns once it answers `PING` (it answers `-LOADING` while it
    /// reads its append-only file back).
    #[track_caller]
    pub fn run(&mut self) {
        assert!(self.try_run(), "redis-server did not start");
    }

    /// [`run`](Self::run), false if Redis exited or did not answer.
    pub fn try_run(&mut self) -> bool {
        assert!(
            std::path::Path::new(BIN).exists(),
            "{BIN} is missing: run scripts/test, which installs it"
        );
        let child = Command::new(BIN)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pong() {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                self.kill9();
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Whether the server answers `PING` (with the password, if any).
    fn pong(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let auth = self
            .password()
            .map_or(String::new(), |pw| format!("AUTH {pw}\r\n"));
        if s.write_all(format!("{auth}PING\r\n").as_bytes()).is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        let want: &[u8] = if auth.is_empty() {
            b"+PONG"
        } else {
            b"+OK\r\n+PONG"
        };
        let mut got = Vec::new();
        while got.len() < want.len() {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        got.starts_with(want)
    }

    fn password(&self) -> Option<&str> {
        let i = self.args.iter().position(|a| a == "--requirepass")?;
        self.args.get(i + 1).map(String::as_str)
    }

    /// One `redis-cli` command (with `AUTH` when `--requirepass` is set);
    /// its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]);
        if let Some(pw) = self.password() {
            cmd.args(["--no-auth-warning", "-a", pw]);
        }
        let out = cmd.args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[track_caller]
    pub fn config_set(&self, key: &str, value: &str) {
        let out = self.cli(&["config", "set", key, value]);
        assert!(out.contains("OK"), "CONFIG SET {key} {value}: {out}");
    }

    /// How many times Redis ran `command` (`INFO commandstats`).
    pub fn commands(&self, command: &str) -> u64 {
        let text = self.cli(&["info", "commandstats"]);
        let key = format!("cmdstat_{command}:calls=");
        text.split(&key)
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    #[track_caller]
    pub fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{name} {pid}");
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `n` relays on this Redis sharing a key prefix of their own, with
    /// `env` besides.
    #[track_caller]
    pub fn relays(&self, n: usize, env: &[(&str, &str)]) -> Vec<Server> {
        let prefix = format!("{}:", unique_session());
        let url = self.url();
        let mut env = env.to_vec();
        env.push(("RELAY_REDIS_URL", url.as_str()));
        env.push(("RELAY_REDIS_PREFIX", prefix.as_str()));
        (0..n).map(|_| Server::start_with(&env)).collect()
    }

    /// Its URL; with a `redis-cluster://` `TEST_WITH_REDIS`, as a cluster's
    /// seed, so that the relays lay their keys out in buckets on it.
    pub fn url(&self) -> String {
        let scheme = match super::cluster_mode() {
            true => "redis-cluster",
            false => "redis",
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped server must run again to die.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Creates session `sid` through the first of `servers` and opens a
/// subscriber of it from the start on each; the session's epoch and the
/// subscribers.
#[track_caller]
pub fn subscribed_on_each(servers: &[Server], sid: &str) -> (String, Vec<Ws>) {
    let epoch = servers[0].put(&format!("/sessions/{sid}")).json()["epoch"]
        .as_str()
        .expect("an epoch")
        .to_string();
    let subscribers = servers
        .iter()
        .map(|s| s.ws(&format!("/ws/{sid}?after=0&epoch={epoch}")))
        .collect();
    (epoch, subscribers)
}
