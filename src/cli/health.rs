//! `relay health`: the container health check. A `FROM scratch` image has
//! no shell or curl, so the binary checks itself: `GET /healthz`, exit 0 on
//! `200`, 1 otherwise, one line of output either way.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Spec;
use super::client::{Client, Limit, Url};

/// How long the whole check may take.
const TIMEOUT: Duration = Duration::from_secs(5);

const HELP: &str = "usage: relay health [--url URL] [--ca FILE]

GET /healthz. Prints the body and exits 0 on 200; prints the reason to
stderr and exits 1 otherwise (refused, timed out after 5 s, another status).
The URL is --url, else RELAY_URL, else the server's own address from
RELAY_HOST and RELAY_PORT
(or PORT): http://127.0.0.1:$RELAY_PORT when it listens on every address
(https:// when RELAY_TLS_CERT is set).
An https:// URL is checked against the CA in --ca FILE (default RELAY_CA,
else the system's trust store, else built-in Mozilla roots). Without
--url, --ca and RELAY_CA, a server with RELAY_TLS_CERT is checked against
the chain in that file and for the name its certificate is made for: a
container's health check needs no more than the server's own settings.

exit codes: 0 healthy, 1 not, 2 bad usage
";

const SPEC: Spec = Spec {
    valued: &["--url", "--ca"],
    switches: &[],
    interleaved: false,
};

/// `relay health ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let parsed = match super::flags_only("health", args, &SPEC, HELP) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // `--url`, else `RELAY_URL` as the other tools read it, else the
    // server's own address.
    let url = match (parsed.value("--url"), super::env_value(env, "RELAY_URL")) {
        (Some(raw), _) => Url::parse(raw).map_err(|e| format!("invalid --url {e}")),
        (None, Some(raw)) => Url::parse(raw).map_err(|e| format!("invalid RELAY_URL {e}")),
        (None, None) => own_url(env),
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return super::usage_error("health", &e),
    };
    let own_cert = own_certificate(&parsed, env);
    let tls = match &own_cert {
        Some(cert) => crate::tls::client_config(Some(cert), None, Some(crate::tls::ALPN_HTTP11))
            .map(Some)
            .map_err(|e| format!("RELAY_TLS_CERT: {e}")),
        None => super::tls_of(&parsed, env, &url),
    };
    let tls = match tls {
        Ok(t) => t,
        Err(e) => return super::usage_error("health", &e),
    };
    let target = url.http("/healthz");
    let mut client = Client::new(url, None, tls);
    if let Some(name) = own_cert.as_deref().and_then(crate::tls::certificate_name) {
        client = client.verify_as(name);
    }
    match client.request("GET", "/healthz", None, Limit::within(TIMEOUT)) {
        Ok(resp) if resp.status == 200 => {
            println!("{}", String::from_utf8_lossy(&resp.body).trim_end());
            0
        }
        Ok(resp) => {
            eprintln!("relay health: {target}: {}", resp.describe());
            1
        }
        Err(e) => {
            eprintln!("relay health: {target}: {e}");
            1
        }
    }
}

/// The server's own certificate file (`RELAY_TLS_CERT`) when `relay health`
/// checks its own server over TLS without being told what to trust (no
/// `--url`, `RELAY_URL`, `--ca` or `RELAY_CA`): the chain the server serves, checked
/// for the name it is made for, is then what is trusted. A container's
/// health check needs nothing more than the server's own settings.
fn own_certificate(parsed: &super::Parsed, env: &[(String, String)]) -> Option<PathBuf> {
    if parsed.value("--url").is_some()
        || super::env_value(env, "RELAY_URL").is_some()
        || parsed.value("--ca").is_some()
        || super::env_value(env, "RELAY_CA").is_some()
    {
        return None;
    }
    super::env_value(env, "RELAY_TLS_CERT").map(PathBuf::from)
}

/// The address the server itself would listen on, read with the server's
/// own settings parser; an unspecified address means loopback.
fn own_url(env: &[(String, String)]) -> Result<Url, String> {
    let address = env
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "RELAY_HOST" | "RELAY_PORT" | "PORT"))
        .cloned();
    let cfg = match crate::config::parse(address, std::iter::empty())? {
        crate::config::Command::Run { cfg, .. } => cfg,
        _ => return Err("unexpected address settings".into()),
    };
    let host = match cfg.host {
        IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_string(),
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    // A server with its own certificate answers only TLS.
    let tls = env
        .iter()
        .any(|(k, v)| k == "RELAY_TLS_CERT" && !v.trim().is_empty());
    let scheme = if tls { "https" } else { "http" };
    Url::parse(&format!("{scheme}://{host}:{}", cfg.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_default_url_is_the_servers_own_address() {
        let u = own_url(&env(&[])).unwrap();
        assert_eq!(u, Url::parse("http://127.0.0.1:8000").unwrap());
        let u = own_url(&env(&[("PORT", "7000"), ("RELAY_HOST", "::")])).unwrap();
        assert_eq!(u, Url::parse("http://[::1]:7000").unwrap());
        let u = own_url(&env(&[("RELAY_PORT", "9001"), ("RELAY_HOST", "10.0.0.2")])).unwrap();
        assert_eq!(u, Url::parse("http://10.0.0.2:9001").unwrap());
        assert!(own_url(&env(&[("RELAY_PORT", "x")])).is_err());
        let u = own_url(&env(&[("RELAY_TLS_CERT", "/etc/relay/cert.pem")])).unwrap();
        assert_eq!(u, Url::parse("https://127.0.0.1:8000").unwrap());
    }
}
