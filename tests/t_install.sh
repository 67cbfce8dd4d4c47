#!/bin/bash
# t_install.sh - `make install DESTDIR=... PREFIX=/usr` gives a usable
# library: headers, libkvpager (static and shared) and a kvpager.pc that a
# program compiles and links against with pkg-config, then runs; the man
# pages and the bash completion in share/; kvpbench's touch_pages in
# libexec/kvpager/, where the installed kvpbench finds it.
#
# Run by tests/run-tests.sh with BUILD set, after the build.
set -u
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

command -v pkg-config >/dev/null || { echo "t_install: pkg-config not found"; exit 77; }
CC=${CC:-cc}

# A make run from make's recipe inherits its command line (BUILD, SANITIZE)
# through MAKEFLAGS; the jobserver is not ours, so -j1 here.
if ! make --no-print-directory -j1 BUILD="$BUILD" DESTDIR="$tmp" PREFIX=/usr \
	install >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	echo "t_install: make install failed"
	exit 1
fi
root="$tmp/usr"

for f in include/kvpager/kvpager.h include/kvpager/pager/pager.h \
	include/kvpager/pager/config.h lib/libkvpager.a lib/libkvpager.so \
	lib/libkvpager.so.0 lib/pkgconfig/kvpager.pc bin/kvp-probe \
	share/man/man1/kvpager.1 share/man/man1/kvpbench.1 \
	share/man/man8/kvpctl.8 share/man/man8/kvp-probe.8 \
	share/man/man3/libkvpager.3 share/man/man7/kvpager-tunables.7 \
	share/bash-completion/completions/kvpager \
	share/bash-completion/completions/kvpbench \
	share/bash-completion/completions/kvpctl \
	share/bash-completion/completions/kvp-probe; do
	[ -e "$root/$f" ] || fail "not installed: /usr/$f"
done
find "$root/include/kvpager" -name '*_i.h' | grep -q . &&
	fail "private *_i.h headers installed"
grep -qx 'prefix=/usr' "$root/lib/pkgconfig/kvpager.pc" ||
	fail "kvpager.pc does not say prefix=/usr: $(head -1 "$root/lib/pkgconfig/kvpager.pc")"

# The installed kvpbench finds what its touch lines run: touch_pages (in
# libexec/kvpager/) and the shim, with no build tree beside it.  A line
# may be skipped for the host (no cgroup, a sanitizer build), never for a
# missing program.
for f in libexec/kvpager/touch_pages lib/libkvpager-preload.so; do
	[ -x "$root/$f" ] || fail "not installed: /usr/$f"
done
"$root/bin/kvpbench" touch --budget 8M --touches 128 --threads 1 \
	--modes mmap,preload --quiet --json --dir "$tmp" >"$tmp/touch" 2>&1 ||
	{ cat "$tmp/touch"; fail "installed kvpbench touch failed"; }
grep -q '"mode":"preload"' "$tmp/touch" ||
	{ cat "$tmp/touch"; fail "installed kvpbench touch: no preload line"; }
grep -q 'touch_pages' "$tmp/touch" &&
	{ cat "$tmp/touch"; fail "installed kvpbench touch: no touch_pages"; }

# Every installed header compiles on its own with the installed -I only
# (it includes what it needs, and nothing that was not installed).
#
# The .pc says prefix=/usr.  A copy with the prefix pointed into DESTDIR
# (rather than PKG_CONFIG_SYSROOT_DIR, which would also move the system's
# fuse3 and liburing paths into DESTDIR) is what pkg-config reads.
mkdir -p "$tmp/pc"
sed "s|^prefix=/usr\$|prefix=$root|" "$root/lib/pkgconfig/kvpager.pc" \
	>"$tmp/pc/kvpager.pc"
export PKG_CONFIG_PATH="$tmp/pc"
cflags=$(pkg-config --cflags kvpager) || fail "pkg-config --cflags kvpager"
case "$cflags" in *"$root/include/kvpager"*) ;;
*) fail "cflags do not point into DESTDIR: $cflags" ;; esac
for h in $(cd "$root/include/kvpager" && find . -name '*.h' | sort); do
	h=${h#./}
	printf '#include "%s"\n' "$h" >"$tmp/hdr.c"
	$CC -std=c11 -D_GNU_SOURCE -fsyntax-only $cflags "$tmp/hdr.c" \
		>"$tmp/hdr.log" 2>&1 ||
		{ sed 's/^/    /' "$tmp/hdr.log" | head -8; fail "header $h does not compile alone"; }
done

# The library was built with sanitizers?  The program must link the same.
san=""
nm "$root/lib/libkvpager.a" 2>/dev/null | grep -q ' U __asan_' &&
	san="-fsanitize=address,undefined"
nm "$root/lib/libkvpager.a" 2>/dev/null | grep -q ' U __tsan_' &&
	san="-fsanitize=thread"

cat >"$tmp/prog.c" <<'EOF'
/* Compile with: cc prog.c $(pkg-config --cflags --libs kvpager) */
#include <stdio.h>
#include <kvpager.h>

int main(void)
{
	struct kvp_config cfg;
	const char *bad = NULL;
	int err;

	kvp_config_defaults(&cfg);
	err = kvp_config_check(&cfg, &bad);
	if (err) {
		printf("defaults rejected: %d (%s)\n", err, bad ? bad : "?");
		return 1;
	}
	printf("kvpager config defaults ok\n");
	return 0;
}
EOF

# Shared: -L into DESTDIR, run with the library path pointing there.
if $CC -std=c11 $san -o "$tmp/prog-shared" "$tmp/prog.c" \
	$(pkg-config --cflags --libs kvpager) >"$tmp/cc1.log" 2>&1; then
	out=$(LD_LIBRARY_PATH="$root/lib" "$tmp/prog-shared") ||
		fail "shared program failed: $out"
	[ "$out" = "kvpager config defaults ok" ] || fail "shared program said: $out"
	LD_LIBRARY_PATH="$root/lib" ldd "$tmp/prog-shared" |
		grep -q "$root/lib/libkvpager.so.0" ||
		fail "shared program does not use the installed libkvpager.so.0"
else
	cat "$tmp/cc1.log"
	fail "cannot build against the installed shared library"
fi

# Static: pkg-config --static brings the private dependencies.
if $CC -std=c11 $san -o "$tmp/prog-static" "$tmp/prog.c" \
	$(pkg-config --cflags kvpager) "$root/lib/libkvpager.a" \
	$(pkg-config --static --libs kvpager | sed 's/-lkvpager//') \
	>"$tmp/cc2.log" 2>&1; then
	out=$("$tmp/prog-static") || fail "static program failed: $out"
	[ "$out" = "kvpager config defaults ok" ] || fail "static program said: $out"
else
	cat "$tmp/cc2.log"
	fail "cannot build against the installed static library"
fi

# uninstall removes what install put there.
make --no-print-directory -j1 BUILD="$BUILD" DESTDIR="$tmp" PREFIX=/usr \
	uninstall >>"$tmp/install.log" 2>&1 || fail "make uninstall failed"
left=$(find "$root" -type f | head -5)
[ -z "$left" ] || fail "uninstall left: $left"

if [ $fails != 0 ]; then
	echo "t_install: $fails checks failed"
	exit 1
fi
echo "t_install: all checks passed"
