#!/bin/bash
# t_man.sh - the man pages and --help agree, both ways: every option a
# tool's --help lists (its subcommands' too) appears in its page, and
# every option the page's OPTIONS list is in --help; every tunable of the
# registry is in kvpager-tunables(7); the pages format with man(1)
# without a warning; the bash completion offers the tools' options.
set -u
BUILD=${BUILD:-build}
PY=/usr/bin/python3
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
for f in kvpager.1 kvpbench.1 kvpctl.8 kvp-probe.8 kvpager-tunables.7 \
	libkvpager.3; do
	[ -f "$BUILD/man/$f" ] || { echo "skipped: $BUILD/man/$f not built"; exit 77; }
done

# tool page scope [section]: the --help of TOOL (SCOPE: its subcommand,
# - none) against the page's options (SECTION, else SCOPE: its .SS
# section; -: the OPTIONS section).
check() {
	local tool=$1 page=$2 scope=$3 section=${4:-$3} help
	if [ "$scope" = - ]; then
		help=$("$BUILD/bin/$tool" --help 2>&1)
	else
		help=$("$BUILD/bin/$tool" "$scope" --help 2>&1)
	fi
	$PY - "$page" "$section" "$help" <<'EOF' || fail "$tool $scope: --help and $page differ"
import re, sys
page, scope, help_text = sys.argv[1], sys.argv[2], sys.argv[3]
roff = open(page).read()
text = re.sub(r"\\f[BIRP]", "", roff).replace("\\-", "-").replace("\\&", "")
opt = r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])"
# --help: every option named anywhere in it
in_help = set(re.findall(opt, help_text))
# the page: every option named anywhere in it
in_page = set(re.findall(opt, text))
# the page's option list (the OPTIONS section, or the scope's .SS)
sec = re.split(r"^\.S[HS] ", text, flags=re.M)
want = "OPTIONS" if scope == "-" else scope
listed = set()
for s in sec:
    head = s.split("\n", 1)[0].strip()
    if head == want:
        for m in re.finditer(r"^\.TP\n(.*)$", s, flags=re.M):
            listed |= set(re.findall(opt, m.group(1)))
bad = False
for o in sorted(in_help - in_page):
    print(f"  --help lists {o}, {page} does not", file=sys.stderr)
    bad = True
for o in sorted(listed - in_help):
    print(f"  {page} lists {o}, --help does not", file=sys.stderr)
    bad = True
if not listed:
    print(f"  {page}: no options listed for {want}", file=sys.stderr)
    bad = True
sys.exit(1 if bad else 0)
EOF
}
check kvpager "$BUILD/man/kvpager.1" run -
check kvpbench "$BUILD/man/kvpbench.1" -
check kvpbench "$BUILD/man/kvpbench.1" decode
check kvpbench "$BUILD/man/kvpbench.1" compute
check kvpbench "$BUILD/man/kvpbench.1" tier
check kvpctl "$BUILD/man/kvpctl.8" -
check kvp-probe "$BUILD/man/kvp-probe.8" -
[ $fails = 0 ] && echo "ok: --help and the man pages agree"

# Every tunable of the registry, with its variable.
names=$(KVP_RUNTIME_DIR=/nonexistent "$BUILD/bin/kvpctl" list |
	sed -n 's/^\([a-z0-9_]*\) = .*/\1/p')
[ -n "$names" ] || fail "kvpctl list gave no tunables"
for n in $names; do
	v=KVP_$(echo "$n" | tr a-z A-Z)
	grep -q "^\\\\fB${n}\\\\fR (\\\\fB${v}\\\\fR)" "$BUILD/man/kvpager-tunables.7" ||
		fail "kvpager-tunables(7) lacks $n ($v)"
done
echo "ok: $(echo "$names" | wc -w) tunables in kvpager-tunables(7)"

# Each page formats without a warning.
if command -v man >/dev/null; then
	for p in "$BUILD"/man/*.[1378]; do
		out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null)
		[ -z "$out" ] || fail "man -l $p: $out"
	done
	echo "ok: the pages format"
fi

# The completion offers a subcommand's options and an option's words.
complete_line() { # TOOL WORDS...: what the completion offers for the last
	local tool=$1
	shift
	bash -c '
		source "$1"; shift
		COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
		_'"${tool//-/_}"'
		printf "%s\n" "${COMPREPLY[@]}"' x "$BUILD/completion/$tool" \
		"$tool" "$@"
}
complete_line kvpager run --metrics | grep -qx -- --metrics-listen ||
	fail "completion: kvpager run --metrics"
complete_line kvpbench decode --predictor l | grep -qx lowrank ||
	fail "completion: kvpbench decode --predictor l"
complete_line kvpbench st | grep -qx stream ||
	fail "completion: kvpbench st"
complete_line kvpctl - | grep -qx -- -m || fail "completion: kvpctl -"
complete_line kvp-probe --p | grep -qx -- --path ||
	fail "completion: kvp-probe --p"
[ $fails = 0 ] || exit 1
echo "t_man: all passed"
