#![no_main]
//! Any bytes as a batch's property columns (their buffers cut from the input, offsets and bitmaps included): each
//! row written (an AMQP 1.0 message, an AMQP 0-9-1 content header) or refused (Fallback), never a panic.
use libfuzzer_sys::fuzz_target;
use spark_amqp_core::content;
use spark_amqp_core::records::{self, Bools, Clock, Conversion, Ints, Map, Route, Rows, Strings, Values};

/// The next `n` bytes of the input (fewer at its end).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

fn strings<'a>(data: &mut &'a [u8]) -> Strings<'a> {
    let head = take(data, 3);
    let (flags, offset, size) = (head.first().copied().unwrap_or(0), head.get(1).copied().unwrap_or(0), head.get(2).copied().unwrap_or(0));
    let valid = (flags & 1 == 1).then(|| take(data, 2));
    let offsets = take(data, 4 * (size as usize % 9));
    Strings { valid, offset: offset as usize % 4, offsets, data: take(data, size as usize) }
}

fn ints<'a>(data: &mut &'a [u8]) -> Ints<'a> {
    let head = take(data, 1);
    let flags = head.first().copied().unwrap_or(0);
    let valid = (flags & 1 == 1).then(|| take(data, 2));
    Ints { valid, offset: (flags >> 1) as usize % 4, values: take(data, 8 * (flags as usize >> 3)) }
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let flags = u32::from_le_bytes(take(&mut data, 4).try_into().unwrap_or([0; 4]));
    let on = |bit: u32| flags >> bit & 1 == 1;
    let mut rows = Rows::default();
    for (i, slot) in rows.strings.iter_mut().enumerate() {
        if on(i as u32) {
            *slot = Some(strings(&mut data));
        }
    }
    if on(9) {
        rows.priority = Some(ints(&mut data));
    }
    if on(10) {
        rows.delivery_mode = Some(ints(&mut data));
    }
    if on(11) {
        rows.timestamp = Some((ints(&mut data), if on(12) { Clock::Micros } else { Clock::Seconds }));
    }
    if on(13) {
        let head = take(&mut data, 2);
        let valid = (head.first().copied().unwrap_or(0) & 1 == 1).then(|| take(&mut data, 2));
        let offsets = take(&mut data, 4 * (head.get(1).copied().unwrap_or(0) as usize % 9));
        let keys = strings(&mut data);
        let values = match flags >> 14 & 7 {
            0 => Values::Str(strings(&mut data)),
            1 => Values::Bin(strings(&mut data)),
            2 => Values::Bool(Bools { valid: None, offset: 0, values: take(&mut data, 2) }),
            3 => Values::Long(ints(&mut data)),
            _ => Values::Double(ints(&mut data)),
        };
        rows.headers = Some(Map { valid, offset: (flags >> 17) as usize % 4, offsets, keys, values });
    }
    let conv = Conversion { legacy: on(20), address_reply_to: on(21), persistent: on(22) };
    let route = Route {
        exchange: on(23).then_some("x"),
        key: on(24).then_some("k"),
        filter: on(25).then_some("f"),
        to: on(26).then_some("/queues/q"),
    };
    for i in 0..4 {
        let _ = records::record(&mut Vec::new(), &rows, i, &route, conv, data);
        let _ = content::properties(&mut Vec::new(), &rows, i, route.filter, conv.persistent);
    }
});
