//! The daemon's counters in Prometheus' text format on a plain HTTP port (`GET /metrics`),
//! as `reprise serve` serves its own. With a token, a scrape must send
//! `Authorization: Bearer TOKEN`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use subtle::ConstantTimeEq;

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

impl MetricsServer {
    pub fn start(address: &str, stats: Arc<Stats>, token: Option<String>) -> Result<MetricsServer, Error> {
        let listener = TcpListener::bind(address).map_err(|e| Error::Io(format!("cannot serve metrics at {address}: {e}")))?;
        let address = listener.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        listener.set_nonblocking(true).map_err(|e| Error::Io(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("reprise-aggregate-metrics".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((conn, _)) => {
                                let _ = answer(conn, &stats, token.as_deref());
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(50)),
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
    let authorized = token.is_none_or(|t| {
        text.lines().any(|l| {
            let (name, value) = l.split_once(':').unwrap_or(("", ""));
            name.eq_ignore_ascii_case("authorization")
                && bool::from(value.trim().trim_start_matches("Bearer ").as_bytes().ct_eq(t.as_bytes()))
        })
    });
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
