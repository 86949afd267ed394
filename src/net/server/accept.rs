//! Accepting connections: every waiting one at once, a 503 for each over
//! the cap, the listener with its backlog.

use super::*;

impl Server {
    /// Accepts every waiting connection; over the cap each gets a 503.
    pub(super) fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let (mut sock, addr) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: try again next turn.
                    warn!(error = e.to_string().as_str(); "accept failed");
                    self.accept_retry = true;
                    return;
                }
            };
            let max = self.cx.cfg().max_connections;
            let full = self.conns.len() >= max;
            if full && (self.conns.len() >= max + REJECT_SLOTS || self.tls.is_some()) {
                // Dropped: the cap and the reject slots are full, or the
                // 503 would cost a whole TLS handshake first.
                continue;
            }
            let _ = sock.set_nodelay(true);
            let open = self.conns.len() + 1;
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            let interest = Interest::READABLE | Interest::WRITABLE;
            if self
                .poll
                .registry()
                .register(&mut sock, Token(key), interest)
                .is_err()
            {
                continue;
            }
            self.next_gen = self.next_gen.wrapping_add(1);
            let generation = self.next_gen;
            let now = self.cx.now();
            let max_body = self.cx.cfg().max_body_bytes;
            let sock = match &self.tls {
                None => Stream::Plain(sock),
                Some(config) => {
                    match rustls::server::UnbufferedServerConnection::new(Arc::clone(config)) {
                        Ok(tls) => Stream::tls(sock, tls.into(), TLS_READ_BUDGET),
                        Err(e) => {
                            warn!(error = e.to_string().as_str(); "cannot start TLS");
                            let _ = self.poll.registry().deregister(&mut sock);
                            continue;
                        }
                    }
                }
            };
            let conn = entry.insert(Conn::new(generation, sock, addr.ip(), max_body, now));
            conn.out().count_on(self.cx.memory_meter());
            let id = ConnId {
                key: key as u32,
                generation,
            };
            self.cx.accepted(open);
            if full {
                let err = ApiError::unavailable("connection limit reached");
                let answer = Answer::from(err);
                let meta = self.cx.meta(None, false);
                http::queue(conn, answer, &meta);
                closing::begin(id, conn, &mut self.cx);
            } else {
                let deadline = now.after(self.cx.cfg().request_timeout);
                self.cx.set_deadline(id, conn, deadline);
            }
        }
    }
}

/// Pending connections the kernel queues before `accept`. mio (like std)
/// uses 128, which drops SYNs when a few hundred clients connect at once and
/// costs each of them a one-second retry; the kernel caps this at
/// `net.core.somaxconn` (4096 on current Linux).
const LISTEN_BACKLOG: i32 = 4096;

/// Binds a non-blocking listener with `SO_REUSEADDR` and a deep backlog.
pub(super) fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}
