//! Every error the API answers with, as a value carrying its status. All the
//! contract's error strings live here, so a reader finds them in one place.

use std::borrow::Cow;

/// An error answer: `{"error": …, "details": …}` with an HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub error: Cow<'static, str>,
    pub details: Option<String>,
}

pub const SIZE_LIMIT: &str = "Message exceeds size limit";
/// The `details` of every `Invalid session_id`.
pub const SESSION_ID_RULE: &str = "1 to 128 characters from A-Z a-z 0-9 . _ ~ -";

impl ApiError {
    fn new(status: u16, error: impl Into<Cow<'static, str>>) -> ApiError {
        ApiError {
            status,
            error: error.into(),
            details: None,
        }
    }

    /// Adds the optional `details` text.
    pub fn with_details(mut self, details: impl Into<String>) -> ApiError {
        self.details = Some(details.into());
        self
    }

    pub fn bad_request(error: impl Into<Cow<'static, str>>) -> ApiError {
        ApiError::new(400, error)
    }
    pub fn invalid_json(details: impl Into<String>) -> ApiError {
        ApiError::new(400, "Invalid JSON").with_details(details)
    }
    pub fn missing_field(field: &str) -> ApiError {
        ApiError::new(400, format!("Missing required field: {field}"))
    }
    /// The `error` text stays exactly the contract's; `details` gives the rule,
    /// so a client that sent a `/` or 200 characters learns what to change.
    pub fn invalid_session_id() -> ApiError {
        ApiError::new(400, "Invalid session_id").with_details(SESSION_ID_RULE)
    }
    /// `metadata` too deep or holding a number that is not a finite float.
    pub fn invalid_metadata(why: &'static str) -> ApiError {
        ApiError::new(400, "Invalid metadata").with_details(why)
    }
    pub fn too_large_field() -> ApiError {
        ApiError::new(400, SIZE_LIMIT)
    }
    pub fn body_too_large() -> ApiError {
        ApiError::new(413, SIZE_LIMIT)
    }
    /// `401`; `needed` says which token the endpoint takes
    /// (`client token required`).
    pub fn unauthorized(needed: &'static str) -> ApiError {
        ApiError::new(401, "Unauthorized").with_details(needed)
    }
    /// `401` for a token for one session that has expired.
    pub fn token_expired() -> ApiError {
        ApiError::new(401, "Unauthorized").with_details("token expired")
    }
    /// `403` for a valid token for the sessions under `prefix` used on
    /// another session.
    pub fn other_prefix(prefix: &str) -> ApiError {
        ApiError::new(403, "Forbidden")
            .with_details(format!("token is for sessions starting with {prefix}"))
    }
    /// `403` for a valid token for one session used on another.
    pub fn other_session() -> ApiError {
        ApiError::new(403, "Forbidden").with_details("token is for another session")
    }
    pub fn forbidden_origin() -> ApiError {
        ApiError::new(403, "Origin not allowed")
    }
    pub fn not_found() -> ApiError {
        ApiError::new(404, "Not found")
    }
    pub fn session_not_found() -> ApiError {
        ApiError::new(404, "Session not found")
    }
    pub fn prompt_not_found() -> ApiError {
        ApiError::new(404, "Prompt not found")
    }
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(405, "Method not allowed")
    }
    pub fn timeout() -> ApiError {
        ApiError::new(408, "Request timeout")
    }
    pub fn conflict() -> ApiError {
        ApiError::new(409, "Conflict").with_details("assistant_msg_id already used")
    }
    /// A `client_msg_id` sent again with another prompt text.
    pub fn prompt_conflict() -> ApiError {
        ApiError::new(409, "Conflict").with_details("client_msg_id already used")
    }
    /// A cancel of a prompt whose final answer is stored.
    pub fn prompt_answered() -> ApiError {
        ApiError::new(409, "Conflict").with_details("prompt already answered")
    }
    /// An answer, final or partial, to a cancelled prompt.
    pub fn prompt_cancelled() -> ApiError {
        ApiError::new(409, "Conflict").with_details("prompt cancelled")
    }
    pub fn unsupported_media_type() -> ApiError {
        ApiError::new(415, "Content-Type must be application/json")
    }
    pub fn too_many_requests() -> ApiError {
        ApiError::new(429, "Too many requests")
    }
    pub fn head_too_large() -> ApiError {
        ApiError::new(431, "Request header fields too large")
    }
    /// A write the storage could not make durable (disk full, I/O error).
    pub fn storage_unavailable() -> ApiError {
        ApiError::new(503, "Storage unavailable")
    }
    /// A write handed to the storage whose fate is not known when it must be
    /// answered (shutdown before the disk confirmed it, or the connection to
    /// Redis lost after the write was sent): it may or may not be stored.
    /// Resending it with the same id is safe and tells which.
    pub fn storage_uncertain(why: &str) -> ApiError {
        ApiError::new(504, "Storage timeout").with_details(format!(
            "{why}; it may have been stored: resend it with the same id to know"
        ))
    }

    /// A stored message read back damaged (not UTF-8, or not a JSON
    /// object): the page that would carry it is not sent.
    pub fn stored_message_damaged(seq: u64) -> ApiError {
        ApiError::new(500, "Stored message damaged").with_details(format!("seq {seq}"))
    }
    /// A plain HTTP request on the TLS port (the connection closes after
    /// it); `host` is the `Host` it named, when that is a plain name, so
    /// the answer gives the URL to use.
    pub fn https_required(host: Option<&str>) -> ApiError {
        let details = match host {
            Some(host) => format!("this port speaks HTTPS: use https://{host}/"),
            None => "this port speaks HTTPS: use an https:// URL".to_string(),
        };
        ApiError::new(400, "Bad Request").with_details(details)
    }
    pub fn unavailable(reason: &'static str) -> ApiError {
        ApiError::new(503, "Service unavailable").with_details(reason)
    }

    /// A write that would pass the memory budget (contract, "Memory
    /// budget", spells its error with a capital U).
    pub fn memory_budget() -> ApiError {
        ApiError::new(503, "Service Unavailable").with_details("memory budget reached")
    }

    /// `POST /reply` or `GET /asks` naming no ask the session knows.
    pub fn ask_not_found() -> ApiError {
        ApiError::new(404, "Ask not found")
    }
    /// An `ask_id` sent again with another text or other choices.
    pub fn ask_conflict() -> ApiError {
        ApiError::new(409, "Conflict").with_details("ask_id already used")
    }
    /// A reply with another text than the one that answered the ask.
    pub fn ask_answered() -> ApiError {
        ApiError::new(409, "Conflict").with_details("ask already answered")
    }
    /// A reply after the ask's `expires_ts`.
    pub fn ask_expired() -> ApiError {
        ApiError::new(409, "Conflict").with_details("ask expired")
    }
    /// A reply to an ask with choices that is none of them.
    pub fn invalid_reply() -> ApiError {
        ApiError::new(400, "Invalid reply").with_details("not one of the choices")
    }

    /// The JSON body of this error.
    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            error: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            details: Option<&'a str>,
        }
        serde_json::to_vec(&Body {
            error: &self.error,
            details: self.details.as_deref(),
        })
        .unwrap_or_default()
    }
}
