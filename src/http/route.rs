//! Method and path to [`Route`], and query strings to the typed, validated
//! parameters the relay core takes. Wrong method on a known path is 405 with
//! `Allow`; an unknown path is 404.

use super::Method;
use crate::error::ApiError;
use crate::store::types::{EveryQuery, MessagesQuery, PromptsQuery};
use crate::store::{Seq, SessionId};

/// Longest long-poll, in milliseconds; longer `timeout`s are clamped.
pub const MAX_POLL_MS: u64 = 300_000;
/// Long-poll default.
pub const DEFAULT_POLL_MS: u64 = 30_000;
/// `/messages` page size default and cap.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /` and the files that make the chat page an app (all off with
    /// `RELAY_WEB=false`).
    Web(WebFile),
    Healthz,
    /// `GET /metrics`: Prometheus text.
    Metrics,
    Readyz,
    PostPrompt,
    GetPrompts(SessionId),
    /// `GET /prompts` with no session: every session the token opens.
    GetEveryPrompts,
    /// `GET /whoami`: what the presented token opens.
    Whoami,
    /// `DELETE /agent/{sid}`: the agent stops in one session.
    DeleteAgent(SessionId),
    /// `DELETE /agent`: the agent stops in every session its token opens.
    DeleteAgentEvery,
    PostResponse,
    /// `POST /cancel`: the person stops a prompt.
    PostCancel,
    WebSocket(SessionId),
    Messages(SessionId),
    /// `GET /sessions/{sid}`: counters and the agent's state.
    GetSession(SessionId),
    PutSession(SessionId),
    DeleteSession(SessionId),
    /// `POST /ask`: a question from the agent.
    PostAsk,
    /// `POST /reply`: the person's answer to an ask.
    PostReply,
    /// `GET /asks/{sid}/{ask_id}` (the id percent-decoded).
    GetAsk(SessionId, String),
    /// `OPTIONS` on a known path: a CORS preflight.
    Preflight {
        allow: &'static str,
    },
    /// Known path, wrong method.
    MethodNotAllowed {
        allow: &'static str,
    },
    NotFound,
}

/// The chat page and what installs it: the web app manifest, the service
/// worker and the icons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebFile {
    Page,
    Manifest,
    Worker,
    IconSvg,
    IconPng,
}

/// The chat page's file at `path`, if it is one.
pub fn web_file(path: &str) -> Option<WebFile> {
    Some(match path {
        "/" => WebFile::Page,
        "/manifest.webmanifest" => WebFile::Manifest,
        "/sw.js" => WebFile::Worker,
        "/icon.svg" => WebFile::IconSvg,
        "/icon.png" => WebFile::IconPng,
        _ => return None,
    })
}

/// Maps a method and path to its route. `Err` is a bad session id (400).
pub fn route(method: Method, path: &str) -> Result<Route, ApiError> {
    use Method::*;
    if let Some(file) = web_file(path) {
        let allow = "GET, HEAD, OPTIONS";
        return Ok(match method {
            Get | Head => Route::Web(file),
            Options => Route::Preflight { allow },
            _ => Route::MethodNotAllowed { allow },
        });
    }
    let (allow, route): (&'static str, Option<Route>) = match path {
        "/healthz" => (
            "GET, HEAD, OPTIONS",
            matches!(method, Get | Head).then_some(Route::Healthz),
        ),
        "/readyz" => (
            "GET, HEAD, OPTIONS",
            matches!(method, Get | Head).then_some(Route::Readyz),
        ),
        "/metrics" => (
            "GET, HEAD, OPTIONS",
            matches!(method, Get | Head).then_some(Route::Metrics),
        ),
        "/prompt" => (
            "POST, OPTIONS",
            (method == Post).then_some(Route::PostPrompt),
        ),
        "/prompts" => (
            "GET, OPTIONS",
            (method == Get).then_some(Route::GetEveryPrompts),
        ),
        "/whoami" => ("GET, OPTIONS", (method == Get).then_some(Route::Whoami)),
        "/agent" => (
            "DELETE, OPTIONS",
            (method == Delete).then_some(Route::DeleteAgentEvery),
        ),
        "/response" => (
            "POST, OPTIONS",
            (method == Post).then_some(Route::PostResponse),
        ),
        "/cancel" => (
            "POST, OPTIONS",
            (method == Post).then_some(Route::PostCancel),
        ),
        "/ask" => ("POST, OPTIONS", (method == Post).then_some(Route::PostAsk)),
        "/reply" => (
            "POST, OPTIONS",
            (method == Post).then_some(Route::PostReply),
        ),
        _ if path.starts_with("/asks/") => return ask_route(method, path),
        _ => {
            let Some((prefix, sid)) = split_session_path(path) else {
                return Ok(Route::NotFound);
            };
            type Make = fn(SessionId) -> Route;
            let (allow, make): (&'static str, Option<Make>) = match prefix {
                "prompts" => ("GET, OPTIONS", (method == Get).then_some(Route::GetPrompts)),
                "ws" => ("GET, OPTIONS", (method == Get).then_some(Route::WebSocket)),
                "messages" => ("GET, OPTIONS", (method == Get).then_some(Route::Messages)),
                "agent" => (
                    "DELETE, OPTIONS",
                    (method == Delete).then_some(Route::DeleteAgent),
                ),
                "sessions" => (
                    "GET, PUT, DELETE, OPTIONS",
                    match method {
                        Get => Some(Route::GetSession),
                        Put => Some(Route::PutSession),
                        Delete => Some(Route::DeleteSession),
                        _ => None,
                    },
                ),
                _ => return Ok(Route::NotFound),
            };
            // The id is checked only on a route that takes it: a wrong
            // method is 405 whatever the id.
            let route = match make {
                Some(make) => Some(make(
                    SessionId::new(sid).ok_or_else(ApiError::invalid_session_id)?,
                )),
                None => None,
            };
            (allow, route)
        }
    };
    Ok(match (route, method) {
        (Some(r), _) => r,
        (None, Options) => Route::Preflight { allow },
        (None, _) => Route::MethodNotAllowed { allow },
    })
}

/// `/asks/{sid}/{ask_id}`: `GET` (and its preflight); any other shape is
/// an unknown path.
fn ask_route(method: Method, path: &str) -> Result<Route, ApiError> {
    let rest = path.strip_prefix("/asks/").unwrap_or("");
    let Some((sid, ask_id)) = rest.split_once('/') else {
        return Ok(Route::NotFound);
    };
    if ask_id.is_empty() || ask_id.contains('/') {
        return Ok(Route::NotFound);
    }
    match method {
        Method::Get => {
            let sid = SessionId::new(sid).ok_or_else(ApiError::invalid_session_id)?;
            let ask_id = percent_decode(ask_id).ok_or_else(ApiError::not_found)?;
            Ok(Route::GetAsk(sid, ask_id))
        }
        Method::Options => Ok(Route::Preflight {
            allow: "GET, OPTIONS",
        }),
        _ => Ok(Route::MethodNotAllowed {
            allow: "GET, OPTIONS",
        }),
    }
}

/// `/prompts/abc` -> `("prompts", "abc")`; `/ws/` -> `("ws", "")`.
fn split_session_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (prefix, sid) = rest.split_once('/')?;
    if sid.contains('/') {
        return None;
    }
    Some((prefix, sid))
}

/// Decodes `%XX` and `+` in a query component; `None` if malformed.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                out.push(v);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The value of query parameter `name` (the last one wins), decoded.
pub fn query_param(query: Option<&str>, name: &str) -> Result<Option<String>, ApiError> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == name {
            found = Some(
                percent_decode(v)
                    .ok_or_else(|| ApiError::bad_request(format!("Invalid {name}")))?,
            );
        }
    }
    Ok(found)
}

fn invalid(name: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("Invalid {name}")).with_details(why.to_string())
}

/// A non-negative decimal integer, saturated at `u64::MAX`. Digits past 64
/// bits are still a well-formed count, only larger than anything stored:
/// a `limit` that large is clamped like any other above 1000, and an
/// `offset`, `after` or `since` that large leaves nothing to match, exactly
/// as `u64::MAX` does (no `seq` or `ts` exceeds it). A leading `+` is
/// accepted and `-0` is zero; any other minus sign is refused.
fn saturating_uint(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.strip_prefix('+').unwrap_or(v);
    if let Some(zeros) = digits.strip_prefix('-') {
        return (!zeros.is_empty() && zeros.bytes().all(|b| b == b'0')).then_some(0);
    }
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits: parsing fails only on overflow.
    Some(digits.parse::<u64>().unwrap_or(u64::MAX))
}

/// Query parameter `name` as a non-negative integer (huge values saturate,
/// see `saturating_uint`); negative or non-numeric is `400 Invalid {name}`.
/// Called for `after`, `since`, `limit` and `offset`, and meant for the
/// WebSocket's `after` too.
pub fn uint_param(query: Option<&str>, name: &str) -> Result<Option<u64>, ApiError> {
    match query_param(query, name)? {
        None => Ok(None),
        Some(v) => saturating_uint(&v)
            .map(Some)
            .ok_or_else(|| invalid(name, "must be a non-negative integer")),
    }
}

/// `timeout`, `wait`, `after` of `GET /prompts`.
pub fn prompts_query(query: Option<&str>) -> Result<PromptsQuery, ApiError> {
    let timeout_ms = match query_param(query, "timeout")? {
        None => DEFAULT_POLL_MS,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(t) if t >= 0.0 && !t.is_nan() => {
                ((t.min(MAX_POLL_MS as f64 / 1000.0)) * 1000.0).ceil() as u64
            }
            _ => {
                return Err(invalid(
                    "timeout",
                    "must be a non-negative number of seconds",
                ));
            }
        },
    };
    let wait = match query_param(query, "wait")?.as_deref() {
        None | Some("true") | Some("1") => true,
        Some("false") | Some("0") => false,
        Some(_) => return Err(invalid("wait", "must be true, false, 1 or 0")),
    };
    Ok(PromptsQuery {
        timeout_ms,
        wait,
        after: uint_param(query, "after")?.map(Seq),
    })
}

/// `timeout`, `wait`, `after` (a cursor) and `limit` of `GET /prompts`
/// with no session: `limit` as for `/messages`; `after` is the decimal
/// cursor a listed prompt carried.
pub fn every_query(query: Option<&str>) -> Result<EveryQuery, ApiError> {
    let q = prompts_query(query)?;
    Ok(EveryQuery {
        timeout_ms: q.timeout_ms,
        wait: q.wait,
        after: q.after.map(Seq::get),
        limit: limit_param(query)?,
    })
}

/// `limit`: default 100, above 1000 clamped, negative `400`.
fn limit_param(query: Option<&str>) -> Result<usize, ApiError> {
    Ok(uint_param(query, "limit")?.map_or(DEFAULT_LIMIT, |n| {
        usize::try_from(n.min(MAX_LIMIT as u64)).unwrap_or(MAX_LIMIT)
    }))
}

/// `limit`, `offset`, `since`, `after` of `GET /messages`.
pub fn messages_query(query: Option<&str>) -> Result<MessagesQuery, ApiError> {
    let limit = limit_param(query)?;
    let offset =
        uint_param(query, "offset")?.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
    Ok(MessagesQuery {
        limit,
        offset,
        since: uint_param(query, "since")?,
        after: uint_param(query, "after")?.map(Seq),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_methods() {
        assert_eq!(route(Method::Get, "/healthz").unwrap(), Route::Healthz);
        assert_eq!(route(Method::Head, "/").unwrap(), Route::Web(WebFile::Page));
        assert_eq!(
            route(Method::Get, "/sw.js").unwrap(),
            Route::Web(WebFile::Worker)
        );
        assert_eq!(
            route(Method::Post, "/").unwrap(),
            Route::MethodNotAllowed {
                allow: "GET, HEAD, OPTIONS"
            }
        );
        assert_eq!(
            route(Method::Get, "/prompts/abc").unwrap(),
            Route::GetPrompts(SessionId::new("abc").unwrap())
        );
        assert_eq!(
            route(Method::Post, "/prompts/abc").unwrap(),
            Route::MethodNotAllowed {
                allow: "GET, OPTIONS"
            }
        );
        assert_eq!(
            route(Method::Options, "/prompt").unwrap(),
            Route::Preflight {
                allow: "POST, OPTIONS"
            }
        );
        assert_eq!(route(Method::Get, "/nope").unwrap(), Route::NotFound);
        assert_eq!(route(Method::Get, "/prompts/a/b").unwrap(), Route::NotFound);
        assert_eq!(
            route(Method::Get, "/ws/").unwrap_err().error,
            "Invalid session_id"
        );
        let e = route(Method::Get, "/ws/a%20b").unwrap_err();
        assert_eq!(e.error, "Invalid session_id");
        assert_eq!(
            e.details.as_deref(),
            Some("1 to 128 characters from A-Z a-z 0-9 . _ ~ -")
        );
    }

    #[test]
    fn prompts_query_clamps_and_rejects() {
        let q = prompts_query(Some("timeout=1000&wait=0&after=4")).unwrap();
        assert_eq!(
            (q.timeout_ms, q.wait, q.after),
            (MAX_POLL_MS, false, Some(Seq(4)))
        );
        assert_eq!(prompts_query(Some("timeout=0.0011")).unwrap().timeout_ms, 2);
        assert_eq!(prompts_query(None).unwrap().timeout_ms, DEFAULT_POLL_MS);
        assert!(prompts_query(Some("timeout=-1")).is_err());
        assert!(prompts_query(Some("timeout=abc")).is_err());
        assert!(prompts_query(Some("timeout=NaN")).is_err());
        assert!(prompts_query(Some("wait=yes")).is_err());
        assert!(prompts_query(Some("after=-1")).is_err());
    }

    #[test]
    fn messages_query_clamps_and_rejects() {
        let q = messages_query(Some("limit=5000&offset=3&since=10")).unwrap();
        assert_eq!((q.limit, q.offset, q.since), (MAX_LIMIT, 3, Some(10)));
        assert_eq!(messages_query(None).unwrap().limit, DEFAULT_LIMIT);
        assert!(messages_query(Some("limit=-1")).is_err());
        assert!(messages_query(Some("offset=-5")).is_err());
        assert!(messages_query(Some("limit=x")).is_err());
    }

    #[test]
    fn numbers_past_64_bits_saturate_and_negatives_are_refused() {
        let huge = "10000000000000000000000000000000";
        let q = messages_query(Some(&format!(
            "limit={huge}&offset={huge}&since={huge}&after={huge}"
        )))
        .unwrap();
        assert_eq!(q.limit, MAX_LIMIT);
        assert_eq!(q.offset, usize::MAX);
        assert_eq!((q.since, q.after), (Some(u64::MAX), Some(Seq(u64::MAX))));
        let q = messages_query(Some("limit=10000000000000000000")).unwrap();
        assert_eq!(q.limit, MAX_LIMIT);
        assert_eq!(messages_query(Some("limit=1001")).unwrap().limit, MAX_LIMIT);
        assert_eq!(
            messages_query(Some("limit=%2B7&offset=-0")).unwrap().limit,
            7
        );
        for bad in [
            "limit=-1",
            "limit=-10000000000000000000",
            "offset=-1",
            "limit=",
            "limit=1.5",
            "limit=1e3",
            "after=-3",
            "since=--1",
        ] {
            assert!(messages_query(Some(bad)).is_err(), "{bad}");
        }
        let q = prompts_query(Some(&format!("after={huge}"))).unwrap();
        assert_eq!(q.after, Some(Seq(u64::MAX)));
        assert_eq!(
            uint_param(Some("after=99999999999999999999"), "after").unwrap(),
            Some(u64::MAX)
        );
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            query_param(Some("token=a%2Bb&x=1"), "token")
                .unwrap()
                .as_deref(),
            Some("a+b")
        );
        assert!(query_param(Some("token=%zz"), "token").is_err());
    }
}
