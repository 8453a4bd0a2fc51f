//! `--config-file`: etcd's YAML configuration (embed.ConfigFromFile).
//!
//! Keys are the flag names (matched case-insensitively; of two keys that
//! differ only in case the one sorting last wins, as etcd's YAML→JSON step
//! sorts them), unknown keys are ignored, `null` keeps the default, TLS
//! settings sit under `client-transport-security` / `peer-transport-security`,
//! durations are integer nanoseconds, URL lists one comma-separated string,
//! `log-outputs` and `cipher-suites` YAML lists. Types are strict, with
//! Go's `encoding/json` error texts.

use super::flags::{check, lookup, Kind, Source, Values};

/// Flags with no YAML key in etcd (they are only flags).
const NOT_IN_FILE: &[&str] = &[
    "config-file",
    "version",
    "client-crl-file",
    "peer-crl-file",
    "raft-read-timeout",
    "raft-write-timeout",
    "socket-reuse-port",
    "socket-reuse-address",
    "discovery-endpoints",
    "discovery-token",
    "discovery-dial-timeout",
    "discovery-request-timeout",
    "discovery-keepalive-time",
    "discovery-keepalive-timeout",
    "discovery-insecure-transport",
    "discovery-insecure-skip-tls-verify",
    "discovery-cert",
    "discovery-key",
    "discovery-cacert",
    "discovery-user",
    "discovery-password",
    "experimental-snapshot-catchup-entries",
    // under *-transport-security instead
    "cert-file",
    "key-file",
    "client-cert-auth",
    "trusted-ca-file",
    "auto-tls",
    "client-cert-file",
    "client-key-file",
    "client-cert-allowed-hostname",
    "peer-cert-file",
    "peer-key-file",
    "peer-client-cert-auth",
    "peer-trusted-ca-file",
    "peer-auto-tls",
    "peer-client-cert-file",
    "peer-client-key-file",
    "peer-cert-allowed-cn",
    "peer-cert-allowed-hostname",
];

/// `client-transport-security` sub-keys → flags.
const CLIENT_TLS: &[(&str, &str)] = &[
    ("cert-file", "cert-file"),
    ("key-file", "key-file"),
    ("client-cert-file", "client-cert-file"),
    ("client-key-file", "client-key-file"),
    ("client-cert-auth", "client-cert-auth"),
    ("trusted-ca-file", "trusted-ca-file"),
    ("auto-tls", "auto-tls"),
    ("allowed-hostname", "client-cert-allowed-hostname"),
];

/// `peer-transport-security` sub-keys → flags.
const PEER_TLS: &[(&str, &str)] = &[
    ("cert-file", "peer-cert-file"),
    ("key-file", "peer-key-file"),
    ("client-cert-file", "peer-client-cert-file"),
    ("client-key-file", "peer-client-key-file"),
    ("client-cert-auth", "peer-client-cert-auth"),
    ("trusted-ca-file", "peer-trusted-ca-file"),
    ("auto-tls", "peer-auto-tls"),
    ("allowed-cn", "peer-cert-allowed-cn"),
    ("allowed-hostname", "peer-cert-allowed-hostname"),
    (
        "skip-client-san-verification",
        "experimental-peer-skip-client-san-verification",
    ),
];

/// A config file problem: `Plain` errors are printed as they are (etcd
/// prints URL errors without its logger), the others as "failed to verify
/// flags".
#[derive(Debug, PartialEq, Eq)]
pub enum FileError {
    Verify(String),
    Plain(String),
}

fn top_key(key: &str) -> Option<&'static str> {
    if key == "experimental-snapshot-catch-up-entries" || key == "snapshot-catchup-entries" {
        return Some(if key == "snapshot-catchup-entries" {
            "snapshot-catchup-entries"
        } else {
            "experimental-snapshot-catchup-entries"
        });
    }
    let fl = lookup(key)?;
    if NOT_IN_FILE.contains(&fl.name) || fl.kind == Kind::Ignored {
        return None;
    }
    // etcdmain reads these in a second pass over the file (configProxy).
    if matches!(fl.name, "proxy" | "discovery-fallback") || fl.name.starts_with("proxy-") {
        return None;
    }
    Some(fl.name)
}

/// A YAML value as go-yaml v2 resolves it (YAML 1.1: `yes`/`on`/`off`
/// are booleans, `0x10`, `010` and `0b11` integers, `1e3` a float), the
/// mappings' keys as strings (a key given twice: the last one).
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

/// go-yaml v2's `resolve` of a plain scalar.
fn resolve(s: &str) -> Node {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Node::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Node::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Node::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Node::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Node::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Node::Float(f64::NAN),
        _ => {}
    }
    let first = s.as_bytes()[0];
    if first.is_ascii_digit() || first == b'+' || first == b'-' {
        let plain = s.replace('_', "");
        if let Ok(v) = retcd_gostd::strconv::parse_int(&plain, 0, 64) {
            return Node::Int(v as i128);
        }
        if let Ok(v) =
            retcd_gostd::strconv::parse_uint(plain.strip_prefix('+').unwrap_or(&plain), 0, 64)
        {
            if !plain.starts_with('-') {
                return Node::Int(v as i128);
            }
        }
        if yaml_style_float(&plain) {
            if let Ok(f) = plain.parse::<f64>() {
                return Node::Float(f);
            }
        }
    } else if first == b'.' {
        if let Ok(f) = s.parse::<f64>() {
            return Node::Float(f);
        }
    }
    Node::Str(s.to_string())
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mant_ok = match mant.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mant),
    };
    mant_ok && exp.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)))
}

/// A float as Go's `strconv.FormatFloat(f, 'g', -1, 32)` (how a number
/// becomes a string field).
fn go_float32(f: f64) -> String {
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f.is_nan() {
        return "NaN".into();
    }
    let v = f as f32;
    let exp = if v == 0.0 {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    if (-4..21).contains(&exp) {
        format!("{v}")
    } else {
        go_exponent(format!("{v:e}"))
    }
}

/// Rust's `{:e}` (`1e21`) as Go writes an exponent: signed, two digits
/// at least (`1e+21`).
fn go_exponent(e: String) -> String {
    match e.split_once('e') {
        Some((m, x)) => {
            let n: i32 = x.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if n < 0 { '-' } else { '+' }, n.abs())
        }
        None => e,
    }
}

/// A float as `encoding/json` writes it (then read back as a number).
fn go_json_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        go_exponent(format!("{f:e}"))
    } else {
        // shortest digits, no exponent (as Go's 'f' format with -1)
        format!("{f}")
    }
}

/// Builds the first document's [`Node`] from the parser's events.
#[derive(Default)]
struct Builder {
    stack: Vec<(Vec<Node>, bool)>,
    root: Option<Node>,
    done: bool,
}

impl Builder {
    fn push(&mut self, n: Node) {
        match self.stack.last_mut() {
            Some((items, _)) => items.push(n),
            None => {
                if self.root.is_none() {
                    self.root = Some(n);
                }
            }
        }
    }
}

fn key_string(n: &Node) -> String {
    match n {
        Node::Str(s) => s.clone(),
        Node::Int(i) => i.to_string(),
        Node::Bool(b) => b.to_string(),
        Node::Float(f) => go_float32(*f)
            .replace("+Inf", ".inf")
            .replace("-Inf", "-.inf")
            .replace("NaN", ".nan"),
        _ => String::new(),
    }
}

impl yaml_rust2::parser::EventReceiver for Builder {
    fn on_event(&mut self, ev: yaml_rust2::parser::Event) {
        use yaml_rust2::parser::Event;
        if self.done {
            return;
        }
        match ev {
            Event::DocumentEnd => self.done = self.root.is_some(),
            Event::Scalar(v, style, _, tag) => {
                let plain = style == yaml_rust2::scanner::TScalarStyle::Plain && tag.is_none();
                self.push(if plain { resolve(&v) } else { Node::Str(v) });
            }
            Event::Alias(_) => self.push(Node::Null),
            Event::SequenceStart(..) => self.stack.push((Vec::new(), false)),
            Event::MappingStart(..) => self.stack.push((Vec::new(), true)),
            Event::SequenceEnd | Event::MappingEnd => {
                let Some((items, map)) = self.stack.pop() else {
                    return;
                };
                let n = if map {
                    let mut out: Vec<(String, Node)> = Vec::new();
                    let mut it = items.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        let k = key_string(&k);
                        match out.iter_mut().find(|(o, _)| *o == k) {
                            Some(e) => e.1 = v,
                            None => out.push((k, v)),
                        }
                    }
                    Node::Map(out)
                } else {
                    Node::Seq(items)
                };
                self.push(n);
            }
            _ => {}
        }
    }
}

/// What a field of etcd's `configYAML` is in Go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Str,
    Bool,
    /// (bits, signed, Go type name)
    Num(u32, bool, &'static str),
    Duration,
    StrList,
}

impl Target {
    fn of(kind: Kind) -> Target {
        match kind {
            Kind::Bool => Target::Bool,
            Kind::Uint => Target::Num(64, false, "uint"),
            Kind::Uint64 => Target::Num(64, false, "uint64"),
            Kind::Uint32 => Target::Num(32, false, "uint32"),
            Kind::Int => Target::Num(64, true, "int"),
            Kind::Int64 => Target::Num(64, true, "int64"),
            Kind::Duration => Target::Duration,
            Kind::List => Target::StrList,
            _ => Target::Str,
        }
    }

    fn go_type(self) -> &'static str {
        match self {
            Target::Str => "string",
            Target::Bool => "bool",
            Target::Num(_, _, t) => t,
            Target::Duration => "time.Duration",
            Target::StrList => "[]string",
        }
    }
}

/// The kind `encoding/json` names in a type error.
fn json_kind(n: &Node) -> &'static str {
    match n {
        Node::Str(_) => "string",
        Node::Int(_) | Node::Float(_) => "number",
        Node::Bool(_) => "bool",
        Node::Seq(_) => "array",
        Node::Map(_) => "object",
        Node::Null => "null",
    }
}

/// A number's JSON text.
fn number_text(n: &Node) -> Option<String> {
    match n {
        Node::Int(i) => Some(i.to_string()),
        Node::Float(f) => Some(go_json_float(*f)),
        _ => None,
    }
}

/// A scalar made a string (sigs.k8s.io/yaml does so for string fields).
fn scalar_str(n: &Node) -> Option<String> {
    match n {
        Node::Str(s) => Some(s.clone()),
        Node::Int(i) => Some(i.to_string()),
        Node::Float(f) => Some(go_float32(*f)),
        Node::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// One field's value as the flag's string, `None` for null; the error
/// is `encoding/json`'s type error.
fn decode(field: &str, t: Target, n: &Node) -> Result<Option<String>, String> {
    let err = |what: String, ty: &str| {
        Err(format!(
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {what} into Go struct field {field} of type {ty}"
        ))
    };
    if *n == Node::Null {
        return Ok(None);
    }
    match t {
        // No number or boolean is made a string: every field of etcd's
        // configYAML is promoted from an embedded struct, so
        // sigs.k8s.io/yaml finds no string target to convert them for.
        Target::Str => match n {
            Node::Str(s) => Ok(Some(s.clone())),
            _ => err(json_kind(n).into(), t.go_type()),
        },
        Target::Bool => match n {
            Node::Bool(b) => Ok(Some(b.to_string())),
            _ => err(json_kind(n).into(), t.go_type()),
        },
        Target::Num(..) | Target::Duration if number_text(n).is_some() => {
            let text = number_text(n).unwrap_or_default();
            let (bits, signed) = match t {
                Target::Num(b, s, _) => (b, s),
                _ => (64, true),
            };
            let ok = if signed {
                text.parse::<i64>().ok().map(|v| v.to_string())
            } else {
                text.parse::<u64>()
                    .ok()
                    .filter(|v| bits >= 64 || v >> bits == 0)
                    .map(|v| v.to_string())
            };
            match ok {
                Some(v) if t == Target::Duration => Ok(Some(format!("{v}ns"))),
                Some(v) => Ok(Some(v)),
                None => err(format!("number {text}"), t.go_type()),
            }
        }
        Target::Num(..) | Target::Duration => err(json_kind(n).into(), t.go_type()),
        Target::StrList => match n {
            Node::Seq(items) => {
                let mut out = Vec::new();
                for it in items {
                    match it {
                        Node::Null => out.push(String::new()),
                        Node::Str(s) => out.push(s.clone()),
                        _ => return err(json_kind(it).into(), "string"),
                    }
                }
                Ok(Some(out.join(",")))
            }
            _ => err(json_kind(n).into(), t.go_type()),
        },
    }
}

/// Whether a field's value holds a float JSON cannot write (checked for
/// the fields whose values are not made strings first).
fn non_finite(n: &Node) -> Option<&'static str> {
    match n {
        Node::Float(f) if f.is_nan() => Some("NaN"),
        Node::Float(f) if f.is_infinite() => Some(if *f > 0.0 { "+Inf" } else { "-Inf" }),
        Node::Seq(v) => v.iter().find_map(non_finite),
        Node::Map(v) => v.iter().find_map(|(_, n)| non_finite(n)),
        _ => None,
    }
}

/// The file's values, and the error etcd reports only after its
/// `Validate` (the `proxy` / `discovery-fallback` second pass).
#[derive(Debug)]
pub struct Parsed {
    pub values: Values,
    pub late: Option<FileError>,
}

/// Reads the YAML text into flag values (the file's only), as etcd 3.5:
/// sigs.k8s.io/yaml (go-yaml v2, then `encoding/json` into `configYAML`:
/// keys in sorted order, matched case-insensitively, the first type error
/// reported), then the URL keys in etcd's order.
pub fn parse(text: &str) -> Result<Parsed, FileError> {
    let mut b = Builder::default();
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    parser
        .load(&mut b, true)
        .map_err(|e| FileError::Verify(format!("error converting YAML to JSON: yaml: {e}")))?;
    let mut values = Values::default();
    let top = match b.root {
        Some(Node::Map(m)) => m,
        None | Some(Node::Null) => {
            return Ok(Parsed {
                values,
                late: None,
            })
        }
        Some(other) => {
            return Err(FileError::Verify(format!(
                "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go value of type embed.configYAML",
                json_kind(&other)
            )))
        }
    };
    let mut top = top;
    top.sort_by(|a, b| a.0.cmp(&b.0));
    // json.Marshal of the converted document: non-finite floats fail it.
    for (key, n) in &top {
        let lower = key.to_ascii_lowercase();
        let stringy = top_key(&lower)
            .and_then(lookup)
            .is_some_and(|f| matches!(Target::of(f.kind), Target::Str | Target::StrList));
        if !stringy {
            if let Some(v) = non_finite(n) {
                return Err(FileError::Verify(format!(
                    "error converting YAML to JSON: json: unsupported value: {v}"
                )));
            }
        }
    }
    let mut first_error: Option<String> = None;
    let keep = |e: String, first: &mut Option<String>| {
        if first.is_none() {
            *first = Some(e);
        }
    };
    for (key, y) in &top {
        let lower = key.to_ascii_lowercase();
        let sub = match lower.as_str() {
            "client-transport-security" => Some(CLIENT_TLS),
            "peer-transport-security" => Some(PEER_TLS),
            _ => None,
        };
        if let Some(table) = sub {
            let h = match y {
                Node::Map(h) => h,
                Node::Null => continue,
                other => {
                    keep(format!(
                        "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go struct field configYAML.{lower} of type embed.securityConfig",
                        json_kind(other)
                    ), &mut first_error);
                    continue;
                }
            };
            let mut h = h.clone();
            h.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in &h {
                let k = k.to_ascii_lowercase();
                let Some((_, flag)) = table.iter().find(|(sk, _)| *sk == k) else {
                    continue;
                };
                let fl = lookup(flag).expect("flag of a TLS sub-key");
                // In etcd's struct these are single strings.
                let t = match Target::of(fl.kind) {
                    Target::StrList => Target::Str,
                    t => t,
                };
                match decode(&format!("securityConfig.{lower}.{k}"), t, v) {
                    Ok(Some(s)) => {
                        values.set.insert(fl.name, (s, Source::File));
                    }
                    Ok(None) => {}
                    Err(e) => keep(e, &mut first_error),
                }
            }
            continue;
        }
        let Some(name) = top_key(&lower) else {
            continue;
        };
        let fl = lookup(name).expect("flag of a key");
        // The URL lists, cors and host-whitelist are strings in the file.
        let t = match (fl.kind, name) {
            (Kind::Urls, _) | (_, "host-whitelist") => Target::Str,
            (k, _) => Target::of(k),
        };
        match decode(&format!("configYAML.{}", fl.name), t, y) {
            Ok(Some(s)) => {
                values.set.insert(fl.name, (s, Source::File));
            }
            Ok(None) => {}
            Err(e) => keep(e, &mut first_error),
        }
    }
    if let Some(e) = first_error {
        return Err(FileError::Verify(e));
    }
    // The URL keys, in etcd's order (advertise-client-urls is named
    // advertise-peer-urls in etcd's message); then the other checks.
    for (name, label) in [
        ("listen-peer-urls", "listen-peer-urls"),
        ("listen-client-urls", "listen-client-urls"),
        ("listen-client-http-urls", "listen-client-http-urls"),
        ("initial-advertise-peer-urls", "initial-advertise-peer-urls"),
        ("advertise-client-urls", "advertise-peer-urls"),
        ("listen-metrics-urls", "listen-metrics-urls"),
    ] {
        let Some((raw, _)) = values.set.get(name).cloned() else {
            continue;
        };
        if raw.is_empty() {
            values.set.remove(name);
            continue;
        }
        let fl = lookup(name).expect("URL flag");
        match check(fl, &raw) {
            Ok(v) => {
                values.set.insert(fl.name, (v, Source::File));
            }
            Err(e) => {
                return Err(FileError::Plain(format!(
                    "unexpected error setting up {label}: {e}"
                )))
            }
        }
    }
    let names: Vec<&'static str> = values.set.keys().copied().collect();
    for name in names {
        let fl = lookup(name).expect("flag");
        if matches!(fl.kind, Kind::Gates | Kind::Urls) && !name.contains("urls") {
            let raw = values.set[name].0.clone();
            let v = check(fl, &raw).map_err(|e| FileError::Verify(format!("{name}: {e}")))?;
            values.set.insert(fl.name, (v, Source::File));
        }
    }
    // etcdmain's second pass (configProxy), reported after Validate.
    let mut late = None;
    for (key, y) in &top {
        let lower = key.to_ascii_lowercase();
        if lower.starts_with("proxy-") && lookup(&lower).is_some() {
            if let Err(e) = decode(
                &format!("configProxy.{lower}"),
                Target::Num(64, false, "uint"),
                y,
            ) {
                late.get_or_insert(FileError::Verify(e));
            }
        }
    }
    if late.is_none() {
        for (key, what, allowed) in [
            (
                "discovery-fallback",
                "discovery-fallback flag",
                &["exit", "proxy"][..],
            ),
            ("proxy", "proxyFlag", &["off", "readonly", "on"][..]),
        ] {
            let Some((_, y)) = top.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)) else {
                continue;
            };
            let v = scalar_str(y).unwrap_or_default();
            if !v.is_empty() && !allowed.contains(&v.as_str()) {
                late = Some(FileError::Plain(format!(
                    "unexpected error setting up {what}: invalid value"
                )));
                break;
            }
        }
    }
    Ok(Parsed { values, late })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_keys_types_and_tls() {
        let v = parse(
            "name: 'a'\nNAME: upper\nsnapshot-count: 4242\nbogus-key: 1\nsnapshot_count: 7\n\
             experimental-corrupt-check-time: 90000000000\nwal-dir: null\n\
             log-outputs: [stderr, /tmp/x.log]\nlisten-client-urls: http://127.0.0.1:1,http://127.0.0.1:2\n\
             client-transport-security:\n  cert-file: /c.pem\n  client-cert-auth: true\n\
             peer-transport-security:\n  allowed-cn: peer\n  cert-file: /p.pem\n\
             experimental-snapshot-catch-up-entries: 10\n",
        )
        .unwrap()
        .values;
        assert_eq!(v.str("name"), "a", "the key sorting last wins");
        assert_eq!(v.u64("snapshot-count"), 4242);
        assert_eq!(v.duration("experimental-corrupt-check-time").as_secs(), 90);
        assert!(!v.is_set("wal-dir"));
        assert_eq!(v.list("log-outputs"), vec!["stderr", "/tmp/x.log"]);
        assert_eq!(v.list("listen-client-urls").len(), 2);
        assert_eq!(v.str("cert-file"), "/c.pem");
        assert!(v.bool("client-cert-auth"));
        assert_eq!(v.str("peer-cert-file"), "/p.pem");
        assert_eq!(v.list("peer-cert-allowed-cn"), vec!["peer"]);
        assert_eq!(v.u64("experimental-snapshot-catchup-entries"), 10);
    }

    #[test]
    fn test_type_errors() {
        let e = |t: &str| parse(t).unwrap_err();
        assert_eq!(
            e("experimental-corrupt-check-time: 90s\n"),
            FileError::Verify("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.experimental-corrupt-check-time of type time.Duration".into())
        );
        assert_eq!(
            e("strict-reconfig-check: \"false\"\n"),
            FileError::Verify("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.strict-reconfig-check of type bool".into())
        );
        assert_eq!(
            e("snapshot-count: -1\n"),
            FileError::Verify("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal number -1 into Go struct field configYAML.snapshot-count of type uint64".into())
        );
        assert_eq!(
            e("listen-client-urls: 127.0.0.1:23790\n"),
            FileError::Plain("unexpected error setting up listen-client-urls: parse \"127.0.0.1:23790\": first path segment in URL cannot contain colon".into())
        );
        assert!(
            matches!(e("a: [b\n"), FileError::Verify(m) if m.starts_with("error converting YAML to JSON: yaml: "))
        );
    }
}
