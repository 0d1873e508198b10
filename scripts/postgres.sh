#!/usr/bin/env bash
# A throw-away PostgreSQL server for the twopc-pg tests.
#
#   scripts/postgres.sh start     install (Debian's packages) if absent, create
#                                 the cluster if absent, start it, print the URL
#   scripts/postgres.sh restart   restart the server (prepared transactions
#                                 survive: the tests rely on this)
#   scripts/postgres.sh stop      stop the server and delete the cluster
#   scripts/postgres.sh status    exit 0 when running
#   scripts/postgres.sh url       print the export line again
#   scripts/postgres.sh standby   a hot standby of the server on
#                                 TWOPC_PRIMARY_PORT (streaming replication,
#                                 created with pg_basebackup if absent), on
#                                 TWOPC_PG_PORT; prints an export of
#                                 TWOPC_PG_STANDBY_URL. The tests use it to
#                                 check that a sink pointed at a standby is
#                                 refused by name:
#     eval "$(TWOPC_PG_PORT=54331 TWOPC_PRIMARY_PORT=54329 scripts/postgres.sh standby)"
#
# `start` prints one line on stdout, an export of the connection URL, so
#   eval "$(scripts/postgres.sh start)"
# sets it in the calling shell. Everything else goes to stderr.
#
# Environment:
#   TWOPC_PG_PORT          port on 127.0.0.1 (default 54329)
#   TWOPC_PG_DIR           cluster directory (default /tmp/twopc-pg-<port>, so
#                          two clusters on two ports never share one)
#   TWOPC_PG_MAX_PREPARED  max_prepared_transactions (64 for a new cluster;
#                          when unset, an existing cluster keeps its value, so
#                          `restart` never changes it by accident). With 0 the
#                          URL is exported as TWOPC_PG_URL_NO_2PC: that server
#                          is the one the start-up rejection test needs:
#     eval "$(TWOPC_PG_PORT=54330 TWOPC_PG_MAX_PREPARED=0 scripts/postgres.sh start)"
#   TWOPC_PG_SETTINGS      more server settings, separated by ';', e.g.
#                          "max_wal_size = 8GB; shared_buffers = 1GB" (the
#                          benchmark's bulk-load settings); rewritten at every
#                          start like the rest
#
# The server refuses to run as root, so as root the cluster is owned by and
# run as the `postgres` user (created by Debian's package); as any other user
# it runs as that user. It listens on 127.0.0.1 only and accepts the test
# user with a password (scram-sha-256).
set -euo pipefail

PORT="${TWOPC_PG_PORT:-54329}"
DIR="${TWOPC_PG_DIR:-/tmp/twopc-pg-$PORT}"
DATA="$DIR/data"
# Marks a directory this script created, so `stop` never deletes anything
# else that TWOPC_PG_DIR may point at.
MARKER="$DIR/.twopc-pg-cluster"
LOG="$DIR/server.log"
# Test credentials of a throw-away cluster, not a secret. The password
# differs from the user name so that tests can check that it never shows up
# in messages (a password equal to the user name would be everywhere).
USER_NAME=twopc
PASSWORD=twopc-test-pw
DB_NAME=twopc

say() { printf '[postgres.sh] %s\n' "$*" >&2; }

# The setting in force: the environment's, else the cluster's, else 64.
max_prepared() {
    if [ -n "${TWOPC_PG_MAX_PREPARED:-}" ]; then
        echo "$TWOPC_PG_MAX_PREPARED"
    else
        sed -n 's/^max_prepared_transactions = //p' "$DATA/twopc.conf" 2>/dev/null | grep . || echo 64
    fi
}

url_line() {
    local var=TWOPC_PG_URL
    [ "$(max_prepared)" = 0 ] && var=TWOPC_PG_URL_NO_2PC
    [ -f "$DATA/standby.signal" ] && var=TWOPC_PG_STANDBY_URL
    echo "export $var=postgres://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/$DB_NAME"
}

find_bindir() {
    # Newest installed server version; Debian keeps them side by side.
    local d
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
        echo "$d"
        return 0
    fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

ensure_installed() {
    if BIN="$(find_bindir)"; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "PostgreSQL is not installed; installing Debian's package 'postgresql'"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        BIN="$(find_bindir)" || { say "installed 'postgresql' but found no initdb/pg_ctl"; exit 3; }
        return 0
    fi
    say "PostgreSQL server binaries (initdb, pg_ctl) are missing. Install them with:"
    say "    sudo apt-get install -y postgresql"
    say "then run this again (as a normal user, or as root)."
    exit 3
}

# Runs a server binary as the user that owns the cluster.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        if ! id postgres >/dev/null 2>&1; then
            say "running as root needs the 'postgres' user (Debian's package creates it)"
            exit 3
        fi
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

is_running() {
    [ -f "$DATA/PG_VERSION" ] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_admin() {
    # Superuser over the cluster's own Unix socket (trust auth, local only).
    as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres -d postgres "$@"
}

write_settings() {
    # Rewritten at every start so a changed TWOPC_PG_MAX_PREPARED applies.
    local mp
    mp="$(max_prepared)"
    case "$mp" in
    '' | *[!0-9]*)
        say "TWOPC_PG_MAX_PREPARED must be a number, not '$mp'"
        exit 2
        ;;
    esac
    as_owner sh -c "cat > '$DATA/twopc.conf'" <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_prepared_transactions = $mp
max_connections = 200
password_encryption = 'scram-sha-256'
$(printf '%s\n' "${TWOPC_PG_SETTINGS:-}" | tr ';' '\n' | sed 's/^ *//')
EOF
}

# Makes $DIR for a new cluster, marked as this script's, owned by the
# cluster's user; refuses a directory someone else filled.
make_cluster_dir() {
    if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ] && [ ! -e "$MARKER" ]; then
        say "$DIR exists and was not created by this script; choose another TWOPC_PG_DIR"
        exit 1
    fi
    mkdir -p "$DIR"
    touch "$MARKER"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$DIR"
    fi
    chmod 700 "$DIR"
}

create_cluster() {
    say "creating cluster in $DATA (port $PORT, max_prepared_transactions=$(max_prepared))"
    make_cluster_dir
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 >"$DIR/initdb.log" 2>&1 || {
        cat "$DIR/initdb.log" >&2
        exit 1
    }
    as_owner sh -c "echo \"include_if_exists = 'twopc.conf'\" >> '$DATA/postgresql.conf'"
}

start_server() {
    write_settings
    # The port can be taken for a while by a client's socket: our ports lie in
    # the kernel's ephemeral range, and a connection that just ended (say,
    # pg_isready to the other test server) keeps its local port in TIME_WAIT
    # for up to a minute. Wait that out instead of failing the run.
    local attempt
    for attempt in $(seq 1 20); do
        if as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null; then
            return 0
        fi
        if ! tail -n 20 "$LOG" 2>/dev/null | grep -q "Address already in use"; then
            break
        fi
        say "port $PORT is in use (attempt $attempt of 20); trying again in 5 s"
        sleep 5
    done
    say "the server did not start; last lines of $LOG:"
    tail -n 20 "$LOG" >&2 || true
    exit 1
}

create_user_and_db() {
    # Idempotent: only what is missing is created. CREATEROLE lets the tests
    # create a role without rights for the start-up rejection test; the test
    # user is deliberately not a superuser. pg_checkpoint (PostgreSQL 15+)
    # lets the benchmark write out the server's dirty state between runs.
    psql_admin <<EOF
SELECT 'CREATE ROLE $USER_NAME LOGIN CREATEROLE PASSWORD ''$PASSWORD'''
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$USER_NAME') \gexec
SELECT 'CREATE DATABASE $DB_NAME OWNER $USER_NAME'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$DB_NAME') \gexec
SELECT 'GRANT pg_checkpoint TO $USER_NAME'
WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pg_checkpoint') \gexec
EOF
}

wait_ready() {
    local i
    for i in $(seq 1 60); do
        if as_owner "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -d "$DB_NAME" -U "$USER_NAME"; then
            return 0
        fi
        sleep 0.5
    done
    say "the server on 127.0.0.1:$PORT is not accepting connections; see $LOG"
    exit 1
}

cmd="${1:-start}"
case "$cmd" in
start)
    ensure_installed
    if [ ! -f "$DATA/PG_VERSION" ]; then
        create_cluster
    fi
    if is_running; then
        say "already running on 127.0.0.1:$PORT ($DATA)"
    else
        start_server
        say "started on 127.0.0.1:$PORT ($DATA, log $LOG)"
    fi
    create_user_and_db
    wait_ready
    url_line
    ;;
standby)
    ensure_installed
    primary="${TWOPC_PRIMARY_PORT:?set TWOPC_PRIMARY_PORT to the port of the server to replicate}"
    if [ ! -f "$DATA/PG_VERSION" ]; then
        say "creating a hot standby of the server on port $primary in $DATA (port $PORT)"
        make_cluster_dir
        # Over the primary's Unix socket, where initdb's default rules trust
        # local replication connections. -R writes standby.signal and the
        # primary_conninfo the standby streams from.
        as_owner "$BIN/pg_basebackup" -h "/tmp/twopc-pg-$primary" -p "$primary" -U postgres \
            -D "$DATA" -R -X stream >"$DIR/basebackup.log" 2>&1 || {
            cat "$DIR/basebackup.log" >&2
            exit 1
        }
    fi
    if is_running; then
        say "already running on 127.0.0.1:$PORT ($DATA)"
    else
        # The copied settings name the primary's port and socket: rewritten.
        start_server
        say "started a hot standby on 127.0.0.1:$PORT ($DATA, log $LOG)"
    fi
    wait_ready
    url_line
    ;;
restart)
    ensure_installed
    if [ ! -f "$DATA/PG_VERSION" ]; then
        say "no cluster in $DATA; run '$0 start' first"
        exit 1
    fi
    write_settings
    # Fast shutdown: sessions are disconnected, prepared transactions stay.
    as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 -m fast restart >/dev/null
    wait_ready
    say "restarted on 127.0.0.1:$PORT"
    ;;
stop)
    ensure_installed
    if is_running; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -w -t 60 -m fast stop >/dev/null
        say "stopped the server on port $PORT"
    fi
    if [ -e "$MARKER" ]; then
        rm -rf "$DIR"
        say "removed $DIR"
    elif [ -e "$DIR" ]; then
        say "left $DIR in place: it was not created by this script"
    fi
    ;;
status)
    ensure_installed
    if is_running; then
        say "running on 127.0.0.1:$PORT ($DATA)"
    else
        say "not running (port $PORT, $DATA)"
        exit 1
    fi
    ;;
url)
    url_line
    ;;
*)
    say "usage: $0 start|restart|stop|status|url|standby"
    exit 2
    ;;
esac
