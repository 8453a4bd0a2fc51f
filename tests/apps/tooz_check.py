#!/usr/bin/python3
"""tooz over etcd3gw (Debian's python3-tooz and python3-etcd3gw) against an
etcd-compatible cluster: locks, groups, leader election, stop().

Run by tests/tests/apps.rs with Debian's /usr/bin/python3 (tooz lives in
/usr/lib/python3/dist-packages):

    tooz_check.py HOST:PORT[,HOST:PORT...]

Coordinator i talks to endpoint i (mod the count), so locks, group members
and leadership are decided across members. Prints one `ok <check> <detail>`
line per check and exits 0, or prints `FAIL <check>: <why>` and exits 1.
Every wait is bounded; a stuck call fails the check through a watchdog
thread (exit 2) rather than hanging the test.
"""

import os
import sys
import threading
import time

import etcd3gw
from etcd3gw.client import Etcd3Client

# Debian 12's tooz 3.1.0 calls etcd3gw.client(..., api_path=...), a keyword
# its etcd3gw 2.0.0 `client()` helper does not take (Etcd3Client does):
# without this shim no etcd3gw coordinator can start at all.
etcd3gw.client = lambda **kw: Etcd3Client(**kw)

from tooz import coordination  # noqa: E402

ENDPOINTS = sys.argv[1].split(",")
# tooz's etcd3gw default api_version is v3alpha, which etcd >= 3.4 answers
# 404: the URL must say v3.
URL = "etcd3+http://{}?api_version=v3&timeout=5&lock_timeout=5&membership_timeout=5"
STOP_BOUND = 10.0
# Names unique to this run, so reruns against one cluster do not collide.
RUN = str(os.getpid()).encode()
TOTAL_BOUND = float(os.environ.get("TOOZ_CHECK_BOUND", "150"))


def watchdog():
    time.sleep(TOTAL_BOUND)
    print("FAIL watchdog: checks did not finish within %ss" % TOTAL_BOUND, flush=True)
    os._exit(2)


threading.Thread(target=watchdog, daemon=True).start()


def fail(check, why):
    print("FAIL %s: %s" % (check, why), flush=True)
    os._exit(1)


def ok(check, detail=""):
    print("ok %s %s" % (check, detail), flush=True)


def coordinator(i, name=None):
    ep = ENDPOINTS[i % len(ENDPOINTS)]
    member = (name or "member-%d" % i).encode()
    c = coordination.get_coordinator(URL.format(ep), member)
    c.start(start_heart=True)
    return c


def stop_bounded(check, c):
    t0 = time.monotonic()
    done = threading.Event()

    def run():
        c.stop()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(STOP_BOUND):
        fail(check, "stop() did not return within %ss" % STOP_BOUND)
    return time.monotonic() - t0


def check_locks():
    a, b = coordinator(0), coordinator(1)
    la, lb = a.get_lock(b"apps-lock-" + RUN), b.get_lock(b"apps-lock-" + RUN)
    if not la.acquire(blocking=False):
        fail("lock", "first acquire failed")
    if lb.acquire(blocking=False):
        fail("lock", "second holder acquired a held lock")
    if not la.release():
        fail("lock", "release failed")
    if not lb.acquire(blocking=2):
        fail("lock", "acquire after release failed")
    lb.release()
    ok("lock", "exclusive, released, re-acquired")

    # Mutual exclusion under contention: 3 coordinators on 3 endpoints,
    # each entering the critical section several times.
    coords = [a, b, coordinator(2)]
    inside = [0]
    max_inside = [0]
    entries = [0]
    guard = threading.Lock()
    errors = []

    def worker(c):
        lock = c.get_lock(b"apps-mutex-" + RUN)
        for _ in range(5):
            if not lock.acquire(blocking=20):
                errors.append("acquire timed out")
                return
            with guard:
                inside[0] += 1
                entries[0] += 1
                max_inside[0] = max(max_inside[0], inside[0])
            time.sleep(0.05)
            with guard:
                inside[0] -= 1
            lock.release()

    ts = [threading.Thread(target=worker, args=(c,)) for c in coords]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
        if t.is_alive():
            fail("mutex", "a worker did not finish within 60s")
    if errors:
        fail("mutex", "; ".join(errors))
    if max_inside[0] != 1 or entries[0] != 15:
        fail("mutex", "max holders %d, entries %d" % (max_inside[0], entries[0]))
    ok("mutex", "15 entries, never two holders")
    for c in coords:
        stop_bounded("lock-stop", c)


def check_groups():
    a, b = coordinator(0), coordinator(1)
    g = b"apps-group-" + RUN
    a.create_group(g).get(timeout=10)
    try:
        b.create_group(g).get(timeout=10)
        fail("group", "creating an existing group succeeded")
    except coordination.GroupAlreadyExist:
        pass
    a.join_group(g, capabilities=b"cap-a").get(timeout=10)
    b.join_group(g, capabilities=b"cap-b").get(timeout=10)
    members = a.get_members(g).get(timeout=10)
    if set(members) != {b"member-0", b"member-1"}:
        fail("group", "members after joins: %r" % (members,))
    caps = b.get_member_capabilities(g, b"member-0").get(timeout=10)
    if caps != b"cap-a":
        fail("group", "capabilities of member-0: %r" % (caps,))
    if g not in a.get_groups().get(timeout=10):
        fail("group", "group not listed")
    a.leave_group(g).get(timeout=10)
    members = b.get_members(g).get(timeout=10)
    if set(members) != {b"member-1"}:
        fail("group", "members after leave: %r" % (members,))
    ok("group", "create, join, members, capabilities, leave")
    for c in (a, b):
        stop_bounded("group-stop", c)


def check_leader():
    """tooz's etcd3gw driver has no native election (run_watchers and
    get_leader are NotImplemented), so a leader is the holder of a tooz lock,
    kept by the driver's heartbeat (lease keepalive). Three candidates on
    three endpoints try the lock non-blocking over 12 s (more than twice the
    5 s lock TTL, so the lease must be renewed over the gateway): exactly one
    may hold it at any time. Then the leader stops and exactly one other
    takes over."""
    coords = [coordinator(i, "cand-%d" % i) for i in range(3)]
    locks = {c: c.get_lock(b"apps-leader-" + RUN) for c in coords}
    leader_of = {}  # coordinator -> time it became leader

    def round_(alive):
        for c in alive:
            c.heartbeat()
            if c not in leader_of and locks[c].acquire(blocking=False):
                leader_of[c] = time.monotonic()
        holders = [c for c in alive if c in leader_of]
        if len(holders) > 1:
            fail("leader", "several leaders at once: %r" %
                 ([h._member_id for h in holders],))
        return holders

    alive = list(coords)
    t_end = time.monotonic() + 12
    while time.monotonic() < t_end:
        round_(alive)
        time.sleep(0.2)
    holders = round_(alive)
    if len(holders) != 1:
        fail("leader", "no leader after 12s")
    leader = holders[0]
    ok("leader", "exactly one leader %s for 12s" % leader._member_id.decode())

    took = stop_bounded("leader-stop", leader)
    alive.remove(leader)
    del leader_of[leader]
    t0 = time.monotonic()
    new = []
    while time.monotonic() < t0 + 30:
        new = round_(alive)
        if new:
            break
        time.sleep(0.2)
    if len(new) != 1:
        fail("leader-failover", "nobody took over within 30s")
    ok("leader-failover", "%s after %.1fs (stop() took %.1fs)" % (
        new[0]._member_id.decode(), time.monotonic() - t0, took))
    for c in alive:
        stop_bounded("leader-stop", c)
    ok("stop", "every stop() returned within %ss" % STOP_BOUND)


check_locks()
check_groups()
check_leader()
print("done", flush=True)
os._exit(0)
