//! Prometheus metrics of a server, on a plain HTTP port (`GET /metrics`).
//!
//! Table numbers (items, inserts, samples, evictions, time callers spent blocked by
//! rate limiters) are read from the tables at each scrape; the service counts
//! requests, bytes in and out and errors per method as they happen.

use std::sync::Arc;

use prometheus::{Encoder, GaugeVec, IntCounterVec, Opts, Registry, TextEncoder};
use reprise_core::Table;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Reads one gauge's value from a table's counters.
type ReadGauge = fn(&reprise_core::TableInfo) -> f64;

/// Counters the gRPC service updates.
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub errors: IntCounterVec,
    pub bytes_received: IntCounterVec,
    pub bytes_sent: IntCounterVec,
    /// Connections and calls the limits refused or ended, by reason (`crate::limits`).
    pub refused: IntCounterVec,
    tables: Vec<Table>,
    gauges: Vec<(GaugeVec, ReadGauge)>,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
    registry.register(Box::new(c.clone())).expect("each metric is registered once");
    c
}

impl Metrics {
    pub fn new(tables: Vec<Table>) -> Metrics {
        let registry = Registry::new();
        let requests = counter(&registry, "reprise_requests_total", "gRPC requests (stream messages count one each)", &["method"]);
        let errors = counter(&registry, "reprise_errors_total", "gRPC calls that ended with an error status", &["method", "code"]);
        let bytes_received = counter(&registry, "reprise_received_bytes_total", "step data received by inserts", &["table"]);
        let bytes_sent = counter(&registry, "reprise_sent_bytes_total", "step data sent in samples", &["table"]);
        let refused = counter(
            &registry,
            "reprise_refused_total",
            "connections refused or closed and calls refused by the server's limits, by reason (max_connections, \
             max_connections_per_peer, idle_timeout, stall_timeout, auth_failure, auth_throttled)",
            &["reason"],
        );
        type Read = fn(&reprise_core::TableInfo) -> f64;
        let defs: [(&str, &str, Read); 8] = [
            ("reprise_table_size", "items in the table", |i| i.size as f64),
            ("reprise_table_max_size", "the table's max_size", |i| i.max_size as f64),
            ("reprise_table_inserts_total", "items inserted since the table was made", |i| i.num_inserts as f64),
            ("reprise_table_samples_total", "items sampled since the table was made", |i| i.num_samples as f64),
            ("reprise_table_evictions_total", "items removed by the remover, max_times_sampled or store pressure", |i| i.num_evictions as f64),
            ("reprise_table_deletes_total", "items deleted by key", |i| i.num_deletes as f64),
            ("reprise_table_blocked_insert_seconds_total", "time inserts waited for the rate limiter", |i| i.blocked_insert_seconds),
            ("reprise_table_blocked_sample_seconds_total", "time samples waited for the rate limiter", |i| i.blocked_sample_seconds),
        ];
        let gauges = defs
            .into_iter()
            .map(|(name, help, read)| {
                let g = GaugeVec::new(Opts::new(name, help), &["table"]).expect("a valid metric definition");
                registry.register(Box::new(g.clone())).expect("each metric is registered once");
                (g, read)
            })
            .collect();
        Metrics { registry, requests, errors, bytes_received, bytes_sent, refused, tables, gauges }
    }

    /// The text exposition of every metric, table numbers read now.
    pub fn render(&self) -> Vec<u8> {
        for t in &self.tables {
            let info = t.info();
            for (g, read) in &self.gauges {
                g.with_label_values(&[t.name()]).set(read(&info));
            }
        }
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// Answers `GET /metrics` on `listener` until the runtime stops. Requests are read up
/// to 8 KiB; anything else gets 404, a malformed request 400. With `token`, a scrape
/// must send `Authorization: Bearer <token>` (else 401), checked by [`crate::auth::check`].
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, token: Option<String>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let (metrics, token) = (metrics.clone(), token.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while len < buf.len() {
                    match conn.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            let text = std::str::from_utf8(&buf[..len]).unwrap_or("");
            let line = text.lines().next().unwrap_or("");
            let authorized = crate::auth::check(token.as_deref(), crate::auth::http_authorization(&buf[..len])).is_ok();
            let (status, body, kind) = if read.is_err() || line.is_empty() {
                ("400 Bad Request", b"bad request\n".to_vec(), "text/plain")
            } else if !authorized {
                ("401 Unauthorized", b"send Authorization: Bearer <token>\n".to_vec(), "text/plain")
            } else if line.starts_with("GET /metrics ") || line == "GET /metrics" {
                ("200 OK", metrics.render(), "text/plain; version=0.0.4")
            } else {
                ("404 Not Found", b"try /metrics\n".to_vec(), "text/plain")
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(&body).await;
            let _ = conn.shutdown().await;
        });
    }
}
