//! HTTP/1.x, sans-IO: the incremental request parser, routing with query
//! validation, response encoding, and the WebSocket upgrade check. Nothing
//! here touches a socket; bytes in, values and bytes out.

use std::borrow::Cow;

pub mod parse;
pub mod plain;
pub mod response;
pub mod route;
pub mod upgrade;

/// Request methods the API knows; anything else is `Other` (405 or 404).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Other,
}

impl Method {
    /// The method's name, for the request log.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other => "OTHER",
        }
    }

    fn parse(m: &str) -> Method {
        match m {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// How the request body is delimited (RFC 9112 section 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length: n`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The parts of a request head the server uses, owned, so the input buffer
/// can be consumed while the request is handled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Option<Method>,
    /// The path, without the query; the API's fixed paths are not copied.
    pub path: Cow<'static, str>,
    /// The raw query string after `?`, if any.
    pub query: Option<String>,
    /// HTTP/1.0 rather than 1.1.
    pub http10: bool,
    /// Whether the connection stays open after the response.
    pub keep_alive: bool,
    pub framing: Option<Framing>,
    pub expect_continue: bool,
    /// `Upgrade: websocket` and `Connection: upgrade` both present.
    pub websocket: bool,
    pub ws_key: Option<String>,
    /// `Sec-WebSocket-Version: 13`, the only version there is (kept as a
    /// flag: the head stays small, and only this value is ever accepted).
    pub ws_version_13: bool,
    /// `Sec-WebSocket-Protocol`, every value joined by commas: the
    /// subprotocols offered (`relay.v1`, `bearer.<token>`). Only upgrade
    /// requests carry it, so other requests pay one failed name match.
    pub ws_protocols: Option<String>,
    pub origin: Option<String>,
    /// An upgrade whose `Origin` is this server's own (its host and port
    /// are the request's `Host`): the page the server serves.
    pub same_origin: bool,
    /// `Content-Type` is `application/json` (parameters allowed).
    pub json: bool,
    pub authorization: Option<String>,
    pub forwarded_for: Option<String>,
}

impl RequestHead {
    /// The method; `Other` when unset.
    pub fn method(&self) -> Method {
        self.method.unwrap_or(Method::Other)
    }

    /// The body framing; no body when unset.
    pub fn framing(&self) -> Framing {
        self.framing.unwrap_or(Framing::Empty)
    }
}
