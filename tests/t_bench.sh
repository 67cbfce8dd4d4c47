#!/bin/bash
# t_bench.sh - tools/kvpbench: what its output promises.
#
# A short run of stream and random (one thread) with the modes side by
# side: each JSON line has the fields the README and the issue name
# (scenario, block_bytes, threads, mode, gb_per_s; ratio_vs_raw and
# ratio_vs_mmap for kvpager modes), the data read was verified, the CPU
# accounting is there and consistent (cpu_s, cpu_us_per_block,
# machine_busy; cpu_pager_s of the pager's threads, part of cpu_s), the
# table has its columns, bad options are refused with a message and
# exit 2, and a run killed with SIGKILL leaves no backing file behind;
# `kvpbench touch` gives every mode's line, verified, with its bytes read
# and written (or says why a mode was skipped); `kvpbench decode` says
# where each step goes (STEP), the disk's rate (DISK) and the reuse slots.  `kvpbench compute` prints a rate for each CPU-bound part (the
# rates are not judged: speed belongs to benchmarks, not tests).
#
# Needs $BUILD/bin/kvpbench (run by tests/run-tests.sh with BUILD set).
. "$(dirname "$0")/helpers/counted.sh"
B="$BUILD/bin/kvpbench"
need "$B"
command -v python3 >/dev/null || { echo "t_bench: python3 not found"; exit 77; }

"$B" --short stream random --threads 1 --repeat 1 --quiet --json \
	--dir "$tmp" >"$tmp/json" 2>"$tmp/err"
rc=$?
cat "$tmp/json" "$tmp/err"
[ $rc = 0 ] || fail "kvpbench --json exit $rc"

python3 - "$tmp/json" <<'PY' || fail "JSON lines do not keep their promises"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = []
def need(ok, what):
    if not ok:
        bad.append(what)

modes = {(r["scenario"], r["mode"]) for r in rows}
for sc in ("stream", "random"):
    for m in ("raw", "mmap", "kvpager-move", "kvpager-copy"):
        need((sc, m) in modes, f"no {sc} {m} line")
for r in rows:
    tag = f'{r.get("scenario")} {r.get("mode")}'
    for k in ("scenario", "block_bytes", "threads", "mode", "gb_per_s"):
        need(k in r, f"{tag}: no {k}")
    need(r.get("verified") is True, f"{tag}: data not verified")
    need(r.get("gb_per_s", 0) > 0, f"{tag}: gb_per_s {r.get('gb_per_s')}")
    need(r.get("cpu_s", -1) >= 0, f"{tag}: no cpu_s")
    need(r.get("cpu_us_per_block", -1) >= 0, f"{tag}: no cpu_us_per_block")
    blocks = r["bytes"] / r["block_bytes"]
    need(abs(r["cpu_us_per_block"] - r["cpu_s"] * 1e6 / blocks) <=
         0.05 * r["cpu_us_per_block"] + 0.1,
         f"{tag}: cpu_us_per_block is not cpu_s per block")
    need(0 <= r.get("machine_busy", -1) <= 1,
         f"{tag}: machine_busy {r.get('machine_busy')}")
    if r["mode"].startswith("kvpager"):
        for k in ("ratio_vs_raw", "ratio_vs_mmap", "install_mode",
                  "demand_faults_total", "cpu_pager_s"):
            need(k in r, f"{tag}: no {k}")
        need(0 <= r.get("cpu_pager_s", -1) <= r["cpu_s"] + 0.02,
             f"{tag}: cpu_pager_s {r.get('cpu_pager_s')} not within "
             f"cpu_s {r['cpu_s']}")
        raw = [q for q in rows if q["mode"] == "raw" and
               q["scenario"] == r["scenario"] and
               q["threads"] == r["threads"] and not q.get("reference")]
        if raw:
            want = r["gb_per_s"] / raw[0]["gb_per_s"]
            need(abs(r["ratio_vs_raw"] - want) < 0.01 * want + 1e-3,
                 f"{tag}: ratio_vs_raw {r['ratio_vs_raw']} is not "
                 f"gb_per_s over raw's ({want:.4f})")
    else:
        need("cpu_pager_s" not in r, f"{tag}: cpu_pager_s without a pager")
# A kvpager mode spends CPU in its service threads; raw has none.
copy = [r for r in rows if r["mode"] == "kvpager-copy" and
        r["scenario"] == "random"]
need(copy and copy[0].get("cpu_pager_s", 0) > 0,
     "random kvpager-copy: its service threads took no CPU")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY

"$B" --short random --threads 1 --modes raw,kvpager-copy --repeat 1 \
	--quiet --dir "$tmp" >"$tmp/table" 2>&1
rc=$?
cat "$tmp/table"
[ $rc = 0 ] || fail "kvpbench (table) exit $rc"
for col in vs_raw vs_mmap cpu/blk busy faults; do
	head -n 3 "$tmp/table" | grep -q "$col" || fail "table: no $col column"
done
grep -Eq '^random +64K +1 +1 +kvpager-copy +[0-9.]+ .* [0-9]+us +[0-9]+%' \
	"$tmp/table" || fail "table: kvpager-copy row without cpu/blk and busy"

"$B" compute --repeat 1 --json >"$tmp/compute" 2>&1
rc=$?
cat "$tmp/compute"
[ $rc = 0 ] || fail "kvpbench compute exit $rc"
python3 - "$tmp/compute" <<'PY' || fail "compute lines do not keep their promises"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
got = {(r["what"], r["threads"], r["path"] == "scalar") for r in rows
       if r.get("scenario") == "compute" and r.get("gb_per_s", 0) > 0}
want = {("synth_fill", 1, False), ("attention", 1, False),
        ("attention", 2, False), ("attention", 1, True)}
for w in sorted(want - got):
    print("  no compute line for", w)
sys.exit(1 if want - got else 0)
PY

# touch: 4 KiB touches over 8 x the budget, the four modes side by side.
# Correctness only: every line that ran read the right words, counted its
# bytes, and the pager read at least what was touched, each sequential
# block about once, and wrote nothing on ro lines.
"$B" touch --budget 8M --touches 128 --threads 1 --quiet --json \
	--dir "$tmp" >"$tmp/touch" 2>"$tmp/touch.err"
rc=$?
cat "$tmp/touch" "$tmp/touch.err"
[ $rc = 0 ] || fail "kvpbench touch exit $rc"
python3 - "$tmp/touch" <<'PY' || fail "touch lines do not keep their promises"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
bad = []
def need(ok, what):
    if not ok:
        bad.append(what)

for pat in ("random", "sequential"):
    for acc in ("ro", "rw"):
        for mode in ("raw", "mmap", "kvpager", "preload"):
            got = [r for r in rows if (r["pattern"], r["access"],
                                       r["mode"]) == (pat, acc, mode)]
            need(len(got) == 1, f"{pat} {acc} {mode}: {len(got)} lines")
for r in rows:
    tag = f'{r["pattern"]} {r["access"]} {r["mode"]}'
    if "skipped" in r:
        # Only the lines that need the host: a cgroup, the shim.
        need(r["mode"] in ("mmap", "preload") and r["skipped"],
             f"{tag}: skipped ({r['skipped']})")
        continue
    need(r.get("verified") is True, f"{tag}: data not verified")
    need(r["touches"] > 0 and r["bytes"] == r["touches"] * 4096,
         f"{tag}: bytes {r['bytes']} is not touches x 4 KiB")
    need(r["gb_per_s"] > 0 and r["cpu_us_per_touch"] >= 0,
         f"{tag}: no rate or CPU")
    need(abs(r["amplification"] * r["bytes"] - r["read_bytes"]) <=
         0.001 * r["read_bytes"] + 1, f"{tag}: amplification is not "
         "read_bytes over bytes")
    if r["mode"] == "raw":
        need(r["read_bytes"] == r["bytes"], f"{tag}: raw read "
             f"{r['read_bytes']}, not the {r['bytes']} touched")
    if r["mode"] == "kvpager":
        need(r["read_bytes"] >= r["bytes"], f"{tag}: read less than "
             "it touched")
        need(r["block_bytes"] >= 4096, f"{tag}: no block_bytes")
        # The pager's own figures: its faults, its reads (at least what
        # was touched) and its threads' CPU.
        need(r.get("demand_faults_total", 0) > 0 and
             r.get("bytes_read_total", 0) >= r["bytes"] and
             r.get("cpu_pager_us_per_touch", -1) >= 0,
             f"{tag}: no pager statistics")
        if r["pattern"] == "sequential":
            need(r["amplification"] <= 2, f"{tag}: amplification "
                 f"{r['amplification']}: blocks read more than twice")
        need((r["written_bytes"] == 0) == (r["access"] == "ro"),
             f"{tag}: wrote {r['written_bytes']} bytes")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
# random --busy: a competing process spins on every CPU meanwhile; each
# line says so, and the pager's CPU per block is reported.
"$B" --short random --threads 4 --reads 32 --ref-depth 0 --repeat 1 \
	--modes raw,kvpager-copy --busy --quiet --json --dir "$tmp" \
	>"$tmp/busy" 2>&1
rc=$?
cat "$tmp/busy"
[ $rc = 0 ] || fail "kvpbench random --busy exit $rc"
python3 - "$tmp/busy" "$(nproc)" <<'PY' || fail "random --busy lines do not keep their promises"
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cpus = int(sys.argv[2])
bad = []
if {r["mode"] for r in rows} != {"raw", "kvpager-copy"}:
    bad.append(f"modes {sorted(r['mode'] for r in rows)}")
for r in rows:
    if r.get("busy_threads") != cpus:
        bad.append(f"{r['mode']}: busy_threads {r.get('busy_threads')}, "
                   f"want {cpus}")
    if r["mode"] == "kvpager-copy" and r.get("cpu_pager_us_per_block", -1) < 0:
        bad.append("kvpager-copy: no cpu_pager_us_per_block")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY

"$B" touch --touch-block 3K >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "--touch-block 3K: exit $rc, want 2"

"$B" --modes bogus >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "--modes bogus: exit $rc, want 2"
grep -q "kvpager-copy" "$tmp/bad" || fail "--modes bogus: the message does not list the modes"
"$B" --budget 12Q >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "--budget 12Q: exit $rc, want 2"
grep -q -- "--budget" "$tmp/bad" || fail "--budget 12Q: the message does not name the option"
# A backing file too small for a scenario is refused before any run,
# with the smallest size that works: stream reads whole --blocks, random
# gives each of its threads (4 with the raw anchor line) a --random-block,
# and reads at most 4 x the budget, which must hold a --block.
"$B" --file-size 1M --repeat 1 --dir "$tmp" >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "--file-size 1M: exit $rc, want 2: $(cat "$tmp/bad")"
grep -q -- "use --file-size 2M or more" "$tmp/bad" ||
	fail "--file-size 1M: no remedy: $(cat "$tmp/bad")"
grep -q "^random" "$tmp/bad" && fail "--file-size 1M: random ran anyway"
"$B" random --file-size 128K --repeat 1 --dir "$tmp" >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "random --file-size 128K: exit $rc, want 2: $(cat "$tmp/bad")"
grep -q -- "use --file-size 256K or more" "$tmp/bad" ||
	fail "random --file-size 128K: no remedy: $(cat "$tmp/bad")"
"$B" stream --block 1G --budget 2M --repeat 1 --dir "$tmp" >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "stream --block 1G --budget 2M: exit $rc, want 2: $(cat "$tmp/bad")"
grep -q -- "use --budget 256M or more" "$tmp/bad" ||
	fail "stream --block 1G --budget 2M: no remedy: $(cat "$tmp/bad")"
"$B" random --file-size 256K --repeat 1 --modes raw --quiet --dir "$tmp" \
	>"$tmp/bad" 2>&1 || fail "random --file-size 256K: exit $?: $(cat "$tmp/bad")"
ls "$tmp"/kvpbench* 2>/dev/null && fail "a backing file was left in $tmp"

# decode: a --warmup that leaves no step to measure is refused, as
# kvpager run refuses it, not lowered.
"$B" decode --preset tiny --context 4096 --predictor window --steps 2 \
	--warmup 2 --quiet >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "decode --steps 2 --warmup 2: exit $rc, want 2"
grep -q -- "--warmup 2 leaves no step to measure" "$tmp/bad" ||
	fail "decode --warmup 2: no message: $(cat "$tmp/bad")"
# an operand is refused (exit 2), as compute and tier refuse one: before,
# decode ignored it and ran
timeout 60 "$B" decode --preset tiny --context 4096 --steps 2 --quiet \
	extra >"$tmp/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "decode extra: exit $rc, want 2"
grep -q "^kvpbench decode: unexpected 'extra'" "$tmp/bad" ||
	fail "decode extra: no message: $(cat "$tmp/bad")"

# kvpbench decode says where each mode's step goes, parts adding up to
# T_step, and for the pager the disk's rate on its own file; a sparse
# predictor reads into reuse slots, counted in the RAM line's frames,
# adjacent blocks in one read.
"$B" decode --preset tiny --context 4096 --predictor window --steps 4 \
	--warmup 0 --rounds 5 --budget 3M --modes ram,kvpager --quiet --path "$tmp" \
	>"$tmp/dec" 2>&1 || fail "kvpbench decode exit $?: $(cat "$tmp/dec")"
cat "$tmp/dec"
python3 - "$tmp/dec" <<'PY' || fail "decode's STEP, DISK or RAM lines break their promise"
import re, sys
text = open(sys.argv[1]).read()
for mode in ("ram", "kvpager"):
    m = re.search(r"^STEP %s +([0-9.]+) s = attention ([0-9.]+) \+ predictor "
                  r"([0-9.]+) \+ new K/V ([0-9.]+) \+ waiting on loads "
                  r"([0-9.]+) \+ the rest (-?[0-9.]+)$" % mode, text, re.M)
    assert m, "no STEP line for " + mode
    parts = [float(x) for x in m.groups()]
    assert abs(sum(parts[1:]) - parts[0]) < 0.0005, m.group(0)
m = re.search(r"^DISK kvpager +([0-9.]+) GB/s raw: random 4 KiB reads", text, re.M)
assert m and float(m.group(1)) > 0, "no DISK line with a rate"
# the window's adjacent blocks are read several to a read
m = re.search(r"^DISK kvpager .*, ([0-9]+) blocks a step in ([0-9]+) reads$",
              text, re.M)
assert m and 0 < int(m.group(2)) < int(m.group(1)), "no blocks in fewer reads"
m = re.search(r"^RAM kvpager .*frames ([0-9.]+) .*reuse slots ([0-9.]+) of it",
              text, re.M)
assert m and 0 < float(m.group(2)) < float(m.group(1)), "no reuse slots"
# the 4 measured steps ran in 4 rounds (--rounds 5 asks more rounds than
# steps), the modes taking turns; vs_ram is the median of the rounds'
m = re.search(r"^ROUNDS kvpager +vs ram, round by round:((?: [0-9.]+)+) "
              r"\(median ([0-9.]+)\)$", text, re.M)
assert m, "no ROUNDS line for kvpager"
each = sorted(float(x) for x in m.group(1).split())
assert len(each) == 4, m.group(0)
med = (each[1] + each[2]) / 2
assert abs(med - float(m.group(2))) < 0.002, m.group(0)
row = re.search(r"^kvpager +(.*)$", text, re.M).group(1).split()
assert abs(float(row[8]) - med) < 0.002, "vs_ram %s is not the median %.3f" % (row[8], med)
PY

# A misspelt KVP_ variable is named once with the one meant (before, it
# was ignored without a word), however many pagers the run opens.
KVP_IO_DEPHT=8 "$B" --short stream random --modes kvpager-move,kvpager-copy \
	--threads 1 --repeat 1 --quiet --dir "$tmp" >/dev/null 2>"$tmp/err" ||
	fail "kvpbench with KVP_IO_DEPHT: exit $?"
[ "$(grep -c "^kvpbench: warning: KVP_IO_DEPHT is not a variable kvpager reads: ignored (did you mean KVP_IO_DEPTH?)" "$tmp/err")" = 1 ] ||
	fail "KVP_IO_DEPHT not named once: $(cat "$tmp/err")"

# Killed with SIGKILL while it holds its backing file (up to 1 GiB),
# kvpbench leaves nothing in --dir: the file never has a name.
mkdir "$tmp/kill"
"$B" --short stream --quiet --dir "$tmp/kill" >/dev/null 2>&1 &
pid=$!
held=0
for _ in $(seq 600); do # until it holds the file, 60 s at most
	if ls -l /proc/$pid/fd 2>/dev/null | grep -q "$tmp/kill/"; then
		held=1
		break
	fi
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
[ $held = 1 ] || fail "kvpbench never held a file in $tmp/kill"
left=$(ls -A "$tmp/kill")
[ -z "$left" ] || fail "kvpbench killed with SIGKILL left '$left' behind"

finish t_bench
