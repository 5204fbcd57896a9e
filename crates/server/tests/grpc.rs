//! The gRPC service against bad input over the wire: wrong sizes, unknown names, NaN
//! priorities, oversized, garbage and truncated messages. Each is refused with a status
//! that names the problem, nothing partial is stored, and the server stays up.

use std::time::Duration;

use bytes::{Buf, BufMut};
use prost::Message;
use reprise_client::pb::{self, replay_client::ReplayClient};
use reprise_core::{DType, Field, RateLimiterConfig, SelectorSpec, Signature, Store, Table, TableConfig};
use reprise_server::{GrpcOptions, GrpcServer};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

fn setup(max_message_bytes: usize) -> (Store, Table, GrpcServer) {
    let sig = Signature::new(vec![Field::new("x", DType::Float32, vec![4]).unwrap()]).unwrap();
    let store = Store::new(sig, 1024, 16, None).unwrap();
    let config = TableConfig {
        name: "t".into(),
        sampler: SelectorSpec::Uniform,
        remover: SelectorSpec::Fifo,
        max_size: 100,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::new(1.0, 1, f64::NEG_INFINITY, f64::INFINITY).unwrap(),
        seed: Some(1),
        evict_when_store_full: true,
        external_selection: false,
    };
    let table = Table::new(config, &store).unwrap();
    let options = GrpcOptions { max_message_bytes, ..GrpcOptions::default() };
    let server = GrpcServer::start(vec![table.clone()], "127.0.0.1:0", options).unwrap();
    (store, table, server)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn connect(server: &GrpcServer) -> Channel {
    Channel::from_shared(format!("http://{}", server.address())).unwrap().connect().await.unwrap()
}

fn steps(n: u32, bytes_per_step: usize) -> pb::InsertOp {
    pb::InsertOp { op: Some(pb::insert_op::Op::Steps(pb::Steps { num_steps: n, columns: vec![vec![0u8; n as usize * bytes_per_step].into()] })) }
}

fn item(table: &str, n: u32, priority: f64) -> pb::InsertOp {
    pb::InsertOp { op: Some(pb::insert_op::Op::CreateItem(pb::CreateItem { table: table.into(), num_steps: n, priority })) }
}

fn flush() -> pb::InsertOp {
    pb::InsertOp { op: Some(pb::insert_op::Op::Flush(pb::Flush { id: 1 })) }
}

/// Sends one insert message on a new stream; returns the first response or status.
async fn insert_once(channel: Channel, ops: Vec<pb::InsertOp>) -> Result<pb::InsertResponse, Status> {
    let mut client = ReplayClient::new(channel);
    let req = pb::InsertRequest { table: "t".into(), max_sequence_length: 0, timeout_seconds: 1.0, ops };
    let mut stream = client.insert(tokio_stream::iter(vec![req])).await?.into_inner();
    match stream.message().await? {
        Some(r) => Ok(r),
        None => Err(Status::unknown("the stream ended without an answer")),
    }
}

#[test]
fn bad_insert_messages_are_refused_with_a_named_problem() {
    let (store, table, server) = setup(1 << 20);
    let rt = runtime();
    rt.block_on(async {
        let ch = connect(&server).await;
        let cases: Vec<(Vec<pb::InsertOp>, Code, &str)> = vec![
            (vec![steps(2, 8), item("t", 1, 1.0), flush()], Code::InvalidArgument, "field 'x' has 16 bytes for 2 steps; expected 32"),
            (vec![pb::InsertOp { op: Some(pb::insert_op::Op::Steps(pb::Steps { num_steps: 1, columns: vec![] })) }], Code::InvalidArgument, "0 columns, expected one per field"),
            (vec![steps(0, 16)], Code::InvalidArgument, "num_steps must be >= 1"),
            (vec![pb::InsertOp { op: None }], Code::InvalidArgument, "no kind set"),
            (vec![steps(1, 16), item("nope", 1, 1.0), flush()], Code::NotFound, "no table named 'nope'"),
            (vec![steps(1, 16), item("t", 1, f64::NAN), flush()], Code::InvalidArgument, "NaN"),
            (vec![steps(1, 16), item("t", 1, -1.0), flush()], Code::InvalidArgument, "priority"),
            (vec![steps(1, 16), item("t", 3, 1.0), flush()], Code::InvalidArgument, "longer than the episode"),
        ];
        for (ops, code, message) in cases {
            let err = insert_once(ch.clone(), ops).await.unwrap_err();
            assert_eq!(err.code(), code, "{err:?}");
            assert!(err.message().contains(message), "{message:?} not in {:?}", err.message());
        }
        // An unknown table in the stream's first message.
        let mut client = ReplayClient::new(ch.clone());
        let req = pb::InsertRequest { table: "zz".into(), ops: vec![flush()], ..Default::default() };
        let err = match client.insert(tokio_stream::iter(vec![req])).await {
            Ok(r) => r.into_inner().message().await.unwrap_err(),
            Err(e) => e,
        };
        assert_eq!(err.code(), Code::NotFound);
        // Good messages still work, on the same connection.
        let ok = insert_once(ch.clone(), vec![steps(2, 16), item("t", 2, 1.0), flush()]).await.unwrap();
        assert_eq!(ok.keys.len(), 1);
    });
    assert_eq!(table.size(), 1, "nothing from the refused messages was stored");
    drop(rt);
    drop(server);
    // Every stream ended: only the one item's block is held.
    assert_eq!(store.free_blocks() as u32, store.num_blocks() - 1);
}

#[test]
fn a_stream_that_ends_without_create_item_leaves_no_item() {
    let (store, table, server) = setup(1 << 20);
    let rt = runtime();
    rt.block_on(async {
        let ch = connect(&server).await;
        let mut client = ReplayClient::new(ch);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut stream = client.insert(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        let first = pb::InsertRequest { table: "t".into(), ops: vec![steps(5, 16), item("t", 2, 1.0), flush()], ..Default::default() };
        tx.send(first).await.unwrap();
        assert_eq!(stream.message().await.unwrap().unwrap().keys.len(), 1);
        tx.send(pb::InsertRequest { ops: vec![steps(3, 16)], ..Default::default() }).await.unwrap();
        drop(tx); // the client goes away: steps without an item
        assert!(stream.message().await.unwrap().is_none());
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(table.size(), 1);
    drop(rt); // the client's connection goes with its runtime
    drop(server);
    assert_eq!(store.free_blocks() as u32, store.num_blocks() - 1);
}

#[test]
fn oversized_messages_are_refused_and_the_server_stays_up() {
    let (_store, table, server) = setup(64 << 10);
    let rt = runtime();
    rt.block_on(async {
        let ch = connect(&server).await;
        let err = insert_once(ch.clone(), vec![steps(8192, 16), item("t", 1, 1.0), flush()]).await.unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
        assert!(err.message().contains("message length too large"), "{}", err.message());
        // A sample request for more items than max_batch_items is refused before any is drawn.
        let mut client = ReplayClient::new(ch.clone());
        let layout = client.get_layout(pb::GetLayoutRequest {}).await.unwrap().into_inner();
        assert_eq!(layout.max_message_bytes, 64 << 10);
        let too_many = pb::SampleRequest { table: "t".into(), num_items: layout.max_batch_items + 1, fields: vec![], timeout_seconds: 0.0 };
        let err = client.sample(tokio_stream::iter(vec![too_many])).await.unwrap().into_inner().message().await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("max_batch_items"));
    });
    assert_eq!(table.size(), 0);
}

/// Sends raw bytes as a gRPC message: what a broken or hostile client could send.
#[derive(Clone, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let v = src.chunk().to_vec();
        src.advance(v.len());
        Ok(Some(v))
    }
}

#[test]
fn garbage_and_truncated_messages_are_refused() {
    let (_store, table, server) = setup(1 << 20);
    let keys: Vec<u64> = vec![];
    let rt = runtime();
    rt.block_on(async {
        let ch = connect(&server).await;
        let good = pb::UpdatePrioritiesRequest { table: "t".into(), keys: vec![1, 2, 3], priorities: vec![1.0, 2.0, 3.0] }.encode_to_vec();
        let truncated = good[..good.len() - 3].to_vec();
        for body in [vec![0xff; 40], truncated, vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]] {
            let mut grpc = tonic::client::Grpc::new(ch.clone());
            grpc.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static("/reprise.v1.Replay/UpdatePriorities");
            let err = grpc.unary(tonic::Request::new(body), path, Raw).await.unwrap_err();
            assert_eq!(err.code(), Code::Internal, "{err:?}");
            assert!(err.message().contains("decode"), "{}", err.message());
        }
        // The server still answers.
        let mut client = ReplayClient::new(ch);
        assert_eq!(client.get_layout(pb::GetLayoutRequest {}).await.unwrap().into_inner().tables.len(), 1);
        let count = client.update_priorities(pb::UpdatePrioritiesRequest { table: "t".into(), keys: keys.clone(), priorities: vec![] }).await.unwrap();
        assert_eq!(count.into_inner().count, 0);
    });
    assert_eq!(table.size(), 0);
}

#[test]
fn rust_client_writes_samples_and_updates() {
    let (_store, table, server) = setup(1 << 20);
    let client = reprise_client::RemoteClient::connect(&server.address(), Default::default()).unwrap();
    assert_eq!(client.table_names(), vec!["t".to_string()]);
    assert_eq!(client.row_bytes("t").unwrap(), vec![16]);
    let mut w = client.writer(Some("t"), Some(4)).unwrap();
    for i in 0..10u8 {
        w.append(&[&[i; 16]]).unwrap();
        if i >= 2 {
            w.create_item("t", 3, 1.0).unwrap();
        }
    }
    w.end_episode().unwrap();
    let keys = w.flush(None, None).unwrap();
    assert_eq!(keys.len(), 8);
    w.close().unwrap();
    assert_eq!(table.size(), 8);
    let (s, partial) = client.sample("t", 5, &[], None, None).unwrap();
    assert!(!partial);
    let r = s.response;
    assert_eq!(r.lengths, vec![3; 5]);
    for (i, key) in r.keys.iter().enumerate() {
        assert!(keys.contains(key));
        let rows = &r.columns[0][i * 48..(i + 1) * 48];
        // The item's three steps are consecutive steps of the episode.
        assert_eq!(rows[16], rows[0] + 1);
        assert_eq!(rows[32], rows[0] + 2);
    }
    assert_eq!(client.update_priorities("t", &r.keys[..2], &[2.0, 3.0]).unwrap(), 2);
    assert_eq!(client.delete("t", &r.keys[..1]).unwrap(), 1);
    let info = client.info().unwrap();
    assert_eq!(info[0].size, 7);
    assert_eq!(info[0].num_deletes, 1);
    // Unknown names are refused by the server with NotFound.
    let err = client.sample("t", 1, &["nope".to_string()], None, None).err().unwrap();
    assert!(matches!(err, reprise_core::Error::NotFound(_)), "{err:?}");
}
