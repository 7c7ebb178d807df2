//! The Python face of the decoder: `Builder` takes chunks, `finish` hands the columns over as plain buffers for
//! `pa.Array.from_buffers`. No arrow-rs: the buffers are Arrow's own layout (validity bitmaps, i32 offsets, values).
use crate::basic::Properties;
use crate::content;
use crate::records::{self, Bools, Clock, Ints, Map, Route, Rows, Strings, Values};
use crate::decode::{bitmap, Columns, Conversion, IntCol, Mask, RowFilter, StrCol, BODY, DELIVERY_MODE, EXCHANGE, HEADERS, OFFSET, PRIORITY, PROPS, QUEUE, ROUTING_KEY, TIMESTAMP};
use pyo3::exceptions::PyValueError;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// The contract with spark_amqp/stream_protocol/core.py: what `add` takes and what `finish` returns. Raised whenever
/// either changes, so that a connector never runs a core it was not written for (it falls back to Python then).
/// 2: the columns to make (`columns`), and None in `finish` for the others. 3: `basic_properties` (AMQP 0-9-1
/// content headers to the property columns). 4: `amqp10_records` and `basic_headers` (the sinks' rows
/// to AMQP 1.0 messages and to AMQP 0-9-1 content-header properties), and `Builder.add_message` (a stream's
/// messages delivered over AMQP 1.0).
const ABI: u32 = 4;

#[pyclass(module = "spark_amqp_core._core")]
struct Builder {
    cols: Columns,
    stream: String,
    conv: Conversion,
    filter: Option<RowFilter>,
    /// Why the last chunk left to Python was left to it (tests and debug logs).
    #[pyo3(get)]
    fallback: Option<&'static str>,
}

fn le_bytes<'py, T: Copy, const N: usize>(py: Python<'py>, v: &[T], f: fn(T) -> [u8; N]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, v.len() * N, |b| {
        for (chunk, x) in b.chunks_exact_mut(N).zip(v) {
            chunk.copy_from_slice(&f(*x));
        }
        Ok(())
    })
}

fn opt_bytes<'py>(py: Python<'py>, v: Option<Vec<u8>>) -> Bound<'py, PyAny> {
    match v {
        Some(b) => PyBytes::new(py, &b).into_any(),
        None => py.None().into_bound(py),
    }
}

/// (validity or None, null count, offsets, data)
fn str_col<'py>(py: Python<'py>, c: &StrCol) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            opt_bytes(py, bitmap(&c.valid, c.nulls)),
            c.nulls.into_pyobject(py)?.into_any(),
            le_bytes(py, &c.offsets, i32::to_le_bytes)?.into_any(),
            PyBytes::new(py, &c.data).into_any(),
        ],
    )
}

/// (validity or None, null count, values)
fn int_col<'py, T: Copy, const N: usize>(py: Python<'py>, c: &IntCol<T>, f: fn(T) -> [u8; N]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            opt_bytes(py, bitmap(&c.valid, c.nulls)),
            c.nulls.into_pyobject(py)?.into_any(),
            le_bytes(py, &c.values, f)?.into_any(),
        ],
    )
}

/// (validity or None, null count, map offsets, keys' str_col, values' str_col)
fn headers_col<'py>(py: Python<'py>, c: &Columns) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            opt_bytes(py, bitmap(&c.headers_valid, c.headers_nulls)),
            c.headers_nulls.into_pyobject(py)?.into_any(),
            le_bytes(py, &c.headers_offsets, i32::to_le_bytes)?.into_any(),
            str_col(py, &c.keys)?.into_any(),
            str_col(py, &c.values)?.into_any(),
        ],
    )
}

/// AMQP 0-9-1 content headers (each the frame's payload, as LazyProperties.header keeps it) to the property
/// columns `columns` (names from spark_amqp.reading.projection, raw_header among them or not): the 9 string
/// properties, priority, delivery_mode, timestamp, headers and raw_header in arrow.py's order, None for those not
/// asked for. None for the whole batch when any header is one the core leaves to Python (basic.rs says which).
#[pyfunction]
fn basic_properties<'py>(py: Python<'py>, headers: Vec<Bound<'py, PyBytes>>, columns: Vec<String>) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut p = Properties::with(&columns).map_err(|name| PyValueError::new_err(format!("not a property column the core makes: {name:?}")))?;
    let slices: Vec<&[u8]> = headers.iter().map(|h| h.as_bytes()).collect();
    // A panic (a bug) leaves the batch to Python, as Builder.add leaves a chunk.
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slices.iter().try_for_each(|h| p.add(h))));
    if !matches!(built, Ok(Ok(()))) {
        return Ok(None);
    }
    let (c, m) = (&p.cols, p.cols.mask);
    let none = || py.None().into_bound(py);
    let mut items: Vec<Bound<'py, PyAny>> = Vec::with_capacity(14);
    for (i, col) in c.props.iter().enumerate() {
        items.push(if m.has(PROPS + i) { str_col(py, col)?.into_any() } else { none() });
    }
    items.push(if m.has(PRIORITY) { int_col(py, &c.priority, i32::to_le_bytes)?.into_any() } else { none() });
    items.push(if m.has(DELIVERY_MODE) { int_col(py, &c.delivery_mode, i32::to_le_bytes)?.into_any() } else { none() });
    items.push(if m.has(TIMESTAMP) { int_col(py, &c.timestamp, i64::to_le_bytes)?.into_any() } else { none() });
    items.push(if m.has(HEADERS) { headers_col(py, c)?.into_any() } else { none() });
    items.push(if p.want_raw { str_col(py, &p.raw)?.into_any() } else { none() });
    Ok(Some(PyTuple::new(py, items)?))
}

/// A column as spark_amqp/sink/core_records.py hands it over: (validity or None, the array's offset, buffer, buffer).
type Column<'py> = (Option<Bound<'py, PyBytes>>, usize, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>);
/// The headers: (validity or None, offset, offsets, keys' column, the values' kind, values' column).
type MapColumn<'py> = (Option<Bound<'py, PyBytes>>, usize, Bound<'py, PyBytes>, Column<'py>, String, Column<'py>);

fn strings<'a>(c: &'a Column<'_>) -> PyResult<Strings<'a>> {
    let data = c.3.as_ref().ok_or_else(|| PyValueError::new_err("a string column without its data buffer"))?;
    Ok(Strings { valid: c.0.as_ref().map(|b| b.as_bytes()), offset: c.1, offsets: c.2.as_bytes(), data: data.as_bytes() })
}

fn ints<'a>(c: &'a Column<'_>) -> Ints<'a> {
    Ints { valid: c.0.as_ref().map(|b| b.as_bytes()), offset: c.1, values: c.2.as_bytes() }
}

fn map<'a>(m: &'a MapColumn<'_>) -> PyResult<Map<'a>> {
    let v = &m.5;
    let values = match m.4.as_str() {
        "string" => Values::Str(strings(v)?),
        "binary" => Values::Bin(strings(v)?),
        "bool" => Values::Bool(Bools { valid: v.0.as_ref().map(|b| b.as_bytes()), offset: v.1, values: v.2.as_bytes() }),
        "long" => Values::Long(ints(v)),
        "double" => Values::Double(ints(v)),
        other => return Err(PyValueError::new_err(format!("not a kind of header value the core writes: {other:?}"))),
    };
    Ok(Map { valid: m.0.as_ref().map(|b| b.as_bytes()), offset: m.1, offsets: m.2.as_bytes(), keys: strings(&m.3)?, values })
}

fn property_rows<'a>(
    strings_: &'a [Option<Column<'_>>], priority: &'a Option<Column<'_>>, delivery_mode: &'a Option<Column<'_>>,
    timestamp: &'a Option<(Column<'_>, bool)>, headers: &'a Option<MapColumn<'_>>,
) -> PyResult<Rows<'a>> {
    if strings_.len() != 9 {
        return Err(PyValueError::new_err("the 9 string property columns, or None for each"));
    }
    let mut rows = Rows { priority: priority.as_ref().map(ints), delivery_mode: delivery_mode.as_ref().map(ints), ..Rows::default() };
    for (slot, col) in rows.strings.iter_mut().zip(strings_) {
        *slot = col.as_ref().map(strings).transpose()?;
    }
    rows.timestamp = timestamp.as_ref().map(|(c, micros)| (ints(c), if *micros { Clock::Micros } else { Clock::Seconds }));
    rows.headers = headers.as_ref().map(map).transpose()?;
    Ok(rows)
}

/// The AMQP 0-9-1 sink's rows as content-header properties (core/src/content.rs), each a bytes: `n` rows of the
/// property columns as `amqp10_records` takes them, and per row the filter value (a header). None for the whole batch
/// when a row is Python's to write.
#[pyfunction]
#[pyo3(signature = (n, strings_, priority, delivery_mode, timestamp, headers, filters, persistent))]
#[allow(clippy::too_many_arguments)]
fn basic_headers<'py>(
    py: Python<'py>, n: usize, strings_: Vec<Option<Column<'py>>>, priority: Option<Column<'py>>, delivery_mode: Option<Column<'py>>,
    timestamp: Option<(Column<'py>, bool)>, headers: Option<MapColumn<'py>>, filters: Option<Vec<Option<String>>>, persistent: bool,
) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
    if filters.as_ref().is_some_and(|f| f.len() != n) {
        return Err(PyValueError::new_err("basic_headers: filter values of another length than the rows"));
    }
    let rows = property_rows(&strings_, &priority, &delivery_mode, &timestamp, &headers)?;
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<Vec<Vec<u8>>, records::Refusal> {
        (0..n)
            .map(|i| {
                let mut out = Vec::with_capacity(128);
                let filter = filters.as_ref().and_then(|f| f[i].as_deref());
                content::properties(&mut out, &rows, i, filter, persistent)?;
                Ok(out)
            })
            .collect()
    }));
    match built {
        Ok(Ok(made)) => Ok(Some(made.iter().map(|r| PyBytes::new(py, r)).collect())),
        _ => Ok(None),
    }
}

/// The sinks' rows as AMQP 1.0 messages (core/src/records.rs), each a bytes: `bodies`, the 9 string property columns
/// (None for those not in the batch), priority and delivery_mode (int64), the timestamp (int64, and whether it counts
/// microseconds), the headers, and per row the routing annotations, the filter value and the address (`tos`: the
/// AMQP 1.0 sink's, which leaves the annotations out). None for the whole batch when a row is Python's to write.
#[pyfunction]
#[pyo3(signature = (bodies, strings_, priority, delivery_mode, timestamp, headers, exchanges, keys, filters, tos, legacy, address_reply_to, persistent))]
#[allow(clippy::too_many_arguments)]
fn amqp10_records<'py>(
    py: Python<'py>, bodies: Vec<Bound<'py, PyBytes>>, strings_: Vec<Option<Column<'py>>>, priority: Option<Column<'py>>,
    delivery_mode: Option<Column<'py>>, timestamp: Option<(Column<'py>, bool)>, headers: Option<MapColumn<'py>>,
    exchanges: Option<Vec<Option<String>>>, keys: Option<Vec<Option<String>>>, filters: Option<Vec<Option<String>>>,
    tos: Option<Vec<String>>, legacy: bool, address_reply_to: bool, persistent: bool,
) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
    let n = bodies.len();
    if [&exchanges, &keys, &filters].iter().any(|v| v.as_ref().is_some_and(|v| v.len() != n)) || tos.as_ref().is_some_and(|t| t.len() != n) {
        return Err(PyValueError::new_err("amqp10_records: columns of other lengths than the bodies"));
    }
    let rows = property_rows(&strings_, &priority, &delivery_mode, &timestamp, &headers)?;
    let conv = records::Conversion { legacy, address_reply_to, persistent };
    fn at(v: &Option<Vec<Option<String>>>, i: usize) -> Option<&str> {
        v.as_ref().and_then(|v| v[i].as_deref())
    }
    let slices: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    // A panic (a bug) leaves the batch to Python, as basic_properties does.
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<Vec<Vec<u8>>, records::Refusal> {
        let mut out = Vec::with_capacity(n);
        for (i, body) in slices.iter().enumerate() {
            let route = Route { exchange: at(&exchanges, i), key: at(&keys, i), filter: at(&filters, i), to: tos.as_ref().map(|t| t[i].as_str()) };
            let mut record = Vec::with_capacity(body.len() + 256);
            records::record(&mut record, &rows, i, &route, conv, body)?;
            out.push(record);
        }
        Ok(out)
    }));
    match built {
        Ok(Ok(made)) => Ok(Some(made.iter().map(|r| PyBytes::new(py, r)).collect())),
        _ => Ok(None),
    }
}

#[pymethods]
impl Builder {
    /// `stream`: the queue column's value and the routing key's default; the conversion of RabbitMQ 4.x (3.x's is
    /// Python's alone); `filter_values`: the row filter's values (None: no filter), `match_unfiltered` its flag;
    /// `columns`: the names of the columns to make (None: all), as spark_amqp.reading.projection gives them.
    #[new]
    #[pyo3(signature = (stream, headerless_durable=false, address_reply_to=true, filter_values=None, match_unfiltered=false, columns=None))]
    fn new(
        stream: String, headerless_durable: bool, address_reply_to: bool, filter_values: Option<Vec<String>>, match_unfiltered: bool,
        columns: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let mask = match columns {
            None => Mask::ALL,
            Some(names) => Mask::of(&names).map_err(|name| PyValueError::new_err(format!("not a column the core makes: {name:?}")))?,
        };
        let filter = filter_values.map(|v| RowFilter { values: v.into_iter().map(String::into_bytes).collect(), match_unfiltered });
        let conv = Conversion { headerless_durable, address_reply_to };
        Ok(Builder { cols: Columns::with(mask), stream, conv, filter, fallback: None })
    }

    /// The chunk's records `skip..stop` (those the filter keeps) as rows: how many were added; None, with nothing
    /// added, when the chunk is left to the Python path. The chunk is copied first (a few microseconds for a chunk of
    /// hundreds of messages), so that no unsafe code reads a Python buffer.
    fn add(&mut self, py: Python<'_>, chunk: PyBuffer<u8>, skip: usize, stop: usize) -> PyResult<Option<usize>> {
        let data = chunk.to_vec(py)?;
        let (rows, entries) = (self.cols.rows, self.cols.keys.valid.len());
        let (cols, stream, conv, filter) = (&mut self.cols, &self.stream, self.conv, self.filter.as_ref());
        // A panic (a bug, never a read past a buffer: the code is safe) leaves the chunk to Python too, rather than
        // fail the task with pyo3's PanicException, which Python code cannot catch as an Exception.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cols.add_chunk(&data, skip, stop, stream, conv, filter)));
        match outcome {
            Ok(Ok(n)) => Ok(Some(n)),
            Ok(Err(why)) => {
                self.fallback = Some(why.0);
                Ok(None)
            }
            Err(_) => {
                self.cols.recover(rows, entries);
                self.fallback = Some("a panic in the core (a bug): the chunk was left to Python");
                Ok(None)
            }
        }
    }

    /// One message of a stream delivered over AMQP 1.0 (its sections, x-stream-offset as Python zeroes it) at `offset`:
    /// True when it became a row, False when the row filter left it out, None (nothing added) when it is Python's.
    fn add_message(&mut self, message: &Bound<'_, PyBytes>, offset: i64) -> Option<bool> {
        let (rows, entries) = (self.cols.rows, self.cols.keys.valid.len());
        let (cols, stream, conv, filter) = (&mut self.cols, &self.stream, self.conv, self.filter.as_ref());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cols.add_message(message.as_bytes(), offset, stream, conv, filter)));
        match outcome {
            Ok(Ok(kept)) => Some(kept),
            Ok(Err(why)) => {
                self.fallback = Some(why.0);
                None
            }
            Err(_) => {
                self.cols.recover(rows, entries);
                self.fallback = Some("a panic in the core (a bug): the message was left to Python");
                None
            }
        }
    }

    /// Rows added since the last `finish`.
    #[getter]
    fn rows(&self) -> usize {
        self.cols.rows
    }

    /// The columns as buffers, in STREAM_ARROW_SCHEMA's order (raw_header, always null here, left out; None for a column
    /// not asked for), and the builder emptied: (rows, body, queue, exchange, routing_key, offsets, the 9 string
    /// properties, priority, delivery_mode, timestamp, (headers validity, null count, offsets, keys, values)).
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let c = &self.cols;
        let m = c.mask;
        let none = || py.None().into_bound(py);
        let string = |at: usize, col: &StrCol| -> PyResult<Bound<'py, PyAny>> { Ok(if m.has(at) { str_col(py, col)?.into_any() } else { none() }) };
        let mut items: Vec<Bound<'py, PyAny>> = vec![
            c.rows.into_pyobject(py)?.into_any(),
            string(BODY, &c.body)?,
            string(QUEUE, &c.queue)?,
            string(EXCHANGE, &c.exchange)?,
            string(ROUTING_KEY, &c.routing_key)?,
            if m.has(OFFSET) { le_bytes(py, &c.offset, i64::to_le_bytes)?.into_any() } else { none() },
        ];
        for (i, p) in c.props.iter().enumerate() {
            items.push(string(PROPS + i, p)?);
        }
        items.push(if m.has(PRIORITY) { int_col(py, &c.priority, i32::to_le_bytes)?.into_any() } else { none() });
        items.push(if m.has(DELIVERY_MODE) { int_col(py, &c.delivery_mode, i32::to_le_bytes)?.into_any() } else { none() });
        items.push(if m.has(TIMESTAMP) { int_col(py, &c.timestamp, i64::to_le_bytes)?.into_any() } else { none() });
        items.push(if m.has(HEADERS) { headers_col(py, c)?.into_any() } else { none() });
        let out = PyTuple::new(py, items)?;
        self.cols.clear();
        Ok(out)
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Builder>()?;
    m.add_function(wrap_pyfunction!(basic_properties, m)?)?;
    m.add_function(wrap_pyfunction!(amqp10_records, m)?)?;
    m.add_function(wrap_pyfunction!(basic_headers, m)?)?;
    m.add("ABI", ABI)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
