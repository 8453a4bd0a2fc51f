//! The Go standard library formats etcdctl's output goes through:
//! `strconv.Quote` (`%q`), `strconv.Parse*` and their error texts,
//! `time.ParseDuration` / `Duration.String`, `encoding/json` string
//! escaping, `text/tabwriter` (usage pages), go-humanize's `Bytes` and
//! `encoding/csv` (pflag's string slices).

/// `strconv.Quote` (of the bytes `s` carries, see `raw`).
pub fn quote(s: &str) -> String {
    quote_bytes(&crate::raw::bytes(s))
}

/// `strconv.Quote` of arbitrary bytes (Go strings are byte strings).
pub fn quote_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 2);
    out.push('"');
    let mut i = 0;
    while i < b.len() {
        match next_rune(&b[i..]) {
            Some((c, n)) => {
                escape_rune(&mut out, c, '"');
                i += n;
            }
            None => {
                out.push_str(&format!("\\x{:02x}", b[i]));
                i += 1;
            }
        }
    }
    out.push('"');
    out
}

/// `%q` of a rune: `'w'`.
pub fn quote_rune(c: char) -> String {
    let mut out = String::from("'");
    escape_rune(&mut out, c, '\'');
    out.push('\'');
    out
}

fn next_rune(b: &[u8]) -> Option<(char, usize)> {
    let n = match b[0] {
        0x00..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    if b.len() < n {
        return None;
    }
    std::str::from_utf8(&b[..n])
        .ok()
        .and_then(|s| s.chars().next())
        .map(|c| (c, n))
}

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

/// Go `encoding/json`'s string encoding (HTML-safe, as `json.Marshal`).
pub fn json_string(out: &mut String, b: &[u8]) {
    out.push('"');
    let mut i = 0;
    while i < b.len() {
        match next_rune(&b[i..]) {
            Some((c, n)) => {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                        out.push_str(&format!("\\u{:04x}", c as u32))
                    }
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
                i += n;
            }
            None => {
                out.push_str("\\ufffd");
                i += 1;
            }
        }
    }
    out.push('"');
}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing {}: invalid syntax",
            quote(s)
        )),
    }
}

fn parse_digits(s: &str, base0: u32, fname: &str) -> Result<(u128, bool), String> {
    let syntax = || format!("strconv.{fname}: parsing {}: invalid syntax", quote(s));
    let mut t = s;
    let mut base = base0;
    let mut underscores = false;
    if base0 == 0 {
        base = 10;
        if let Some(r) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            base = 16;
            t = r;
            underscores = true;
        } else if let Some(r) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
            base = 2;
            t = r;
            underscores = true;
        } else if let Some(r) = t.strip_prefix("0o").or_else(|| t.strip_prefix("0O")) {
            base = 8;
            t = r;
            underscores = true;
        } else if t.len() > 1 && t.starts_with('0') {
            base = 8;
            t = &t[1..];
            underscores = true;
        } else {
            underscores = true;
        }
    }
    if t.is_empty() {
        return Err(syntax());
    }
    let mut v: u128 = 0;
    let mut overflow = false;
    for ch in t.chars() {
        if ch == '_' && underscores {
            continue;
        }
        let d = ch.to_digit(base).ok_or_else(syntax)?;
        v = v * base as u128 + d as u128;
        if v > u64::MAX as u128 {
            overflow = true;
            v = u64::MAX as u128 + 1;
        }
    }
    Ok((v, overflow))
}

/// `strconv.ParseInt(s, base, bits)` with Go's error texts.
pub fn parse_int(s: &str, base: u32, bits: u32) -> Result<i64, String> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (v, _) = parse_digits(body, base, "ParseInt")
        .map_err(|_| format!("strconv.ParseInt: parsing {}: invalid syntax", quote(s)))?;
    let limit: u128 = 1u128 << (bits - 1);
    let range = || format!("strconv.ParseInt: parsing {}: value out of range", quote(s));
    if neg {
        if v > limit {
            return Err(range());
        }
        Ok((-(v as i128)) as i64)
    } else {
        if v >= limit {
            return Err(range());
        }
        Ok(v as i64)
    }
}

/// `strconv.ParseUint(s, base, 64)`.
pub fn parse_uint(s: &str, base: u32, _bits: u32) -> Result<u64, String> {
    let (v, overflow) = parse_digits(s, base, "ParseUint")?;
    if overflow {
        return Err(format!(
            "strconv.ParseUint: parsing {}: value out of range",
            quote(s)
        ));
    }
    Ok(v as u64)
}

/// `time.ParseDuration`, in nanoseconds.
pub fn parse_duration(s: &str) -> Result<i64, String> {
    let err = || format!("time: invalid duration {}", quote(s));
    let mut t = s;
    let mut neg = false;
    if let Some(r) = t.strip_prefix('-') {
        neg = true;
        t = r;
    } else if let Some(r) = t.strip_prefix('+') {
        t = r;
    }
    if t == "0" {
        return Ok(0);
    }
    if t.is_empty() {
        return Err(err());
    }
    let mut total: f64 = 0.0;
    while !t.is_empty() {
        let num_end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let num = &t[..num_end];
        if num.is_empty() || num == "." {
            return Err(err());
        }
        let v: f64 = num.parse().map_err(|_| err())?;
        t = &t[num_end..];
        let unit_end = t
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(t.len());
        let unit = &t[..unit_end];
        t = &t[unit_end..];
        let mult: f64 = match unit {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration {}", quote(s))),
            u => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    quote(u),
                    quote(s)
                ))
            }
        };
        total += v * mult;
    }
    if total > i64::MAX as f64 {
        return Err(err());
    }
    Ok(if neg { -(total as i64) } else { total as i64 })
}

/// Go's `time.Duration.String()`.
pub fn format_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let neg = ns < 0;
    let u = ns.unsigned_abs();
    let mut s = if u < 1_000_000_000 {
        let (unit, div) = if u < 1_000 {
            ("ns", 1u64)
        } else if u < 1_000_000 {
            ("\u{b5}s", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        format!("{}{unit}", frac(u, div))
    } else {
        let h = u / 3_600_000_000_000;
        let rem = u % 3_600_000_000_000;
        let m = rem / 60_000_000_000;
        let sec = rem % 60_000_000_000;
        let secs = format!("{}s", frac(sec, 1_000_000_000));
        if h > 0 {
            format!("{h}h{m}m{secs}")
        } else if m > 0 {
            format!("{m}m{secs}")
        } else {
            secs
        }
    };
    if neg {
        s.insert(0, '-');
    }
    s
}

fn frac(v: u64, div: u64) -> String {
    let int = v / div;
    let rem = v % div;
    if rem == 0 {
        return int.to_string();
    }
    let width = div.trailing_zeros_decimal();
    let f = format!("{rem:0width$}");
    format!("{int}.{}", f.trim_end_matches('0'))
}

trait DecimalZeros {
    fn trailing_zeros_decimal(self) -> usize;
}

impl DecimalZeros for u64 {
    fn trailing_zeros_decimal(self) -> usize {
        let mut n = 0;
        let mut v = self;
        while v >= 10 {
            v /= 10;
            n += 1;
        }
        n
    }
}

/// go-humanize's `Bytes` (SI units).
pub fn humanize_bytes(s: u64) -> String {
    const SIZES: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if s < 10 {
        return format!("{s} B");
    }
    let e = ((s as f64).ln() / 1000f64.ln()).floor();
    let suffix = SIZES[e as usize];
    let val = ((s as f64) / 1000f64.powf(e) * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {suffix}")
    } else {
        format!("{val:.0} {suffix}")
    }
}

/// One record of `encoding/csv` (pflag's `stringSlice` value).
pub fn read_csv_record(s: &str) -> Result<Vec<String>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    if !s.contains('"') {
        return Ok(s.split(',').map(|x| x.to_string()).collect());
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    let mut in_quotes = false;
    let mut field_start = true;
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    in_quotes = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == '"' && field_start {
            in_quotes = true;
            field_start = false;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
            field_start = true;
        } else {
            cur.push(c);
            field_start = false;
        }
    }
    if in_quotes {
        return Err(
            "parse error on line 1, column 0: extraneous or missing \" in quoted-field".into(),
        );
    }
    out.push(cur);
    Ok(out)
}

/// `text/tabwriter` as etcd's usage pages use it: minwidth 0, tabwidth
/// 8, padding 1, padchar '\t', no flags.
pub fn tabwrite(text: &str) -> String {
    // Split into lines of cells; the last cell of each line is not
    // tab-terminated.
    let lines: Vec<Vec<&str>> = text.split('\n').map(|l| l.split('\t').collect()).collect();
    let mut out = String::new();
    let mut widths: Vec<usize> = Vec::new();
    format_block(&lines, 0, lines.len(), &mut widths, &mut out);
    out
}

fn cell_width(s: &str) -> usize {
    s.chars().count()
}

fn format_block(
    lines: &[Vec<&str>],
    line0: usize,
    line1: usize,
    widths: &mut Vec<usize>,
    out: &mut String,
) {
    let column = widths.len();
    let mut l0 = line0;
    let mut this = line0;
    while this < line1 {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        write_lines(lines, l0, this, widths, out);
        l0 = this;
        let mut width = 0;
        while this < line1 {
            let line = &lines[this];
            if column + 1 >= line.len() {
                break;
            }
            let w = cell_width(line[column]) + 1;
            if w > width {
                width = w;
            }
            this += 1;
        }
        widths.push(width);
        format_block(lines, l0, this, widths, out);
        widths.pop();
        l0 = this;
    }
    write_lines(lines, l0, line1, widths, out);
}

fn write_lines(
    lines: &[Vec<&str>],
    line0: usize,
    line1: usize,
    widths: &[usize],
    out: &mut String,
) {
    for (i, line) in lines.iter().enumerate().take(line1).skip(line0) {
        for (j, c) in line.iter().enumerate() {
            out.push_str(c);
            if j < widths.len() && j + 1 < line.len() {
                let cellw = widths[j].div_ceil(8) * 8;
                let n = cellw - cell_width(c);
                for _ in 0..n.div_ceil(8) {
                    out.push('\t');
                }
            }
        }
        if i + 1 < lines.len() {
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("a\"b\n"), "\"a\\\"b\\n\"");
        assert_eq!(quote_bytes(b"\xff\x00"), "\"\\xff\\x00\"");
        assert_eq!(quote("é"), "\"é\"");
        let mut s = String::new();
        json_string(&mut s, b"<a&b>\x01\xff");
        assert_eq!(s, "\"\\u003ca\\u0026b\\u003e\\u0001\\ufffd\"");
    }

    #[test]
    fn numbers_and_durations() {
        assert_eq!(parse_int("0x10", 0, 64), Ok(16));
        assert_eq!(
            parse_int("x", 10, 64),
            Err("strconv.ParseInt: parsing \"x\": invalid syntax".into())
        );
        assert_eq!(
            parse_int("694d77aa9e38260f", 16, 64),
            Ok(0x694d77aa9e38260f)
        );
        assert!(parse_int("ffffffffffffffff", 16, 64).is_err());
        assert_eq!(parse_duration("1m30s"), Ok(90_000_000_000));
        assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(
            parse_duration("x"),
            Err("time: invalid duration \"x\"".into())
        );
        assert_eq!(format_duration(1_500_000_000), "1.5s");
        assert_eq!(format_duration(90_000_000_000), "1m30s");
        assert_eq!(format_duration(1_234_567), "1.234567ms");
        assert_eq!(humanize_bytes(20480), "20 kB");
        assert_eq!(humanize_bytes(1_234_567), "1.2 MB");
    }

    #[test]
    fn tabwriter() {
        let t = "A:\n\tab\tx\n\tabcdefghij\ty\nB\n";
        assert_eq!(tabwrite(t), "A:\n\tab\t\tx\n\tabcdefghij\ty\nB\n");
    }
}
