//! The HTTP stage of a connection: pull requests out of its reader one at a
//! time, route them, call the relay, and queue the answers in order. Called
//! by the loop whenever the connection has input or was re-listed.

use std::rc::Rc;

use log::{debug, info};

use super::conn::{Parked, Phase};
use super::server::{OUT_HIGH_WATER, Server};
use super::ws::WsState;
use crate::http::parse::Step;
use crate::http::response::{self, CONTINUE, Meta};
use crate::http::route::{Route, messages_query, prompts_query, query_param, route, uint_param};
use crate::http::{Method, RequestHead, upgrade};
use crate::keepalive::Keepalive;
use crate::ratelimit::client_addr;
use crate::relay::{ApiError, ConnId, Fetch};
use crate::time::Millis;
use crate::web;

/// Requests answered on one connection per turn before others get a turn.
const REQUESTS_PER_TURN: usize = 64;

/// Which token a route needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Open,
    Client,
    Agent,
    Either,
}

fn role(route: &Route) -> Role {
    match route {
        Route::GetPrompts(_) | Route::PostResponse => Role::Agent,
        Route::PostPrompt | Route::WebSocket(_) | Route::Messages(_) | Route::DeleteSession(_) => {
            Role::Client
        }
        Route::PutSession(_) => Role::Either,
        Route::WebPage
        | Route::Healthz
        | Route::Readyz
        | Route::Preflight { .. }
        | Route::MethodNotAllowed { .. }
        | Route::NotFound => Role::Open,
    }
}

/// Compares in time that depends only on the lengths, not on where the
/// first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `Content-Type` is `application/json`, parameters allowed.
fn is_json(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// A handled request's answer.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: Body,
    extra: Vec<(&'static str, String)>,
}

/// An answer's body: its own bytes, bytes shared with other answers (a
/// pending set several agents fetch), or bytes of the binary (the web
/// page); the last two are queued without a copy.
enum Body {
    Owned(Vec<u8>),
    Shared(Rc<[u8]>),
    Static(&'static [u8]),
}

impl Answer {
    fn ok(body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            content_type: response::JSON,
            body: Body::Owned(body),
            extra: Vec::new(),
        }
    }

    fn shared(body: Rc<[u8]>) -> Answer {
        Answer {
            status: 200,
            content_type: response::JSON,
            body: Body::Shared(body),
            extra: Vec::new(),
        }
    }
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        let mut extra = Vec::new();
        match e.status {
            401 => extra.push(("WWW-Authenticate", "Bearer".to_string())),
            503 | 429 => extra.push(("Retry-After", "1".to_string())),
            _ => {}
        }
        Answer {
            status: e.status,
            content_type: response::JSON,
            body: Body::Owned(e.body()),
            extra,
        }
    }
}

impl Server {
    /// Reads, parses and answers requests until the connection has no
    /// complete request left, parks, upgrades, or used its turn.
    pub(super) fn drive_http(&mut self, id: ConnId, now: Millis) {
        let mut handled = 0;
        loop {
            let Some(conn) = self.conn(id) else { return };
            if conn.out.queued() > OUT_HIGH_WATER {
                conn.out_paused = true; // resumes once the output drains
                break;
            }
            let Phase::Http(h) = &mut conn.phase else {
                return;
            };
            match h.reader.next_step() {
                Ok(Step::NeedMore) => {
                    if conn.eof {
                        // The peer sent its last byte and everything complete
                        // is answered: flush, then close.
                        self.begin_closing(id, now);
                        return;
                    }
                    if !conn.readable {
                        break;
                    }
                    let want = h.reader.want();
                    if !self.fill(id, want) {
                        return; // peer gone
                    }
                }
                Ok(Step::SendContinue) => conn.out.push_owned(CONTINUE.to_vec()),
                Ok(Step::Request(head, body)) => {
                    self.handle(id, *head, body, now);
                    self.apply_effects(now);
                    handled += 1;
                    if handled >= REQUESTS_PER_TURN {
                        self.reprocess.push(id);
                        break;
                    }
                }
                Err(e) => {
                    debug!(status = e.status; "bad request framing");
                    self.reply_error_and_close(id, &e, None);
                    return;
                }
            }
        }
        let keepalive = self.cfg.keepalive_timeout;
        let request_timeout = self.cfg.request_timeout;
        let Some(conn) = self.conn(id) else { return };
        if let Phase::Http(h) = &mut conn.phase {
            let deadline = if h.reader.mid_request() {
                h.request_started.get_or_insert(now).after(request_timeout)
            } else {
                h.request_started = None;
                now.after(keepalive)
            };
            self.set_deadline(id, deadline);
        }
    }

    /// Routes one request and queues its answer (or parks, or upgrades).
    fn handle(&mut self, id: ConnId, head: RequestHead, body: Vec<u8>, now: Millis) {
        let answer = match self.dispatch(id, &head, body, now) {
            Ok(Some(a)) => a,
            Ok(None) => return, // parked or upgraded
            Err(e) => Answer::from(e),
        };
        self.respond(id, &head, answer, now);
    }

    fn dispatch(
        &mut self,
        id: ConnId,
        head: &RequestHead,
        body: Vec<u8>,
        now: Millis,
    ) -> Result<Option<Answer>, ApiError> {
        let route = if head.path == "/" && !self.cfg.web {
            Route::NotFound // the page is off: `/` is an unknown path
        } else {
            route(head.method(), &head.path)?
        };
        if head.method() == Method::Post && self.limiter.enabled() {
            let peer = self.conn(id).map(|c| c.peer);
            if let Some(peer) = peer {
                let client = client_addr(
                    peer,
                    head.forwarded_for.as_deref(),
                    &self.cfg.trusted_proxies,
                );
                if let Err(wait_s) = self.limiter.check(client, now) {
                    debug!(client = client.to_string().as_str(); "rate limited");
                    let mut a = Answer::from(ApiError::too_many_requests());
                    a.extra = vec![("Retry-After", wait_s.to_string())];
                    return Ok(Some(a));
                }
            }
        }
        self.authorize(&route, head)?;
        let unix_ms = self.clock.unix_now();
        let answer = match route {
            Route::WebPage => Answer {
                status: 200,
                content_type: web::CONTENT_TYPE,
                body: Body::Static(web::PAGE),
                extra: web::headers()
                    .iter()
                    .map(|&(k, v)| (k, v.to_string()))
                    .collect(),
            },
            Route::Healthz => Answer::ok(self.healthz_body(unix_ms)),
            Route::Readyz => self.readyz(),
            Route::PostPrompt => {
                if !is_json(head.content_type.as_deref()) {
                    return Err(ApiError::unsupported_media_type());
                }
                Answer::ok(self.relay.post_prompt(now, unix_ms, &body)?)
            }
            Route::GetPrompts(sid) => {
                let q = prompts_query(head.query.as_deref())?;
                match self.relay.get_prompts(now, id, &sid, q)? {
                    Fetch::Ready(list) => Answer::shared(list),
                    Fetch::Park { deadline } => {
                        let parked = Parked {
                            sid: sid.into(),
                            keep_alive: head.keep_alive,
                            http10: head.http10,
                            origin: head.origin.as_deref().map(Rc::from),
                        };
                        self.park(id, parked, deadline);
                        return Ok(None);
                    }
                }
            }
            Route::PostResponse => {
                if !is_json(head.content_type.as_deref()) {
                    return Err(ApiError::unsupported_media_type());
                }
                Answer::ok(self.relay.post_response(now, unix_ms, &body)?)
            }
            Route::WebSocket(sid) => {
                self.upgrade(id, head, sid, now)?;
                return Ok(None);
            }
            Route::Messages(sid) => {
                let q = messages_query(head.query.as_deref())?;
                Answer::ok(self.relay.messages(now, &sid, q)?)
            }
            Route::PutSession(sid) => Answer::ok(self.relay.put_session(now, &sid)?),
            Route::DeleteSession(sid) => Answer::ok(self.relay.delete_session(&sid)?),
            Route::Preflight { allow } => Answer {
                status: 204,
                content_type: response::JSON,
                body: Body::Owned(Vec::new()),
                extra: vec![
                    ("Access-Control-Allow-Methods", allow.to_string()),
                    (
                        "Access-Control-Allow-Headers",
                        "Content-Type, Authorization".to_string(),
                    ),
                    ("Access-Control-Max-Age", "86400".to_string()),
                ],
            },
            Route::MethodNotAllowed { allow } => {
                let mut a = Answer::from(ApiError::method_not_allowed());
                a.extra.push(("Allow", allow.to_string()));
                a
            }
            Route::NotFound => Answer::from(ApiError::not_found()),
        };
        Ok(Some(answer))
    }

    /// Checks the bearer token the route's role needs; a role whose token
    /// is unset is open.
    fn authorize(&self, route: &Route, head: &RequestHead) -> Result<(), ApiError> {
        let client = self.cfg.client_token.as_deref();
        let agent = self.cfg.agent_token.as_deref();
        let wanted: Vec<&str> = match role(route) {
            Role::Open => return Ok(()),
            Role::Client => client.into_iter().collect(),
            Role::Agent => agent.into_iter().collect(),
            Role::Either => match (client, agent) {
                (Some(c), Some(a)) => vec![c, a],
                _ => Vec::new(),
            },
        };
        if wanted.is_empty() {
            return Ok(());
        }
        let bearer = head
            .authorization
            .as_deref()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(|t| t.trim().to_string());
        let presented = match (bearer, route) {
            (Some(t), _) => Some(t),
            (None, Route::WebSocket(_)) => {
                query_param(head.query.as_deref(), "token").ok().flatten()
            }
            (None, _) => None,
        };
        let ok = presented.is_some_and(|p| {
            wanted.iter().fold(false, |acc, w| {
                acc | constant_time_eq(p.as_bytes(), w.as_bytes())
            })
        });
        if ok {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }

    fn healthz_body(&self, unix_ms: u64) -> Vec<u8> {
        let c = self.relay.counts();
        format!(
            "{{\"ok\":true,\"timestamp\":{unix_ms},\"sessions\":{},\"connections\":{},\"subscribers\":{},\"parked_polls\":{}}}",
            c.sessions,
            self.conns.len(),
            c.subscribers,
            c.parked_polls
        )
        .into_bytes()
    }

    fn readyz(&self) -> Answer {
        let reason = if self.shutdown_deadline.is_some() {
            Some("shutting down")
        } else if self.conns.len() >= self.cfg.max_connections {
            Some("connection limit reached")
        } else if self.relay.sessions_full() {
            Some("session limit reached")
        } else {
            None
        };
        match reason {
            None => Answer::ok(b"{\"ready\":true}".to_vec()),
            Some(r) => Answer {
                status: 503,
                content_type: response::JSON,
                body: Body::Owned(format!("{{\"ready\":false,\"reason\":\"{r}\"}}").into_bytes()),
                extra: Vec::new(),
            },
        }
    }

    /// Queues an answer; a connection that does not stay open starts closing.
    fn respond(&mut self, id: ConnId, head: &RequestHead, answer: Answer, now: Millis) {
        let mut meta: Meta = self.meta(head.origin.as_deref(), head.keep_alive);
        meta.http10 = head.http10;
        meta.head_only = head.method() == Method::Head;
        let extra: Vec<(&str, &str)> = answer.extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let keep_alive = meta.keep_alive;
        let (status, ct) = (answer.status, answer.content_type);
        let body_len = match &answer.body {
            Body::Owned(b) => b.len(),
            Body::Shared(b) => b.len(),
            Body::Static(b) => b.len(),
        };
        // A body queued by itself (shared or static) follows its head as a
        // chunk of its own; a small one is copied into the answer instead
        // (one chunk, one write).
        let apart = body_len > SHARE_ABOVE && !meta.head_only;
        let bytes = match &answer.body {
            _ if apart => response::encode_head(status, ct, &extra, body_len, &meta),
            Body::Owned(b) => response::encode_typed(status, ct, &extra, b, &meta),
            Body::Shared(b) => response::encode_typed(status, ct, &extra, b, &meta),
            Body::Static(b) => response::encode_typed(status, ct, &extra, b, &meta),
        };
        let Some(conn) = self.conn(id) else { return };
        conn.out.push_owned(bytes);
        match answer.body {
            Body::Shared(b) if apart => conn.out.push_shared(b),
            Body::Static(b) if apart => conn.out.push_static(b),
            Body::Owned(b) if apart => conn.out.push_owned(b),
            _ => {}
        }
        if !keep_alive {
            self.begin_closing(id, now);
        }
    }

    /// Validates an upgrade, registers the subscriber, queues the 101 and the
    /// replay, and moves the connection to the WebSocket stage.
    fn upgrade(
        &mut self,
        id: ConnId,
        head: &RequestHead,
        sid: String,
        now: Millis,
    ) -> Result<(), ApiError> {
        let accept = upgrade::check(head, &self.cfg.cors_origins)?;
        let query = head.query.as_deref();
        let after = uint_param(query, "after")?;
        let epoch = query_param(query, "epoch")?;
        let cursor = self
            .relay
            .subscribe(now, id, &sid, after, epoch.as_deref())?;
        let ping_ms = self.cfg.ping_interval.as_millis() as u64;
        let Some(conn) = self.conn(id) else {
            return Ok(());
        };
        conn.out.push_owned(accept);
        let phase = std::mem::replace(&mut conn.phase, Phase::Closing { shut: false });
        let leftover = match phase {
            Phase::Http(mut h) => h.reader.take_rest(),
            _ => Vec::new(),
        };
        let keepalive = Keepalive::new(now, ping_ms);
        let deadline = keepalive.deadline();
        conn.phase = Phase::WebSocket(Box::new(WsState::new(
            leftover,
            Rc::from(sid.as_str()),
            keepalive,
            cursor,
        )));
        // Frames may already be buffered behind the head: read them now.
        conn.readable = true;
        // The replay is the first refill, done when its output is written.
        info!(session_id = sid.as_str(), after = after.unwrap_or(0), resume = after.is_some(); "client connected");
        self.set_deadline(id, deadline);
        self.mark_write(id);
        self.reprocess.push(id);
        Ok(())
    }
}

/// Bodies up to this size are copied into the answer rather than queued apart.
const SHARE_ABOVE: usize = 4096;
