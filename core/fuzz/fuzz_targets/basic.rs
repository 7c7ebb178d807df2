#![no_main]
//! Any bytes as an AMQP 0-9-1 content header (basic.rs): decoded into the property columns or refused, never a
//! panic, every column then as long as the others.
use libfuzzer_sys::fuzz_target;
use spark_amqp_core::basic::Properties;

fuzz_target!(|data: &[u8]| {
    let columns = ["message_id", "priority", "timestamp", "headers", "raw_header"];
    let mut p = Properties::with(&columns).unwrap();
    let _ = p.add(data);
    let _ = p.add(data.get(data.len() / 2..).unwrap_or(&[]));
});
