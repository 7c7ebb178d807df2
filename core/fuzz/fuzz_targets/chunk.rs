#![no_main]
//! Any bytes as a chunk (its CRC made right half the time, so that the records are reached), with a row filter half
//! the time: all or nothing, and the columns consistent.
use libfuzzer_sys::fuzz_target;
use spark_amqp_core::decode::{Columns, Conversion, RowFilter};

fuzz_target!(|data: &[u8]| {
    let mut chunk = data.to_vec();
    if chunk.len() >= 48 && chunk[1] & 1 == 0 {
        let size = (u32::from_be_bytes(chunk[36..40].try_into().unwrap()) as usize).min(chunk.len() - 48);
        chunk[36..40].copy_from_slice(&(size as u32).to_be_bytes());
        chunk[44..48].copy_from_slice(&[0, 0, 0, 0]);
        let crc = crc32fast::hash(&chunk[48..48 + size]);
        chunk[32..36].copy_from_slice(&crc.to_be_bytes());
        chunk[0] = 0x50;
    }
    let filter = RowFilter { values: vec![b"eu".to_vec()], match_unfiltered: data.len() % 2 == 0 };
    let filter = (data.len() % 3 == 0).then_some(&filter);
    let mut c = Columns::new();
    let conv = Conversion { headerless_durable: false, address_reply_to: true };
    match c.add_chunk(&chunk, data.len() % 3, usize::MAX, "s", conv, filter) {
        Ok(n) => assert_eq!(c.rows, n),
        Err(_) => assert_eq!(c.rows, 0),
    }
    assert_eq!(c.body.offsets.len(), c.rows + 1);
    assert_eq!(*c.body.offsets.last().unwrap() as usize, c.body.data.len());
    assert_eq!(c.offset.len(), c.rows);
});
