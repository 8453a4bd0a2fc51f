//! Watch tests, named after etcd's watchable_store_test.go and
//! watcher_test.go.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use retcd_api::etcdserverpb::{
    request_op, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest, WatchResponse,
};
use retcd_api::mvccpb::event::EventType;

use crate::kvstore_test::{new_store, TestStore};
use crate::watchable_store::PROGRESS_ALL_ID;
use crate::{
    NoLeases, WatchError, WatchOptions, WatchRange, WatchStream, WatchableStore, WriteBatch,
};

struct T {
    _t: TestStore,
    kv: Arc<crate::KvStore>,
    ws: Arc<WatchableStore>,
}

fn setup() -> T {
    let t = new_store();
    let kv = t.store.clone();
    let ws = WatchableStore::new(kv.clone());
    T { _t: t, kv, ws }
}

impl T {
    /// Runs `f` in one batch, commits it and notifies, as the apply thread.
    fn apply(&self, f: impl FnOnce(&mut WriteBatch<'_>)) {
        let mut b = self.kv.begin_batch().unwrap();
        f(&mut b);
        let events = b.take_events();
        b.commit(false).unwrap();
        self.ws.notify(self.kv.current_revision(), events);
    }

    fn put(&self, k: &str, v: &str) {
        self.apply(|b| {
            b.put(&put_req(k, v), &NoLeases).unwrap();
        });
    }

    fn del(&self, k: &str) {
        self.apply(|b| {
            b.delete_range(&DeleteRangeRequest {
                key: k.into(),
                ..Default::default()
            })
            .unwrap();
        });
    }

    fn stream(&self, cap: usize) -> (WatchStream, Rx) {
        let (tx, rx) = sync_channel(cap);
        (
            self.ws.new_stream(Arc::new(tx)),
            Rx {
                rx,
                buf: RefCell::default(),
            },
        )
    }
}

/// A stream's receiving side: its channel carries lists of responses (a
/// `notify` sends one list per stream); this hands them out one by one.
struct Rx {
    rx: Receiver<Vec<WatchResponse>>,
    buf: RefCell<VecDeque<WatchResponse>>,
}

impl Rx {
    /// The next response: left over from the last list, or from the list
    /// `get` takes off the channel.
    fn next<E>(
        &self,
        get: impl FnOnce(&Receiver<Vec<WatchResponse>>) -> Result<Vec<WatchResponse>, E>,
    ) -> Result<WatchResponse, E> {
        let mut buf = self.buf.borrow_mut();
        if buf.is_empty() {
            buf.extend(get(&self.rx)?);
        }
        Ok(buf.pop_front().expect("lists are never empty"))
    }

    fn recv_timeout(&self, d: Duration) -> Result<WatchResponse, RecvTimeoutError> {
        self.next(|rx| rx.recv_timeout(d))
    }

    fn try_recv(&self) -> Result<WatchResponse, TryRecvError> {
        self.next(Receiver::try_recv)
    }
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

fn watch(s: &WatchStream, key: &str, end: &str, opts: WatchOptions) -> i64 {
    let id = s.reserve(0).unwrap();
    s.watch(
        id,
        WatchRange::new(key.as_bytes(), end.as_bytes()).unwrap(),
        opts,
    );
    id
}

fn from(rev: i64) -> WatchOptions {
    WatchOptions {
        start_rev: rev,
        ..Default::default()
    }
}

fn recv(rx: &Rx) -> WatchResponse {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("a watch response within 5s")
}

/// (revision, key, type) of every event received until `n` events arrived.
fn collect(rx: &Rx, n: usize) -> Vec<(i64, String, i32)> {
    let mut out = Vec::new();
    while out.len() < n {
        let r = recv(rx);
        for e in r.events {
            let kv = e.kv.unwrap();
            out.push((
                kv.mod_revision,
                String::from_utf8(kv.key.to_vec()).unwrap(),
                e.r#type,
            ));
        }
    }
    out
}

#[test]
fn test_watch() {
    let t = setup();
    let (s, rx) = t.stream(16);
    let id = watch(&s, "foo", "", from(0));
    assert_eq!(id, 0);
    t.put("bar", "x");
    t.put("foo", "y");
    let r = recv(&rx);
    assert_eq!(r.watch_id, 0);
    assert_eq!(r.header.unwrap().revision, 3);
    assert_eq!(r.events.len(), 1);
    let kv = r.events[0].kv.as_ref().unwrap();
    assert_eq!(
        (kv.key.as_ref(), kv.value.as_ref()),
        (&b"foo"[..], &b"y"[..])
    );
    assert!(r.events[0].prev_kv.is_none());
    assert!(rx.try_recv().is_err());
}

#[test]
fn test_watch_ids_and_duplicate() {
    let t = setup();
    let (s, _rx) = t.stream(16);
    assert_eq!(s.reserve(0), Ok(0));
    assert_eq!(s.reserve(2), Ok(2));
    assert_eq!(s.reserve(2), Err(WatchError::DuplicateId));
    assert_eq!(s.reserve(0), Ok(1));
    assert_eq!(s.reserve(0), Ok(3));
    assert!(s.cancel(1));
    assert!(!s.cancel(1));
    assert!(!s.cancel(42));
    assert_eq!(WatchRange::new(b"b", b"a"), Err(WatchError::EmptyRange));
}

#[test]
fn test_cancel_unsynced() {
    let t = setup();
    for i in 0..3 {
        t.put("foo", &i.to_string());
    }
    let (s, _rx) = t.stream(16);
    let ids: Vec<i64> = (0..10).map(|_| watch(&s, "foo", "", from(1))).collect();
    for id in ids {
        assert!(s.cancel(id));
    }
    assert_eq!(t.ws.gauges().1, 0);
}

#[test]
fn test_sync_watchers() {
    let t = setup();
    t.put("foo", "a");
    t.put("foo", "b");
    let (s, rx) = t.stream(16);
    watch(&s, "foo", "", from(1));
    // history 2..=3 arrives in one response at the current revision
    let r = recv(&rx);
    assert_eq!(r.header.unwrap().revision, 3);
    assert_eq!(r.events.len(), 2);
    // then the watcher is synced: new events come from notify
    t.put("foo", "c");
    assert_eq!(
        collect(&rx, 1),
        vec![(4, "foo".into(), EventType::Put as i32)]
    );
}

#[test]
fn test_watch_future_rev() {
    let t = setup();
    let (s, rx) = t.stream(16);
    watch(&s, "foo", "", from(10));
    for i in 0..12 {
        t.put("foo", &i.to_string());
    }
    let got = collect(&rx, 4);
    assert_eq!(
        got.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![10, 11, 12, 13]
    );
}

#[test]
fn test_watch_compacted() {
    let t = setup();
    for i in 0..10 {
        t.put("foo", &i.to_string());
    }
    t.apply(|b| {
        b.compact(5, true).unwrap();
    });
    let (s, rx) = t.stream(16);
    let id = watch(&s, "foo", "", from(3));
    let r = recv(&rx);
    assert_eq!(r.watch_id, id);
    assert!(r.canceled);
    assert_eq!(r.compact_revision, 5);
    assert!(r.events.is_empty());
    assert!(!s.contains(id));
    // its id stays taken until the client cancels it, as in etcd: an
    // automatic id skips it, the cancel is answered (once)
    assert_eq!(id, 0);
    assert_eq!(s.reserve(0), Ok(1));
    assert!(s.cancel(id));
    assert!(!s.cancel(id));
    assert!(s.cancel(1));
    // at the compaction revision itself the history is still readable (etcd)
    let id = watch(&s, "foo", "", from(5));
    let got = collect(&rx, 7);
    assert_eq!(got.first().unwrap().0, 5);
    assert!(s.contains(id));
}

#[test]
fn test_watch_batch_unsynced() {
    let t = setup();
    let n = 2 * crate::watchable_store::MAX_REVS_PER_SYNC as usize + 500;
    for i in 0..n {
        t.put(&format!("k{}", i % 7), "v");
    }
    let (s, rx) = t.stream(4);
    watch(&s, "k", "l", from(1));
    let mut revs = Vec::new();
    let mut responses = 0;
    while revs.len() < n {
        let r = recv(&rx);
        responses += 1;
        for e in &r.events {
            assert!(e.kv.as_ref().unwrap().mod_revision <= r.header.unwrap().revision);
        }
        revs.extend(r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision));
    }
    assert_eq!(revs, (2..=n as i64 + 1).collect::<Vec<_>>());
    assert!(responses >= 3, "history is sent in chunks, got {responses}");
}

#[test]
fn test_watch_txn_events_in_one_response() {
    let t = setup();
    t.put("a", "0");
    let (s, rx) = t.stream(16);
    watch(&s, "", "\0", from(0));
    t.apply(|b| {
        let op = |k: &str| RequestOp {
            request: Some(request_op::Request::RequestPut(put_req(k, "1"))),
        };
        let del = RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: "a".into(),
                    ..Default::default()
                },
            )),
        };
        let txn = TxnRequest {
            success: vec![op("b"), op("c"), del],
            ..Default::default()
        };
        b.txn(&txn, &NoLeases).unwrap();
        b.put(&put_req("d", "2"), &NoLeases).unwrap();
    });
    // one batch: both revisions in one response, the txn's events together
    let r = recv(&rx);
    assert_eq!(r.header.unwrap().revision, 4);
    let got: Vec<(i32, i64)> = r
        .events
        .iter()
        .map(|e| (e.r#type, e.kv.as_ref().unwrap().mod_revision))
        .collect();
    let (p, d) = (EventType::Put as i32, EventType::Delete as i32);
    assert_eq!(got, vec![(p, 3), (p, 3), (d, 3), (p, 4)]);
    // a txn alone in its batch
    t.apply(|b| {
        let txn = TxnRequest {
            success: vec![
                RequestOp {
                    request: Some(request_op::Request::RequestPut(put_req("e", "1"))),
                },
                RequestOp {
                    request: Some(request_op::Request::RequestPut(put_req("f", "1"))),
                },
            ],
            ..Default::default()
        };
        b.txn(&txn, &NoLeases).unwrap();
    });
    let r = recv(&rx);
    assert_eq!(r.header.unwrap().revision, 5);
    assert_eq!(r.events.len(), 2);
}

#[test]
fn test_watch_filters_and_prev_kv() {
    let t = setup();
    t.put("foo", "1");
    let (s, rx) = t.stream(64);
    let noput = watch(
        &s,
        "foo",
        "",
        WatchOptions {
            no_put: true,
            ..Default::default()
        },
    );
    let prev = watch(
        &s,
        "foo",
        "",
        WatchOptions {
            prev_kv: true,
            no_delete: true,
            ..Default::default()
        },
    );
    t.put("foo", "2");
    t.del("foo");
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(recv(&rx));
    }
    let p = got.iter().find(|r| r.watch_id == prev).unwrap();
    assert_eq!(p.events[0].r#type, EventType::Put as i32);
    assert_eq!(p.events[0].prev_kv.as_ref().unwrap().value, &b"1"[..]);
    let d = got.iter().find(|r| r.watch_id == noput).unwrap();
    assert_eq!(d.events[0].r#type, EventType::Delete as i32);
    assert!(d.events[0].prev_kv.is_none());
    assert_eq!(d.events[0].kv.as_ref().unwrap().mod_revision, 4);
    // the same from history: prev_kv computed at revision - 1
    let h = watch(
        &s,
        "foo",
        "",
        WatchOptions {
            start_rev: 2,
            prev_kv: true,
            ..Default::default()
        },
    );
    let r = recv(&rx);
    assert_eq!(r.watch_id, h);
    assert_eq!(r.events.len(), 3);
    assert!(r.events[0].prev_kv.is_none(), "a creation has no prev_kv");
    assert_eq!(r.events[1].prev_kv.as_ref().unwrap().value, &b"1"[..]);
    assert_eq!(r.events[2].prev_kv.as_ref().unwrap().value, &b"2"[..]);
}

/// Puts read the value they replace only while a watcher wants prev_kv; a
/// watcher that starts between such a put's apply and its notify still
/// gets prev_kv (read at notify), and puts while none wants it carry none.
#[test]
fn test_prev_kv_read_at_notify_for_a_watcher_started_after_apply() {
    let t = setup();
    t.put("foo", "1");
    // applied while no watcher wants prev_kv: the event carries none
    let mut b = t.kv.begin_batch().unwrap();
    b.put(&put_req("foo", "2"), &NoLeases).unwrap();
    let events = b.take_events();
    assert!(events[0].1.prev_kv.is_none());
    b.commit(false).unwrap();
    let (s, rx) = t.stream(64);
    let prev_kv = || WatchOptions {
        prev_kv: true,
        ..Default::default()
    };
    let id = watch(&s, "foo", "", prev_kv());
    assert_eq!(t.kv.prev_kv_watchers.load(Ordering::Relaxed), 1);
    t.ws.notify(t.kv.current_revision(), events);
    let r = recv(&rx);
    assert_eq!(r.watch_id, id);
    assert_eq!(r.events[0].prev_kv.as_ref().unwrap().value, &b"1"[..]);
    // while it exists, puts read the value they replace at apply
    let mut b = t.kv.begin_batch().unwrap();
    let resp = b.put(&put_req("foo", "3"), &NoLeases).unwrap();
    assert!(resp.prev_kv.is_none(), "not asked by the request");
    assert_eq!(
        b.take_events()[0].1.prev_kv.as_ref().unwrap().value,
        &b"2"[..]
    );
    b.commit(false).unwrap();
    // cancelled (and a stream dropped): the count goes back to zero
    assert!(s.cancel(id));
    assert_eq!(t.kv.prev_kv_watchers.load(Ordering::Relaxed), 0);
    let id2 = watch(&s, "foo", "", prev_kv());
    assert!(id2 != id);
    assert_eq!(t.kv.prev_kv_watchers.load(Ordering::Relaxed), 1);
    drop(s);
    assert_eq!(t.kv.prev_kv_watchers.load(Ordering::Relaxed), 0);
}

/// A full channel parks the watcher (notify never blocks); once the reader
/// drains, every event arrives, in order, exactly once.
#[test]
fn test_watch_victim_no_event_lost() {
    let t = setup();
    let (s, rx) = t.stream(2);
    watch(&s, "k", "", from(0));
    let started = Instant::now();
    for i in 0..300 {
        t.put("k", &i.to_string());
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    let got = collect(&rx, 300);
    assert_eq!(
        got.iter().map(|e| e.0).collect::<Vec<_>>(),
        (2..=301).collect::<Vec<_>>()
    );
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
}

#[test]
fn test_progress_request() {
    let t = setup();
    t.put("a", "1");
    let (s, rx) = t.stream(16);
    // no watcher: no answer (etcd 3.5.8+)
    s.request_progress_all();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let synced = watch(&s, "b", "", from(0));
    s.request_progress_all();
    let r = recv(&rx);
    assert_eq!(
        (r.watch_id, r.header.unwrap().revision),
        (PROGRESS_ALL_ID, 2)
    );
    assert!(s.cancel(synced));
    // an unsynced watcher defers the progress response until it is synced
    let id = watch(&s, "a", "", from(1));
    s.request_progress_all();
    let first = recv(&rx);
    assert_eq!(first.watch_id, id);
    assert_eq!(first.events.len(), 1);
    let r = recv(&rx);
    assert_eq!(
        (r.watch_id, r.header.unwrap().revision),
        (PROGRESS_ALL_ID, 2)
    );
}

#[test]
fn test_progress_notify_tick() {
    let t = setup();
    let (s, rx) = t.stream(16);
    let id = watch(
        &s,
        "a",
        "",
        WatchOptions {
            progress_notify: true,
            ..Default::default()
        },
    );
    watch(&s, "b", "", from(0));
    s.progress_tick();
    let r = recv(&rx);
    assert_eq!((r.watch_id, r.events.len()), (id, 0));
    t.put("a", "1");
    recv(&rx);
    s.progress_tick(); // events were sent since the last tick: elided
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
}

#[test]
fn test_restore_resyncs_from_history() {
    let t = setup();
    let (s, rx) = t.stream(16);
    watch(&s, "k", "", from(0));
    t.put("k", "1");
    assert_eq!(collect(&rx, 1)[0].0, 2);
    // a snapshot install changes the store without notify
    for i in 0..3 {
        let mut b = t.kv.begin_batch().unwrap();
        b.put(&put_req("k", &i.to_string()), &NoLeases).unwrap();
        b.commit(false).unwrap();
    }
    t.ws.restore();
    let got = collect(&rx, 3);
    assert_eq!(got.iter().map(|e| e.0).collect::<Vec<_>>(), vec![3, 4, 5]);
    t.put("k", "x");
    assert_eq!(collect(&rx, 1)[0].0, 6);
}

/// etcd 3.5.22 (fe30a6e4f): a restore does not lower a watcher of a
/// future revision: it gets nothing below its start.
#[test]
fn test_restore_keeps_future_watcher_start() {
    let t = setup();
    let (s, rx) = t.stream(16);
    watch(&s, "k", "", from(5)); // store at 1
    t.ws.restore();
    std::thread::sleep(Duration::from_millis(300)); // a sync round or more
    t.put("k", "2"); // 2
    t.put("k", "3"); // 3
    t.put("k", "4"); // 4
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    t.put("k", "5"); // 5
    assert_eq!(collect(&rx, 1)[0].0, 5);
}

/// etcd 3.5.22 (#20290): no progress response, requested or periodic,
/// while the store is below a watcher's requested start revision.
#[test]
fn test_no_progress_below_requested_start() {
    let t = setup();
    let (s, rx) = t.stream(16);
    let id = watch(
        &s,
        "k",
        "",
        WatchOptions {
            start_rev: 3,
            requested_rev: 3,
            progress_notify: true,
            ..Default::default()
        },
    );
    s.request_progress_all();
    s.progress_tick();
    t.put("x", "1"); // 2
    s.progress_tick();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    t.put("x", "2"); // 3: reached; the deferred request is answered
    let r = recv(&rx);
    assert_eq!(
        (r.watch_id, r.header.unwrap().revision),
        (PROGRESS_ALL_ID, 3)
    );
    s.progress_tick();
    let r = recv(&rx);
    assert_eq!((r.watch_id, r.header.unwrap().revision), (id, 3));
}

#[test]
fn test_stream_drop_removes_watchers() {
    let t = setup();
    let (s, rx) = t.stream(1);
    watch(&s, "k", "", from(0));
    watch(&s, "k", "", from(1));
    t.put("k", "1");
    t.put("k", "2");
    drop(rx);
    drop(s);
    t.put("k", "3");
    assert_eq!(t.ws.gauges().1, 0);
}

#[test]
fn test_events_between() {
    let t = setup();
    t.put("a", "1");
    t.put("b", "1");
    t.del("a");
    let evs =
        t.kv.events_between(2, 4, &WatchRange::new(b"a", b"").unwrap())
            .unwrap();
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[1].r#type, EventType::Delete as i32);
    assert_eq!(evs[1].kv.as_ref().unwrap().mod_revision, 4);
}

/// Applies several puts as one committed batch (one raft Ready), notified
/// once, as the apply thread does with a group commit.
fn apply_puts(t: &T, puts: &[(&str, String)]) {
    t.apply(|b| {
        for (k, v) in puts {
            b.put(&put_req(k, v), &NoLeases).unwrap();
        }
    });
}

#[test]
fn test_notify_merges_revisions_of_a_batch() {
    let t = setup();
    let (s, rx) = t.stream(16);
    let a = watch(&s, "a", "", from(0));
    let all = watch(&s, "a", "c", from(0));
    apply_puts(
        &t,
        &[
            ("a", "1".into()),
            ("b", "2".into()),
            ("a", "3".into()),
            ("z", "4".into()),
        ],
    );
    let mut got = [recv(&rx), recv(&rx)];
    got.sort_by_key(|r| r.watch_id);
    let revs = |r: &WatchResponse| {
        r.events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect::<Vec<_>>()
    };
    // one response per watcher for the whole batch, header at its last event
    assert_eq!((got[0].watch_id, revs(&got[0])), (a, vec![2, 4]));
    assert_eq!(got[0].header.as_ref().unwrap().revision, 4);
    assert_eq!((got[1].watch_id, revs(&got[1])), (all, vec![2, 3, 4]));
    assert_eq!(got[1].header.as_ref().unwrap().revision, 4);
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
}

/// Watchers with the same picks share one plan (`notify` reuses the last
/// watcher's reply for the next one with the same events); watchers in
/// between with other picks, on two streams, still get their own.
#[test]
fn test_notify_watchers_with_the_same_events_each_get_them() {
    let t = setup();
    t.put("a", "0");
    let (s1, rx1) = t.stream(16);
    let (s2, rx2) = t.stream(16);
    let prev = WatchOptions {
        prev_kv: true,
        ..Default::default()
    };
    // stream 1: two plain, one prev_kv, two plain, one range; stream 2:
    // two plain
    let mut want1 = vec![
        (watch(&s1, "a", "", from(0)), vec![3, 5], false),
        (watch(&s1, "a", "", from(0)), vec![3, 5], false),
        (watch(&s1, "a", "", prev), vec![3, 5], true),
        (watch(&s1, "a", "", from(0)), vec![3, 5], false),
        (watch(&s1, "a", "", from(0)), vec![3, 5], false),
        (watch(&s1, "a", "c", from(0)), vec![3, 4, 5], false),
    ];
    let mut want2 = vec![
        (watch(&s2, "a", "", from(0)), vec![3, 5], false),
        (watch(&s2, "a", "", from(0)), vec![3, 5], false),
    ];
    apply_puts(
        &t,
        &[("a", "1".into()), ("b", "2".into()), ("a", "3".into())],
    );
    for (rx, want) in [(&rx1, &mut want1), (&rx2, &mut want2)] {
        let mut got: Vec<_> = (0..want.len())
            .map(|_| {
                let r = recv(rx);
                let revs: Vec<i64> = (r.events.iter())
                    .map(|e| e.kv.as_ref().unwrap().mod_revision)
                    .collect();
                let with_prev = r.events.iter().all(|e| e.prev_kv.is_some());
                assert!(with_prev || r.events.iter().all(|e| e.prev_kv.is_none()));
                assert_eq!(r.header.as_ref().unwrap().revision, 5);
                (r.watch_id, revs, with_prev)
            })
            .collect();
        got.sort();
        want.sort();
        assert_eq!(&got, want);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    }
}

#[test]
fn test_notify_cuts_large_batches_at_revision_boundaries() {
    let t = setup();
    let (s, rx) = t.stream(64);
    watch(&s, "k", "", from(0));
    // 20 KiB values: three revisions fit under MERGE_LIMIT_BYTES, a fourth does not
    let big = "x".repeat(20 * 1024);
    let puts: Vec<(&str, String)> = (0..10).map(|_| ("k", big.clone())).collect();
    apply_puts(&t, &puts);
    let mut revs = Vec::new();
    let mut sizes = Vec::new();
    while revs.len() < 10 {
        let r = recv(&rx);
        let last = r.events.last().unwrap().kv.as_ref().unwrap().mod_revision;
        assert_eq!(r.header.as_ref().unwrap().revision, last);
        sizes.push(r.events.len());
        revs.extend(r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision));
    }
    assert_eq!(revs, (2..=11).collect::<Vec<_>>());
    assert_eq!(
        sizes,
        vec![3, 3, 3, 1],
        "cut when the next revision would pass the limit"
    );
}

#[test]
fn test_notify_victim_with_several_replies_loses_nothing() {
    let t = setup();
    // room for one message: a first put fills it, so the next batch's
    // responses (cut in several at revision boundaries) are all parked
    // with the watcher together
    let (s, rx) = t.stream(1);
    watch(&s, "k", "", from(0));
    t.put("k", "first"); // 2
    let big = "y".repeat(30 * 1024);
    let puts: Vec<(&str, String)> = (0..8).map(|_| ("k", big.clone())).collect();
    apply_puts(&t, &puts); // 3..=10, cut into 4 responses
    t.put("k", "last"); // 11
    let got = collect(&rx, 10);
    assert_eq!(
        got.iter().map(|e| e.0).collect::<Vec<_>>(),
        (2..=11).collect::<Vec<_>>()
    );
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
}

/// A stream's watchers get one message per batch; when it is refused they
/// all become victims holding their own replies, and each still gets every
/// event once, in order, with prev_kv as it asked.
#[test]
fn test_notify_parks_every_watcher_of_a_full_stream() {
    let t = setup();
    let (s, rx) = t.stream(1);
    let plain = watch(&s, "k", "", from(0));
    let with_prev = watch(
        &s,
        "k",
        "",
        WatchOptions {
            prev_kv: true,
            ..Default::default()
        },
    );
    let prefix = watch(&s, "k", "l", from(0));
    for i in 0..200 {
        t.put("k", &i.to_string());
    }
    let mut per: std::collections::BTreeMap<i64, Vec<(i64, Option<String>)>> = Default::default();
    while per.values().map(Vec::len).sum::<usize>() < 600 {
        let r = recv(&rx);
        for e in r.events {
            let prev = e
                .prev_kv
                .map(|p| String::from_utf8(p.value.to_vec()).unwrap());
            per.entry(r.watch_id)
                .or_default()
                .push((e.kv.unwrap().mod_revision, prev));
        }
    }
    let revs = |id: i64| per[&id].iter().map(|e| e.0).collect::<Vec<_>>();
    for id in [plain, with_prev, prefix] {
        assert_eq!(revs(id), (2..=201).collect::<Vec<_>>(), "watcher {id}");
    }
    assert!(per[&plain].iter().all(|e| e.1.is_none()));
    assert!(per[&prefix].iter().all(|e| e.1.is_none()));
    let prevs: Vec<Option<String>> = per[&with_prev].iter().map(|e| e.1.clone()).collect();
    let want: Vec<Option<String>> = std::iter::once(None)
        .chain((0..199).map(|i| Some(i.to_string())))
        .collect();
    assert_eq!(prevs, want);
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
}

/// Watchers of one stream catching up from history while the stream is
/// full are parked with their replies, and those leave in one message once
/// the stream has room (one message per victim filled a stream's channel,
/// which counts messages); each reply holds the watcher's own events from
/// the catch-up's shared encoding: with and without `prev_kv`, filtered.
#[test]
fn test_victims_of_a_stream_are_retried_in_one_message() {
    let t = setup();
    t.put("a", "1");
    t.put("a", "2");
    t.put("b", "3");
    t.del("a");
    // a stream whose channel is full until the test reads it
    let (tx, rx) = sync_channel::<Vec<WatchResponse>>(1);
    tx.send(vec![WatchResponse::default()]).unwrap();
    let s = t.ws.new_stream(Arc::new(tx));
    let plain = watch(&s, "a", "", from(2));
    let prev = watch(
        &s,
        "a",
        "",
        WatchOptions {
            start_rev: 2,
            prev_kv: true,
            ..Default::default()
        },
    );
    let no_put = watch(
        &s,
        "",
        "\0",
        WatchOptions {
            start_rev: 2,
            no_put: true,
            ..Default::default()
        },
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.ws.victim_count() < 3 {
        assert!(
            Instant::now() < deadline,
            "the three watchers were not parked"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    rx.recv().unwrap();
    let list = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a message within 5s");
    assert_eq!(list.len(), 3, "one message holding every victim's reply");
    let of = |id: i64| list.iter().find(|r| r.watch_id == id).expect("a reply");
    let evs = |r: &WatchResponse| -> Vec<(i64, i32, Option<Vec<u8>>)> {
        r.events
            .iter()
            .map(|e| {
                let kv = e.kv.as_ref().unwrap();
                let p = e.prev_kv.as_ref().map(|p| p.value.to_vec());
                (kv.mod_revision, e.r#type, p)
            })
            .collect()
    };
    let (put, del) = (EventType::Put as i32, EventType::Delete as i32);
    assert_eq!(
        evs(of(plain)),
        vec![(2, put, None), (3, put, None), (5, del, None)]
    );
    assert_eq!(
        evs(of(prev)),
        vec![
            (2, put, None),
            (3, put, Some(b"1".to_vec())),
            (5, del, Some(b"2".to_vec()))
        ]
    );
    assert_eq!(evs(of(no_put)), vec![(5, del, None)]);
    for r in &list {
        assert_eq!(r.header.unwrap().revision, 5);
    }
    // all caught up: the next put reaches each once more
    t.put("a", "4");
    let mut got = 0;
    while got < 2 {
        got += rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the put")
            .len();
    }
    assert_eq!(got, 2, "the put goes to the two watchers of puts on a");
}
