#!/bin/bash
# t_python.sh - the Python binding's tests (python/tests, pytest) against
# the package built in $BUILD/python, with Debian's python3.  Prints
# pytest's pass and fail counts; skips (77) when numpy or pytest are
# missing (make deps installs them) or the build is sanitized (python3
# is not, and an instrumented libkvpager cannot be loaded into it).
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}

case "$BUILD" in *build-*)
	echo "t_python: skipped in a sanitizer build ($BUILD): python3 cannot load an instrumented libkvpager"
	exit 77 ;;
esac
[ -x "$PYTHON" ] || { echo "t_python: $PYTHON not found"; exit 77; }
if ! "$PYTHON" -c 'import numpy, pytest' 2>/dev/null; then
	echo "t_python: numpy or pytest missing for $PYTHON: run make deps (apt-get install python3-numpy python3-pytest)"
	exit 77
fi
[ -f "$BUILD/python/kvpager/_abi.py" ] ||
	{ echo "t_python: $BUILD/python/kvpager not built: run make"; exit 1; }

export BUILD
export PYTHONPATH="$BUILD/python"
# -p no:cacheprovider: no .pytest_cache in the source tree.
"$PYTHON" -m pytest -p no:cacheprovider -q -rs python/tests
rc=$?
[ $rc = 5 ] && { echo "t_python: no tests collected"; exit 1; }
exit $rc
