//! The sinks' rows to AMQP 1.0 messages (spark_amqp/sink/amqp10_messages.py's `Amqp10Encoder`): the sections RabbitMQ
//! holds for the same row published by the AMQP 0-9-1 sink, then the body as one data section, byte for byte what
//! Python writes. Columns come as Arrow's own buffers (`Strings`, `Ints`, `Map`), read with bounds checks. A row the
//! core does not write exactly as Python would (a value Python refuses, a header key Python's dict would merge, a
//! symbol that is not ASCII, a timestamp Python's float could round) is a `Fallback`: the batch is then Python's, which
//! encodes it or names the bad value.
use crate::amqp::{fb, Fallback, R};

/// Why a batch was left to Python.
pub type Refusal = Fallback;

/// A string or binary column: validity bitmap (None: no nulls), the array's offset, i32 offsets, data.
#[derive(Clone, Copy)]
pub struct Strings<'a> {
    pub valid: Option<&'a [u8]>,
    pub offset: usize,
    pub offsets: &'a [u8],
    pub data: &'a [u8],
}

/// An int64 (or float64: `float`) column: validity bitmap, the array's offset, 8-byte little-endian values.
#[derive(Clone, Copy)]
pub struct Ints<'a> {
    pub valid: Option<&'a [u8]>,
    pub offset: usize,
    pub values: &'a [u8],
}

/// A boolean column: validity and values, both bitmaps.
#[derive(Clone, Copy)]
pub struct Bools<'a> {
    pub valid: Option<&'a [u8]>,
    pub offset: usize,
    pub values: &'a [u8],
}

/// The values of the headers map, by the kinds Python encodes alike.
#[derive(Clone, Copy)]
pub enum Values<'a> {
    Str(Strings<'a>),
    Bin(Strings<'a>),
    Bool(Bools<'a>),
    Long(Ints<'a>),
    Double(Ints<'a>),
}

/// A map<string, _> column: validity, offset, i32 offsets into its entries, and the entries' keys and values.
#[derive(Clone, Copy)]
pub struct Map<'a> {
    pub valid: Option<&'a [u8]>,
    pub offset: usize,
    pub offsets: &'a [u8],
    pub keys: Strings<'a>,
    pub values: Values<'a>,
}

pub(crate) fn bit(bits: &[u8], i: usize) -> R<bool> {
    bits.get(i / 8).map(|b| b >> (i % 8) & 1 == 1).ok_or(Fallback("a bitmap shorter than its array"))
}

pub(crate) fn valid(bits: Option<&[u8]>, i: usize) -> R<bool> {
    bits.map_or(Ok(true), |b| bit(b, i))
}

fn word<const N: usize>(data: &[u8], i: usize) -> R<[u8; N]> {
    let start = i.checked_mul(N).ok_or(Fallback("overflow"))?;
    let end = start.checked_add(N).ok_or(Fallback("overflow"))?;
    let slice = data.get(start..end).ok_or(Fallback("a buffer shorter than its array"))?;
    let mut out = [0u8; N];
    out.copy_from_slice(slice);
    Ok(out)
}

pub(crate) fn bound(data: &[u8], i: usize) -> R<usize> {
    usize::try_from(i32::from_le_bytes(word::<4>(data, i)?)).map_err(|_| Fallback("a negative offset"))
}

impl<'a> Strings<'a> {
    pub fn get(&self, i: usize) -> R<Option<&'a [u8]>> {
        let at = self.offset + i;
        if !valid(self.valid, at)? {
            return Ok(None);
        }
        let (start, end) = (bound(self.offsets, at)?, bound(self.offsets, at + 1)?);
        self.data.get(start..end).map(Some).ok_or(Fallback("offsets past the data"))
    }
}

impl Ints<'_> {
    pub fn get(&self, i: usize) -> R<Option<[u8; 8]>> {
        let at = self.offset + i;
        if !valid(self.valid, at)? {
            return Ok(None);
        }
        word::<8>(self.values, at).map(Some)
    }

    pub fn long(&self, i: usize) -> R<Option<i64>> {
        Ok(self.get(i)?.map(i64::from_le_bytes))
    }
}

/// The string properties, in spark_amqp/property_columns.py's order.
pub const MESSAGE_ID: usize = 0;
pub const CORRELATION_ID: usize = 1;
pub const CONTENT_TYPE: usize = 2;
pub const CONTENT_ENCODING: usize = 3;
pub const TYPE: usize = 4;
pub const APP_ID: usize = 5;
pub const USER_ID: usize = 6;
pub const REPLY_TO: usize = 7;
pub const EXPIRATION: usize = 8;

/// How a timestamp column counts: epoch seconds (an integer column), or Spark's microseconds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    Seconds,
    Micros,
}

/// A batch's property columns (None: not in the batch).
#[derive(Default)]
pub struct Rows<'a> {
    pub strings: [Option<Strings<'a>>; 9],
    pub priority: Option<Ints<'a>>,
    pub delivery_mode: Option<Ints<'a>>,
    pub timestamp: Option<(Ints<'a>, Clock)>,
    pub headers: Option<Map<'a>>,
}

/// What decides the sections beside the row: RabbitMQ's line (`legacy`: 3.x, `address_reply_to`: 4.3's reply-to
/// addresses, spark_amqp/stream_protocol/rows.py's `Conversion`) and option `persistent`.
#[derive(Clone, Copy)]
pub struct Conversion {
    pub legacy: bool,
    pub address_reply_to: bool,
    pub persistent: bool,
}

/// One message's own values beside its columns: the stream sink's routing annotations, its filter value, and the
/// AMQP 1.0 sink's address (`to`, which replaces the annotations).
pub struct Route<'a> {
    pub exchange: Option<&'a str>,
    pub key: Option<&'a str>,
    pub filter: Option<&'a str>,
    pub to: Option<&'a str>,
}

const FILTER_VALUE_HEADER: &[u8] = b"x-stream-filter-value";
/// Header keys a row's own values would overwrite in Python's dict of application properties.
const MERGED: [&[u8]; 3] = [FILTER_VALUE_HEADER, b"x-basic-type", b"x-basic-app-id"];
const MAX_TIMESTAMP: i64 = 253_402_300_799; // 9999-12-31T23:59:59Z, as spark_amqp/sink/columns.py

fn var(out: &mut Vec<u8>, small: u8, large: u8, raw: &[u8]) {
    if raw.len() < 256 {
        out.extend_from_slice(&[small, raw.len() as u8]);
    } else {
        out.push(large);
        out.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    }
    out.extend_from_slice(raw);
}

fn string(out: &mut Vec<u8>, raw: &[u8]) {
    var(out, 0xa1, 0xb1, raw);
}

fn symbol(out: &mut Vec<u8>, raw: &[u8]) -> R<()> {
    if !raw.is_ascii() {
        return fb("a symbol that is not ASCII (Python refuses it)");
    }
    var(out, 0xa3, 0xb3, raw);
    Ok(())
}

fn symbol_bytes(raw: &[u8]) -> R<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len() + 2);
    symbol(&mut out, raw)?;
    Ok(out)
}

fn encoded(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

/// A list or map of `count` encoded items, in its smallest form (spark_amqp/amqp10/types.py's `_compound_bytes`).
fn compound(out: &mut Vec<u8>, small: u8, large: u8, count: usize, body: &[u8]) {
    if body.len() + 1 < 256 && count < 256 {
        out.extend_from_slice(&[small, (body.len() + 1) as u8, count as u8]);
    } else {
        out.push(large);
        out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(&(count as u32).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// A section: its descriptor, then a list (`list`) or a map of `count` items.
fn section(out: &mut Vec<u8>, code: u8, list: bool, count: usize, body: &[u8]) {
    out.extend_from_slice(&[0x00, 0x53, code]);
    if list {
        compound(out, 0xc0, 0xd0, count, body);
    } else {
        compound(out, 0xc1, 0xd1, count, body);
    }
}

/// urllib.parse.quote(text, safe=""): every byte but ASCII letters, digits and `_.-~` as %XX.
fn quoted(out: &mut Vec<u8>, raw: &[u8]) {
    for &b in raw {
        if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

/// A short string property, as Python checks it: at most 255 bytes.
pub(crate) fn short<'a>(rows: &Rows<'a>, at: usize, i: usize) -> R<Option<&'a [u8]>> {
    let value = match &rows.strings[at] {
        Some(col) => col.get(i)?,
        None => None,
    };
    match value {
        Some(v) if v.len() > 255 => fb("a property over 255 bytes (Python names it)"),
        _ => Ok(value),
    }
}

pub(crate) fn octet(col: &Option<Ints<'_>>, i: usize) -> R<Option<u8>> {
    match col.as_ref().map(|c| c.long(i)).transpose()?.flatten() {
        None => Ok(None),
        Some(v) => u8::try_from(v).map(Some).map_err(|_| Fallback("an octet out of range (Python names it)")),
    }
}

/// Epoch seconds, as Python's `int(datetime.timestamp())` gives them (truncated toward zero), within its range.
pub(crate) fn seconds(col: &Option<(Ints<'_>, Clock)>, i: usize) -> R<Option<i64>> {
    let Some((c, clock)) = col else { return Ok(None) };
    let Some(v) = c.long(i)? else { return Ok(None) };
    let s = match clock {
        Clock::Seconds => v,
        Clock::Micros => {
            // Python goes through a float: exact below 2**32 seconds whatever the fraction (a float's spacing there
            // is under half a microsecond), and for whole seconds; anything else is Python's to round.
            if v.rem_euclid(1_000_000) != 0 && v.unsigned_abs() >= (1u64 << 32) * 1_000_000 {
                return fb("a timestamp past 2106 with a fraction of a second");
            }
            v / 1_000_000
        }
    };
    if !(0..=MAX_TIMESTAMP).contains(&s) {
        return fb("a timestamp out of range (Python names it)");
    }
    Ok(Some(s))
}

/// A header value as the row holds it, before either sink encodes it.
#[derive(Clone, Copy)]
pub(crate) enum Value<'a> {
    Null,
    Str(&'a [u8]),
    Bytes(&'a [u8]),
    Bool(bool),
    Long(i64),
    Double(f64),
}

/// The map's entry `j` value.
pub(crate) fn value<'a>(values: &Values<'a>, j: usize) -> R<Value<'a>> {
    Ok(match values {
        Values::Str(c) => c.get(j)?.map_or(Value::Null, Value::Str),
        Values::Bin(c) => c.get(j)?.map_or(Value::Null, Value::Bytes),
        Values::Bool(c) => {
            let at = c.offset + j;
            if valid(c.valid, at)? {
                Value::Bool(bit(c.values, at)?)
            } else {
                Value::Null
            }
        }
        Values::Long(c) => c.long(j)?.map_or(Value::Null, Value::Long),
        Values::Double(c) => c.get(j)?.map_or(Value::Null, |b| Value::Double(f64::from_le_bytes(b))),
    })
}

/// A header value as an application property (spark_amqp/sink/amqp10_messages.py's `_app_value`).
fn app_value(out: &mut Vec<u8>, v: Value<'_>) {
    match v {
        Value::Null => out.push(0x40),
        Value::Str(raw) => string(out, raw),
        Value::Bytes(raw) => var(out, 0xa0, 0xb0, raw),
        Value::Bool(b) => out.push(if b { 0x41 } else { 0x42 }),
        Value::Long(i) => {
            out.push(0x81);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Value::Double(d) => {
            out.push(0x82);
            out.extend_from_slice(&d.to_be_bytes());
        }
    }
}

/// The delivery mode a row is written with, as Python checks it: 1 or 2, else 2 with option `persistent`.
pub(crate) fn delivery_mode(rows: &Rows<'_>, i: usize, persistent: bool) -> R<Option<u8>> {
    match octet(&rows.delivery_mode, i)? {
        Some(m @ (1 | 2)) => Ok(Some(m)),
        Some(_) => fb("a delivery_mode other than 1 or 2 (Python names it)"),
        None => Ok(persistent.then_some(2)),
    }
}

/// The expiration, as Python checks it: digits (ASCII ones; Python parses others itself).
pub(crate) fn expiration<'a>(rows: &Rows<'a>, i: usize) -> R<Option<&'a [u8]>> {
    match short(rows, EXPIRATION, i)? {
        Some(e) if e.is_empty() || !e.iter().all(u8::is_ascii_digit) => fb("an expiration Python refuses or parses itself"),
        e => Ok(e),
    }
}

/// Row `i`'s headers as application properties (key, encoded value), each key checked as Python checks it.
fn headers(rows: &Rows<'_>, i: usize, body: &mut Vec<u8>) -> R<usize> {
    let Some(m) = &rows.headers else { return Ok(0) };
    let at = m.offset + i;
    if !valid(m.valid, at)? {
        return Ok(0);
    }
    let (start, end) = (bound(m.offsets, at)?, bound(m.offsets, at + 1)?);
    if end < start {
        return fb("map offsets that go back");
    }
    let mut keys: Vec<&[u8]> = Vec::new(); // not end - start: offsets from malformed buffers can claim billions
    for j in start..end {
        let key = m.keys.get(j)?.ok_or(Fallback("a null map key"))?;
        if key.len() > 255 {
            return fb("a header key over 255 bytes (Python names it)");
        }
        if MERGED.contains(&key) {
            return fb("a header key Python's dict would merge");
        }
        keys.push(key);
        string(body, key);
        app_value(body, value(&m.values, j)?);
    }
    let count = keys.len();
    keys.sort_unstable(); // a repeated key (sorted, not compared pairwise: a map may hold thousands)
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return fb("a repeated header key, which Python's dict would merge");
    }
    Ok(count)
}

/// Row `i` of `rows` as a whole message, appended to `out`.
pub fn record(out: &mut Vec<u8>, rows: &Rows<'_>, i: usize, route: &Route<'_>, conv: Conversion, body: &[u8]) -> R<()> {
    let s = |at| short(rows, at, i);
    let (message_id, correlation_id, user_id, reply_to) = (s(MESSAGE_ID)?, s(CORRELATION_ID)?, s(USER_ID)?, s(REPLY_TO)?);
    let (content_type, content_encoding, kind, app_id) = (s(CONTENT_TYPE)?, s(CONTENT_ENCODING)?, s(TYPE)?, s(APP_ID)?);
    let priority = octet(&rows.priority, i)?;
    let mode = delivery_mode(rows, i, conv.persistent)?;
    let timestamp = seconds(&rows.timestamp, i)?;
    let ttl = match expiration(rows, i)? {
        None => None,
        Some(e) if conv.legacy => Some((e, 0)),
        Some(e) => {
            let ms = std::str::from_utf8(e).ok().and_then(|t| t.parse::<u32>().ok()).ok_or(Fallback("a ttl over an AMQP uint (Python names it)"))?;
            Some((e, ms))
        }
    };

    let (mut ann, mut ann_count) = (Vec::new(), 0);
    let mut annotate = |name: &[u8], value: &dyn Fn(&mut Vec<u8>)| -> R<()> {
        symbol(&mut ann, name)?;
        value(&mut ann);
        ann_count += 2;
        Ok(())
    };
    if route.to.is_none() {
        if let Some(x) = route.exchange {
            annotate(b"x-exchange", &|o| string(o, x.as_bytes()))?;
        }
        if let Some(k) = route.key {
            annotate(b"x-routing-key", &|o| string(o, k.as_bytes()))?;
        }
    }
    let mut apps = Vec::new();
    let mut app_count = 2 * headers(rows, i, &mut apps)?;
    let mut app = |name: &[u8], value: &[u8]| {
        string(&mut apps, name);
        string(&mut apps, value);
        app_count += 2;
    };
    if let Some(f) = route.filter {
        if conv.legacy {
            app(FILTER_VALUE_HEADER, f.as_bytes());
        } else {
            annotate(FILTER_VALUE_HEADER, &|o| string(o, f.as_bytes()))?;
        }
    }
    let mut header = Vec::new();
    let mut header_count = 0;
    if conv.legacy {
        if let Some(p) = priority {
            annotate(b"x-basic-priority", &|o| o.extend_from_slice(&[0x50, p]))?;
        }
        if let Some(m) = mode {
            annotate(b"x-basic-delivery-mode", &|o| o.extend_from_slice(&[0x50, m]))?;
        }
        if let Some((e, _)) = ttl {
            annotate(b"x-basic-expiration", &|o| string(o, e))?;
        }
        if let Some(t) = kind {
            app(b"x-basic-type", t);
        }
        if let Some(a) = app_id {
            app(b"x-basic-app-id", a);
        }
    } else {
        if mode.is_some() || priority.is_some() || ttl.is_some() {
            let fields: [Option<Vec<u8>>; 3] = [
                mode.map(|m| vec![if m == 2 { 0x41 } else { 0x42 }]),
                priority.map(|p| vec![0x50, p]),
                ttl.map(|(_, ms)| [&[0x70u8][..], &ms.to_be_bytes()].concat()),
            ];
            header_count = fields.iter().rposition(Option::is_some).map_or(0, |p| p + 1);
            for field in &fields[..header_count] {
                header.extend_from_slice(field.as_deref().unwrap_or(&[0x40]));
            }
        }
        if let Some(t) = kind {
            annotate(b"x-basic-type", &|o| string(o, t))?;
        }
    }

    // The properties section: message-id, user-id, to, subject, reply-to, correlation-id, content-type,
    // content-encoding, absolute-expiry-time, creation-time, group-id; trailing nulls left out.
    let mut reply = Vec::new();
    let reply_to = match reply_to {
        Some(r) if !conv.legacy && conv.address_reply_to => {
            reply.extend_from_slice(b"/queues/");
            quoted(&mut reply, r);
            Some(&reply[..])
        }
        other => other,
    };
    let group = if conv.legacy { None } else { app_id };
    let mut fields: [Option<Vec<u8>>; 11] = Default::default();
    fields[0] = message_id.map(|v| encoded(|o| string(o, v)));
    fields[1] = user_id.map(|v| encoded(|o| var(o, 0xa0, 0xb0, v)));
    fields[2] = route.to.map(|v| encoded(|o| string(o, v.as_bytes())));
    fields[4] = reply_to.map(|v| encoded(|o| string(o, v)));
    fields[5] = correlation_id.map(|v| encoded(|o| string(o, v)));
    fields[6] = content_type.map(symbol_bytes).transpose()?;
    fields[7] = content_encoding.map(symbol_bytes).transpose()?;
    fields[9] = timestamp.map(|t| [&[0x83u8][..], &(t * 1000).to_be_bytes()].concat());
    fields[10] = group.map(|v| encoded(|o| string(o, v)));
    let props_count = fields.iter().rposition(Option::is_some).map_or(0, |p| p + 1);
    let mut props = Vec::new();
    for field in &fields[..props_count] {
        props.extend_from_slice(field.as_deref().unwrap_or(&[0x40]));
    }

    if header_count > 0 {
        section(out, 0x70, true, header_count, &header);
    }
    if ann_count > 0 {
        section(out, 0x72, false, ann_count, &ann);
    }
    if props_count > 0 {
        section(out, 0x73, true, props_count, &props);
    }
    if app_count > 0 {
        section(out, 0x74, false, app_count, &apps);
    }
    out.extend_from_slice(&[0x00, 0x53, 0x75]);
    var(out, 0xa0, 0xb0, body);
    Ok(())
}
