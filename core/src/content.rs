//! The AMQP 0-9-1 sink's rows to content-header properties (spark_amqp/sink/columns.py's `_property_rows`): the flag
//! word and the properties, byte for byte what Python writes for the same row (spark_amqp/sink/basic_properties.py:
//! pamqp 4.0's marshal, which leaves out an empty string, with a headers table whose keys are sorted, an integer in the
//! smallest of its types, a float in 64 bits). Whatever the core does not write as Python would (a value Python
//! refuses, a key over 255 bytes) is a `Fallback`: the batch is then Python's.
use crate::amqp::{fb, Fallback, R};
use crate::records::{bound, delivery_mode, expiration, octet, seconds, short, valid, value, Map, Rows, Value};
use crate::records::{APP_ID, CONTENT_ENCODING, CONTENT_TYPE, CORRELATION_ID, MESSAGE_ID, REPLY_TO, TYPE, USER_ID};

fn long_bytes(out: &mut Vec<u8>, code: u8, raw: &[u8]) -> R<()> {
    let size = u32::try_from(raw.len()).map_err(|_| Fallback("a table value over 4 GiB"))?;
    out.push(code);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(raw);
    Ok(())
}

/// pamqp's `encode_table_value` for the values a row's headers hold (its `table_integer` without
/// DEPRECATED_RABBITMQ_SUPPORT, which Python checks).
fn encode(out: &mut Vec<u8>, v: Value<'_>) -> R<()> {
    match v {
        Value::Null => out.push(b'V'),
        Value::Str(s) => long_bytes(out, b'S', s)?,
        Value::Bytes(b) => long_bytes(out, b'x', b)?,
        Value::Bool(b) => out.extend_from_slice(&[b't', b as u8]),
        Value::Long(i) => {
            if let Ok(x) = i8::try_from(i) {
                out.push(b'b');
                out.extend_from_slice(&x.to_be_bytes());
            } else if let Ok(x) = i16::try_from(i) {
                out.push(b's');
                out.extend_from_slice(&x.to_be_bytes());
            } else if let Ok(x) = u16::try_from(i) {
                out.push(b'u');
                out.extend_from_slice(&x.to_be_bytes());
            } else if let Ok(x) = i32::try_from(i) {
                out.push(b'I');
                out.extend_from_slice(&x.to_be_bytes());
            } else if let Ok(x) = u32::try_from(i) {
                out.push(b'i');
                out.extend_from_slice(&x.to_be_bytes());
            } else {
                out.push(b'l');
                out.extend_from_slice(&i.to_be_bytes());
            }
        }
        Value::Double(d) if !d.is_finite() => return fb("a header float that is not finite (Python names it)"),
        Value::Double(d) => {
            out.push(b'd');
            out.extend_from_slice(&d.to_be_bytes());
        }
    }
    Ok(())
}

/// Row `i`'s headers and its filter value as pamqp's field table (None: the row has neither).
fn table(map: &Option<Map<'_>>, i: usize, filter: Option<&str>) -> R<Option<Vec<u8>>> {
    let mut entries: Vec<(&[u8], Value<'_>)> = Vec::new();
    let mut present = false;
    if let Some(m) = map {
        let at = m.offset + i;
        if valid(m.valid, at)? {
            present = true;
            let (start, end) = (bound(m.offsets, at)?, bound(m.offsets, at + 1)?);
            if end < start {
                return fb("map offsets that go back");
            }
            for j in start..end {
                let key = m.keys.get(j)?.ok_or(Fallback("a null map key"))?;
                if key.len() > 255 {
                    return fb("a header key over a short string's 255 bytes (Python names it)");
                }
                entries.push((key, value(&m.values, j)?));
            }
        }
    }
    if let Some(f) = filter {
        present = true;
        entries.push((b"x-stream-filter-value", Value::Str(f.as_bytes())));
    }
    if !present {
        return Ok(None);
    }
    // A dict keeps a repeated key's last value; pamqp writes the keys sorted.
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let mut body = Vec::new();
    for (k, (key, v)) in entries.iter().enumerate() {
        if entries.get(k + 1).is_some_and(|next| next.0 == *key) {
            continue;
        }
        body.push(key.len() as u8);
        body.extend_from_slice(key);
        encode(&mut body, *v)?;
    }
    let size = u32::try_from(body.len()).map_err(|_| Fallback("a table over 4 GiB"))?;
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    Ok(Some(out))
}

struct Header {
    flags: u16,
    body: Vec<u8>,
}

impl Header {
    fn put(&mut self, flag: u16, encoded: Option<&[u8]>) {
        if let Some(v) = encoded {
            self.flags |= flag;
            self.body.extend_from_slice(v);
        }
    }

    /// A short string; an empty one is left out, as pamqp leaves it.
    fn text(&mut self, flag: u16, v: Option<&[u8]>) {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            self.flags |= flag;
            self.body.push(v.len() as u8);
            self.body.extend_from_slice(v);
        }
    }
}

/// Row `i`'s properties as a content header carries them after its body size: the flag word, then each property.
pub fn properties(out: &mut Vec<u8>, rows: &Rows<'_>, i: usize, filter: Option<&str>, persistent: bool) -> R<()> {
    let s = |at| short(rows, at, i);
    let expiration = expiration(rows, i)?;
    let mode = delivery_mode(rows, i, persistent)?;
    let priority = octet(&rows.priority, i)?;
    let timestamp = seconds(&rows.timestamp, i)?;
    let headers = table(&rows.headers, i, filter)?;
    let mut h = Header { flags: 0, body: Vec::new() };
    // In pamqp's order, each with its flag.
    h.text(0x8000, s(CONTENT_TYPE)?);
    h.text(0x4000, s(CONTENT_ENCODING)?);
    h.put(0x2000, headers.as_deref());
    h.put(0x1000, mode.as_ref().map(std::slice::from_ref));
    h.put(0x0800, priority.as_ref().map(std::slice::from_ref));
    h.text(0x0400, s(CORRELATION_ID)?);
    h.text(0x0200, s(REPLY_TO)?);
    h.text(0x0100, expiration);
    h.text(0x0080, s(MESSAGE_ID)?);
    h.put(0x0040, timestamp.map(|t| (t as u64).to_be_bytes()).as_ref().map(|b| &b[..]));
    h.text(0x0020, s(TYPE)?);
    h.text(0x0010, s(USER_ID)?);
    h.text(0x0008, s(APP_ID)?);
    let (flags, body) = (h.flags, h.body);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(())
}
