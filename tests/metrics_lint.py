#!/usr/bin/python3
"""metrics_lint.py FILE - check a Prometheus text exposition (format 0.0.4).

Parsed by Debian's python3-prometheus-client (every line must parse), then
held to the naming conventions (prometheus.io/docs/practices/naming):
every family has one # HELP and one # TYPE line; counters end in _total and
nothing else does; units are base units (_seconds, _bytes, no _us, _ms,
_kib...); a histogram has _bucket (cumulative, with le="+Inf"), _sum and
_count, its +Inf bucket equal to its count.  Exit 0 clean, 1 with the
problems on stderr.
"""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
NOT_BASE = re.compile(r"_(us|usec|ms|msec|ns|nanoseconds|microseconds|"
                      r"milliseconds|minutes|hours|kb|kib|mb|mib|gb|gib|"
                      r"percent)(_|$)")


def lint(text):
    problems = []
    helps, types = {}, {}
    for line in text.splitlines():
        m = re.match(r"^# (HELP|TYPE) (\S+) (.*)$", line)
        if not m:
            continue
        kind, name, rest = m.groups()
        seen = helps if kind == "HELP" else types
        if name in seen:
            problems.append(f"{kind} twice for {name}")
        seen[name] = rest
        if not rest.strip():
            problems.append(f"empty {kind} for {name}")
    families = list(text_string_to_metric_families(text))
    if not families:
        problems.append("no metric families")
    for name, typ in types.items():
        if name not in helps:
            problems.append(f"{name}: a TYPE and no HELP")
        if not NAME.match(name):
            problems.append(f"{name}: not a metric name")
        if NOT_BASE.search(name):
            problems.append(f"{name}: not in base units")
        if typ == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: a counter not ending in _total")
        if typ != "counter" and name.endswith("_total"):
            problems.append(f"{name}: a {typ} ending in _total")
    for fam in families:
        for s in fam.samples:
            base = s.name
            for suffix in ("_bucket", "_sum", "_count"):
                if fam.type == "histogram" and base.endswith(suffix):
                    base = base[: -len(suffix)]
            if base not in types:
                problems.append(f"{s.name}: no # TYPE line for it")
        if fam.type != "histogram":
            continue
        names = {s.name for s in fam.samples}
        for suffix in ("_bucket", "_sum", "_count"):
            if fam.name + suffix not in names:
                problems.append(f"{fam.name}: histogram without {suffix}")
        series = {}
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items()
                               if k != "le"))
            series.setdefault(key, {"b": [], "count": None})
            if s.name.endswith("_bucket"):
                series[key]["b"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                series[key]["count"] = s.value
        for key, v in series.items():
            b = sorted(v["b"])
            if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
                problems.append(f"{fam.name}{key}: buckets not cumulative")
            if not b or b[-1][0] != float("inf"):
                problems.append(f"{fam.name}{key}: no le=\"+Inf\" bucket")
            elif b[-1][1] != v["count"]:
                problems.append(f"{fam.name}{key}: +Inf bucket is not "
                                f"the count")
    return problems


def main():
    with open(sys.argv[1]) as f:
        text = f.read()
    try:
        problems = lint(text)
    except ValueError as e:
        problems = [f"does not parse: {e}"]
    for p in problems:
        print(f"{sys.argv[1]}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
