//! A well-behaved client of one session, for tests that check the server
//! keeps serving it while others misbehave.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Http, Server, Ws, unique_session};

/// The web client, the agent and a reading WebSocket subscriber of one
/// session, each on its own kept connection, all opened up front (new
/// connections may be refused while abusers hold the cap).
pub struct Good {
    pub sid: String,
    pub client: Http,
    pub agent: Http,
    pub ws: Ws,
    /// Round trips done so far.
    pub rounds: u32,
    /// The longest round trip so far.
    pub slowest: Duration,
}

impl Good {
    #[track_caller]
    pub fn new(srv: &Server) -> Good {
        let sid = unique_session();
        let ws = srv.ws(&format!("/ws/{sid}"));
        Good {
            sid,
            client: srv.conn(),
            agent: srv.conn(),
            ws,
            rounds: 0,
            slowest: Duration::ZERO,
        }
    }

    #[track_caller]
    pub fn health(&mut self) -> Value {
        let r = self.client.request("GET", "/healthz", &[], None);
        assert_eq!(r.status, 200, "/healthz for the good client: {}", r.text());
        r.json()
    }

    /// prompt -> long-poll -> response -> WebSocket, all on the kept
    /// connections; each read is bounded by the harness's 10 s timeout, so
    /// a starved loop fails the test.
    #[track_caller]
    pub fn round_trip(&mut self) {
        let t = Instant::now();
        self.rounds += 1;
        let id = format!("good-{}", self.rounds);
        let text = format!("answer {}", self.rounds);
        let sid = self.sid.clone();
        self.agent
            .send("GET", &format!("/prompts/{sid}?timeout=20"), &[], None);
        let p = json!({"session_id": sid, "prompt": "hello", "client_msg_id": id});
        let r = self.client.post_json("/prompt", &p);
        assert_eq!(r.status, 200, "good prompt: {}", r.text());
        let polled = self.agent.read_response();
        assert_eq!(polled.status, 200, "good long-poll: {}", polled.text());
        assert_eq!(polled.json()[0]["client_msg_id"], id.as_str());
        let a = json!({"session_id": sid, "client_msg_id": id, "text": text});
        let r = self.agent.post_json("/response", &a);
        assert_eq!(r.status, 200, "good response: {}", r.text());
        assert_eq!(r.json()["delivered"], true);
        let f = self.ws.recv_json_skip_pings();
        assert_eq!(f["data"]["text"], text.as_str(), "{f}");
        assert_eq!(f["data"]["client_msg_id"], id.as_str(), "{f}");
        self.slowest = self.slowest.max(t.elapsed());
    }

    /// Round trips for `span`, at least `min` of them.
    #[track_caller]
    pub fn keep_going(&mut self, span: Duration, min: u32) {
        let until = Instant::now() + span;
        let start = self.rounds;
        while Instant::now() < until || self.rounds - start < min {
            self.round_trip();
        }
    }
}
