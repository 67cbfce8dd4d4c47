/*
 * attention.cu - CUDA decode attention over the device block pool
 * (flash-decoding, GQA; fp16, bf16, fp32), and the scatter of staged
 * blocks into slots (attention_cuda.h).
 *
 * Kernel 1: grid (kv_heads x head groups, splits, nseq), 128 threads.  A
 * thread block takes one share (kvp_paged_split_range) of one sequence's
 * table for up to HG query heads that read the same KV head, so each K
 * and V row is read from memory once for all of them (GQA).  The threads
 * form row groups of lr lanes; a group reads a whole row with one 16-byte
 * load per lane (per 16 bytes of row it owns), two tokens at a time so
 * that four loads are in flight, and reduces each head's score with
 * shuffles inside the group.  Every group keeps each head's running
 * (m, l, acc) slice (the online softmax of attn_common.h); the groups
 * merge by shuffles in a warp, the warps in shared memory, and the block
 * writes each head's partial where kvp_paged_partial says.
 * Kernel 2: grid (q_heads, nseq), one thread per output element: the
 * partials of a head merged as kvp_paged_merge_head does.  Rows are found
 * by kvp_paged_k_off / _v_off: the indexing the CPU tests check.
 */
#include <errno.h>

#include <cuda_fp16.h>

#include "lib/cuda/attention_cuda.h"

#define WARPS 4
#define THREADS (32 * WARPS)
#define UNROLL 2 /* tokens a group has in flight */

/* Elements of a 16-byte vector of dtype T. */
template <int T> struct vec_elems {
	static const int n = T == KVP_ATTN_FP32 ? 4 : 8;
};

/* The 16 bytes at p as fp32 (exact conversions, as kvp_attn_load's). */
template <int T>
__device__ __forceinline__ void vec_to_f32(uint4 u, float *f)
{
	const uint32_t w[4] = { u.x, u.y, u.z, u.w };
	int i;

	if (T == KVP_ATTN_FP32) {
#pragma unroll
		for (i = 0; i < 4; i++)
			f[i] = __uint_as_float(w[i]);
	} else if (T == KVP_ATTN_BF16) {
#pragma unroll
		for (i = 0; i < 4; i++) {
			f[2 * i] = __uint_as_float(w[i] << 16);
			f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
		}
	} else {
#pragma unroll
		for (i = 0; i < 4; i++) {
			f[2 * i] = __half2float(
			    __ushort_as_half((unsigned short)(w[i] & 0xffffu)));
			f[2 * i + 1] = __half2float(
			    __ushort_as_half((unsigned short)(w[i] >> 16)));
		}
	}
}

/* Merge partial (mb, lb, accb[n]) into (ma, la, acca[n]): kvp_attn_merge
 * on registers. */
template <int N>
__device__ __forceinline__ void merge_regs(float &ma, float &la, float *acca,
					   float mb, float lb,
					   const float *accb)
{
	const float m = fmaxf(ma, mb);
	float fa, fb;
	int i;

	if (m == KVP_ATTN_NEG_INF)
		return;
	fa = ma == KVP_ATTN_NEG_INF ? 0.0f : expf(ma - m);
	fb = mb == KVP_ATTN_NEG_INF ? 0.0f : expf(mb - m);
#pragma unroll
	for (i = 0; i < N; i++)
		acca[i] = acca[i] * fa + accb[i] * fb;
	la = la * fa + lb * fb;
	ma = m;
}

/*
 * T: dtype; HG: query heads a block serves (a power of two, >= the
 * group's or a part of it); EPL: elements of a row a lane owns (8 for
 * head_dim <= 256, else 16).  Dynamic shared memory: WARPS * HG * (dim
 * + 2) floats.
 */
template <int T, int HG, int EPL>
__global__ void __launch_bounds__(THREADS)
    kvp_attn_split_kernel(struct kvp_dev_attn a)
{
	extern __shared__ float sm[];
	const int EV = vec_elems<T>::n, NVL = EPL / vec_elems<T>::n;
	const struct kvp_paged_shape *sh = &a.shape;
	const uint32_t dim = sh->head_dim, nvec = dim / EV;
	const uint32_t gq = sh->q_heads / sh->kv_heads;
	const uint32_t hgroups = (gq + HG - 1) / HG;
	const uint32_t j = blockIdx.x / hgroups;
	const uint32_t hfirst = (blockIdx.x % hgroups) * HG;
	const uint32_t h0 = j * gq + hfirst;
	const uint32_t nh = gq - hfirst < HG ? gq - hfirst : HG;
	const uint32_t split = blockIdx.y, seq = blockIdx.z;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const uint32_t G = sh->block_tokens;
	const uint32_t *slots = a.slots + a.off[seq];
	const uint32_t *ntok = a.ntok + a.off[seq];
	const char *pool = (const char *)a.pool;
	const float scale = rsqrtf((float)dim);
	const uint64_t esz = kvp_attn_esize(T);
	float q[HG][EPL], acc[HG][EPL], m[HG], l[HG];
	uint32_t lr = 1, sub, grp, ngrp, gmask, lo, hi, total, f;
	int hh, k, e, u, off;

	/* lanes per row: a power of two (so a group stays in one warp) that
	 * covers the row's vectors NVL at a time */
	while (lr < 32 && lr * NVL < nvec)
		lr <<= 1;
	sub = lane & (lr - 1);
	grp = threadIdx.x / lr;
	ngrp = THREADS / lr;
	gmask = lr == 32 ? 0xffffffffu
			 : ((1u << lr) - 1u) << (lane & ~(lr - 1u));
	kvp_paged_split_range(a.off[seq + 1] - a.off[seq], split, gridDim.y,
			      &lo, &hi);
	/* this lane's slice of each head's query, scaled; zeros past the
	 * row or the group's heads */
#pragma unroll
	for (hh = 0; hh < HG; hh++) {
		m[hh] = KVP_ATTN_NEG_INF;
		l[hh] = 0.0f;
#pragma unroll
		for (k = 0; k < NVL; k++) {
			const uint32_t v = sub + lr * k;
#pragma unroll
			for (e = 0; e < EV; e++) {
				acc[hh][k * EV + e] = 0.0f;
				q[hh][k * EV + e] =
				    (uint32_t)hh < nh && v < nvec
					? a.q[((size_t)seq * sh->q_heads + h0 +
					       hh) * dim +
					      v * EV + e] *
					      scale
					: 0.0f;
			}
		}
	}
	total = (hi - lo) * G;
	for (f = grp; f < total; f += UNROLL * ngrp) {
		uint4 kr[UNROLL][NVL], vr[UNROLL][NVL];
		bool ok[UNROLL];

		/* every load of this step first: 2 * UNROLL * NVL in flight */
#pragma unroll
		for (u = 0; u < UNROLL; u++) {
			const uint32_t ff = f + u * ngrp;
			const uint32_t b = lo + ff / G, t = ff % G;

			ok[u] = ff < total && t < kvp_paged_ntok(sh, ntok, b);
#pragma unroll
			for (k = 0; k < NVL; k++) {
				const uint32_t v = sub + lr * k;

				if (ok[u] && v < nvec) {
					const char *kp =
					    pool +
					    kvp_paged_k_off(sh, slots[b], j,
							    t) +
					    v * 16;
					kr[u][k] = __ldg((const uint4 *)kp);
					vr[u][k] = __ldg(
					    (const uint4 *)(kp +
							    kvp_paged_half_bytes(
								sh)));
				} else {
					kr[u][k] = make_uint4(0, 0, 0, 0);
					vr[u][k] = make_uint4(0, 0, 0, 0);
				}
			}
		}
#pragma unroll
		for (u = 0; u < UNROLL; u++) {
			float kf[EPL], vf[EPL];

			if (!ok[u]) /* the same for the whole group */
				continue;
#pragma unroll
			for (k = 0; k < NVL; k++) {
				vec_to_f32<T>(kr[u][k], kf + k * EV);
				vec_to_f32<T>(vr[u][k], vf + k * EV);
			}
#pragma unroll
			for (hh = 0; hh < HG; hh++) {
				float s = 0.0f, w;

#pragma unroll
				for (e = 0; e < EPL; e++)
					s += q[hh][e] * kf[e];
				for (off = lr / 2; off > 0; off >>= 1)
					s += __shfl_xor_sync(gmask, s, off);
				if (s > m[hh]) {
					const float fr =
					    m[hh] == KVP_ATTN_NEG_INF
						? 0.0f
						: expf(m[hh] - s);

					m[hh] = s;
					l[hh] *= fr;
#pragma unroll
					for (e = 0; e < EPL; e++)
						acc[hh][e] *= fr;
				}
				w = expf(s - m[hh]);
				l[hh] += w;
#pragma unroll
				for (e = 0; e < EPL; e++)
					acc[hh][e] += w * vf[e];
			}
		}
	}
	/* the groups of a warp: lane x and lane x ^ off own the same
	 * elements of different tokens */
	for (off = lr; off < 32; off <<= 1) {
#pragma unroll
		for (hh = 0; hh < HG; hh++) {
			float ob[EPL], mo, lo_;

			mo = __shfl_xor_sync(0xffffffffu, m[hh], off);
			lo_ = __shfl_xor_sync(0xffffffffu, l[hh], off);
#pragma unroll
			for (e = 0; e < EPL; e++)
				ob[e] = __shfl_xor_sync(0xffffffffu,
							acc[hh][e], off);
			merge_regs<EPL>(m[hh], l[hh], acc[hh], mo, lo_, ob);
		}
	}
	/* each warp's first group to shared memory, then the warps merged
	 * into the partials, one thread per (head, element) */
	if (lane < lr) {
#pragma unroll
		for (hh = 0; hh < HG; hh++) {
			float *w = sm + (size_t)(warp * HG + hh) * (dim + 2);

			if (lane == 0) {
				w[0] = m[hh];
				w[1] = l[hh];
			}
#pragma unroll
			for (k = 0; k < NVL; k++) {
				const uint32_t v = sub + lr * k;

				if (v < nvec)
#pragma unroll
					for (e = 0; e < EV; e++)
						w[2 + v * EV + e] =
						    acc[hh][k * EV + e];
			}
		}
	}
	__syncthreads();
	for (f = threadIdx.x; f < nh * dim; f += THREADS) {
		const uint32_t h = f / dim, d = f % dim;
		float mm = KVP_ATTN_NEG_INF, ll = 0.0f, aa = 0.0f, *p;
		int w;

		for (w = 0; w < WARPS; w++)
			mm = fmaxf(mm, sm[(size_t)(w * HG + h) * (dim + 2)]);
		if (mm != KVP_ATTN_NEG_INF)
			for (w = 0; w < WARPS; w++) {
				const float *s =
				    sm + (size_t)(w * HG + h) * (dim + 2);
				const float fr = s[0] == KVP_ATTN_NEG_INF
						     ? 0.0f
						     : expf(s[0] - mm);

				ll += s[1] * fr;
				aa += s[2 + d] * fr;
			}
		p = kvp_paged_partial(a.scratch + (size_t)seq * sh->q_heads *
						      gridDim.y *
						      kvp_paged_partial_floats(dim),
				      h0 + h, split, gridDim.y, dim);
		if (d == 0) {
			p[0] = mm;
			p[1] = ll;
		}
		p[2 + d] = aa;
	}
}

/* kvp_paged_merge_head, one thread per element of the head's output. */
__global__ void kvp_attn_merge_kernel(struct kvp_dev_attn a)
{
	const uint32_t h = blockIdx.x, seq = blockIdx.y;
	const uint32_t dim = a.shape.head_dim;
	const float *scr = a.scratch + (size_t)seq * a.shape.q_heads *
					   a.splits *
					   kvp_paged_partial_floats(dim);
	float *out = a.out + ((size_t)seq * a.shape.q_heads + h) * dim;
	uint32_t d, sp;

	for (d = threadIdx.x; d < dim; d += blockDim.x) {
		float mm = KVP_ATTN_NEG_INF, ll = 0.0f, aa = 0.0f;

		for (sp = 0; sp < a.splits; sp++)
			mm = fmaxf(mm, kvp_paged_partial((float *)scr, h, sp,
							 a.splits, dim)[0]);
		if (mm != KVP_ATTN_NEG_INF)
			for (sp = 0; sp < a.splits; sp++) {
				const float *p = kvp_paged_partial(
				    (float *)scr, h, sp, a.splits, dim);
				const float fr = p[0] == KVP_ATTN_NEG_INF
						     ? 0.0f
						     : expf(p[0] - mm);

				ll += p[1] * fr;
				aa += p[2 + d] * fr;
			}
		out[d] = ll > 0.0f ? aa / ll : 0.0f;
	}
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

template <int T, int HG, int EPL>
static void launch_split(const struct kvp_dev_attn *a, cudaStream_t st)
{
	const struct kvp_paged_shape *sh = &a->shape;
	const uint32_t gq = sh->q_heads / sh->kv_heads;
	dim3 grid(sh->kv_heads * ((gq + HG - 1) / HG), a->splits, a->nseq);
	size_t shm = sizeof(float) * WARPS * HG * (sh->head_dim + 2);

	kvp_attn_split_kernel<T, HG, EPL><<<grid, THREADS, shm, st>>>(*a);
}

/* The heads a block serves: the group (a power of two at least its
 * size), at most 64 / EPL so that q and acc stay in registers. */
template <int T, int EPL>
static void launch_epl(const struct kvp_dev_attn *a, cudaStream_t st)
{
	const uint32_t gq = a->shape.q_heads / a->shape.kv_heads;

	if (gq <= 1)
		launch_split<T, 1, EPL>(a, st);
	else if (gq <= 2)
		launch_split<T, 2, EPL>(a, st);
	else if (gq <= 4 || EPL > 8)
		launch_split<T, 4, EPL>(a, st);
	else
		launch_split<T, 64 / EPL, EPL>(a, st);
}

template <int T>
static void launch_dtype(const struct kvp_dev_attn *a, cudaStream_t st)
{
	/* a row of 256 elements or fewer: 8 per lane covers it */
	if (a->shape.head_dim <= 256)
		launch_epl<T, 8>(a, st);
	else
		launch_epl<T, 16>(a, st);
}

extern "C" int kvp_cuda_attend(const struct kvp_dev_attn *a, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	const struct kvp_paged_shape *sh = &a->shape;

	if (!a->nseq || !sh->kv_heads || sh->q_heads % sh->kv_heads ||
	    !sh->head_dim || sh->head_dim % 8 ||
	    sh->head_dim > KVP_DEV_MAX_DIM || !a->splits || a->splits > 65535 ||
	    !sh->block_tokens || sh->slot_bytes % 16 || !a->scratch)
		return -EINVAL;
	switch (sh->dtype) {
	case KVP_ATTN_FP16:
		launch_dtype<KVP_ATTN_FP16>(a, st);
		break;
	case KVP_ATTN_BF16:
		launch_dtype<KVP_ATTN_BF16>(a, st);
		break;
	case KVP_ATTN_FP32:
		launch_dtype<KVP_ATTN_FP32>(a, st);
		break;
	default:
		return -EINVAL;
	}
	if (cudaGetLastError() != cudaSuccess)
		return -EIO;
	kvp_attn_merge_kernel<<<dim3(sh->q_heads, a->nseq), 128, 0, st>>>(*a);
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
