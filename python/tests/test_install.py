"""`make install` puts the package where Debian's python3 finds it for the
PREFIX, recording the library's directory; the installed copy imports and
works."""

import os
import subprocess
import sys

from conftest import BUILD, ROOT


def test_make_install_into_dist_packages(tmp_path):
    # make runs us from make check: its MAKEFLAGS (jobserver) are not ours.
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    res = subprocess.run(
        ["make", "--no-print-directory", "-j1", f"BUILD={BUILD}",
         f"DESTDIR={tmp_path}", "PREFIX=/usr", "install"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    site = tmp_path / "usr/lib/python3/dist-packages"
    pkg = site / "kvpager"
    assert (pkg / "_abi.py").is_file() and (pkg / "pager.py").is_file()
    assert (pkg / "_installed.py").read_text() == 'LIBDIR = "/usr/lib"\n'
    # The recorded /usr/lib is not there yet (DESTDIR): name the library.
    code = ("import kvpager, os; p = kvpager.Pager(budget='4M', "
            "pool_prefault_bytes=0); p.close(); "
            "print(os.path.dirname(kvpager.__file__))")
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env=dict(env, PYTHONPATH=str(site),
                 KVPAGER_LIBRARY=str(tmp_path / "usr/lib/libkvpager.so.0")),
        timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(pkg)
