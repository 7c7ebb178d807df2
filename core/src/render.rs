#![forbid(unsafe_code)]
//! Values as text, as the Python path writes them: rows.py's `_text`, arrow.py's `render_header`, Python's float
//! repr and datetime's isoformat, base64; and Arrow's validity bitmaps.
use crate::amqp::{fb, R, V};
use std::io::Write;

/// rows.py's `_text`: None; str as it is; bytes as UTF-8 with replacement; anything else str().
pub fn text(v: V, out: &mut Vec<u8>) -> R<bool> {
    match v {
        V::Null => return Ok(false),
        V::Str(s) => out.extend_from_slice(s.as_bytes()),
        V::Sym(s) if s.is_ascii() => out.extend_from_slice(s),
        V::Bin(b) => out.extend_from_slice(String::from_utf8_lossy(b).as_bytes()),
        V::Bool(b) => out.extend_from_slice(if b { b"True" } else { b"False" }),
        V::U(x) => write!(out, "{x}").unwrap(),
        V::I(x) | V::Ts(x) => write!(out, "{x}").unwrap(),
        V::F32(x) => py_float_repr(x as f64, out),
        V::F64(x) => py_float_repr(x, out),
        V::Uuid(u) => uuid(u, out),
        _ => return fb("a property value left to Python"),
    }
    Ok(true)
}

/// arrow.py's `render_header` of rows.py's `_header_value`.
pub fn render_header(v: V, out: &mut Vec<u8>) -> R<bool> {
    match v {
        V::Null => return Ok(false),
        V::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        V::Ts(ms) => iso_utc(ms.div_euclid(1000), out)?,
        V::Bin(b) | V::Opaque(b) => match std::str::from_utf8(b) {
            Ok(s) => out.extend_from_slice(s.as_bytes()),
            Err(_) => {
                out.extend_from_slice(b"base64:");
                base64(b, out);
            }
        },
        V::List(..) | V::Map(..) | V::Compound => return fb("a nested value (JSON)"),
        _ => return text(v, out),
    }
    Ok(true)
}

/// Python's repr() of a float.
pub fn py_float_repr(x: f64, out: &mut Vec<u8>) {
    if x.is_nan() {
        return out.extend_from_slice(b"nan");
    }
    if x.is_infinite() {
        return out.extend_from_slice(if x > 0.0 { b"inf" } else { b"-inf" });
    }
    if x == 0.0 {
        return out.extend_from_slice(if x.is_sign_negative() { b"-0.0" } else { b"0.0" });
    }
    // The shortest digits that round-trip, as Python's repr has them; where two such strings are as near the value
    // (996.04693603515625: ...562 or ...563), Rust's shortest form may take the upper one and Python takes the even one,
    // so the digits are those of the value correctly rounded (ties to even) to that many digits.
    let shortest = format!("{:e}", x);
    let n = shortest.split('e').next().unwrap().bytes().filter(u8::is_ascii_digit).count();
    let s = format!("{:.*e}", n - 1, x);
    let (mant, exp) = s.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let mut digits: Vec<u8> = mant.bytes().filter(|&c| c != b'.').collect();
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    let decpt = exp + 1;
    if neg {
        out.push(b'-');
    }
    if decpt <= -4 || decpt > 16 {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs()).unwrap();
    } else if decpt <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-decpt) as usize));
        out.extend_from_slice(&digits);
    } else if decpt as usize >= digits.len() {
        out.extend_from_slice(&digits);
        out.extend(std::iter::repeat_n(b'0', decpt as usize - digits.len()));
        out.extend_from_slice(b".0");
    } else {
        out.extend_from_slice(&digits[..decpt as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[decpt as usize..]);
    }
}

/// datetime.fromtimestamp(seconds, UTC).isoformat() (years 1 to 9999, as Python's datetime).
pub(crate) fn iso_utc(secs: i64, out: &mut Vec<u8>) -> R<()> {
    if !(-62_135_596_800..=253_402_300_799).contains(&secs) {
        return fb("a timestamp datetime cannot hold");
    }
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // days to civil (H. Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    write!(out, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}+00:00", y, m, d, rem / 3600, rem % 3600 / 60, rem % 60).unwrap();
    Ok(())
}

fn uuid(u: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

pub(crate) fn base64(b: &[u8], out: &mut Vec<u8>) {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        out.push(A[(n >> 18) as usize & 63]);
        out.push(A[(n >> 12) as usize & 63]);
        out.push(if c.len() > 1 { A[(n >> 6) as usize & 63] } else { b'=' });
        out.push(if c.len() > 2 { A[n as usize & 63] } else { b'=' });
    }
}

/// One validity byte a row to an Arrow bitmap (None when no row is null).
pub fn bitmap(valid: &[u8], nulls: usize) -> Option<Vec<u8>> {
    if nulls == 0 {
        return None;
    }
    let mut out = vec![0u8; valid.len().div_ceil(8)];
    for (i, &v) in valid.iter().enumerate() {
        out[i >> 3] |= v << (i & 7);
    }
    Some(out)
}
