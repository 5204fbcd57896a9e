//! The gRPC service against bad input over the wire: wrong sizes, unknown names, NaN
//! priorities, oversized, garbage and truncated messages. Each is refused with a status
//! that names the problem, nothing partial is stored, and the server stays up. A client
//! that dies with an item sent but not committed leaves no item and no held block, and
//! one connection gets at most `max_concurrent_per_connection` requests in progress.

mod support;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use reprise_client::pb::{self, replay_client::ReplayClient};
use reprise_client::StepWriter;
use reprise_core::{DType, Field, RateLimiterConfig, SelectorSpec, Signature, Store, Table, TableConfig, Wait};
use reprise_server::{RemoteServerOptions, RemoteServer};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

use support::{wait_until, PATIENCE};

fn setup(max_message_bytes: usize) -> (Store, Table, RemoteServer) {
    let limiter = RateLimiterConfig::new(1.0, 1, f64::NEG_INFINITY, f64::INFINITY).unwrap();
    setup_with(limiter, RemoteServerOptions { max_message_bytes, ..RemoteServerOptions::default() })
}

/// One table "t" over a store of 64 blocks of 16 steps of `x: float32[4]`.
fn setup_with(rate_limiter: RateLimiterConfig, options: RemoteServerOptions) -> (Store, Table, RemoteServer) {
    let sig = Signature::new(vec![Field::new("x", DType::Float32, vec![4]).unwrap()]).unwrap();
    let store = Store::new(sig, 1024, 16, None).unwrap();
    let config = TableConfig {
        name: "t".into(),
        sampler: SelectorSpec::Uniform,
        remover: SelectorSpec::Fifo,
        max_size: 100,
        max_times_sampled: 0,
        rate_limiter,
        seed: Some(1),
        evict_when_store_full: true,
        external_selection: false,
        extensions: reprise_core::ExtensionSpec::defaults(),
        attributes: Default::default(),
        max_staleness: None,
        groups: None,
    };
    let table = Table::new(config, &store).unwrap();
    let server = RemoteServer::start(vec![table.clone()], "127.0.0.1:0", options).unwrap();
    (store, table, server)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A client runtime that keeps its connections going between `block_on` calls (while
/// the test thread watches the server); dropping it is the client process dying.
fn client_process() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

async fn connect(server: &RemoteServer) -> Channel {
    Channel::from_shared(format!("http://{}", server.address())).unwrap().connect().await.unwrap()
}

fn steps(n: u32, bytes_per_step: usize) -> pb::InsertOp {
    pb::InsertOp { op: Some(pb::insert_op::Op::Steps(pb::Steps { num_steps: n, columns: vec![vec![0u8; n as usize * bytes_per_step].into()] })) }
}

fn item(table: &str, n: u32, priority: f64) -> pb::InsertOp {
    pb::InsertOp { op: Some(pb::insert_op::Op::CreateItem(pb::CreateItem { table: table.into(), num_steps: n, priority, attributes: Default::default() })) }
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

/// A stream's first message: 18 steps (blocks 0 and 1) and an item over the last two
/// (block 1); block 0 stays held by the stream's writer alone, until the stream ends.
/// Its second message: 3 more steps (block 1) and an item over them.
fn two_messages() -> (pb::InsertRequest, pb::InsertRequest) {
    let first = pb::InsertRequest { table: "t".into(), timeout_seconds: -1.0, ops: vec![steps(18, 16), item("t", 2, 1.0), flush()], ..Default::default() };
    let second = pb::InsertRequest { ops: vec![steps(3, 16), item("t", 3, 1.0), flush()], ..Default::default() };
    (first, second)
}

/// The client of an insert stream dies (its runtime, and with it its connection, is
/// dropped) while the second message's item waits on a full queue: received, not yet
/// committed. The server must drop that item and end the stream (block 0 returns).
/// With `client_dies` false, a sample makes room instead and the same item commits.
fn second_item_waits_on_the_rate_limiter(client_dies: bool) {
    let (store, table, server) = setup_with(RateLimiterConfig::queue(1).unwrap(), RemoteServerOptions::default());
    let blocks = store.num_blocks() as usize;
    let rt = client_process();
    let (tx, mut responses) = rt.block_on(async {
        let mut client = ReplayClient::new(connect(&server).await);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut responses = client.insert(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        let (first, second) = two_messages();
        tx.send(first).await.unwrap();
        assert_eq!(responses.message().await.unwrap().unwrap().keys.len(), 1);
        tx.send(second).await.unwrap();
        (tx, responses)
    });
    // The table counts the wait of a blocked insert every 50 ms.
    wait_until("the second item to wait on the rate limiter", || table.info().blocked_insert_seconds > 0.0);
    assert_eq!(table.size(), 1);
    if client_dies {
        drop(rt);
        drop((tx, responses));
        wait_until("the dead client's writer to give block 0 back (or its item to appear)", || {
            store.free_blocks() == blocks - 1 || table.size() != 1
        });
        assert_eq!(table.size(), 1, "the item of a client that died before its commit was stored");
        assert_eq!(store.free_blocks(), blocks - 1, "the dead client's blocks did not all return");
    } else {
        drop(table.sample(1, Some(Duration::ZERO)).unwrap());
        let answer = rt.block_on(async { tokio::time::timeout(PATIENCE, responses.message()).await });
        assert_eq!(answer.expect("the item commits once the queue has room").unwrap().unwrap().keys.len(), 1);
        assert_eq!(table.size(), 2);
        drop((tx, responses));
        drop(rt);
        wait_until("the stream's writer to give block 0 back", || store.free_blocks() == blocks - 1);
    }
    drop(server);
    assert_eq!(table.size(), if client_dies { 1 } else { 2 });
}

#[test]
fn a_client_that_dies_while_its_item_waits_leaves_no_item_and_returns_its_blocks() {
    second_item_waits_on_the_rate_limiter(true);
}

#[test]
fn an_item_that_waits_on_the_rate_limiter_commits_once_there_is_room() {
    second_item_waits_on_the_rate_limiter(false);
}

/// A request body that sends one chunk and then stays open (the client neither ends
/// the stream nor sends more): what a client killed mid-send leaves behind.
struct OneChunk(Option<Bytes>);

impl http_body::Body for OneChunk {
    type Data = Bytes;
    type Error = Status;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<std::result::Result<http_body::Frame<Bytes>, Status>>> {
        match self.0.take() {
            Some(chunk) => Poll::Ready(Some(Ok(http_body::Frame::data(chunk)))),
            None => Poll::Pending,
        }
    }
}

/// A message as gRPC frames it: an uncompressed flag, a big-endian length, the bytes.
fn framed(length: usize, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(length as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

/// Opens an `Insert` stream whose body is `chunk`, bytes as they go on the wire.
async fn raw_insert(server: &RemoteServer, chunk: Vec<u8>) -> http::Response<tonic::body::Body> {
    use tonic::client::GrpcService;
    let mut channel = connect(server).await;
    std::future::poll_fn(|cx| GrpcService::<tonic::body::Body>::poll_ready(&mut channel, cx)).await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/reprise.v1.Replay/Insert", server.address()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(OneChunk(Some(chunk.into()))))
        .unwrap();
    let response = channel.call(request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    response
}

/// The next response message of a raw stream (`None` once it ends).
async fn next_response(body: &mut tonic::body::Body, buf: &mut Vec<u8>) -> Option<pb::InsertResponse> {
    use http_body::Body;
    loop {
        if buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() >= 5 + len {
                let message = pb::InsertResponse::decode(&buf[5..5 + len]).unwrap();
                buf.drain(..5 + len);
                return Some(message);
            }
        }
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?.unwrap();
        match frame.into_data() {
            Ok(data) => buf.extend_from_slice(&data),
            Err(trailers) => panic!("the stream ended early: {:?}", trailers.into_trailers().ok()),
        }
    }
}

/// Two messages in one chunk, the second cut after its `CreateItem` (its `Flush` and
/// the stream's end never come), then the client dies. The server must store nothing
/// of the cut message and end the stream (block 0 returns); with `cut` false the same
/// bytes, whole, store the second item (the control: a server that stores nothing fails it).
fn second_message_cut_in_transit(cut: bool) {
    let (store, table, server) = setup(1 << 20);
    let blocks = store.num_blocks() as usize;
    let (first, mut second) = two_messages();
    let whole = second.encode_to_vec();
    second.ops.pop(); // the Flush
    let without_flush = second.encode_to_vec();
    assert!(whole.starts_with(&without_flush), "a cut message is a prefix of the whole one");
    let mut chunk = framed(first.encoded_len(), &first.encode_to_vec());
    chunk.extend(framed(whole.len(), if cut { &without_flush } else { &whole }));
    let rt = client_process();
    let response = rt.block_on(async {
        let mut response = raw_insert(&server, chunk).await;
        let mut buf = Vec::new();
        // The answer to the first message: the server has read the chunk, cut part included.
        let r = tokio::time::timeout(PATIENCE, next_response(response.body_mut(), &mut buf)).await.expect("an answer to the first message");
        assert_eq!(r.unwrap().keys.len(), 1);
        if !cut {
            let r = tokio::time::timeout(PATIENCE, next_response(response.body_mut(), &mut buf)).await.expect("an answer to the second message");
            assert_eq!(r.unwrap().keys.len(), 1);
        }
        response
    });
    drop(rt); // the client dies: its connection closes
    drop(response);
    let items = if cut { 1 } else { 2 };
    wait_until("the stream's writer to give block 0 back (or an item to appear)", || {
        store.free_blocks() == blocks - 1 || table.size() != items
    });
    assert_eq!(table.size(), items, "items stored for a stream whose second message was {}", if cut { "cut" } else { "whole" });
    assert_eq!(store.free_blocks(), blocks - 1, "the client's blocks did not all return");
}

#[test]
fn a_message_cut_after_its_create_item_stores_nothing_and_returns_its_blocks() {
    second_message_cut_in_transit(true);
}

#[test]
fn the_same_message_whole_stores_its_item() {
    second_message_cut_in_transit(false);
}

/// Past `max_concurrent_per_connection` (64 by default) streams open on one
/// connection, a further request waits, unanswered and without effect, while other
/// connections are served; it proceeds as soon as one of the open streams ends.
#[test]
fn requests_past_the_per_connection_limit_wait_until_an_earlier_one_ends() {
    let limit = RemoteServerOptions::default().max_concurrent_per_connection;
    assert_eq!(limit, 64, "the documented default");
    // Samples wait on the empty table (min size 1).
    let (_store, table, server) = setup(1 << 20);
    let rt = runtime();
    rt.block_on(async {
        let ch = connect(&server).await;
        let mut client = ReplayClient::new(ch.clone());
        client.get_layout(pb::GetLayoutRequest {}).await.unwrap();
        let mut open = Vec::new();
        for i in 0..limit {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let request = pb::SampleRequest { table: "t".into(), num_items: 1, fields: vec![], timeout_seconds: 2.0 * PATIENCE.as_secs_f64(), tokens: 0 };
            tx.send(request).await.unwrap();
            let call = client.sample(tokio_stream::wrappers::ReceiverStream::new(rx));
            let responses = tokio::time::timeout(PATIENCE, call).await.unwrap_or_else(|_| panic!("stream {i} of {limit} did not open"));
            open.push((tx, responses.unwrap().into_inner()));
        }
        // One more on the same connection: an insert, whose item would show in the table.
        let mut extra = tokio::spawn(insert_once(ch.clone(), vec![steps(1, 16), item("t", 1, 1.0), flush()]));
        // Another connection is answered meanwhile; the extra request is still held.
        let mut other = ReplayClient::new(connect(&server).await);
        tokio::time::timeout(PATIENCE, other.info(pb::InfoRequest {})).await.expect("another connection is served").unwrap();
        let held = tokio::time::timeout(Duration::from_millis(500), &mut extra).await;
        assert!(held.is_err(), "request {} on one connection was served past the limit: {held:?}", limit + 1);
        assert_eq!(table.size(), 0, "request {} on one connection took effect past the limit", limit + 1);
        // One open stream ends: the extra request goes through, and its item feeds the waiting samples.
        drop(open.pop());
        let inserted = tokio::time::timeout(PATIENCE, extra).await.expect("the held request proceeds once a stream ends");
        assert_eq!(inserted.unwrap().unwrap().keys.len(), 1);
        for (_tx, mut responses) in open {
            let r = tokio::time::timeout(PATIENCE, responses.message()).await.expect("a waiting sample is answered");
            assert_eq!(r.unwrap().unwrap().keys.len(), 1);
        }
    });
    assert_eq!(table.size(), 1);
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
        let too_many = pb::SampleRequest { table: "t".into(), num_items: layout.max_batch_items + 1, fields: vec![], timeout_seconds: 0.0, tokens: 0 };
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
    use reprise_client::ReplayClient as _;
    let client = reprise_client::RemoteClient::connect(&server.address(), Default::default()).unwrap();
    assert_eq!(client.table_names(), vec!["t".to_string()]);
    assert_eq!(client.row_bytes("t").unwrap(), vec![16]);
    let mut w = client.writer(Some("t"), Some(4)).unwrap();
    for i in 0..10u8 {
        w.append(&[&[i; 16]], Wait::default()).unwrap();
        if i >= 2 {
            w.create_item("t", 3, 1.0, &[], Wait::default()).unwrap();
        }
    }
    w.end_episode(Wait::default()).unwrap();
    let keys = w.flush(Wait::default()).unwrap();
    assert_eq!(keys.len(), 8);
    w.close(Wait::default()).unwrap();
    assert_eq!(table.size(), 8);
    let drawn = client.sample("t", 5, &[], None, None).unwrap();
    assert!(drawn.cut_short.is_none());
    let r = drawn.sample.response;
    assert_eq!(r.lengths, vec![3; 5]);
    for (i, key) in r.keys.iter().enumerate() {
        assert!(keys.contains(key));
        let rows = &r.columns[0].bytes().unwrap()[i * 48..(i + 1) * 48];
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
