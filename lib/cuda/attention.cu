/*
 * attention.cu - CUDA decode attention over paged KV (flash-decoding).
 *
 * Kernel 1: grid (q_heads, splits), 128 threads.  Each thread block takes a
 * contiguous share of the listed KV blocks for one query head; each warp
 * takes every 4th token of it: lanes split the head dimension, a shuffle
 * reduction gives the score, and every lane keeps the running (m, l) and
 * its slice of acc (the online softmax of attn_common.h).  The warps then
 * merge in shared memory and the thread block writes its partial.
 * Kernel 2: grid q_heads; merges the splits (kvp_attn_merge) and finishes.
 */
#include <errno.h>

#include "lib/cuda/attn_common.h"
#include "lib/cuda/attention_cuda.h"

#define WARPS 4
#define MAX_PER_LANE 16 /* head_dim <= 512 */

__global__ void kvp_attn_split_kernel(struct kvp_cuda_attn_args a)
{
	const uint32_t h = blockIdx.x, split = blockIdx.y;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const uint32_t dim = a.head_dim, per = dim / 32;
	const uint32_t j = h / (a.q_heads / a.kv_heads);
	const uint32_t es = kvp_attn_esize(a.dtype);
	const size_t half = (size_t)a.kv_heads * a.block_tokens * dim * es;
	const uint32_t lo = (uint32_t)((uint64_t)a.n * split / gridDim.y);
	const uint32_t hi = (uint32_t)((uint64_t)a.n * (split + 1) / gridDim.y);
	__shared__ float qs[512];
	__shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][512];
	float acc[MAX_PER_LANE], m = KVP_ATTN_NEG_INF, l = 0.0f;
	const float scale = rsqrtf((float)dim);
	uint32_t i, b, t, e;

	for (i = threadIdx.x; i < dim; i += blockDim.x)
		qs[i] = a.q[(size_t)h * dim + i] * scale;
	for (e = 0; e < MAX_PER_LANE; e++)
		acc[e] = 0.0f;
	__syncthreads();
	for (b = lo; b < hi; b++) {
		const char *blk = (const char *)a.kv_base + a.offsets[b];
		const uint32_t nt = a.ntokens ? a.ntokens[b] : a.block_tokens;

		for (t = warp; t < nt; t += WARPS) {
			const size_t row = ((size_t)j * a.block_tokens + t) * dim;
			const char *k = blk + row * es, *v = blk + half + row * es;
			float s = 0.0f, w, f;
			int off;

			for (e = 0; e < per; e++)
				s += qs[lane + 32 * e] *
				     kvp_attn_load(a.dtype, k, lane + 32 * e);
			for (off = 16; off > 0; off >>= 1)
				s += __shfl_xor_sync(0xffffffffu, s, off);
			if (s > m) {
				f = kvp_attn_rescale(&m, s);
				l *= f;
				for (e = 0; e < per; e++)
					acc[e] *= f;
			}
			w = kvp_attn_weight(s, m);
			l += w;
			for (e = 0; e < per; e++)
				acc[e] += w * kvp_attn_load(a.dtype, v,
							    lane + 32 * e);
		}
	}
	for (e = 0; e < per; e++)
		wacc[warp][lane + 32 * e] = acc[e];
	if (lane == 0) {
		wm[warp] = m;
		wl[warp] = l;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		float *p = a.scratch + ((size_t)h * gridDim.y + split) * (dim + 2);

		p[0] = wm[0];
		p[1] = wl[0];
		for (i = 0; i < dim; i++)
			p[2 + i] = wacc[0][i];
		for (i = 1; i < WARPS; i++)
			kvp_attn_merge(&p[0], &p[1], p + 2, wm[i], wl[i],
				       wacc[i], dim);
	}
}

__global__ void kvp_attn_merge_kernel(struct kvp_cuda_attn_args a)
{
	const uint32_t h = blockIdx.x, dim = a.head_dim;
	float *base = a.scratch + (size_t)h * a.splits * (dim + 2);
	uint32_t s;

	if (threadIdx.x != 0)
		return;
	for (s = 1; s < a.splits; s++) {
		float *p = base + (size_t)s * (dim + 2);

		kvp_attn_merge(&base[0], &base[1], base + 2, p[0], p[1], p + 2,
			       dim);
	}
	kvp_attn_finish(base[1], base + 2, a.out + (size_t)h * dim, dim);
}

extern "C" size_t kvp_cuda_attn_scratch_floats(uint32_t q_heads,
					       uint32_t head_dim,
					       uint32_t splits)
{
	return (size_t)q_heads * splits * (head_dim + 2);
}

extern "C" int kvp_cuda_attn_decode(const struct kvp_cuda_attn_args *a,
				    void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;

	if (!a || a->n == 0 || a->kv_heads == 0 || a->q_heads % a->kv_heads ||
	    a->head_dim == 0 || a->head_dim % 32 || a->head_dim > 512 ||
	    a->splits == 0 || a->splits > 1024 || a->block_tokens == 0 ||
	    !a->scratch || a->dtype < 0 || a->dtype > 2)
		return -EINVAL;
	kvp_attn_split_kernel<<<dim3(a->q_heads, a->splits), 32 * WARPS, 0,
				st>>>(*a);
	if (cudaGetLastError() != cudaSuccess)
		return -EIO;
	kvp_attn_merge_kernel<<<a->q_heads, 32, 0, st>>>(*a);
	if (cudaGetLastError() != cudaSuccess)
		return -EIO;
	return 0;
}
