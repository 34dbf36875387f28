#!/usr/bin/env bash
# Records page-access traces of real programs (nobody here wrote them) under valgrind lackey
# and reduces them to vmtier traces (docs/trace-format.md).
#
#   tests/traces/record.sh [redis|sqlite|all]     (default: all)
#
# Environment: SIM (vmtier-sim binary), OUT (output dir, default tests/traces),
# MAX (records kept per trace), SKIP (records skipped at start-up), REQUESTS (redis-benchmark -n).
# Installs (apt) what it needs: valgrind, redis-server + redis-benchmark (redis-tools), sqlite3.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIM=${SIM:-target/release/vmtier-sim}
OUT=${OUT:-tests/traces}
MAX=${MAX:-1500000}
SKIP=${SKIP:-500000}
REQUESTS=${REQUESTS:-20000}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

[ -x "$SIM" ] || cargo build --release -p vmtier-policies --bin vmtier-sim
# Only recording needs these programs, so only recording installs them.
need=()
for pkg in valgrind redis-server redis-tools sqlite3; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "record.sh: installing ${need[*]}"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

lackey() { # lackey LOGFIFO CMD...
    local log=$1; shift
    valgrind --tool=lackey --trace-mem=yes --log-file="$log" "$@"
}

record_redis() {
    local port=6399 fifo="$WORK/redis.fifo"
    mkfifo "$fifo"
    "$SIM" record-lackey --out "$OUT/redis.vmt.gz" --skip-records "$SKIP" --max-records "$MAX" <"$fifo" &
    local reader=$!
    lackey "$fifo" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --logfile "$WORK/redis.log" &
    local server=$!
    for _ in $(seq 1 120); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 1
    done
    # Bounded load against the local server only; it stops by itself, or when the reader has
    # kept enough records.
    timeout 900 redis-benchmark -h 127.0.0.1 -p "$port" -n "$REQUESTS" -r 200000 -d 256 -c 4 \
        -t set,get,lpush,lpop,sadd,hset -q >"$WORK/bench.log" 2>&1 &
    local bench=$!
    wait "$reader"
    kill "$bench" 2>/dev/null || true
    wait "$bench" 2>/dev/null || true
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$server" 2>/dev/null || true
    wait "$server" || true
}

record_sqlite() {
    local fifo="$WORK/sqlite.fifo"
    mkfifo "$fifo"
    "$SIM" record-lackey --out "$OUT/sqlite.vmt.gz" --skip-records "$SKIP" --max-records "$MAX" <"$fifo" &
    local reader=$!
    cat >"$WORK/load.sql" <<'SQL'
PRAGMA cache_size = -65536;
CREATE TABLE t(a INTEGER PRIMARY KEY, b INTEGER, c TEXT);
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 60000)
  INSERT INTO t SELECT i, abs(random()) % 5000, hex(randomblob(48)) FROM s;
CREATE INDEX tb ON t(b);
SELECT count(*), sum(length(c)) FROM t WHERE b BETWEEN 100 AND 400;
SELECT b, count(*) FROM t GROUP BY b ORDER BY 2 DESC LIMIT 5;
UPDATE t SET c = hex(randomblob(48)) WHERE b < 250;
SELECT count(*) FROM t AS x JOIN t AS y ON x.b = y.b WHERE x.a < 2000 AND y.a < 20000;
SELECT max(c) FROM t WHERE b BETWEEN 1000 AND 1100;
DELETE FROM t WHERE a % 7 = 0;
SELECT count(*), avg(b) FROM t;
SQL
    lackey "$fifo" sqlite3 ':memory:' <"$WORK/load.sql" >/dev/null || true
    wait "$reader"
}

case "${1:-all}" in
    redis) record_redis ;;
    sqlite) record_sqlite ;;
    all) record_redis; record_sqlite ;;
    *) echo "usage: $0 [redis|sqlite|all]" >&2; exit 2 ;;
esac
ls -l "$OUT"/*.vmt.gz
