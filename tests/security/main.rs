//! Who may do what, and clients that misbehave, against the real binary:
//! bearer tokens (auth), tokens for one session (session_tokens) and for
//! the sessions under a prefix, with `/whoami` (prefix_tokens), the rate
//! limit and trusted proxies (rate_limit), refused tokens in the log
//! (refusals_log), input built to hurt
//! (poison_input), hostile clients beside a well-behaved one (fairness) and
//! every abuse at once within bounded memory (abuse).

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod auth;
mod fairness;
mod poison_input;
mod prefix_tokens;
mod rate_limit;
mod refusals_log;
mod session_tokens;
