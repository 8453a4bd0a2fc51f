#!/usr/bin/env bash
# Build gobench (etcd's tools/benchmark put/range, re-created on clientv3 3.4)
# from Debian packages only: no Go module download, no network but apt.
#
#   tools/gobench/build.sh            # -> tools/gobench/gobench
#   OUT=/tmp/gobench tools/gobench/build.sh
#
# Needs root for apt-get (skipped when everything is already there).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/gobench}"

# golang-go: the Go toolchain (1.19 on Debian 12).
# golang-etcd-server-dev: etcd 3.4.23 sources (clientv3, pkg/report) under
#   /usr/share/gocode; it depends on grpc, protobuf, zap, ... as golang-*-dev.
# cobra, pb.v1, x/time: what the benchmark itself imports.
pkgs=(golang-go golang-etcd-server-dev golang-github-spf13-cobra-dev
      golang-gopkg-cheggaaa-pb.v1-dev golang-golang-x-time-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >&2
fi

# GOPATH mode against Debian's source tree: no go.mod, no module proxy.
export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off
export GOCACHE="${GOCACHE:-/tmp/gobench-gocache}"
cd "$here"
go version >&2
go build -o "$out" .
echo "built $out" >&2
