#!/usr/bin/env bash
# Makes sure a PostgreSQL server accepts connections on 127.0.0.1:5432 as user postgres
# without a password (trust), for QSM's tests and benchmarks: reuses one that runs, starts an
# installed one, or installs Debian's and starts it. Idempotent; safe to run concurrently
# (a lock serialises the installers). Never run this on a production database host: it sets
# trust authentication for local TCP connections of the cluster it creates.
set -euo pipefail
HOST=${QSM_PG_HOST:-127.0.0.1}
PORT=${QSM_PG_PORT:-5432}

ready() { pg_isready -q -h "$HOST" -p "$PORT" 2>/dev/null || \
  (command -v psql >/dev/null && psql -h "$HOST" -p "$PORT" -U postgres -Atc 'select 1' postgres >/dev/null 2>&1); }

ready && exit 0
exec 9>/tmp/qsm-ensure-postgres.lock
flock 9
ready && exit 0

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
if ! command -v pg_ctlcluster >/dev/null; then
  echo "ensure-postgres: installing PostgreSQL from Debian's packages" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
# The newest installed cluster, created if there is none.
cluster=$(pg_lsclusters -h 2>/dev/null | sort -k1,1V | tail -1 || true)
if [ -z "$cluster" ]; then
  ver=$(ls /usr/lib/postgresql | sort -V | tail -1)
  $SUDO pg_createcluster "$ver" main -p "$PORT" >/dev/null
  cluster=$(pg_lsclusters -h | sort -k1,1V | tail -1)
fi
ver=$(echo "$cluster" | awk '{print $1}')
name=$(echo "$cluster" | awk '{print $2}')
conf=/etc/postgresql/$ver/$name
if ! grep -q '^# qsm-test-trust' "$conf/pg_hba.conf"; then
  $SUDO sh -c "printf '# qsm-test-trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' | cat - '$conf/pg_hba.conf' > '$conf/pg_hba.conf.new' && mv '$conf/pg_hba.conf.new' '$conf/pg_hba.conf'"
fi
$SUDO pg_ctlcluster "$ver" "$name" start 2>/dev/null || $SUDO pg_ctlcluster "$ver" "$name" reload
for _ in $(seq 1 60); do
  ready && exit 0
  sleep 0.5
done
echo "ensure-postgres: PostgreSQL did not come up on $HOST:$PORT" >&2
exit 1
