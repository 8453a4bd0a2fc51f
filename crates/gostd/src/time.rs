//! Go's `time.ParseDuration` and `time.Duration.String`.

/// `time.ParseDuration`, in nanoseconds: `[-+]?([0-9]*(\.[0-9]*)?unit)+`
/// or `0`; units ns, us, µs, μs, ms, s, m, h. Go's error texts:
/// `time: invalid duration "x"`, `time: missing unit in duration "1"`,
/// `time: unknown unit "d" in duration "1d"`.
pub fn parse_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", quote(orig));
    let mut s = orig;
    let mut neg = false;
    if let Some(r) = s.strip_prefix('-') {
        neg = true;
        s = r;
    } else if let Some(r) = s.strip_prefix('+') {
        s = r;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: i64 = 0;
    while !s.is_empty() {
        if !(s.starts_with('.') || s.as_bytes()[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // [0-9]*
        let len = s.len();
        let (mut v, rest) = leading_int(s).ok_or_else(invalid)?;
        s = rest;
        let pre = len != s.len();
        // (\.[0-9]*)?
        let (mut f, mut scale, mut post) = (0i64, 1f64, false);
        if let Some(r) = s.strip_prefix('.') {
            let len = r.len();
            (f, scale, s) = leading_fraction(r);
            post = len != s.len();
        }
        if !pre && !post {
            return Err(invalid());
        }
        let end = s
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if end == 0 {
            return Err(format!("time: missing unit in duration {}", quote(orig)));
        }
        let (u, rest) = s.split_at(end);
        s = rest;
        let unit: i64 = match u {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    quote(u),
                    quote(orig)
                ))
            }
        };
        if v > i64::MAX / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            v = v.wrapping_add((f as f64 * (unit as f64 / scale)) as i64);
            if v < 0 {
                return Err(invalid());
            }
        }
        d = d.wrapping_add(v);
        if d < 0 {
            return Err(invalid());
        }
    }
    Ok(if neg { -d } else { d })
}

/// `leadingInt`: the leading `[0-9]*` of `s` (None on overflow).
fn leading_int(s: &str) -> Option<(i64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut x: i64 = 0;
    for c in s[..end].bytes() {
        x = x.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
    }
    Some((x, &s[end..]))
}

/// `leadingFraction`: the leading `[0-9]*` of `s` as a fraction; digits
/// past what an i64 holds are read and dropped.
fn leading_fraction(s: &str) -> (i64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (mut x, mut scale, mut overflow) = (0i64, 1f64, false);
    for c in s[..end].bytes() {
        if overflow {
            continue;
        }
        match x
            .checked_mul(10)
            .and_then(|y| y.checked_add(i64::from(c - b'0')))
        {
            Some(y) => {
                x = y;
                scale *= 10.0;
            }
            None => overflow = true,
        }
    }
    (x, scale, &s[end..])
}

/// The `time` package's own `quote` of the bytes `s` carries
/// ([`crate::raw`]): printable ASCII as it is (`"` and `\` escaped),
/// every other byte as `\xNN`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &b in crate::raw::bytes(s).iter() {
        if (b' '..0x80).contains(&b) {
            if b == b'"' || b == b'\\' {
                out.push('\\');
            }
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    out
}

/// `time.Duration.String`: `1h30m0s`, `1m0s`, `1.5s`, `100ms`,
/// `190.678µs`, `12ns`, `0s`.
pub fn format_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let u = ns.unsigned_abs();
    let mut s = if u < 1_000_000_000 {
        let (unit, div) = match u {
            0..=999 => ("ns", 1u64),
            1_000..=999_999 => ("\u{b5}s", 1_000),
            _ => ("ms", 1_000_000),
        };
        format!("{}{unit}", fraction(u, div))
    } else {
        let h = u / 3_600_000_000_000;
        let m = u % 3_600_000_000_000 / 60_000_000_000;
        let secs = format!("{}s", fraction(u % 60_000_000_000, 1_000_000_000));
        match (h, m) {
            (0, 0) => secs,
            (0, m) => format!("{m}m{secs}"),
            (h, m) => format!("{h}h{m}m{secs}"),
        }
    };
    if ns < 0 {
        s.insert(0, '-');
    }
    s
}

/// `v / div` with the fraction's trailing zeros dropped (`div` a power of
/// ten).
fn fraction(v: u64, div: u64) -> String {
    let (int, rem) = (v / div, v % div);
    if rem == 0 {
        return int.to_string();
    }
    let width = div.ilog10() as usize;
    let f = format!("{rem:0width$}");
    format!("{int}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_duration_as_go() {
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse_duration("1m30s"), Ok(90_000_000_000));
        assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration(".5s"), Ok(500_000_000));
        assert_eq!(parse_duration("5.s"), Ok(5_000_000_000));
        assert_eq!(parse_duration("90us"), Ok(90_000));
        assert_eq!(parse_duration("90µs"), Ok(90_000));
        assert_eq!(parse_duration("-5s"), Ok(-5_000_000_000));
        assert_eq!(parse_duration("+0"), Ok(0));
        assert_eq!(
            parse_duration("9223372036854775807ns"),
            Ok(i64::MAX),
            "exact, not through a float"
        );
        let e = |s: &str| parse_duration(s).unwrap_err();
        assert_eq!(e(""), "time: invalid duration \"\"");
        assert_eq!(e("x"), "time: invalid duration \"x\"");
        assert_eq!(e(".s"), "time: invalid duration \".s\"");
        assert_eq!(e("1.2.3s"), "time: missing unit in duration \"1.2.3s\"");
        assert_eq!(e("5"), "time: missing unit in duration \"5\"");
        assert_eq!(e("1d"), "time: unknown unit \"d\" in duration \"1d\"");
        assert_eq!(
            e("5é"),
            "time: unknown unit \"\\xc3\\xa9\" in duration \"5\\xc3\\xa9\""
        );
        assert_eq!(
            e("9223372036854775808ns"),
            "time: invalid duration \"9223372036854775808ns\""
        );
        assert_eq!(e("3000000h"), "time: invalid duration \"3000000h\"");
    }

    #[test]
    fn test_format_duration_as_go() {
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(12), "12ns");
        assert_eq!(format_duration(190_678), "190.678\u{b5}s");
        assert_eq!(format_duration(1_234_567), "1.234567ms");
        assert_eq!(format_duration(1_500_000_000), "1.5s");
        assert_eq!(format_duration(60_000_000_000), "1m0s");
        assert_eq!(format_duration(90_000_000_000), "1m30s");
        assert_eq!(format_duration(5_400_000_000_000), "1h30m0s");
        assert_eq!(format_duration(-1_500_000_000), "-1.5s");
    }
}
