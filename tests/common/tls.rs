//! `TEST_WITH_TLS=1`: every server the harness starts serves TLS with a
//! certificate made once per test process (openssl: a CA and a server
//! certificate for 127.0.0.1 and localhost), and the harness's clients
//! (`Http`, `Ws`, `/healthz`) speak TLS to it, trusting that CA. Off, the
//! streams are plain sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

/// Whether the suite runs over TLS.
pub fn tls_mode() -> bool {
    std::env::var_os("TEST_WITH_TLS").is_some()
}

/// In `TEST_WITH_TLS` mode, prints why the test does not run there and
/// returns true (the test then returns at once); otherwise false.
pub fn skip_with_tls(reason: &str) -> bool {
    let skip = tls_mode();
    if skip {
        eprintln!("skipped with TEST_WITH_TLS: {reason}");
    }
    skip
}

/// The certificate files of this test process, made on first use.
pub struct Files {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    config: Arc<ClientConfig>,
}

/// See [`Files`].
pub fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("relay-test-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the certificate directory");
        let path = |f: &str| dir.join(f).display().to_string();
        let key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        openssl(&format!(
            "req -x509 {key} -days 2 -subj /CN=test-ca -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign -keyout {} -out {}",
            path("ca.key"),
            path("ca.pem")
        ));
        std::fs::write(
            dir.join("ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .expect("write the extensions");
        openssl(&format!(
            "req {key} -subj /CN=localhost -keyout {} -out {}",
            path("server.key"),
            path("server.csr")
        ));
        openssl(&format!(
            "x509 -req -days 2 -set_serial 1 -in {} -CA {} -CAkey {} -extfile {} -out {}",
            path("server.csr"),
            path("ca.pem"),
            path("ca.key"),
            path("ext"),
            path("server.pem")
        ));
        let ca = dir.join("ca.pem");
        let config = relay::tls::client_config(Some(&ca), None, Some(b"http/1.1"))
            .expect("client settings for the test CA");
        Files {
            ca,
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            config,
        }
    })
}

/// Runs openssl with `args` split at whitespace (the tests' paths have
/// none).
#[track_caller]
pub fn openssl(args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .output()
        .expect("run openssl (scripts/test installs it)");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A connection of the harness: the socket, or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// `sock` as is, or in `TEST_WITH_TLS` mode with a TLS handshake done
    /// over it (checked against the test CA for 127.0.0.1).
    #[track_caller]
    pub fn over(sock: TcpStream) -> Stream {
        match Stream::try_over(sock) {
            Ok(s) => s,
            Err(e) => panic!("TLS handshake with relay failed: {e}"),
        }
    }

    /// [`Stream::over`], the handshake's failure as a value (a server
    /// killed on purpose).
    pub fn try_over(sock: TcpStream) -> io::Result<Stream> {
        if !tls_mode() {
            return Ok(Stream::Plain(sock));
        }
        let name = ServerName::try_from("127.0.0.1").expect("an IP address name");
        let conn = ClientConnection::new(Arc::clone(&files().config), name).expect("TLS client");
        let mut tls = StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(Stream::Tls(Box::new(tls)))
    }

    /// The socket under it, for timeouts and options.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }

    /// Ends the write side (over TLS, `close_notify` first).
    pub fn shutdown_write(&mut self) {
        if let Stream::Tls(t) = self {
            t.conn.send_close_notify();
            let _ = t.flush();
        }
        let _ = self.tcp().shutdown(Shutdown::Write);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}
