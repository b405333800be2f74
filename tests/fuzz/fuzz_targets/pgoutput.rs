//! Feeds arbitrary bytes to both layers of the replication stream decoder: the CopyData
//! framing (XLogData / primary keepalive) and the pgoutput message decoder. Neither may panic,
//! whatever the bytes; errors are the expected outcome for most inputs.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_relay::source::pgoutput;
use outbox_relay::source::replication::{parse_copy_data, ReplicationMessage};

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let _ = pgoutput::decode(bytes.clone());
    if let Ok(ReplicationMessage::XLogData { data, .. }) = parse_copy_data(bytes) {
        let _ = pgoutput::decode(data);
    }
});
