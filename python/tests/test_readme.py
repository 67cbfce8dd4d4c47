"""The README's Python example runs as written."""

import os
import re

from conftest import ROOT, run_python


def readme_example() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Using kvpager from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs():
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    total, evictions = res.stdout.split()
    assert float(total) == 16 << 20  # 64 MiB of float32 ones
    assert int(evictions) > 0
