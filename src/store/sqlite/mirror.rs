//! The storage thread's picture of what the database holds, kept in memory
//! so that a write is decided without reading the database: which sessions
//! exist, their next `seq`, the ids of the dedupe window, the pending count,
//! and where each retained message's row is.
//!
//! It follows the in-memory log's rules exactly (`store::log`): a prompt
//! stays known while pending or in history, an answer while in history;
//! history keeps the newest `history_limit` messages. What history drops
//! becomes garbage: rows the database still holds, deleted in bulk later
//! ([`Mirror::take_garbage`]), because a row deleted at once would dirty a
//! page of its own in every commit.
//!
//! It is built by replaying the rows in insertion order (the same replay
//! that restores the loop's copy), and rebuilt that way after a transaction
//! rolls back, so a failed commit never leaves it ahead of the file.

use std::collections::VecDeque;
use std::rc::Rc;

use crate::store::idmap::{IdMap, KeyHash};
use crate::store::message::Kind;

/// A retained message: its `seq`, its row, and its own id (a prompt's
/// `client_msg_id`, an answer's `assistant_msg_id`).
struct Entry {
    seq: u64,
    row: i64,
    kind: Kind,
    id: Rc<str>,
}

/// What the dedupe window knows about a prompt.
pub struct Prompt {
    row: i64,
    answered: bool,
    in_history: bool,
}

impl Prompt {
    /// Its row, while the database still holds it (pending or in history).
    pub fn row(&self) -> Option<i64> {
        (self.in_history || !self.answered).then_some(self.row)
    }
}

/// What the dedupe window knows about an answer.
pub struct Answer {
    pub client_msg_id: Rc<str>,
    pub row: i64,
}

/// One session as the database holds it.
pub struct Session {
    /// The session id (the map's key, shared).
    name: Rc<str>,
    /// The `sessions` row.
    pub id: i64,
    pub epoch: String,
    pub next_seq: u64,
    pub last_assistant: u64,
    pub dropped_assistant: u64,
    history: VecDeque<Entry>,
    prompts: IdMap<Prompt>,
    answers: IdMap<Answer>,
    pending: usize,
    /// Rows of this session went to the garbage since its counters were
    /// last written (it is then in `Garbage::sessions`): they are written
    /// when those rows are deleted.
    dirty: bool,
}

impl Session {
    /// A session with its stored counters, its messages to be replayed.
    pub fn new(
        name: &str,
        id: i64,
        epoch: String,
        next_seq: u64,
        last_assistant: u64,
        dropped_assistant: u64,
    ) -> Session {
        Session {
            name: Rc::from(name),
            id,
            epoch,
            next_seq,
            last_assistant,
            dropped_assistant,
            history: VecDeque::new(),
            prompts: IdMap::new(),
            answers: IdMap::new(),
            pending: 0,
            dirty: false,
        }
    }

    /// Unanswered prompts.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// The prompt with this id, while pending or in history.
    pub fn prompt(&self, client_msg_id: &str) -> Option<(&Rc<str>, &Prompt)> {
        self.prompts.get_key_value(client_msg_id)
    }

    /// A prompt id's hash in this session, for [`Session::prompt_hashed`]
    /// and [`Mirror::append_prompt`]: a new prompt's id is hashed once.
    pub fn prompt_hash(&self, client_msg_id: &str) -> KeyHash {
        self.prompts.hash_of(client_msg_id)
    }

    /// [`Session::prompt`] with the id's hash.
    pub fn prompt_hashed(&self, hash: KeyHash, client_msg_id: &str) -> Option<&Prompt> {
        self.prompts.get_hashed(hash, client_msg_id).map(|(_, p)| p)
    }

    /// The answer with this id, while in history.
    pub fn answer(&self, assistant_msg_id: &str) -> Option<&Answer> {
        self.answers.get(assistant_msg_id)
    }

    /// Every row the session still needs (history and the pending prompts
    /// history dropped): what deleting it deletes.
    pub fn rows(&self) -> Vec<i64> {
        let mut rows: Vec<i64> = self.history.iter().map(|e| e.row).collect();
        rows.extend(
            self.prompts
                .values()
                .filter(|p| !p.in_history)
                .map(|p| p.row),
        );
        rows
    }
}

/// Rows waiting to be deleted, and the sessions that dropped them since
/// the last collection (their counters are written with the deletion).
#[derive(Default)]
struct Garbage {
    rows: Vec<i64>,
    sessions: Vec<Rc<str>>,
}

impl Garbage {
    /// A row `s` no longer needs.
    fn drop_row(&mut self, s: &mut Session, row: i64) {
        self.rows.push(row);
        if !s.dirty {
            s.dirty = true;
            self.sessions.push(s.name.clone());
        }
    }
}

/// Every session, by id, and the rows waiting to be deleted.
pub struct Mirror {
    history_limit: usize,
    sessions: IdMap<Session>,
    garbage: Garbage,
}

/// Where a session is in the mirror ([`Mirror::find`]): found once per
/// command, without hashing and comparing its id again. Valid until a
/// session is created or removed.
#[derive(Clone, Copy, Debug)]
pub struct At(usize);

impl Mirror {
    /// An empty mirror for this history limit.
    pub fn new(history_limit: usize) -> Mirror {
        Mirror {
            history_limit,
            sessions: IdMap::new(),
            garbage: Garbage::default(),
        }
    }

    /// Sessions stored.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn get(&self, sid: &str) -> Option<&Session> {
        self.sessions.get(sid)
    }

    pub fn find(&self, sid: &str) -> Option<At> {
        self.sessions.index_of(sid).map(At)
    }

    pub fn at(&self, at: At) -> Option<&Session> {
        self.sessions.at(at.0)
    }

    pub fn insert(&mut self, s: Session) {
        self.sessions.insert(s.name.clone(), s);
    }

    pub fn remove(&mut self, sid: &str) -> Option<Session> {
        self.sessions.remove(sid)
    }

    /// Appends a stored prompt (row `row`, id `id` of hash `hash` in its
    /// session: [`Session::prompt_hash`]) to its session.
    pub fn append_prompt(&mut self, at: At, seq: u64, row: i64, id: &str, hash: KeyHash) {
        let Some(s) = self.sessions.at_mut(at.0) else {
            return;
        };
        let id: Rc<str> = Rc::from(id);
        let p = Prompt {
            row,
            answered: false,
            in_history: true,
        };
        s.prompts.insert_hashed(hash, id.clone(), p);
        s.pending += 1;
        push(
            s,
            &mut self.garbage,
            self.history_limit,
            seq,
            row,
            Kind::Prompt,
            id,
        );
    }

    /// Appends a stored answer (row `row`) to `prompt`'s session and marks
    /// the prompt answered.
    pub fn append_answer(&mut self, at: At, seq: u64, row: i64, prompt: &str, id: &str) {
        let Some(s) = self.sessions.at_mut(at.0) else {
            return;
        };
        s.last_assistant = seq;
        if let Some(p) = s.prompts.get_mut(prompt)
            && !p.answered
        {
            p.answered = true;
            s.pending -= 1;
            if !p.in_history {
                let row = p.row;
                s.prompts.remove(prompt);
                self.garbage.drop_row(s, row);
            }
        }
        let id: Rc<str> = Rc::from(id);
        let cid = s
            .prompts
            .get_key_value(prompt)
            .map_or_else(|| Rc::from(prompt), |(k, _)| k.clone());
        s.answers.insert(
            id.clone(),
            Answer {
                client_msg_id: cid,
                row,
            },
        );
        push(
            s,
            &mut self.garbage,
            self.history_limit,
            seq,
            row,
            Kind::Assistant,
            id,
        );
    }

    /// Replays one stored row (insertion order).
    pub fn replay(&mut self, sid: &str, row: i64, seq: u64, kind: Kind, cid: &str, aid: &str) {
        let Some(at) = self.find(sid) else {
            return;
        };
        match kind {
            Kind::Prompt => {
                let Some(hash) = self.at(at).map(|s| s.prompt_hash(cid)) else {
                    return;
                };
                self.append_prompt(at, seq, row, cid, hash)
            }
            Kind::Assistant => self.append_answer(at, seq, row, cid, aid),
        }
    }

    /// A row of no session (one deleted before its garbage was collected).
    pub fn orphan(&mut self, row: i64) {
        self.garbage.rows.push(row);
    }

    /// Rows waiting to be deleted.
    pub fn garbage(&self) -> usize {
        self.garbage.rows.len()
    }

    /// The rows to delete now, and the sessions whose counters must be
    /// written with them (the counters then cover every deleted row).
    pub fn take_garbage(&mut self) -> (Vec<i64>, Vec<&Session>) {
        let Garbage { rows, sessions } = std::mem::take(&mut self.garbage);
        for name in &sessions {
            if let Some(s) = self.sessions.get_mut(name) {
                s.dirty = false;
            }
        }
        // A session deleted since is gone, and needs no counters.
        let dirty = sessions
            .iter()
            .filter_map(|name| self.sessions.get(name))
            .collect();
        (rows, dirty)
    }
}

/// Appends to history and drops the oldest entries past `limit`, as
/// `SessionLog::push_history` does; dropped rows nothing keeps go to the
/// garbage.
fn push(
    s: &mut Session,
    garbage: &mut Garbage,
    limit: usize,
    seq: u64,
    row: i64,
    kind: Kind,
    id: Rc<str>,
) {
    s.next_seq = s.next_seq.max(seq + 1);
    s.history.push_back(Entry { seq, row, kind, id });
    while s.history.len() > limit {
        let Some(old) = s.history.pop_front() else {
            break;
        };
        match old.kind {
            Kind::Prompt => {
                let answered = s.prompts.get_mut(&old.id).is_some_and(|p| {
                    p.in_history = false;
                    p.answered
                });
                if answered {
                    s.prompts.remove(&old.id);
                } else {
                    // A pending prompt outlives its place in history.
                    continue;
                }
            }
            Kind::Assistant => {
                s.dropped_assistant = s.dropped_assistant.max(old.seq);
                s.answers.remove(&old.id);
            }
        }
        garbage.drop_row(s, old.row);
    }
}
