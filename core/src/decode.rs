#![forbid(unsafe_code)]
//! Stream chunks to the source's columns (spark_amqp.reading.arrow.STREAM_ARROW_SCHEMA), without Python.
//!
//! The twin of spark_amqp.stream_protocol.rows.RowMaker (RabbitMQ 4.x's conversions), arrow.to_stream_batch and
//! streams.filtering.RowFilter. Whatever it does not mirror exactly (3.x's conversion, compressed sub-entries,
//! nested values, odd section layouts, undecodable data) is a `Fallback`: the chunk goes to the Python path, which
//! then also raises the errors Python raises, so a malformed message fails the same way on both paths. A chunk is all
//! or nothing (`Columns::rollback`, in columns.rs). Safe code only: a bounds mistake here is a panic (a Python
//! exception), never a read past a buffer. The `Mask` says which columns a query asked for: the others are neither built
//! nor rendered, and a query that asks for nothing held in the sections before the body has its records split at the
//! body by the sections' sizes (rows.py's `split`), none of them decoded.
pub use crate::amqp::{Fallback, Reader, R, V};
use crate::amqp::fb;
use crate::columns::{EXPIRATION, REPLY_TO};
pub use crate::columns::{
    Columns, IntCol, Mask, StrCol, BODY, COLUMNS, DELIVERY_MODE, EXCHANGE, HEADERS, OFFSET, PRIORITY, PROPS, QUEUE, ROUTING_KEY,
    STRING_PROPERTIES, TIMESTAMP,
};
pub use crate::render::{bitmap, py_float_repr};
use crate::render::{render_header, text};

#[derive(Clone, Copy)]
pub struct Conversion {
    pub headerless_durable: bool,
    pub address_reply_to: bool,
}

struct Props<'a> {
    message_id: V<'a>,
    user_id: V<'a>,
    reply_to: V<'a>,
    correlation_id: V<'a>,
    content_type: V<'a>,
    content_encoding: V<'a>,
    creation_time: V<'a>,
    group_id: V<'a>,
}

impl Columns {
    /// The records `skip..stop` of a chunk as a consumer gets it (header, data entries). All or nothing.
    pub fn add_chunk(&mut self, chunk: &[u8], skip: usize, stop: usize, stream: &str, conv: Conversion, filter: Option<&RowFilter>) -> R<usize> {
        let (rows, entries) = (self.rows, self.keys.valid.len());
        let r = self.chunk(chunk, skip, stop, stream, conv, filter);
        if r.is_err() {
            self.rollback(rows, entries);
        }
        r
    }

    fn chunk(&mut self, chunk: &[u8], skip: usize, stop: usize, stream: &str, conv: Conversion, filter: Option<&RowFilter>) -> R<usize> {
        if chunk.len() < 48 || chunk[0] >> 4 != 5 {
            return fb("not a chunk");
        }
        let entries = u16::from_be_bytes(chunk[2..4].try_into().unwrap()) as usize;
        let records = u32::from_be_bytes(chunk[4..8].try_into().unwrap()) as usize;
        let first = u64::from_be_bytes(chunk[24..32].try_into().unwrap());
        let crc = u32::from_be_bytes(chunk[32..36].try_into().unwrap());
        let size = u32::from_be_bytes(chunk[36..40].try_into().unwrap()) as usize;
        let bloom = (u32::from_be_bytes(chunk[44..48].try_into().unwrap()) >> 24) as usize;
        let mut start = 48;
        if chunk.len() - 48 > size {
            start += bloom;
        }
        if start + size > chunk.len() {
            return fb("a chunk shorter than its header says");
        }
        let data = &chunk[start..start + size];
        if crc32fast::hash(data) != crc {
            return fb("CRC");
        }
        if entries != records {
            return fb("sub-entries (compressed): left to Python, which decompresses them");
        }
        // Offsets past int64 (Python's pa.array raises there).
        let Some(first) = first.checked_add(records as u64).filter(|&end| end <= i64::MAX as u64).map(|_| first as i64) else {
            return fb("offsets past int64");
        };
        let mut pos = 0;
        let mut added = 0;
        let mut entries = Vec::new(); // one map's entries, reused from record to record
        for i in 0..records {
            if pos + 4 > data.len() {
                return fb("an entry past the end");
            }
            let word = u32::from_be_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
            if word & 0x8000_0000 != 0 || pos + 4 + word > data.len() {
                return fb("a sub-entry, or an entry past the end");
            }
            let record = &data[pos + 4..pos + 4 + word];
            pos += 4 + word;
            if i >= skip && i < stop {
                let (rows, kept_entries) = (self.rows, self.keys.valid.len());
                self.record(record, first + i as i64, stream, conv, &mut entries)?;
                // Every record in the range is decoded (its errors are the chunk's), and then filtered out or kept.
                if filter.map_or(Ok(true), |f| f.keeps(&entries))? {
                    added += 1;
                } else {
                    self.rollback(rows, kept_entries);
                }
            }
        }
        Ok(added)
    }

    /// One message delivered alone (an AMQP 1.0 transfer from a stream: its sections, as a chunk's record holds them)
    /// at `offset`: whether the row filter kept it (then it is a row); on a Fallback, or filtered out, nothing is added.
    pub fn add_message(&mut self, rec: &[u8], offset: i64, stream: &str, conv: Conversion, filter: Option<&RowFilter>) -> R<bool> {
        let (rows, kept_entries) = (self.rows, self.keys.valid.len());
        let mut entries = Vec::new();
        let kept = self.record(rec, offset, stream, conv, &mut entries).and_then(|()| filter.map_or(Ok(true), |f| f.keeps(&entries)));
        if !matches!(kept, Ok(true)) {
            self.rollback(rows, kept_entries);
        }
        kept
    }

    pub fn record<'a>(
        &mut self, rec: &'a [u8], offset: i64, stream: &str, conv: Conversion, entries: &mut Vec<(&'a [u8], V<'a>)>,
    ) -> R<()> {
        entries.clear();
        let m = self.mask;
        self.offset.push(offset);
        if m.has(QUEUE) {
            self.queue.push(Some(stream.as_bytes()))?;
        }
        let is_amqp10 = rec.len() >= 3 && rec[0] == 0 && rec[1] == 0x53 && (0x70..=0x78).contains(&rec[2]);
        if !is_amqp10 {
            if m.has(BODY) {
                self.body.push(Some(rec))?;
            }
            self.nulls()?;
        } else if m.sections() {
            self.sections(rec, stream, conv, entries)?;
        } else {
            self.body_only(rec)?;
        }
        self.rows += 1;
        Ok(())
    }

    /// rows.py's `split`, for a query that asks for no column of the sections before the body: the body when it is one
    /// data section, the last, found by the sizes of the sections before it, none of them decoded. Anything else (several
    /// data sections, an amqp-value body, a section not sized so) is Python's, which decodes the whole message.
    fn body_only(&mut self, rec: &[u8]) -> R<()> {
        const WHOLE: Fallback = Fallback("a body split by sizes does not find: left to Python, which decodes the message");
        let n = rec.len();
        let byte = |at: usize| rec.get(at).copied().ok_or(WHOLE);
        let word = |at: usize| rec.get(at..at + 4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize).ok_or(WHOLE);
        let mut pos = 0;
        while pos < n && byte(pos)? == 0x00 && byte(pos + 1)? == 0x53 {
            let (code, kind, at) = (byte(pos + 2)?, byte(pos + 3)?, pos + 4);
            if (0x75..=0x77).contains(&code) {
                if code == 0x75 && (kind == 0xA0 || kind == 0xB0) {
                    let (size, head) = if kind == 0xA0 { (byte(at)? as usize, 1) } else { (word(at)?, 4) };
                    if at + head + size == n {
                        if self.mask.has(BODY) {
                            self.body.push(Some(&rec[at + head..]))?;
                        }
                        return Ok(());
                    }
                }
                return Err(WHOLE);
            }
            pos = match kind {
                0xC0 | 0xC1 => at + 1 + byte(at)? as usize,
                0xD0 | 0xD1 => at + 4 + word(at)?,
                0x40 | 0x45 => at,
                _ => return Err(WHOLE),
            };
        }
        Err(WHOLE)
    }

    fn sections<'a>(&mut self, rec: &'a [u8], stream: &str, conv: Conversion, entries: &mut Vec<(&'a [u8], V<'a>)>) -> R<()> {
        let m = self.mask;
        let body = m.has(BODY);
        let mut r = Reader { d: rec, p: 0 };
        let mut seen = 0u16;
        let mut header: [V; 3] = [V::Null; 3];
        let mut header_items = 0usize;
        let mut props = Props {
            message_id: V::Null,
            user_id: V::Null,
            reply_to: V::Null,
            correlation_id: V::Null,
            content_type: V::Null,
            content_encoding: V::Null,
            creation_time: V::Null,
            group_id: V::Null,
        };
        let (mut exchange, mut routing_key, mut basic_type): (V, Option<V>, V) = (V::Null, None, V::Null);
        let mut body_kind = 0u8; // 0 none, 0x75 data, 0x77 value
        while r.p < rec.len() {
            if r.take(2)? != [0x00, 0x53] {
                return fb("a section descriptor other than a smallulong");
            }
            let code = r.u8()?;
            if !(0x70..=0x78).contains(&code) {
                return fb("an unknown section");
            }
            let bit = 1u16 << (code - 0x70);
            if seen & bit != 0 && code != 0x75 {
                return fb("a section twice");
            }
            if body_kind != 0 && code != 0x78 && !(code == 0x75 && body_kind == 0x75) {
                return fb("a section after the body");
            }
            seen |= bit;
            let v = r.value(false)?;
            match (code, v) {
                (0x70, V::List(n, end)) => {
                    for i in 0..n {
                        let x = r.value(false)?;
                        if i < 3 {
                            header[i] = x;
                        }
                        r.skip(x)?;
                    }
                    r.close(end)?;
                    header_items = n;
                }
                (0x71 | 0x78, V::Map(..)) => r.skip(v)?,
                (0x72, V::Map(n, end)) => {
                    for _ in 0..n {
                        let k = match r.value(false)? {
                            V::Sym(k) if k.is_ascii() => k,
                            V::Str(k) => k.as_bytes(),
                            _ => return fb("an annotation key that is not a symbol or string"),
                        };
                        let x = r.value(false)?;
                        r.skip(x)?;
                        match k {
                            b"x-exchange" => exchange = x,
                            b"x-routing-key" => routing_key = Some(x),
                            _ if k.starts_with(b"x-basic-") => {
                                if k == b"x-basic-type" {
                                    basic_type = x
                                }
                            }
                            _ => put(entries, k, x),
                        }
                    }
                    r.close(end)?;
                }
                (0x73, V::List(n, end)) => {
                    for i in 0..n {
                        let x = r.value(false)?;
                        r.skip(x)?;
                        match i {
                            0 => props.message_id = x,
                            1 => props.user_id = x,
                            4 => props.reply_to = x,
                            5 => props.correlation_id = x,
                            6 => props.content_type = x,
                            7 => props.content_encoding = x,
                            9 => props.creation_time = x,
                            10 => props.group_id = x,
                            _ => {}
                        }
                    }
                    r.close(end)?;
                }
                (0x74, V::Map(n, end)) => {
                    for _ in 0..n {
                        let k = match r.value(false)? {
                            V::Str(k) => k.as_bytes(),
                            V::Sym(k) if k.is_ascii() => k,
                            _ => return fb("an application property key that is not a string"),
                        };
                        let x = r.value(true)?;
                        r.skip(x)?;
                        put(entries, k, x);
                    }
                    r.close(end)?;
                }
                (0x75, V::Bin(b)) => {
                    if body {
                        self.body.data.extend_from_slice(b);
                    }
                    body_kind = 0x75;
                }
                (0x77, V::Bin(b)) => {
                    if body {
                        self.body.data.extend_from_slice(b);
                    }
                    body_kind = 0x77;
                }
                (0x77, V::Str(s)) => {
                    if body {
                        self.body.data.extend_from_slice(s.as_bytes());
                    }
                    body_kind = 0x77;
                }
                (0x77, V::Null) => body_kind = 0x77,
                (0x70 | 0x71 | 0x72 | 0x73 | 0x74 | 0x78, V::Null) => {}
                _ => return fb("a section of a kind or value left to Python"),
            }
        }
        if body {
            self.body.end(true)?;
        }
        // What is not asked for is neither checked nor rendered: the Python path does not convert it either.
        if m.has(EXCHANGE) {
            // str(ann.get("x-exchange") or "")
            match exchange {
                V::Null => self.exchange.push(Some(b""))?,
                V::Str(s) => self.exchange.push(Some(s.as_bytes()))?,
                V::Sym(s) if s.is_ascii() => self.exchange.push(Some(s))?,
                _ => return fb("an x-exchange that is not text"),
            }
        }
        if m.has(ROUTING_KEY) {
            // str(ann.get("x-routing-key", stream))
            match routing_key {
                None => self.routing_key.push(Some(stream.as_bytes()))?,
                Some(V::Null) => self.routing_key.push(Some(b"None"))?,
                Some(V::Str(s)) => self.routing_key.push(Some(s.as_bytes()))?,
                Some(V::Sym(s)) if s.is_ascii() => self.routing_key.push(Some(s))?,
                _ => return fb("an x-routing-key that is not text"),
            }
        }

        // header: durable, priority, ttl
        if m.has(DELIVERY_MODE) {
            let durable = if header_items > 0 {
                header[0]
            } else if conv.headerless_durable {
                V::Bool(true)
            } else {
                V::Null
            };
            let mode = match durable {
                V::Null => None,
                V::Bool(b) => Some(if b { 2 } else { 1 }),
                _ => return fb("a durable that is not a boolean"),
            };
            self.delivery_mode.push(mode);
        }
        if m.has(PRIORITY) {
            let priority = match header[1] {
                V::Null => None,
                V::U(x) if x <= i32::MAX as u64 => Some(x as i32),
                V::I(x) if x >= i32::MIN as i64 && x <= i32::MAX as i64 => Some(x as i32),
                _ => return fb("a priority left to Python"),
            };
            self.priority.push(priority);
        }
        let expiration = match header[2] {
            V::Null | V::U(_) | V::I(_) | V::Str(_) => header[2],
            _ if !m.has(EXPIRATION) => V::Null,
            _ => return fb("a ttl left to Python"),
        };
        let reply_to = match props.reply_to {
            _ if !m.has(REPLY_TO) => V::Null,
            V::Str(s) if conv.address_reply_to && s.starts_with("/queues/") => {
                if s.contains('%') {
                    return fb("a reply_to address to unquote");
                }
                V::Str(&s[8..])
            }
            V::Sym(s) if conv.address_reply_to && s.starts_with(b"/queues/") => {
                if !s.is_ascii() || s.contains(&b'%') {
                    return fb("a reply_to address to unquote");
                }
                V::Sym(&s[8..])
            }
            x => x,
        };
        // STRING_PROPERTIES' order: message_id, correlation_id, content_type, content_encoding, type, app_id,
        // user_id, reply_to, expiration
        let texts = [
            props.message_id,
            props.correlation_id,
            props.content_type,
            props.content_encoding,
            basic_type,
            props.group_id,
            props.user_id,
            reply_to,
            expiration,
        ];
        for (i, (col, v)) in self.props.iter_mut().zip(texts).enumerate() {
            if m.has(PROPS + i) {
                let ok = text(v, &mut col.data)?;
                col.end(ok)?;
            }
        }
        if m.has(TIMESTAMP) {
            let ts = match props.creation_time {
                V::Null => None,
                V::Ts(ms) | V::I(ms) => Some(ms.div_euclid(1000).checked_mul(1_000_000).ok_or(Fallback("a timestamp out of range"))?),
                V::U(ms) if ms <= i64::MAX as u64 => {
                    Some((ms as i64 / 1000).checked_mul(1_000_000).ok_or(Fallback("a timestamp out of range"))?)
                }
                _ => return fb("a creation_time left to Python"),
            };
            self.timestamp.push(ts);
        }

        // headers: annotations (not routing, not x-basic-*), then application properties; x-stream-offset cut out. The
        // entries are gathered whatever the mask: the row filter reads them.
        if m.has(HEADERS) {
            entries.retain(|(k, _)| *k != b"x-stream-offset");
            if entries.is_empty() {
                self.headers_valid.push(0);
                self.headers_nulls += 1;
            } else {
                self.headers_valid.push(1);
                for (k, v) in entries.iter() {
                    self.keys.push(Some(k))?;
                    let ok = render_header(*v, &mut self.values.data)?;
                    self.values.end(ok)?;
                }
            }
            self.headers_offsets.push(self.keys.valid.len() as i32);
        }
        Ok(())
    }

}

/// The header a publisher marks a message with for stream filtering (spark_amqp.rabbitmq.FILTER_VALUE_HEADER).
pub const FILTER_VALUE: &[u8] = b"x-stream-filter-value";

/// streams.filtering.RowFilter.keeps of rows.StreamProperties.text_header: the filter value as text (a string or a
/// symbol as it is, binary as UTF-8 with replacement), kept when it is one of `values`; a message without one (or
/// with one of another type) as `match_unfiltered` says.
pub struct RowFilter {
    pub values: Vec<Vec<u8>>,
    pub match_unfiltered: bool,
}

impl RowFilter {
    fn keeps(&self, entries: &[(&[u8], V)]) -> R<bool> {
        let value = entries.iter().find(|(k, _)| *k == FILTER_VALUE).map(|e| e.1);
        let text: std::borrow::Cow<[u8]> = match value {
            Some(V::Str(s)) => s.as_bytes().into(),
            Some(V::Sym(s)) if s.is_ascii() => s.into(),
            Some(V::Sym(_)) => return fb("a filter value that is a symbol not ASCII"),
            Some(V::Bin(b) | V::Opaque(b)) => match String::from_utf8_lossy(b) {
                std::borrow::Cow::Borrowed(t) => t.as_bytes().into(),
                std::borrow::Cow::Owned(t) => t.into_bytes().into(),
            },
            _ => return Ok(self.match_unfiltered),
        };
        Ok(self.values.iter().any(|v| v[..] == text[..]))
    }
}

/// dict semantics: a key seen before keeps its place and takes the new value.
fn put<'a>(entries: &mut Vec<(&'a [u8], V<'a>)>, k: &'a [u8], v: V<'a>) {
    for e in entries.iter_mut() {
        if e.0 == k {
            e.1 = v;
            return;
        }
    }
    entries.push((k, v));
}

