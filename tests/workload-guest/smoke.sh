#!/bin/bash
# smoke.sh - quick checks of the workload guest under single-level TCG.
#
# Needs only qemu-system-x86_64 (and gdb for the corruption-kinds check,
# skipped without it); no testbed. Builds the guest first. Prints
# "ok NAME" / "FAIL NAME" per check and "N passed, N failed"; exits non-zero
# if any check failed. Takes about 25 s.
#
#   tests/workload-guest/smoke.sh            # O defaults to target/workload-guest
#   O=/tmp/wg QEMU=/path/to/qemu tests/workload-guest/smoke.sh

set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
O=${O:-$root/target/workload-guest}
QEMU=${QEMU:-qemu-system-x86_64}
ELF=$O/workload.elf

tmp=$(mktemp -d)
bg_pid=
cleanup() {
	[ -n "$bg_pid" ] && kill "$bg_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0

ok() {
	echo "ok $1"
	passed=$((passed + 1))
}

# bad NAME WHY [LOG]: report a failure with the tail of the guest log.
bad() {
	echo "FAIL $1: $2"
	[ -n "${3:-}" ] && [ -f "$3" ] && tail -n 15 "$3" | sed 's/^/    /'
	failed=$((failed + 1))
}

finish() {
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit
}

qemu_args() {
	echo -accel tcg -m 64M -kernel "$ELF" -display none -nodefaults \
		-no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4
}

# run NAME APPEND: boot the guest, serial log in $tmp/NAME.log, status in $rc.
# isa-debug-exit: status 1 = clean, 3 = corruption, 5 = bad input.
run() {
	local name=$1 append=$2

	# shellcheck disable=SC2046
	timeout 30 "$QEMU" $(qemu_args) -append "$append" \
		-serial "file:$tmp/$name.log" >"$tmp/$name.qemu" 2>&1
	rc=$?
}

# count PATTERN NAME: number of log lines matching an extended regex.
count() {
	grep -cE "$1" "$tmp/$2.log"
}

# field KEY LINE: value of KEY=value in a protocol line.
field() {
	sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"
}

if ! make -s -C "$here" O="$O"; then
	bad build "make failed"
	finish
fi

check_clean() {
	local n=clean log=$tmp/clean.log

	run $n "hot=4M duration=3"
	if [ "$rc" -ne 1 ]; then
		bad $n "exit status $rc, want 1" "$log"
	elif [ "$(count '^WG done corrupted=0 ' $n)" -ne 1 ]; then
		bad $n "no 'WG done corrupted=0'" "$log"
	elif [ "$(count '^WG (start|filled|verified) ' $n)" -ne 3 ]; then
		bad $n "missing start/filled/verified line" "$log"
	elif [ "$(count '^WG progress ' $n)" -lt 2 ]; then
		bad $n "fewer than 2 progress lines" "$log"
	else
		ok $n
	fi
}

check_inject() {
	local n=inject log=$tmp/inject.log inj bad_gpa

	run $n "hot=4M duration=2 inject=1 seed=42"
	inj=$(field gpa "$(grep '^WG inject ' "$log")")
	bad_gpa=$(field gpa "$(grep '^WG corrupt ' "$log")")
	if [ "$rc" -ne 3 ]; then
		bad $n "exit status $rc, want 3" "$log"
	elif [ "$(count '^WG corrupt ' $n)" -ne 1 ]; then
		bad $n "want exactly one WG corrupt line" "$log"
	elif [ -z "$inj" ] || [ $((inj)) -ne $((bad_gpa)) ]; then
		bad $n "corrupt gpa '$bad_gpa' != inject gpa '$inj'" "$log"
	elif [ "$(count '^WG done corrupted=1 ' $n)" -ne 1 ]; then
		bad $n "no 'WG done corrupted=1'" "$log"
	else
		ok $n
	fi
}

check_zipf_shift() {
	local n=zipf-shift log=$tmp/zipf-shift.log from to last

	run $n "pattern=zipf hot=4M shift_after=1 duration=2"
	from=$(field hot_start "$(grep '^WG start ' "$log")")
	to=$(field hot_start "$(grep '^WG hotshift ' "$log")")
	last=$(field hot_start "$(grep '^WG progress ' "$log" | tail -n 1)")
	if [ "$rc" -ne 1 ]; then
		bad $n "exit status $rc, want 1" "$log"
	elif [ "$(count '^WG hotshift ' $n)" -ne 1 ]; then
		bad $n "want exactly one WG hotshift line" "$log"
	elif [ $((to)) -ne $((from + 4 * 1024 * 1024)) ] || [ "$last" != "$to" ]; then
		bad $n "hot set went $from -> $to (last progress $last)" "$log"
	elif [ "$(count '^WG done corrupted=0 ' $n)" -ne 1 ]; then
		bad $n "no 'WG done corrupted=0'" "$log"
	else
		ok $n
	fi
}

# A hot set that wraps past the end of the fill area, all writes.
check_seq_wrap() {
	local n=seq-wrap log=$tmp/seq-wrap.log

	run $n "pattern=seq hot=8M hot_offset=56M write_pct=100 duration=1"
	if [ "$rc" -ne 1 ] || [ "$(count '^WG done corrupted=0 ' $n)" -ne 1 ]; then
		bad $n "exit status $rc or corruption reported" "$log"
	else
		ok $n
	fi
}

# A warm set and a timed scan phase (with the background sweep off, only the
# scan sweeps): the warm set is where asked, the scan ran, nothing corrupted.
check_warm_scan() {
	local n=warm-scan log=$tmp/warm-scan.log start pages

	run $n "hot=4M warm=8M warm_offset=32M scan_at=1 scan_for=1 sweep_every=0 duration=3"
	start=$(grep '^WG start ' "$log")
	pages=$(field pages "$(grep '^WG scan end ' "$log")")
	if [ "$rc" -ne 1 ] || [ "$(count '^WG done corrupted=0 ' $n)" -ne 1 ]; then
		bad $n "exit status $rc or corruption reported" "$log"
	elif [ $(($(field warm_start "$start") - $(field fill_start "$start"))) -ne $((32 << 20)) ] ||
		[ "$(field warm_bytes "$start")" != $((8 << 20)) ]; then
		bad $n "warm set not at +32M with 8M: $start" "$log"
	elif [ "$(count '^WG scan (start|end) ' $n)" -ne 2 ] || [ "${pages:-0}" -lt 1000 ]; then
		bad $n "no scan phase, or it swept only '${pages:-}' pages" "$log"
	else
		ok $n
	fi
}

# check_error NAME APPEND MESSAGE
check_error() {
	local n=$1 log=$tmp/$1.log

	run "$n" "$2"
	if [ "$rc" -ne 5 ]; then
		bad "$n" "exit status $rc, want 5" "$log"
	elif [ "$(count "^WG error $3\$" "$n")" -ne 1 ]; then
		bad "$n" "no 'WG error $3'" "$log"
	elif [ "$(count '^WG start ' "$n")" -ne 0 ]; then
		bad "$n" "guest started despite the error" "$log"
	else
		ok "$n"
	fi
}

# gdb_py SCRIPT: run a gdb Python script against QEMU's gdbstub and print
# its "OUT ..." lines. The VM pauses while gdb is attached.
gdb_py() {
	printf '%s\n' "$1" >"$tmp/gdb.py"
	timeout 20 gdb -q -batch -ex 'set architecture i386:x86-64' \
		-ex "target remote $tmp/gdb.sock" -ex "source $tmp/gdb.py" \
		-ex detach 2>&1 | sed -n 's/^OUT //p'
}

# Corrupt RAM behind the guest's back the ways a broken migration would:
# swap two pages, shift a page by one word, flip one bit, and write back
# a stale copy of a hot line (a lost write). The guest must report every
# wrong word exactly once: 2 * 1024 + 1023 + 1 (+ 16 if the line was
# rewritten in between, which its version byte tells). The run lasts 10 s so that
# gdb's writes land before the final sweep even on a loaded machine (with 4 s, a
# late write behind the final sweep's position went unseen).
check_corruption_kinds() {
	local n=corruption-kinds log=$tmp/corruption-kinds.log
	local fs end line vidx old v0 v1 want got

	if ! command -v gdb >/dev/null; then
		echo "skip $n (no gdb)"
		return
	fi
	# shellcheck disable=SC2046
	timeout 40 "$QEMU" $(qemu_args) -append "hot=4M duration=10" \
		-serial "file:$log" -gdb "unix:$tmp/gdb.sock,server=on,wait=off" \
		>"$tmp/$n.qemu" 2>&1 &
	bg_pid=$!
	for _ in $(seq 100); do
		grep -q '^WG filled ' "$log" 2>/dev/null && break
		sleep 0.1
	done
	fs=$(field fill_start "$(grep '^WG start ' "$log")")
	# The version table starts at the page after the image (__end).
	end=0x$(nm "$ELF" | awk '$3 == "__end" { print $1 }')
	line=$((fs + 64))
	vidx=$((end + (line - fs) / 64))
	old=$(gdb_py "i = gdb.selected_inferior(); print('OUT', bytes(i.read_memory($line, 64)).hex(), bytes(i.read_memory($vidx, 1))[0])")
	v0=${old#* }
	sleep 1
	v1=$(gdb_py "
i = gdb.selected_inferior()
rd = lambda a, n: bytes(i.read_memory(a, n))
a, b, s, f = $fs + (16 << 20), $fs + (16 << 20) + 4096, $fs + (24 << 20), $fs + (32 << 20) + 308
pa, pb = rd(a, 4096), rd(b, 4096)
i.write_memory(a, pb); i.write_memory(b, pa)
i.write_memory(s + 4, rd(s, 4092))
w = int.from_bytes(rd(f, 4), 'little') ^ 0x100
i.write_memory(f, w.to_bytes(4, 'little'))
v = rd($vidx, 1)[0]
i.write_memory($line, bytes.fromhex('${old%% *}'))
print('OUT', v)")
	wait "$bg_pid"
	rc=$?
	bg_pid=
	want=$((2 * 1024 + 1023 + 1))
	[ -n "$v1" ] && [ "$v1" != "$v0" ] && want=$((want + 16))
	got=$(count '^WG corrupt ' $n)
	if [ -z "$v1" ]; then
		bad $n "gdb could not corrupt guest memory" "$log"
	elif [ "$rc" -ne 3 ]; then
		bad $n "exit status $rc, want 3" "$log"
	elif [ "$got" -ne "$want" ] ||
	     [ "$(count "^WG done corrupted=$want " $n)" -ne 1 ]; then
		bad $n "$got WG corrupt lines, want $want" "$log"
	elif [ "$(grep '^WG corrupt ' "$log" | sort | uniq -d | wc -l)" -ne 0 ]; then
		bad $n "a word was reported twice" "$log"
	else
		ok $n
	fi
}

check_clean
check_inject
check_zipf_shift
check_seq_wrap
check_warm_scan
check_error unknown-param "hot=4M bogus=1" "unknown parameter bogus"
check_error bad-value "hot=12Q" "bad value hot=12Q"
check_corruption_kinds
finish
