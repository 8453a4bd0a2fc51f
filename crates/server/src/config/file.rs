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
use yaml_rust2::{Yaml, YamlLoader};

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
    Some(fl.name)
}

/// The entries of a YAML mapping in the order etcd applies them: keys
/// sorted as strings, matched lower-cased (the last match wins).
fn sorted_entries(h: &yaml_rust2::yaml::Hash) -> Vec<(String, &Yaml)> {
    let mut v: Vec<(String, &Yaml)> = h
        .iter()
        .filter_map(|(k, v)| scalar_string(k).map(|k| (k, v)))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn scalar_string(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn json_kind(y: &Yaml) -> String {
    match y {
        Yaml::String(_) => "string".into(),
        Yaml::Integer(i) => format!("number {i}"),
        Yaml::Real(r) => format!("number {r}"),
        Yaml::Boolean(_) => "bool".into(),
        Yaml::Array(_) => "array".into(),
        Yaml::Hash(_) => "object".into(),
        _ => "value".into(),
    }
}

/// One YAML value as the flag's canonical string; `None` for null.
fn convert(field: &str, kind: Kind, y: &Yaml) -> Result<Option<String>, FileError> {
    if matches!(y, Yaml::Null) {
        return Ok(None);
    }
    let mismatch = || {
        let what = match (kind, y) {
            // Go names the value only for numbers it cannot fit.
            (Kind::Bool | Kind::Str | Kind::List, Yaml::Integer(_) | Yaml::Real(_)) => {
                "number".to_string()
            }
            (_, Yaml::Integer(_) | Yaml::Real(_)) => json_kind(y),
            _ => json_kind(y)
                .split(' ')
                .next()
                .unwrap_or("value")
                .to_string(),
        };
        FileError::Verify(format!(
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {what} into Go struct field configYAML.{field} of type {}",
            kind.go_type()
        ))
    };
    let s = match kind {
        Kind::Str | Kind::Enum(_) | Kind::Urls | Kind::Gates | Kind::Ignored => {
            scalar_string(y).ok_or_else(mismatch)?
        }
        Kind::Bool => match y {
            Yaml::Boolean(b) => b.to_string(),
            _ => return Err(mismatch()),
        },
        Kind::Uint | Kind::Uint64 | Kind::Uint32 => match y {
            Yaml::Integer(i) if *i >= 0 => i.to_string(),
            _ => return Err(mismatch()),
        },
        Kind::Int | Kind::Int64 => match y {
            Yaml::Integer(i) => i.to_string(),
            _ => return Err(mismatch()),
        },
        Kind::Duration => match y {
            Yaml::Integer(i) => format!("{i}ns"),
            _ => return Err(mismatch()),
        },
        Kind::List => match y {
            Yaml::Array(items) => {
                let mut out = Vec::new();
                for it in items {
                    out.push(scalar_string(it).ok_or_else(mismatch)?);
                }
                out.join(",")
            }
            _ => return Err(mismatch()),
        },
    };
    Ok(Some(s))
}

/// Reads the YAML text into flag values (the file's only).
pub fn parse(text: &str) -> Result<Values, FileError> {
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| FileError::Verify(format!("error converting YAML to JSON: yaml: {e}")))?;
    let mut values = Values::default();
    let Some(doc) = docs.into_iter().next() else {
        return Ok(values);
    };
    let top = match doc {
        Yaml::Hash(h) => h,
        Yaml::Null => return Ok(values),
        other => {
            return Err(FileError::Verify(format!(
                "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go value of type embed.configYAML",
                json_kind(&other)
            )))
        }
    };
    for (key, y) in sorted_entries(&top) {
        let lower = key.to_ascii_lowercase();
        let sub = match lower.as_str() {
            "client-transport-security" => Some(CLIENT_TLS),
            "peer-transport-security" => Some(PEER_TLS),
            _ => None,
        };
        if let Some(table) = sub {
            let Yaml::Hash(h) = y else {
                if matches!(y, Yaml::Null) {
                    continue;
                }
                return Err(FileError::Verify(format!(
                    "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go struct field configYAML.{lower} of type embed.securityConfig",
                    json_kind(y)
                )));
            };
            for (k, v) in sorted_entries(h) {
                let k = k.to_ascii_lowercase();
                let Some((_, flag)) = table.iter().find(|(sk, _)| *sk == k) else {
                    continue;
                };
                let fl = lookup(flag).expect("flag of a TLS sub-key");
                // In etcd's struct these are single strings.
                let kind = if fl.kind == Kind::List {
                    Kind::Str
                } else {
                    fl.kind
                };
                if let Some(s) = convert(&format!("{lower}.{k}"), kind, v)? {
                    values.set.insert(fl.name, (s, Source::File));
                }
            }
            continue;
        }
        let Some(name) = top_key(&lower) else {
            continue;
        };
        let fl = lookup(name).expect("flag of a key");
        let Some(s) = convert(&lower, fl.kind, y)? else {
            continue;
        };
        let s = match check(fl, &s) {
            Ok(s) => s,
            Err(e) if fl.kind == Kind::Urls => {
                return Err(FileError::Plain(format!(
                    "unexpected error setting up {name}: {e}"
                )))
            }
            Err(e) => return Err(FileError::Verify(format!("{name}: {e}"))),
        };
        values.set.insert(fl.name, (s, Source::File));
    }
    Ok(values)
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
        .unwrap();
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
