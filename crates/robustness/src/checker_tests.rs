//! The checkers classify hand-made histories correctly.

use crate::history::{History, Kv, Operation, Request, Response};
use crate::linearizability::{check, Verdict, DEFAULT_BUDGET};
use crate::model::KvState;
use crate::watch::{self, EventKind, Filter, WatchEvent, WatchItem, WatchRecord};

fn put(c: usize, key: &str, v: &str, call: u64, ret: u64, rev: i64) -> Operation {
    Operation {
        client: c,
        req: Request::Put {
            key: key.into(),
            value: v.into(),
            lease: 0,
        },
        call,
        ret: Some(ret),
        resp: Some(Response::Put { rev }),
    }
}

fn put_unknown(c: usize, key: &str, v: &str, call: u64) -> Operation {
    Operation {
        client: c,
        req: Request::Put {
            key: key.into(),
            value: v.into(),
            lease: 0,
        },
        call,
        ret: None,
        resp: None,
    }
}

fn kv(key: &str, v: &str, create: i64, m: i64, ver: i64) -> Kv {
    Kv {
        key: key.into(),
        value: v.into(),
        create_revision: create,
        mod_revision: m,
        version: ver,
        lease: 0,
    }
}

fn get(c: usize, key: &str, call: u64, ret: u64, val: Option<Kv>, rev: i64) -> Operation {
    Operation {
        client: c,
        req: Request::Get { key: key.into() },
        call,
        ret: Some(ret),
        resp: Some(Response::Get { kv: val, rev }),
    }
}

fn verdict(ops: &[Operation]) -> Verdict {
    check(ops, &KvState::new(1), DEFAULT_BUDGET)
}

fn is_ok(ops: &[Operation]) -> bool {
    matches!(verdict(ops), Verdict::Ok)
}

#[test]
fn test_sequential_history_is_linearizable() {
    let ops = vec![
        put(0, "a", "x", 0, 10, 2),
        get(1, "a", 20, 30, Some(kv("a", "x", 2, 2, 1)), 2),
        put(0, "a", "y", 40, 50, 3),
        get(1, "a", 60, 70, Some(kv("a", "y", 2, 3, 2)), 3),
    ];
    assert!(is_ok(&ops));
}

#[test]
fn test_concurrent_read_may_see_either() {
    // The get overlaps the put: old or new value are both fine.
    let old = vec![put(0, "a", "x", 0, 100, 2), get(1, "a", 10, 20, None, 1)];
    let new = vec![
        put(0, "a", "x", 0, 100, 2),
        get(1, "a", 10, 20, Some(kv("a", "x", 2, 2, 1)), 2),
    ];
    assert!(is_ok(&old));
    assert!(is_ok(&new));
}

#[test]
fn test_stale_read_is_caught() {
    // The put returned before the get was called, yet the get misses it.
    let ops = vec![put(0, "a", "x", 0, 10, 2), get(1, "a", 20, 30, None, 1)];
    match verdict(&ops) {
        Verdict::Violation(v) => {
            assert_eq!(v.culprit.call, 20, "{v}");
            assert_eq!(v.prefix.len(), 2);
            assert!(v.to_string().contains("culprit"));
        }
        other => panic!("expected a violation, got {other:?}"),
    }
}

#[test]
fn test_lost_write_is_caught() {
    // An acknowledged write vanishes (the final read does not see it and
    // the revision did not move).
    let ops = vec![
        put(0, "a", "x", 0, 10, 2),
        put(0, "b", "y", 20, 30, 3),
        get(1, "a", 40, 50, None, 3),
    ];
    assert!(matches!(verdict(&ops), Verdict::Violation(_)));
}

#[test]
fn test_revision_going_back_is_caught() {
    let ops = vec![
        put(0, "a", "x", 0, 10, 2),
        put(0, "a", "y", 20, 30, 3),
        get(1, "b", 40, 50, None, 3),
        get(1, "b", 60, 70, None, 2),
    ];
    assert!(matches!(verdict(&ops), Verdict::Violation(_)));
}

#[test]
fn test_skipped_revision_is_caught() {
    let ops = vec![put(0, "a", "x", 0, 10, 2), put(0, "a", "y", 20, 30, 4)];
    assert!(matches!(verdict(&ops), Verdict::Violation(_)));
}

#[test]
fn test_unknown_write_may_or_may_not_apply() {
    let seen = vec![
        put_unknown(0, "a", "x", 0),
        get(1, "a", 100, 110, Some(kv("a", "x", 2, 2, 1)), 2),
    ];
    let unseen = vec![put_unknown(0, "a", "x", 0), get(1, "a", 100, 110, None, 1)];
    assert!(is_ok(&seen));
    assert!(is_ok(&unseen));
    // But not both: once seen, it cannot disappear.
    let both = vec![
        put_unknown(0, "a", "x", 0),
        get(1, "a", 100, 110, Some(kv("a", "x", 2, 2, 1)), 2),
        get(1, "a", 200, 210, None, 2),
    ];
    assert!(matches!(verdict(&both), Verdict::Violation(_)));
}

#[test]
fn test_value_never_written_is_caught() {
    let ops = vec![get(1, "a", 0, 10, Some(kv("a", "ghost", 2, 2, 1)), 2)];
    assert!(matches!(verdict(&ops), Verdict::Violation(_)));
}

#[test]
fn test_cas_and_leases() {
    let cas = |call, exp, v: &str, resp| Operation {
        client: 0,
        req: Request::Cas {
            key: "a".into(),
            expected_mod_rev: exp,
            value: v.into(),
        },
        call,
        ret: Some(call + 5),
        resp: Some(resp),
    };
    let ops = vec![
        put(0, "a", "x", 0, 5, 2),
        cas(
            10,
            2,
            "y",
            Response::Cas {
                succeeded: true,
                kv: None,
                rev: 3,
            },
        ),
        cas(
            20,
            2,
            "z",
            Response::Cas {
                succeeded: false,
                kv: Some(kv("a", "y", 2, 3, 2)),
                rev: 3,
            },
        ),
    ];
    assert!(is_ok(&ops));
    // A CAS that succeeds on a stale expectation is a violation.
    let mut bad = ops.clone();
    bad[2] = cas(
        20,
        2,
        "z",
        Response::Cas {
            succeeded: true,
            kv: None,
            rev: 4,
        },
    );
    assert!(matches!(verdict(&bad), Verdict::Violation(_)));

    let op = |call, req, resp| Operation {
        client: 0,
        req,
        call,
        ret: Some(call + 5),
        resp: Some(resp),
    };
    let lease_ops = vec![
        op(
            0,
            Request::LeaseGrant { id: 7 },
            Response::LeaseGrant { rev: 1 },
        ),
        op(
            10,
            Request::Put {
                key: "a".into(),
                value: "x".into(),
                lease: 7,
            },
            Response::Put { rev: 2 },
        ),
        op(
            20,
            Request::LeaseRevoke { id: 7 },
            Response::LeaseRevoke { rev: 3 },
        ),
        op(
            30,
            Request::Get { key: "a".into() },
            Response::Get { kv: None, rev: 3 },
        ),
        op(
            40,
            Request::Put {
                key: "b".into(),
                value: "y".into(),
                lease: 7,
            },
            Response::LeaseNotFound,
        ),
    ];
    assert!(is_ok(&lease_ops));
    // Keys of a revoked lease must be gone.
    let mut bad = lease_ops.clone();
    bad[3] = op(
        30,
        Request::Get { key: "a".into() },
        Response::Get {
            kv: Some(Kv {
                lease: 7,
                ..kv("a", "x", 2, 2, 1)
            }),
            rev: 3,
        },
    );
    assert!(matches!(verdict(&bad), Verdict::Violation(_)));
}

#[test]
fn test_minimal_failing_prefix_stops_at_the_culprit() {
    let mut ops = vec![put(0, "a", "v0", 0, 10, 2)];
    // A long correct tail after the violation at t=20.
    ops.push(get(1, "a", 20, 30, None, 1));
    for i in 0..50u64 {
        ops.push(put(
            0,
            "b",
            &format!("w{i}"),
            100 + i * 10,
            105 + i * 10,
            3 + i as i64,
        ));
    }
    match verdict(&ops) {
        Verdict::Violation(v) => {
            assert_eq!(v.prefix.len(), 2, "{v}");
            assert_eq!(v.culprit.call, 20);
        }
        other => panic!("expected a violation, got {other:?}"),
    }
}

#[test]
fn test_many_concurrent_clients_check_quickly() {
    // 8 clients, 4000 operations, overlapping puts and reads on 5 keys.
    let mut st = KvState::new(1);
    let mut ops = Vec::new();
    let mut t = 0u64;
    for i in 0..4000u64 {
        let c = (i % 8) as usize;
        let key = format!("k{}", i % 5);
        let req = if i % 3 == 0 {
            Request::Get { key }
        } else {
            Request::Put {
                key,
                value: format!("v{i}"),
                lease: 0,
            }
        };
        let resp = st.apply(&req);
        // Each op spans a window overlapping ~8 neighbours.
        ops.push(Operation {
            client: c,
            req,
            call: t,
            ret: Some(t + 75),
            resp: Some(resp),
        });
        t += 10;
    }
    let start = std::time::Instant::now();
    assert!(is_ok(&ops));
    assert!(start.elapsed().as_secs() < 20);
}

// ---- watch ----

fn ev(
    kind: EventKind,
    key: &str,
    v: &str,
    create: i64,
    rev: i64,
    ver: i64,
    prev: Option<Kv>,
) -> WatchEvent {
    let kv = match kind {
        EventKind::Put => kv(key, v, create, rev, ver),
        EventKind::Delete => Kv {
            key: key.into(),
            value: String::new(),
            create_revision: 0,
            mod_revision: rev,
            version: 0,
            lease: 0,
        },
    };
    WatchEvent {
        kind,
        kv,
        prev_kv: prev,
    }
}

fn history3() -> (History, Vec<WatchEvent>) {
    let h = History {
        ops: vec![
            put(0, "a", "x", 0, 10, 2),
            put(0, "b", "y", 20, 30, 3),
            Operation {
                client: 0,
                req: Request::Delete { key: "a".into() },
                call: 40,
                ret: Some(50),
                resp: Some(Response::Delete { deleted: 1, rev: 4 }),
            },
        ],
        stale_reads: vec![],
        compactions: vec![],
    };
    let evs = vec![
        ev(EventKind::Put, "a", "x", 2, 2, 1, None),
        ev(EventKind::Put, "b", "y", 3, 3, 1, None),
        ev(
            EventKind::Delete,
            "a",
            "",
            0,
            4,
            0,
            Some(kv("a", "x", 2, 2, 1)),
        ),
    ];
    (h, evs)
}

/// The one watch record (from revision 2, with prev_kv) test histories use.
pub(crate) fn rec(items: Vec<WatchItem>) -> WatchRecord {
    WatchRecord {
        id: 0,
        member: 0,
        filter: Filter::None,
        prev_kv: true,
        start_rev: 2,
        items,
    }
}

fn one_per_response(evs: &[WatchEvent]) -> Vec<WatchItem> {
    evs.iter()
        .map(|e| WatchItem::Events {
            header_rev: e.kv.mod_revision,
            events: vec![e.clone()],
            time: 0,
        })
        .collect()
}

#[test]
fn test_watch_good_stream_passes() {
    let (h, evs) = history3();
    let mut items = one_per_response(&evs[..2]);
    items.push(WatchItem::Progress { rev: 3 });
    items.push(WatchItem::Restart {
        resume_rev: 4,
        reason: "killed".into(),
    });
    items.extend(one_per_response(&evs[2..]));
    let r = watch::check(&[rec(items)], &h, 1, 4);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn test_watch_duplicate_event_is_caught() {
    let (h, evs) = history3();
    let mut items = one_per_response(&evs);
    items.insert(
        2,
        WatchItem::Events {
            header_rev: 3,
            events: vec![evs[1].clone()],
            time: 0,
        },
    );
    let r = watch::check(&[rec(items)], &h, 1, 4);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("not unique") || v.contains("not atomic")),
        "{:?}",
        r.violations
    );
}

#[test]
fn test_watch_gap_is_caught() {
    let (h, evs) = history3();
    let items = one_per_response(&[evs[0].clone(), evs[2].clone()]);
    let r = watch::check(&[rec(items)], &h, 1, 4);
    assert!(
        r.violations.iter().any(|v| v.contains("not reliable")),
        "{:?}",
        r.violations
    );
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("acknowledged write not in the watch history")),
        "{:?}",
        r.violations
    );
}

#[test]
fn test_watch_out_of_order_and_bookmark_are_caught() {
    let (h, evs) = history3();
    let items = vec![
        WatchItem::Events {
            header_rev: 2,
            events: vec![evs[0].clone()],
            time: 0,
        },
        WatchItem::Progress { rev: 3 },
        WatchItem::Events {
            header_rev: 3,
            events: vec![evs[1].clone()],
            time: 0,
        },
        WatchItem::Events {
            header_rev: 4,
            events: vec![evs[2].clone()],
            time: 0,
        },
    ];
    let r = watch::check(&[rec(items)], &h, 1, 4);
    assert!(
        r.violations.iter().any(|v| v.contains("bookmarkable")),
        "{:?}",
        r.violations
    );
}

#[test]
fn test_watch_wrong_prev_kv_and_phantom_are_caught() {
    let (h, mut evs) = history3();
    evs[2].prev_kv = Some(kv("a", "stale", 2, 2, 1));
    let r = watch::check(&[rec(one_per_response(&evs))], &h, 1, 4);
    assert!(
        r.violations.iter().any(|v| v.contains("wrong prev_kv")),
        "{:?}",
        r.violations
    );
    let (h, mut evs) = history3();
    evs[1].kv.value = "never-written".into();
    let r = watch::check(&[rec(one_per_response(&evs))], &h, 1, 4);
    assert!(
        r.violations.iter().any(|v| v.contains("phantom")),
        "{:?}",
        r.violations
    );
}

#[test]
fn test_watch_split_revision_and_filters() {
    let (h, evs) = history3();
    // A filtered (no-delete) watcher that also got the delete.
    let mut f = rec(one_per_response(&evs));
    f.filter = Filter::NoDelete;
    f.id = 1;
    let full = rec(one_per_response(&evs));
    let r = watch::check(&[full, f], &h, 1, 4);
    assert!(
        r.violations.iter().any(|v| v.contains("filter")),
        "{:?}",
        r.violations
    );
}
