//! Commands to Redis: RESP arrays of bulk strings, written by hand into
//! the link's output (no allocation per argument).

use super::Known;
use crate::store::mem::StoreLimits;
use crate::wire::{digits, push_decimal};

/// The arguments every script call starts with (see `push_common`).
pub struct Common<'a> {
    pub unix_ms: u64,
    pub limits: &'a StoreLimits,
    pub prefix: &'a [u8],
    pub op: &'a [u8],
    pub sid: &'a [u8],
    pub known: Known<'a>,
    /// The epoch of a session the call may create.
    pub epoch: &'a [u8],
    /// The session's channel, in parts.
    pub channel: &'a [&'a [u8]],
    /// Sessions the call's keys may hold at most: the cap, or in a
    /// cluster its bucket's share (`slot::bucket_cap`).
    pub cap: u64,
}

/// Appends one command: a RESP array of bulk strings.
pub fn push_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    push_array(out, args.len());
    for a in args {
        push_bulk(out, &[a]);
    }
}

/// The script's arguments 1 to 11, which every call sends in this order
/// (`relay.lua` reads them by position).
pub fn push_common(out: &mut Vec<u8>, c: Common) {
    push_bulk(out, &[c.op]);
    push_bulk(out, &[c.sid]);
    push_number(out, c.unix_ms);
    push_bulk(out, &[c.known.epoch.as_bytes()]);
    push_number(out, c.known.next);
    push_number(out, c.limits.history_limit as u64);
    push_number(out, c.cap);
    push_number(out, c.limits.max_pending as u64);
    push_bulk(out, &[c.epoch]);
    push_bulk(out, c.channel);
    push_bulk(out, &[c.prefix]);
}

/// `SUBSCRIBE` or `UNSUBSCRIBE` of the channel a session's changes are
/// published on (`<prefix>e:<sid>`).
pub fn push_channel_command(out: &mut Vec<u8>, command: &[u8], prefix: &[u8], sid: &str) {
    push_array(out, 2);
    push_bulk(out, &[command]);
    push_bulk(out, &[prefix, b"e:", sid.as_bytes()]);
}

/// `*<n>\r\n`: an array of `n` elements follows.
pub fn push_array(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    push_decimal(out, n as u64);
    out.extend_from_slice(b"\r\n");
}

/// One bulk string: the concatenation of `parts`.
pub fn push_bulk(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.push(b'$');
    push_decimal(out, parts.iter().map(|p| p.len() as u64).sum());
    out.extend_from_slice(b"\r\n");
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// A number as a bulk string.
pub fn push_number(out: &mut Vec<u8>, n: u64) {
    push_bulk(out, &[digits(n, &mut [0; 20])]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        push_command(&mut out, &[b"SET", b"k", b""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        out.clear();
        push_bulk(&mut out, &[b"p:", b"s:", b"x"]);
        push_number(&mut out, 0);
        push_number(&mut out, u64::MAX);
        assert_eq!(
            out,
            b"$5\r\np:s:x\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n"
        );
    }
}
