#![forbid(unsafe_code)]
//! AMQP 0-9-1 content headers (basic's properties) to the source's property columns, as
//! spark_amqp/client/properties.py's `decode_properties` and arrow.py's `render_header` make them. A batch is all or
//! nothing: whatever Python would not decode cleanly beyond the two poison values it keeps (a short string that is not
//! UTF-8, a timestamp past year 9999) is a `Fallback`, and the whole batch is Python's then, so that a truncated
//! header, a continued flag word or a nested table never gets a guess.
use crate::amqp::{fb, R};
use crate::columns::{Columns, Mask, COLUMNS, StrCol, DELIVERY_MODE, HEADERS, PRIORITY, PROPS, TIMESTAMP};
use crate::render::{iso_utc, py_float_repr};
use std::io::Write;

/// properties.py's MAX_TIMESTAMP: the last second Spark's TimestampType holds.
const MAX_TIMESTAMP: u64 = 253_402_300_799;

/// Where a short-string property (its place in wire order, properties.py's NAMES) goes among the string columns
/// (arrow.py's order); None for cluster_id, which has no column but is still decoded (a bad one keeps the raw header).
fn string_column(wire: usize) -> Option<usize> {
    match wire {
        0 => Some(2),  // content_type
        1 => Some(3),  // content_encoding
        5 => Some(1),  // correlation_id
        6 => Some(7),  // reply_to
        7 => Some(8),  // expiration
        8 => Some(0),  // message_id
        10 => Some(4), // type
        11 => Some(6), // user_id
        12 => Some(5), // app_id
        _ => None,     // cluster_id
    }
}

/// The property columns of a batch of content headers, and raw_header (the header of a message with a poison value).
pub struct Properties {
    pub cols: Columns,
    pub raw: StrCol,
    pub want_raw: bool,
}

struct Cursor<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        match self.p.checked_add(n) {
            Some(end) if end <= self.d.len() => {
                let out = &self.d[self.p..end];
                self.p = end;
                Ok(out)
            }
            _ => fb("a truncated content header"),
        }
    }
    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
}

/// A table's keys and rendered values (None: a null map value).
type Entries<'a> = Vec<(&'a [u8], Option<Vec<u8>>)>;

/// One decoded message before it becomes a row: values in wire order, the headers' entries.
#[derive(Default)]
struct Message<'a> {
    strings: [Option<&'a [u8]>; 9],
    priority: Option<i32>,
    delivery_mode: Option<i32>,
    timestamp: Option<i64>,
    headers: Option<Entries<'a>>,
    bad: bool,
}

impl Properties {
    /// Columns for `names` (spark_amqp.reading.projection's property columns, raw_header among them or not).
    pub fn with<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let want_raw = names.iter().any(|n| n.as_ref() == "raw_header");
        let rest: Vec<&str> = names.iter().map(|n| n.as_ref()).filter(|n| *n != "raw_header").collect();
        if let Some(name) = rest.iter().find(|n| COLUMNS[..PROPS].contains(n)) {
            return Err(name.to_string());
        }
        let mask = Mask::of(&rest)?;
        Ok(Properties { cols: Columns::with(mask), raw: StrCol::new(), want_raw })
    }

    /// One message's content header (the frame's payload: class, weight, body size, flags, properties) as a row.
    pub fn add(&mut self, header: &[u8]) -> R<()> {
        let m = decode(header)?;
        let mask = self.cols.mask;
        let c = &mut self.cols;
        for (i, col) in c.props.iter_mut().enumerate() {
            if mask.has(PROPS + i) {
                col.push(m.strings[i])?;
            }
        }
        if mask.has(PRIORITY) {
            c.priority.push(m.priority);
        }
        if mask.has(DELIVERY_MODE) {
            c.delivery_mode.push(m.delivery_mode);
        }
        if mask.has(TIMESTAMP) {
            c.timestamp.push(m.timestamp);
        }
        if mask.has(HEADERS) {
            let valid = m.headers.is_some();
            for (k, v) in m.headers.into_iter().flatten() {
                c.keys.push(Some(k))?;
                c.values.push(v.as_deref())?;
            }
            if c.keys.valid.len() > i32::MAX as usize {
                return fb("a map past 2^31 entries");
            }
            c.headers_valid.push(valid as u8);
            c.headers_nulls += !valid as usize;
            c.headers_offsets.push(c.keys.valid.len() as i32);
        }
        if self.want_raw {
            self.raw.push(if m.bad { Some(header) } else { None })?;
        }
        c.rows += 1;
        Ok(())
    }
}

fn decode(header: &[u8]) -> R<Message<'_>> {
    let mut m = Message::default();
    let plist = header.get(12..).unwrap_or(&[]);
    if plist.len() < 2 {
        m.bad = !plist.is_empty();
        return Ok(m);
    }
    let flags = u16::from_be_bytes([plist[0], plist[1]]);
    if flags & 1 != 0 {
        return fb("a continued flag word");
    }
    let mut r = Cursor { d: plist, p: 2 };
    for i in 0..14 {
        if flags & (1 << (15 - i)) == 0 {
            continue;
        }
        match i {
            2 => {
                let size = u32::from_be_bytes(r.array()?) as usize;
                m.headers = Some(table(r.take(size)?, &mut m.bad)?);
            }
            3 => m.delivery_mode = Some(r.u8()? as i32),
            4 => m.priority = Some(r.u8()? as i32),
            9 => {
                let seconds = u64::from_be_bytes(r.array()?);
                if seconds <= MAX_TIMESTAMP {
                    m.timestamp = Some(seconds as i64 * 1_000_000);
                } else {
                    m.bad = true;
                }
            }
            _ => {
                let size = r.u8()? as usize;
                let raw = r.take(size)?;
                match (std::str::from_utf8(raw), string_column(i)) {
                    (Err(_), _) => m.bad = true,
                    (Ok(_), Some(col)) => m.strings[col] = Some(raw),
                    (Ok(_), None) => {}
                }
            }
        }
    }
    Ok(m)
}

/// A field table's entries, values rendered as `render_header` does; None for a void value (or a timestamp past
/// 9999, which also marks the message bad, as `_timestamp` raising does in Python).
fn table<'a>(d: &'a [u8], bad: &mut bool) -> R<Entries<'a>> {
    let mut r = Cursor { d, p: 0 };
    let mut out: Entries<'a> = Vec::new();
    while r.p < d.len() {
        let klen = r.u8()? as usize;
        let key = r.take(klen)?;
        if std::str::from_utf8(key).is_err() {
            return fb("a header key that is not UTF-8");
        }
        // A Python dict keeps the first place and the last value of a repeated key.
        if out.iter().any(|(k, _)| *k == key) {
            return fb("a repeated header key");
        }
        let mut v = Vec::new();
        match r.u8()? {
            b't' => v.extend_from_slice(if r.u8()? != 0 { b"true" } else { b"false" }),
            b'b' => write!(v, "{}", i8::from_be_bytes(r.array()?)).unwrap(),
            b'B' => write!(v, "{}", r.u8()?).unwrap(),
            b's' => write!(v, "{}", i16::from_be_bytes(r.array()?)).unwrap(),
            b'u' => write!(v, "{}", u16::from_be_bytes(r.array()?)).unwrap(),
            b'I' => write!(v, "{}", i32::from_be_bytes(r.array()?)).unwrap(),
            b'i' => write!(v, "{}", u32::from_be_bytes(r.array()?)).unwrap(),
            b'l' | b'L' => write!(v, "{}", i64::from_be_bytes(r.array()?)).unwrap(),
            b'f' => py_float_repr(f32::from_be_bytes(r.array()?) as f64, &mut v),
            b'd' => py_float_repr(f64::from_be_bytes(r.array()?), &mut v),
            b'T' => {
                let seconds = u64::from_be_bytes(r.array()?);
                if seconds <= MAX_TIMESTAMP {
                    iso_utc(seconds as i64, &mut v)?;
                } else {
                    *bad = true;
                    out.push((key, None));
                    continue;
                }
            }
            b'V' => {
                out.push((key, None));
                continue;
            }
            b'S' | b'x' => {
                let size = u32::from_be_bytes(r.array()?) as usize;
                let raw = r.take(size)?;
                if std::str::from_utf8(raw).is_ok() {
                    v.extend_from_slice(raw);
                } else {
                    v.extend_from_slice(b"base64:");
                    crate::render::base64(raw, &mut v);
                }
            }
            _ => return fb("a header value left to Python (decimal, nested, or of no known type)"),
        }
        out.push((key, Some(v)));
    }
    Ok(out)
}
