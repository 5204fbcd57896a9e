//! The daemon's counters in Prometheus' text format on a plain HTTP port (`GET /metrics`),
//! as `reprise serve` serves its own. With a token, a scrape must send
//! `Authorization: Bearer TOKEN`, checked by `reprise_core::auth` as on every other
//! endpoint; beyond loopback a token is required (an allow-list admits members, not
//! scrapers). Each connection is answered on its own short-lived thread (at most
//! `MAX_CONNECTIONS` at once, each given 2 s to send its request), so a slow scraper
//! holds only its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use reprise_core::auth;

use crate::stats::Stats;
use crate::Error;

pub struct MetricsServer {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The counters as Prometheus text (`reprise_aggregate_<name>_total`).
pub fn render(stats: &Stats) -> String {
    let mut out = String::new();
    for (name, help, value) in stats.snapshot() {
        let metric = format!("reprise_aggregate_{name}_total");
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} counter\n{metric} {value}\n"));
    }
    out
}

/// Connections answered at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 16;

impl MetricsServer {
    pub fn start(address: &str, stats: Arc<Stats>, token: Option<String>) -> Result<MetricsServer, Error> {
        let listener = TcpListener::bind(address).map_err(|e| Error::Io(format!("cannot serve metrics at {address}: {e}")))?;
        let address = listener.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        if token.is_none() && !address.ip().is_loopback() {
            return Err(Error::InvalidArgument(format!(
                "metrics at {address}: beyond loopback the metrics endpoint needs a token (an allow-list admits \
                 members, not scrapers); set token, or serve metrics on 127.0.0.1"
            )));
        }
        listener.set_nonblocking(true).map_err(|e| Error::Io(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let token: Arc<Option<String>> = Arc::new(token);
        let busy = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("reprise-aggregate-metrics".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((conn, _)) = listener.accept() else {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        };
                        if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                            busy.fetch_sub(1, Ordering::AcqRel);
                            continue; // dropped: closed
                        }
                        let (stats, token, done) = (stats.clone(), token.clone(), busy.clone());
                        let spawned = std::thread::Builder::new().name("reprise-aggregate-scrape".into()).spawn(move || {
                            let _ = answer(conn, &stats, token.as_ref().as_deref());
                            done.fetch_sub(1, Ordering::AcqRel);
                        });
                        if spawned.is_err() {
                            busy.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                })
                .map_err(|e| Error::Io(e.to_string()))?
        };
        Ok(MetricsServer { address, stop, thread: Some(thread) })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer(mut conn: TcpStream, stats: &Stats, token: Option<&str>) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&request);
    let authorized = auth::check(token, auth::http_authorization(&request)).is_ok();
    let (status, body) = if !text.starts_with("GET /metrics") {
        ("404 Not Found", "not found: GET /metrics\n".to_string())
    } else if !authorized {
        ("401 Unauthorized", "this endpoint needs Authorization: Bearer <token>\n".to_string())
    } else {
        ("200 OK", render(stats))
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
