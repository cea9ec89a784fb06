#!/usr/bin/env bash
# The benchmark of SPEC §8 (PF-1 … PF-4), for a person to run — never part of the tests.
# Seeds scales 1, 10 and 400 (scale 400 is about a million runs) on a throw-away PostgreSQL and
# compares sexton with the raw floor and the naive delete on identical copies, under a concurrent
# application writer, with each method's WAL; at scale 10 sexton runs once more under a WAL
# budget. Prints a markdown table and a summary of the PF targets and writes
# bench/results/latest.{md,json}. Scale 400 takes most of the time (the file-side parts below
# take about 20 minutes more).
# Then the short-lived records (TTL-1, TTL-4): a million expired handoffs and a million expired
# conversation events, expired by a sexton pass and by a raw batched delete, writer beside.
# Then run traces (TR-1 … TR-4): `sexton traces clean` against `find -delete` by age, and sexton
# by quota, on trees of 10 k, 100 k and 1 M files written under --scratch (about 6 GB free needed
# at 1 M: a file takes a 4 KiB block or two), with peak RSS; the page cache is dropped before
# each method when this runs as root. Then attachment bytes (AT-1): 100 k rows with files, a pass through the
# queue against a plain stat-and-unlink loop. Attachment bytes and run traces run again on an
# S3-compatible server on loopback (s3s-fs, built once from crates.io) against a plain
# list-and-delete loop on the same server.
#   bash bench/run.sh                     # all of it
#   bash bench/run.sh --scales 1,10       # a quicker look
#   bash bench/run.sh --only scales --scales 400 --methods sexton,raw+markers+files
#                                         # two methods side by side (about 20 minutes)
#   bash bench/run.sh --only expiry       # the short-lived records alone (a few minutes),
#                                         # merged into the results files beside the scales
#   bash bench/run.sh --only expiry --expiry-rows 100000   # a quicker look at them
#   bash bench/run.sh --only traces,attachments   # the file-side jobs alone (about 20 minutes)
#   bash bench/run.sh --only traces --trace-files 10000,100000   # a quicker look at traces
#   bash bench/run.sh --only traces,attachments --sexton /tmp/sexton   # a binary built earlier
#   bash bench/run.sh --no-object-store   # without the S3-compatible server (about 25 minutes
#                                         # less; the results then hold no object-store rows)
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
command -v /usr/bin/time >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
cargo build --release --quiet -p sexton --bin sexton
cargo build --release --quiet -p sexton-bench
object_store=yes
args=()
for arg in "$@"; do
  if [ "$arg" = --no-object-store ]; then object_store=no; else args+=("$arg"); fi
done
bench() {
  pg_virtualenv -t -o shared_buffers=512MB -o max_wal_size=4GB -o max_connections=100 \
    target/release/sexton-bench "$@"
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
