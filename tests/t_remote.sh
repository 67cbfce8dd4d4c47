#!/bin/bash
# t_remote.sh - two instances, one prefix: kvpager run --model --cache-dir
# --remote.  Instance A (its own empty cache directory) prefills a prompt
# and publishes its chunks to a redis-server this test starts on a free
# loopback port; instance B (another process, another empty directory)
# reads the prefix from Redis and generates the same tokens with the same
# logits, bit for bit, and stores what it fetched in its own directory.
# Another salt reads nothing of it; a value tampered with in Redis is a
# counted miss with the same tokens; a server that is absent or hangs,
# or refuses the URL's db or password, costs errors, counted, never other
# tokens, and stderr says why, once.  While an instance that
# fetched decodes, its view's remote/ files, kvpctl stats and /metrics
# over HTTP show the tier's counters.  random:tiny, fp16 KV.
set -u
BUILD=${BUILD:-build}
kvp="$BUILD/bin/kvpager"
tmp=$(mktemp -d)
pid=""
vp="" # a decoding instance
cleanup() {
	[ -n "$vp" ] && kill -9 "$vp" 2>/dev/null
	[ -n "$vp" ] && wait "$vp" 2>/dev/null
	[ -d "$tmp/mnt" ] && fusermount3 -u -z "$tmp/mnt" 2>/dev/null
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	[ -n "$pid" ] && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
fail=0

[ -x "$kvp" ] || { echo "t_remote: $kvp not built"; exit 77; }
command -v redis-server >/dev/null ||
	{ echo "t_remote: redis-server not found (apt-get install redis-server)"; exit 77; }

run() { "$kvp" run --quiet --budget 8M --model random:tiny "$@"; }
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
tokens() { sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/'; }
check() { # check WHAT GOT WANT
	if [ "$2" != "$3" ]; then
		echo "FAIL: $1: got '$2', want '$3'"
		fail=1
	fi
}

# a free port below the ephemeral range
port=$(/usr/bin/python3 -c '
import random, socket
for _ in range(1000):
    p = random.randint(20000, 29999)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass
    finally: s.close()')
start_redis() {
	redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" \
		--appendonly no --logfile "$tmp/redis.log" &
	pid=$!
	for _ in $(seq 100); do
		redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
		sleep 0.1
	done
	echo "FAIL: redis-server did not start"; cat "$tmp/redis.log"; exit 1
}
start_redis
url="redis://127.0.0.1:$port?timeout_ms=5000"

python3 -c "print(','.join(['1']+[str((i*5*7919+5)%511+1) for i in range(1,300)]))" >"$tmp/p"
P=(--prompt-tokens "@$tmp/p" --generate 8 --json)

ref=$(run "${P[@]}" --logits-out "$tmp/l0") || { echo "FAIL: no cache"; exit 1; }
a=$(run "${P[@]}" --logits-out "$tmp/la" --cache-dir "$tmp/A" --remote "$url")
check "A: hit" "$(field prefix_hit_tokens <<<"$a")" 0
check "A: published" "$(field remote_publishes <<<"$a")" 4
check "A: tokens" "$(tokens <<<"$a")" "$(tokens <<<"$ref")"
keys_a=$(redis-cli -p "$port" --scan --pattern 'kvp:3:*')
b=$(KVP_REMOTE_URL="$url" run "${P[@]}" --logits-out "$tmp/lb" --cache-dir "$tmp/B")
check "B: hit" "$(field prefix_hit_tokens <<<"$b")" 256
check "B: fetched" "$(field remote_chunks_fetched <<<"$b")" 4
# random:tiny's prompt attends to itself: B maps the chunks it fetched
# (a memfd each, the KV cache's store), none copied into its region
check "B: mapped from Redis" "$(field remote_chunks_mapped <<<"$b")" 4
check "B: mapped tokens" "$(field prefix_mapped_tokens <<<"$b")" 256
check "B: tokens" "$(tokens <<<"$b")" "$(tokens <<<"$ref")"
cmp -s "$tmp/l0" "$tmp/lb" || { echo "FAIL: B's logits differ"; fail=1; }
# B stored what it fetched: its own directory serves it now
c=$(run "${P[@]}" --cache-dir "$tmp/B")
check "B's directory: hit" "$(field prefix_hit_tokens <<<"$c")" 256

# A checkpoint's prompt attends to its history: B reads each chunk, then
# maps it; one fetch each (it counted two).
model=../shared/models/stories260K.bin
if [ -f "$model" ]; then
	python3 -c "print(','.join(str(1 + i % 400) for i in range(200)))" >"$tmp/p2"
	M=(--quiet --budget 8M --model "$model" --prompt-tokens "@$tmp/p2" --generate 4 --json)
	"$kvp" run "${M[@]}" --cache-dir "$tmp/MA" --remote "$url" >/dev/null
	c=$("$kvp" run "${M[@]}" --cache-dir "$tmp/MB" --remote "$url")
	check "checkpoint B: hits" "$(field remote_hits <<<"$c")" 3
	check "checkpoint B: fetched" "$(field remote_chunks_fetched <<<"$c")" 3
	check "checkpoint B: mapped" "$(field remote_chunks_mapped <<<"$c")" 3
else
	echo "note: $model absent: the checkpoint's case skipped"
fi

# the tier's counters while an instance that fetched the prefix decodes:
# /metrics over HTTP, and with FUSE the view and kvpctl
view=""
if [ -c /dev/fuse ] && command -v fusermount3 >/dev/null; then
	view=$tmp/mnt
	export KVP_RUNTIME_DIR=$tmp/reg
fi
# (kvpager itself in the background, not run's shell: $! is kvpager)
KVP_FUSE_MOUNT=$view "$kvp" run --quiet --budget 8M --model random:tiny \
	--prompt-tokens "@$tmp/p" --generate 100000 --cache-dir "$tmp/G" \
	--remote "$url" --metrics-listen 127.0.0.1:0 >/dev/null 2>"$tmp/g.err" &
vp=$!
murl=""
end=$((SECONDS + 180)) # the prefill has fetched its 4 chunks (generous)
while [ $SECONDS -lt $end ]; do
	murl=$(sed -n 's/^kvpager: metrics at //p' "$tmp/g.err")
	[ -n "$murl" ] && curl -sS --max-time 30 -o "$tmp/m" "$murl" 2>/dev/null &&
		grep -q '^kvpager_remote_hits_total{pid="[0-9]*"} 4$' "$tmp/m" && break
	kill -0 "$vp" 2>/dev/null || break
	sleep 0.2
done
got=$(grep -c '^kvpager_remote_hits_total{pid="[0-9]*"} 4$' "$tmp/m" 2>/dev/null)
check "metrics: kvpager_remote_hits_total (${murl:-no url}: $(cat "$tmp/g.err"))" "$got" 1
got=$(grep -c '^kvpager_remote_fetch_latency_seconds_count{pid="[0-9]*"} [1-9]' "$tmp/m" 2>/dev/null)
check "metrics: the fetch latency histogram" "$got" 1
if /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null; then
	/usr/bin/python3 tests/metrics_lint.py "$tmp/m" || { echo "FAIL: metrics do not lint"; fail=1; }
fi
if [ -n "$view" ]; then
	got=$(cat "$view/remote/hits_total" 2>&1)
	check "view: remote/hits_total" "$got" 4
	got=$(cat "$view/remote/lookups_total" 2>&1)
	[ "$got" -ge 4 ] 2>/dev/null || { echo "FAIL: view: remote/lookups_total: $got"; fail=1; }
	got=$("$BUILD/bin/kvpctl" -m "$view" stats 2>&1 | grep -c '^remote/')
	check "kvpctl stats: remote lines" "$got" 26
	got=$("$BUILD/bin/kvpctl" -m "$view" stats 2>&1 | grep -c '^remote/fetch_latency_mean_us = [0-9]')
	check "kvpctl stats: the mean fetch latency" "$got" 1
	got=$(grep -c '^kvpager_remote_bytes_read_total{pid="[0-9]*"} [1-9]' "$view/metrics")
	check "view: metrics file" "$got" 1
else
	echo "note: no /dev/fuse or fusermount3: the view's remote/ case skipped"
fi
kill "$vp"
wait "$vp" 2>/dev/null
vp=""
[ -n "$view" ] && fusermount3 -u -z "$view" 2>/dev/null

# another tenant: nothing from Redis, the same tokens
c=$(run "${P[@]}" --cache-dir "$tmp/C" --cache-salt tenant-b --remote "$url")
check "other salt: hit" "$(field prefix_hit_tokens <<<"$c")" 0
check "other salt: fetched" "$(field remote_chunks_fetched <<<"$c")" 0
check "other salt: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$ref")"

# a tampered value: fails verification, a miss from there, same tokens
k=$(head -n 1 <<<"$keys_a") # A's, not the other tenant's
redis-cli -p "$port" setrange "$k" 200 XXXX >/dev/null
c=$(run "${P[@]}" --cache-dir "$tmp/D" --remote "$url")
check "tampered: failed verification" "$(field remote_verify_failed <<<"$c")" 1
[ "$(field remote_chunks_mapped <<<"$c")" -lt 4 ] || { echo "FAIL: a tampered chunk was mapped"; fail=1; }
check "tampered: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$ref")"
[ "$(field prefix_hit_tokens <<<"$c")" -lt 256 ] || { echo "FAIL: a tampered chunk was served"; fail=1; }

# a tier that cannot be used costs counted errors, never other tokens,
# and stderr says why, once: said CASE DIR URL ERROR
said() {
	c=$(run "${P[@]}" --cache-dir "$tmp/$2" --remote "$3" 2>"$tmp/err")
	check "$1: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$ref")"
	check "$1: said why, once ($(cat "$tmp/err"))" "$(grep -cF "$4" "$tmp/err")" 1
}
said "bad db" H "redis://127.0.0.1:$port/99" \
	"127.0.0.1:$port refused SELECT 99: ERR DB index is out of range"
said "bad password" I "redis://u:pw@127.0.0.1:$port" \
	"127.0.0.1:$port refused AUTH as u: WRONGPASS"
redis-cli -p "$port" config set requirepass pw >/dev/null
said "no password" J "$url" "the server refused GET: NOAUTH"
redis-cli -p "$port" -a pw --no-auth-warning config set requirepass "" >/dev/null

# a server that hangs (SIGSTOP), then one that is gone: counted errors
kill -STOP "$pid"
c=$(run "${P[@]}" --cache-dir "$tmp/E" --remote "redis://127.0.0.1:$port?timeout_ms=200" 2>"$tmp/err")
kill -CONT "$pid"
check "hung: tokens" "$(tokens <<<"$c")" "$(tokens <<<"$ref")"
check "hung: hit" "$(field prefix_hit_tokens <<<"$c")" 0
[ "$(field remote_timeouts <<<"$c")" -ge 1 ] || { echo "FAIL: hung: no timeout counted: $c"; fail=1; }
check "hung: said why ($(cat "$tmp/err"))" \
	"$(grep -c "127.0.0.1:$port did not answer within 200 ms" "$tmp/err")" 1
kill -9 "$pid"; wait "$pid" 2>/dev/null; pid=""
said "absent" F "$url" "cannot connect to 127.0.0.1:$port: Connection refused"
check "absent: hit" "$(field prefix_hit_tokens <<<"$c")" 0
[ "$(field remote_errors <<<"$c")" -ge 1 ] || { echo "FAIL: absent: no error counted: $c"; fail=1; }

c=$(run --generate 2 --remote "$url" 2>&1)
[ $? = 2 ] && grep -q "add --cache-dir" <<<"$c" || { echo "FAIL: --remote alone: $c"; fail=1; }

[ $fail = 0 ] && echo "t_remote: ok"
exit $fail
