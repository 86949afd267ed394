//! The clients relay ships, run against the real server: the command line
//! tools (cli), one agent serving many sessions (agent_all), the
//! conversation handed to the command (context), the server's reasons for a
//! refused token (reasons), their questions to the person (ask), how they
//! stop a prompt (cancel), their end-to-end encryption (e2e), the example
//! clients a user copies (examples), a phone paired by a QR code (pair),
//! and the web page in headless Chromium (web_page).

#[path = "../common/mod.rs"]
mod common;

mod agent_all;
mod ask;
mod cancel;
mod cli;
mod context;
mod e2e;
mod examples;
mod pair;
mod reasons;
mod web_page;
