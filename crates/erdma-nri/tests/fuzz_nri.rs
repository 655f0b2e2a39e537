//! Fuzzing the NRI plugin's wire protocol with what a hostile or broken runtime can send over the
//! NRI socket: the connection multiplexer's frames, ttRPC's messages inside them, the ttRPC
//! envelopes and the NRI requests inside those, all from arbitrary bytes and from real requests
//! (encoded by the fake runtime's types) with bytes mutated.
//!
//! - `Mux` and `MessageReader` (both hand-written) are checked against a parse of the same bytes
//!   written here from the wire format: the same payloads and messages, in order, and the same
//!   end (clean end, error, or a refused length prefix), whatever the chunking.
//! - Length prefixes cannot make them allocate more than the cap: a counting allocator measures
//!   the peak heap after a prefix announcing 4 GiB (refused at once) or just under the cap (the
//!   multiplexer reserves it: at most `MAX_FRAME`; the ttRPC reader holds only what arrived).
//! - The plugin itself answers every method with any body (decoded with prost) without its
//!   session breaking, and a runtime that writes garbage ends the session with an error.

use erdma_nri::api::{self, Event};
use erdma_nri::fake::FakeRuntime;
use erdma_nri::mux::{self, MAX_FRAME, Mux, MuxError};
use erdma_nri::plugin::{self, Handler, PluginConfig};
use erdma_nri::ttrpc::{self, BoxFuture, MAX_MESSAGE, MessageReader, RpcError};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestRunner;
use prost::Message as _;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

struct Counting;

thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    let _ = HELD.try_with(|h| {
        let now = h.get().saturating_add(n);
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn sub(n: usize) {
    let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only touches
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: same layout, as the caller promised.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A runtime on this thread only, so that the allocator's per-thread counts see all the work.
fn local_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

const KIB: usize = 1 << 10;

// ---------------------------------------------------------------------------------------------
// The multiplexer.

/// How the oracle expects a multiplexed stream to end.
#[derive(Debug, PartialEq, Eq)]
enum MuxEnd {
    /// At a frame boundary or inside a header (the reader treats a cut header as the end).
    Clean,
    /// Inside a frame's payload.
    CutPayload,
    /// A length prefix above the cap.
    TooLarge(usize),
}

/// The oracle: frames (connection, payload) of `wire` by the format (ID, length: big-endian u32;
/// payload), and how the stream ends.
fn mux_frames(wire: &[u8]) -> (Received, MuxEnd) {
    let mut out = Vec::new();
    let mut rest = wire;
    loop {
        if rest.len() < 8 {
            return (out, MuxEnd::Clean);
        }
        let id = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes")) as usize;
        if len > (4 << 20) + 64 {
            return (out, MuxEnd::TooLarge(len));
        }
        if rest.len() < 8 + len {
            return (out, MuxEnd::CutPayload);
        }
        out.push((id, rest[8..8 + len].to_vec()));
        rest = &rest[8 + len..];
    }
}

/// Runs a `Mux` over `wire` written in `chunks`-sized writes, then closed: the payloads each of
/// connections 1 and 2 received, and the mux task's result.
/// Payloads received, by connection.
type Received = Vec<(u32, Vec<u8>)>;

fn run_mux(wire: &[u8], chunk: usize) -> (Received, Result<(), MuxError>) {
    local_rt().block_on(async {
        let (ours, mut theirs) = tokio::io::duplex(64 * KIB);
        let mut m = Mux::new(ours);
        let mut c1 = m.open(mux::PLUGIN_SERVICE_CONN);
        let mut c2 = m.open(mux::RUNTIME_SERVICE_CONN);
        let task = m.start();
        let data = wire.to_vec();
        let writer = tokio::spawn(async move {
            for piece in data.chunks(chunk.max(1)) {
                if theirs.write_all(piece).await.is_err() {
                    return;
                }
            }
            let _ = theirs.shutdown().await;
            // Keep the write side open until the reader is done; dropping it ends the read half.
            drop(theirs);
        });
        let result = task.await.expect("mux task does not panic");
        let _ = writer.await;
        let mut got = Vec::new();
        // The mux task has ended: every payload is queued.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while let Ok(p) = c1.incoming.try_recv() {
            a.push(p);
        }
        while let Ok(p) = c2.incoming.try_recv() {
            b.push(p);
        }
        got.extend(a.into_iter().map(|p| (1, p)));
        got.extend(b.into_iter().map(|p| (2, p)));
        (got, result)
    })
}

/// Frames for connections 1, 2 and others, with short payloads, as bytes; sometimes a frame with
/// a lying length prefix.
fn mux_wire() -> impl Strategy<Value = Vec<u8>> {
    let frame = (
        prop_oneof![Just(1u32), Just(2u32), any::<u32>()],
        prop::collection::vec(any::<u8>(), 0..64),
        prop_oneof![8 => Just(None), 1 => any::<u32>().prop_map(Some)],
    )
        .prop_map(|(id, payload, lie)| {
            let len = lie.unwrap_or(payload.len() as u32);
            [&id.to_be_bytes()[..], &len.to_be_bytes(), &payload].concat()
        });
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(frame, 0..12).prop_map(|f| f.concat()),
    ]
}

// ---------------------------------------------------------------------------------------------
// ttRPC messages.

#[derive(Debug, PartialEq, Eq)]
enum MsgEnd {
    Clean,
    Cut,
    TooLarge,
}

/// The oracle for ttRPC's framing (length: big-endian u32, stream: u32, type: u8, flags: u8;
/// body) over the concatenated chunks.
fn ttrpc_messages(wire: &[u8]) -> (Vec<ttrpc::Message>, MsgEnd) {
    let mut out = Vec::new();
    let mut rest = wire;
    loop {
        if rest.is_empty() {
            return (out, MsgEnd::Clean);
        }
        if rest.len() < 10 {
            return (out, MsgEnd::Cut);
        }
        let len = u32::from_be_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        if len > 4 << 20 {
            return (out, MsgEnd::TooLarge);
        }
        if rest.len() < 10 + len {
            return (out, MsgEnd::Cut);
        }
        out.push(ttrpc::Message {
            stream: u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes")),
            kind: rest[8],
            flags: rest[9],
            body: rest[10..10 + len].to_vec(),
        });
        rest = &rest[10 + len..];
    }
}

/// Feeds `chunks` to a `MessageReader` and reads until it ends.
fn read_messages(chunks: &[Vec<u8>]) -> (Vec<ttrpc::Message>, Result<(), RpcError>) {
    local_rt().block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for c in chunks {
            tx.send(c.clone()).expect("receiver alive");
        }
        drop(tx);
        let mut r = MessageReader::new(rx);
        let mut out = Vec::new();
        loop {
            match r.next().await {
                Ok(Some(m)) => out.push(m),
                Ok(None) => return (out, Ok(())),
                Err(e) => return (out, Err(e)),
            }
        }
    })
}

fn ttrpc_wire() -> impl Strategy<Value = Vec<u8>> {
    let msg = (
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..48),
        prop_oneof![8 => Just(None), 1 => any::<u32>().prop_map(Some)],
    )
        .prop_map(|(stream, kind, flags, body, lie)| {
            let mut m = ttrpc::Message {
                stream,
                kind,
                flags,
                body,
            }
            .encode();
            if let Some(len) = lie {
                m[0..4].copy_from_slice(&len.to_be_bytes());
            }
            m
        });
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(msg, 0..10).prop_map(|m| m.concat()),
    ]
}

/// Splits `wire` into chunks at the given cut points (as mux frames arrive).
fn chunked(wire: &[u8], cuts: &[Index]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
    at.push(0);
    at.push(wire.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| wire[w[0]..w[1]].to_vec()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn mux_reads_exactly_the_frames_of_the_wire(wire in mux_wire(), chunk in 1usize..300) {
        let (frames, end) = mux_frames(&wire);
        let (got, result) = run_mux(&wire, chunk);
        // Frames of connections nobody opened are dropped; each connection keeps its order.
        for id in [1u32, 2] {
            let want: Vec<&Vec<u8>> = frames.iter().filter(|(i, _)| *i == id).map(|(_, p)| p).collect();
            let have: Vec<&Vec<u8>> = got.iter().filter(|(i, _)| *i == id).map(|(_, p)| p).collect();
            prop_assert_eq!(have, want);
        }
        match (end, result) {
            (MuxEnd::Clean, Ok(())) => {}
            (MuxEnd::CutPayload, Err(MuxError::Io(_))) => {}
            (MuxEnd::TooLarge(n), Err(MuxError::FrameTooLarge(m))) => prop_assert_eq!(n, m),
            (end, result) => prop_assert!(false, "expected {:?}, got {:?}", end, result),
        }
    }

    #[test]
    fn ttrpc_reader_reads_exactly_the_messages_of_the_wire(wire in ttrpc_wire(), cuts in prop::collection::vec(any::<Index>(), 0..8)) {
        let (want, end) = ttrpc_messages(&wire);
        let (got, result) = read_messages(&chunked(&wire, &cuts));
        prop_assert_eq!(&got, &want);
        for m in &got {
            prop_assert!(m.body.len() <= MAX_MESSAGE);
        }
        match (end, result) {
            (MsgEnd::Clean, Ok(())) => {}
            (MsgEnd::Cut | MsgEnd::TooLarge, Err(RpcError::Protocol(_))) => {}
            (end, result) => prop_assert!(false, "expected {:?}, got {:?}", end, result),
        }
    }

    /// Envelopes and NRI requests from arbitrary bytes: prost decodes or refuses; what it keeps
    /// is linear in the input: encoded again it is at most twice as long (unknown fields are
    /// dropped; only a negative int32 sent as a 5-byte varint grows, to 10 bytes).
    #[test]
    fn envelopes_and_requests_from_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        fn check<M: prost::Message + Default>(body: &[u8]) -> Result<(), TestCaseError> {
            if let Ok(m) = M::decode(body) {
                prop_assert!(m.encoded_len() <= 2 * body.len());
            }
            Ok(())
        }
        check::<api::envelope::Request>(&body)?;
        check::<api::envelope::Response>(&body)?;
        check::<api::ConfigureRequest>(&body)?;
        check::<api::SynchronizeRequest>(&body)?;
        check::<api::CreateContainerRequest>(&body)?;
        check::<api::StateChangeEvent>(&body)?;
        check::<api::RunPodSandboxRequest>(&body)?;
        check::<api::ValidateContainerAdjustmentRequest>(&body)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Bounded memory from length prefixes.

/// Peak heap of reading `wire` with a `Mux`, above what was held before.
fn mux_peak(wire: &[u8]) -> usize {
    let base = HELD.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let _ = run_mux(wire, wire.len());
    PEAK.with(Cell::get) - base
}

fn ttrpc_peak(wire: &[u8]) -> usize {
    let base = HELD.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let _ = read_messages(&[wire.to_vec()]);
    PEAK.with(Cell::get) - base
}

#[test]
fn length_prefixes_cannot_make_the_readers_allocate_beyond_the_cap() {
    // The runtime, a duplex pipe and the tasks cost a few hundred KiB.
    let overhead = 512 * KIB;
    // 4 GiB announced: refused before any allocation for it.
    let huge = [0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 1, 2, 3];
    let peak = mux_peak(&huge);
    assert!(peak < overhead, "mux: peak {peak} for a 4 GiB prefix");
    // Just under the cap, then the stream ends: the mux reserves the announced payload (its one
    // allocation from a prefix), never more than the cap.
    let near = [
        &[0, 0, 0, 1][..],
        &((MAX_FRAME as u32).to_be_bytes()),
        b"xyz",
    ]
    .concat();
    let peak = mux_peak(&near);
    assert!(peak <= MAX_FRAME + overhead, "mux: peak {peak}");
    // ttRPC: the reader holds only what arrived, whatever the prefix says.
    let mut msg = ((MAX_MESSAGE as u32).to_be_bytes()).to_vec();
    msg.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
    msg.extend_from_slice(&[7u8; 100]);
    let peak = ttrpc_peak(&msg);
    assert!(
        peak < overhead,
        "ttrpc: peak {peak} for a message announced at the cap"
    );
    let mut msg = u32::MAX.to_be_bytes().to_vec();
    msg.extend_from_slice(&[0; 6]);
    let peak = ttrpc_peak(&msg);
    assert!(peak < overhead, "ttrpc: peak {peak} for a 4 GiB prefix");
}

// ---------------------------------------------------------------------------------------------
// The plugin's service: any method, any body.

/// A handler that accepts everything and looks at what it is given.
struct Accepting;

impl Handler for Accepting {
    fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> BoxFuture<'_, Vec<api::ContainerUpdate>> {
        Box::pin(async move {
            containers
                .iter()
                .take(pods.len())
                .map(|c| api::ContainerUpdate {
                    container_id: c.id.clone(),
                    ..Default::default()
                })
                .collect()
        })
    }

    fn state_change(
        &self,
        _event: Event,
        pod: Option<api::PodSandbox>,
        _container: Option<api::Container>,
    ) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match pod {
                Some(p) if p.name == "refuse" => Err("refused".into()),
                _ => Ok(()),
            }
        })
    }

    fn create_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> BoxFuture<'_, Result<api::ContainerAdjustment, String>> {
        Box::pin(async move {
            if container.name == "refuse" {
                return Err("refused".into());
            }
            let a = api::ContainerAdjustment {
                annotations: pod.annotations.clone(),
                ..Default::default()
            };
            Ok(a)
        })
    }
}

/// Every method name the plugin knows, one it does not, and `StateChange`.
const METHODS: &[&str] = &[
    "Configure",
    "Synchronize",
    "CreateContainer",
    "StateChange",
    "RunPodSandbox",
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "UpdateContainer",
    "PostUpdateContainer",
    "StopContainer",
    "RemoveContainer",
    "ValidateContainerAdjustment",
    "NoSuchMethod",
    "",
];

/// Real requests as the runtime encodes them, to be mutated.
fn real_bodies() -> Vec<Vec<u8>> {
    let pod = api::PodSandbox {
        id: "sb-1".into(),
        name: "p".into(),
        namespace: "team-a".into(),
        uid: "0d6f5c8e".into(),
        annotations: [(
            "network.alibabacloud.com/erdma-smcr".to_string(),
            "true".to_string(),
        )]
        .into(),
        pid: 4242,
        ..Default::default()
    };
    let c = api::Container {
        id: "c-1".into(),
        pod_sandbox_id: "sb-1".into(),
        name: "main".into(),
        env: vec!["ERDMA_DEVICES=erdma_0".into()],
        linux: Some(api::LinuxContainer {
            devices: vec![api::LinuxDevice {
                path: "/dev/infiniband/uverbs0".into(),
                r#type: "c".into(),
                major: 231,
                minor: 192,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        api::ConfigureRequest {
            config: String::new(),
            runtime_name: "containerd".into(),
            runtime_version: "2.1.0".into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            nri_version: "v0.12.0".into(),
        }
        .encode_to_vec(),
        api::SynchronizeRequest {
            pods: vec![pod.clone()],
            containers: vec![c.clone()],
            more: false,
        }
        .encode_to_vec(),
        api::CreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        }
        .encode_to_vec(),
        api::StateChangeEvent {
            event: Event::RunPodSandbox as i32,
            pod: Some(pod.clone()),
            container: None,
        }
        .encode_to_vec(),
        api::RunPodSandboxRequest { pod: Some(pod) }.encode_to_vec(),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let bodies = real_bodies();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        (
            prop::sample::select(bodies),
            prop::collection::vec((any::<Index>(), any::<u8>(), any::<bool>()), 1..6)
        )
            .prop_map(|(mut b, edits)| {
                for (i, byte, insert) in edits {
                    let p = i.index(b.len() + 1);
                    if insert || p == b.len() {
                        b.insert(p, byte);
                    } else {
                        b[p] = byte;
                    }
                }
                b
            }),
    ]
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A plugin session on `rt` against the fake runtime, registered and configured.
struct Running {
    session: erdma_nri::fake::Session,
    plugin: tokio::task::JoinHandle<Result<(), plugin::NriError>>,
    cancel: CancellationToken,
    _dir: tempfile::TempDir,
}

fn start(rt: &tokio::runtime::Runtime) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("nri.sock");
    let runtime = rt
        .block_on(async { FakeRuntime::bind(&sock) })
        .expect("bind");
    let cfg = PluginConfig {
        socket: sock,
        name: "erdma".into(),
        idx: "10".into(),
        events: Vec::new(),
        budget: Duration::from_millis(500),
        observer: None,
    };
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let plugin = rt.spawn(async move { plugin::run_session(&cfg, Arc::new(Accepting), &c).await });
    let session = rt.block_on(async {
        let mut s = runtime.accept().await.expect("accept");
        s.registration().await.expect("RegisterPlugin");
        s.configure().await.expect("Configure");
        s
    });
    Running {
        session,
        plugin,
        cancel,
        _dir: dir,
    }
}

fn multi_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// One plugin session for the whole run; every case is one call with any method and body. The
/// plugin answers each (a result or a status); the session never breaks, and a well-formed call
/// still works at the end.
#[test]
fn the_plugin_answers_any_method_with_any_body() {
    let rt = multi_rt();
    let Running {
        mut session,
        plugin,
        cancel,
        _dir,
    } = start(&rt);
    let strategy = (prop::sample::select(METHODS), body());
    let n = cases(256);
    let mut runner = TestRunner::new(ProptestConfig::with_cases(n));
    let result = runner.run(&strategy, |(method, body)| {
        let r = rt.block_on(session.call_raw(method, body));
        match r {
            Ok(_) | Err(RpcError::Status { .. }) => {}
            Err(e) => prop_assert!(false, "{method}: the session broke: {e}"),
        }
        prop_assert!(!plugin.is_finished(), "the plugin session ended");
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Every case reached the plugin (Configure was the first call).
    assert!(
        session.methods().len() > n as usize,
        "{} calls",
        session.methods().len()
    );
    // Still serving: a Configure (which the fuzzing may have changed) and a real event.
    rt.block_on(async {
        session.configure().await.expect("Configure after fuzzing");
        let pod = api::PodSandbox {
            name: "p".into(),
            ..Default::default()
        };
        session
            .state_change(Event::RunPodSandbox, &pod, None)
            .await
            .expect("RunPodSandbox after fuzzing");
    });
    cancel.cancel();
    let _ = rt.block_on(plugin);
}

/// Found by reading the plugin for this test: a runtime could send `Synchronize` parts with
/// `more: true` for ever, and the plugin kept every pod and container of them. Now the parts may
/// carry at most `MAX_SYNC_OBJECTS` in all; past that the call is refused and the parts dropped,
/// and a whole Synchronize works again.
#[test]
fn an_endless_split_synchronize_is_refused() {
    let rt = multi_rt();
    let Running {
        session,
        plugin,
        cancel,
        _dir,
    } = start(&rt);
    let part = api::SynchronizeRequest {
        pods: vec![api::PodSandbox::default(); 10_000],
        containers: Vec::new(),
        more: true,
    }
    .encode_to_vec();
    let limit = plugin::MAX_SYNC_OBJECTS / 10_000;
    rt.block_on(async {
        for i in 0..limit {
            session
                .call_raw("Synchronize", part.clone())
                .await
                .unwrap_or_else(|e| panic!("part {i}: {e}"));
        }
        let err = session
            .call_raw("Synchronize", part.clone())
            .await
            .expect_err("one part too many");
        assert!(
            matches!(
                &err,
                RpcError::Status {
                    code: ttrpc::code::INTERNAL,
                    ..
                }
            ),
            "{err}"
        );
        let whole = api::SynchronizeRequest {
            pods: vec![api::PodSandbox::default(); 3],
            containers: Vec::new(),
            more: false,
        }
        .encode_to_vec();
        session
            .call_raw("Synchronize", whole)
            .await
            .expect("a whole Synchronize after the refusal");
    });
    assert!(!plugin.is_finished());
    cancel.cancel();
    let _ = rt.block_on(plugin);
}

/// A "runtime" that writes garbage to the plugin's connection and closes it: the session ends
/// with an error (or normally), never a panic or a hang.
#[test]
fn a_runtime_writing_garbage_ends_the_session() {
    let rt = local_rt();
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases(32)));
    let result = runner.run(&mux_wire(), |wire| {
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let sock = dir.path().join("nri.sock");
            let listener = tokio::net::UnixListener::bind(&sock).expect("bind");
            let cfg = PluginConfig {
                socket: sock,
                name: "erdma".into(),
                idx: "10".into(),
                events: Vec::new(),
                budget: Duration::from_millis(100),
                observer: None,
            };
            let cancel = CancellationToken::new();
            let session = tokio::spawn(async move {
                plugin::run_session(&cfg, Arc::new(Accepting), &cancel).await
            });
            let (mut stream, _) = listener.accept().await.expect("accept");
            let _ = stream.write_all(&wire).await;
            drop(stream);
            let ended = tokio::time::timeout(Duration::from_secs(30), session).await;
            prop_assert!(ended.is_ok(), "the session did not end");
            prop_assert!(ended.expect("ended").is_ok(), "the session panicked");
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
