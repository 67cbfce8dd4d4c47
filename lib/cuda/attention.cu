/*
 * attention.cu - CUDA decode attention over the device block pool
 * (flash-decoding, GQA; fp16, bf16, fp32), and the scatter of staged
 * blocks into slots (attention_cuda.h).
 *
 * Kernel 1: grid (q_heads, splits, nseq), 128 threads.  Each thread block
 * takes the share kvp_paged_split_range gives it of one sequence's table
 * for one query head; each warp takes every 4th token of each block:
 * lanes split the head dimension, a shuffle reduction gives the score,
 * and every lane keeps the running (m, l) and its slice of acc (the online
 * softmax of attn_common.h).  The warps then merge in shared memory and
 * the thread block writes its partial where kvp_paged_partial says.
 * Kernel 2: grid (q_heads, nseq); kvp_paged_merge_head.  Rows are found by
 * kvp_paged_k_off / _v_off: the indexing the CPU tests check.
 */
#include <errno.h>

#include "lib/cuda/attention_cuda.h"

#define WARPS 4
#define MAX_PER_LANE (KVP_DEV_MAX_DIM / 32)

template <int T>
__global__ void kvp_attn_split_kernel(struct kvp_dev_attn a)
{
	const struct kvp_paged_shape *sh = &a.shape;
	const uint32_t h = blockIdx.x, split = blockIdx.y, seq = blockIdx.z;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	/* lane x holds elements x, x + 32, ...: per of them, the last
	 * partly (head_dim need not be a multiple of 32) */
	const uint32_t dim = sh->head_dim, per = (dim + 31) / 32;
	const uint32_t j = kvp_paged_kv_head(sh, h);
	const uint32_t *slots = a.slots + a.off[seq];
	const uint32_t *ntok = a.ntok + a.off[seq];
	const size_t qf = (size_t)sh->q_heads * dim;
	__shared__ float qs[KVP_DEV_MAX_DIM];
	__shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][KVP_DEV_MAX_DIM];
	float acc[MAX_PER_LANE], m = KVP_ATTN_NEG_INF, l = 0.0f;
	const float scale = rsqrtf((float)dim);
	uint32_t lo, hi, i, b, t, e;

	kvp_paged_split_range(a.off[seq + 1] - a.off[seq], split, gridDim.y,
			      &lo, &hi);
	for (i = threadIdx.x; i < dim; i += blockDim.x)
		qs[i] = a.q[seq * qf + (size_t)h * dim + i] * scale;
	for (e = 0; e < MAX_PER_LANE; e++)
		acc[e] = 0.0f;
	__syncthreads();
	for (b = lo; b < hi; b++) {
		const uint32_t nt = kvp_paged_ntok(sh, ntok, b);

		for (t = warp; t < nt; t += WARPS) {
			const char *k = (const char *)a.pool +
					kvp_paged_k_off(sh, slots[b], j, t);
			const char *v = (const char *)a.pool +
					kvp_paged_v_off(sh, slots[b], j, t);
			float s = 0.0f, w, f;
			int off;

			for (e = 0; e < per; e++)
				if (lane + 32 * e < dim)
					s += qs[lane + 32 * e] *
					     kvp_attn_load(T, k, lane + 32 * e);
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
				if (lane + 32 * e < dim)
					acc[e] += w * kvp_attn_load(T, v,
								    lane + 32 * e);
		}
	}
	for (e = 0; e < per; e++)
		if (lane + 32 * e < dim)
			wacc[warp][lane + 32 * e] = acc[e];
	if (lane == 0) {
		wm[warp] = m;
		wl[warp] = l;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		float *scr = a.scratch + (size_t)seq * sh->q_heads * gridDim.y *
					     kvp_paged_partial_floats(dim);
		float *p = kvp_paged_partial(scr, h, split, gridDim.y, dim);

		p[0] = wm[0];
		p[1] = wl[0];
		for (i = 0; i < dim; i++)
			p[2 + i] = wacc[0][i];
		for (i = 1; i < WARPS; i++)
			kvp_attn_merge(&p[0], &p[1], p + 2, wm[i], wl[i],
				       wacc[i], dim);
	}
}

__global__ void kvp_attn_merge_kernel(struct kvp_dev_attn a)
{
	const uint32_t h = blockIdx.x, seq = blockIdx.y;
	const uint32_t dim = a.shape.head_dim;
	float *scr = a.scratch + (size_t)seq * a.shape.q_heads * a.splits *
				     kvp_paged_partial_floats(dim);

	if (threadIdx.x != 0)
		return;
	kvp_paged_merge_head(scr, h, a.splits, dim,
			     a.out + (size_t)seq * a.shape.q_heads * dim);
}

__global__ void kvp_scatter_kernel(struct kvp_dev_scatter s)
{
	const uint4 *src =
	    (const uint4 *)((const char *)s.src + (size_t)blockIdx.x * s.bytes);
	uint4 *dst = (uint4 *)((char *)s.dst + s.slots[blockIdx.x] * s.stride);
	uint64_t i, n = s.bytes / 16;

	for (i = threadIdx.x; i < n; i += blockDim.x)
		dst[i] = src[i];
}

extern "C" int kvp_cuda_attend(const struct kvp_dev_attn *a, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	const struct kvp_paged_shape *sh = &a->shape;
	dim3 grid(sh->q_heads, a->splits, a->nseq);

	if (!a->nseq || !sh->kv_heads || sh->q_heads % sh->kv_heads ||
	    !sh->head_dim || sh->head_dim % 8 ||
	    sh->head_dim > KVP_DEV_MAX_DIM || !a->splits || a->splits > 65535 ||
	    !sh->block_tokens || !a->scratch)
		return -EINVAL;
	switch (sh->dtype) {
	case KVP_ATTN_FP16:
		kvp_attn_split_kernel<KVP_ATTN_FP16>
		    <<<grid, 32 * WARPS, 0, st>>>(*a);
		break;
	case KVP_ATTN_BF16:
		kvp_attn_split_kernel<KVP_ATTN_BF16>
		    <<<grid, 32 * WARPS, 0, st>>>(*a);
		break;
	case KVP_ATTN_FP32:
		kvp_attn_split_kernel<KVP_ATTN_FP32>
		    <<<grid, 32 * WARPS, 0, st>>>(*a);
		break;
	default:
		return -EINVAL;
	}
	if (cudaGetLastError() != cudaSuccess)
		return -EIO;
	kvp_attn_merge_kernel<<<dim3(sh->q_heads, a->nseq), 32, 0, st>>>(*a);
	if (cudaGetLastError() != cudaSuccess)
		return -EIO;
	return 0;
}

extern "C" int kvp_cuda_scatter(const struct kvp_dev_scatter *s, void *stream)
{
	if (s->bytes % 16 || s->stride % 16)
		return -EINVAL;
	if (!s->count)
		return 0;
	kvp_scatter_kernel<<<s->count, 256, 0, (cudaStream_t)stream>>>(*s);
	return cudaGetLastError() == cudaSuccess ? 0 : -EIO;
}
