//! Process entry: a subcommand (`agent`, `send`, `health`) runs the
//! matching client tool; anything else runs the server: configuration from
//! the environment and flags, logging, bind, run. The server's exit codes:
//! 0 after a clean shutdown, 2 for a bad setting, 1 when it cannot start or
//! fails.

use std::process::ExitCode;

use relay::config::{self, Command};
use relay::net::Server;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env: Vec<(String, String)> = std::env::vars().collect();
    if let Some(code) = relay::cli::dispatch(&args, &env) {
        return ExitCode::from(code);
    }
    let cfg = match config::parse(env, args) {
        Ok(Command::Run(cfg)) => *cfg,
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
    match (&cfg.client_token, &cfg.agent_token) {
        (Some(_), None) => {
            log::warn!(open_role = "agent"; "only RELAY_CLIENT_TOKEN is set: the agent endpoints are open")
        }
        (None, Some(_)) => {
            log::warn!(open_role = "client"; "only RELAY_AGENT_TOKEN is set: the client endpoints are open")
        }
        _ => {}
    }
    let mut server = match Server::bind(cfg, true) {
        Ok(s) => s,
        Err(e) => {
            log::error!(error = e.to_string().as_str(); "cannot start");
            eprintln!("relay: cannot start: {e}");
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
