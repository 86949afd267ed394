//! The HTTP API, endpoint by endpoint, against the real binary: `POST
//! /prompt` and `POST /response` (prompt_and_response), the other endpoints,
//! routing and CORS (endpoints), the settings that change what they answer
//! (limits), long-polls (long_poll), streamed answers, presence and receipts
//! (streaming), stopping a prompt (cancel), questions from the agent
//! (asks), one agent for many sessions (all_sessions), and the seed
//! spec's flows end to end (flows).

#[path = "../common/mod.rs"]
mod common;

mod all_sessions;
mod asks;
mod cancel;
mod endpoints;
mod flows;
mod limits;
mod long_poll;
mod prompt_and_response;
mod streaming;
