//! Pieces the seeded random differential tests (`*_random_differential.rs`)
//! share: their knobs, range ends, and readable requests in failure output.

use rand::rngs::StdRng;
use rand::Rng;

/// `$var` as a number, else `default`.
pub fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// etcd's prefix end of `key` (`\0`, from the key on, when it is all 0xff).
pub fn prefix_end(key: &[u8]) -> Vec<u8> {
    match key.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut e = key[..=i].to_vec();
            e[i] += 1;
            e
        }
        None => vec![0],
    }
}

/// A range end for `key`: none (the key), its prefix end, `\0` (from the
/// key on), a key of `keys` (maybe below it), the key and `\0` (the key as
/// a range) or the key itself (an empty range).
pub fn range_end(rng: &mut StdRng, key: &[u8], keys: &[&[u8]]) -> Vec<u8> {
    match rng.random_range(0..100) {
        0..35 => Vec::new(),
        35..55 => prefix_end(key),
        55..70 => vec![0],
        70..90 => keys[rng.random_range(0..keys.len())].to_vec(), // possibly below the key
        90..95 => [key, &[0]].concat(),
        _ => key.to_vec(), // an empty range
    }
}

/// Bytes as an escaped string in quotes.
pub fn show_bytes(b: &[u8]) -> String {
    format!("\"{}\"", b.escape_ascii())
}

/// `Debug` output with every byte list (`[97, 47, 98]`) shown as an
/// escaped string (`"a/b"`); an empty list stays `[]`.
pub fn bytes_as_strings(debug: &str) -> String {
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug;
    while let Some(at) = rest.find('[') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let bytes = after.find(']').and_then(|end| {
            let inner = &after[..end];
            let bs: Option<Vec<u8>> = inner.split(", ").map(|n| n.parse().ok()).collect();
            bs.filter(|b| !b.is_empty()).map(|b| (b, end))
        });
        match bytes {
            Some((b, end)) => {
                out.push_str(&show_bytes(&b));
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A gRPC call's answer as the differential tests compare it: the
/// response (made a `Resp` by `f`), or the status's code and message; a
/// call past its bound is DeadlineExceeded "(test: call timed out)".
pub fn answer<T, R>(
    r: Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>,
    f: fn(T) -> R,
) -> Result<R, (tonic::Code, String)> {
    match r {
        Ok(Ok(r)) => Ok(f(r.into_inner())),
        Ok(Err(s)) => Err((s.code(), s.message().to_string())),
        Err(_) => Err((
            tonic::Code::DeadlineExceeded,
            "(test: call timed out)".into(),
        )),
    }
}

/// A revision to ask for: 0, one past the head, the head, any up to it,
/// or mostly one of `seen` (revisions answers named lately).
pub fn recent_rev(rng: &mut StdRng, head: i64, seen: &[i64]) -> i64 {
    match rng.random_range(0..10) {
        0 => 0,
        1 => head + 1,
        2 => head,
        3 => rng.random_range(1..=head.max(1)),
        _ if !seen.is_empty() => seen[rng.random_range(0..seen.len())],
        _ => head,
    }
}

/// The draws of a generator holding a seeded `StdRng`.
pub trait Dice {
    fn rng(&mut self) -> &mut StdRng;

    /// True with probability `p`.
    fn p(&mut self, p: f64) -> bool {
        self.rng().random_bool(p)
    }

    /// One of `xs`.
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng().random_range(0..xs.len())]
    }
}

/// `s` with every number that is a placeholder (`base + i`, i below
/// 2^20) written `name#i`: the server-chosen IDs the tests map by order.
pub fn placeholder_names(s: &str, base: i64, name: &str) -> String {
    rename_numbers(s, |digits| match digits.parse::<i64>() {
        Ok(n) if (base..base + (1 << 20)).contains(&n) => Some(format!("{name}#{}", n - base)),
        _ => None,
    })
}

/// `s` with each run of ASCII digits replaced by what `rename` makes of
/// it, or kept when it makes nothing.
pub fn rename_numbers(s: &str, rename: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        match rename(digits) {
            Some(name) => out.push_str(&name),
            None => out.push_str(digits),
        }
        digits.clear();
    };
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

/// Each object's keys in the order written (objects in the order they end).
pub fn key_order(json: &str) -> Vec<String> {
    let b = json.as_bytes();
    let (mut out, mut stack) = (Vec::new(), Vec::<Option<Vec<String>>>::new());
    let mut expect_key = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                stack.push(Some(Vec::new()));
                expect_key = true;
            }
            b'[' => stack.push(None),
            b'}' | b']' => {
                if let Some(Some(keys)) = stack.pop() {
                    out.push(keys.join(","));
                }
                expect_key = false;
            }
            b',' => expect_key = matches!(stack.last(), Some(Some(_))),
            b'"' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if expect_key {
                    let k =
                        serde_json::from_slice(&b[start..=i.min(b.len() - 1)]).unwrap_or_default();
                    if let Some(Some(keys)) = stack.last_mut() {
                        keys.push(k);
                    }
                    expect_key = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Clears what two servers' headers differ in by nature: the cluster ID,
/// the member ID and the raft term (revisions are compared).
pub fn clear_header(h: &mut Option<retcd_api::etcdserverpb::ResponseHeader>) {
    if let Some(h) = h {
        h.cluster_id = 0;
        h.member_id = 0;
        h.raft_term = 0;
    }
}

/// A Txn answer with every header cleared ([`clear_header`]) and every
/// key-value it holds passed to `kv`, in nested Txns too.
pub fn normalise_txn(
    t: &mut retcd_api::etcdserverpb::TxnResponse,
    kv: &dyn Fn(&mut retcd_api::mvccpb::KeyValue),
) {
    use retcd_api::etcdserverpb::response_op::Response;
    clear_header(&mut t.header);
    for r in &mut t.responses {
        match &mut r.response {
            Some(Response::ResponseRange(r)) => {
                clear_header(&mut r.header);
                r.kvs.iter_mut().for_each(kv);
            }
            Some(Response::ResponsePut(r)) => {
                clear_header(&mut r.header);
                r.prev_kv.iter_mut().for_each(kv);
            }
            Some(Response::ResponseDeleteRange(r)) => {
                clear_header(&mut r.header);
                r.prev_kvs.iter_mut().for_each(kv);
            }
            Some(Response::ResponseTxn(t)) => normalise_txn(t, kv),
            None => {}
        }
    }
}

/// A Txn branch with no Put that etcd (3.4.23 and 3.5.1 alike) dies on.
/// etcd checks a Put with `ignore_value` or `ignore_lease` against the
/// store as it was before the Txn (`checkRequestPut` in
/// etcdserver/apply.go) and panics in the apply ("unexpected error during
/// txnWrite": every member dies) when an earlier op of its branch deleted
/// its key; its "duplicate key" check (`checkIntervals` in
/// etcdserver/api/v3rpc/key.go) misses a delete from a key on (range end
/// `\0`) and may miss one in a nested Txn. So such a Put after either
/// loses its ignore flags, unless the flags fail the API's check anyway
/// (a value or a lease given with them). retcd answers InvalidArgument
/// "etcdserver: key not found" there. Returns whether it changed anything.
pub fn no_etcd_crash(branch: &mut [retcd_api::etcdserverpb::RequestOp]) -> bool {
    use retcd_api::etcdserverpb::{request_op::Request, PutRequest};
    // Flags the API lets through (it refuses a value or a lease with them).
    let flagged = |p: &PutRequest| {
        (p.ignore_value || p.ignore_lease)
            && (!p.ignore_value || p.value.is_empty())
            && (!p.ignore_lease || p.lease == 0)
    };
    let (mut changed, mut may_delete) = (false, false);
    for op in branch.iter_mut() {
        match &mut op.request {
            Some(Request::RequestDeleteRange(d)) if d.range_end == [0] => may_delete = true,
            Some(Request::RequestTxn(_)) => may_delete = true,
            Some(Request::RequestPut(p)) if may_delete && flagged(p) => {
                (p.ignore_value, p.ignore_lease) = (false, false);
                changed = true;
            }
            _ => {}
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_bytes_as_strings_and_prefix_end() {
        assert_eq!(
            bytes_as_strings("PutRequest { key: [97, 47, 98], value: [], x: [0, 255] }"),
            r#"PutRequest { key: "a/b", value: [], x: "\x00\xff" }"#
        );
        assert_eq!(prefix_end(b"a"), b"b");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\x00");
    }
}
