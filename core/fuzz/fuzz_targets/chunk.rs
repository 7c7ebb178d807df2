#![no_main]
//! Any bytes as a chunk (its CRC made right half the time, so that the records are reached), with a row filter a third
//! of the time and some columns only (a query's .schema()) half the time: all or nothing, and the columns consistent.
use libfuzzer_sys::fuzz_target;
use spark_amqp_core::decode::{Columns, Conversion, Mask, RowFilter, BODY, HEADERS, QUEUE};

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
    // The mask from bytes of the chunk header the decoder ignores (its timestamp), so that both vary independently.
    let mask = match data.get(8..12) {
        Some(b) if data.len() % 4 < 2 => Mask(u32::from_be_bytes(b.try_into().unwrap()) & Mask::ALL.0),
        _ => Mask::ALL,
    };
    let mut c = Columns::with(mask);
    let conv = Conversion { headerless_durable: false, address_reply_to: true };
    match c.add_chunk(&chunk, data.len() % 3, usize::MAX, "s", conv, filter) {
        Ok(n) => assert_eq!(c.rows, n),
        Err(_) => assert_eq!(c.rows, 0),
    }
    assert_eq!(c.offset.len(), c.rows);
    for (at, col) in [(BODY, &c.body), (QUEUE, &c.queue)] {
        let built = if mask.has(at) { c.rows } else { 0 };
        assert_eq!((col.valid.len(), col.offsets.len()), (built, built + 1));
        assert_eq!(*col.offsets.last().unwrap() as usize, col.data.len());
    }
    assert_eq!(c.headers_valid.len(), if mask.has(HEADERS) { c.rows } else { 0 });
    c.clear();
    assert_eq!((c.rows, c.body.data.len(), c.keys.valid.len()), (0, 0, 0));
});
