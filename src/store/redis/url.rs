//! `RELAY_REDIS_URL`: `redis://[[user]:password@]host[:port][/db]`, the
//! form redis-cli and the client libraries take, or `rediss://` for Redis
//! over TLS (the host is the name its certificate is checked against).
//! Percent-escapes in the user and password are decoded.
//!
//! `redis-sentinel://[[user]:password@]host[:port][,host[:port]…]/master[/db]`
//! names Redis Sentinels (port 26379 unless given) and the master they
//! watch: the relay asks them where the master is and follows its
//! failovers (`net/redis.rs`, `sentinel.rs`). The user and password log in
//! to the master, and to the sentinels too where they ask for a password
//! (Redis keeps the two apart; one URL keeps one secret for both, the
//! common setup, and a sentinel without `requirepass` just ignores it).
//! `rediss-sentinel://` speaks TLS to the sentinels (each certificate
//! checked against its host in the URL) and to the master (checked
//! against the address the sentinels name, as they name it).
//!
//! `redis-cluster://[[user]:password@]host[:port][,host[:port]…]` names
//! some nodes of a Redis Cluster (port 6379 unless given): the relay asks
//! them for the slot map and talks to every master (`net/redis.rs`,
//! `cluster.rs`); `rediss-cluster://` speaks TLS to every node, each
//! certificate checked against the address the cluster names it by. A
//! cluster has one database, so the URL names none.

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
    /// `redis-sentinel://`: the master is whatever these sentinels say
    /// (`host` and `port` are the first sentinel's).
    pub sentinel: Option<Sentinels>,
    /// `redis-cluster://`: nodes to ask for the slot map (`host` and
    /// `port` are the first one's).
    pub cluster: Option<Vec<(String, u16)>>,
}

/// The sentinels of a `redis-sentinel://` URL and the master's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinels {
    pub hosts: Vec<(String, u16)>,
    pub master: String,
}

impl RedisUrl {
    /// Parses the URL; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let (rest, tls, sentinel, cluster) = match url.split_once("://") {
            Some(("redis", rest)) => (rest, false, false, false),
            Some(("rediss", rest)) => (rest, true, false, false),
            Some(("redis-sentinel", rest)) => (rest, false, true, false),
            Some(("rediss-sentinel", rest)) => (rest, true, true, false),
            Some(("redis-cluster", rest)) => (rest, false, false, true),
            Some(("rediss-cluster", rest)) => (rest, true, false, true),
            _ => {
                return Err(
                    "expected redis://host[:port][/db], rediss://…, redis-sentinel://host:port[,…]/master or redis-cluster://host:port[,…]"
                        .into(),
                );
            }
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
        if cluster && !path.is_empty() {
            return Err("a Redis Cluster has one database: redis-cluster://host:port[,…]".into());
        }
        let (master, db) = match path.split_once('/') {
            _ if !sentinel => ("", path),
            Some((m, db)) => (m, db),
            None => (path, ""),
        };
        let db = match db {
            "" => 0,
            db => db
                .parse()
                .map_err(|_| format!("database '{db}' is not a number"))?,
        };
        let sentinel = if sentinel {
            if master.is_empty() {
                return Err("no master name: redis-sentinel://host:port/<master name>".into());
            }
            let hosts = hostport
                .split(',')
                .map(|h| host_port(h, 26379))
                .collect::<Result<Vec<_>, _>>()?;
            Some(Sentinels {
                hosts,
                master: master.to_string(),
            })
        } else {
            None
        };
        let cluster = if cluster {
            let hosts = hostport
                .split(',')
                .map(|h| host_port(h, 6379))
                .collect::<Result<Vec<_>, _>>()?;
            Some(hosts)
        } else {
            None
        };
        let (host, port) = match (&sentinel, &cluster) {
            (Some(s), _) => s.hosts[0].clone(),
            (None, Some(c)) => c[0].clone(),
            (None, None) => host_port(hostport, 6379)?,
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (non_empty(decode(u)?), non_empty(decode(p)?)),
                None => (None, non_empty(decode(a)?)),
            },
        };
        Ok(RedisUrl {
            host,
            port,
            user,
            password,
            db,
            tls,
            sentinel,
            cluster,
        })
    }

    /// The addresses the host resolves to (a name is looked up once, at
    /// start: the loop never waits for DNS).
    /// With sentinels, theirs (each host's first); with a cluster, the
    /// nodes' the URL names (each host's first).
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        let hosts = match (&self.sentinel, &self.cluster) {
            (Some(s), _) => &s.hosts,
            (None, Some(c)) => c,
            (None, None) => {
                return Ok((self.host.as_str(), self.port).to_socket_addrs()?.collect());
            }
        };
        let mut addrs = Vec::new();
        for (host, port) in hosts {
            addrs.extend((host.as_str(), *port).to_socket_addrs()?.next());
        }
        Ok(addrs)
    }

    /// For logs: the URL without its password.
    pub fn display(&self) -> String {
        if let Some(s) = &self.sentinel {
            let hosts: Vec<String> = s.hosts.iter().map(|(h, p)| bracket(h, *p)).collect();
            let hosts = hosts.join(",");
            let scheme = if self.tls { "rediss" } else { "redis" };
            return format!("{scheme}-sentinel://{hosts}/{}/{}", s.master, self.db);
        }
        let scheme = if self.tls { "rediss" } else { "redis" };
        if let Some(c) = &self.cluster {
            let hosts: Vec<String> = c.iter().map(|(h, p)| bracket(h, *p)).collect();
            return format!("{scheme}-cluster://{}", hosts.join(","));
        }
        format!("{scheme}://{}/{}", bracket(&self.host, self.port), self.db)
    }
}

/// `host:port`, an IPv6 address in brackets.
fn bracket(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host[:port]` or `[v6][:port]`.
fn host_port(hostport: &str, default: u16) -> Result<(String, u16), String> {
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
        None => default,
    };
    Ok((host.to_string(), port))
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
        assert_eq!(u.sentinel, None);
    }

    #[test]
    fn parses_sentinels_and_the_master_name() {
        let u = RedisUrl::parse("redis-sentinel://:pw@s1:5000,[::1],s3/mymaster/2").unwrap();
        let s = u.sentinel.clone().unwrap();
        let hosts = [("s1", 5000), ("::1", 26379), ("s3", 26379)];
        let hosts: Vec<(String, u16)> = hosts.iter().map(|(h, p)| (h.to_string(), *p)).collect();
        assert_eq!(s.hosts, hosts);
        assert_eq!(s.master, "mymaster");
        assert_eq!((u.db, u.password.as_deref(), u.tls), (2, Some("pw"), false));
        assert_eq!(
            u.display(),
            "redis-sentinel://s1:5000,[::1]:26379,s3:26379/mymaster/2"
        );
        let u = RedisUrl::parse("redis-sentinel://s1/m").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("s1", 26379, 0));
        for bad in [
            "redis-sentinel://s1",
            "redis-sentinel://s1/",
            "redis-sentinel://s1,/m",
            "redis-sentinel://s1/m/x",
            "rediss-sentinel://s1",
        ] {
            assert!(RedisUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_cluster_nodes() {
        let u = RedisUrl::parse("redis-cluster://:pw@n1:7000,[::1],n3:7002").unwrap();
        let hosts = [("n1", 7000), ("::1", 6379), ("n3", 7002)];
        let hosts: Vec<(String, u16)> = hosts.iter().map(|(h, p)| (h.to_string(), *p)).collect();
        assert_eq!(u.cluster.as_ref(), Some(&hosts));
        assert_eq!((u.host.as_str(), u.port, u.db), ("n1", 7000, 0));
        assert_eq!(
            (u.password.as_deref(), u.tls, u.sentinel.is_none()),
            (Some("pw"), false, true)
        );
        assert_eq!(u.display(), "redis-cluster://n1:7000,[::1]:6379,n3:7002");
        let u = RedisUrl::parse("rediss-cluster://n1").unwrap();
        assert!(u.tls);
        assert_eq!(u.display(), "rediss-cluster://n1:6379");
        for bad in [
            "redis-cluster://n1/0",
            "redis-cluster://",
            "redis-cluster://n1,",
        ] {
            assert!(RedisUrl::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(RedisUrl::parse("redis://x").unwrap().cluster, None);
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
