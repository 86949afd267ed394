//! The simulated clients' steps, drawn from a seeded generator. A step
//! names what a client does, never the state it finds: which parked poll
//! hangs up or which subscriber reads is a number taken modulo what
//! exists when the step runs, so any subsequence of a run is a run too
//! (the shrinker drops steps freely).

use std::fmt;

/// Sessions the clients touch: few, so every step meets the others' work.
pub const SESSIONS: u64 = 3;
/// Sessions the clients of a spread run touch ([`Op::spread`]): enough
/// that some are idle at any time, so a small memory budget drops them
/// from memory and their next use reads them back.
pub const WIDE_SESSIONS: u64 = 9;
/// One step in this many of a spread run restarts the relay, and of a
/// run that loses its write-ahead log ([`Op::crash`]) crashes it.
pub const RESTART_ONE_IN: u64 = 500;
/// The most committed transactions a crash loses with the log.
const LOST_AT_MOST: u64 = 3;
/// `client_msg_id`s drawn: reused all the time (duplicates, conflicts,
/// answers to prompts answered, cancelled or trimmed already).
const PROMPT_IDS: u64 = 6;
const ANSWER_IDS: u64 = 5;
const ASK_IDS: u64 = 4;
const TEXTS: u64 = 3;

/// splitmix64: a seed means the same run on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn maybe(&mut self, n: u64) -> Option<u64> {
        (self.below(3) > 0).then(|| self.below(n))
    }
}

/// How a subscriber's client reads its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Everything, at the end of every step.
    Fast,
    /// Only at its `Read` steps.
    Slow,
    /// Never again (until it hangs up and reconnects).
    Stopped,
}

/// One step of the simulated world.
#[derive(Clone, Debug)]
pub enum Op {
    Prompt {
        s: u64,
        id: u64,
        text: u64,
    },
    /// A final answer to prompt `c<prompt>`; `id: None` lets the server
    /// name it.
    Answer {
        s: u64,
        prompt: u64,
        id: Option<u64>,
        text: u64,
    },
    /// A part of a streamed answer.
    Part {
        s: u64,
        prompt: u64,
        id: u64,
        text: u64,
    },
    Cancel {
        s: u64,
        prompt: u64,
    },
    Ask {
        s: u64,
        id: u64,
        text: u64,
    },
    Reply {
        s: u64,
        ask: u64,
        text: u64,
    },
    /// `GET /prompts/{s}`: parks for `timeout_s` unless prompts are
    /// pending (`after` from the model's pending set when `Some`).
    Poll {
        s: u64,
        after: Option<u64>,
        timeout_s: u64,
    },
    /// `GET /prompts/{s}?wait=false`.
    PollNow {
        s: u64,
    },
    /// `GET /prompts`: every session, parked or not.
    PollEvery {
        timeout_s: u64,
    },
    /// `GET /asks/{s}/k<ask>`, parked up to `timeout_s`.
    AskPoll {
        s: u64,
        ask: u64,
        timeout_s: u64,
    },
    /// A parked request's client hangs up.
    Hangup {
        pick: u64,
    },
    /// A WebSocket: live only, or resuming where an earlier subscriber
    /// of the session stopped (`after` and `epoch`).
    Subscribe {
        s: u64,
        resume: Option<u64>,
        reading: Reading,
    },
    /// A subscriber's client reads up to `frames` frames.
    Read {
        pick: u64,
        frames: u64,
    },
    /// A subscriber changes how it reads.
    SetReading {
        pick: u64,
        reading: Reading,
    },
    /// A subscriber's client closes its socket.
    Unsubscribe {
        pick: u64,
    },
    Messages {
        s: u64,
    },
    Put {
        s: u64,
    },
    Delete {
        s: u64,
    },
    /// The storage (with a data directory) takes up to `take` commands
    /// into one transaction, which commits or (`fail`) rolls back.
    Storage {
        take: u64,
        fail: bool,
    },
    /// The clock moves on by `ms`, firing every deadline on the way.
    Advance {
        ms: u64,
    },
    /// The relay restarts with its data directory ([`Op::spread`] and
    /// [`Op::crash`] runs only): every connection is closed, what the
    /// storage had not committed is lost, and the new relay reads no
    /// session at start. `lose`: the last committed transactions lost too,
    /// as with `relay.db-wal` deleted after a crash, while the side file
    /// `relay.generation` still counts them.
    Restart {
        lose: u64,
    },
}

fn reading(rng: &mut Rng) -> Reading {
    match rng.below(4) {
        0 | 1 => Reading::Fast,
        2 => Reading::Slow,
        _ => Reading::Stopped,
    }
}

/// The steps that name a session, binding it to `$s`: one list for
/// reading the session and for moving a step to another.
macro_rules! session_op {
    ($s:ident) => {
        Op::Prompt { s: $s, .. }
            | Op::Answer { s: $s, .. }
            | Op::Part { s: $s, .. }
            | Op::Cancel { s: $s, .. }
            | Op::Ask { s: $s, .. }
            | Op::Reply { s: $s, .. }
            | Op::Poll { s: $s, .. }
            | Op::PollNow { s: $s }
            | Op::AskPoll { s: $s, .. }
            | Op::Subscribe { s: $s, .. }
            | Op::Messages { s: $s }
            | Op::Put { s: $s }
            | Op::Delete { s: $s }
    };
}

impl Op {
    /// One step drawn from `rng`, weighted so that writes dominate and
    /// every kind of client shows up within a few dozen steps.
    pub fn draw(rng: &mut Rng) -> Op {
        let s = rng.below(SESSIONS);
        match rng.below(100) {
            0..=17 => Op::Prompt {
                s,
                id: rng.below(PROMPT_IDS),
                text: rng.below(TEXTS),
            },
            18..=29 => Op::Answer {
                s,
                prompt: rng.below(PROMPT_IDS),
                id: rng.maybe(ANSWER_IDS),
                text: rng.below(TEXTS),
            },
            30..=36 => Op::Part {
                s,
                prompt: rng.below(PROMPT_IDS),
                id: rng.below(ANSWER_IDS),
                text: rng.below(TEXTS),
            },
            37..=40 => Op::Cancel {
                s,
                prompt: rng.below(PROMPT_IDS),
            },
            41..=44 => Op::Ask {
                s,
                id: rng.below(ASK_IDS),
                text: rng.below(2),
            },
            45..=47 => Op::Reply {
                s,
                ask: rng.below(ASK_IDS),
                text: rng.below(2),
            },
            48..=53 => Op::Poll {
                s,
                after: rng.maybe(4),
                timeout_s: rng.below(20),
            },
            54..=55 => Op::PollNow { s },
            56..=57 => Op::PollEvery {
                timeout_s: rng.below(20),
            },
            58..=59 => Op::AskPoll {
                s,
                ask: rng.below(ASK_IDS),
                timeout_s: rng.below(20),
            },
            60..=62 => Op::Hangup { pick: rng.next() },
            63..=67 => Op::Subscribe {
                s,
                resume: rng.maybe(8),
                reading: reading(rng),
            },
            68..=73 => Op::Read {
                pick: rng.next(),
                frames: 1 + rng.below(6),
            },
            74..=75 => Op::SetReading {
                pick: rng.next(),
                reading: reading(rng),
            },
            76..=78 => Op::Unsubscribe { pick: rng.next() },
            79..=80 => Op::Messages { s },
            81..=82 => Op::Put { s },
            83..=84 => Op::Delete { s },
            85..=92 => Op::Storage {
                take: [1, 2, 3, 8, 32, 1_000][rng.below(6) as usize],
                fail: rng.below(8) == 0,
            },
            _ => Op::Advance {
                ms: [1, 10, 100, 700, 2_500, 12_000][rng.below(6) as usize],
            },
        }
    }

    /// The same step, on one of [`WIDE_SESSIONS`] sessions (drawn from
    /// `rng`) instead of one of [`SESSIONS`]; or, now and then, a restart
    /// instead.
    pub fn spread(mut self, rng: &mut Rng) -> Op {
        let to = rng.below(WIDE_SESSIONS / SESSIONS) * SESSIONS;
        if rng.below(RESTART_ONE_IN) == 0 {
            return Op::Restart { lose: 0 };
        }
        if let session_op!(s) = &mut self {
            *s += to;
        }
        self
    }

    /// The same step, or now and then (drawn from `rng`) a crash that
    /// loses the last one to [`LOST_AT_MOST`] committed transactions with
    /// the write-ahead log instead.
    pub fn crash(self, rng: &mut Rng) -> Op {
        if rng.below(RESTART_ONE_IN) == 0 {
            return Op::Restart {
                lose: 1 + rng.below(LOST_AT_MOST),
            };
        }
        self
    }

    /// The session the step names, if one.
    pub fn session(&self) -> Option<u64> {
        match *self {
            session_op!(s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |o: &Option<u64>| o.map_or("-".to_string(), |v| v.to_string());
        match self {
            Op::Prompt { s, id, text } => write!(f, "POST /prompt s{s} c{id} text=t{text}"),
            Op::Answer {
                s,
                prompt,
                id,
                text,
            } => write!(
                f,
                "POST /response s{s} prompt=c{prompt} id={} text=t{text}",
                id.map_or("-".to_string(), |i| format!("a{i}"))
            ),
            Op::Part {
                s,
                prompt,
                id,
                text,
            } => write!(f, "POST /response s{s} prompt=c{prompt} a{id} part=t{text}"),
            Op::Cancel { s, prompt } => write!(f, "POST /cancel s{s} c{prompt}"),
            Op::Ask { s, id, text } => write!(f, "POST /ask s{s} k{id} text=q{text}"),
            Op::Reply { s, ask, text } => write!(f, "POST /reply s{s} k{ask} text=r{text}"),
            Op::Poll {
                s,
                after,
                timeout_s,
            } => write!(
                f,
                "GET /prompts/s{s} after={} timeout={timeout_s}",
                opt(after)
            ),
            Op::PollNow { s } => write!(f, "GET /prompts/s{s}?wait=false"),
            Op::PollEvery { timeout_s } => write!(f, "GET /prompts timeout={timeout_s}"),
            Op::AskPoll { s, ask, timeout_s } => {
                write!(f, "GET /asks/s{s}/k{ask} timeout={timeout_s}")
            }
            Op::Hangup { pick } => write!(f, "hang up parked #{}", pick % 1000),
            Op::Subscribe { s, resume, reading } => {
                write!(f, "WS /ws/s{s} resume={} reading={reading:?}", opt(resume))
            }
            Op::Read { pick, frames } => {
                write!(f, "subscriber #{} reads {frames} frames", pick % 1000)
            }
            Op::SetReading { pick, reading } => {
                write!(f, "subscriber #{} reads {reading:?}", pick % 1000)
            }
            Op::Unsubscribe { pick } => write!(f, "subscriber #{} hangs up", pick % 1000),
            Op::Messages { s } => write!(f, "GET /messages/s{s}"),
            Op::Put { s } => write!(f, "PUT /sessions/s{s}"),
            Op::Delete { s } => write!(f, "DELETE /sessions/s{s}"),
            Op::Storage { take, fail } => write!(
                f,
                "storage takes {take} and {}",
                if *fail { "rolls back" } else { "commits" }
            ),
            Op::Advance { ms } => write!(f, "clock +{ms} ms"),
            Op::Restart { lose: 0 } => write!(f, "the relay restarts"),
            Op::Restart { lose } => write!(
                f,
                "the relay restarts, its last {lose} commits lost with relay.db-wal"
            ),
        }
    }
}
