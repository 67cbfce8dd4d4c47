#!/bin/bash
# t_kvpctl.sh - kvpctl against live pagers.
#
# The pagers are `test_fuse_view --serve`: a pager opened from the
# environment (KVP_* tunables, KVP_FUSE_MOUNT) with one region "demo" of
# 16 MiB in 64 KiB blocks, scanned slowly until SIGTERM.  The registry is a
# fresh KVP_RUNTIME_DIR.  Covered: listing pagers, -a, get, set (valid,
# invalid, not runtime, unknown), a budget change visible in the engine's
# statistics, list, stats --watch, load (all or nothing), -p and -m, two
# pagers, a clean exit, and a pager killed (-9) leaving a stale mount that
# kvpctl reports and the next pager cleans up.
set -u
BUILD=${BUILD:-build}
K=$BUILD/bin/kvpctl
S=$BUILD/tests/test_fuse_view

. "$(dirname "$0")/helpers/tap.sh"
[ -x "$K" ] || skip "$K is not built (make BUILD=$BUILD)"
[ -x "$S" ] || skip "$S is not built (make BUILD=$BUILD check)"
[ -c /dev/fuse ] || skip "/dev/fuse is missing (modprobe fuse)"
command -v fusermount3 >/dev/null || skip "fusermount3 not found (apt-get install fuse3)"

tmp=$(mktemp -d /tmp/kvp-ctl-XXXXXX)
export KVP_RUNTIME_DIR=$tmp/reg
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	# a stale mount fails stat (ENOTCONN): no -d test here
	for m in "$tmp"/m1 "$tmp"/m2; do
		fusermount3 -u -z "$m" 2>/dev/null
	done
	rm -rf "$tmp"
}
trap cleanup EXIT


# start_pager MOUNT [VAR=VALUE...]: a serving pager; sets $pid
start_pager() {
	local mnt=$1 i
	shift
	env "$@" KVP_FUSE_MOUNT="$mnt" "$S" --serve >"$mnt.out" 2>&1 &
	pid=$!
	pids+=("$pid")
	for i in $(seq 100); do
		grep -q '^ready' "$mnt.out" 2>/dev/null && return 0
		if ! kill -0 "$pid" 2>/dev/null; then
			grep -q -i -E 'userfaultfd|permission' "$mnt.out" &&
				skip "the pager cannot start here: $(cat "$mnt.out")"
			fail "the pager died: $(cat "$mnt.out")"
		fi
		sleep 0.1
	done
	fail "the pager did not get ready: $(cat "$mnt.out")"
}

expect 0 "no running pager" "$K"
expect 1 "no running pager found" "$K" get io_depth
expect 0 "ram_budget_bytes = 1G" "$K" list
expect 2 "usage" "$K" frobnicate
# the command line is checked before a pager is looked for: a command
# without what it needs, a NAME=VALUE the registry refuses, a file that
# cannot be opened, an argument too many exit 2 with the reason (before:
# exit 1, "no running pager found", and list took any argument)
expect 2 "^kvpctl: get: name a tunable" "$K" get
expect 2 "^kvpctl: set: 'io_depth' is not NAME=VALUE" "$K" set io_depth
expect 2 "^kvpctl: ram_budget_bytes: '1K' is out of range" \
	"$K" set ram_budget_bytes=1K
expect 2 "^kvpctl: load: give one FILE" "$K" load
expect 2 "^kvpctl: cannot open $tmp/none.conf" "$K" load "$tmp/none.conf"
expect 2 "^kvpctl: list takes no argument, not 'x'" "$K" list x

start_pager "$tmp/m1" KVP_RAM_BUDGET_BYTES=16M
p1=$pid
expect 0 "^$p1 +test_fuse_view[a-z_]* +$tmp/m1\$" "$K"
expect 0 "^ram_budget_bytes = 16777216\$" "$K" -a
expect 0 "^demand_faults_total = [0-9]+\$" "$K" -a
expect 0 "^install_mode = \[auto\] move copy\$" "$K" get install_mode
expect 0 "^16777216\$" "$K" -n get ram_budget_bytes
expect 0 "^regions/demo/nr_blocks = 256\$" "$K" get regions/demo/nr_blocks
# any file of the view, by its path: the top-level ones too
expect 0 "^pid = $p1\$" "$K" get pid
expect 0 "^uffd_mode = (full|user-mode-only)\$" "$K" -m "$tmp/m1" get uffd_mode
expect 0 "^last_error = \$" "$K" get last_error
expect 0 "^ram_budget_bytes = 16777216\$" "$K" list
expect 0 "bytes 2M\.\.1P, default 1G, runtime" "$K" list

# valid changes apply at once
expect 0 "" "$K" set install_mode=copy io_batch=8
expect 0 "^auto move \[copy\]\$" "$K" -n get install_mode
expect 0 "^8\$" "$K" -n get io_batch
# refused ones change nothing and say why: what the registry refuses is
# the command line's (exit 2), what the pager refuses the run's (exit 1)
expect 2 "ram_budget_bytes: '1K' is out of range; accepted: 2M\.\.1P" \
	"$K" set ram_budget_bytes=1K
expect 2 "io_depth cannot change on a running pager: set KVP_IO_DEPTH" \
	"$K" set io_depth=8
expect 2 "unknown tunable 'nosuch'" "$K" set nosuch=1
expect 2 "is a statistic" "$K" set demand_faults_total=0
expect 2 "not NAME=VALUE" "$K" set ram_budget_bytes
expect 1 "unknown name 'nosuch': not a tunable, a statistic or a file of the view" \
	"$K" get nosuch
expect 1 "unknown name 'regions/nosuch'" "$K" get regions/nosuch
expect 1 "unknown name '\.\./m1/pid'" "$K" get ../m1/pid
expect 0 "^16777216\$" "$K" -n get ram_budget_bytes
# set is all or nothing: a bad value, or a KV tunable on a pager without
# a KV layer, leaves the good ones unset too
expect 2 "ram_budget_bytes: 'bogus' is not a size.*nothing was changed" \
	"$K" set io_batch=2 ram_budget_bytes=bogus
expect 1 "no kv layer is attached.*nothing was changed" \
	"$K" set ram_budget_bytes=6M prefetch_depth_layers=1
expect 0 "^16777216\$" "$K" -n get ram_budget_bytes
expect 0 "^8\$" "$K" -n get io_batch

# a smaller budget shows in the engine: resident bytes follow it, the
# scan now faults and evicts
ev0=$("$K" -n get evictions_clean_total)
expect 0 "" "$K" set ram_budget_bytes=4M
sleep 1
res=$("$K" -n get resident_bytes)
[ "$res" -le $((4 * 1024 * 1024 + 65536)) ] ||
	fail "resident_bytes $res above the 4M budget (+1 block)"
ok "resident_bytes $res within the new budget"
ev1=$("$K" -n get evictions_clean_total)
[ "$ev1" -gt "$ev0" ] || fail "no evictions after the budget drop ($ev0 -> $ev1)"
ok "evictions $ev0 -> $ev1"
out=$("$K" stats --watch 0.5 --count 2) || fail "stats --watch: $out"
[ "$(echo "$out" | wc -l)" = 3 ] || fail "stats --watch printed: $out"
echo "$out" | head -1 | grep -q 'faults/s' || fail "no header: $out"
echo "$out" | tail -n 2 | awk '$1 > 0 { f = 1 } END { exit !f }' ||
	fail "no faults/s in: $out"
ok "stats --watch shows the scan's faults"
expect 0 "^bytes_read_total = [0-9]+\$" "$K" stats
# numeric options: whole values in range, the option named, exit 2
for w in nan inf -inf -1 0 0.001 1e3 0x10 "" " 1" .5x 1.5.5 86401 \
	99999999999999999999; do
	expect 2 "stats --watch takes seconds from 0.01 to 86400" \
		"$K" stats --watch "$w" --count 1
done
for c in -1 x 1.5 "" " 1" 4294967296 99999999999999999999; do
	expect 2 "stats --count takes a number of lines from 0 to 4294967295" \
		"$K" stats --watch 1 --count "$c"
done
expect 2 "stats: --watch needs a value" "$K" stats --watch
for p in 0 -1 x " 1" +1 2147483648 99999999999999999999; do
	expect 2 "-p takes a process id from 1 to 2147483647" \
		"$K" -p "$p" get io_depth
done
out=$("$K" stats --watch .5 --count 1) || fail "stats --watch .5: $out"
ok "stats --watch .5 takes half a second"

# load: all or nothing
printf '# budget and batching\nram_budget_bytes = 6M\n\nio_batch = 4\n' >"$tmp/good.conf"
printf 'ram_budget_bytes = 5M\nio_batch = 0\n' >"$tmp/bad.conf"
printf 'ram_budget_bytes = 5M\nservice_threads = 9\n' >"$tmp/static.conf"
expect 0 "2 tunables changed" "$K" load "$tmp/good.conf"
expect 0 "^6291456\$" "$K" -n get ram_budget_bytes
expect 1 "line 2: io_batch: '0' is out of range.*nothing was changed" \
	"$K" load "$tmp/bad.conf"
expect 1 "line 2: service_threads cannot change" "$K" load "$tmp/static.conf"
expect 0 "^6291456\$" "$K" -n get ram_budget_bytes
expect 0 "^4\$" "$K" -n get io_batch
expect 2 "cannot open" "$K" load "$tmp/none.conf"

# choosing a pager
expect 0 "^64\$" "$K" -p "$p1" -n get io_depth
expect 0 "^64\$" "$K" -m "$tmp/m1" -n get io_depth
expect 1 "no running pager with pid 1 " "$K" -p 1 get io_depth
expect 1 "not a kvpager view" "$K" -m "$tmp" get io_depth
start_pager "$tmp/m2"
p2=$pid
expect 1 "2 pagers are running; choose one with -p PID" "$K" get io_depth
expect 0 "^1073741824\$" "$K" -p "$p2" -n get ram_budget_bytes
expect 0 "^6291456\$" "$K" -p "$p1" -n get ram_budget_bytes

# a clean exit unregisters and unmounts
kill -TERM "$p2"
wait "$p2" || fail "pager $p2 exited $?"
mountpoint -q "$tmp/m2" && fail "$tmp/m2 still mounted after exit"
expect 0 "^$p1 " "$K"
ok "clean exit"

# a crash leaves a stale mount: reported, and cleaned by the next pager
kill -9 "$p1"
wait "$p1" 2>/dev/null
stat "$tmp/m1" >/dev/null 2>&1 && fail "$tmp/m1 is not stale after kill -9"
expect 1 "the view at $tmp/m1 is dead.*fusermount3 -u -z" "$K" -m "$tmp/m1" get io_depth
expect 0 "no running pager" "$K"
start_pager "$tmp/m1"
expect 0 "^1073741824\$" "$K" -n get ram_budget_bytes
kill -TERM "$pid"
wait "$pid" || fail "pager exited $?"
ok "stale mount recovered"
[ -z "$(ls "$KVP_RUNTIME_DIR")" ] || fail "registry not empty: $(ls "$KVP_RUNTIME_DIR")"
ok "registry empty"
echo "$tap_n checks passed"
