#!/usr/bin/env bash
# The benchmark of SPEC §8, for a person to run — never part of the tests. What it measures and
# how is docs/benchmark.md; `--help` lists the parts and every option. It starts a throw-away
# PostgreSQL (and an S3-compatible server, s3s-fs, on loopback), builds sexton and the bench in
# release, runs the parts chosen and writes bench/results/latest.{md,json}.
#   bash bench/run.sh                                   # every part (about 3 hours)
#   bash bench/run.sh --only scales --scales 1,10       # a quicker look
#   bash bench/run.sh --only expiry --expiry-rows 100000
#   bash bench/run.sh --only traces,attachments --no-object-store
#   bash bench/run.sh --only scales --scales 10 --baseline-sexton /tmp/before/target/release/sexton
#                                                       # before and after a change, pair by pair
#   cargo run --release -p sexton-bench -- --render     # latest.md anew from latest.json
# --no-object-store leaves the S3-compatible server out (the results then hold no `… s3` rows).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
command -v /usr/bin/time >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
cargo build --release --quiet -p sexton --bin sexton
cargo build --release --quiet -p sexton-bench
release="${CARGO_TARGET_DIR:-target}/release"
object_store=yes
args=()
for arg in "$@"; do
  if [ "$arg" = --no-object-store ]; then object_store=no; else args+=("$arg"); fi
done
bench() {
  pg_virtualenv -t -o shared_buffers=512MB -o max_wal_size=4GB -o max_connections=100 \
    "$release/sexton-bench" --sexton "$release/sexton" "$@"
}
# The attachment bytes and run traces run on an S3-compatible server too (s3s-fs on loopback).
bench_with_object_store() {
  bench --s3-endpoint "$SEXTON_TEST_S3" --s3-dir "$SEXTON_TEST_S3_ROOT" "$@"
}
if [ "$object_store" = no ]; then
  bench "${args[@]}"
else
  ensure_s3s_fs
  with_s3s_fs bench_with_object_store "${args[@]}"
fi
