//! Process entry: a subcommand (`agent`, `send`, `health`) runs the
//! matching client tool; anything else runs the server: configuration from
//! the environment and flags, logging, bind, run. The server's exit codes:
//! 0 after a clean shutdown, 2 for a bad setting, 1 when it cannot start or
//! fails.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::process::ExitCode;

use relay::config::{self, Command, Config};
use relay::net::Server;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: Vec<(String, String)> = std::env::vars().collect();
    if let Some(code) = relay::cli::dispatch(&args, &env) {
        return ExitCode::from(code);
    }
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
    warn_about_open_endpoints(&cfg);
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let opened = match &cfg.data_dir {
        None => None,
        Some(dir) => {
            let limits = relay::relay::Limits::from_config(&cfg).store();
            match relay::store::sqlite::open(dir, limits, cfg.sync, relay::time::Millis(0)) {
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
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!(error = e.to_string().as_str(); "server failed");
            ExitCode::FAILURE
        }
    }
}

/// Warns at start about endpoints anyone can use: all of them on a
/// non-loopback address without tokens (worded after Redis's protected-mode
/// notice; the server still listens, as the contract's defaults ask), or
/// one role's when only the other role's token is set.
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
    match (&cfg.client_token, &cfg.agent_token) {
        (Some(_), None) => {
            log::warn!(open_role = "agent"; "only RELAY_CLIENT_TOKEN is set: the agent endpoints are open")
        }
        (None, Some(_)) => {
            log::warn!(open_role = "client"; "only RELAY_AGENT_TOKEN is set: the client endpoints are open")
        }
        _ => {}
    }
}
