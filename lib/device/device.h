/*
 * device.h - an accelerator for decode attention, opened by name.
 *
 *   "cuda"  the first CUDA device, through libkvpager-cuda.so (built from
 *           lib/cuda/ when nvcc was found), loaded with dlopen only when
 *           asked for: nothing else in kvpager needs the CUDA runtime.
 *   "emu"   a CPU emulation of a device (lib/device/dev_emu.c): device
 *           memory is host memory, the kernel is the scalar code of
 *           lib/cuda/paged_attn.h, and the two streams are deferred and
 *           run in an adversarial order, so that a schedule that lets a
 *           copy overwrite what a kernel still reads, or reuses a staging
 *           buffer too early, gives wrong results.  For tests and for
 *           checking the path on a machine without a GPU; its timings
 *           mean nothing.
 *
 * The attention engine on a device is devattn.h.
 */
#ifndef KVP_DEVICE_H
#define KVP_DEVICE_H

#include <stddef.h>

#include "lib/cuda/dev_ops.h"

struct kvp_device;

/* Where the emulation runs each stream's queued operations. */
enum kvp_emu_order {
	KVP_EMU_COPY_FIRST = 0,	   /* copies at once, kernels at the last
				      moment: catches slot reuse races */
	KVP_EMU_ALL_LATE = 1,	   /* both deferred to the last moment:
				      catches staging reuse races */
	KVP_EMU_IMMEDIATE = 2,	   /* everything at issue (in order) */
};

/*
 * kvp_device_open - open device `name` ("cuda" or "emu"; NULL: "cuda").
 * Returns 0 and *out, or -ENODEV with msg (len bytes, NUL-terminated)
 * saying what is missing and the remedy: a kvpager built without nvcc
 * (no libkvpager-cuda.so), no libcudart, no CUDA driver, no device; or
 * -EINVAL for an unknown name.  Nothing is left behind on failure.
 */
int kvp_device_open(const char *name, struct kvp_device **out, char *msg,
		    size_t len);
/* NULL is a no-op.  Everything made on it must be freed first. */
void kvp_device_close(struct kvp_device *d);

/* "cuda" or "emu". */
const char *kvp_device_kind(const struct kvp_device *d);
/* What it is, e.g. "NVIDIA H200, 139.8 GiB, CUDA runtime 13.0". */
void kvp_device_describe(struct kvp_device *d, char *buf, size_t len);

/* The emulation's order (emu only; others ignore it). */
void kvp_device_emu_order(struct kvp_device *d, enum kvp_emu_order o);

/* The device's operations and handle (for devattn.c). */
const struct kvp_dev_ops *kvp_device_ops(const struct kvp_device *d);
void *kvp_device_handle(const struct kvp_device *d);

/* Where `cuda` looks for libkvpager-cuda.so: $KVP_CUDA_LIB, else next to
 * the running program (../lib/ and its own folder), else the loader's
 * search path.  For messages. */
const char *kvp_device_cuda_lib_name(void);

#endif /* KVP_DEVICE_H */
