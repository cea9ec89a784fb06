#!/usr/bin/env bash
# The whole test suite against a throw-away local PostgreSQL (a fresh database per test), plus the
# formatting and lint gates. Installs PostgreSQL if it is missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
cargo fmt --all -- --check
cargo clippy --quiet --workspace --all-targets -- -D warnings
cargo build --quiet --workspace --all-targets
with_throwaway_postgres cargo test --workspace "$@"
