#!/usr/bin/env bash
# The whole test suite against a throw-away local PostgreSQL (a fresh database per test), plus the
# formatting and lint gates, the Prometheus alert rules and the Dockerfile's lint. Installs
# PostgreSQL, Prometheus, faketime, hadolint, PgBouncer and s3s-fs if they are missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
ensure_prometheus
ensure_faketime
ensure_hadolint
ensure_pgbouncer
ensure_chromium
ensure_s3s_fs
promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml)
"$HADOLINT" deploy/Dockerfile
cargo fmt --all -- --check
cargo clippy --quiet --workspace --all-targets -- -D warnings
cargo build --quiet --workspace --all-targets
with_throwaway_postgres cargo test --workspace "$@"
# ER-2 stops and restarts its PostgreSQL, hl3 reads the cluster's WAL rate and hl4's replication
# slot lags for every test: each runs alone, one after the other, on a cluster of their own.
with_throwaway_postgres cargo test --test tests -- --ignored --test-threads=1 er2_ hl3_ hl4_
# OS-5: the file tests that hold on both backends again, their roots in buckets of a real
# S3-compatible server (tests/common/backend.rs), the SIGKILL tests (EX-8, RQ-3) and every
# erasure test (RQ-1 … RQ-5) and `doctor`'s (OP-7: a bucket's versioning read) among them; and
# the rules of object storage alone (tests/objects.rs) and behind a store that throttles
# (tests/throttling.rs), ignored in the local pass.
with_s3s_fs with_throwaway_postgres cargo test --test tests -- --include-ignored objects:: \
  ex8_workers_killed ex3_a_file_still_referenced ex3_ex4_detail_goes ex3_a_file_recorded_before_a_crash \
  ex3_a_drain_beside ex3_files_of_many ss6_history_goes at1_the_files_mtime_decides \
  at1_a_missing_file at1_many_attachments at1_the_artifacts_root \
  er3_a_file_deleted_or_rewritten_between_plan tr2_age_first_then_quota tr2_live_traces_count \
  tr2_traces_older_than_the_age tr2_with_no_quota tr3_a_live_session_spelled_otherwise tr3_a_second_cleaner \
  tr3_the_trace_of_a_live_session tr4_the_background_job tr4_the_dry_run \
  at1_overlapping_roots ex3_an_output_path_naming_a_directory ex3_another_spelling_of_a_referenced \
  ss6_a_session_directory_of_any_depth ss6_workers_killed ss6_er3_a_removal_that_never_reports \
  explain_attachments_agree explain_traces_agree erasure:: doctor:: orphans:: throttling::
