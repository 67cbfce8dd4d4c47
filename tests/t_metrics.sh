#!/bin/bash
# t_metrics.sh - /metrics over HTTP while `kvpager run` decodes: scraped
# with curl, every line parsed (Debian's python3-prometheus-client and the
# naming rules of tests/metrics_lint.py), the same families as the view's
# metrics file; a port in use and a bad address refused at start with
# their messages; KVP_METRICS_LISTEN read, --metrics-listen winning.
set -u
BUILD=${BUILD:-build}
K=$BUILD/bin/kvpager
PY=/usr/bin/python3

skip() {
	echo "skipped: $*"
	exit 77
}
[ -x "$K" ] || skip "$K is not built (make BUILD=$BUILD)"
command -v curl >/dev/null || skip "curl not found (apt-get install curl)"
$PY -c 'import prometheus_client' 2>/dev/null ||
	skip "no prometheus_client (apt-get install python3-prometheus-client)"

tmp=$(mktemp -d /tmp/kvp-metrics-XXXXXX)
export TMPDIR=$tmp
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	exit 1
}

# A port held by another socket, and an address of no interface here.
$PY - >"$tmp/held" <<'EOF' &
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
EOF
holder=$!
for _ in $(seq 100); do [ -s "$tmp/held" ] && break; sleep 0.1; done
port=$(cat "$tmp/held")
[ -n "$port" ] || fail "no port held"
"$K" run --preset tiny --context 256 --steps 2 --metrics-listen "$port" \
	>/dev/null 2>"$tmp/err"
rc=$?
kill "$holder" 2>/dev/null
[ $rc = 1 ] || fail "a port in use: exit $rc, not 1"
grep -q "cannot listen on $port: the port is in use; pick another one" \
	"$tmp/err" || fail "a port in use: $(cat "$tmp/err")"
echo "ok: a port in use is refused at start"

for bad in nohost:9464 127.0.0.1:99999 ::1:9464; do
	"$K" run --preset tiny --context 256 --steps 2 \
		--metrics-listen "$bad" >/dev/null 2>"$tmp/err"
	rc=$?
	[ $rc = 2 ] || fail "--metrics-listen $bad: exit $rc, not 2"
	grep -q "metrics listen address '$bad'" "$tmp/err" ||
		fail "--metrics-listen $bad: $(cat "$tmp/err")"
done
KVP_METRICS_LISTEN=192.0.2.1:0 "$K" run --preset tiny --context 256 \
	--steps 2 >/dev/null 2>"$tmp/err"
grep -q "no interface of this machine has that address" "$tmp/err" ||
	fail "KVP_METRICS_LISTEN not read: $(cat "$tmp/err")"
echo "ok: bad addresses are refused at start, with what is accepted"

# A long decode, scraped while it runs; the option wins over the variable.
KVP_METRICS_LISTEN=192.0.2.1:0 "$K" run --preset tiny --context 4096 \
	--steps 1000000 --metrics-listen 127.0.0.1:0 --quiet \
	>"$tmp/out" 2>"$tmp/err" &
pid=$!
url=
for _ in $(seq 600); do
	url=$(sed -n 's/^kvpager: metrics at //p' "$tmp/err")
	[ -n "$url" ] && break
	kill -0 $pid 2>/dev/null || fail "kvpager ended: $(cat "$tmp/err")"
	sleep 0.1
done
[ -n "$url" ] || fail "no 'metrics at' line: $(cat "$tmp/err")"
case $url in http://127.0.0.1:*/metrics) ;; *) fail "url $url" ;; esac
for i in 1 2 3; do
	curl -sS --max-time 30 -D "$tmp/h$i" -o "$tmp/m$i" "$url" ||
		fail "curl $url"
	kill -0 $pid 2>/dev/null || fail "kvpager ended before scrape $i"
	grep -qi '^content-type: text/plain; version=0.0.4' "$tmp/h$i" ||
		fail "content type: $(cat "$tmp/h$i")"
	$PY tests/metrics_lint.py "$tmp/m$i" || fail "scrape $i does not parse"
	sleep 0.5
done
code=$(curl -s -o /dev/null -w '%{http_code}' "${url%/metrics}/nothing")
[ "$code" = 404 ] || fail "another path: $code, not 404"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url")
[ "$code" = 405 ] || fail "POST: $code, not 405"
# the decode went on between the scrapes
$PY - "$tmp/m1" "$tmp/m3" <<'EOF' || fail "no progress between scrapes"
import sys
from prometheus_client.parser import text_string_to_metric_families as p
def faults(f):
    for fam in p(open(f).read()):
        for s in fam.samples:
            if s.name == "kvpager_demand_faults_total":
                return s.value
a, b = faults(sys.argv[1]), faults(sys.argv[2])
sys.exit(0 if b >= a and b > 0 else 1)
EOF
kill -TERM $pid
wait $pid
rc=$?
pid=
[ $rc = 143 ] || fail "SIGTERM: exit $rc, not 143"
echo "ok: 3 scrapes during the decode parse, 404 and 405 elsewhere"
echo "t_metrics: all passed"
