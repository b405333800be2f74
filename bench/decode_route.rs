//! Microbenchmarks of the relay's per-event CPU path: the pgoutput decoder, the outbox
//! mapping and the router, on messages of the captured PostgreSQL 15 stream
//! (`tests/fixtures/pgoutput-v1-stream.jsonl`) and on an Insert shaped like the rows of
//! `bench/run.py` (about 300 bytes: uuid, `Order`, `key-417`, `Created`, a jsonb payload with a
//! 200-character string, `{}` headers, a timestamp).
//!
//! ```sh
//! cargo bench --bench decode_route            # criterion: ns per event
//! cargo bench --bench decode_route -- --list  # the benchmark names
//! ```
//!
//! Before criterion runs, it prints the heap bytes and allocations per event of each path,
//! counted by the global allocator of this binary (allocated, not net: what the decoder and
//! router ask of the allocator, freed or not).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{criterion_group, Criterion, Throughput};
use outbox_relay::config::OutboxColumns;
use outbox_relay::lsn::Lsn;
use outbox_relay::router::Router;
use outbox_relay::source::outbox::{OutboxDecoder, OutboxEvent};
use outbox_relay::source::pgoutput::{decode, LogicalReplicationMessage};

/// Counts what the program asks of the system allocator.
struct CountingAlloc;

static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A growing realloc asks for the new size; count it as one allocation of that size.
        ALLOCATED_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/pgoutput-v1-stream.jsonl"
));

/// The fixture's messages, in stream order.
fn fixture() -> Vec<Bytes> {
    FIXTURE
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("fixture line is JSON");
            hex::decode(v["hex"].as_str().expect("hex field"))
                .expect("hex")
                .into()
        })
        .collect()
}

/// The outbox's relation id in the fixture (its Relation message on line 3).
const OUTBOX_REL_ID: u32 = 0x410f;

/// An Insert into the fixture's outbox relation shaped like `bench/run.py`'s rows.
fn bench_row_insert() -> Bytes {
    let payload = format!(r#"{{"pad": "{}", "seq": 41717}}"#, "x".repeat(200));
    let values: [&[u8]; 7] = [
        b"6f1c1e2a-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
        b"Order",
        b"key-417",
        b"Created",
        payload.as_bytes(),
        b"{}",
        b"2026-11-29 23:56:37.123456+00",
    ];
    let mut buf = BytesMut::new();
    buf.put_u8(b'I');
    buf.put_u32(OUTBOX_REL_ID);
    buf.put_u8(b'N');
    buf.put_u16(values.len() as u16);
    for value in values {
        buf.put_u8(b't');
        buf.put_u32(value.len() as u32);
        buf.put_slice(value);
    }
    buf.freeze()
}

/// An outbox decoder that has seen the fixture's Type and Relation for the outbox.
fn outbox_decoder(stream: &[Bytes]) -> OutboxDecoder {
    let mut decoder = OutboxDecoder::new(
        "public.outbox".parse().expect("table name"),
        OutboxColumns::default(),
        None,
    );
    for bytes in &stream[..3] {
        match decode(bytes.clone()).expect("fixture decodes") {
            LogicalReplicationMessage::Type(ty) => decoder.on_type(&ty),
            LogicalReplicationMessage::Relation(rel) => decoder.on_relation(&rel),
            _ => {}
        }
    }
    decoder
}

/// Decode, map and route one Insert: the relay's per-event work before the producer.
fn decode_map_route(decoder: &OutboxDecoder, router: &Router, bytes: Bytes) -> usize {
    let LogicalReplicationMessage::Insert(insert) = decode(bytes).expect("decodes") else {
        unreachable!("an Insert")
    };
    let event = decoder
        .on_insert(&insert, Lsn::from(0x113E_1080))
        .expect("maps")
        .expect("on the outbox");
    let record = router.route(&event, 1_764_460_597_123).expect("routes");
    record.size()
}

fn event_of(decoder: &OutboxDecoder, bytes: Bytes) -> OutboxEvent {
    let LogicalReplicationMessage::Insert(insert) = decode(bytes).expect("decodes") else {
        unreachable!("an Insert")
    };
    decoder
        .on_insert(&insert, Lsn::from(0))
        .expect("maps")
        .expect("on the outbox")
}

/// Runs `f` once to warm up, then `n` times, and returns (bytes, allocations) per call.
fn allocations_per_call(n: u64, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (bytes0, count0) = (
        ALLOCATED_BYTES.load(Ordering::Relaxed),
        ALLOCATIONS.load(Ordering::Relaxed),
    );
    for _ in 0..n {
        f();
    }
    let bytes = ALLOCATED_BYTES.load(Ordering::Relaxed) - bytes0;
    let count = ALLOCATIONS.load(Ordering::Relaxed) - count0;
    (bytes as f64 / n as f64, count as f64 / n as f64)
}

fn print_allocations() {
    let stream = fixture();
    let row = bench_row_insert();
    let decoder = outbox_decoder(&stream);
    let router = Router::default();
    let event = event_of(&decoder, row.clone());
    let n = 10_000;
    let rows: [(&str, (f64, f64)); 4] = [
        (
            "decode, 300 B outbox insert",
            allocations_per_call(n, || drop(black_box(decode(row.clone())))),
        ),
        (
            "decode, each fixture message",
            allocations_per_call(n, || {
                for bytes in &stream {
                    drop(black_box(decode(bytes.clone())));
                }
            }),
        ),
        (
            "route, 300 B outbox event",
            allocations_per_call(n, || drop(black_box(router.route(&event, 0)))),
        ),
        (
            "decode + map + route, 300 B insert",
            allocations_per_call(n, || {
                black_box(decode_map_route(&decoder, &router, row.clone()));
            }),
        ),
    ];
    println!("heap allocated per event (counting global allocator, {n} iterations):");
    for (name, (mut bytes, mut count)) in rows {
        if name.contains("each fixture") {
            bytes /= stream.len() as f64;
            count /= stream.len() as f64;
        }
        println!("  {name:<38} {bytes:>7.0} bytes {count:>5.1} allocations");
    }
}

fn benches(c: &mut Criterion) {
    let stream = fixture();
    let row = bench_row_insert();
    let decoder = outbox_decoder(&stream);
    let router = Router::default();
    let event = event_of(&decoder, row.clone());

    let mut group = c.benchmark_group("pgoutput");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode_insert_300B", |b| {
        b.iter(|| decode(black_box(row.clone())))
    });
    group.throughput(Throughput::Elements(stream.len() as u64));
    group.bench_function("decode_fixture_stream", |b| {
        b.iter(|| {
            for bytes in &stream {
                black_box(decode(black_box(bytes.clone())).ok());
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("outbox");
    group.throughput(Throughput::Elements(1));
    let LogicalReplicationMessage::Insert(insert) = decode(row.clone()).expect("decodes") else {
        unreachable!("an Insert")
    };
    group.bench_function("map_insert_300B", |b| {
        b.iter(|| decoder.on_insert(black_box(&insert), Lsn::from(0)))
    });
    group.finish();

    let mut group = c.benchmark_group("router");
    group.throughput(Throughput::Elements(1));
    group.bench_function("route_default_300B", |b| {
        b.iter(|| router.route(black_box(&event), 1_764_460_597_123))
    });
    group.bench_function("decode_map_route_300B", |b| {
        b.iter(|| decode_map_route(&decoder, &router, black_box(row.clone())))
    });
    group.finish();
}

criterion_group!(decode_route, benches);

fn main() {
    // `cargo test --benches` runs this binary with `--bench` absent: keep that quick.
    if std::env::args().any(|a| a == "--bench") {
        print_allocations();
    }
    decode_route();
    Criterion::default().configure_from_args().final_summary();
}
