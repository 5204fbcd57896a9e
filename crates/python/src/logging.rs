//! Rust log records (`tracing` events with target "reprise", forwarded through the
//! `log` crate when no `tracing` subscriber is set) -> Python's `logging` module,
//! logger "reprise".
//!
//! Records are handed to one thread, "reprise-log", that takes the GIL to log
//! them: the thread that logs (a table waiting on its rate limiter, a server
//! connection) may hold locks a GIL-holding Python thread waits for, so it never
//! takes the GIL itself. A record that cannot get the GIL within a second is
//! printed to stderr instead. Records after the interpreter has begun to shut
//! down are dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;

struct ToPython {
    tx: Mutex<Sender<(log::Level, String, String)>>,
}

impl log::Log for ToPython {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("reprise") && metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            if let Ok(tx) = self.tx.lock() {
                let _ = tx.send((record.level(), record.target().replace("::", "."), record.args().to_string()));
            }
        }
    }

    fn flush(&self) {}
}

/// Logs one record through Python's `logging`, from a thread of its own that
/// waits for the GIL. A thread that holds the GIL while it waits for a server (a
/// local writer's `append` that needs a block) would keep it for ever, so after
/// [`GIL_PATIENCE`] the message goes to stderr instead; exactly one of the two
/// prints it. False once the interpreter is shutting down.
fn deliver(level: log::Level, target: String, message: String) -> bool {
    let python_level = match level {
        log::Level::Error => 40,
        log::Level::Warn => 30,
        log::Level::Info => 20,
        log::Level::Debug | log::Level::Trace => 10,
    };
    let printed = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = channel::<bool>();
    let (claim, text) = (printed.clone(), message.clone());
    let spawned = std::thread::Builder::new().name("reprise-log-gil".into()).spawn(move || {
        let attached = Python::try_attach(|py| {
            if !claim.swap(true, Ordering::SeqCst) {
                let logged = py.import("logging").and_then(|m| m.call_method1("getLogger", (target,))).and_then(|logger| logger.call_method1("log", (python_level, text)));
                drop(logged); // a failing handler is Python's to report, not ours
            }
        });
        let _ = done_tx.send(attached.is_some());
    });
    if spawned.is_err() {
        eprintln!("{message}");
        return true;
    }
    match done_rx.recv_timeout(GIL_PATIENCE) {
        Ok(attached) => attached,
        Err(_) => {
            if !printed.swap(true, Ordering::SeqCst) {
                eprintln!("{message}");
            }
            true
        }
    }
}

/// How long a record waits for the GIL before it is printed to stderr.
const GIL_PATIENCE: Duration = Duration::from_secs(1);

/// Installs the forwarding logger once per process (a no-op when another
/// extension has already installed a `log` logger).
pub fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let (tx, rx) = channel::<(log::Level, String, String)>();
        let spawned = std::thread::Builder::new().name("reprise-log".into()).spawn(move || {
            for (level, target, message) in rx {
                if !deliver(level, target, message) {
                    return; // the interpreter is shutting down
                }
            }
        });
        if spawned.is_ok() && log::set_boxed_logger(Box::new(ToPython { tx: Mutex::new(tx) })).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
    });
}
