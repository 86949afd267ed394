//! The command line tools in the same binary. They are blocking clients
//! over `std::net`, sharing one small HTTP client ([`client`]).

pub mod client;
