/*
 * dev_ops.h - what kvpager asks of an accelerator: memory, asynchronous
 * copies on two streams, events, and the paged attention launch.
 *
 * Plain C (no CUDA types) so that the host code (lib/device/) and the CUDA
 * code (lib/cuda/device_cuda.cu, in libkvpager-cuda.so) share it.  Two
 * implementations: the CUDA one, found at run time by dlopen
 * (lib/device/device.c), and the CPU emulation (lib/device/dev_emu.c),
 * which runs the same schedule with deferred streams so that the tests
 * catch a copy that overwrites what a kernel still reads.
 *
 * Every call returns 0 or -errno (-ENOMEM, -EIO for a failed device call,
 * -EINVAL); none leaves a partial allocation behind.  Calls are made by
 * one thread at a time.  Streams run their operations in issue order;
 * an operation on one stream may run before, during or after any of the
 * other stream's unless an event orders them.
 */
#ifndef KVP_CUDA_DEV_OPS_H
#define KVP_CUDA_DEV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "lib/cuda/paged_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_DEV_STREAM_COMPUTE 0 /* kernels, their inputs and outputs */
#define KVP_DEV_STREAM_COPY 1	 /* KV blocks to the pool */
#define KVP_DEV_STREAMS 2
#define KVP_DEV_EVENTS 8 /* events are numbered 0 .. KVP_DEV_EVENTS-1 */
#define KVP_DEV_MAX_DIM 512 /* head_dim: a multiple of 8, at most this */

/* One launch: the attention of nseq sequences of one layer over the pool. */
struct kvp_dev_attn {
	struct kvp_paged_shape shape; /* geometry and slot_bytes */
	const void *pool;	      /* device: the slots */
	const uint32_t *off;	      /* device: nseq + 1 offsets into slots */
	const uint32_t *slots;	      /* device: each sequence's table */
	const uint32_t *ntok;	      /* device: valid tokens per entry */
	uint32_t nseq;		      /* sequences, >= 1 */
	const float *q;		      /* device: nseq * q_heads * head_dim */
	float *out;		      /* device: as q */
	float *scratch;		      /* device: kvp_dev_scratch_floats() */
	uint32_t splits;	      /* shares per (sequence, head), >= 1 */
};

/* Floats of scratch a launch needs. */
static inline size_t kvp_dev_scratch_floats(uint32_t nseq, uint32_t q_heads,
					    uint32_t head_dim, uint32_t splits)
{
	return (size_t)nseq * q_heads * splits *
	       kvp_paged_partial_floats(head_dim);
}

/* A move inside device memory: count blocks of `bytes` each from
 * src + i * bytes to dst + slots[i] * stride (slots in device memory). */
struct kvp_dev_scatter {
	void *dst;
	const void *src;
	const uint32_t *slots;
	uint32_t count;
	uint64_t bytes, stride;
};

struct kvp_dev_ops {
	const char *name; /* "cuda", "emu" */
	/* open the first device; msg gets what is missing on failure */
	int (*open)(void **dev, char *msg, size_t len);
	void (*close)(void *dev);
	/* "NVIDIA H200, 139 GiB, runtime 13.0" and the like */
	void (*describe)(void *dev, char *buf, size_t len);
	int (*mem_alloc)(void *dev, size_t bytes, void **p);
	void (*mem_free)(void *dev, void *p);
	/* page-locked host memory, the source of asynchronous copies */
	int (*host_alloc)(void *dev, size_t bytes, void **p);
	void (*host_free)(void *dev, void *p);
	/* asynchronous on stream: host -> device (to_dev) or back */
	int (*copy)(void *dev, void *dst, const void *src, size_t bytes,
		    int to_dev, int stream);
	int (*scatter)(void *dev, const struct kvp_dev_scatter *s,
		       int stream);
	int (*attend)(void *dev, const struct kvp_dev_attn *a, int stream);
	/* event e marks what stream has issued so far */
	int (*record)(void *dev, int event, int stream);
	/* stream's later operations wait for event e */
	int (*stream_wait)(void *dev, int stream, int event);
	/* the host waits for event e (never recorded: returns at once) */
	int (*event_sync)(void *dev, int event);
};

/* The entry point libkvpager-cuda.so exports (lib/device/device.c). */
typedef const struct kvp_dev_ops *(*kvp_dev_ops_fn)(void);
#define KVP_CUDA_OPS_SYMBOL "kvp_cuda_dev_ops"

#ifdef __cplusplus
}
#endif

#endif /* KVP_CUDA_DEV_OPS_H */
