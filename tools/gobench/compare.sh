#!/usr/bin/env bash
# Alternate gobench (etcd's Go benchmark, re-created) and retcd-bench against
# one running server, same parameters, and tabulate ops/s, p99 and each tool's
# own CPU time per 1000 requests (from /usr/bin/time: user + sys of the whole
# process, start-up included), plus the server's CPU per 1000 requests.
#
#   EP=127.0.0.1:24379 SERVER_PID=1234 RUNS=3 OUT=/tmp/gobench-res tools/gobench/compare.sh
#
# Rows: put (10 conns, 100 clients, 50 000, sequential keys, 8 B keys, 256 B
# values, key space 100 000), range-s and range-l of one existing key
# (10 conns, 100 clients, 100 000). Round r runs go first when r is odd and
# retcd-bench first when r is even.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EP="${EP:-127.0.0.1:24379}"
RUNS="${RUNS:-3}"
OUT="${OUT:-/tmp/gobench-results}"
GOB="${GOB:-$here/gobench}"
RB="${RB:-$here/../../target/release/retcd-bench}"
ETCDCTL="${ETCDCTL:-/usr/bin/etcdctl}"
KEY="${RANGE_KEY:-benchkey}"
SERVER_PID="${SERVER_PID:-}"
WORKLOADS="${WORKLOADS:-put range-s range-l}"
if [[ -n $SERVER_PID ]]; then
  comm=$(cat "/proc/$SERVER_PID/comm")
  case $comm in bash|sh|nohup|dash) echo "SERVER_PID $SERVER_PID is a '$comm', not the server: give the server's own PID" >&2; exit 2 ;; esac
fi
mkdir -p "$OUT"
tsv="$OUT/results.tsv"
[[ -f $tsv ]] || printf 'workload\tround\ttool\tops_s\tp99_ms\tclient_cpu_ms_per_1k\tserver_cpu_ms_per_1k\terrors\n' > "$tsv"

server_cpu_ticks() {
  if [[ -n $SERVER_PID ]]; then
    # fields 14 (utime) and 15 (stime) of /proc/PID/stat, counted after "(comm)"
    sed 's/^.*) //' "/proc/$SERVER_PID/stat" | awk '{print $12 + $13}'
  else
    echo 0
  fi
}

common=(--endpoints "$EP" --conns 10 --clients 100)
args_for() { # workload -> subcommand args
  case $1 in
    put) echo "put --total 50000 --key-size 8 --val-size 256 --sequential-keys --key-space-size 100000" ;;
    range-s) echo "range $KEY --total 100000 --consistency s" ;;
    range-l) echo "range $KEY --total 100000 --consistency l" ;;
  esac
}
total_for() { case $1 in put) echo 50000 ;; *) echo 100000 ;; esac; }

run_one() { # tool workload round
  local tool=$1 w=$2 r=$3 bin
  case $tool in go) bin=$GOB ;; rust) bin=$RB ;; esac
  local f="$OUT/$w-$r-$tool"
  # shellcheck disable=SC2046
  local cmd=("$bin" "${common[@]}" $(args_for "$w"))
  echo "${cmd[*]}" > "$f.cmd"
  local s0 s1
  s0=$(server_cpu_ticks)
  /usr/bin/time -f '%U %S %e' -o "$f.time" "${cmd[@]}" > "$f.out" 2> "$f.err"
  s1=$(server_cpu_ticks)
  local n; n=$(total_for "$w")
  local rps p99 cpu scpu errs
  rps=$(grep -m1 'Requests/sec' "$f.out" | awk '{print $2}')
  p99=$(grep -m1 '^  99% in' "$f.out" | awk '{printf "%.1f", $3 * 1000}')
  cpu=$(awk -v n="$n" '{printf "%.1f", ($1 + $2) * 1e6 / n}' "$f.time")
  scpu=$(awk -v a="$s0" -v b="$s1" -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", (b - a) / hz * 1e6 / n}')
  errs=$(grep -c -i 'error distribution' "$f.out" || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$w" "$r" "$tool" "$rps" "$p99" "$cpu" "$scpu" "$errs" | tee -a "$tsv"
}

# the one key the range rows read (256-byte value, like the put rows)
"$ETCDCTL" --endpoints "$EP" put "$KEY" "$(head -c 256 /dev/zero | tr '\0' v)" > /dev/null

for w in $WORKLOADS; do
  for r in $(seq 1 "$RUNS"); do
    if (( r % 2 )); then order=(go rust); else order=(rust go); fi
    for t in "${order[@]}"; do run_one "$t" "$w" "$r"; sleep 2; done
  done
done

python3 - "$tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("\nmedians (%s)" % sys.argv[1])
print("| workload | tool | runs | ops/s (each) | median ops/s | median p99 ms | client CPU ms/1000 req | server CPU ms/1000 req |")
print("|---|---|---:|---|---:|---:|---:|---:|")
for w in dict.fromkeys(r["workload"] for r in rows):
    for t in ("go", "rust"):
        rs = [r for r in rows if r["workload"] == w and r["tool"] == t]
        if not rs: continue
        med = lambda k: statistics.median(float(r[k]) for r in rs)
        each = ", ".join("%.0f" % float(r["ops_s"]) for r in rs)
        name = "gobench (Go)" if t == "go" else "retcd-bench"
        print("| %s | %s | %d | %s | %.0f | %.1f | %.1f | %.1f |" % (w, name, len(rs), each, med("ops_s"), med("p99_ms"), med("client_cpu_ms_per_1k"), med("server_cpu_ms_per_1k")))
PY
