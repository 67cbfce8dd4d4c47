#!/bin/bash
# t_probe.sh - tools/kvp-probe: one line per facility, --json, --path,
# the userfaultfd mode and its cost, the exit status.
#
# Needs $BUILD/bin/kvp-probe (run by tests/run-tests.sh with BUILD set).
set -u
BUILD=${BUILD:-build}
probe="$BUILD/bin/kvp-probe"
fails=0
tmp=$(mktemp -d)
trap 'umount "$tmp/ramfs" 2>/dev/null; rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

if [ ! -x "$probe" ]; then
	echo "t_probe: $probe not built (run make BUILD=$BUILD first)"
	exit 77
fi
command -v python3 >/dev/null || { echo "t_probe: python3 not found"; exit 77; }

"$probe" >"$tmp/out" 2>"$tmp/err"
rc=$?
cat "$tmp/out" "$tmp/err"
[ $rc = 0 ] || fail "kvp-probe exit $rc here (this machine can run the pager)"
grep -q '^kvp-probe: the pager can run here' "$tmp/out" ||
	fail "no 'the pager can run here' line"

# Every facility the issue names has its line, ok or missing.
for f in 'userfaultfd syscall' 'userfaultfd device' 'userfaultfd user-mode' \
	'userfaultfd mode' 'uffd MOVE' 'uffd POISON' 'uffd WP' \
	'uffd WP_ASYNC' 'uffd MINOR_SHMEM' 'uffd THREAD_ID' \
	'uffd EVENT_REMOVE' 'uffd EVENT_UNMAP' 'io_uring' \
	'io_uring op READ' 'io_uring op WRITE' 'O_DIRECT' \
	'transparent hugepages' 'process_madvise DONTNEED' \
	'page first touch' 'install auto' 'tlb flush' '/dev/fuse' \
	'fusermount3' \
	'RLIMIT_MEMLOCK' 'CUDA device'; do
	grep -Eq "^$f +(ok|missing) " "$tmp/out" || fail "no line for '$f'"
done
# Details that carry information.
grep -Eq '^O_DIRECT +ok .*memory align [0-9]+, offset align [0-9]+' \
	"$tmp/out" || fail "O_DIRECT line has no alignment"
grep -Eq '^transparent hugepages +(ok|missing) +mode (always|madvise|never)' \
	"$tmp/out" || fail "THP line has no mode"
grep -Eq '^page first touch +ok +[0-9]+\.[0-9]+ us per 4 KiB page .*\([0-9]+\.[0-9]+ us after\): [0-9]+ us per 64 KiB block' \
	"$tmp/out" || fail "first-touch line has no figures"
grep -Eq '^install auto +ok +2 MiB blocks go in by (move|copy): (a page.s first touch costs (no less|less) than copying it|not measured) \([0-9]+\.[0-9]+ us\)' \
	"$tmp/out" || fail "install auto line has no choice"
grep -Eq '^tlb flush +ok +a 64 KiB range dropped alone: [0-9]+\.[0-9] us \([0-9]+\.[0-9]+ us per page flushed\)(; in batches of 16, [0-9]+\.[0-9] us each)?$' \
	"$tmp/out" || fail "tlb flush line has no figures"
grep -Eq '^RLIMIT_MEMLOCK +ok +[0-9]+ bytes' "$tmp/out" ||
	fail "RLIMIT_MEMLOCK line has no value"
# The status is the column after the 26-wide name.
if grep -E '^.{27}missing ' "$tmp/out" | grep -qv '(remedy: '; then
	fail "a missing facility without a remedy"
fi

# The mode the pager gets, and what it costs.  Root here: full mode.
if [ "$(id -u)" = 0 ]; then
	grep -Eq '^userfaultfd mode +ok +full via ' "$tmp/out" ||
		fail "as root the mode line does not say full"
	grep -q 'the pager can run here (userfaultfd full)' "$tmp/out" ||
		fail "the summary does not name the mode"
fi

# --json: one object per line, each with the four fields, ending with the
# verdict; the same facilities as the text.
"$probe" --json >"$tmp/json" 2>"$tmp/jerr"
rc=$?
[ $rc = 0 ] || fail "kvp-probe --json exit $rc"
python3 - "$tmp/json" "$tmp/out" <<'EOF' || fail "--json does not parse or differs"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    assert set(r) == {"facility", "available", "detail", "remedy"}, r
    assert isinstance(r["available"], bool), r
    assert r["available"] or r["remedy"], r
names = [r["facility"] for r in rows]
text = [re.split(r" {2,}", l)[0] for l in open(sys.argv[2])
        if re.search(r" (ok|missing) ", l)]
assert names[:-1] == text, (names, text)
last = rows[-1]
assert last["facility"] == "pager" and last["available"] is True, last
assert "userfaultfd mode full" in last["detail"] or "user-mode-only" in last["detail"], last
print("json: %d facilities, all parse" % len(rows))
EOF

# --path: a path that does not exist says so on the O_DIRECT line and the
# probe fails, naming it.
"$probe" --path "$tmp/nonexistent" >"$tmp/o2" 2>"$tmp/e2"
rc=$?
[ $rc != 0 ] || fail "--path to a missing directory exits 0"
grep -Eq "^O_DIRECT +missing +$tmp/nonexistent: no such file or directory" \
	"$tmp/o2" || { cat "$tmp/o2"; fail "--path missing: no clear line"; }
grep -q "cannot run here: the backing path $tmp/nonexistent" "$tmp/e2" ||
	fail "--path missing: the verdict does not name the path"
"$probe" --json --path "$tmp/nonexistent" 2>/dev/null | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
assert rows[-1]["facility"] == "pager" and rows[-1]["available"] is False
' || fail "--json --path missing: verdict not false"

# A file, not a directory: refused as kvpager run --path refuses it ("Not
# a directory"), naming the path and the remedy, and left as it was.
echo keep >"$tmp/file"
"$probe" --path "$tmp/file" >"$tmp/o3" 2>"$tmp/e3"
rc=$?
[ $rc = 1 ] || fail "--path to a regular file exits $rc, want 1"
grep -Eq "^O_DIRECT +missing +$tmp/file: not a directory \(remedy: pass --path the directory" \
	"$tmp/o3" || { grep O_DIRECT "$tmp/o3"; fail "--path file: no clear line"; }
grep -q "cannot run here: the backing path $tmp/file: Not a directory" \
	"$tmp/e3" || { cat "$tmp/e3"; fail "--path file: the verdict does not say why"; }
[ "$(cat "$tmp/file")" = keep ] || fail "--path file: the file changed"
# A directory on a filesystem that refuses O_DIRECT (ramfs), where we may
# mount: missing, buffered.
mkdir -p "$tmp/ramfs"
if [ "$(id -u)" = 0 ] && mount -t ramfs kvp-probe-test "$tmp/ramfs" 2>/dev/null; then
	"$probe" --path "$tmp/ramfs" >"$tmp/o4" 2>&1
	grep -Eq "^O_DIRECT +missing +$tmp/ramfs: this filesystem \(ramfs\) refuses O_DIRECT" \
		"$tmp/o4" || { grep O_DIRECT "$tmp/o4"; fail "--path ramfs: no clear line"; }
	umount "$tmp/ramfs"
else
	echo "t_probe: ramfs directory case not run (needs root and mount)"
fi
# A directory that does accept O_DIRECT here.
"$probe" --path "$tmp" | grep -Eq "^O_DIRECT +ok +$tmp " ||
	echo "t_probe: note: $tmp refuses O_DIRECT (not a failure)"

# An unprivileged user gets user-mode-only where full mode is refused, and
# the probe says what that costs.
knob=$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null || echo 1)
as_nobody() {
	setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
}
if [ "$(id -u)" = 0 ] && [ "$knob" = 0 ] && command -v setpriv >/dev/null &&
	! as_nobody test -r /dev/userfaultfd -a -w /dev/userfaultfd; then
	mkdir -p "$tmp/nobody"
	cp "$probe" "$tmp/kvp-probe"
	chmod 755 "$tmp" "$tmp/kvp-probe"
	chmod 1777 "$tmp/nobody"
	if as_nobody env TMPDIR="$tmp/nobody" "$tmp/kvp-probe" >"$tmp/o5" 2>&1; then
		grep -Eq '^userfaultfd mode +ok +user-mode-only via .*fail with EFAULT' \
			"$tmp/o5" || { cat "$tmp/o5"; fail "as nobody: no user-mode-only line with its cost"; }
		grep -Eq '^userfaultfd syscall +missing .*Operation not permitted' \
			"$tmp/o5" || fail "as nobody: the syscall line does not say refused"
		grep -Eq '^userfaultfd full mode +missing .*remedy: ' "$tmp/o5" ||
			fail "as nobody: no remedy for full mode"
		grep -q 'can run here (userfaultfd user-mode-only)' "$tmp/o5" ||
			fail "as nobody: summary does not name the mode"
	else
		cat "$tmp/o5"
		fail "as nobody: kvp-probe failed"
	fi
else
	echo "t_probe: user-mode-only case not run (needs root, vm.unprivileged_userfaultfd=0)"
fi

if [ $fails != 0 ]; then
	echo "t_probe: $fails checks failed"
	exit 1
fi
echo "t_probe: all checks passed"
