//! The data directory's storage thread, simulated: the relay holds a
//! real `Durable` handle with no thread behind it
//! (`Durable::detached`), and this side plays the thread. It takes the
//! commands the loop sent, in order, a few at a time into one
//! transaction, decides each with the memory engine's rules on its own
//! copy of the log (as the thread's writer does), and commits it, or
//! rolls it back and answers every command `503`. Commands wait in the
//! queue until a `Storage` step takes them: completions come late,
//! batched, or never (a request that timed out meanwhile is cancelled at
//! the take, as `Frontier` has it).
//!
//! The model follows what the storage committed, record by record (a
//! life of a session begins at its `Created`, ends at its `Deleted`); the
//! relay must then hold exactly that, and answer each request waiting on
//! a ticket with its own command's outcome, once.
//!
//! Every transaction committed is kept with its generation, as the
//! database and its write-ahead log hold them, and the side file's
//! generation beside them. A crash that loses the log loses the last few
//! transactions: the copy is then what the rest make, the side file is
//! ahead, and the start's decision (`sqlite::recover`, the one `open`
//! makes) is applied to the copy as `open` applies it to `relay.db`.

use std::collections::{HashMap, HashSet};

use relay::store::Message;
use relay::store::record::{Command, Done, Op as Cmd, Outcome as Decided, Record};
use relay::store::record::{SessionImage, StoredRow};
use relay::store::sqlite::{Committed, Detached, Recovery, recover};
use relay::store::{IdGen, MemStore, StoreLimits};

use super::*;

/// What a request waiting on a ticket must be answered.
#[derive(Debug)]
pub(super) enum Expect {
    /// Stored (or found stored), with the `seq` its answer carries.
    Ok(Option<u64>),
    Refused(u16),
}

pub(super) struct Storage {
    side: Detached,
    /// The storage's own state of every session (the thread's copy).
    pub(super) copy: MemStore,
    queue: VecDeque<Command>,
    /// A transaction taken and not committed yet: its commands are the
    /// storage's (a timeout leaves them to finish), and those cancelled
    /// before the take.
    open: Option<(Vec<Command>, Vec<Done>)>,
    /// The outcome of every ticket the storage decided, until answered.
    pub(super) expected: HashMap<u64, Expect>,
    /// Tickets whose requesters were answered `503` at their timeout.
    pub(super) abandoned: HashSet<u64>,
    /// Tickets of reads for the loop (a session read back): their
    /// requests are answered by what they run, or decide, again.
    pub(super) reads: HashSet<u64>,
    /// The row of every ask stored, by session and `seq`: an unanswered
    /// ask that history dropped keeps its row, and a session read back
    /// has it (as the thread reads it by its rowid).
    asked: HashMap<(String, u64), StoredRow>,
    /// Every transaction committed, with its generation, oldest first.
    txs: Vec<(u64, Tx)>,
    /// The side file: the generation of the last transaction acknowledged.
    acked: u64,
    /// Every session with the number of its `sessions` row, in the order
    /// created (the start's reading lists them after a row, as the
    /// thread does), and the next number.
    rows: Rows,
}

/// A committed transaction, replayed after a lost log.
enum Tx {
    /// The records its commands wrote.
    Records(Vec<Record>),
    /// A start's new epochs, by session.
    Epochs(Vec<(SessionId, String)>),
}

/// The `sessions` rows: each session with its row's number, and the
/// next number (a lost log takes the rows it created with it).
struct Rows {
    list: Vec<(i64, SessionId)>,
    next: i64,
}

impl Default for Rows {
    fn default() -> Rows {
        Rows {
            list: Vec::new(),
            next: 1,
        }
    }
}

/// Sessions listed by one `Cmd::Dormant`: few, so that the start's
/// reading takes several commands, with the others between them.
const LISTED: usize = 2;

impl Storage {
    pub(super) fn new(side: Detached, limits: StoreLimits) -> Storage {
        Storage {
            side,
            copy: MemStore::new(limits),
            queue: VecDeque::new(),
            open: None,
            expected: HashMap::new(),
            abandoned: HashSet::new(),
            reads: HashSet::new(),
            asked: HashMap::new(),
            txs: Vec::new(),
            acked: 0,
            rows: Rows::default(),
        }
    }

    /// The ids of up to [`LISTED`] sessions after the row `after`, and
    /// the row to go on after when there may be more.
    fn listed(&self, after: i64) -> (Vec<SessionId>, Option<i64>) {
        let list: Vec<&(i64, SessionId)> = self
            .rows
            .list
            .iter()
            .filter(|(row, _)| *row > after)
            .take(LISTED)
            .collect();
        let next = (list.len() == LISTED).then(|| list[LISTED - 1].0);
        (list.into_iter().map(|(_, sid)| sid.clone()).collect(), next)
    }
}

impl Storage {
    /// The relay restarts: what was queued or taken and not committed is
    /// lost with it, and the new relay's handle is played from now on.
    pub(super) fn restart(&mut self, side: Detached) {
        self.side = side;
        self.queue.clear();
        self.open = None;
        self.expected.clear();
        self.abandoned.clear();
        self.reads.clear();
    }

    /// A crash lost the write-ahead log: the last `lose` transactions are
    /// gone from the database, and the side file still counts them. The
    /// copy is made again from the transactions left.
    pub(super) fn lose(&mut self, lose: u64) {
        let keep = self.txs.len().saturating_sub(lose as usize);
        self.txs.truncate(keep);
        self.copy = MemStore::new(self.copy.limits());
        self.asked.clear();
        self.rows = Rows::default();
        for (_, tx) in &self.txs {
            match tx {
                Tx::Records(records) => {
                    for r in records {
                        apply(&mut self.copy, &mut self.asked, &mut self.rows, r);
                    }
                }
                Tx::Epochs(epochs) => {
                    for (sid, epoch) in epochs {
                        renew(&mut self.copy, &self.asked, sid, epoch);
                    }
                }
            }
        }
    }

    /// The start's decision on the side file and the database's
    /// generation (the real one, `sqlite::recover`), applied to the copy
    /// in one transaction as `open` applies it to `relay.db`.
    pub(super) fn recover(&mut self) -> Option<Recovery<SessionId>> {
        let stored = self.txs.last().map_or(0, |(g, _)| *g);
        let copy = &self.copy;
        let sessions = || Ok::<_, std::convert::Infallible>(copy.idle(|_, _| true));
        let Ok(recovery) = recover(Some(self.acked), stored, sessions, &mut IdGen::new());
        let r = recovery?;
        for (sid, epoch) in &r.epochs {
            renew(&mut self.copy, &self.asked, sid, epoch);
        }
        self.txs.push((r.generation, Tx::Epochs(r.epochs.clone())));
        Some(r)
    }
}

/// Applies one committed record to the copy, keeping the row of each ask
/// and of each session.
fn apply(
    copy: &mut MemStore,
    asked: &mut HashMap<(String, u64), StoredRow>,
    rows: &mut Rows,
    r: &Record,
) {
    copy.apply(Millis(0), r.clone());
    match r {
        Record::Ask { sid, seq, .. } => {
            let log = copy.get(sid);
            let m = log.and_then(|l| l.history().find(|m| m.seq == *seq));
            if let Some(m) = m {
                asked.insert((sid.to_string(), seq.get()), row(m));
            }
        }
        Record::Deleted { sid } => {
            asked.retain(|(s, _), _| s != sid.as_str());
            rows.list.retain(|(_, s)| s != sid);
        }
        Record::Created { sid, .. } => {
            rows.list.push((rows.next, sid.clone()));
            rows.next += 1;
        }
        _ => {}
    }
}

/// `sid` in the copy under a new epoch, the rest as stored: read from its
/// rows again, as a start reads it.
fn renew(copy: &mut MemStore, asked: &HashMap<(String, u64), StoredRow>, sid: &str, epoch: &str) {
    let Some(mut image) = image(copy, asked, sid) else {
        return;
    };
    image.epoch = epoch.to_string();
    let limit = copy.limits().history_limit;
    copy.insert(image.sid.clone(), image.into_log(Millis(0), limit));
}

/// A session the copy holds, whole, as the storage thread sends it to the
/// loop: its counters and the messages its history and pending set hold
/// (the thread reads them from their rows). Built inside the group that
/// carries the command asking for it, before that command is decided, as
/// the thread's `State::session_for_loop` is: it sees every command
/// queued before it and none after. The relay takes it only when its log
/// lacks the session: one dropped from memory past the budget, or one
/// created by a write still in flight.
fn image(
    copy: &MemStore,
    asked: &HashMap<(String, u64), StoredRow>,
    sid: &str,
) -> Option<SessionImage> {
    let (key, log) = copy.key_and_log(sid)?;
    let mut msgs: Vec<&Message> = log.history().map(|m| &**m).collect();
    for m in log.page_all_pending() {
        if !msgs.iter().any(|h| h.seq == m.seq) {
            msgs.push(m);
        }
    }
    let mut rows: Vec<StoredRow> = msgs.into_iter().map(row).collect();
    for ((s, seq), r) in asked {
        if s == sid && log.retains(Seq(*seq)) && !rows.iter().any(|h| h.seq.get() == *seq) {
            rows.push(r.clone());
        }
    }
    rows.sort_by_key(|r| r.seq);
    Some(SessionImage {
        sid: key.clone(),
        epoch: log.epoch().to_string(),
        counters: log.counters(),
        rows,
    })
}

/// A stored message as its row.
fn row(m: &Message) -> StoredRow {
    StoredRow {
        seq: m.seq,
        kind: m.kind,
        client_msg_id: m.client_msg_id.to_string(),
        assistant_msg_id: m.assistant_msg_id.as_deref().map(str::to_string),
        ts: m.ts,
        data: Some(m.data().to_vec()),
    }
}

/// The `seq` an outcome's answer carries.
fn seq_of(o: &Decided) -> Option<u64> {
    match o {
        Decided::Cancel { seq, .. } | Decided::Ask { seq, .. } | Decided::Reply { seq, .. } => {
            Some(seq.get())
        }
        _ => None,
    }
}

impl World {
    /// A `Storage` step: the transaction taken at an earlier step, if
    /// any, commits or (`fail`) rolls back; then up to `take` commands
    /// are taken into the next, committed at once when there are few, or
    /// left open until the next step (a request that times out meanwhile
    /// finds its write in flight). The relay takes each commit as it does
    /// when the thread wakes the loop.
    pub(super) fn storage(&mut self, take: u64, fail: bool) -> Check {
        let Some(st) = &mut self.storage else {
            return Ok(());
        };
        while let Ok(batch) = st.side.batches.try_recv() {
            st.queue.extend(batch);
        }
        if let Some((group, cancelled)) = st.open.take() {
            self.commit(group, cancelled, fail)?;
        }
        let Some(st) = &mut self.storage else {
            return Ok(());
        };
        let n = (take as usize).min(st.queue.len());
        if n == 0 {
            return Ok(());
        }
        let group: Vec<Command> = st.queue.drain(..n).collect();
        let (group, cancelled) = st.side.take(group);
        if take > 3 {
            st.open = Some((group, cancelled));
            return Ok(());
        }
        self.commit(group, cancelled, fail)
    }

    /// Commits (or, `fail`, rolls back) a transaction of `group`, with
    /// the commands `cancelled` at its take answered apart.
    fn commit(&mut self, group: Vec<Command>, cancelled: Vec<Done>, fail: bool) -> Check {
        let Some(st) = &mut self.storage else {
            return Ok(());
        };
        self.ops += 1;
        let n = group.len() + cancelled.len();
        let mut dones = Vec::with_capacity(n);
        let mut records_of = Vec::new();
        let mut reads = 0;
        for cmd in group {
            if matches!(cmd.op, Cmd::Load { .. } | Cmd::Warm | Cmd::Dormant { .. }) {
                st.reads.insert(cmd.ticket.n);
                reads += 1;
            }
            let ticket = cmd.ticket;
            if fail {
                dones.push(Done::only(ticket, Err(ApiError::storage_unavailable())));
                continue;
            }
            let mut records = Vec::new();
            let collect = matches!(cmd.op, Cmd::Collect { .. });
            let mut images = Vec::new();
            let result = match cmd.op {
                Cmd::Write(w) => {
                    if cmd.load {
                        images.extend(image(&st.copy, &st.asked, w.session()));
                    }
                    st.copy.decide(Millis(0), cmd.unix_ms, w, &mut records)
                }
                Cmd::Load { sid } => {
                    images.extend(image(&st.copy, &st.asked, &sid));
                    Ok(Decided::Loaded)
                }
                // The start's reading (`Cache::warm`): every session
                // with a pending prompt whole; every id follows, a few
                // at a time.
                Cmd::Warm => {
                    for sid in st.copy.idle(|_, log| log.pending_len() > 0) {
                        images.extend(image(&st.copy, &st.asked, &sid));
                    }
                    Ok(Decided::Warmed {
                        dormant: Vec::new(),
                        next: Some(0),
                    })
                }
                Cmd::Dormant { after } => {
                    let (dormant, next) = st.listed(after);
                    Ok(Decided::Warmed { dormant, next })
                }
                Cmd::Collect { sids } => {
                    for sid in sids.into_iter().filter(|sid| st.copy.contains(sid)) {
                        records.push(Record::Deleted { sid });
                    }
                    Ok(Decided::Collected)
                }
            };
            for r in &records {
                apply(&mut st.copy, &mut st.asked, &mut st.rows, r);
            }
            records_of.push((records.clone(), collect));
            dones.push(Done {
                ticket,
                result,
                records,
                images,
            });
        }
        for d in dones.iter().chain(&cancelled) {
            if d.ticket.conn == NOBODY || st.reads.contains(&d.ticket.n) {
                continue;
            }
            let e = match &d.result {
                Ok(o) => Expect::Ok(seq_of(o)),
                Err(e) => Expect::Refused(e.status),
            };
            st.expected.insert(d.ticket.n, e);
        }
        // A group of reads alone commits nothing (`thread.rs`); any other
        // is the next generation, acknowledged in the side file.
        let commands = dones.len() - reads;
        if commands > 0 && !fail {
            st.acked += 1;
            let records = records_of.iter().flat_map(|(r, _)| r.iter().cloned());
            st.txs.push((st.acked, Tx::Records(records.collect())));
        }
        dones.extend(cancelled);
        let committed = Committed {
            done: dones,
            commands,
            micros: 0,
            ok: !fail,
        };
        if st.side.done.send(committed).is_err() {
            return Err("the relay dropped its storage handle".to_string());
        }
        for (records, collect) in records_of {
            for r in &records {
                self.committed(r, collect)?;
            }
        }
        self.seen.commits += 1;
        self.node.relay.storage_done(self.now);
        self.apply_effects()
    }

    /// The model follows one committed record.
    pub(super) fn committed(&mut self, r: &Record, collect: bool) -> Check {
        let now = self.now;
        let (sid, seq, kind, id) = match r {
            Record::Created { sid, epoch } => {
                if self.model.live(sid).is_some() {
                    return Err(format!("{sid} created while it exists"));
                }
                self.model.create(sid, epoch, now)?;
                return Ok(());
            }
            Record::Deleted { sid } => {
                let Some(i) = self.model.live(sid) else {
                    return Err(format!("{sid} deleted while it does not exist"));
                };
                let since = now.since(self.model.incs[i].last_write);
                if collect && since < TTL_MS {
                    return Err(format!(
                        "{sid} collected {since} ms after a write was committed"
                    ));
                }
                if collect {
                    self.seen.collected += 1;
                }
                self.model.end(sid);
                return Ok(());
            }
            Record::Prompt {
                sid,
                seq,
                client_msg_id,
                ..
            } => (sid, seq, Kind::Prompt, client_msg_id),
            Record::Response {
                sid,
                seq,
                assistant_msg_id,
                ..
            } => (sid, seq, Kind::Assistant, assistant_msg_id),
            Record::Cancel {
                sid,
                seq,
                client_msg_id,
                ..
            } => (sid, seq, Kind::Cancel, client_msg_id),
            Record::Ask {
                sid, seq, ask_id, ..
            } => (sid, seq, Kind::Ask, ask_id),
            Record::Reply {
                sid, seq, ask_id, ..
            } => (sid, seq, Kind::Reply, ask_id),
        };
        let inc = self
            .model
            .inc_mut(sid)
            .ok_or_else(|| format!("a message committed to {sid}, which does not exist"))?;
        if let Some(was) = inc.reused(seq.get(), kind, id) {
            return Err(format!(
                "{sid}: {kind:?} {id} committed at seq {} under epoch {}, where {:?} {} was \
                 acknowledged under the same epoch before the log was lost",
                seq.get(),
                inc.epoch,
                was.kind,
                was.id
            ));
        }
        if seq.get() != inc.next_seq() {
            return Err(format!(
                "{sid}: {kind:?} {id} committed at seq {}, the next is {}",
                seq.get(),
                inc.next_seq()
            ));
        }
        inc.push(kind, id);
        inc.last_write = now;
        match r {
            Record::Prompt { client_msg_id, .. } => {
                inc.pending.push((seq.get(), client_msg_id.clone()));
            }
            Record::Response { client_msg_id, .. } | Record::Cancel { client_msg_id, .. } => {
                inc.unpend(client_msg_id);
            }
            _ => {}
        }
        Ok(())
    }

    /// A request that waited on `ticket` is answered `status` with
    /// `body`: the outcome its own command was decided with.
    pub(super) fn check_ticket(&mut self, n: u64, status: u16, body: &[u8]) -> Check {
        let Some(st) = &mut self.storage else {
            return Err("an answer by ticket from the memory engine".to_string());
        };
        if st.reads.remove(&n) {
            // A part decided on the log once its session was read.
            return Ok(());
        }
        match st.expected.remove(&n) {
            Some(Expect::Ok(seq)) if status == 200 => {
                if let Some(seq) = seq {
                    let got = json(body)?["seq"].as_u64();
                    if got != Some(seq) {
                        return Err(format!(
                            "ticket {n} answered seq {got:?}, its command was decided at {seq}"
                        ));
                    }
                }
                Ok(())
            }
            Some(Expect::Refused(s)) if s == status => Ok(()),
            e => Err(format!(
                "ticket {n} answered {status}, its command was decided {e:?}"
            )),
        }
    }
}
