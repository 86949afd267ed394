//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the
//! server's counters. The shell counts what only it sees (requests by route
//! and status, frames queued, accepted connections, loop turn durations);
//! the relay counts what it stores; [`render`] writes a snapshot of both.
//! Pure: no clock, no sockets. Every label set is bounded (routes and
//! statuses are fixed sets), so the map of request counters is too.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::histogram::{BOUNDS, Histogram};
use crate::http::Method;
use crate::relay::{Counts, Stats};
use crate::store::seam::StoreStats;

/// `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the shell counts.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Answers by route (its index in [`ROUTES`], which keeps the labels'
    /// order) and status.
    requests: BTreeMap<(u8, u16), u64>,
    /// WebSocket message frames queued on subscribers (live and refilled).
    pub frames_sent: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// How long each loop turn took, from the wake-up to the next sleep.
    pub turns: Histogram,
}

impl Metrics {
    /// Counts one answer.
    pub fn request(&mut self, method: Method, path: &str, status: u16) {
        *self
            .requests
            .entry((route_index(method, path), status))
            .or_insert(0) += 1;
    }
}

/// The route labels, a fixed set whatever the path (session ids are not
/// labels), in the order the exposition lists them.
const ROUTES: [&str; 18] = [
    "ask",
    "asks",
    "cancel",
    "healthz",
    "messages",
    "metrics",
    "other",
    "page",
    "preflight",
    "prompt",
    "prompts",
    "readyz",
    "reply",
    "response",
    "session_delete",
    "session_put",
    "sessions",
    "ws",
];

/// The route a request was for, as an index into [`ROUTES`]: counting an
/// answer compares small numbers, not text.
fn route_index(method: Method, path: &str) -> u8 {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match (method, first) {
        (Method::Options, _) => 8,
        // The page and the files that install it.
        (_, "") => 7,
        _ if crate::http::route::web_file(path).is_some() => 7,
        (_, "prompt") => 9,
        (_, "cancel") => 2,
        (_, "response") => 13,
        (_, "prompts") => 10,
        (_, "ws") => 17,
        (_, "messages") => 4,
        (Method::Put, "sessions") => 15,
        (Method::Delete, "sessions") => 14,
        (_, "sessions") => 16,
        (_, "healthz") => 3,
        (_, "readyz") => 11,
        (_, "metrics") => 5,
        (_, "ask") => 0,
        (_, "asks") => 1,
        (_, "reply") => 12,
        _ => 6,
    }
}

/// The route a request was for, as a label.
pub fn route_label(method: Method, path: &str) -> &'static str {
    ROUTES[usize::from(route_index(method, path))]
}

/// Everything one scrape reports.
pub struct Snapshot<'a> {
    pub shell: &'a Metrics,
    /// The storage thread's totals, with persistence.
    pub store: Option<&'a StoreStats>,
    pub stats: Stats,
    pub counts: Counts,
    pub connections: usize,
    /// Bytes queued in the server for all connections.
    pub bytes_queued: usize,
    /// Debug builds: the logs' kept count and a recount (the tests
    /// compare them).
    pub memory_recount: Option<(usize, usize)>,
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn single(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The exposition text.
pub fn render(s: &Snapshot) -> Vec<u8> {
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "relay_requests_total",
        "counter",
        "HTTP answers by route and status.",
    );
    for (&(route, status), n) in &s.shell.requests {
        let route = ROUTES[usize::from(route)];
        let _ = writeln!(
            out,
            "relay_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
        );
    }
    let st = s.stats;
    single(
        &mut out,
        "relay_prompts_stored_total",
        "counter",
        "Prompts stored.",
        st.prompts_stored,
    );
    single(
        &mut out,
        "relay_responses_stored_total",
        "counter",
        "Assistant messages stored.",
        st.responses_stored,
    );
    family(
        &mut out,
        "relay_duplicates_total",
        "counter",
        "Resent messages answered as duplicates, by kind.",
    );
    let _ = writeln!(
        out,
        "relay_duplicates_total{{kind=\"prompt\"}} {}",
        st.prompt_duplicates
    );
    let _ = writeln!(
        out,
        "relay_duplicates_total{{kind=\"response\"}} {}",
        st.response_duplicates
    );
    single(
        &mut out,
        "relay_frames_sent_total",
        "counter",
        "WebSocket message frames queued on subscribers.",
        s.shell.frames_sent,
    );
    single(
        &mut out,
        "relay_resyncs_total",
        "counter",
        "resync frames sent to subscribers.",
        st.resyncs,
    );
    single(
        &mut out,
        "relay_connections_accepted_total",
        "counter",
        "Connections accepted.",
        s.shell.accepted,
    );
    let c = s.counts;
    single(
        &mut out,
        "relay_connections",
        "gauge",
        "Open connections.",
        s.connections as u64,
    );
    single(
        &mut out,
        "relay_subscribers",
        "gauge",
        "WebSocket subscribers.",
        c.subscribers as u64,
    );
    single(
        &mut out,
        "relay_parked_polls",
        "gauge",
        "Parked long-polls.",
        c.parked_polls as u64,
    );
    single(
        &mut out,
        "relay_sessions",
        "gauge",
        "Sessions stored (in memory, and with a data directory on disk only).",
        c.sessions as u64,
    );
    single(
        &mut out,
        "relay_memory_bytes",
        "gauge",
        "Bytes held for sessions (logs, ids, drafts, queued output), as counted.",
        c.memory_bytes as u64,
    );
    single(
        &mut out,
        "relay_memory_budget_bytes",
        "gauge",
        "The memory budget (RELAY_MAX_MEMORY).",
        c.memory_budget as u64,
    );
    single(
        &mut out,
        "relay_sessions_resident",
        "gauge",
        "Sessions held in memory.",
        c.resident as u64,
    );
    single(
        &mut out,
        "relay_session_loads_total",
        "counter",
        "Sessions read back into memory from the storage.",
        s.stats.session_loads,
    );
    single(
        &mut out,
        "relay_session_evictions_total",
        "counter",
        "Sessions dropped from memory to keep the budget (read back on their next use).",
        s.stats.session_evictions,
    );
    if let Some((kept, walked)) = s.memory_recount {
        let help = "Debug builds: the logs' part of relay_memory_bytes (with the sessions known by id only), kept and recounted.";
        family(&mut out, "relay_memory_logs_bytes", "gauge", help);
        let _ = writeln!(out, "relay_memory_logs_bytes{{count=\"kept\"}} {kept}");
        let _ = writeln!(out, "relay_memory_logs_bytes{{count=\"walked\"}} {walked}");
    }
    single(
        &mut out,
        "relay_bytes_queued",
        "gauge",
        "Bytes queued in the server for all connections.",
        s.bytes_queued as u64,
    );
    histogram(
        &mut out,
        "relay_loop_turn_seconds",
        "Time from a loop wake-up to the next sleep.",
        &s.shell.turns,
    );
    if let Some(st) = s.store {
        single(
            &mut out,
            "relay_storage_commits_total",
            "counter",
            "Transactions the storage thread ran (group commits).",
            st.commits,
        );
        single(
            &mut out,
            "relay_storage_commands_total",
            "counter",
            "Writes those transactions carried (divided by the commits: the batch size).",
            st.commands,
        );
        single(
            &mut out,
            "relay_storage_errors_total",
            "counter",
            "Transactions that failed and rolled back (their writes got 503).",
            st.errors,
        );
        histogram(
            &mut out,
            "relay_storage_commit_seconds",
            "Time to decide and commit one transaction, fsync included.",
            &st.commit_time,
        );
    }
    out.into_bytes()
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    family(out, name, "histogram", help);
    let mut cumulative = 0;
    for (bound, n) in BOUNDS.iter().zip(h.buckets()) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(out, "{name}_sum {}", h.sum_us() as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {}", h.count());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_a_fixed_set_of_labels() {
        assert_eq!(route_label(Method::Get, "/prompts/abc"), "prompts");
        assert_eq!(route_label(Method::Put, "/sessions/x"), "session_put");
        assert_eq!(route_label(Method::Get, "/"), "page");
        assert_eq!(route_label(Method::Get, "/sw.js"), "page");
        assert_eq!(route_label(Method::Head, "/icon.png"), "page");
        assert_eq!(route_label(Method::Options, "/prompt"), "preflight");
        assert_eq!(route_label(Method::Get, "/anything/else"), "other");
        assert!(ROUTES.is_sorted(), "the exposition lists routes by label");
    }

    #[test]
    fn the_histogram_is_cumulative_and_counts_everything() {
        let mut m = Metrics::default();
        m.turns.observe_us(50);
        m.turns.observe_us(3_000);
        m.turns.observe_us(5_000_000);
        m.request(Method::Post, "/prompt", 200);
        m.request(Method::Post, "/prompt", 200);
        let text = String::from_utf8(render(&Snapshot {
            shell: &m,
            stats: Stats::default(),
            counts: Counts::default(),
            connections: 2,
            memory_recount: None,
            bytes_queued: 10,
            store: None,
        }))
        .unwrap();
        assert!(
            text.contains("relay_loop_turn_seconds_bucket{le=\"0.0001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("relay_loop_turn_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("relay_loop_turn_seconds_bucket{le=\"1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("relay_loop_turn_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("relay_requests_total{route=\"prompt\",status=\"200\"} 2\n"));
        assert!(text.contains("relay_connections 2\n"));
    }
}
