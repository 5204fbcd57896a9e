//! The local server and client in one process: writes land in place, samples read
//! in place, blocks come back when connections close, bad commits are refused.

use std::time::Duration;

use reprise_client::LocalClient;
use reprise_core::rate_limiter::RateLimiterConfig;
use reprise_core::selectors::SelectorSpec;
use reprise_core::signature::{DType, Field, Signature};
use reprise_core::{Collect, Error, Store, Table, TableConfig};
use reprise_server::LocalServer;

fn setup(name: &str) -> (Store, Table, LocalServer) {
    let sig = Signature::new(vec![Field::new("v", DType::Int64, vec![]).unwrap()]).unwrap();
    let store = Store::new(sig, 256, 8, None).unwrap();
    let table = Table::new(
        TableConfig {
            name: "replay".into(),
            sampler: SelectorSpec::Fifo,
            remover: SelectorSpec::Fifo,
            max_size: 128,
            max_times_sampled: 0,
            rate_limiter: RateLimiterConfig::min_size(1).unwrap(),
            seed: Some(0),
            evict_when_store_full: true,
            external_selection: false,
        },
        &store,
    )
    .unwrap();
    let server = LocalServer::start(vec![table.clone()], Some(name)).unwrap();
    (store, table, server)
}

fn values(sample: &impl Collect) -> Vec<i64> {
    let t = sample.max_length();
    let mut out = vec![0u8; 8 * t as usize * sample.items().len()];
    sample.gather(0, t, &mut out);
    out.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn client_writes_in_place_and_samples_read_in_place() {
    let (store, table, server) = setup(&format!("t-rw-{}", std::process::id()));
    let client = LocalClient::connect(server.path()).unwrap();
    let mut w = client.writer(None, None).unwrap();
    for v in 0..10i64 {
        w.append(&[&v.to_ne_bytes()]).unwrap();
        if v >= 2 {
            w.create_item("replay", 3, 1.0).unwrap();
        }
    }
    w.flush(None, None).unwrap();
    assert_eq!(table.size(), 8);
    let (s, err) = client.sample("replay", 2, Some(Duration::ZERO), None).unwrap();
    assert!(err.is_none());
    assert_eq!(values(&s), vec![0, 1, 2, 0, 1, 2]);
    drop(s);
    w.close().unwrap();
    drop(w);
    // Only items hold blocks now: 10 steps in 2 blocks of 8.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(store.free_blocks(), store.num_blocks() as usize - 2);
    assert_eq!(client.info().unwrap()[0].size, 8);
}

#[test]
fn a_dropped_connection_returns_its_blocks_and_leaves_no_partial_item() {
    let (store, table, server) = setup(&format!("t-drop-{}", std::process::id()));
    let client = LocalClient::connect(server.path()).unwrap();
    let mut w = client.writer(None, None).unwrap();
    for v in 0..20i64 {
        w.append(&[&v.to_ne_bytes()]).unwrap();
    }
    w.create_item("replay", 1, 1.0).unwrap();
    // Dropped without flush or close: like a killed client (the queued item is never sent).
    std::mem::forget(w);
    drop(client);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(table.size(), 0);
    // The forgotten writer's socket is still open in this process, so its blocks
    // stay held until the server stops.
    drop(server);
    assert_eq!(store.free_blocks(), store.num_blocks() as usize);
}

#[test]
fn a_second_server_with_the_same_name_is_refused() {
    let name = format!("t-dup-{}", std::process::id());
    let (_store, table, _server) = setup(&name);
    let e = LocalServer::start(vec![table], Some(&name)).err().unwrap();
    assert!(e.to_string().contains("already running"), "{e}");
}

#[test]
fn a_client_of_a_stopped_server_gets_an_error_not_a_hang() {
    let (_store, _table, mut server) = setup(&format!("t-stop-{}", std::process::id()));
    let client = LocalClient::connect(server.path()).unwrap();
    server.stop();
    let e = client.sample("replay", 1, None, None).err().unwrap();
    assert!(matches!(e, Error::Io(_)), "{e}");
    assert!(LocalClient::connect(server.path()).is_err());
}

#[test]
fn unknown_tables_are_not_found() {
    let (_store, _table, server) = setup(&format!("t-nf-{}", std::process::id()));
    let client = LocalClient::connect(server.path()).unwrap();
    assert!(matches!(client.sample("nope", 1, None, None), Err(Error::NotFound(_))));
    let mut w = client.writer(None, None).unwrap();
    w.append(&[&1i64.to_ne_bytes()]).unwrap();
    assert!(matches!(w.create_item("nope", 1, 1.0), Err(Error::NotFound(_))));
    assert!(matches!(w.create_item("replay", 1, f64::NAN), Err(Error::InvalidArgument(_))));
    assert!(matches!(w.create_item("replay", 2, 1.0), Err(Error::InvalidArgument(_))));
}
