//! spark-amqp's compiled core: RabbitMQ stream chunks, and AMQP 0-9-1 content headers, to the source's Arrow columns.
//!
//! `amqp` (AMQP 1.0 values), `basic` (AMQP 0-9-1 content headers to the property columns), `columns` (what is built, and the mask of the columns a query asks for), `decode` (chunks
//! to columns) and `render` (values as text) are the decoder, free of Python (what `cargo test` and cargo fuzz build);
//! `python` is the pyo3 module `spark_amqp_core._core` over it. All of it is safe code. Python keeps the API and the
//! Arrow schema: it calls `Builder.add` for each chunk and turns what `Builder.finish` returns into pyarrow arrays
//! (spark_amqp/streams/held.py).
#![forbid(unsafe_code)]

pub mod amqp;
pub mod basic;
pub mod columns;
pub mod content;
pub mod decode;
pub mod records;
pub mod render;

#[cfg(feature = "python")]
mod python;

#[cfg(test)]
mod tests;
