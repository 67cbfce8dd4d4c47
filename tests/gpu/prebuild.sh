#!/bin/bash
# tests/gpu/prebuild.sh - build what tests/gpu/run.sh runs, here, for a GPU
# machine that has the driver but not the build's Debian packages (a
# rented or borrowed one).  From the repository root:
#
#   tests/gpu/prebuild.sh [ARCH]        (default sm_90: H100, H200)
#
# Rebuilds the CUDA objects for ARCH (and PTX, so a newer GPU JIT-compiles
# it), builds the programs and the two device tests, and copies into
# build/gpu-libs the shared libraries they load that a machine without
# Debian's -dev packages may lack (liburing, libfuse3, hiredis, libsodium,
# ...; never the C library or the C++ runtime, which the GPU machine has).
# Then take build/ there and run: KVP_GPU_PREBUILT=1 tests/gpu/run.sh
set -eu
arch=${1:-sm_90}
case $arch in
sm_[0-9]*) ;;
*)
	echo "prebuild.sh: ARCH '$arch' is not sm_NN (e.g. sm_90)" >&2
	exit 2
	;;
esac
B=build
# NVCCFLAGS is not a prerequisite of the objects: drop them so that make
# compiles them again for this arch.
rm -f $B/obj/lib/cuda/*.o $B/lib/libkvpager-cuda.a $B/lib/libkvpager-cuda.so
make -j"$(nproc)" \
	NVCCFLAGS="-O3 -gencode arch=compute_${arch#sm_},code=$arch -gencode arch=compute_${arch#sm_},code=compute_${arch#sm_}" \
	all $B/tests/test_devpool $B/tests/test_kvcache_device
[ -f $B/lib/libkvpager-cuda.so ] || {
	echo "prebuild.sh: no $B/lib/libkvpager-cuda.so: nvcc was not found" >&2
	exit 1
}
rm -rf $B/gpu-libs
mkdir -p $B/gpu-libs
ldd $B/bin/* $B/lib/*.so $B/tests/test_devpool $B/tests/test_kvcache_device \
	2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
	grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
	while read -r lib; do cp -L "$lib" $B/gpu-libs/; done
# the GPU machine's copy of the tree may carry no (or an old) .git
git rev-parse --short HEAD >$B/gpu-commit 2>/dev/null || echo unknown >$B/gpu-commit
git diff --quiet HEAD 2>/dev/null || sed -i 's/$/ (with changes not committed)/' $B/gpu-commit
echo "prebuild.sh: built for $arch; $(ls $B/gpu-libs | wc -l) libraries in $B/gpu-libs ($(du -sh $B/gpu-libs | cut -f1))"
