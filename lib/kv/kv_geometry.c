/*
 * kv_geometry.c - KV cache shapes, element conversion and region layout.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "lib/cuda/attn_common.h"
#include "lib/kv/kv_geometry.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVP_HAVE_X86 1
#endif

struct preset {
	const char *name;
	struct kvp_kv_geometry g;
};

static const struct preset presets[] = {
	{ "llama3-8b", { 32, 32, 8, 128, KVP_KV_FP16, 4 } },
	{ "qwen3-8b", { 36, 32, 8, 128, KVP_KV_FP16, 4 } },
	{ "tiny", { 2, 4, 2, 16, KVP_KV_FP32, 4 } },
};

static const char *const preset_names[] = { "llama3-8b", "qwen3-8b", "tiny",
					    NULL };

int kvp_kv_geometry_preset(const char *name, struct kvp_kv_geometry *out)
{
	size_t i;

	if (!name)
		return -ENOENT;
	for (i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		if (!strcmp(presets[i].name, name)) {
			*out = presets[i].g;
			return 0;
		}
	}
	return -ENOENT;
}

const char *const *kvp_kv_geometry_presets(void)
{
	return preset_names;
}

int kvp_kv_geometry_check(const struct kvp_kv_geometry *g)
{
	if (!g || g->layers == 0 || g->kv_heads == 0 || g->q_heads == 0)
		return -EINVAL;
	if (g->q_heads > KVP_KV_MAX_Q_HEADS || g->q_heads % g->kv_heads)
		return -EINVAL;
	if (g->head_dim < 8 || g->head_dim > KVP_KV_MAX_HEAD_DIM ||
	    g->head_dim % 8)
		return -EINVAL;
	if (g->block_tokens == 0 || g->block_tokens > KVP_KV_MAX_BLOCK_TOKENS)
		return -EINVAL;
	if (g->dtype != KVP_KV_FP16 && g->dtype != KVP_KV_BF16 &&
	    g->dtype != KVP_KV_FP32)
		return -EINVAL;
	return 0;
}

size_t kvp_kv_dtype_size(enum kvp_kv_dtype t)
{
	return t == KVP_KV_FP32 ? 4 : 2;
}

const char *kvp_kv_dtype_name(enum kvp_kv_dtype t)
{
	switch (t) {
	case KVP_KV_FP16:
		return "fp16";
	case KVP_KV_BF16:
		return "bf16";
	case KVP_KV_FP32:
		return "fp32";
	}
	return "?";
}

int kvp_kv_dtype_parse(const char *name, enum kvp_kv_dtype *out)
{
	static const enum kvp_kv_dtype all[] = { KVP_KV_FP16, KVP_KV_BF16,
						 KVP_KV_FP32 };
	size_t i;

	for (i = 0; name && i < 3; i++) {
		if (!strcmp(name, kvp_kv_dtype_name(all[i]))) {
			*out = all[i];
			return 0;
		}
	}
	return -EINVAL;
}

size_t kvp_kv_token_layer_bytes(const struct kvp_kv_geometry *g)
{
	return 2 * (size_t)g->kv_heads * g->head_dim *
	       kvp_kv_dtype_size(g->dtype);
}

size_t kvp_kv_token_bytes(const struct kvp_kv_geometry *g)
{
	return kvp_kv_token_layer_bytes(g) * g->layers;
}

size_t kvp_kv_block_bytes(const struct kvp_kv_geometry *g)
{
	return kvp_kv_token_layer_bytes(g) * g->block_tokens;
}

static size_t pow2_ceil(size_t x)
{
	size_t p = 1;

	while (p < x)
		p <<= 1;
	return p;
}

size_t kvp_kv_block_stride(const struct kvp_kv_geometry *g)
{
	return pow2_ceil(kvp_kv_block_bytes(g));
}

/* ---- element conversion ---- */

float kvp_kv_f16_to_f32(uint16_t h)
{
	return kvp_attn_f16_to_f32(h);
}

uint16_t kvp_kv_f32_to_f16(float f)
{
	return kvp_attn_f32_to_f16(f);
}

float kvp_kv_bf16_to_f32(uint16_t h)
{
	return kvp_attn_bf16_to_f32(h);
}

uint16_t kvp_kv_f32_to_bf16(float f)
{
	return kvp_attn_f32_to_bf16(f);
}

bool kvp_cpu_simd(void)
{
#ifdef KVP_HAVE_X86
	static int cached = -1;
	int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);

	/* racing first callers compute the same value */
	if (c < 0) {
		c = __builtin_cpu_supports("avx2") &&
		    __builtin_cpu_supports("f16c") &&
		    __builtin_cpu_supports("fma");
		__atomic_store_n(&cached, c, __ATOMIC_RELAXED);
	}
	return c;
#else
	return false;
#endif
}

#ifdef KVP_HAVE_X86

__attribute__((target("f16c,avx2"))) static size_t
f16_to_f32_x86(const uint16_t *s, float *d, size_t n)
{
	size_t i;

	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(
					    (const __m128i *)(s + i))));
	return i;
}

__attribute__((target("f16c,avx2"))) static size_t
f32_to_f16_x86(const float *s, uint16_t *d, size_t n)
{
	size_t i;

	for (i = 0; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(d + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
						 _MM_FROUND_TO_NEAREST_INT));
	return i;
}

__attribute__((target("avx2"))) static size_t
bf16_to_f32_x86(const uint16_t *s, float *d, size_t n)
{
	size_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		__m256i w = _mm256_cvtepu16_epi32(
		    _mm_loadu_si128((const __m128i *)(s + i)));

		_mm256_storeu_ps(d + i,
				 _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
	}
	return i;
}
#endif

void kvp_kv_to_f32(enum kvp_kv_dtype t, const void *src, float *dst, size_t n)
{
	const uint16_t *s = src;
	size_t i = 0;

	if (t == KVP_KV_FP32) {
		memcpy(dst, src, n * sizeof(float));
		return;
	}
#ifdef KVP_HAVE_X86
	if (kvp_cpu_simd())
		i = t == KVP_KV_FP16 ? f16_to_f32_x86(s, dst, n)
				     : bf16_to_f32_x86(s, dst, n);
#endif
	for (; i < n; i++)
		dst[i] = t == KVP_KV_FP16 ? kvp_attn_f16_to_f32(s[i])
					  : kvp_attn_bf16_to_f32(s[i]);
}

void kvp_kv_from_f32(enum kvp_kv_dtype t, const float *src, void *dst, size_t n)
{
	uint16_t *d = dst;
	size_t i = 0;

	if (t == KVP_KV_FP32) {
		memcpy(dst, src, n * sizeof(float));
		return;
	}
#ifdef KVP_HAVE_X86
	if (t == KVP_KV_FP16 && kvp_cpu_simd())
		i = f32_to_f16_x86(src, d, n);
#endif
	for (; i < n; i++)
		d[i] = t == KVP_KV_FP16 ? kvp_attn_f32_to_f16(src[i])
					: kvp_attn_f32_to_bf16(src[i]);
}

/* ---- layout ---- */

size_t kvp_kv_pager_block_choose(const struct kvp_kv_geometry *g,
				 size_t target_bytes)
{
	size_t want = kvp_kv_block_stride(g);

	if (want < 4096)
		want = 4096;
	if (target_bytes > want)
		want = target_bytes;
	return pow2_ceil(want);
}

int kvp_kv_layout_init(struct kvp_kv_layout *l, const struct kvp_kv_geometry *g,
		       uint64_t min_capacity_blocks, size_t pager_block_bytes)
{
	struct kvp_kv_layout n;
	uint64_t per, cap;

	if (kvp_kv_geometry_check(g) || min_capacity_blocks == 0)
		return -EINVAL;
	memset(&n, 0, sizeof(n));
	n.geo = *g;
	n.block_stride = kvp_kv_block_stride(g);
	if (pager_block_bytes == 0)
		pager_block_bytes = kvp_kv_pager_block_choose(g, 0);
	if (pager_block_bytes < 4096 || pager_block_bytes < n.block_stride ||
	    (pager_block_bytes & (pager_block_bytes - 1)))
		return -EINVAL;
	n.pager_block_bytes = pager_block_bytes;
	per = pager_block_bytes / n.block_stride;
	cap = (min_capacity_blocks + per - 1) / per * per;
	if (cap >= UINT32_MAX)
		return -EOVERFLOW;
	if (cap > SIZE_MAX / n.block_stride / g->layers)
		return -EOVERFLOW;
	n.blocks_per_pager_block = (uint32_t)per;
	n.capacity_blocks = (uint32_t)cap;
	n.layer_bytes = (size_t)cap * n.block_stride;
	n.region_bytes = n.layer_bytes * g->layers;
	*l = n;
	return 0;
}

void kvp_kv_layout_pager_span(const struct kvp_kv_layout *l, uint64_t pb,
			      uint32_t *layer, uint32_t *first_pblock)
{
	uint64_t per_layer = l->layer_bytes / l->pager_block_bytes;

	*layer = (uint32_t)(pb / per_layer);
	*first_pblock =
	    (uint32_t)((pb % per_layer) * l->blocks_per_pager_block);
}
