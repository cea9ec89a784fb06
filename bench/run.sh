#!/usr/bin/env bash
# The benchmark of SPEC §8 (PF-1 … PF-4), for a person to run — never part of the tests.
# Seeds scales 1, 10 and 100 on a throw-away PostgreSQL and compares sexton with the raw floor
# and the naive delete on identical copies, under a concurrent application writer. Prints a
# markdown table and writes bench/results/latest.{md,json}. About 25 minutes here.
# Then the short-lived records (TTL-1, TTL-4): a million expired handoffs and a million expired
# conversation events, expired by a sexton pass and by a raw batched delete, writer beside.
#   bash bench/run.sh                     # scales 1,10,100, then the short-lived records
#   bash bench/run.sh --scales 1,10       # a quicker look
#   bash bench/run.sh --only expiry       # the short-lived records alone (a few minutes),
#                                         # merged into the results files beside the scales
#   bash bench/run.sh --only expiry --expiry-rows 100000   # a quicker look at them
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
command -v /usr/bin/time >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
cargo build --release --quiet -p sexton --bin sexton
cargo build --release --quiet -p sexton-bench
pg_virtualenv -o shared_buffers=512MB -o max_wal_size=4GB -o max_connections=100 \
  target/release/sexton-bench "$@"
