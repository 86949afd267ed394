//! Signals: SIGHUP reloads the certificate; SIGINT and SIGTERM begin a
//! bounded shutdown (the grace for parked requests and subscribers, then
//! every write still waiting for storage answered).

use super::*;

impl Server {
    /// SIGHUP reloads the certificate; SIGINT and SIGTERM shut down.
    pub(super) fn on_signal(&mut self) {
        let Some(signals) = &mut self.signals else {
            return;
        };
        let (mut reload, mut stop) = (false, false);
        for signal in signals.pending() {
            if signal == SIGHUP {
                reload = true;
            } else {
                stop = true;
            }
        }
        if reload {
            self.reload_tls();
        }
        if stop {
            self.begin_shutdown();
        }
    }

    /// Reads the certificate files again: connections accepted from now on
    /// use the new pair, open ones keep theirs. A pair that fails to load
    /// is logged and the one in use stays.
    pub(super) fn reload_tls(&mut self) {
        let Some(files) = &self.cx.cfg().tls else {
            info!("SIGHUP: no TLS certificate to reload");
            return;
        };
        match crate::tls::server_config(files) {
            Ok(config) => {
                self.tls = Some(config);
                info!(cert = files.cert.display().to_string().as_str(); "TLS certificate reloaded");
            }
            Err(e) => {
                log::error!(error = e.as_str(); "TLS certificate reload failed; keeping the one in use");
            }
        }
    }

    /// Stops accepting, answers parked polls `[]`, closes subscribers with
    /// 1001 and idle connections at once, and lets in-flight requests finish
    /// with `Connection: close`. The loop exits when every connection is
    /// gone or the grace period ends.
    pub fn begin_shutdown(&mut self) {
        let now = self.cx.now();
        if self.cx.shutdown_at().is_some() {
            // A second signal: stop now.
            self.cx.shut_down_by(now);
            return;
        }
        info!("shutting down");
        self.cx.shut_down_by(now.after(SHUTDOWN_GRACE));
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let ids: Vec<ConnId> = self.conns.iter().map(|(k, c)| c.id(k)).collect();
        for id in ids {
            let Some(conn) = lookup(&mut self.conns, id) else {
                continue;
            };
            let cx = &mut self.cx;
            let idle = match conn.phase() {
                Phase::Parked(..) => {
                    parked::timed_out(id, conn, cx);
                    false
                }
                Phase::WebSocket(_) => {
                    subscriber::close(id, conn, cx, 1001, "server shutting down");
                    false
                }
                // An answer still going out is finished, then closed.
                Phase::Http(h) if !h.reader.mid_request() => {
                    conn.queued() == 0 || {
                        closing::begin(id, conn, cx);
                        false
                    }
                }
                _ => false,
            };
            if idle {
                self.close(id);
            }
        }
    }

    /// The shutdown's last turn: every request still waiting for its write
    /// is answered (`503` for a write cancelled before the storage took
    /// it, `504` for one it holds and has not confirmed), and what can be
    /// written now is.
    pub(super) fn answer_waiting_writes(&mut self) {
        let waiting: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase(), Phase::Committing(..)))
            .map(|(k, c)| c.id(k))
            .collect();
        if waiting.is_empty() {
            return;
        }
        info!(requests = waiting.len(); "answering the writes the storage has not confirmed");
        for id in waiting {
            if let Some(conn) = lookup(&mut self.conns, id) {
                parked::commit_timed_out(id, conn, &mut self.cx, true);
            }
        }
        self.apply_effects();
        self.flush_pending();
    }
}
