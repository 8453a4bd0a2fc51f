//! The Go standard library formats etcdctl's output goes through:
//! `strconv.Quote` (`%q`), `strconv.Parse*` and their error texts,
//! `time.ParseDuration` / `Duration.String`, `encoding/json` string
//! escaping, `text/tabwriter` (usage pages), go-humanize's `Bytes`.

use retcd_gostd::strconv;

pub use retcd_gostd::strconv::{quote, quote_bytes};
pub use retcd_gostd::time::format_duration;

/// `strconv.ParseInt(s, base, bits)` (error: Go's text, the bytes `s`
/// carries quoted).
pub fn parse_int(s: &str, base: u32, bits: u32) -> Result<i64, String> {
    strconv::parse_int(s, base, bits).map_err(|e| e.to_string())
}

/// `strconv.ParseUint(s, base, bits)`.
pub fn parse_uint(s: &str, base: u32, bits: u32) -> Result<u64, String> {
    strconv::parse_uint(s, base, bits).map_err(|e| e.to_string())
}

/// Go `encoding/json`'s string encoding (HTML-safe, as `json.Marshal`).
pub fn json_string(out: &mut String, b: &[u8]) {
    out.push('"');
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
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
        }
        for _ in chunk.invalid() {
            out.push_str("\\ufffd");
        }
    }
    out.push('"');
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
    fn json_strings() {
        let mut s = String::new();
        json_string(&mut s, b"<a&b>\x01\xff");
        assert_eq!(s, "\"\\u003ca\\u0026b\\u003e\\u0001\\ufffd\"");
    }

    #[test]
    fn carried_bytes_in_number_errors() {
        assert_eq!(
            parse_int(&crate::raw::text(b"1\xff"), 10, 64),
            Err("strconv.ParseInt: parsing \"1\\xff\": invalid syntax".into())
        );
        assert_eq!(humanize_bytes(20480), "20 kB");
        assert_eq!(humanize_bytes(1_234_567), "1.2 MB");
    }

    #[test]
    fn tabwriter() {
        let t = "A:\n\tab\tx\n\tabcdefghij\ty\nB\n";
        assert_eq!(tabwrite(t), "A:\n\tab\t\tx\n\tabcdefghij\ty\nB\n");
    }
}
