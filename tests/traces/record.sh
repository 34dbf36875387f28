#!/usr/bin/env bash
# Records page-access traces of real programs (nobody here wrote them) under valgrind lackey
# and reduces them to vmtier traces (docs/trace-format.md).
#
#   tests/traces/record.sh [redis|sqlite|kv-zipf|db-scan|xz|py-gc|epochs|all]   (default: all)
#
# redis, sqlite: the first traces, a window of MAX merged records after SKIP (no epochs).
# kv-zipf, db-scan, xz, py-gc ("epochs" runs the four): whole runs of longer programs, reduced
# to epochs of EPOCH executed instructions with one merged record kept in SAMPLE
# (record-lackey --epoch-instructions/--sample-every, docs/trace-format.md; every run and its
# figures in tests/traces/README.md).
#
# Environment: SIM (vmtier-sim binary), OUT (output dir, default tests/traces),
# MAX (records kept per trace), SKIP (records skipped at start-up), REQUESTS (redis-benchmark -n),
# EPOCH (instructions per epoch, default 1000000), SAMPLE (keep 1 record in N, default 8),
# THIN (then keep 1 access in N of the written trace, vmtier-sim thin, default 4),
# MAX_EPOCHS (safety cap per trace, default 2000), SEED (sampling and load seed, default 1).
# Installs (apt) what it needs: valgrind, redis-server + redis-benchmark (redis-tools), sqlite3,
# xz-utils, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIM=${SIM:-target/release/vmtier-sim}
OUT=${OUT:-tests/traces}
MAX=${MAX:-1500000}
SKIP=${SKIP:-500000}
REQUESTS=${REQUESTS:-20000}
EPOCH=${EPOCH:-1000000}
SAMPLE=${SAMPLE:-8}
THIN=${THIN:-4}
MAX_EPOCHS=${MAX_EPOCHS:-2000}
SEED=${SEED:-1}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

[ -x "$SIM" ] || cargo build --release -p vmtier-sim --bin vmtier-sim
# Only recording needs these programs, so only recording installs them.
need=()
for pkg in valgrind redis-server redis-tools sqlite3 xz-utils python3; do
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

# Epoch recordings: the reducer reads lackey's log from a FIFO and writes NAME.vmt.gz.
# Then every THIN-th access of it is kept (vmtier-sim thin: a second stratified sample).
epoch_reader() { # epoch_reader NAME FIFO
    "$SIM" record-lackey --out "$WORK/$1.vmt.gz" --epoch-instructions "$EPOCH" \
        --sample-every "$SAMPLE" --max-epochs "$MAX_EPOCHS" --seed "$SEED" \
        --max-records 100000000 <"$2"
    "$SIM" thin --trace "$WORK/$1.vmt.gz" --every "$THIN" --seed "$SEED" --out "$OUT/$1.vmt.gz"
    "$SIM" stat --trace "$OUT/$1.vmt.gz"
}

# A key-value store under a skewed load: redis-server (recorded) loaded with KV_KEYS keys of
# 512 B, then KV_OPS requests, 90 % GET / 10 % SET, keys drawn from a Zipf(0.99) law over the
# keys in a random order; halfway the order is redrawn (the hot keys change). The client is
# redis-cli --pipe on commands generated up front (Python, seeded).
record_kv_zipf() {
    local port=6398 fifo="$WORK/kv.fifo"
    local keys=${KV_KEYS:-8000} ops=${KV_OPS:-30000}
    python3 - "$keys" "$ops" "$SEED" >"$WORK/kv.resp" <<'PY'
import bisect, random, sys
keys, ops, seed = map(int, sys.argv[1:])
rnd = random.Random(seed)
out = sys.stdout.buffer
def cmd(*args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
def value():
    return rnd.randbytes(256).hex().encode()
for k in range(keys):
    cmd(b"SET", b"key:%d" % k, value())
cdf, acc = [], 0.0
for r in range(1, keys + 1):
    acc += r ** -0.99
    cdf.append(acc)
for phase in range(2):
    order = list(range(keys))
    rnd.shuffle(order)
    for _ in range(ops // 2):
        k = order[min(bisect.bisect_left(cdf, rnd.random() * acc), keys - 1)]
        if rnd.random() < 0.9:
            cmd(b"GET", b"key:%d" % k)
        else:
            cmd(b"SET", b"key:%d" % k, value())
PY
    mkfifo "$fifo"
    epoch_reader kv-zipf "$fifo" &
    local reader=$!
    lackey "$fifo" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --logfile "$WORK/kv.log" &
    local server=$!
    for _ in $(seq 1 120); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 1
    done
    timeout 3600 redis-cli -p "$port" --pipe --pipe-timeout 0 <"$WORK/kv.resp" >"$WORK/kv.pipe.log" 2>&1 || true
    redis-cli -p "$port" info memory | grep -E '^used_memory(_human)?:' || true
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$server" 2>/dev/null || true
    wait "$server" || true
    wait "$reader"
}

# A database whose working set is far beyond any budget: a DB_ROWS-row table (120 B payload,
# an index on b) is built natively, then sqlite3 (recorded) opens it with a 256 MiB page cache
# and runs full scans, uniform and skewed point queries and index range scans in turn.
record_db_scan() {
    local fifo="$WORK/db.fifo" rows=${DB_ROWS:-40000}
    sqlite3 "$WORK/db.sqlite" <<SQL
CREATE TABLE t(a INTEGER PRIMARY KEY, b INTEGER, c TEXT);
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $rows)
  INSERT INTO t SELECT i, abs(random()) % 10000, hex(randomblob(60)) FROM s;
CREATE INDEX tb ON t(b);
SQL
    cat >"$WORK/db.sql" <<SQL
PRAGMA cache_size = -262144;
PRAGMA mmap_size = 0;
SELECT count(*), sum(length(c)) FROM t WHERE b % 7 = 3;
WITH RECURSIVE r(i, k) AS (SELECT 0, 1 + abs(random()) % $rows UNION ALL
  SELECT i + 1, 1 + abs(random()) % $rows FROM r WHERE i < 5000)
  SELECT sum((SELECT length(c) FROM t WHERE a = k)) FROM r;
SELECT b, count(*) FROM t WHERE b BETWEEN 2000 AND 2600 GROUP BY b ORDER BY 2 DESC LIMIT 3;
WITH RECURSIVE r(i, k) AS (SELECT 0, 1 + abs(random()) % (1 + abs(random()) % $rows) UNION ALL
  SELECT i + 1, 1 + abs(random()) % (1 + abs(random()) % $rows) FROM r WHERE i < 5000)
  SELECT sum((SELECT b FROM t WHERE a = k)) FROM r;
SELECT count(*), max(c) FROM t WHERE a % 5 = 1;
WITH RECURSIVE r(i, k) AS (SELECT 0, abs(random()) % 10000 UNION ALL
  SELECT i + 1, abs(random()) % 10000 FROM r WHERE i < 3000)
  SELECT sum((SELECT count(*) FROM t WHERE b = k)) FROM r;
SELECT sum(a), avg(b) FROM t;
SQL
    mkfifo "$fifo"
    epoch_reader db-scan "$fifo" &
    local reader=$!
    lackey "$fifo" sqlite3 "$WORK/db.sqlite" <"$WORK/db.sql" >"$WORK/db.out" || true
    wait "$reader"
    cat "$WORK/db.out"
    ls -l "$WORK/db.sqlite"
}

# A compressor with phases: xz -6 (8 MiB dictionary, bt4 match finder) on XZ_KB KiB of text
# (this repository's sources), then as much of a binary (the vmtier-sim executable), then
# text again.
record_xz() {
    local fifo="$WORK/xz.fifo" kb=${XZ_KB:-64}
    # (head closes the pipe early: cat's SIGPIPE is expected.)
    { git ls-files -z -- '*.rs' '*.md' | xargs -0 cat 2>/dev/null | head -c $((kb * 1024)) || true
      head -c $((kb * 1024)) "$SIM"
      git ls-files -z -- '*.c' '*.h' '*.sh' '*.toml' | xargs -0 cat 2>/dev/null | head -c $((kb * 1024)) || true
    } >"$WORK/xz.in"
    mkfifo "$fifo"
    epoch_reader xz "$fifo" &
    local reader=$!
    lackey "$fifo" xz -6 -T1 -c "$WORK/xz.in" >"$WORK/xz.out"
    wait "$reader"
    ls -l "$WORK/xz.in" "$WORK/xz.out"
}

# A GC-heavy graph workload: Debian's CPython (/usr/bin/python3, recorded; -S: no site imports) builds a random graph of
# PY_NODES objects with 4 edges each, runs breadth-first searches from random roots while
# allocating short-lived lists, rebuilds a third of the graph (garbage in cycles) and runs
# full collections (gc.collect walks every object) between rounds.
record_py_gc() {
    local fifo="$WORK/py.fifo" nodes=${PY_NODES:-2500}
    cat >"$WORK/gc.py" <<'PY'
import gc, random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(seed)
class Node:
    __slots__ = ("id", "edges", "payload")
    def __init__(self, i):
        self.id, self.edges, self.payload = i, [], [i] * 8
nodes = [Node(i) for i in range(n)]
for v in nodes:
    v.edges = [nodes[rnd.randrange(n)] for _ in range(4)]
def bfs(root):
    seen, frontier, depth = {root.id}, [root], 0
    while frontier:
        nxt = []
        for v in frontier:
            for w in v.edges:
                if w.id not in seen:
                    seen.add(w.id)
                    nxt.append(w)
        frontier, depth = nxt, depth + 1
    return len(seen), depth
for rnd_no in range(3):
    print(rnd_no, bfs(nodes[rnd.randrange(n)]), bfs(nodes[rnd.randrange(n)]))
    for i in rnd.sample(range(n), n // 3):
        v = Node(i)
        v.edges = [nodes[rnd.randrange(n)] for _ in range(4)]
        nodes[i].edges.append(nodes[i])  # the old node becomes cyclic garbage
        nodes[i] = v
    print("collected", gc.collect())
PY
    mkfifo "$fifo"
    epoch_reader py-gc "$fifo" &
    local reader=$!
    lackey "$fifo" /usr/bin/python3 -S "$WORK/gc.py" "$nodes" "$SEED"
    wait "$reader"
}

case "${1:-all}" in
    redis) record_redis ;;
    sqlite) record_sqlite ;;
    kv-zipf) record_kv_zipf ;;
    db-scan) record_db_scan ;;
    xz) record_xz ;;
    py-gc) record_py_gc ;;
    epochs) record_kv_zipf; record_db_scan; record_xz; record_py_gc ;;
    all) record_redis; record_sqlite; record_kv_zipf; record_db_scan; record_xz; record_py_gc ;;
    *) echo "usage: $0 [redis|sqlite|kv-zipf|db-scan|xz|py-gc|epochs|all]" >&2; exit 2 ;;
esac
ls -l "$OUT"/*.vmt.gz
