#!/usr/bin/env bash
# The whole test suite against a throw-away local PostgreSQL (a fresh database per test), plus the
# formatting and lint gates, the Prometheus alert rules and the Dockerfile's lint. Installs
# PostgreSQL, Prometheus, faketime, hadolint and PgBouncer if they are missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
ensure_prometheus
ensure_faketime
ensure_hadolint
ensure_pgbouncer
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
