/*
 * attention_cuda.h - decode attention over paged KV on a CUDA device.
 *
 * Plain C declarations (no CUDA types) for build/lib/libkvpager-cuda.a, built
 * from lib/cuda/attention.cu when nvcc is found.  The math is
 * lib/cuda/attn_common.h, the same code the CPU path runs (tested there).
 *
 * One call: for one sequence and one layer, the attention of the query over
 * n KV blocks in the layout of lib/kv/kv_geometry.h, each at byte offset
 * offsets[i] from kv_base, all in device memory.  The kernel splits the
 * blocks over `splits` thread blocks per query head (flash-decoding) and
 * merges the partials in a second kernel.
 */
#ifndef KVP_CUDA_ATTENTION_H
#define KVP_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_cuda_attn_args {
	uint32_t q_heads, kv_heads, head_dim, block_tokens;
	int dtype;		 /* KVP_ATTN_FP16 / BF16 / FP32 */
	const void *kv_base;	 /* device: the KV pool */
	const uint64_t *offsets; /* device: n byte offsets of the blocks */
	const uint32_t *ntokens; /* device: n valid token counts, or NULL */
	uint32_t n;		 /* blocks, >= 1 */
	const float *q;		 /* device: q_heads * head_dim */
	float *out;		 /* device: q_heads * head_dim */
	float *scratch;		 /* device: kvp_cuda_attn_scratch_floats() */
	uint32_t splits;	 /* thread blocks per head, 1 .. 1024 */
};

/* Floats of scratch a call with these parameters needs. */
size_t kvp_cuda_attn_scratch_floats(uint32_t q_heads, uint32_t head_dim,
				    uint32_t splits);

/*
 * Launch both kernels on stream (a cudaStream_t; NULL: the default
 * stream); returns 0 or -EINVAL (bad arguments: head_dim over 512 or not a
 * multiple of 32, ...) or -EIO (a launch failed).  Asynchronous.
 */
int kvp_cuda_attn_decode(const struct kvp_cuda_attn_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVP_CUDA_ATTENTION_H */
