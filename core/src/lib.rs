//! spark-amqp's compiled core: RabbitMQ stream chunks to the source's Arrow columns.
//!
//! `decode` is the decoder, safe code only and free of Python (what `cargo test` and cargo fuzz build); `python` is
//! the pyo3 module `spark_amqp_core._core` over it. Python keeps the API and the Arrow schema: it calls `Builder.add`
//! for each chunk and turns what `Builder.finish` returns into pyarrow arrays (spark_amqp/streams/held.py).
#![forbid(unsafe_code)]

pub mod decode;

#[cfg(feature = "python")]
mod python;

#[cfg(test)]
mod tests;
