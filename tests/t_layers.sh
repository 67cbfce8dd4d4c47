#!/bin/bash
# t_layers.sh - the README's layout is the code's: lib/'s folders include
# only pager/, kmod-helpers/ and the folders listed before them.
#
# The order is read from the README's Layout section (the lines
# "      NAME/   ..." under lib/).  kv/ and predict/ interleave by file: the
# predictors use kv's lower half (kv_geometry, block_table, attention,
# kv_tunables), which includes nothing of predict/.  Every folder of lib/
# must be listed.  Exit 0 passed, 1 failed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

mapfile -t order < <(awk '/^    lib\/ /{on=1; next} /^    [a-z]/{on=0}
	on && /^      [a-z_]+\/ / {sub(/^ +/, ""); sub(/\/.*/, ""); print}' README.md)
[ ${#order[@]} -gt 3 ] || { echo "FAIL: no lib/ folders in README.md's layout"; exit 1; }
declare -A rank
for i in "${!order[@]}"; do rank[${order[$i]}]=$i; done

kv_low='kv_geometry|block_table|attention|kv_tunables'
for dir in lib/*/; do
	f=$(basename "$dir")
	[ -n "${rank[$f]:-}" ] || { fail "lib/$f/ is not in README.md's layout"; continue; }
	for src in "$dir"*.[ch] "$dir"*.cu; do
		[ -e "$src" ] || continue
		while read -r g file; do
			[ "$g" = "$f" ] && continue
			[ -n "${rank[$g]:-}" ] || { fail "$src includes lib/$g/, a folder the README does not list"; continue; }
			if [ "$f" = predict ] && [ "$g" = kv ]; then
				echo "$file" | grep -Eq "^($kv_low)\.h$" ||
					fail "$src includes lib/kv/$file, above predict/"
				continue
			fi
			if [ "$f" = kv ] && [ "$g" = predict ]; then
				basename "$src" | grep -Eq "^($kv_low)\." &&
					fail "$src (kv's lower half) includes lib/predict/$file"
				continue
			fi
			[ "${rank[$g]}" -lt "${rank[$f]}" ] ||
				fail "$src includes lib/$g/$file: $g/ is not before $f/ in README.md"
		done < <(sed -n 's|^#include "lib/\([a-z_]*\)/\([a-z_0-9]*\.h\)".*|\1 \2|p' "$src")
	done
done
[ $fails = 0 ] || { echo "t_layers: $fails failure(s)"; exit 1; }
echo "t_layers: ${#order[@]} folders, each includes only those before it"
