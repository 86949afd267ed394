//! The clients relay ships, run against the real server: the command line
//! tools (cli), how they stop a prompt (cancel), their end-to-end
//! encryption (e2e), the example clients a user copies (examples), and the
//! web page in headless Chromium (web_page).

#[path = "../common/mod.rs"]
mod common;

mod agent_all;
mod cancel;
mod cli;
mod context;
mod e2e;
mod examples;
mod reasons;
mod web_page;
