# shellcheck shell=bash
# Shared helpers for the testbed scripts: where things are, which kernel, byte sizes.

TESTBED_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$TESTBED_DIR/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
TB_OUT=$TARGET/testbed

die() {
	echo "testbed: $*" >&2
	exit 125
}

# The newest installed Debian 6.12 kernel release, e.g. 6.12.117+deb12-amd64.
newest_kernel_release() {
	local k
	k=$(find /boot -maxdepth 1 -name 'vmlinuz-6.12.*+deb12-amd64' -printf '%f\n' 2>/dev/null |
		sed 's/^vmlinuz-//' | sort -V | tail -n 1)
	[ -n "$k" ] || return 1
	echo "$k"
}

# Converts 512M, 1G, 2048K or plain bytes to MiB (QEMU's -m unit).
size_to_mib() {
	local s=${1^^} n unit
	n=${s%%[KMGT]*}
	unit=${s#"$n"}
	unit=${unit%B}
	unit=${unit%I}
	[[ $n =~ ^[0-9]+$ ]] || return 1
	case $unit in
	"") echo $((n / 1048576)) ;;
	K) echo $((n / 1024)) ;;
	M) echo "$n" ;;
	G) echo $((n * 1024)) ;;
	T) echo $((n * 1048576)) ;;
	*) return 1 ;;
	esac
}
