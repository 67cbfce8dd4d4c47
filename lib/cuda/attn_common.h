/*
 * attn_common.h - attention math shared by the CPU code and the CUDA kernel.
 *
 * Plain C11 that nvcc also compiles: every function is KVP_HD, which is
 * __host__ __device__ under nvcc and static inline elsewhere.  No libc
 * beyond <math.h> (expf) and <stdint.h>/<string.h>-free bit casts, no
 * project headers, so lib/cuda/attention.cu needs nothing else.  The CPU
 * tests (tests/test_attention.c) run this code through the scalar path of
 * lib/kv/attention.c.
 *
 * Online softmax (Milakov & Gimelshein; flash-decoding): a partial result
 * over some tokens is (m, l, acc[dim]): the running max score m, the sum
 * l = sum exp(s_t - m) and acc = sum exp(s_t - m) v_t.  Partials merge by
 * rescaling to the larger max; the output is acc / l.
 */
#ifndef KVP_CUDA_ATTN_COMMON_H
#define KVP_CUDA_ATTN_COMMON_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KVP_HD __host__ __device__ __forceinline__ static
#else
#define KVP_HD static inline
#endif

/* Element types, numbered as enum kvp_kv_dtype in lib/kv/kv_geometry.h. */
#define KVP_ATTN_FP16 0
#define KVP_ATTN_BF16 1
#define KVP_ATTN_FP32 2

/* A score no real one reaches: the max of an empty partial. */
#define KVP_ATTN_NEG_INF (-INFINITY)

union kvp_attn_bits {
	float f;
	uint32_t u;
};

KVP_HD float kvp_attn_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	union kvp_attn_bits b;

	if (exp == 0x1f) { /* inf, nan */
		b.u = sign | 0x7f800000u | (man << 13);
	} else if (exp != 0) { /* normal */
		b.u = sign | ((exp + 112u) << 23) | (man << 13);
	} else if (man == 0) { /* zero */
		b.u = sign;
	} else { /* subnormal: renormalise */
		exp = 113;
		while (!(man & 0x400u)) {
			man <<= 1;
			exp--;
		}
		b.u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
	}
	return b.f;
}

/* Round to nearest even, overflow to inf, nan kept nan. */
KVP_HD uint16_t kvp_attn_f32_to_f16(float f)
{
	union kvp_attn_bits b;
	uint32_t sign, abs;

	b.f = f;
	sign = (b.u >> 16) & 0x8000u;
	abs = b.u & 0x7fffffffu;
	if (abs >= 0x7f800000u) /* inf or nan */
		return (uint16_t)(sign | 0x7c00u |
				  (abs > 0x7f800000u ? 0x200u : 0));
	if (abs >= 0x477ff000u) /* rounds to >= 65520: inf */
		return (uint16_t)(sign | 0x7c00u);
	if (abs >= 0x38800000u) { /* normal half */
		uint32_t mant = abs + 0xc8000fffu + ((abs >> 13) & 1u);

		return (uint16_t)(sign | (mant >> 13));
	}
	/* subnormal half or zero: add 0.5 (as a float) and take the bits */
	{
		union kvp_attn_bits t;

		t.u = abs;
		t.f += 0.5f;
		return (uint16_t)(sign | (t.u - 0x3f000000u));
	}
}

KVP_HD float kvp_attn_bf16_to_f32(uint16_t h)
{
	union kvp_attn_bits b;

	b.u = (uint32_t)h << 16;
	return b.f;
}

KVP_HD uint16_t kvp_attn_f32_to_bf16(float f)
{
	union kvp_attn_bits b;

	b.f = f;
	if ((b.u & 0x7fffffffu) > 0x7f800000u) /* nan stays quiet nan */
		return (uint16_t)((b.u >> 16) | 0x40u);
	b.u += 0x7fffu + ((b.u >> 16) & 1u);
	return (uint16_t)(b.u >> 16);
}

/* Element i of an array of dtype t (KVP_ATTN_*), as fp32. */
KVP_HD float kvp_attn_load(int t, const void *base, uint32_t i)
{
	if (t == KVP_ATTN_FP32)
		return ((const float *)base)[i];
	if (t == KVP_ATTN_BF16)
		return kvp_attn_bf16_to_f32(((const uint16_t *)base)[i]);
	return kvp_attn_f16_to_f32(((const uint16_t *)base)[i]);
}

/* Bytes of one element of dtype t. */
KVP_HD uint32_t kvp_attn_esize(int t)
{
	return t == KVP_ATTN_FP32 ? 4u : 2u;
}

/* q . k over dim elements, k of dtype t, in fp32. */
KVP_HD float kvp_attn_dot(int t, const float *q, const void *k, uint32_t dim)
{
	float s = 0.0f;
	uint32_t i;

	for (i = 0; i < dim; i++)
		s += q[i] * kvp_attn_load(t, k, i);
	return s;
}

/*
 * One online-softmax step: a new max m_new >= *m for scores about to be
 * added.  Returns the factor every part of the old partial (l and acc)
 * must be multiplied by, and sets *m = m_new.  An empty partial (m =
 * -inf) gives 0.
 */
KVP_HD float kvp_attn_rescale(float *m, float m_new)
{
	float f = *m == KVP_ATTN_NEG_INF ? 0.0f : expf(*m - m_new);

	*m = m_new;
	return f;
}

/* Weight of score s under max m (m >= s). */
KVP_HD float kvp_attn_weight(float s, float m)
{
	return expf(s - m);
}

/*
 * Merge partial (mb, lb, accb) into (ma, la, acca), dim elements.  Either
 * may be empty (m = -inf, l = 0).
 */
KVP_HD void kvp_attn_merge(float *ma, float *la, float *acca, float mb,
			   float lb, const float *accb, uint32_t dim)
{
	float m = *ma > mb ? *ma : mb;
	float fa, fb;
	uint32_t i;

	if (m == KVP_ATTN_NEG_INF)
		return;
	fa = *ma == KVP_ATTN_NEG_INF ? 0.0f : expf(*ma - m);
	fb = mb == KVP_ATTN_NEG_INF ? 0.0f : expf(mb - m);
	for (i = 0; i < dim; i++)
		acca[i] = acca[i] * fa + accb[i] * fb;
	*la = *la * fa + lb * fb;
	*ma = m;
}

/* out = acc / l (zeros if l is 0). */
KVP_HD void kvp_attn_finish(float l, const float *acc, float *out, uint32_t dim)
{
	float inv = l > 0.0f ? 1.0f / l : 0.0f;
	uint32_t i;

	for (i = 0; i < dim; i++)
		out[i] = acc[i] * inv;
}

/*
 * kvp_attn_block_head - add one KV block's tokens to the partial of one
 * query head: the scalar reference of the inner loop.
 *
 * k, v: the head's K and V rows in the block (ntok rows of dim elements of
 * dtype t, one after another); q: the head's query, already multiplied by
 * the softmax scale 1/sqrt(dim); (m, l, acc) the partial, updated.
 */
KVP_HD void kvp_attn_block_head(int t, const void *k, const void *v,
				uint32_t ntok, uint32_t dim, const float *q,
				float *m, float *l, float *acc)
{
	uint32_t es = kvp_attn_esize(t);
	float s[64];
	uint32_t base, j, i;

	/* in chunks of 64 tokens: scores, one rescale, then the values */
	for (base = 0; base < ntok; base += 64) {
		uint32_t n = ntok - base < 64 ? ntok - base : 64;
		float mx = *m, f;

		for (j = 0; j < n; j++) {
			const char *kr =
			    (const char *)k + (size_t)(base + j) * dim * es;

			s[j] = kvp_attn_dot(t, q, kr, dim);
			if (s[j] > mx)
				mx = s[j];
		}
		f = kvp_attn_rescale(m, mx);
		*l *= f;
		for (i = 0; i < dim; i++)
			acc[i] *= f;
		for (j = 0; j < n; j++) {
			const char *vr =
			    (const char *)v + (size_t)(base + j) * dim * es;
			float w = kvp_attn_weight(s[j], mx);

			*l += w;
			for (i = 0; i < dim; i++)
				acc[i] += w * kvp_attn_load(t, vr, i);
		}
	}
}

#endif /* KVP_CUDA_ATTN_COMMON_H */
