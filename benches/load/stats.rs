//! Measurement helpers: a log-linear latency histogram (relative error below
//! 1/128, fixed 58 KiB), process CPU and RSS from /proc, the result line, and
//! raising RLIMIT_NOFILE.

use std::fmt::Write as _;
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB: u64 = 128;
const SUB_BITS: u32 = 7;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// Latency histogram over nanoseconds.
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max_ns: u64,
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max_ns: 0,
        }
    }

    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.total += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// The latency at quantile `q` (0..=1) in microseconds: the upper bound of
    /// the bucket holding it, never above the maximum seen.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return upper_bound(index).min(self.max_ns) as f64 / 1000.0;
            }
        }
        self.max_ns as f64 / 1000.0
    }

    pub fn max_us(&self) -> f64 {
        self.max_ns as f64 / 1000.0
    }
}

fn bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let msb = 63 - ns.leading_zeros();
    let mantissa = ns >> (msb - SUB_BITS);
    ((msb - SUB_BITS + 1) as u64 * SUB + (mantissa - SUB)) as usize
}

fn upper_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let group = index / SUB;
    let mantissa = index % SUB + SUB;
    ((mantissa + 1) << (group - 1)).saturating_sub(1)
}

unsafe extern "C" {
    fn sysconf(name: i32) -> i64;
    fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
    fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
}

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}

const SC_CLK_TCK: i32 = 2;
const RLIMIT_NOFILE: i32 = 7;

/// Raises the soft open-file limit to the hard one; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut rl = RLimit { cur: 0, max: 0 };
    // SAFETY: plain libc calls with a correctly laid out `struct rlimit` (Linux, 64-bit).
    unsafe {
        if getrlimit(RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        rl.cur = rl.max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &mut rl);
    }
    rl.cur
}

/// User + system CPU seconds of a process (`self` or a pid), from /proc.
pub fn cpu_secs(pid: &str) -> Option<f64> {
    cpu_split(pid).map(|(user, sys)| user + sys)
}

/// User and system (kernel) CPU seconds of a process.
/// User and system CPU seconds of a process, or summed over a
/// comma-separated list of processes (two relay instances).
pub fn cpu_split(pids: &str) -> Option<(f64, f64)> {
    let mut sum = (0.0, 0.0);
    for pid in pids.split(',') {
        let (u, s) = cpu_split_one(pid)?;
        sum = (sum.0 + u, sum.1 + s);
    }
    Some(sum)
}

fn cpu_split_one(pid: &str) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is field 3; utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let sys: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_sec = unsafe { sysconf(SC_CLK_TCK) }.max(1) as f64;
    Some((user as f64 / per_sec, sys as f64 / per_sec))
}

/// Resident set size of a process in bytes (VmRSS).
pub fn rss_bytes(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU of both sides over a measured window.
pub struct CpuWindow {
    server_pid: Option<String>,
    server_start: Option<(f64, f64)>,
    gen_start: f64,
    /// Redis behind the relays (`--redis-pid`): measured apart.
    redis_start: Option<(String, f64)>,
}

/// `--redis-pid`, set once by `main`.
pub static REDIS_PID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// CPU seconds used by both sides in a window.
pub struct CpuUse {
    pub server_s: Option<f64>,
    /// The part of `server_s` spent in the kernel (system time).
    pub server_sys_s: Option<f64>,
    pub generator_s: f64,
    /// Redis's CPU seconds, with `--redis-pid`.
    pub redis_s: Option<f64>,
}

impl CpuWindow {
    pub fn start(server_pid: Option<&str>) -> CpuWindow {
        CpuWindow {
            server_pid: server_pid.map(str::to_owned),
            server_start: server_pid.and_then(cpu_split),
            gen_start: cpu_secs("self").unwrap_or(0.0),
            redis_start: REDIS_PID
                .get()
                .and_then(|p| cpu_split(p).map(|(u, s)| (p.clone(), u + s))),
        }
    }

    pub fn stop(&self) -> CpuUse {
        let server = match (&self.server_pid, self.server_start) {
            (Some(pid), Some((user0, sys0))) => {
                cpu_split(pid).map(|(user, sys)| (user - user0, sys - sys0))
            }
            _ => None,
        };
        CpuUse {
            server_s: server.map(|(user, sys)| user + sys),
            server_sys_s: server.map(|(_, sys)| sys),
            generator_s: cpu_secs("self").unwrap_or(0.0) - self.gen_start,
            redis_s: self
                .redis_start
                .as_ref()
                .and_then(|(p, t0)| cpu_split(p).map(|(u, s)| u + s - t0)),
        }
    }
}

/// One `RESULT key=value …` line, the format run.sh aggregates.
pub struct ResultLine(String);

impl ResultLine {
    pub fn new(figure: &str, target: &str) -> ResultLine {
        ResultLine(format!("RESULT figure={figure} target={target}"))
    }

    pub fn num(&mut self, key: &str, value: f64) -> &mut Self {
        let _ = if value.fract() == 0.0 && value.abs() < 1e15 {
            write!(self.0, " {key}={value:.0}")
        } else {
            write!(self.0, " {key}={value:.2}")
        };
        self
    }

    /// What a run of operations timed one by one reports: how long it was
    /// measured, how many were done in that window and at what rate, their
    /// latency and the CPU both sides spent.
    pub fn window(&mut self, secs: f64, ops: f64, h: &Histogram, cpu: &CpuUse) -> &mut Self {
        self.num("secs", secs)
            .num("ops", ops)
            .num("ops_per_s", ops / secs)
            .latency(h)
            .cpu(cpu, secs, ops)
    }

    /// Latency percentiles p50, p99, p99.9 and max in microseconds.
    pub fn latency(&mut self, h: &Histogram) -> &mut Self {
        self.num("p50_us", h.quantile_us(0.5))
            .num("p99_us", h.quantile_us(0.99))
            .num("p999_us", h.quantile_us(0.999))
            .num("max_us", h.max_us())
    }

    /// Both sides' CPU as a percentage of one core over `secs`, and the
    /// server's CPU microseconds per operation, with the kernel's part of them
    /// (the floor no change in the server's own code can go below).
    pub fn cpu(&mut self, cpu: &CpuUse, secs: f64, ops: f64) -> &mut Self {
        if let Some(server) = cpu.server_s {
            self.num("server_cpu_pct", 100.0 * server / secs);
            if ops > 0.0 {
                self.num("server_us_per_op", 1e6 * server / ops);
                if let Some(sys) = cpu.server_sys_s {
                    self.num("server_kernel_us_per_op", 1e6 * sys / ops);
                }
            }
        }
        if let Some(redis) = cpu.redis_s {
            self.num("redis_cpu_pct", 100.0 * redis / secs);
            if ops > 0.0 {
                self.num("redis_us_per_op", 1e6 * redis / ops);
            }
        }
        self.num("gen_cpu_pct", 100.0 * cpu.generator_s / secs)
    }

    pub fn print(&self) {
        println!("{}", self.0);
    }
}
