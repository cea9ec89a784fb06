#!/usr/bin/env bash
# Runs `sexton demo` against a throw-away local PostgreSQL: migrate, seed demo data, one nightly
# pass through the queue, before/after report, then one conversation and one session erased on
# request with their receipts. Installs PostgreSQL if it is missing.
#   bash scripts/demo.sh                  # file roots on the local disk
#   bash scripts/demo.sh --object-store   # every file root in a bucket of a local S3-compatible
#                                         # server (s3s-fs, built once from crates.io): the seed
#                                         # writes the bucket's directory, sexton reaches the
#                                         # files through the S3 API only
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
cargo build --quiet --bin sexton
if [ "${1:-}" != "--object-store" ]; then
  with_throwaway_postgres "${CARGO_TARGET_DIR:-target}/debug/sexton" demo "$@"
  exit
fi
shift
ensure_s3s_fs
# with_s3s_fs names the server's endpoint and data directory; the bucket "demo" is a directory
# of it, and each root a prefix in the bucket.
with_s3s_fs with_throwaway_postgres bash -c '
  mkdir -p "$SEXTON_TEST_S3_ROOT/demo"
  export SEXTON_DEMO_DIR="$SEXTON_TEST_S3_ROOT/demo"
  for root in output attachments sessions traces; do
    prefix="${root/output/outputs}"
    export "SEXTON_PATHS__${root^^}_ROOT=s3://demo/$prefix"
  done
  export SEXTON_STORAGE__ENDPOINT="$SEXTON_TEST_S3" SEXTON_STORAGE__REGION=us-east-1 \
    SEXTON_STORAGE__PATH_STYLE=true SEXTON_STORAGE__ALLOW_HTTP=true \
    SEXTON_STORAGE__ACCESS_KEY_ID=sexton-test SEXTON_STORAGE__SECRET_ACCESS_KEY=sexton-test-secret
  exec "${CARGO_TARGET_DIR:-target}/debug/sexton" demo "$@"' _ "$@"
