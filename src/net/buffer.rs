//! Output queue of chunks, owned or shared. A broadcast frame is one
//! `Rc<[u8]>` pushed to every subscriber's queue; a response is an owned
//! `Vec<u8>`. Writes go out with `writev` over up to 16 chunks, bounded by a
//! byte budget per call so one connection cannot starve the loop.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::rc::Rc;

use crate::store::log::weight::{Meter, Share, alloc};

/// One queued piece of output.
#[derive(Debug)]
pub enum Chunk {
    Owned(Vec<u8>),
    Shared(Rc<[u8]>),
    /// Bytes of the binary itself (the web page).
    Static(&'static [u8]),
}

impl Chunk {
    fn bytes(&self) -> &[u8] {
        match self {
            Chunk::Owned(v) => v,
            Chunk::Shared(r) => r,
            Chunk::Static(b) => b,
        }
    }
}

/// What a write attempt ended with.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteStatus {
    /// Everything queued was written.
    Drained,
    /// The socket is full; wait for the writable edge.
    WouldBlock,
    /// The budget ran out with bytes left; write again next turn.
    Budget,
    /// The peer is gone or the socket failed.
    Failed,
}

/// Unsent output of one connection.
#[derive(Debug, Default)]
pub struct OutQueue {
    chunks: VecDeque<Chunk>,
    /// Bytes of the front chunk already written.
    front_off: usize,
    /// Unsent bytes in all chunks.
    queued: usize,
    /// Bytes of the owned chunks (a shared chunk's bytes are the log's or
    /// every subscriber's at once, and static ones the binary's).
    owned: usize,
    /// What the queue holds, on the memory budget's meter.
    share: Share,
}

const MAX_IOVECS: usize = 16;

impl OutQueue {
    /// Counts this queue's bytes on `meter` from now on.
    pub fn count_on(&mut self, meter: &Meter) {
        self.share = Share::on(meter);
        self.weigh();
    }

    /// What the queue holds now: its deque of chunks and the owned ones.
    #[inline]
    fn weigh(&mut self) {
        let deque = self.chunks.capacity() * std::mem::size_of::<Chunk>();
        self.share.set(alloc(deque) + self.owned);
    }

    /// Unsent bytes.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Whether nothing is left to send.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Queues bytes this connection owns.
    pub fn push_owned(&mut self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        // Small writes back to back (pipelined answers) coalesce into one chunk.
        if let Some(Chunk::Owned(last)) = self.chunks.back_mut()
            && last.len() + bytes.len() <= 4096
        {
            self.queued += bytes.len();
            self.owned += bytes.len();
            last.extend_from_slice(&bytes);
            self.weigh();
            return;
        }
        self.queued += bytes.len();
        self.owned += bytes.len();
        self.chunks.push_back(Chunk::Owned(bytes));
        self.weigh();
    }

    /// Queues bytes shared with other connections (a broadcast frame).
    pub fn push_shared(&mut self, bytes: Rc<[u8]>) {
        if bytes.is_empty() {
            return;
        }
        self.queued += bytes.len();
        self.chunks.push_back(Chunk::Shared(bytes));
        self.weigh();
    }

    /// Queues bytes that live as long as the program (the web page).
    pub fn push_static(&mut self, bytes: &'static [u8]) {
        if bytes.is_empty() {
            return;
        }
        self.queued += bytes.len();
        self.chunks.push_back(Chunk::Static(bytes));
        self.weigh();
    }

    /// Frees the queue's room when nothing is queued: a connection about
    /// to wait (a parked poll, a quiet subscriber) would otherwise keep
    /// room for four chunks it may not need for minutes. Not called after
    /// every write: a busy connection keeps its room.
    pub fn release(&mut self) {
        if self.queued == 0 && self.chunks.capacity() > 0 {
            self.chunks = VecDeque::new();
            self.front_off = 0;
            self.weigh();
        }
    }

    /// Drops every chunk not yet started, keeping a partly written one so the
    /// stream stays well-formed; called before a close frame on a slow
    /// subscriber.
    pub fn drop_unstarted(&mut self) {
        let keep = usize::from(self.front_off > 0);
        while self.chunks.len() > keep {
            if let Some(c) = self.chunks.pop_back() {
                self.queued -= c.bytes().len();
                self.dropped(&c);
            }
        }
        if keep == 0 {
            self.front_off = 0;
        }
        self.weigh();
    }

    /// Writes queued bytes to `w` until it would block, everything is
    /// written, or `budget` bytes went out.
    pub fn write_to<W: Write>(&mut self, w: &mut W, budget: usize) -> WriteStatus {
        let mut sent = 0usize;
        while self.queued > 0 {
            if sent >= budget {
                return WriteStatus::Budget;
            }
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut n = 0;
            for (i, c) in self.chunks.iter().take(MAX_IOVECS).enumerate() {
                let b = c.bytes();
                slices[i] = IoSlice::new(if i == 0 { &b[self.front_off..] } else { b });
                n = i + 1;
            }
            match w.write_vectored(&slices[..n]) {
                Ok(0) => return WriteStatus::Failed,
                Ok(k) => {
                    sent += k;
                    self.consume(k);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return WriteStatus::WouldBlock,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return WriteStatus::Failed,
            }
        }
        if self.chunks.capacity() > 64 {
            self.chunks.shrink_to(8);
        }
        self.weigh();
        WriteStatus::Drained
    }

    /// A chunk left the queue.
    fn dropped(&mut self, c: &Chunk) {
        if let Chunk::Owned(v) = c {
            self.owned -= v.len();
        }
    }

    fn consume(&mut self, mut k: usize) {
        self.queued -= k;
        while k > 0 {
            let Some(front) = self.chunks.front() else {
                break;
            };
            let left = front.bytes().len() - self.front_off;
            if k >= left {
                k -= left;
                self.front_off = 0;
                if let Some(c) = self.chunks.pop_front() {
                    self.dropped(&c);
                }
            } else {
                self.front_off += k;
                k = 0;
            }
        }
        self.weigh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `cap` bytes per call, then blocks.
    struct Trickle {
        got: Vec<u8>,
        per_call: usize,
        calls_left: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.calls_left == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.calls_left -= 1;
            let n = buf.len().min(self.per_call);
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let mut q = OutQueue::default();
        q.push_owned(b"hello ".to_vec());
        q.push_shared(Rc::from(&b"shared "[..]));
        q.push_owned(b"world".to_vec());
        let mut w = Trickle {
            got: Vec::new(),
            per_call: 4,
            calls_left: 2,
        };
        assert_eq!(q.write_to(&mut w, usize::MAX), WriteStatus::WouldBlock);
        assert_eq!(q.queued(), 18 - w.got.len());
        assert_eq!(w.got, b"hello ");
        w.calls_left = 100;
        assert_eq!(q.write_to(&mut w, usize::MAX), WriteStatus::Drained);
        assert_eq!(w.got, b"hello shared world");
    }

    #[test]
    fn budget_stops_a_long_write() {
        let mut q = OutQueue::default();
        q.push_shared(Rc::from(vec![1u8; 1000]));
        let mut w = Trickle {
            got: Vec::new(),
            per_call: 100,
            calls_left: 100,
        };
        assert_eq!(q.write_to(&mut w, 300), WriteStatus::Budget);
        assert_eq!(w.got.len(), 300);
    }

    #[test]
    fn release_frees_only_an_empty_queue() {
        let mut q = OutQueue::default();
        q.push_owned(b"answer".to_vec());
        q.release();
        assert_eq!(q.queued(), 6);
        let mut w = Trickle {
            got: Vec::new(),
            per_call: 100,
            calls_left: 100,
        };
        assert_eq!(q.write_to(&mut w, usize::MAX), WriteStatus::Drained);
        assert!(q.chunks.capacity() > 0);
        q.release();
        assert_eq!(q.chunks.capacity(), 0);
        q.push_shared(Rc::from(&b"frame"[..]));
        assert_eq!(q.queued(), 5);
    }

    #[test]
    fn drop_unstarted_keeps_a_partly_written_chunk() {
        let mut q = OutQueue::default();
        q.push_shared(Rc::from(vec![1u8; 10]));
        q.push_shared(Rc::from(vec![2u8; 10]));
        let mut w = Trickle {
            got: Vec::new(),
            per_call: 4,
            calls_left: 1,
        };
        q.write_to(&mut w, usize::MAX);
        q.drop_unstarted();
        assert_eq!(q.queued(), 6);
        let mut q = OutQueue::default();
        q.push_shared(Rc::from(vec![1u8; 10]));
        q.drop_unstarted();
        assert!(q.is_empty());
    }
}
