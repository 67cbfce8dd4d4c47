#!/bin/bash
# t_cache.sh - kvpager run --model --cache-dir: the second run of a prompt
# reads its stored prefix instead of computing it and generates the same
# tokens with the same logits, bit for bit; a prompt sharing a prefix reads
# that prefix; salts, encryption keys, a corrupt block and another format
# version each give a miss or a clear error, never other tokens.
# stories260K (../shared/models/stories260K.bin) when present, and
# random:tiny (fp16 KV) always.
set -u
BUILD=${BUILD:-build}
kvp="$BUILD/bin/kvpager"
tmp=$(mktemp -d)
trap 'umount "$tmp/full" 2>/dev/null; rm -rf "$tmp"' EXIT
fail=0

run() { "$kvp" run --quiet --budget 8M "$@"; }
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
tokens() { sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/'; }
check() { # check WHAT GOT WANT
	if [ "$2" != "$3" ]; then
		echo "FAIL: $1: got '$2', want '$3'"
		fail=1
	fi
}

# one model: MODEL PROMPT-FILE WANT-HIT (tokens read on the second run)
one() {
	local m=$1 p=$2 want_hit=$3 d="$tmp/c.$RANDOM" a b c
	a=$(run --model "$m" --prompt-tokens "@$p" --generate 12 --json \
		--logits-out "$tmp/la") || { echo "FAIL: $m without a cache"; fail=1; return; }
	b=$(run --model "$m" --prompt-tokens "@$p" --generate 12 --json \
		--logits-out "$tmp/lb" --cache-dir "$d")
	check "$m first run: hit" "$(field prefix_hit_tokens <<<"$b")" 0
	# its chunks were stored behind the first token, all of them
	[ "$(field cache_written_behind <<<"$b")" -gt 0 ] 2>/dev/null ||
		{ echo "FAIL: $m first run: nothing written behind"; fail=1; }
	c=$(run --model "$m" --prompt-tokens "@$p" --generate 12 --json \
		--logits-out "$tmp/lc" --cache-dir "$d")
	check "$m second run: hit" "$(field prefix_hit_tokens <<<"$c")" "$want_hit"
	check "$m second run: written" "$(field cache_bytes_written <<<"$c")" 0
	check "$m tokens, cache" "$(tokens <<<"$b")" "$(tokens <<<"$a")"
	check "$m tokens, hit" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
	cmp -s "$tmp/la" "$tmp/lb" || { echo "FAIL: $m logits differ with a cache"; fail=1; }
	cmp -s "$tmp/la" "$tmp/lc" || { echo "FAIL: $m logits differ on a hit"; fail=1; }
	# another namespace reads nothing of it
	c=$(run --model "$m" --prompt-tokens "@$p" --generate 12 --json \
		--cache-dir "$d" --cache-salt tenant-b)
	check "$m other salt: hit" "$(field prefix_hit_tokens <<<"$c")" 0
	check "$m other salt: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
}

gen_prompt() { # N SEED FILE: N token ids, BOS first
	python3 -c "import sys
n,s=int(sys.argv[1]),int(sys.argv[2])
print(','.join(['1']+[str((i*s*7919+s)%511+1) for i in range(1,n)]))" "$1" "$2" >"$3"
}

model=../shared/models/stories260K.bin
if [ -f "$model" ]; then
	gen_prompt 448 3 "$tmp/p448"
	one "$model" "$tmp/p448" 384
	# a prompt sharing its first 400 tokens: 6 whole chunks of 64
	head -c "$(python3 -c "import sys;print(len(','.join(open(sys.argv[1]).read().strip().split(',')[:400])))" "$tmp/p448")" "$tmp/p448" >"$tmp/p400"
	printf ',5,6,7,8,9,10,11,12\n' >>"$tmp/p400"
	d="$tmp/shared"
	run --model "$model" --prompt-tokens "@$tmp/p448" --generate 2 --cache-dir "$d" >/dev/null
	c=$(run --model "$model" --prompt-tokens "@$tmp/p400" --generate 2 --json --cache-dir "$d")
	check "shared prefix: hit" "$(field prefix_hit_tokens <<<"$c")" 384
else
	echo "note: $model absent: stories260K's cases skipped"
fi

# random:tiny: fp16 KV, a prompt attending to itself
gen_prompt 300 5 "$tmp/p300"
one random:tiny "$tmp/p300" 256

# KVP_CACHE_WRITE_BEHIND=0: stored during the prefill, the same hit after
d="$tmp/wb0"
b=$(KVP_CACHE_WRITE_BEHIND=0 run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d")
check "store in the prefill: written behind" "$(field cache_written_behind <<<"$b")" 0
c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d")
check "store in the prefill: hit" "$(field prefix_hit_tokens <<<"$c")" 256
# the chunks read back from the KV cache after the first token (write
# behind) are the bytes the prefill computed: each block file equals the
# one stored during the prefill from the prefill's own K and V
b=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$tmp/wb1")
awk -v a="$(field prefill_offer_s <<<"$b")" -v b="$(field offer_after_first_token_s <<<"$b")" \
	'BEGIN { exit !(a < 0.0005 && b > 0) }' ||
	{ echo "FAIL: write behind: offered in the prefill: $b"; fail=1; }
[ "$(ls "$tmp/wb1" | grep -c 'kvb$')" = 4 ] || { echo "FAIL: write behind: $(ls "$tmp/wb1")"; fail=1; }
for f in "$d"/*.kvb; do
	cmp -s "$f" "$tmp/wb1/${f##*/}" || { echo "FAIL: read back: ${f##*/} differs"; fail=1; }
done
b=$(KVP_CACHE_WRITE_BEHIND=off run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$tmp/wboff")
check "KVP_CACHE_WRITE_BEHIND=off: written behind" "$(field cache_written_behind <<<"$b")" 0
rc=0
KVP_CACHE_WRITE_BEHIND=maybe run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --cache-dir "$tmp/wbbad" >/dev/null 2>"$tmp/wbbad.err" || rc=$?
check "KVP_CACHE_WRITE_BEHIND=maybe: refused" "$rc:$(grep -c "KVP_CACHE_WRITE_BEHIND: 'maybe'" "$tmp/wbbad.err")" "2:1"

# the model's identity by name: found under the same name (option or
# variable), never under another name nor under the weights' hash
d="$tmp/named"
run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --cache-dir "$d" --cache-model-id tiny-a >/dev/null
c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d" --cache-model-id tiny-a)
check "model id: hit" "$(field prefix_hit_tokens <<<"$c")" 256
c=$(KVP_CACHE_MODEL_ID=tiny-a run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d")
check "model id from KVP_CACHE_MODEL_ID: hit" "$(field prefix_hit_tokens <<<"$c")" 256
c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d" --cache-model-id tiny-b)
check "other model id: hit" "$(field prefix_hit_tokens <<<"$c")" 0
c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json --cache-dir "$d")
check "no model id (weights' hash): hit" "$(field prefix_hit_tokens <<<"$c")" 0

# encryption at rest: a key file; without it, or with another, misses
head -c 32 /dev/urandom >"$tmp/key"
chmod 600 "$tmp/key"
d="$tmp/sealed"
a=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d" --cache-key-file "$tmp/key")
b=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d" --cache-key-file "$tmp/key")
check "sealed: hit" "$(field prefix_hit_tokens <<<"$b")" 256
# another key, or none, names other blocks: its misses drop nothing, it
# counts none of the key's blocks as already stored, writes over none of
# them, and finds its own blocks next time; the key's blocks still hit
(cd "$d" && md5sum ./*.kvb) >"$tmp/sealed.sums"
for k in "" "$(printf '%064d' 7)"; do
	w=${k:+other key}
	w=${w:-no key}
	c=$(KVP_CACHE_KEY=$k run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d")
	check "sealed, $w: hit" "$(field prefix_hit_tokens <<<"$c")" 0
	check "sealed, $w: unauthenticated" "$(field cache_dropped_unauth <<<"$c")" 0
	check "sealed, $w: already stored" "$(field cache_puts_present <<<"$c")" 0
	check "sealed, $w: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
	c=$(KVP_CACHE_KEY=$k run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d")
	check "sealed, $w, again: hit" "$(field prefix_hit_tokens <<<"$c")" 256
done
(cd "$d" && md5sum --quiet -c "$tmp/sealed.sums") ||
	{ echo "FAIL: sealed: another key wrote over the key's blocks"; fail=1; }
c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d" --cache-key-file "$tmp/key")
check "sealed, after the others: hit" "$(field prefix_hit_tokens <<<"$c")" 256
check "sealed, after the others: written" "$(field cache_bytes_written <<<"$c")" 0
check "sealed, after the others: unauthenticated" "$(field cache_dropped_unauth <<<"$c")" 0
chmod 644 "$tmp/key"
c=$(run --model random:tiny --generate 2 --cache-dir "$d" --cache-key-file "$tmp/key" 2>&1)
[ $? = 2 ] && grep -q "chmod 600" <<<"$c" || { echo "FAIL: a key file others read: $c"; fail=1; }
c=$(KVP_CACHE_KEY=xyz run --model random:tiny --generate 2 --cache-dir "$d" 2>&1)
[ $? = 2 ] && grep -q "KVP_CACHE_KEY: .*64 hex digits" <<<"$c" ||
	{ echo "FAIL: a bad KVP_CACHE_KEY not named: $c"; fail=1; }

# a corrupt block, mapped (random:tiny's prompt attends to itself, so its
# chunks are not read at the hit): found when the decode first reads it,
# dropped, counted, and the run stops with an error, never a wrong
# token; the next run computes that chunk again: the same tokens
d="$tmp/corrupt"
a=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d")
b=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json --cache-dir "$d")
check "mapped: tokens" "$(field prefix_mapped_tokens <<<"$b")" 256
# the prefill's breakdown: the 44 tokens after the 4 chunks computed
check "prefill: computed" "$(field prefill_computed_tokens <<<"$b")" 44
check "prefill, first run: computed" "$(field prefill_computed_tokens <<<"$a")" 300
check "mapped: verified" "$(field cache_mapped_verified <<<"$b")" 4
# the scan's 4 KiB per block at open and each mapped chunk's 128-byte
# header, not one byte of a payload
check "mapped: headers read at the hit" "$(field cache_bytes_read <<<"$b")" 16896
for f in "$d"/*.kvb; do
	printf 'XXXX' | dd of="$f" bs=1 seek=300 conv=notrunc status=none
	break
done
c=$(KVP_CACHE_DIR="$d" run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json 2>&1)
rc=$?
[ $rc != 0 ] && grep -q "failed verification when read" <<<"$c" ||
	{ echo "FAIL: a corrupt mapped block: exit $rc: $c"; fail=1; }
c=$(KVP_CACHE_DIR="$d" run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 4 --json)
check "corrupt, next run: torn" "$(field cache_dropped_torn <<<"$c")" 0
check "corrupt, next run: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
check "corrupt, next run: blocks" "$(field cache_blocks <<<"$c")" 4
# a corrupt block read at the hit (stories260K attends to its prompt: each
# chunk is read into the prefill's history): a miss, counted, same tokens
if [ -f "$model" ]; then
	d="$tmp/corrupt2"
	a=$(run --model "$model" --prompt-tokens "@$tmp/p448" --generate 4 --json --cache-dir "$d")
	for f in "$d"/*.kvb; do
		printf 'XXXX' | dd of="$f" bs=1 seek=300 conv=notrunc status=none
		break
	done
	c=$(run --model "$model" --prompt-tokens "@$tmp/p448" --generate 4 --json --cache-dir "$d")
	check "corrupt, read: torn" "$(field cache_dropped_torn <<<"$c")" 1
	check "corrupt, read: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
fi

# a directory that cannot be used fails the work, as --path's does
# (exit 1, with the remedy); a value refused is the command line's
# (exit 2), and leaves no directory made.  refused CASE STATUS TEXT ARGS...
refused() {
	local what=$1 want=$2 text=$3 rc=0
	shift 3
	c=$(run --model random:tiny --generate 2 "$@" 2>&1) || rc=$?
	[ $rc = "$want" ] && grep -q -- "$text" <<<"$c" ||
		{ echo "FAIL: $what: exit $rc (want $want): $c"; fail=1; }
}
echo "kvpager-cache 9" >"$d/kvpcache"
refused "format 9" 1 "has format 9, this kvpager reads 1" --cache-dir "$d"
refused "no parent" 1 "mkdir -p its parent" --cache-dir "$tmp/none/c"
mkdir -m 777 "$tmp/open"
chmod 777 "$tmp/open" # past the umask
refused "others may write" 1 "chmod 700" --cache-dir "$tmp/open"
mkdir -m 700 "$tmp/held"
# the subshell becomes the sleep that holds the lock, so that killing it
# frees the lock (flock FILE CMD left CMD holding it after flock was killed)
(exec 9>"$tmp/held/kvpcache.lock" && flock 9 && exec sleep 600) &
holder=$!
for _ in $(seq 100); do
	flock -n "$tmp/held/kvpcache.lock" true || break
	sleep 0.1
done
refused "in use" 1 "in use by another process" --cache-dir "$tmp/held"
kill "$holder"; wait "$holder" 2>/dev/null
if [ "$(id -u)" = 0 ]; then
	mkdir -m 700 "$tmp/theirs"
	chown 65534 "$tmp/theirs"
	refused "another user's" 1 "not to you" --cache-dir "$tmp/theirs"
fi
refused "a bad URL" 2 "must start with redis://" --cache-dir "$tmp/u" \
	--remote ftp://x
[ -e "$tmp/u" ] && { echo "FAIL: a refused URL made the directory"; fail=1; }
echo secret >"$tmp/pw"
chmod 644 "$tmp/pw"
refused "a password file others may read" 2 "chmod 600" --cache-dir \
	"$tmp/pw-dir" --remote "redis://u:@127.0.0.1:1/?password_file=$tmp/pw"
refused "no password file" 2 "cannot open the redis password file" \
	--cache-dir "$tmp/pw-dir" \
	--remote "redis://u:@127.0.0.1:1/?password_file=$tmp/none"
[ -e "$tmp/pw-dir" ] &&
	{ echo "FAIL: a refused password file made the directory"; fail=1; }
c=$(run --preset tiny --steps 2 --cache-dir "$tmp/x" 2>&1)
[ $? = 2 ] && grep -q "add --model" <<<"$c" || { echo "FAIL: no model: $c"; fail=1; }

# the view and kvpctl show the cache's figures while a run decodes
if [ -c /dev/fuse ] && command -v fusermount3 >/dev/null; then
	export KVP_RUNTIME_DIR=$tmp/reg
	d="$tmp/viewed"
	run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --cache-dir "$d" >/dev/null
	# The program itself in the background, not the function: $! must
	# be kvpager's pid, or the kill below leaves it decoding.
	KVP_FUSE_MOUNT=$tmp/mnt "$kvp" run --quiet --budget 8M --model random:tiny \
		--prompt-tokens "@$tmp/p300" --generate 100000 --cache-dir "$d" \
		>/dev/null 2>&1 &
	vp=$!
	# The prefill's four hits are counted as its chunks arrive: wait
	# for all of them (the file appears with the first), 60 s at most.
	for i in $(seq 300); do
		[ "$(cat "$tmp/mnt/cache/hits_total" 2>/dev/null)" = 4 ] && break
		sleep 0.2
	done
	got=$(cat "$tmp/mnt/cache/hits_total" 2>&1)
	check "view: cache/hits_total" "$got" 4
	got=$("$BUILD/bin/kvpctl" -m "$tmp/mnt" stats 2>&1 | grep -c '^cache/')
	check "kvpctl stats: cache lines" "$got" 19
	got=$(grep -c '^kvpager_cache_hits_total{pid="[0-9]*"} 4$' "$tmp/mnt/metrics")
	check "metrics: kvpager_cache_hits_total" "$got" 1
	kill "$vp"
	wait "$vp"
	fusermount3 -u -z "$tmp/mnt" 2>/dev/null
else
	echo "note: no /dev/fuse or fusermount3: the view's case skipped"
fi

# A run that fails after its first token, while the held-back chunks are
# read back from the KV cache behind it (--ram 2M leaves the decode no
# frames): a clear error, not a crash in the freed KV cache; the
# directory it leaves serves a later run the same tokens.
gen_prompt 512 7 "$tmp/p512"
d="$tmp/stop"
run --model random:tiny --ram 2M --prompt-tokens "@$tmp/p512" --generate 4 \
	--json --cache-dir "$d" >"$tmp/stop.out" 2>"$tmp/stop.err"
check "failing after the first token: exit" "$?" 1
grep -q "leaves no frames" "$tmp/stop.err" ||
	{ echo "FAIL: failing after the first token: $(cat "$tmp/stop.err")"; fail=1; }
a=$(run --model random:tiny --prompt-tokens "@$tmp/p512" --generate 4 --json)
c=$(run --model random:tiny --prompt-tokens "@$tmp/p512" --generate 4 --json --cache-dir "$d")
check "after a failed run: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"

# SIGTERM with a cache open stops the run cleanly, as without one: the
# prefix cache's threads leave the signal to the run's own handler.
d="$tmp/term"
"$kvp" run --budget 8M --model random:tiny --prompt-tokens "@$tmp/p512" \
	--generate 1000000 --cache-dir "$d" >"$tmp/term.out" 2>"$tmp/term.err" &
pid=$!
for _ in $(seq 600); do # decoding, 60 s at most
	grep -q "decode" "$tmp/term.err" 2>/dev/null && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
kill -TERM $pid 2>/dev/null
wait $pid
check "SIGTERM with a cache: exit" "$?" 143
grep -q "interrupted after [0-9]* of 1000000 decode steps" "$tmp/term.err" ||
	{ echo "FAIL: SIGTERM with a cache: no word of it: $(tail -c 300 "$tmp/term.err")"; fail=1; }

# A disk that fills (a tmpfs of 100 KiB, room for two of p300's four 36
# KiB chunk files): the run evicts to make room and says so, instead of
# failing its puts; the next run hits what was kept, with the same tokens.
if [ "$(id -u)" = 0 ] && mkdir "$tmp/full" &&
	mount -t tmpfs -o size=100k,mode=700 tmpfs "$tmp/full" 2>/dev/null; then
	a=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 --json)
	b=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 \
		--json --cache-dir "$tmp/full/c" 2>"$tmp/full.err")
	check "full disk: exit" "$?" 0
	check "full disk: puts that found it full" "$(field cache_disk_full <<<"$b")" 2
	check "full disk: put errors" "$(field cache_put_errors <<<"$b")" 0
	check "full disk: said once" "$(grep -c 'the disk is full' "$tmp/full.err")" 1
	c=$(run --model random:tiny --prompt-tokens "@$tmp/p300" --generate 2 \
		--json --cache-dir "$tmp/full/c" 2>/dev/null)
	check "full disk: hit" "$(field prefix_hit_tokens <<<"$c")" 128
	check "full disk: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$a")"
	umount "$tmp/full"
else
	echo "note: not root or no tmpfs: the full disk case skipped"
fi

[ $fail = 0 ] && echo "t_cache: ok"
exit $fail
