//! Go's `strconv`: `Quote` (what `%q` prints), `QuoteRune`, `ParseBool`,
//! `ParseInt`, `ParseUint` and `Atoi`, with their `*NumError` texts.

use crate::raw;

/// `strconv.Quote` of the bytes `s` carries ([`raw::bytes`]; for text
/// without carriers, its UTF-8 bytes).
pub fn quote(s: &str) -> String {
    quote_bytes(&raw::bytes(s))
}

/// `strconv.Quote` of arbitrary bytes (Go strings are byte strings): a
/// byte that starts no valid UTF-8 sequence is `\xNN`.
pub fn quote_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 2);
    out.push('"');
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            escape_rune(&mut out, c, '"');
        }
        for x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02x}"));
        }
    }
    out.push('"');
    out
}

/// `strconv.QuoteRune` (`%q` of a rune): `'w'`.
pub fn quote_rune(c: char) -> String {
    let mut out = String::from("'");
    escape_rune(&mut out, c, '\'');
    out.push('\'');
    out
}

/// `unicode.IsPrint`, near enough for command lines: letters, marks,
/// numbers, punctuation, symbols and the ASCII space.
fn is_print(c: char) -> bool {
    if (c as u32) < 0x80 {
        return (0x20..0x7f).contains(&(c as u32));
    }
    let unprintable = c.is_control()
        || c == '\u{00ad}'
        || matches!(c as u32, 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0x2028 | 0x2029)
        || (c.is_whitespace() && c != '\u{3000}');
    !unprintable
}

/// `appendEscapedRune`.
fn escape_rune(out: &mut String, c: char, q: char) {
    if c == q || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if is_print(c) {
        out.push(c);
        return;
    }
    match c {
        '\u{07}' => out.push_str("\\a"),
        '\u{08}' => out.push_str("\\b"),
        '\u{0c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{0b}' => out.push_str("\\v"),
        c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push_str(&format!("\\U{:08x}", c as u32)),
    }
}

/// Why a number was refused (`strconv.ErrSyntax` or `strconv.ErrRange`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumErrorKind {
    Syntax,
    Range,
}

/// `*strconv.NumError`; `Display` prints Go's `Error()`:
/// `strconv.ParseInt: parsing "x": invalid syntax`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumError {
    /// The function: `ParseBool`, `ParseInt`, `ParseUint`, `Atoi`.
    pub func: &'static str,
    /// The text that was refused.
    pub num: String,
    pub kind: NumErrorKind,
}

impl NumError {
    fn new(func: &'static str, num: &str, kind: NumErrorKind) -> NumError {
        NumError {
            func,
            num: num.to_string(),
            kind,
        }
    }
}

impl std::fmt::Display for NumError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.kind {
            NumErrorKind::Syntax => "invalid syntax",
            NumErrorKind::Range => "value out of range",
        };
        write!(
            f,
            "strconv.{}: parsing {}: {why}",
            self.func,
            quote(&self.num)
        )
    }
}

impl std::error::Error for NumError {}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, NumError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(NumError::new("ParseBool", s, NumErrorKind::Syntax)),
    }
}

/// `strconv.ParseUint(s, base, bits)`: base 0 reads Go's prefixes (`0x`,
/// `0o`, `0b`, a leading `0` for octal) and allows `_` between digits;
/// `bits` 0 is 64.
pub fn parse_uint(s: &str, base: u32, bits: u32) -> Result<u64, NumError> {
    unsigned(s, base, bits).map_err(|kind| NumError::new("ParseUint", s, kind))
}

/// [`parse_uint`] without the error's function and text.
fn unsigned(s0: &str, base: u32, bits: u32) -> Result<u64, NumErrorKind> {
    use NumErrorKind::{Range, Syntax};
    if s0.is_empty() {
        return Err(Syntax);
    }
    let b = s0.as_bytes();
    let base0 = base == 0;
    let (base, digits) = match base {
        2..=36 => (base, b),
        0 if b[0] == b'0' && b.len() >= 3 => match b[1].to_ascii_lowercase() {
            b'b' => (2, &b[2..]),
            b'o' => (8, &b[2..]),
            b'x' => (16, &b[2..]),
            _ => (8, &b[1..]),
        },
        0 if b[0] == b'0' => (8, &b[1..]),
        0 => (10, b),
        // Go's base error; no caller passes one.
        _ => return Err(Syntax),
    };
    let bits = if bits == 0 || bits > 64 { 64 } else { bits };
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let cutoff = u64::MAX / u64::from(base) + 1;
    let mut underscores = false;
    let mut n: u64 = 0;
    for &c in digits {
        let d = match c {
            b'_' if base0 => {
                underscores = true;
                continue;
            }
            b'0'..=b'9' => c - b'0',
            _ if c.is_ascii_alphabetic() => c.to_ascii_lowercase() - b'a' + 10,
            _ => return Err(Syntax),
        };
        if u32::from(d) >= base {
            return Err(Syntax);
        }
        if n >= cutoff {
            return Err(Range);
        }
        n *= u64::from(base);
        match n.checked_add(u64::from(d)) {
            Some(n1) if n1 <= max => n = n1,
            _ => return Err(Range),
        }
    }
    if underscores && !underscore_ok(s0) {
        return Err(Syntax);
    }
    Ok(n)
}

/// `underscoreOK`: each `_` stands between digits (a base prefix counts as
/// a digit).
fn underscore_ok(s: &str) -> bool {
    let mut b = s.as_bytes();
    if let [b'-' | b'+', rest @ ..] = b {
        b = rest;
    }
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || hex && c.is_ascii_hexdigit() {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// `strconv.ParseInt(s, base, bits)`.
pub fn parse_int(s: &str, base: u32, bits: u32) -> Result<i64, NumError> {
    signed(s, base, bits).map_err(|kind| NumError::new("ParseInt", s, kind))
}

fn signed(s: &str, base: u32, bits: u32) -> Result<i64, NumErrorKind> {
    if s.is_empty() {
        return Err(NumErrorKind::Syntax);
    }
    let (neg, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let bits = if bits == 0 || bits > 64 { 64 } else { bits };
    let un = match unsigned(body, base, bits) {
        Ok(v) => v,
        Err(NumErrorKind::Range) => u64::MAX,
        Err(e) => return Err(e),
    };
    let cutoff = 1u64 << (bits - 1);
    if (!neg && un >= cutoff) || (neg && un > cutoff) {
        return Err(NumErrorKind::Range);
    }
    Ok(if neg {
        (un as i64).wrapping_neg()
    } else {
        un as i64
    })
}

/// `strconv.Atoi` (base 10, no prefixes or underscores).
pub fn atoi(s: &str) -> Result<i64, NumError> {
    signed(s, 10, 64).map_err(|kind| NumError::new("Atoi", s, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_quoting() {
        assert_eq!(quote("a\"b\n"), "\"a\\\"b\\n\"");
        assert_eq!(quote_bytes(b"\xff\x00"), "\"\\xff\\x00\"");
        assert_eq!(quote("é\u{7f}\u{85}"), "\"é\\x7f\\u0085\"");
        assert_eq!(quote(&raw::text(b"k\xfe")), "\"k\\xfe\"");
        assert_eq!(quote_rune('x'), "'x'");
        assert_eq!(quote_rune('\''), "'\\''");
        assert_eq!(quote_rune('\u{1}'), "'\\x01'");
    }

    #[test]
    fn test_numbers_as_go() {
        let e = |s: &str| parse_int(s, 0, 64).unwrap_err().to_string();
        assert_eq!(parse_int("0x10", 0, 64), Ok(16));
        assert_eq!(parse_int("-0b101", 0, 64), Ok(-5));
        assert_eq!(parse_int("017", 0, 64), Ok(15));
        assert_eq!(parse_int("0o17", 0, 64), Ok(15));
        assert_eq!(parse_int("1_000", 0, 64), Ok(1000));
        assert_eq!(parse_int("0x_1f", 0, 64), Ok(31));
        assert_eq!(parse_int("0", 0, 64), Ok(0));
        assert_eq!(parse_int("-9223372036854775808", 0, 64), Ok(i64::MIN));
        assert_eq!(e("x"), "strconv.ParseInt: parsing \"x\": invalid syntax");
        assert_eq!(e("0x"), "strconv.ParseInt: parsing \"0x\": invalid syntax");
        assert_eq!(
            e("1__0"),
            "strconv.ParseInt: parsing \"1__0\": invalid syntax"
        );
        assert_eq!(e("_1"), "strconv.ParseInt: parsing \"_1\": invalid syntax");
        assert_eq!(e("1_"), "strconv.ParseInt: parsing \"1_\": invalid syntax");
        assert_eq!(
            e("+-1"),
            "strconv.ParseInt: parsing \"+-1\": invalid syntax"
        );
        assert_eq!(
            e("9223372036854775808"),
            "strconv.ParseInt: parsing \"9223372036854775808\": value out of range"
        );
        // Go stops at the overflow, before the bad digit
        assert_eq!(
            e("99999999999999999999x"),
            "strconv.ParseInt: parsing \"99999999999999999999x\": value out of range"
        );
        assert_eq!(
            parse_int("1_0", 10, 64).unwrap_err().kind,
            NumErrorKind::Syntax
        );
        assert_eq!(
            parse_int("694d77aa9e38260f", 16, 64),
            Ok(0x694d77aa9e38260f)
        );
        assert!(parse_int("ffffffffffffffff", 16, 64).is_err());
        assert_eq!(parse_uint("4294967295", 0, 32), Ok(u32::MAX as u64));
        assert_eq!(
            parse_uint("4294967296", 0, 32).unwrap_err().kind,
            NumErrorKind::Range
        );
        assert_eq!(
            parse_uint("+5", 0, 64).unwrap_err().to_string(),
            "strconv.ParseUint: parsing \"+5\": invalid syntax"
        );
        assert_eq!(
            parse_int("2147483648", 0, 32).unwrap_err().kind,
            NumErrorKind::Range
        );
        assert_eq!(parse_int("-2147483648", 0, 32), Ok(-2147483648));
        assert_eq!(atoi("-12"), Ok(-12));
        assert_eq!(
            atoi("0x1").unwrap_err().to_string(),
            "strconv.Atoi: parsing \"0x1\": invalid syntax"
        );
        assert_eq!(
            parse_bool("yes").unwrap_err().to_string(),
            "strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
        assert_eq!(parse_bool("T"), Ok(true));
    }
}
