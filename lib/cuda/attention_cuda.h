/*
 * attention_cuda.h - the CUDA kernels of libkvpager-cuda.so: decode
 * attention over the device block pool, and the scatter of staged blocks
 * into pool slots.
 *
 * Plain C declarations (no CUDA types).  The indexing and the math are
 * lib/cuda/paged_attn.h and attn_common.h, the same code the CPU runs in
 * tests/test_devpool.c; the arguments are dev_ops.h's.
 */
#ifndef KVP_CUDA_ATTENTION_H
#define KVP_CUDA_ATTENTION_H

#include "lib/cuda/dev_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Flash-decoding over paged KV with GQA: kernel 1, grid (kv_heads x head
 * groups, splits, nseq), computes each (head, share) partial into
 * scratch, reading each KV row once for the query heads of its group;
 * kernel 2, grid (q_heads, nseq), merges them into out.  slot_bytes must
 * be a multiple of 16 (rows are read 16 bytes at a time).  Launched on stream (a
 * cudaStream_t; NULL: the default stream), asynchronous.  Returns 0,
 * -EINVAL (head_dim not a multiple of 8 or over KVP_DEV_MAX_DIM, splits
 * 0, q_heads not a multiple of kv_heads, a bad dtype) or -EIO (a launch
 * failed).
 */
int kvp_cuda_attend(const struct kvp_dev_attn *a, void *stream);

/* The scatter of dev_ops.h on stream: 0, -EINVAL (bytes not a multiple
 * of 16), -EIO. */
int kvp_cuda_scatter(const struct kvp_dev_scatter *s, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVP_CUDA_ATTENTION_H */
