#!/usr/bin/env bash
# Runs `sexton demo` against a throw-away local PostgreSQL: migrate, seed demo data, one nightly
# pass through the queue, before/after report. Installs PostgreSQL if it is missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(repo_root)"
ensure_cargo
ensure_postgres
cargo build --quiet --bin sexton
with_throwaway_postgres target/debug/sexton demo "$@"
