#!/usr/bin/env bash
# Install (Debian package `postgresql`) and start a local PostgreSQL server on 127.0.0.1,
# create a database and a user for the experiments store tests, and print the line to
# evaluate:   eval "$(bash scripts/ci-postgres.sh)"   (progress goes to stderr).
# Idempotent: a second run reuses the installed server, the cluster, the role and the db.
set -euo pipefail

DB=${JAXCORE_PG_DB:-jaxcore_test}
ROLE=${JAXCORE_PG_USER:-jaxcore}
PASSWORD=${JAXCORE_PG_PASSWORD:-jaxcore}
log() { echo "[ci-postgres] $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  log "installing postgresql (apt-get)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
VERSION=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$VERSION main"; then
  log "creating cluster $VERSION/main"
  pg_createcluster "$VERSION" main >&2
fi
PORT=$(pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" {print $3}')
if ! pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" {print $4}' | grep -q online; then
  log "starting PostgreSQL $VERSION on 127.0.0.1:$PORT"
  pg_ctlcluster "$VERSION" main start >&2
fi
for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PORT" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PORT" >&2

psql_admin() { runuser -u postgres -- psql -p "$PORT" -v ON_ERROR_STOP=1 -qtA "$@"; }
if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != "1" ]; then
  log "creating role $ROLE"
  psql_admin -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'" >&2
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
  log "creating database $DB"
  psql_admin -c "CREATE DATABASE $DB OWNER $ROLE" >&2
fi
echo "export JAXCORE_TEST_POSTGRES_URL=postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
