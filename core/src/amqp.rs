#![forbid(unsafe_code)]
//! AMQP 1.0's type system, read without copying (spark_amqp.amqp10.types' decode): values borrow the record's bytes,
//! and whatever the core does not mirror exactly is a `Fallback` (the chunk is then Python's).

#[derive(Debug)]
pub struct Fallback(pub &'static str);
pub type R<T> = Result<T, Fallback>;

pub fn fb<T>(why: &'static str) -> R<T> {
    Err(Fallback(why))
}

#[derive(Clone, Copy, Debug)]
pub enum V<'a> {
    Null,
    Bool(bool),
    U(u64),
    I(i64),
    F32(f32),
    F64(f64),
    Ts(i64),
    Uuid(&'a [u8]),
    Bin(&'a [u8]),
    Str(&'a str),
    Sym(&'a [u8]),
    Opaque(&'a [u8]),
    List(usize, usize), // (count, end): items follow
    Map(usize, usize),
    Compound, // an array, or a list/map that was skipped
}

pub struct Reader<'a> {
    pub d: &'a [u8],
    pub p: usize,
}

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.p.checked_add(n).ok_or(Fallback("overflow"))?;
        if end > self.d.len() {
            return fb("past the end");
        }
        let s = &self.d[self.p..end];
        self.p = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    fn be<const N: usize>(&mut self) -> R<[u8; N]> {
        Ok(self.take(N)?.try_into().unwrap())
    }
    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_be_bytes(self.be()?))
    }

    /// One value; a described value is unwrapped when `described` (its descriptor read and dropped).
    /// A list or map is returned as its head: the caller reads its items, then `close`s it.
    pub fn value(&mut self, described: bool) -> R<V<'a>> {
        let code = self.u8()?;
        Ok(match code {
            0x00 => {
                if !described {
                    return fb("a described value");
                }
                let d = self.value(false)?;
                self.skip(d)?;
                let v = self.value(false)?;
                return Ok(v);
            }
            0x40 => V::Null,
            0x41 => V::Bool(true),
            0x42 => V::Bool(false),
            0x43 | 0x44 => V::U(0),
            0x45 => V::List(0, self.p),
            0x50 | 0x52 | 0x53 => V::U(self.u8()? as u64),
            0x51 | 0x54 | 0x55 => V::I(self.u8()? as i8 as i64),
            0x56 => V::Bool(self.u8()? != 0),
            0x60 => V::U(u16::from_be_bytes(self.be()?) as u64),
            0x61 => V::I(i16::from_be_bytes(self.be()?) as i64),
            0x70 => V::U(self.u32()? as u64),
            0x71 => V::I(i32::from_be_bytes(self.be()?) as i64),
            0x72 => V::F32(f32::from_be_bytes(self.be()?)),
            0x73 | 0x74 => V::Opaque(self.take(4)?),
            0x80 => V::U(u64::from_be_bytes(self.be()?)),
            0x81 => V::I(i64::from_be_bytes(self.be()?)),
            0x82 => V::F64(f64::from_be_bytes(self.be()?)),
            0x83 => V::Ts(i64::from_be_bytes(self.be()?)),
            0x84 => V::Opaque(self.take(8)?),
            0x94 => V::Opaque(self.take(16)?),
            0x98 => V::Uuid(self.take(16)?),
            0xA0 | 0xA1 | 0xA3 | 0xB0 | 0xB1 | 0xB3 => {
                let n = if code < 0xB0 { self.u8()? as usize } else { self.u32()? as usize };
                let raw = self.take(n)?;
                match code & 0x0F {
                    0x0 => V::Bin(raw),
                    0x1 => V::Str(std::str::from_utf8(raw).map_err(|_| Fallback("a string not UTF-8"))?),
                    _ => V::Sym(raw),
                }
            }
            0xC0 | 0xC1 | 0xD0 | 0xD1 => {
                let (size, count, head) = if code < 0xD0 {
                    (self.u8()? as usize, self.u8()? as usize, 1)
                } else {
                    (self.u32()? as usize, self.u32()? as usize, 4)
                };
                // the size counts the count field and the items
                let end = (self.p - head).checked_add(size).ok_or(Fallback("overflow"))?;
                if end > self.d.len() || end < self.p {
                    return fb("a compound past the end");
                }
                if code & 1 == 1 {
                    if count % 2 == 1 {
                        return fb("a map of an odd count");
                    }
                    V::Map(count / 2, end)
                } else {
                    V::List(count, end)
                }
            }
            _ => return fb("a type left to Python (an array, an unknown code)"),
        })
    }

    /// Past a value just read (a list's or map's items: each read, so that Python would decode them too).
    pub fn skip(&mut self, v: V<'a>) -> R<()> {
        match v {
            V::List(n, end) => {
                for _ in 0..n {
                    let x = self.value(true)?;
                    self.skip(x)?;
                }
                self.close(end)
            }
            V::Map(n, end) => {
                for _ in 0..2 * n {
                    let x = self.value(true)?;
                    self.skip(x)?;
                }
                self.close(end)
            }
            _ => Ok(()),
        }
    }

    /// The end of a list or map: where its size said (Python raises DecodeError otherwise).
    pub fn close(&mut self, end: usize) -> R<()> {
        if self.p != end {
            return fb("a compound's items do not fill its size");
        }
        Ok(())
    }
}

