//! Process entry: a subcommand (`agent`, `send`, `health`, `token`) runs the
//! matching client tool; anything else runs the server: configuration from
//! the environment and flags, logging, bind, run. The server's exit codes:
//! 0 after a clean shutdown, 2 for a bad setting, 1 when it cannot start or
//! fails.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use relay::config::{self, Command, Config};
use relay::net::Server;

/// The static (musl) build's allocator: dlmalloc instead of musl's own.
/// musl's allocator returns freed groups to the kernel eagerly, so a
/// server that allocates and frees per request would pay `mmap`, `munmap`
/// and page faults over and over; dlmalloc keeps freed memory for the next
/// request.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: Alloc = Alloc;

/// One dlmalloc heap for every thread, behind std's mutex, called out of
/// line: inlined at every allocation site (as link-time optimization does
/// with the allocator itself), each site would carry its own copy of the
/// lock and the call, against the static binary's size cap
/// (`scripts/image.sh`). std's mutex takes one atomic exchange each way when
/// nobody holds it (the loop's case nearly always); the crate's own global
/// wrapper locks a pthread mutex, two calls into musl per allocation.
#[cfg(target_env = "musl")]
struct Alloc;

#[cfg(target_env = "musl")]
static HEAP: std::sync::Mutex<dlmalloc::Dlmalloc> =
    std::sync::Mutex::new(dlmalloc::Dlmalloc::new());

/// The heap, locked. A poisoned lock cannot happen (the release profile
/// aborts on panic), and the heap's state is whole between calls anyway.
#[cfg(target_env = "musl")]
fn heap() -> std::sync::MutexGuard<'static, dlmalloc::Dlmalloc> {
    HEAP.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// SAFETY: every method holds the mutex while it calls the heap, so one
// thread at a time uses it (`Dlmalloc` is `Send` and not `Sync`; the mutex
// is what makes sharing it sound), and neither the mutex nor dlmalloc
// allocates through this allocator (dlmalloc gets its memory from `mmap`),
// so nothing re-enters it. `malloc`, `calloc`, `free` and `realloc` take a
// size and alignment and follow `GlobalAlloc`'s contracts
// (dlmalloc's documentation); each method passes the caller's layout and
// pointer unchanged, so the caller's obligations (a non-zero-size layout;
// a pointer from this allocator with the layout it was allocated with) are
// exactly theirs, and a null pointer on failure is returned as is.
#[cfg(target_env = "musl")]
unsafe impl std::alloc::GlobalAlloc for Alloc {
    #[inline(never)]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { heap().malloc(layout.size(), layout.align()) }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { heap().calloc(layout.size(), layout.align()) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this heap with this layout; the caller's
        // contract is forwarded unchanged.
        unsafe { heap().free(ptr, layout.size(), layout.align()) }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `size` is the caller's, unchanged.
        unsafe { heap().realloc(ptr, layout.size(), layout.align(), size) }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: Vec<(String, String)> = std::env::vars().collect();
    if let Some(code) = relay::cli::dispatch(&args, &env) {
        return ExitCode::from(code);
    }
    let env_copy = env.clone();
    let (cfg, warnings) = match config::parse(env, args) {
        Ok(Command::Run { cfg, warnings }) => (*cfg, warnings),
        Ok(Command::Help) => {
            print!("{}{}", config::help(), relay::cli::SUMMARY);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("relay {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("relay: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = relay::logging::init(cfg.log_level, cfg.log_format) {
        eprintln!("relay: cannot start logging: {e}");
        return ExitCode::FAILURE;
    }
    for warning in &warnings {
        log::warn!("{warning}");
    }
    for name in config::tool_variables_in(&env_copy) {
        log::debug!(
            "{name} is read by the command line tools (relay agent, relay send), not by the server"
        );
    }
    if let Err(e) = check_tls_files(&cfg) {
        log::error!("{e}");
        return ExitCode::from(2);
    }
    warn_about_open_endpoints(&cfg);
    let storage = storage_line(&cfg);
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let opened = match &cfg.data_dir {
        None => None,
        Some(dir) => {
            if let Err(e) = prepare_data_dir(dir) {
                log::error!("cannot start: {e}");
                return ExitCode::FAILURE;
            }
            match relay::store::sqlite::open(dir, cfg.sync) {
                Ok(opened) => Some(opened),
                Err(e) => {
                    log::error!("cannot start: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let mut server = match Server::bind(cfg, true, opened) {
        Ok(s) => s,
        Err(e) => {
            // One line, through the logger (stderr in both formats), naming
            // the address when listening is what failed. No key-value
            // fields: the text format would print the error a second time.
            match e.kind() {
                // Ports below 1024 need privilege: say how to get it, or
                // to do without.
                ErrorKind::PermissionDenied if addr.port() < 1024 => {
                    log::error!(
                        "cannot listen on {addr}: {e}; ports below 1024 need root or \
                         CAP_NET_BIND_SERVICE (setcap cap_net_bind_service=+ep on the \
                         binary, or AmbientCapabilities= in the systemd unit): or use a \
                         port above 1023 behind a proxy"
                    )
                }
                ErrorKind::AddrInUse
                | ErrorKind::AddrNotAvailable
                | ErrorKind::PermissionDenied => {
                    log::error!("cannot listen on {addr}: {e}")
                }
                _ => log::error!("cannot start: {e}"),
            }
            return ExitCode::FAILURE;
        }
    };
    // Once listening, so a start that fails is still one line.
    log::info!(storage = storage.0; "storage: {}", storage.1);
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!(error = e.to_string().as_str(); "server failed");
            ExitCode::FAILURE
        }
    }
}

/// The certificate, key and Redis CA files are read once before binding,
/// so a missing or mismatched file is a bad setting (exit 2) whose message
/// names the file, not a failure to start.
fn check_tls_files(cfg: &Config) -> Result<(), String> {
    if let Some(files) = &cfg.tls {
        relay::tls::server_config(files)?;
    }
    if let Some(ca) = &cfg.redis_ca {
        relay::tls::client_config(Some(ca), None, None)?;
    }
    Ok(())
}

/// Checks the data directory before the database is opened, so each
/// mistake is named as what it is: a missing parent (a mistyped path) is
/// refused rather than created whole as `mkdir -p` would; only the last
/// component is created; a directory the server cannot write in names the
/// user the server runs as and the `chown` that fixes it. Called once at
/// start, before the storage opens the directory.
fn prepare_data_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        let parent = match dir.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => Path::new("/"),
        };
        if !parent.is_dir() {
            return Err(format!(
                "RELAY_DATA_DIR {}: its parent directory {} does not exist; create it \
                 first (relay creates only the last component), or check the path for a typo",
                dir.display(),
                parent.display()
            ));
        }
        match std::fs::create_dir(dir) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(format!(
                    "cannot create RELAY_DATA_DIR {}: {e}{}",
                    dir.display(),
                    not_writable_hint(parent, &e)
                ));
            }
            _ => {}
        }
        log::info!("created the data directory {}", dir.display());
    }
    if !dir.is_dir() {
        // The storage names this case itself.
        return Ok(());
    }
    let probe = dir.join("relay.probe");
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "the data directory {} is not writable: {e}{}",
            dir.display(),
            not_writable_hint(dir, &e)
        )),
    }
}

/// For a write refused in `dir`: which user the server runs as, who owns
/// `dir`, and the command that lets the server write there. Empty for
/// other errors (a read-only file system, a full disk), which `chown`
/// does not fix.
fn not_writable_hint(dir: &Path, e: &std::io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    if e.kind() != ErrorKind::PermissionDenied {
        return String::new();
    }
    // `/proc/self` belongs to the process's effective user.
    let Ok(me) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return String::new();
    };
    let who = user_name(me).map_or(format!("uid {me}"), |n| format!("user {n} (uid {me})"));
    let name = user_name(me).unwrap_or_else(|| me.to_string());
    let owner = match std::fs::metadata(dir).map(|m| m.uid()) {
        Ok(o) => format!(
            ", owned by {}",
            user_name(o).unwrap_or_else(|| format!("uid {o}"))
        ),
        Err(_) => String::new(),
    };
    format!(
        "; relay runs as {who}, which cannot write in {}{owner}: run `sudo chown {name} {}` \
         (or name a directory that user owns)",
        dir.display(),
        dir.display()
    )
}

/// The name `/etc/passwd` gives `uid`, if any (no NSS lookup: the static
/// build has none).
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// Where sessions live, for the start log: its kind and the line that
/// says it, whatever the settings, so a server that keeps nothing across
/// restarts says so (a misspelled storage setting is refused by
/// `config::parse`, but an unset one is the default). The Redis URL is
/// shown without its password.
fn storage_line(cfg: &Config) -> (&'static str, String) {
    match (&cfg.data_dir, &cfg.redis) {
        (Some(dir), _) => (
            "sqlite",
            format!("SQLite database {}", dir.join("relay.db").display()),
        ),
        (None, Some(url)) => (
            "redis",
            format!(
                "Redis at {} (keys start with {})",
                url.display(),
                cfg.redis_prefix
            ),
        ),
        (None, None) => ("memory", "memory, nothing kept across restarts".to_string()),
    }
}

/// Warns at start about endpoints anyone can use: all of them on a
/// non-loopback address without tokens (worded after Redis's protected-mode
/// notice; the server still listens, as the contract's defaults ask), or
/// one role's when only the other role's token is set and there is no
/// token secret.
fn warn_about_open_endpoints(cfg: &Config) {
    if config::open_to_the_network(cfg) {
        log::warn!(
            "relay is listening on {} (not loopback) with no tokens set: anyone who can reach this port \
             can post prompts into the agent and read its answers. To fix it, set RELAY_CLIENT_TOKEN and \
             RELAY_AGENT_TOKEN to require bearer tokens, or set RELAY_HOST=127.0.0.1 to accept local \
             connections only.",
            cfg.host
        );
    }
    // With a token secret no role is open: session tokens are required
    // where the server-wide token is unset.
    match (&cfg.client_token, &cfg.agent_token) {
        _ if cfg.token_secret.is_some() => {}
        (Some(_), None) => {
            log::warn!(open_role = "agent"; "only RELAY_CLIENT_TOKEN is set: the agent endpoints are open")
        }
        (None, Some(_)) => {
            log::warn!(open_role = "client"; "only RELAY_AGENT_TOKEN is set: the client endpoints are open")
        }
        _ => {}
    }
}
