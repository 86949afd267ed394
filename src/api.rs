//! The API's rules, pure: which token a route needs (compared in constant
//! time), the rate limit, CORS headers, the `Content-Type` check, the
//! `/healthz` and `/readyz` bodies, the web page, and the dispatch of a
//! parsed request to the relay core. Sans-IO like the cores: a request and
//! the facts of the moment in, an [`Outcome`] out; the I/O shell only
//! encodes and queues it, parks the connection, or upgrades it.

use std::borrow::Cow;
use std::net::IpAddr;
use std::rc::Rc;

use log::debug;

use crate::config::{Config, Origins};
use crate::http::response::{JSON, Meta};
use crate::http::route::{
    Route, WebFile, every_query, messages_query, prompts_query, query_param, route, uint_param,
    web_file,
};
use crate::http::{Method, RequestHead, upgrade};
use crate::ratelimit::{RateLimiter, client_addr};
use crate::relay::{ApiError, AskFetch, ConnId, Fetch, Relay, Reply, Scope};
use crate::store::model::{NewAsk, NewCancel, NewPrompt, NewReply, NewResponse, Write};
use crate::store::{Cursor, Seq, SessionId};
use crate::time::{Millis, Turn};
use crate::{token, web};

/// An answer's body: its own bytes, bytes shared with other answers (a
/// pending set several agents fetch), or bytes of the binary (the web
/// page); the last two are queued without a copy.
#[derive(Debug)]
pub enum Body {
    Owned(Vec<u8>),
    Shared(Rc<[u8]>),
    Static(&'static [u8]),
}

impl Body {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::Owned(b) => b.len(),
            Body::Shared(b) => b.len(),
            Body::Static(b) => b.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Body::Owned(b) => b,
            Body::Shared(b) => b,
            Body::Static(b) => b,
        }
    }
}

/// A request's answer, before encoding.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Body,
    pub extra: Vec<(&'static str, String)>,
    /// Why a 4xx or 5xx was given, for the debug request log.
    pub reason: Option<String>,
}

impl Answer {
    /// `200` with a JSON body of its own.
    pub fn ok(body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            content_type: JSON,
            body: Body::Owned(body),
            extra: Vec::new(),
            reason: None,
        }
    }

    /// `200` with a JSON body shared with other answers.
    pub fn shared(body: Rc<[u8]>) -> Answer {
        Answer {
            body: Body::Shared(body),
            ..Answer::ok(Vec::new())
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
        let reason = match &e.details {
            Some(d) => format!("{}: {d}", e.error),
            None => e.error.to_string(),
        };
        Answer {
            status: e.status,
            content_type: JSON,
            body: Body::Owned(e.body()),
            extra,
            reason: Some(reason),
        }
    }
}

/// What the shell does with a request.
#[derive(Debug)]
pub enum Outcome {
    /// Encode and queue this answer.
    Answer(Answer),
    /// Park the connection on a long-poll of `sid` (of every session the
    /// token opens when `None`) until `deadline`.
    Park {
        sid: Option<SessionId>,
        deadline: Millis,
    },
    /// Park the connection on `GET /asks` of `sid` until a reply to
    /// `ask_id` or `deadline`; the ask expires at `expires_at` (loop
    /// time), `expires_ts` on the wall clock.
    ParkAsk {
        sid: SessionId,
        ask_id: String,
        deadline: Millis,
        expires_at: Millis,
        expires_ts: u64,
    },
    /// Answer `101` with `accept` and continue as a subscriber of `sid`
    /// at `cursor` (already registered with the relay).
    Upgrade {
        accept: Vec<u8>,
        sid: SessionId,
        cursor: Cursor,
        after: Option<Seq>,
    },
    /// Answer with the shell's metrics (the token, if any, was checked).
    Metrics,
    /// The request waits for the engine, under a ticket: an
    /// `Effect::Reply` (its answer) or `Effect::Retry` (run it again)
    /// follows.
    Wait,
}

/// The shell's facts of the moment that some answers report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts {
    /// Open connections.
    pub connections: usize,
    pub shutting_down: bool,
    /// The request runs again after the read it waited for
    /// ([`Relay::sync_first`]): it does not wait twice.
    pub synced: bool,
}

/// Which token a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Open,
    Client,
    Agent,
    Either,
    /// What a client reads and an agent watches (`/ws`, `GET /messages`):
    /// the client token, or the agent token when one is set (agents
    /// watch for cancels and read the conversation they answer).
    Watch,
    /// `/metrics`: its own token, when one is set.
    Metrics,
}

impl Role {
    /// The `details` of a `401` here.
    fn needed(self) -> &'static str {
        match self {
            Role::Client => "client token required",
            Role::Agent => "agent token required",
            Role::Either | Role::Watch => "client or agent token required",
            Role::Metrics => "metrics token required",
            Role::Open => "no token required",
        }
    }

    /// The role's name, for the log.
    fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Agent => "agent",
            Role::Either | Role::Watch => "client or agent",
            Role::Metrics => "metrics",
            Role::Open => "none",
        }
    }

    /// Whether a token for one session, minted for `role`, serves here.
    fn takes(self, role: token::Role) -> bool {
        match self {
            Role::Client => role == token::Role::Client,
            Role::Agent => role == token::Role::Agent,
            Role::Either | Role::Watch => true,
            Role::Open | Role::Metrics => false,
        }
    }
}

fn role(route: &Route) -> Role {
    match route {
        Route::GetPrompts(_) | Route::GetEveryPrompts | Route::PostResponse => Role::Agent,
        Route::PostPrompt | Route::PostCancel | Route::DeleteSession(_) => Role::Client,
        Route::WebSocket(_) | Route::Messages(_) => Role::Watch,
        Route::PutSession(_) | Route::GetSession(_) => Role::Either,
        Route::PostAsk | Route::GetAsk(..) => Role::Agent,
        Route::DeleteAgent(_) | Route::DeleteAgentEvery => Role::Agent,
        Route::PostReply => Role::Client,
        Route::Metrics => Role::Metrics,
        // Any valid token, or none on an open server: checked by `whoami`.
        Route::Whoami => Role::Open,
        Route::Web(_)
        | Route::Healthz
        | Route::Readyz
        | Route::Preflight { .. }
        | Route::MethodNotAllowed { .. }
        | Route::NotFound => Role::Open,
    }
}

/// The session a route names in its path; `None` for the `POST`s, whose
/// session is in the body, and for the routes of no session.
fn route_session(route: &Route) -> Option<&SessionId> {
    match route {
        Route::GetPrompts(sid)
        | Route::WebSocket(sid)
        | Route::Messages(sid)
        | Route::PutSession(sid)
        | Route::GetSession(sid)
        | Route::DeleteSession(sid)
        | Route::DeleteAgent(sid)
        | Route::GetAsk(sid, _) => Some(sid),
        // Listed one by one, not `_`: a new route with a session in its
        // path must be placed here on purpose, or a token for one session
        // would open it for every session.
        Route::Web(_)
        | Route::Healthz
        | Route::Metrics
        | Route::Readyz
        | Route::PostPrompt
        | Route::Whoami
        | Route::DeleteAgentEvery
        | Route::GetEveryPrompts
        | Route::PostResponse
        | Route::PostCancel
        | Route::PostAsk
        | Route::PostReply
        | Route::Preflight { .. }
        | Route::MethodNotAllowed { .. }
        | Route::NotFound => None,
    }
}

/// What a request's token opened.
#[derive(Clone, Copy, Debug)]
enum Grant {
    /// The route, whatever its session: a server-wide token, or no token
    /// needed.
    Any,
    /// Only this session's (a `POST` whose body names it).
    Session(token::Claims),
}

impl Grant {
    /// The sessions a poll of every session covers under this grant.
    fn scope(&self) -> Scope {
        match self {
            Grant::Any => Scope::Every,
            Grant::Session(c) => match SessionId::new(c.session()).filter(|_| !c.prefix) {
                Some(sid) => Scope::Session(sid),
                None => Scope::Prefix(Rc::from(c.session())),
            },
        }
    }

    /// `403` unless the grant covers `sid`.
    fn admits(&self, sid: &str) -> Result<(), ApiError> {
        match self {
            Grant::Any => Ok(()),
            Grant::Session(c) if c.opens(sid) => Ok(()),
            Grant::Session(c) if c.prefix => Err(ApiError::other_prefix(c.session())),
            Grant::Session(_) => Err(ApiError::other_session()),
        }
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

/// The API's settings and its one piece of state, the rate limiter.
pub struct Api {
    client_token: Option<String>,
    agent_token: Option<String>,
    /// Set: tokens for one session are taken too, and no role is open.
    token_secret: Option<token::Secret>,
    origins: Origins,
    trusted_proxies: Vec<IpAddr>,
    web: bool,
    metrics_token: Option<String>,
    max_connections: usize,
    limiter: RateLimiter,
    refusals: refusals::Refusals,
}

impl Api {
    /// The rules as configured.
    pub fn new(cfg: &Config) -> Api {
        Api {
            client_token: cfg.client_token.clone(),
            agent_token: cfg.agent_token.clone(),
            token_secret: cfg.token_secret.clone(),
            origins: cfg.cors_origins.clone(),
            trusted_proxies: cfg.trusted_proxies.clone(),
            web: cfg.web,
            metrics_token: cfg.metrics_token.clone(),
            max_connections: cfg.max_connections,
            limiter: RateLimiter::new(cfg.rate_limit),
            refusals: refusals::Refusals::default(),
        }
    }

    /// Forgets rate-limit buckets that refilled; called by the periodic sweep.
    pub fn sweep(&mut self, now: Millis) {
        self.limiter.sweep(now);
        self.refusals.flush(now);
    }

    /// The headers an answer to a request from `origin` carries: the
    /// allow-origin value (`*`, or the origin when it is on the list, with
    /// `Vary: Origin`), and whether the connection stays open.
    pub fn meta<'a>(&'a self, origin: Option<&'a str>, keep_alive: bool, facts: Facts) -> Meta<'a> {
        let (allow_origin, vary_origin) = match &self.origins {
            Origins::Any => (Some("*"), false),
            Origins::List(_) => (origin.filter(|o| self.origins.allows(o)), true),
        };
        Meta {
            keep_alive: keep_alive && !facts.shutting_down,
            http10: false,
            allow_origin,
            vary_origin,
            head_only: false,
        }
    }

    /// Handles one parsed request from connection `conn` at `peer`.
    #[allow(clippy::too_many_arguments)]
    pub fn handle(
        &mut self,
        relay: &mut Relay,
        turn: Turn,
        conn: ConnId,
        peer: IpAddr,
        head: &RequestHead,
        body: &[u8],
        facts: Facts,
    ) -> Outcome {
        match self.dispatch(relay, turn, conn, peer, head, body, facts) {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Answer(Answer::from(e)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        relay: &mut Relay,
        turn: Turn,
        conn: ConnId,
        peer: IpAddr,
        head: &RequestHead,
        body: &[u8],
        facts: Facts,
    ) -> Result<Outcome, ApiError> {
        let route = if !self.web && web_file(&head.path).is_some() {
            Route::NotFound // the page is off: its paths are unknown
        } else {
            route(head.method(), &head.path)?
        };
        if head.method() == Method::Post && self.limiter.enabled() {
            let client = client_addr(peer, head.forwarded_for.as_deref(), &self.trusted_proxies);
            if let Err(wait_s) = self.limiter.check(client, turn.now) {
                let mut a = Answer::from(ApiError::too_many_requests());
                a.extra = vec![("Retry-After", wait_s.to_string())];
                return Ok(Outcome::Answer(a));
            }
        }
        let grant = match self.authorize(&route, head, turn.unix_ms / 1000) {
            Ok(grant) => grant,
            Err(e) => {
                let client =
                    client_addr(peer, head.forwarded_for.as_deref(), &self.trusted_proxies);
                let label = crate::metrics::route_label(head.method(), &head.path);
                let need = role(&route).name();
                self.refusals.note(turn.now, label, need, e.status, client);
                return Err(e);
            }
        };
        let (now, unix_ms) = (turn.now, turn.unix_ms);
        let answer = match route {
            Route::Web(file) => web_answer(file, head.query.as_deref()),
            Route::Healthz => Answer::ok(healthz_body(relay, unix_ms, facts)),
            Route::Whoami => Answer::ok(self.whoami(head, unix_ms / 1000)?),
            Route::Readyz => self.readyz(relay, facts),
            Route::PostPrompt => {
                json_body(head)?;
                let p = NewPrompt::parse(body)?;
                grant.admits(&p.session_id)?;
                return Ok(reply(relay.write(now, unix_ms, conn, Write::Prompt(p))?));
            }
            Route::GetPrompts(sid) => {
                let q = prompts_query(head.query.as_deref())?;
                if !facts.synced && relay.sync_first_poll(conn, &sid, &q)? {
                    return Ok(Outcome::Wait);
                }
                match relay.get_prompts(now, conn, &sid, q)? {
                    Fetch::Ready(list) => Answer::shared(list),
                    Fetch::Park {
                        deadline,
                        sid: stored,
                    } => {
                        let sid = Some(stored.unwrap_or(sid));
                        return Ok(Outcome::Park { sid, deadline });
                    }
                }
            }
            Route::GetEveryPrompts => {
                let q = every_query(head.query.as_deref())?;
                if !facts.synced && relay.sync_first_every(conn) {
                    return Ok(Outcome::Wait);
                }
                match relay.get_every_prompts(now, conn, grant.scope(), q)? {
                    Fetch::Ready(list) => Answer::shared(list),
                    Fetch::Park { deadline, .. } => {
                        return Ok(Outcome::Park {
                            sid: None,
                            deadline,
                        });
                    }
                }
            }
            Route::PostResponse => {
                json_body(head)?;
                let r = NewResponse::parse(body)?;
                grant.admits(&r.session_id)?;
                return Ok(reply(relay.write(now, unix_ms, conn, Write::answer(r))?));
            }
            Route::PostCancel => {
                json_body(head)?;
                let c = NewCancel::parse(body)?;
                grant.admits(&c.session_id)?;
                return Ok(reply(relay.write(now, unix_ms, conn, Write::Cancel(c))?));
            }
            Route::WebSocket(sid) => {
                return self.upgrade(relay, now, conn, head, sid, facts.synced);
            }
            Route::Metrics => return Ok(Outcome::Metrics),
            Route::Messages(sid) => {
                let q = messages_query(head.query.as_deref())?;
                if !facts.synced && relay.sync_first(conn, &sid)? {
                    return Ok(Outcome::Wait);
                }
                Answer::ok(relay.messages(now, &sid, q)?)
            }
            Route::DeleteAgent(sid) => {
                if !facts.synced && relay.sync_first(conn, &sid)? {
                    return Ok(Outcome::Wait);
                }
                Answer::ok(relay.agent_stopped(now, &sid)?)
            }
            Route::DeleteAgentEvery => Answer::ok(relay.agent_stopped_every(now, &grant.scope())),
            Route::GetSession(sid) => {
                if !facts.synced && relay.sync_first(conn, &sid)? {
                    return Ok(Outcome::Wait);
                }
                Answer::ok(relay.session_info(now, &sid)?)
            }
            Route::PutSession(sid) => {
                let w = Write::Create {
                    sid: Cow::Borrowed(&sid),
                    put: true,
                };
                return Ok(reply(relay.write(now, unix_ms, conn, w)?));
            }
            Route::DeleteSession(sid) => {
                let w = Write::Delete {
                    sid: Cow::Borrowed(&sid),
                };
                return Ok(reply(relay.write(now, unix_ms, conn, w)?));
            }
            Route::PostAsk => {
                json_body(head)?;
                let a = NewAsk::parse(body)?;
                grant.admits(&a.session_id)?;
                return Ok(reply(relay.write(now, unix_ms, conn, Write::Ask(a))?));
            }
            Route::PostReply => {
                json_body(head)?;
                let r = NewReply::parse(body)?;
                grant.admits(&r.session_id)?;
                return Ok(reply(relay.write(now, unix_ms, conn, Write::Reply(r))?));
            }
            Route::GetAsk(sid, ask_id) => {
                let q = prompts_query(head.query.as_deref())?;
                if !facts.synced && relay.sync_first(conn, &sid)? {
                    return Ok(Outcome::Wait);
                }
                match relay.get_ask(now, unix_ms, conn, &sid, &ask_id, &q)? {
                    AskFetch::Ready(body) => Answer::ok(body),
                    AskFetch::Park {
                        deadline,
                        expires_at,
                        expires_ts,
                    } => {
                        return Ok(Outcome::ParkAsk {
                            sid,
                            ask_id,
                            deadline,
                            expires_at,
                            expires_ts,
                        });
                    }
                }
            }
            Route::Preflight { allow } => preflight(allow),
            Route::MethodNotAllowed { allow } => {
                let mut a = Answer::from(ApiError::method_not_allowed());
                a.extra.push(("Allow", allow.to_string()));
                a
            }
            Route::NotFound => Answer::from(ApiError::not_found()),
        };
        Ok(Outcome::Answer(answer))
    }

    /// Checks a WebSocket upgrade and registers the subscriber.
    fn upgrade(
        &mut self,
        relay: &mut Relay,
        now: Millis,
        conn: ConnId,
        head: &RequestHead,
        sid: SessionId,
        synced: bool,
    ) -> Result<Outcome, ApiError> {
        let accept = upgrade::check(head, &self.origins)?;
        let query = head.query.as_deref();
        let after = uint_param(query, "after")?.map(Seq);
        let epoch = query_param(query, "epoch")?;
        if !synced && relay.sync_first_listening(conn, &sid)? {
            return Ok(Outcome::Wait);
        }
        let Some(cursor) = relay.subscribe(now, conn, &sid, after, epoch.as_deref())? else {
            // The session is being created: the upgrade runs again then.
            return Ok(Outcome::Wait);
        };
        Ok(Outcome::Upgrade {
            accept,
            sid: relay.stored_id(sid),
            cursor,
            after,
        })
    }

    /// Checks the token the route's role needs, and says what it opened.
    /// A server-wide token opens the role's endpoints in every session; a
    /// token for one session (with a token secret set) only its role's,
    /// in its session: checked here when the path names the session, by
    /// the returned [`Grant`] once a `POST` body names it. A role whose
    /// server-wide token is unset is open, unless a token secret is set.
    /// A WebSocket may pass its token as the subprotocol `bearer.<token>`
    /// or as `?token=` (browsers cannot set headers there); a header, when
    /// present, wins, then the subprotocol. Called once per request, before
    /// anything is read or changed; `unix_s` is the turn's clock.
    fn authorize(&self, route: &Route, head: &RequestHead, unix_s: u64) -> Result<Grant, ApiError> {
        let need = role(route);
        let client = self.client_token.as_deref();
        let agent = self.agent_token.as_deref();
        let wanted: Vec<&str> = match need {
            Role::Open => return Ok(Grant::Any),
            Role::Client => client.into_iter().collect(),
            Role::Agent => agent.into_iter().collect(),
            Role::Metrics => self.metrics_token.as_deref().into_iter().collect(),
            Role::Either => match (client, agent) {
                (Some(c), Some(a)) => vec![c, a],
                _ => Vec::new(),
            },
            // Open while the client role is; else the client token, and
            // the agent token when one is set (an unset agent token opens
            // nothing more here).
            Role::Watch => match client {
                Some(c) => [Some(c), agent].into_iter().flatten().collect(),
                None => Vec::new(),
            },
        };
        let secret = self.token_secret.as_ref().filter(|_| need != Role::Metrics);
        if wanted.is_empty() && secret.is_none() {
            return Ok(Grant::Any);
        }
        let refused = || {
            debug!("unauthorized");
            ApiError::unauthorized(need.needed())
        };
        let bearer = head.authorization.as_deref().and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .map(str::trim)
        });
        let query_token;
        let presented = match (bearer, route) {
            (Some(t), _) => t,
            (None, Route::WebSocket(_)) => match upgrade::subprotocol_token(head) {
                Some(t) => t,
                None => {
                    query_token = query_param(head.query.as_deref(), "token").ok().flatten();
                    query_token.as_deref().ok_or_else(refused)?
                }
            },
            (None, _) => return Err(refused()),
        };
        let server_wide = wanted.iter().fold(false, |acc, w| {
            acc | constant_time_eq(presented.as_bytes(), w.as_bytes())
        });
        if server_wide {
            return Ok(Grant::Any);
        }
        let Some(secret) = secret else {
            return Err(refused());
        };
        let claims = check_session_token(secret, presented, need, unix_s)?;
        match route_session(route) {
            Some(sid) => Grant::Session(claims).admits(sid).map(|()| Grant::Any),
            None => Ok(Grant::Session(claims)),
        }
    }

    /// `GET /whoami`: what the presented token opens, for a page that
    /// must know where it may create a session. A server-wide token
    /// answers its role (`both` when it serves both, or when the other
    /// role is open), a token for one session or a prefix its role, its
    /// session or prefix and its expiry (`expires_ts`, ms); no token, or
    /// one that opens nothing, answers the open roles, or `401` when none
    /// is open.
    fn whoami(&self, head: &RequestHead, unix_s: u64) -> Result<Vec<u8>, ApiError> {
        let locked = self.token_secret.is_some();
        let client_open = self.client_token.is_none() && !locked;
        let agent_open = self.agent_token.is_none() && !locked;
        let presented = head.authorization.as_deref().and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .map(str::trim)
        });
        let is = |t: Option<&str>, p: &str| {
            t.is_some_and(|t| constant_time_eq(p.as_bytes(), t.as_bytes()))
        };
        let mut out = String::with_capacity(96);
        let (client, agent) = match presented {
            Some(p)
                if is(self.client_token.as_deref(), p) || is(self.agent_token.as_deref(), p) =>
            {
                (
                    client_open || is(self.client_token.as_deref(), p),
                    agent_open || is(self.agent_token.as_deref(), p),
                )
            }
            Some(p) if self.token_secret.is_some() => {
                let need = Role::Either;
                let secret = self
                    .token_secret
                    .as_ref()
                    .ok_or_else(|| ApiError::unauthorized(need.needed()))?;
                let c = check_session_token(secret, p, need, unix_s)?;
                out.push_str(if c.prefix {
                    ",\"prefix\":"
                } else {
                    ",\"session\":"
                });
                crate::wire::push_json_str(&mut out, c.session());
                if let Some(at) = c.expires {
                    out.push_str(",\"expires_ts\":");
                    crate::wire::push_decimal_str(&mut out, at.saturating_mul(1000));
                }
                (c.role == token::Role::Client, c.role == token::Role::Agent)
            }
            _ => (client_open, agent_open),
        };
        let role = match (client, agent) {
            (true, true) => "both",
            (true, false) => "client",
            (false, true) => "agent",
            (false, false) => return Err(ApiError::unauthorized(Role::Either.needed())),
        };
        Ok(format!("{{\"role\":\"{role}\"{out}}}").into_bytes())
    }

    /// `/readyz`: `503` with the reason while shutting down or a cap is full.
    fn readyz(&self, relay: &Relay, facts: Facts) -> Answer {
        let reason = if facts.shutting_down {
            Some("shutting down")
        } else if facts.connections >= self.max_connections {
            Some("connection limit reached")
        } else if relay.sessions_full() {
            Some("session limit reached")
        } else if !relay.storage_ok() {
            Some("storage")
        } else if relay.memory_full() {
            Some("memory")
        } else {
            None
        };
        match reason {
            None => Answer::ok(b"{\"ready\":true}".to_vec()),
            Some(r) => Answer {
                status: 503,
                reason: Some(r.to_string()),
                ..Answer::ok(format!("{{\"ready\":false,\"reason\":\"{r}\"}}").into_bytes())
            },
        }
    }
}

/// Checks a token for one session against the role a route needs, at
/// `unix_s`: `401` when it is not one the secret signed, has expired, or is
/// for the other role; otherwise what it says, for the session check. No
/// lookup: the secret alone decides, comparing the tag in constant time.
fn check_session_token(
    secret: &token::Secret,
    presented: &str,
    need: Role,
    unix_s: u64,
) -> Result<token::Claims, ApiError> {
    let Ok(claims) = secret.open(presented) else {
        debug!("unauthorized: not a valid token");
        return Err(ApiError::unauthorized(need.needed()));
    };
    if claims.expired(unix_s) {
        debug!("unauthorized: token expired");
        return Err(ApiError::token_expired());
    }
    if !need.takes(claims.role) {
        debug!(role = claims.role.as_str(); "unauthorized: token for the other role");
        return Err(ApiError::unauthorized(need.needed()));
    }
    Ok(claims)
}

/// A write's reply as an outcome.
fn reply(r: Reply) -> Outcome {
    match r {
        Reply::Now(body) => Outcome::Answer(Answer::ok(body)),
        Reply::Wait => Outcome::Wait,
    }
}

/// `POST` bodies must be JSON: a foreign web page cannot send that without
/// a CORS preflight.
fn json_body(head: &RequestHead) -> Result<(), ApiError> {
    if head.json {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type())
    }
}

/// `/healthz`: liveness with the counters.
fn healthz_body(relay: &Relay, unix_ms: u64, facts: Facts) -> Vec<u8> {
    let c = relay.counts();
    format!(
        "{{\"ok\":true,\"timestamp\":{unix_ms},\"sessions\":{},\"connections\":{},\"subscribers\":{},\"parked_polls\":{}}}",
        c.sessions, facts.connections, c.subscribers, c.parked_polls
    )
    .into_bytes()
}

/// The `204` answer to a CORS preflight.
fn preflight(allow: &'static str) -> Answer {
    Answer {
        status: 204,
        extra: vec![
            ("Access-Control-Allow-Methods", allow.to_string()),
            (
                "Access-Control-Allow-Headers",
                "Content-Type, Authorization".to_string(),
            ),
            ("Access-Control-Max-Age", "86400".to_string()),
        ],
        ..Answer::ok(Vec::new())
    }
}

/// The chat page or one of its files, from the binary; the manifest
/// names in its start URL the session `?session=` gives.
fn web_answer(file: WebFile, query: Option<&str>) -> Answer {
    let (content_type, body) = match file {
        WebFile::Page => (web::CONTENT_TYPE, Body::Static(web::PAGE)),
        WebFile::Manifest => (
            web::MANIFEST_TYPE,
            Body::Owned(web::manifest(
                query_param(query, "session")
                    .ok()
                    .flatten()
                    .and_then(|s| SessionId::new(&s))
                    .as_ref()
                    .map(SessionId::as_str),
            )),
        ),
        WebFile::Worker => ("text/javascript; charset=utf-8", Body::Static(web::WORKER)),
        WebFile::IconSvg => ("image/svg+xml", Body::Static(web::ICON_SVG)),
        WebFile::IconPng => ("image/png", Body::Static(web::ICON_PNG)),
    };
    let csp = match file {
        WebFile::Page => web::csp(),
        WebFile::Worker => web::WORKER_CSP,
        _ => web::FILE_CSP,
    };
    Answer {
        status: 200,
        content_type,
        body,
        extra: web::headers(csp)
            .iter()
            .map(|&(k, v)| (k, v.to_string()))
            .collect(),
        reason: None,
    }
}

mod refusals;

#[cfg(test)]
mod tests;
