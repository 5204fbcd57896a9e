//! The live dashboard: one page and the data it shows, over HTTP.
//!
//! - `GET /` and the page's files (`index.html`, `app.js`, `style.css`,
//!   `uplot.min.js`, `uplot.min.css`) from a directory (the Python package's
//!   `reprise/dashboard/`); only those names are served. The page holds no data,
//!   so it needs no token.
//! - `GET /api/snapshot`: [`Monitor::snapshot`] as JSON.
//! - `GET /api/events`: Server-Sent Events, `event: snapshot` with the snapshot
//!   once a second (the first at once), `: ping` comments in between.
//!
//! The data endpoints follow the metrics rule: with a token, every request must
//! send `Authorization: Bearer <token>` (else 401); off loopback a token is
//! required. One task builds the snapshot once a second while anyone listens and
//! every stream sends that same text, so ten open pages cost what one does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use reprise_core::error::{Error, Result};
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use crate::monitor::Monitor;
use crate::remote::is_loopback;

/// The page's files and their content types.
const FILES: [(&str, &str); 5] = [
    ("index.html", "text/html; charset=utf-8"),
    ("app.js", "text/javascript; charset=utf-8"),
    ("style.css", "text/css; charset=utf-8"),
    ("uplot.min.js", "text/javascript; charset=utf-8"),
    ("uplot.min.css", "text/css; charset=utf-8"),
];

/// Scripts only from the page's own files: a name that slipped into the DOM as
/// markup still could not run.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// How often streams get a new snapshot.
pub const INTERVAL: Duration = Duration::from_secs(1);

struct App {
    monitor: Arc<Monitor>,
    token: Option<String>,
    files: Option<PathBuf>,
    latest: watch::Sender<Arc<str>>,
}

/// A running dashboard; stops when dropped.
pub struct Dashboard {
    address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Dashboard {
    /// Serves the dashboard of `monitor` at `address` (`host:port`, port 0 picks
    /// one), its page from `files` (None: data endpoints only).
    pub fn start(monitor: Arc<Monitor>, address: &str, token: Option<String>, files: Option<PathBuf>) -> Result<Dashboard> {
        if token.as_deref().is_some_and(str::is_empty) {
            return Err(Error::InvalidArgument("token must not be empty".into()));
        }
        if token.is_none() && !is_loopback(address) {
            return Err(Error::InvalidArgument(format!(
                "dashboard_address {address:?} is not loopback: a token is required (the page asks for it)"
            )));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("reprise-dashboard")
            .enable_all()
            .build()
            .map_err(|e| Error::Io(format!("cannot start the dashboard runtime: {e}")))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(address))
            .map_err(|e| Error::InvalidArgument(format!("cannot listen on dashboard_address {address}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        let app = Arc::new(App { monitor, token, files, latest: watch::channel(Arc::from("{}")).0 });
        runtime.spawn(tick(app.clone()));
        let router = Router::new()
            .route("/", get(|s: State<Arc<App>>| page(s, "index.html")))
            .route("/{file}", get(|s: State<Arc<App>>, f: axum::extract::Path<String>| async move { page(s, &f.0).await }))
            .route("/api/snapshot", get(snapshot))
            .route("/api/events", get(events))
            .with_state(app);
        let (tx, rx) = oneshot::channel::<()>();
        runtime.spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Dashboard { address: bound, shutdown: Some(tx), runtime: Some(runtime) })
    }

    /// `host:port` the dashboard listens on.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Closes the listener and every open page's stream. Idempotent.
    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(200));
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Builds the snapshot once per interval while some stream listens.
async fn tick(app: Arc<App>) {
    let mut every = tokio::time::interval(INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        if app.latest.receiver_count() > 0 {
            let text: Arc<str> = Arc::from(app.monitor.snapshot().to_string());
            app.latest.send_replace(text);
        }
    }
}

fn with_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    with_headers((status, [(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn page(State(app): State<Arc<App>>, name: &str) -> Response {
    let Some(&(_, kind)) = FILES.iter().find(|(f, _)| *f == name) else {
        return error(StatusCode::NOT_FOUND, "no such file; the dashboard is at /");
    };
    let Some(dir) = &app.files else {
        return error(StatusCode::NOT_FOUND, "this server has no dashboard page; its data is at /api/snapshot");
    };
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => with_headers(([(header::CONTENT_TYPE, kind)], bytes).into_response()),
        Err(_) => error(StatusCode::NOT_FOUND, "the dashboard's files are missing from this installation"),
    }
}

/// The refusal to answer with, when the request lacks the token.
fn refusal(app: &App, headers: &HeaderMap) -> Option<Response> {
    let given = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    crate::auth::check(app.token.as_deref(), given).err().map(|r| error(StatusCode::UNAUTHORIZED, r.message()))
}

async fn snapshot(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&app, &headers) {
        return r;
    }
    let body = app.monitor.snapshot().to_string();
    with_headers(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn events(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&app, &headers) {
        return r;
    }
    let first: Arc<str> = Arc::from(app.monitor.snapshot().to_string());
    let stream = tokio_stream::once(first).chain(WatchStream::from_changes(app.latest.subscribe()));
    let sse = Sse::new(stream.map(|text| Ok::<_, Infallible>(Event::default().event("snapshot").data(&*text))))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)).text("ping"));
    with_headers(sse.into_response())
}
