#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: Debian's postgresql (15), on a unix socket in DIR
# only (no TCP port), trust authentication for the user `sbx`, durability off (fsync,
# synchronous_commit) because its data dies with the run.
# Usage: tools/pg_test_server.sh start DIR   (DIR is wiped first; prints the socket directory)
#        tools/pg_test_server.sh stop DIR    (stops it, removes DIR; succeeds if none runs)
#        tools/pg_test_server.sh pause DIR   (stops it, keeps its data: a database outage)
#        tools/pg_test_server.sh resume DIR  (starts the paused server again on its data)
# As root, the server runs as the `postgres` user (PostgreSQL refuses root). URL of a database:
#   postgresql:///postgres?host=DIR&user=sbx
set -euo pipefail

cmd=${1:?usage: pg_test_server.sh start|stop|pause|resume DIR}
dir=${2:?usage: pg_test_server.sh start|stop|pause|resume DIR}
bin=${SBX_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[[ -x "$bin/pg_ctl" ]] || { echo "pg_test_server: no PostgreSQL server binaries (apt-get install postgresql)" >&2; exit 1; }

as_owner() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_server() {
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-k $dir -c listen_addresses= -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
    start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
}

case "$cmd" in
  start)
    if [[ -f "$dir/data/postmaster.pid" ]]; then as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"
    mkdir -p "$dir"
    [[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U sbx -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    start_server
    echo "$dir"
    ;;
  pause)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
    ;;
  resume)
    start_server
    ;;
  stop)
    if [[ -f "$dir/data/postmaster.pid" ]]; then
      as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
    fi
    rm -rf "$dir"
    ;;
  *) echo "pg_test_server: unknown command $cmd" >&2; exit 2 ;;
esac
