//! The conversation with one Redis Sentinel, sans-IO: the shell
//! (`net/redis.rs`) owns the socket, writes [`Sentinel::hello`] once it
//! connects and hands over what it reads. The relay logs in where the
//! sentinel asks for a password (one without `requirepass` refuses the
//! `AUTH`, which is ignored), asks where the master is
//! (`SENTINEL get-master-addr-by-name`), then listens to `+switch-master`,
//! which names the new master at the end of each failover.
//!
//! Invariants: a sentinel that does not know the master, answers
//! anything but an address, or sends more than [`MAX_INPUT`] bytes
//! without a whole reply is dropped (the shell asks the next one); a
//! `+switch-master` of another master name is ignored.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

use super::codec::push_command;
use super::reply::bytes_of;
use super::url::RedisUrl;

/// The channel on which sentinels announce a new master.
const SWITCH: &[u8] = b"+switch-master";

/// Bytes buffered without a whole reply before the sentinel is dropped.
const MAX_INPUT: usize = 1 << 16;

/// What one sentinel link is waiting for.
#[derive(Debug, Default, PartialEq, Eq)]
enum Step {
    /// `AUTH`'s answer, then the address.
    #[default]
    Auth,
    Address,
    /// Subscribed: `+switch-master` messages.
    Listening,
}

/// One sentinel link's state.
#[derive(Debug, Default)]
pub struct Sentinel {
    master: String,
    step: Step,
    input: Vec<u8>,
}

impl Sentinel {
    pub fn new(master: &str) -> Sentinel {
        Sentinel {
            master: master.to_string(),
            ..Sentinel::default()
        }
    }

    /// What to send once the socket connected (the state starts over).
    pub fn hello(&mut self, url: &RedisUrl) -> Vec<u8> {
        let mut out = Vec::new();
        self.input.clear();
        self.step = Step::Address;
        match (&url.user, &url.password) {
            (Some(u), Some(p)) => push_command(&mut out, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
            (None, Some(p)) => push_command(&mut out, &[b"AUTH", p.as_bytes()]),
            _ => {}
        }
        if url.password.is_some() {
            self.step = Step::Auth;
        }
        let master = self.master.as_bytes();
        push_command(&mut out, &[b"SENTINEL", b"get-master-addr-by-name", master]);
        push_command(&mut out, &[b"SUBSCRIBE", SWITCH]);
        out
    }

    /// Bytes read: each address heard (the master's, then each new one),
    /// as `host` and `port`. An error says why the link is dropped.
    #[inline(never)]
    pub fn input(&mut self, bytes: &[u8]) -> Result<Vec<(String, u16)>, &'static str> {
        self.input.extend_from_slice(bytes);
        if self.input.len() > MAX_INPUT {
            return Err("the sentinel's reply is too large");
        }
        let mut heard = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = decode(&self.input[at..]).map_err(|_| "not RESP")? {
            at += used;
            if let Some(addr) = self.frame(frame)? {
                heard.push(addr);
            }
        }
        self.input.drain(..at);
        Ok(heard)
    }

    fn frame(&mut self, frame: OwnedFrame) -> Result<Option<(String, u16)>, &'static str> {
        let parts = match frame {
            OwnedFrame::Array(parts) => parts,
            // A sentinel without a password refuses AUTH: nothing to log
            // in to. A wrong password shows in the next answer.
            _ if self.step == Step::Auth => Vec::new(),
            _ if self.step == Step::Address => {
                return Err("the sentinel does not know the master, or refused the password");
            }
            _ => return Ok(None),
        };
        let word = |i: usize| parts.get(i).map_or(&b""[..], bytes_of);
        match self.step {
            Step::Auth => {
                self.step = Step::Address;
                Ok(None)
            }
            Step::Address => {
                self.step = Step::Listening;
                if parts.len() != 2 {
                    return Err("the sentinel answered something else than an address");
                }
                address(word(0), word(1)).map(Some)
            }
            // message, +switch-master, "<name> <old ip> <old port> <new ip> <new port>"
            Step::Listening if word(0) == b"message" => {
                let mut words = word(2).split(|b| *b == b' ');
                if words.next() != Some(self.master.as_bytes()) {
                    return Ok(None);
                }
                let mut words = words.skip(2);
                match (words.next(), words.next(), words.next()) {
                    (Some(host), Some(port), None) => address(host, port).map(Some),
                    _ => Ok(None),
                }
            }
            Step::Listening => Ok(None),
        }
    }
}

fn address(host: &[u8], port: &[u8]) -> Result<(String, u16), &'static str> {
    let port = std::str::from_utf8(port).ok().and_then(|p| p.parse().ok());
    match (std::str::from_utf8(host), port) {
        (Ok(host), Some(port)) => Ok((host.to_string(), port)),
        _ => Err("the sentinel named no address"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_for_the_master_then_follows_its_switches() {
        let url = RedisUrl::parse("redis-sentinel://:pw@s1/main").unwrap();
        let mut s = Sentinel::new("main");
        let hello = String::from_utf8(s.hello(&url)).unwrap();
        assert!(hello.contains("AUTH\r\n$2\r\npw"), "{hello}");
        assert!(
            hello.contains("get-master-addr-by-name\r\n$4\r\nmain"),
            "{hello}"
        );
        assert!(hello.ends_with("$14\r\n+switch-master\r\n"), "{hello}");
        // A sentinel without a password refuses AUTH; the answer is split.
        let a = s.input(b"-ERR AUTH <password> called without any password configured\r\n*2\r\n$9\r\n127.0.0.1\r\n$4\r\n63");
        assert_eq!(a, Ok(vec![]));
        let a = s.input(b"79\r\n*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n");
        assert_eq!(a, Ok(vec![("127.0.0.1".to_string(), 6379)]));
        let other = b"*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$29\r\nother 1.1.1.1 1 2.2.2.2 2 xxx\r\n";
        assert_eq!(s.input(other), Ok(vec![]));
        let ours = "main 127.0.0.1 6379 10.0.0.2 6380";
        let msg = format!(
            "*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n${}\r\n{ours}\r\n",
            ours.len()
        );
        let a = s.input(msg.as_bytes());
        assert_eq!(a, Ok(vec![("10.0.0.2".to_string(), 6380)]));
    }

    #[test]
    fn a_sentinel_that_does_not_know_the_master_is_dropped() {
        let url = RedisUrl::parse("redis-sentinel://s1/main").unwrap();
        let mut s = Sentinel::new("main");
        assert!(!String::from_utf8(s.hello(&url)).unwrap().contains("AUTH"));
        assert!(s.input(b"*-1\r\n").is_err());
        let mut s = Sentinel::new("main");
        s.hello(&url);
        assert!(s.input(b"*1\r\n$1\r\nx\r\n").is_err());
        assert!(s.input(&[b'+'; MAX_INPUT + 1]).is_err());
    }
}
