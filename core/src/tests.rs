//! The decoder's own checks (`cargo test --no-default-features`, run by make test). That its columns equal the
//! Python path's is tests/stream_protocol/test_core_differential.py's job (hypothesis); these pin the pieces written
//! by hand and the all-or-nothing contract.
use crate::decode::{py_float_repr, Columns, Conversion, Mask, RowFilter};

const CONV: Conversion = Conversion { headerless_durable: false, address_reply_to: true };

/// A user chunk of simple entries, as chunks.build makes it.
fn chunk(first: u64, records: &[&[u8]]) -> Vec<u8> {
    let mut data = Vec::new();
    for r in records {
        data.extend_from_slice(&(r.len() as u32).to_be_bytes());
        data.extend_from_slice(r);
    }
    let mut out = vec![0x50, 0];
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&(records.len() as u32).to_be_bytes());
    out.extend_from_slice(&0i64.to_be_bytes());
    out.extend_from_slice(&1u64.to_be_bytes());
    out.extend_from_slice(&first.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(&data).to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&data);
    out
}

/// A message of one data section, with application properties `k` → `v` (strings).
fn message(body: &[u8], props: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    if !props.is_empty() {
        let mut items = Vec::new();
        for (k, v) in props {
            for s in [k, v] {
                items.push(0xA1);
                items.push(s.len() as u8);
                items.extend_from_slice(s.as_bytes());
            }
        }
        out.extend_from_slice(&[0x00, 0x53, 0x74, 0xC1, (items.len() + 1) as u8, (2 * props.len()) as u8]);
        out.extend_from_slice(&items);
    }
    out.extend_from_slice(&[0x00, 0x53, 0x75, 0xA0, body.len() as u8]);
    out.extend_from_slice(body);
    out
}

fn repr(x: f64) -> String {
    let mut out = Vec::new();
    py_float_repr(x, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn floats_print_as_python_repr_does() {
    for (x, want) in [
        (1.0, "1.0"),
        (0.1, "0.1"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (1e16, "1e+16"),
        (1234567890123456.0, "1234567890123456.0"),
        (-2.5, "-2.5"),
        (-0.0, "-0.0"),
        (f64::INFINITY, "inf"),
        (f64::NAN, "nan"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        // two shortest strings as near: Python takes the even last digit (found by the 0-9-1 differential test)
        (996.04693603515625, "996.0469360351562"),
        (128.000030517578125, "128.00003051757812"),
        (f32::from_bits(0x4326_a3f2) as f64, "166.64041137695312"),
    ] {
        assert_eq!(repr(x), want, "{x:e}");
    }
}

#[test]
fn a_chunk_becomes_rows_with_offsets() {
    let (a, b) = (message(b"one", &[]), message(b"two", &[("k", "v")]));
    let mut c = Columns::new();
    assert_eq!(c.add_chunk(&chunk(40, &[&a, &b]), 0, usize::MAX, "s", CONV, None).unwrap(), 2);
    assert_eq!(c.offset, vec![40, 41]);
    assert_eq!(c.body.data, b"onetwo");
    assert_eq!(c.body.offsets, vec![0, 3, 6]);
    assert_eq!((c.headers_nulls, &c.headers_offsets[..]), (1, &[0, 0, 1][..]));
}

#[test]
fn skip_and_stop_keep_the_range_only() {
    let msgs: Vec<Vec<u8>> = (0..5).map(|i| message(format!("m{i}").as_bytes(), &[])).collect();
    let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
    let mut c = Columns::new();
    assert_eq!(c.add_chunk(&chunk(10, &refs), 1, 3, "s", CONV, None).unwrap(), 2);
    assert_eq!(c.offset, vec![11, 12]);
}

#[test]
fn a_chunk_left_to_python_adds_nothing() {
    let good = message(b"x", &[]);
    let mut damaged = chunk(0, &[&good, &good]);
    let last = damaged.len() - 1;
    damaged[last] ^= 1; // the CRC no longer matches
    let mut c = Columns::new();
    assert_eq!(c.add_chunk(&chunk(0, &[&good]), 0, 9, "s", CONV, None).unwrap(), 1);
    assert!(c.add_chunk(&damaged, 0, 9, "s", CONV, None).is_err());
    // an array (0xe0) as an amqp-value body: valid, but left to Python
    assert!(c.add_chunk(&chunk(1, &[&good, b"\x00\x53\x77\xe0\x01\x00"]), 0, 9, "s", CONV, None).is_err());
    assert_eq!((c.rows, c.offset.len(), &c.body.data[..]), (1, 1, &b"x"[..]));
    // offsets past int64
    assert!(c.add_chunk(&chunk(i64::MAX as u64, &[&good]), 0, 9, "s", CONV, None).is_err());
}

#[test]
fn truncated_input_is_refused_not_read_past() {
    let full = chunk(0, &[&message(b"body", &[("tenant", "eu")])]);
    for n in 0..full.len() {
        let mut c = Columns::new();
        assert!(c.add_chunk(&full[..n], 0, 9, "s", CONV, None).is_err(), "{n} bytes");
        assert_eq!(c.rows, 0);
    }
}

#[test]
fn the_filter_keeps_the_values_asked_for() {
    let eu = message(b"eu", &[("x-stream-filter-value", "eu")]);
    let us = message(b"us", &[("x-stream-filter-value", "us")]);
    let none = message(b"none", &[]);
    let msgs = chunk(0, &[&eu, &us, &none]);
    for (unfiltered, rows, want) in [(false, 1, &b"eu"[..]), (true, 2, &b"eunone"[..])] {
        let filter = RowFilter { values: vec![b"eu".to_vec()], match_unfiltered: unfiltered };
        let mut c = Columns::new();
        let added = c.add_chunk(&msgs, 0, 9, "s", CONV, Some(&filter)).unwrap();
        assert_eq!((added, c.rows, c.offset.len(), &c.body.data[..]), (rows, rows, rows, want));
    }
}

/// A message whose properties section is a list of 1 item of an unknown type code (0xff), sized right: a full decode
/// refuses it, a split by sizes steps over it.
fn bad_properties(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0x00, 0x53, 0x73, 0xC0, 2, 1, 0xFF];
    out.extend_from_slice(&[0x00, 0x53, 0x75, 0xA0, body.len() as u8]);
    out.extend_from_slice(body);
    out
}

#[test]
fn a_mask_builds_only_its_columns() {
    let msgs = [message(b"one", &[("k", "v")]), message(b"two", &[])];
    let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
    let mut c = Columns::with(Mask::of(&["offset", "headers"]).unwrap());
    assert_eq!(c.add_chunk(&chunk(7, &refs), 0, 9, "s", CONV, None).unwrap(), 2);
    assert_eq!((c.offset.clone(), &c.headers_offsets[..], c.headers_nulls), (vec![7, 8], &[0, 1, 1][..], 1));
    assert!(c.body.data.is_empty() && c.body.valid.is_empty() && c.queue.valid.is_empty());
    assert!(c.props.iter().all(|p| p.valid.is_empty()) && c.timestamp.valid.is_empty());
    assert_eq!(Mask::of(&["body", "nope"]), Err("nope".to_string()));
}

#[test]
fn body_and_offset_decode_no_section_before_the_body() {
    let msgs = [bad_properties(b"kept"), message(b"plain", &[("k", "v")]), b"not amqp".to_vec()];
    let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
    let mut full = Columns::new();
    assert!(full.add_chunk(&chunk(0, &refs), 0, 9, "s", CONV, None).is_err(), "a full read leaves it to Python");
    let mut c = Columns::with(Mask::of(&["body", "offset"]).unwrap());
    assert_eq!(c.add_chunk(&chunk(0, &refs), 0, 9, "s", CONV, None).unwrap(), 3);
    assert_eq!((&c.body.data[..], &c.body.offsets[..]), (&b"keptplainnot amqp"[..], &[0, 4, 9, 17][..]));
    // split's limits are Python's: two data sections, or one not last, are left to it
    let two = [&message(b"a", &[])[..], &message(b"b", &[])[..]].concat();
    assert!(c.add_chunk(&chunk(3, &[&two]), 0, 9, "s", CONV, None).is_err());
    assert_eq!(c.rows, 3);
}

#[test]
fn a_masked_chunk_is_all_or_nothing() {
    let good = message(b"x", &[("k", "v")]);
    let mut c = Columns::with(Mask::of(&["queue", "headers"]).unwrap());
    assert_eq!(c.add_chunk(&chunk(0, &[&good]), 0, 9, "s", CONV, None).unwrap(), 1);
    assert!(c.add_chunk(&chunk(1, &[&good, &bad_properties(b"y")]), 0, 9, "s", CONV, None).is_err());
    assert_eq!((c.rows, c.offset.len(), c.queue.valid.len(), &c.headers_offsets[..], c.keys.valid.len()), (1, 1, 1, &[0, 1][..], 1));
    c.clear();
    assert_eq!((c.rows, c.queue.valid.len(), c.keys.valid.len()), (0, 0, 0));
}

/// A content header (class 60, weight 0, body size 9) of these flags and encoded properties.
fn content_header(flags: u16, values: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(values);
    out
}

#[test]
fn basic_properties_render_as_python_and_keep_a_poisoned_header() {
    use crate::basic::Properties;
    let table: &[u8] = b"\x01bt\x01\x01iI\xff\xff\xff\xfe\x01ff\x3f\xc0\x00\x00\x01tT\x00\x00\x00\x00\x65\x93\x7d\x25\x01vV\x01xx\x00\x00\x00\x02\xff\x00";
    let mut values = vec![0x04];
    values.extend_from_slice(b"json");
    values.extend_from_slice(&(table.len() as u32).to_be_bytes());
    values.extend_from_slice(table);
    let good = content_header(1 << 15 | 1 << 13, &values);
    let poisoned = content_header(1 << 7 | 1 << 6, b"\x02\xff\xfe\xff\xff\xff\xff\xff\xff\xff\xff");
    let mut p = Properties::with(&["content_type", "message_id", "timestamp", "headers", "raw_header"]).unwrap();
    p.add(&good).unwrap();
    p.add(&poisoned).unwrap();
    let c = &p.cols;
    assert_eq!((c.rows, &c.props[2].data[..], &c.props[2].valid[..]), (2, &b"json"[..], &[1, 0][..]));
    assert_eq!((&c.props[0].valid[..], c.timestamp.nulls), (&[0, 0][..], 2)); // message_id not UTF-8, timestamp past 9999
    assert_eq!(c.keys.data, b"biftvx");
    assert_eq!(c.values.data, b"true-21.52024-01-02T03:04:05+00:00base64:/wA=");
    assert_eq!((&c.values.valid[..], &c.headers_offsets[..], &c.headers_valid[..]), (&[1, 1, 1, 1, 0, 1][..], &[0, 6, 6][..], &[1, 0][..]));
    assert_eq!((&p.raw.valid[..], &p.raw.data[..]), (&[0, 1][..], &poisoned[..]));
}

#[test]
fn basic_properties_leave_what_python_renders_otherwise_to_it() {
    use crate::basic::Properties;
    let nested = content_header(1 << 13, b"\x00\x00\x00\x07\x01aF\x00\x00\x00\x00");
    let repeated = content_header(1 << 13, b"\x00\x00\x00\x06\x01aV\x01aV");
    let truncated = content_header(1 << 15, b"\x05ab");
    let continued = content_header(1 << 15 | 1, b"\x00\x00\x01a");
    for header in [&nested, &repeated, &truncated, &continued] {
        assert!(Properties::with(&["headers"]).unwrap().add(header).is_err());
    }
    assert!(Properties::with(&["body"]).is_err());
    let mut none = Properties::with(&["headers", "raw_header"]).unwrap();
    none.add(&content_header(0, b"")).unwrap();
    none.add(&[0, 60, 0]).unwrap(); // no property list at all: nothing to keep, as Python
    assert_eq!((none.cols.headers_nulls, none.raw.nulls), (2, 2));
}

mod records {
    use crate::records::{record, Conversion, Route, Rows, Strings, MESSAGE_ID};

    const PLAIN: Route = Route { exchange: None, key: None, filter: None, to: None };

    fn strings<'a>(offsets: &'a [u8], data: &'a [u8]) -> Strings<'a> {
        Strings { valid: None, offset: 0, offsets, data }
    }

    #[test]
    fn a_message_id_and_a_body() {
        let offsets: Vec<u8> = [0i32, 2].iter().flat_map(|o| o.to_le_bytes()).collect();
        let mut rows = Rows::default();
        rows.strings[MESSAGE_ID] = Some(strings(&offsets, b"m1"));
        let mut out = Vec::new();
        let conv = Conversion { legacy: false, address_reply_to: true, persistent: true };
        record(&mut out, &rows, 0, &PLAIN, conv, b"hi").unwrap();
        let header = [0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41]; // durable: true
        let properties = [0x00, 0x53, 0x73, 0xc0, 0x05, 0x01, 0xa1, 0x02, b'm', b'1'];
        let data = [0x00, 0x53, 0x75, 0xa0, 0x02, b'h', b'i'];
        assert_eq!(out, [&header[..], &properties, &data].concat());
    }

    #[test]
    fn offsets_past_their_data_are_python_s_not_a_panic() {
        let offsets: Vec<u8> = [0i32, 9].iter().flat_map(|o| o.to_le_bytes()).collect();
        let mut rows = Rows::default();
        rows.strings[MESSAGE_ID] = Some(strings(&offsets, b"m1"));
        let conv = Conversion { legacy: false, address_reply_to: true, persistent: false };
        assert!(record(&mut Vec::new(), &rows, 0, &PLAIN, conv, b"").is_err());
        assert!(record(&mut Vec::new(), &rows, 5, &PLAIN, conv, b"").is_err()); // a row past the offsets
    }
}
