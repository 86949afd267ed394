//! Who may do what, and clients that misbehave, against the real binary:
//! bearer tokens (auth), tokens for one session (session_tokens), the rate
//! limit and trusted proxies (rate_limit), input built to hurt
//! (poison_input), hostile clients beside a well-behaved one (fairness) and
//! every abuse at once within bounded memory (abuse).

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod auth;
mod fairness;
mod poison_input;
mod rate_limit;
mod session_tokens;
