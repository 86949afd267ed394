//! Test certificates made with openssl, and a small rustls client: a TLS
//! connection checked against a test CA, one request, one answer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use serde_json::Value;

use crate::common::{Server, openssl};

pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Certificates made for one test in a directory of their own, removed on
/// drop.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// A CA named `ca` and a server certificate `server` it signed, for
    /// localhost and 127.0.0.1.
    pub fn new() -> Certs {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("relay-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let certs = Certs { dir };
        certs.ca("ca");
        certs.leaf("server", "ca", "DNS:localhost,IP:127.0.0.1");
        certs
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn pem(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.key"))
    }

    /// `-keyout name.key -out name.pem`, for the commands below.
    fn outputs(&self, name: &str) -> String {
        format!(
            "-keyout {} -out {}",
            self.key(name).display(),
            self.pem(name).display()
        )
    }

    /// A self-signed CA certificate `name.pem` with its key `name.key`.
    pub fn ca(&self, name: &str) {
        openssl(&format!(
            "req -x509 {NEW_KEY} -days 2 -subj /CN={name} \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign {}",
            self.outputs(name)
        ));
    }

    /// A server certificate `name.pem` (key `name.key`) for the names in
    /// `san` (`DNS:…,IP:…`), signed by the CA `ca`.
    pub fn leaf(&self, name: &str, ca: &str, san: &str) {
        let csr = self.path(&format!("{name}.csr"));
        let ext = self.path(&format!("{name}.ext"));
        let extensions = format!(
            "subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        );
        std::fs::write(&ext, extensions).unwrap();
        openssl(&format!(
            "req {NEW_KEY} -subj /CN={name} -keyout {} -out {}",
            self.key(name).display(),
            csr.display()
        ));
        openssl(&format!(
            "x509 -req -days 2 -set_serial 2 -in {} -CA {} -CAkey {} -extfile {} -out {}",
            csr.display(),
            self.pem(ca).display(),
            self.key(ca).display(),
            ext.display(),
            self.pem(name).display()
        ));
    }

    /// A self-signed server certificate `name.pem` (key `name.key`) for
    /// localhost and 127.0.0.1; `ca` says whether it is marked as a CA, as
    /// `openssl req -x509` does by default.
    pub fn self_signed(&self, name: &str, ca: bool) {
        let constraints = if ca { "CA:TRUE" } else { "CA:FALSE" };
        openssl(&format!(
            "req -x509 {NEW_KEY} -days 2 -subj /CN=localhost \
             -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
             -addext basicConstraints=critical,{constraints} {}",
            self.outputs(name)
        ));
    }

    /// Starts a relay serving the certificate `name`, with `extra` settings.
    #[track_caller]
    pub fn server(&self, name: &str, extra: &[(&str, &str)]) -> Server {
        let (cert, key) = (self.pem(name), self.key(name));
        let mut env = vec![
            ("RELAY_TLS_CERT", cert.to_str().unwrap()),
            ("RELAY_TLS_KEY", key.to_str().unwrap()),
        ];
        env.extend_from_slice(extra);
        Server::start_single_with(&env)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A new P-256 key, unencrypted.
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

pub type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr` checked against the CA file `ca` for the
/// name `host`, its handshake done; the error is rustls's.
pub fn try_connect(addr: SocketAddr, ca: &Path, host: &str) -> Result<Tls, std::io::Error> {
    let config = relay::tls::client_config(Some(ca), None, Some(b"http/1.1")).unwrap();
    let name = ServerName::try_from(host.to_string()).unwrap();
    let conn = ClientConnection::new(config, name).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    sock.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut tls = StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

#[track_caller]
pub fn connect(srv: &Server, certs: &Certs) -> Tls {
    try_connect(srv.addr(), &certs.pem("ca"), "localhost").expect("TLS handshake")
}

/// One request on `tls`; the answer's status and body (framed by
/// `Content-Length`, which is all the server sends).
#[track_caller]
pub fn request(tls: &mut Tls, method: &str, path: &str, body: Option<&Value>) -> (u16, Vec<u8>) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).unwrap();
    tls.write_all(body.as_bytes()).unwrap();
    tls.flush().unwrap();
    read_response(tls)
}

#[track_caller]
pub fn read_response(tls: &mut Tls) -> (u16, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tls.read(&mut byte).expect("read the answer's head");
        assert_eq!(
            n,
            1,
            "closed before the head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).expect("read the body");
    (status, body)
}

/// Polls `/healthz` over TLS (bounded) until `parked_polls` is `n`.
#[track_caller]
pub fn wait_parked(srv: &Server, certs: &Certs, n: u64) {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut tls = connect(srv, certs);
    loop {
        let (status, body) = request(&mut tls, "GET", "/healthz", None);
        assert_eq!(status, 200);
        if json_of(&body)["parked_polls"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "parked_polls never became {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

/// Whether the peer closes `sock` (EOF or reset) within `within`; bytes it
/// sends first are skipped.
pub fn closed_within(sock: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}
