#![forbid(unsafe_code)]
//! The columns the decoder builds, in Arrow's layout (validity, i32 offsets, values), and the `Mask` of those a query
//! asked for (spark_amqp.reading.projection): a column not asked for stays empty. A chunk is all or nothing: `rollback`
//! takes the columns back to where the chunk began, `recover` does after a panic.
use crate::amqp::{fb, R};

/// A string column: one validity byte a row (packed at the end), i32 offsets, the bytes.
#[derive(Default)]
pub struct StrCol {
    pub valid: Vec<u8>,
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub nulls: usize,
}

impl StrCol {
    pub(crate) fn new() -> Self {
        StrCol { offsets: vec![0], ..Default::default() }
    }
    pub(crate) fn end(&mut self, valid: bool) -> R<()> {
        if self.data.len() > i32::MAX as usize {
            return fb("a column past 2 GiB");
        }
        self.offsets.push(self.data.len() as i32);
        self.valid.push(valid as u8);
        self.nulls += !valid as usize;
        Ok(())
    }
    pub(crate) fn push(&mut self, v: Option<&[u8]>) -> R<()> {
        if let Some(b) = v {
            self.data.extend_from_slice(b);
        }
        self.end(v.is_some())
    }
    /// Back to `rows` rows, the bytes of an unfinished row dropped too; a column the mask leaves empty stays so.
    fn truncate(&mut self, rows: usize) {
        if rows < self.valid.len() {
            self.nulls -= self.valid[rows..].iter().filter(|&&v| v == 0).count();
            self.valid.truncate(rows);
        }
        self.offsets.truncate(rows + 1);
        if let Some(&end) = self.offsets.get(rows) {
            self.data.truncate(end as usize);
        }
    }
}

#[derive(Default)]
pub struct IntCol<T> {
    pub valid: Vec<u8>,
    pub values: Vec<T>,
    pub nulls: usize,
}

impl<T: Default + Copy> IntCol<T> {
    pub(crate) fn push(&mut self, v: Option<T>) {
        self.values.push(v.unwrap_or_default());
        self.valid.push(v.is_some() as u8);
        self.nulls += v.is_none() as usize;
    }
    fn truncate(&mut self, rows: usize) {
        if rows >= self.valid.len() {
            return;
        }
        self.nulls -= self.valid[rows..].iter().filter(|&&v| v == 0).count();
        self.valid.truncate(rows);
        self.values.truncate(rows);
    }
}

pub const STRING_PROPERTIES: usize = 9;

/// The columns a query asked for (spark_amqp.reading.projection), a bit each at its place in `COLUMNS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mask(pub u32);

/// STREAM_ARROW_SCHEMA's columns but raw_header (an AMQP 0-9-1 reader's only), in its order.
pub const COLUMNS: [&str; 18] = [
    "body",
    "queue",
    "exchange",
    "routing_key",
    "offset",
    "message_id",
    "correlation_id",
    "content_type",
    "content_encoding",
    "type",
    "app_id",
    "user_id",
    "reply_to",
    "expiration",
    "priority",
    "delivery_mode",
    "timestamp",
    "headers",
];
pub const BODY: usize = 0;
pub const QUEUE: usize = 1;
pub const EXCHANGE: usize = 2;
pub const ROUTING_KEY: usize = 3;
pub const OFFSET: usize = 4;
pub const PROPS: usize = 5; // the string properties, STRING_PROPERTIES of them
pub(crate) const REPLY_TO: usize = PROPS + 7;
pub(crate) const EXPIRATION: usize = PROPS + 8;
pub const PRIORITY: usize = 14;
pub const DELIVERY_MODE: usize = 15;
pub const TIMESTAMP: usize = 16;
pub const HEADERS: usize = 17;

impl Mask {
    pub const ALL: Mask = Mask((1 << COLUMNS.len()) - 1);

    /// The mask of these column names; the first name that is not a column, as an error.
    pub fn of<S: AsRef<str>>(names: &[S]) -> Result<Mask, String> {
        let mut bits = 0u32;
        for name in names {
            let at = COLUMNS.iter().position(|c| *c == name.as_ref()).ok_or_else(|| name.as_ref().to_string())?;
            bits |= 1 << at;
        }
        Ok(Mask(bits))
    }

    pub fn has(self, column: usize) -> bool {
        self.0 >> column & 1 == 1
    }

    /// Whether any column asked for is read from the sections before the body (all but body, queue and offset).
    pub(crate) fn sections(self) -> bool {
        self.0 & !(1 << BODY | 1 << QUEUE | 1 << OFFSET) != 0
    }
}

pub struct Columns {
    pub mask: Mask,
    pub rows: usize,
    pub body: StrCol,
    pub queue: StrCol,
    pub exchange: StrCol,
    pub routing_key: StrCol,
    pub offset: Vec<i64>,
    pub props: [StrCol; STRING_PROPERTIES], // message_id … expiration, arrow.py's order
    pub priority: IntCol<i32>,
    pub delivery_mode: IntCol<i32>,
    pub timestamp: IntCol<i64>, // microseconds
    pub headers_valid: Vec<u8>,
    pub headers_nulls: usize,
    pub headers_offsets: Vec<i32>,
    pub keys: StrCol,
    pub values: StrCol,
}

impl Default for Columns {
    fn default() -> Self {
        Self::new()
    }
}

impl Columns {
    pub fn new() -> Self {
        Self::with(Mask::ALL)
    }

    /// Columns that build only those of `mask` (the others stay empty; offsets are always kept: the rows' count).
    pub fn with(mask: Mask) -> Self {
        Columns {
            mask,
            rows: 0,
            body: StrCol::new(),
            queue: StrCol::new(),
            exchange: StrCol::new(),
            routing_key: StrCol::new(),
            offset: Vec::new(),
            props: std::array::from_fn(|_| StrCol::new()),
            priority: IntCol::default(),
            delivery_mode: IntCol::default(),
            timestamp: IntCol::default(),
            headers_valid: Vec::new(),
            headers_nulls: 0,
            headers_offsets: vec![0],
            keys: StrCol::new(),
            values: StrCol::new(),
        }
    }

    pub(crate) fn rollback(&mut self, rows: usize, entries: usize) {
        self.rows = rows;
        for c in [&mut self.body, &mut self.queue, &mut self.exchange, &mut self.routing_key] {
            c.truncate(rows);
        }
        for c in self.props.iter_mut() {
            c.truncate(rows);
        }
        self.offset.truncate(rows);
        self.priority.truncate(rows);
        self.delivery_mode.truncate(rows);
        self.timestamp.truncate(rows);
        if rows < self.headers_valid.len() {
            self.headers_nulls -= self.headers_valid[rows..].iter().filter(|&&v| v == 0).count();
            self.headers_valid.truncate(rows);
        }
        self.headers_offsets.truncate(rows + 1);
        self.keys.truncate(entries);
        self.values.truncate(entries);
    }

    /// Null in every column built from the sections before the body (a record that is not AMQP 1.0).
    pub(crate) fn nulls(&mut self) -> R<()> {
        let m = self.mask;
        for (at, c) in [(EXCHANGE, &mut self.exchange), (ROUTING_KEY, &mut self.routing_key)] {
            if m.has(at) {
                c.push(None)?;
            }
        }
        for (i, c) in self.props.iter_mut().enumerate() {
            if m.has(PROPS + i) {
                c.push(None)?;
            }
        }
        for (at, c) in [(PRIORITY, &mut self.priority), (DELIVERY_MODE, &mut self.delivery_mode)] {
            if m.has(at) {
                c.push(None);
            }
        }
        if m.has(TIMESTAMP) {
            self.timestamp.push(None);
        }
        if m.has(HEADERS) {
            self.headers_valid.push(0);
            self.headers_nulls += 1;
            self.headers_offsets.push(self.keys.valid.len() as i32);
        }
        Ok(())
    }

    /// After a panic inside `add_chunk` (a bug: it never happens in the tests), back to `rows` rows and `entries`
    /// header entries, whatever state the panic left: each column cut to its length and its null count counted anew.
    pub fn recover(&mut self, rows: usize, entries: usize) {
        fn cut(c: &mut StrCol, n: usize) {
            let n = n.min(c.valid.len()).min(c.offsets.len().saturating_sub(1));
            c.valid.truncate(n);
            c.offsets.truncate(n + 1);
            c.data.truncate(c.offsets.last().map_or(0, |&o| o as usize));
            c.nulls = c.valid.iter().filter(|&&v| v == 0).count();
        }
        fn cut_int<T>(c: &mut IntCol<T>, n: usize) {
            c.valid.truncate(n);
            c.values.truncate(n);
            c.nulls = c.valid.iter().filter(|&&v| v == 0).count();
        }
        let m = self.mask;
        let mut rows = rows.min(self.offset.len());
        if m.has(HEADERS) {
            rows = rows.min(self.headers_valid.len()).min(self.headers_offsets.len().saturating_sub(1));
        }
        for (at, c) in [(BODY, &self.body), (QUEUE, &self.queue), (EXCHANGE, &self.exchange), (ROUTING_KEY, &self.routing_key)] {
            if m.has(at) {
                rows = rows.min(c.valid.len());
            }
        }
        for c in [&mut self.body, &mut self.queue, &mut self.exchange, &mut self.routing_key] {
            cut(c, rows);
        }
        for c in self.props.iter_mut() {
            cut(c, rows);
        }
        self.offset.truncate(rows);
        cut_int(&mut self.priority, rows);
        cut_int(&mut self.delivery_mode, rows);
        cut_int(&mut self.timestamp, rows);
        self.headers_valid.truncate(rows);
        self.headers_nulls = self.headers_valid.iter().filter(|&&v| v == 0).count();
        self.headers_offsets.truncate(rows + 1);
        let entries = entries.min(self.headers_offsets.last().map_or(0, |&o| o as usize));
        cut(&mut self.keys, entries);
        cut(&mut self.values, entries);
        self.rows = rows;
    }

    pub fn clear(&mut self) {
        self.rollback(0, 0);
    }
}
