//! Go strings are bytes: etcdctl passes any bytes through, in arguments,
//! stdin and keys. retcdctl's parsing and printing work on `String`s, so
//! text here *carries* such bytes: each byte that is not
//! part of valid UTF-8 (always 0x80..=0xFF) is the private-use character
//! U+10FF00 + byte. [`text`] makes such text of bytes, [`bytes`] gives the
//! bytes back; the edges use them: the command line and stdin come in
//! through [`text`], keys, values and names go to the server and all
//! output goes out through [`bytes`].

use std::borrow::Cow;

/// The first carrier character (byte 0x80); bytes 0x80..=0xFF map to
/// U+10FF80..=U+10FFFF.
const BASE: u32 = 0x10_FF00;

/// `b` as text, losslessly: valid UTF-8 as it is, every other byte as its
/// carrier character (and the bytes of a carrier character that was in
/// `b` itself too, so that [`bytes`] gives them back).
pub fn text(b: &[u8]) -> String {
    let carry = |out: &mut String, x: u8| {
        out.push(char::from_u32(BASE + u32::from(x)).expect("a valid char"));
    };
    match std::str::from_utf8(b) {
        Ok(s) if !has_carriers(s) => s.to_string(),
        _ => {
            let mut out = String::with_capacity(b.len() + 8);
            for chunk in b.utf8_chunks() {
                for c in chunk.valid().chars() {
                    if is_carrier(c) {
                        c.encode_utf8(&mut [0; 4])
                            .bytes()
                            .for_each(|x| carry(&mut out, x));
                    } else {
                        out.push(c);
                    }
                }
                chunk.invalid().iter().for_each(|&x| carry(&mut out, x));
            }
            out
        }
    }
}

fn is_carrier(c: char) -> bool {
    u32::from(c) >= BASE + 0x80
}

/// Whether `s` may hold a carrier: they are 4-byte characters starting
/// 0xF4 0x8F.
fn has_carriers(s: &str) -> bool {
    s.as_bytes().windows(2).any(|w| w == [0xF4, 0x8F])
}

/// The bytes `s` carries (see [`text`]).
pub fn bytes(s: &str) -> Cow<'_, [u8]> {
    if !has_carriers(s) {
        return Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    let mut buf = [0u8; 4];
    for c in s.chars() {
        if is_carrier(c) {
            out.push((u32::from(c) - BASE) as u8);
        } else {
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    Cow::Owned(out)
}

/// [`bytes`] as a `Vec`.
pub fn vec(s: &str) -> Vec<u8> {
    bytes(s).into_owned()
}

/// `s` written to stderr as the bytes it carries.
pub fn eprint(s: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().lock().write_all(&bytes(s));
}

/// `s` written to stdout as the bytes it carries.
pub fn print(s: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(&bytes(s));
}

/// The text of `p`'s bytes (see [`text`]): what a Go program prints of
/// the path it was given.
pub fn path_text(p: &std::path::Path) -> String {
    text(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
}

/// The path `s` carries (its bytes, as Go opens a string path).
pub fn path(s: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt as _;
    std::ffi::OsString::from_vec(vec(s)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_bytes_round_trip_through_text() {
        for b in [
            &b"plain"[..],
            b"p/\xff",
            b"\xfe\x00",
            b"caf\xc3\xa9 \xc3",
            b"\xf4\x8f\xbe\xbf",
            b"",
        ] {
            assert_eq!(&*bytes(&text(b)), b, "{b:?}");
        }
        assert_eq!(text(b"ok"), "ok");
        assert_eq!(&*bytes(&path_text(&path(&text(b"d/\xfd")))), b"d/\xfd");
        assert!(matches!(bytes("ok é"), Cow::Borrowed(_)));
    }
}
