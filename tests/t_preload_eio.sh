#!/bin/bash
# t_preload_eio.sh - the preload shim on a backing directory whose writes fail.
#
# tests/progs/failfs mirrors a directory through FUSE and fails every write
# while a control file exists (EIO, or ENOSPC for a full disk).  A program
# that knows nothing of kvpager (tests/progs/dirty_then_check) runs under
# libkvpager-preload.so with KVP_BACKING_DIR on that mount:
#   recover: it dirties more than the budget while writes fail (the pager
#     cannot write any of it back), must not hang or die, and once the
#     store recovers it dirties four times the budget more and reads every
#     byte back right (no dirty block dropped); in both install modes.
#   stuck: writes never recover and it dirties three times the budget: it
#     must end with SIGBUS (README: a fault past the overdraft), not hang.
#
# Exit 0 passed, 1 failed, 77 skipped (the last line says why).
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIB=$ROOT/$BUILD/lib/libkvpager-preload.so
PROG=$ROOT/$BUILD/tests/progs/dirty_then_check
FAILFS=$ROOT/$BUILD/tests/progs/failfs
BUDGET_MB=32

skip() { echo "$*"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

for f in "$LIB" "$PROG" "$FAILFS"; do
	[ -e "$f" ] || skip "no $f (build it: make BUILD=$BUILD $f)"
done
if ldd "$LIB" "$PROG" 2>/dev/null | grep -Eq 'lib(a|t|ub|hwa)san'; then
	skip "built with a sanitizer (its runtime owns malloc): the preload is tested in plain builds"
fi
[ -c /dev/fuse ] || skip "no /dev/fuse"
command -v fusermount3 >/dev/null || skip "no fusermount3 (apt-get install fuse3)"

work=$(mktemp -d "${TMPDIR:-/tmp}/kvp-t-eio.XXXXXX") || exit 1
fs_pid=
cleanup() {
	[ -n "$fs_pid" ] && fusermount3 -u -z "$work/mnt" 2>/dev/null
	[ -n "$fs_pid" ] && wait "$fs_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# mount_failfs ERRNO : a fresh failfs on $work/mnt, writes failing.
mount_failfs() {
	local i
	mkdir -p "$work/back" "$work/mnt"
	touch "$work/failing"
	"$FAILFS" "$work/back" "$work/mnt" "$work/failing" "$1" \
		2>"$work/failfs.err" &
	fs_pid=$!
	for ((i = 0; i < 500; i++)); do
		grep -q " $work/mnt fuse" /proc/mounts && return 0
		sleep 0.02
	done
	cat "$work/failfs.err"
	fail "failfs did not mount at $work/mnt"
	return 1
}

umount_failfs() {
	fusermount3 -u "$work/mnt" 2>/dev/null || fusermount3 -u -z "$work/mnt"
	wait "$fs_pid" 2>/dev/null
	fs_pid=
}

# wait_line FILE TEXT SECONDS PID : until FILE has TEXT; 1 if PID ended or
# the time ran out first.
wait_line() {
	local i
	for ((i = 0; i < $3 * 50; i++)); do
		grep -q "$2" "$1" && return 0
		kill -0 "$4" 2>/dev/null || { grep -q "$2" "$1"; return; }
		sleep 0.02
	done
	return 1
}

# wait_exit PID SECONDS : sets rc to its exit status, or kills it (rc 124).
wait_exit() {
	local i
	for ((i = 0; i < $2 * 10; i++)); do
		kill -0 "$1" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$1" 2>/dev/null; then
		kill -KILL "$1"
		wait "$1" 2>/dev/null
		rc=124
	else
		wait "$1"
		rc=$?
	fi
}

served() {
	env KVP_RAM_BUDGET_BYTES=${BUDGET_MB}M KVP_PRELOAD_MIN_BYTES=16M \
		KVP_BACKING_DIR="$work/mnt" KVP_PRELOAD_STRICT=1 \
		KVP_PRELOAD_STATS=1 KVP_INSTALL_MODE="$mode" \
		LD_PRELOAD="$LIB" "$@"
}

show() { sed "s/^/    $name| /" "$work/$name.out" "$work/$name.err"; }

# recover MODE ERRNO
recover() {
	mode=$1 name=recover-$1-$2
	mount_failfs "$2" || return
	rm -f "$work/go"
	# Two blocks (2 MiB each) past the budget: within its overdraft.
	served "$PROG" $((BUDGET_MB + 4)) $((BUDGET_MB * 4)) "$work/go" \
		>"$work/$name.out" 2>"$work/$name.err" &
	local pid=$!
	if ! wait_line "$work/$name.out" "phase 1 done" 120 $pid; then
		show
		fail "$name: dirtying past the budget with writes failing did not finish"
		kill -KILL $pid 2>/dev/null
		wait $pid 2>/dev/null
		umount_failfs
		return
	fi
	sleep 1 # back-off retries fail meanwhile
	rm -f "$work/failing"
	touch "$work/go"
	wait_exit $pid 180
	if [ $rc -ne 0 ] || ! grep -q "^all ok" "$work/$name.out"; then
		show
		fail "$name: exit $rc after the store recovered (124: hung)"
	elif ! grep -q "write-back to .* failed" "$work/$name.err" ||
		! grep -q "write-back to .* works again" "$work/$name.err"; then
		show
		fail "$name: stderr does not say that write-back failed and recovered"
	elif ! grep -Eq "write_errors [1-9]" "$work/$name.err"; then
		show
		fail "$name: the stats line counts no write errors"
	else
		pass "$name: $((BUDGET_MB + 4)) MiB dirty while writes failed, then $((BUDGET_MB * 5 + 4)) MiB checked after recovery"
	fi
	umount_failfs
}

# stuck MODE : writes never recover; SIGBUS, never a hang.
stuck() {
	mode=$1 name=stuck-$1
	mount_failfs EIO || return
	touch "$work/go"
	served "$PROG" $((BUDGET_MB * 3)) 0 "$work/go" \
		>"$work/$name.out" 2>"$work/$name.err" &
	local pid=$!
	wait_exit $pid 180
	if [ $rc -ne $((128 + 7)) ]; then
		show
		fail "$name: exit $rc, expected SIGBUS (135; 124: hung)"
	elif ! grep -q "write-back to .* failed" "$work/$name.err"; then
		show
		fail "$name: stderr does not say that write-back failed"
	else
		pass "$name: SIGBUS past budget + overdraft with writes failing"
	fi
	umount_failfs
}

recover move EIO
recover copy ENOSPC
stuck move
stuck copy

if [ $fails -ne 0 ]; then
	echo "t_preload_eio: $fails failed"
	exit 1
fi
echo "t_preload_eio: all passed"
