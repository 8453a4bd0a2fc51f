//! Normalisation of etcdctl output for differential comparison.
//!
//! What differs between two fresh servers for reasons that do not matter:
//! `cluster_id`, `member_id` and `raft_term` (IDs derive from URLs and the
//! cluster token; terms from elections) and the loopback ports. Revisions are
//! compared exactly: both servers start from an empty store and receive the
//! same requests, so revisions must match.
//! etcdctl's client-side JSON log lines (e.g. the retry interceptor's
//! `{"level":"warn","ts":…,"target":…,"error":"rpc error: code = … desc = …"}`)
//! are reduced to their `level`, `msg` and `error` fields.

use serde_json::Value;

use crate::etcdctl::Output;

const ID_FIELDS: &[&str] = &["cluster_id", "member_id", "raft_term"];

/// Replaces `cluster_id`, `member_id` and `raft_term` values, at any depth,
/// with placeholders.
pub fn normalize_json(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                if ID_FIELDS.contains(&k.as_str()) {
                    *val = Value::String(format!("<{k}>"));
                } else {
                    normalize_json(val);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize_json),
        _ => {}
    }
}

/// Replaces `127.0.0.1:<port>` / `localhost:<port>` with `127.0.0.1:PORT`.
pub fn normalize_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find("127.0.0.1:") {
        let (head, tail) = rest.split_at(pos + "127.0.0.1:".len());
        out.push_str(head);
        let digits = tail.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 {
            out.push_str("PORT");
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// Normalises stdout: each line that is a JSON document (`-w json`) gets
/// [`normalize_json`] and is re-serialised with sorted keys; other lines
/// get [`normalize_text`].
pub fn normalize_stdout(s: &str) -> String {
    if let Ok(mut v) = serde_json::from_str::<Value>(s.trim()) {
        if !s.trim().is_empty() {
            normalize_json(&mut v);
            return format!("{v}\n");
        }
    }
    s.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(mut v) if v.is_object() => {
                normalize_json(&mut v);
                v.to_string()
            }
            _ => normalize_text(l),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Normalises stderr: client JSON log lines keep only `level`, `msg`,
/// `error`; everything else gets [`normalize_text`].
pub fn normalize_stderr(s: &str) -> String {
    s.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) if m.contains_key("level") => {
                let f = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
                format!(
                    "[client log] level={} msg={} error={}",
                    f("level"),
                    f("msg"),
                    normalize_text(&f("error"))
                )
            }
            _ => normalize_text(l),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The normalised form of a whole etcdctl run.
pub fn normalize_output(o: &Output) -> Output {
    Output {
        stdout: normalize_stdout(&o.stdout),
        stderr: normalize_stderr(&o.stderr),
        code: o.code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_ids_are_masked_revisions_kept() {
        let s = r#"{"header":{"cluster_id":14841639068965178418,"member_id":10276657743932975437,"revision":5,"raft_term":2},"count":1}"#;
        let out = normalize_stdout(s);
        assert!(out.contains(r#""cluster_id":"<cluster_id>""#), "{out}");
        assert!(out.contains(r#""member_id":"<member_id>""#), "{out}");
        assert!(out.contains(r#""raft_term":"<raft_term>""#), "{out}");
        assert!(out.contains(r#""revision":5"#), "{out}");
    }

    #[test]
    fn ports_are_masked() {
        assert_eq!(
            normalize_text("dial 127.0.0.1:23790 x 127.0.0.1:"),
            "dial 127.0.0.1:PORT x 127.0.0.1:"
        );
    }

    #[test]
    fn client_log_lines_are_reduced() {
        let l = r#"{"level":"warn","ts":"2024-01-01T00:00:00.000Z","caller":"clientv3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"endpoint://client-abc/127.0.0.1:2379","attempt":0,"error":"rpc error: code = OutOfRange desc = etcdserver: mvcc: required revision has been compacted"}"#;
        assert_eq!(
            normalize_stderr(l),
            "[client log] level=warn msg=retrying of unary invoker failed error=rpc error: code = OutOfRange desc = etcdserver: mvcc: required revision has been compacted"
        );
    }
}
