#!/bin/bash
# t_edge_values.sh - every numeric option of the tools refuses edge values.
#
# Each row names a command and one of its numeric options; the command is
# run with the option set to each value of the common edge table (a sign, a
# fraction, nan, inf, 1e400, 2^64, a suffix past 2^64 - 1, trailing
# letters, an empty word) and to the row's own extra values (0 where 0 is
# not taken, 4294967297 where the field is narrower than 2^32 + 1, a value
# just past the range).  Each must exit 2, before doing anything, with a
# message on stderr that names the option.  A value cut to 32 bits or
# wrapped from -1 would be taken instead (exit 0 or a run that starts).
#
# Needs $BUILD/bin (run by tests/run-tests.sh with BUILD set).
set -u
BUILD=${BUILD:-build}
fails=0
rows=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$tmp/dir # where a tool would write, were a value taken
mkdir "$dir"

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# Values that no numeric option takes.
common=(-1 nan inf -inf 1e400 1.5 12abc 18446744073709551616 16383P "")

# row COMMAND... -- OPTION EXTRA_VALUE...: the common values and these.
row() {
	edge_values "${common[@]}" -- "$@"
}

# row_only COMMAND... -- OPTION VALUE...: these values only.
row_only() {
	edge_values -- "$@"
}

# edge_values VALUE... -- COMMAND... -- OPTION VALUE...
edge_values() {
	local vals=() cmd=() opt v out rc
	while [ "$1" != "--" ]; do
		vals+=("$1")
		shift
	done
	shift
	while [ "$1" != "--" ]; do
		cmd+=("$1")
		shift
	done
	shift
	opt=$1
	shift
	[ -x "$BUILD/bin/${cmd[0]}" ] || {
		fail "$BUILD/bin/${cmd[0]} not built"
		return
	}
	rows=$((rows + 1))
	for v in "${vals[@]}" "$@"; do
		# stdin closed and a time limit: a value taken by mistake
		# must not start a long run.
		timeout -k 5 60 "$BUILD/bin/${cmd[0]}" "${cmd[@]:1}" "$opt" "$v" \
			</dev/null >"$tmp/out" 2>"$tmp/err"
		rc=$?
		out=$(head -c 300 "$tmp/err")
		if [ $rc != 2 ]; then
			fail "${cmd[*]} $opt '$v': exit $rc, want 2 ($out)"
		elif ! grep -q -- "$opt" "$tmp/err"; then
			fail "${cmd[*]} $opt '$v': the message does not name" \
				"$opt: $out"
		fi
	done
}

# kvpbench: the backing file would go to $dir, were a value taken.
row kvpbench --dir "$dir" --quiet -- --budget 0 1
row kvpbench --dir "$dir" --quiet -- --file-size 0 2P
row kvpbench --dir "$dir" --quiet -- --block 0 4095 3M 2G
row kvpbench --dir "$dir" --quiet -- --random-block 0 4097 2G
row kvpbench --dir "$dir" --quiet -- --depth 0 4097 4294967297
row kvpbench --dir "$dir" --quiet -- --ref-depth 4097 4294967297
row kvpbench --dir "$dir" --quiet -- --reads 0 4294967297
row kvpbench --dir "$dir" --quiet -- --threads 0 65 4294967297 1,,4 1,-1
row kvpbench --dir "$dir" --quiet -- --pager-threads 0 65 4294967297
row kvpbench --dir "$dir" --quiet -- --timeout 0 86401 4294967297
row kvpbench --dir "$dir" --quiet -- --repeat 0 16 4294967297
row kvpbench decode --quiet --path "$dir" -- --context 0 4294967297
row kvpbench decode --quiet --path "$dir" -- --batch 0 4097 4294967298
row kvpbench decode --quiet --path "$dir" -- --budget-tokens 0 4294967297
row kvpbench decode --quiet --path "$dir" -- --steps 0 4294967297
row kvpbench decode --quiet --path "$dir" -- --warmup 4294967297
row kvpbench decode --quiet --path "$dir" -- --budget 0 1 2P
row kvpbench decode --quiet --path "$dir" -- --ram 0 1 2P
row kvpbench decode --quiet --path "$dir" -- --rank 0 4097 4294967297
row kvpbench decode --quiet --path "$dir" -- --block 0 2G
row kvpbench decode --quiet --path "$dir" -- --depth 0 1025 4294967297
row kvpbench compute -- --repeat 0 16 4294967297
row kvpsoak -- --seconds 0 4294967297
row kvpsoak -- --service-threads 0 65 4294967297
# kvp-probe has no numeric option; an empty --path is refused too.
row_only kvp-probe -- --path ""
# kvpager run (its options are the main job's).
K=(kvpager run --quiet --path "$dir")
row "${K[@]}" -- --context 0 4294967297 3G
row "${K[@]}" -- --batch 0 65537 4294967298
row "${K[@]}" -- --steps 0 4294967297
row "${K[@]}" -- --warmup 4294967297
row "${K[@]}" -- --budget 0 1 2P
row "${K[@]}" -- --depth 17 4294967297
row "${K[@]}" -- --block 0 4095 2G
row "${K[@]}" -- --budget-tokens 0 15 1048577 4294967297
row "${K[@]}" -- --block-tokens 0 1025 4294967297
row "${K[@]}" -- --rank 0 3 513 4294967297
row "${K[@]}" -- --sample-every 4294967297
row "${K[@]}" -- --sample-layers 4294967297
row "${K[@]}" -- --threads 257 4294967297
row "${K[@]}" -- --seed
# kvpctl (the view's): the values are refused before any pager is looked
# for, so an empty registry is enough.  --watch takes fractions of a
# second, so it gets its own list.
export KVP_RUNTIME_DIR=$dir/run
row_only kvpctl stats -- --watch nan inf -inf 1e400 -1 0 12abc "" 16383P
row kvpctl stats -- --count 4294967297999999999999
row kvpctl -- -p 0 4294967297 2147483648

ls -A "$dir" | grep -q . && fail "a value was taken: files left in $dir"
[ $fails = 0 ] || { echo "t_edge_values: $fails failure(s)"; exit 1; }
echo "t_edge_values: ok ($rows options, ${#common[@]} common values each)"
