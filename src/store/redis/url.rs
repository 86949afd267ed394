//! `RELAY_REDIS_URL`: `redis://[[user]:password@]host[:port][/db]`, the
//! form redis-cli and the client libraries take, or `rediss://` for Redis
//! over TLS (the host is the name its certificate is checked against).
//! Percent-escapes in the user and password are decoded.

use std::net::{SocketAddr, ToSocketAddrs};

/// Where Redis is and how to log in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisUrl {
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: u32,
    /// `rediss://`: TLS, the certificate checked against `host`.
    pub tls: bool,
}

impl RedisUrl {
    /// Parses the URL; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let (rest, tls) = match url.split_once("://") {
            Some(("redis", rest)) => (rest, false),
            Some(("rediss", rest)) => (rest, true),
            _ => return Err("expected redis://host[:port][/db] or rediss://…".into()),
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hostport, db) = match rest.split_once('/') {
            Some((hp, "")) => (hp, 0),
            Some((hp, db)) => (
                hp,
                db.parse()
                    .map_err(|_| format!("database '{db}' is not a number"))?,
            ),
            None => (rest, 0),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| "unclosed [ in the host".to_string())?;
            match after.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None if after.is_empty() => (host, None),
                None => return Err("expected :port after the host".into()),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| format!("port '{p}' is not a port"))?,
            None => 6379,
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (non_empty(decode(u)?), non_empty(decode(p)?)),
                None => (None, non_empty(decode(a)?)),
            },
        };
        Ok(RedisUrl {
            host: host.to_string(),
            port,
            user,
            password,
            db,
            tls,
        })
    }

    /// The addresses the host resolves to (a name is looked up once, at
    /// start: the loop never waits for DNS).
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        Ok((self.host.as_str(), self.port).to_socket_addrs()?.collect())
    }

    /// For logs: the URL without its password.
    pub fn display(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{host}:{}/{}", self.port, self.db)
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// Percent-decoding (`%40` is `@`).
fn decode(s: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "bad %-escape in the user or password".to_string())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the user or password is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        let u = RedisUrl::parse("redis://127.0.0.1:6379/0").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("127.0.0.1", 6379, 0));
        assert_eq!(u.password, None);
        let u = RedisUrl::parse("redis://:s%40cret@cache/2").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("cache", 6379, 2));
        assert_eq!(u.password.as_deref(), Some("s@cret"));
        assert_eq!(u.user, None);
        let u = RedisUrl::parse("redis://relay:pw@[::1]:7000").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 7000));
        assert_eq!(u.user.as_deref(), Some("relay"));
        assert_eq!(u.display(), "redis://[::1]:7000/0");
        assert!(!u.tls);
        let u = RedisUrl::parse("rediss://:pw@cache.example.com:6380").unwrap();
        assert!(u.tls);
        assert_eq!(u.display(), "rediss://cache.example.com:6380/0");
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        for bad in [
            "http://x",
            "rediss://",
            "redis://",
            "redis://x:port",
            "redis://x/db",
            "redis://:%zz@x",
            "redis://[::1",
        ] {
            assert!(RedisUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
