#![no_main]
//! Any bytes as one message: decoded or refused (Fallback), never a panic, and the columns stay consistent.
use libfuzzer_sys::fuzz_target;
use spark_amqp_core::decode::{Columns, Conversion};

fuzz_target!(|data: &[u8]| {
    let mut c = Columns::new();
    let mut entries = Vec::new();
    let conv = Conversion { headerless_durable: data.first().is_some_and(|b| b & 1 == 1), address_reply_to: true };
    let before = c.rows;
    let ok = c.record(data, 7, "s", conv, &mut entries).is_ok();
    assert_eq!(c.rows, before + ok as usize);
});
