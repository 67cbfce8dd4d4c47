/*
 * kv_geometry.h - the shape of a KV cache and its layout in a region.
 *
 * A geometry names a model's attention shape: layers, query heads, KV heads
 * (grouped-query attention: q_heads / kv_heads query heads share one KV
 * head), head dimension, element type, and G, the tokens of one KV block.
 *
 * One KV block holds K and V of G consecutive tokens of one sequence, all
 * KV heads, one layer, contiguous:
 *
 *   K[kv_head][slot][dim]  then  V[kv_head][slot][dim]       (slot < G)
 *
 * A layout places KV blocks in a region (a pager region, or plain memory):
 * layer-major, so that one layer's physical blocks are contiguous and a
 * pager block holds a whole number of KV blocks of one layer:
 *
 *   offset(layer, pblock) = layer * layer_bytes + pblock * block_stride
 *
 * Physical block numbers (from block_table.h) are shared by all layers: a
 * sequence's logical block maps to one physical number, and the layer picks
 * the row.  Nothing here allocates or locks; all calls are pure.
 */
#ifndef KVP_KV_GEOMETRY_H
#define KVP_KV_GEOMETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kvp_kv_dtype {
	KVP_KV_FP16 = 0, /* IEEE binary16 */
	KVP_KV_BF16 = 1, /* bfloat16 (the top half of a binary32) */
	KVP_KV_FP32 = 2, /* IEEE binary32 */
};

/* Limits that every geometry must respect (checked by _check). */
#define KVP_KV_MAX_HEAD_DIM	512u /* multiple of 8, 8 .. 512 */
#define KVP_KV_MAX_Q_HEADS	256u /* q_heads, a multiple of kv_heads */
#define KVP_KV_MAX_BLOCK_TOKENS 1024u

struct kvp_kv_geometry {
	uint32_t layers;	 /* transformer layers, >= 1 */
	uint32_t q_heads;	 /* query heads, a multiple of kv_heads */
	uint32_t kv_heads;	 /* KV heads (GQA), >= 1 */
	uint32_t head_dim;	 /* elements per head, a multiple of 8 */
	enum kvp_kv_dtype dtype; /* element type of K and V */
	uint32_t block_tokens;	 /* G: tokens per KV block, 1 .. 1024 */
};

/*
 * kvp_kv_geometry_preset - fill *out with a named preset.
 *
 *   llama3-8b  32 layers, 32 q heads, 8 KV heads, head dim 128, fp16:
 *              128 KiB of KV per token, 4 KiB per token and layer
 *   qwen3-8b   36 layers, 32 q heads, 8 KV heads, head dim 128, fp16:
 *              144 KiB per token
 *   tiny       2 layers, 4 q heads, 2 KV heads, head dim 16, fp32: for tests
 *
 * Every preset has G = 4 (KVSwap's group on NVMe); change block_tokens
 * afterwards if wanted.  Returns 0, or -ENOENT for an unknown name (*out
 * untouched).
 */
int kvp_kv_geometry_preset(const char *name, struct kvp_kv_geometry *out);

/* The preset names, NULL-terminated, for help texts. */
const char *const *kvp_kv_geometry_presets(void);

/*
 * kvp_kv_geometry_check - 0 if *g respects the limits above, else -EINVAL.
 * Every function below that takes a geometry assumes it passed this check.
 */
int kvp_kv_geometry_check(const struct kvp_kv_geometry *g);

/* Bytes of one element: 2, 2 or 4. */
size_t kvp_kv_dtype_size(enum kvp_kv_dtype t);
/* "fp16", "bf16", "fp32". */
const char *kvp_kv_dtype_name(enum kvp_kv_dtype t);
/* Parse one of those names; 0 or -EINVAL (*out untouched). */
int kvp_kv_dtype_parse(const char *name, enum kvp_kv_dtype *out);

/* Query heads per KV head. */
static inline uint32_t kvp_kv_group(const struct kvp_kv_geometry *g)
{
	return g->q_heads / g->kv_heads;
}

/* K and V of one token in one layer (4 KiB for llama3-8b). */
size_t kvp_kv_token_layer_bytes(const struct kvp_kv_geometry *g);
/* K and V of one token in all layers (128 KiB for llama3-8b). */
size_t kvp_kv_token_bytes(const struct kvp_kv_geometry *g);
/* One KV block: 2 * G * kv_heads * head_dim * element size. */
size_t kvp_kv_block_bytes(const struct kvp_kv_geometry *g);
/*
 * Distance between two physical KV blocks of one layer: block_bytes
 * rounded up to a power of two (so that a power-of-two pager block holds a
 * whole number of them).  Equal to block_bytes for every preset.
 */
size_t kvp_kv_block_stride(const struct kvp_kv_geometry *g);

/* Byte offset, inside a KV block, of K (resp. V) of (kv_head, slot). */
static inline size_t kvp_kv_k_offset(const struct kvp_kv_geometry *g,
				     uint32_t kv_head, uint32_t slot)
{
	size_t es = g->dtype == KVP_KV_FP32 ? 4 : 2;

	return ((size_t)kv_head * g->block_tokens + slot) * g->head_dim * es;
}

static inline size_t kvp_kv_v_offset(const struct kvp_kv_geometry *g,
				     uint32_t kv_head, uint32_t slot)
{
	size_t es = g->dtype == KVP_KV_FP32 ? 4 : 2;
	size_t half = (size_t)g->kv_heads * g->block_tokens * g->head_dim * es;

	return half + kvp_kv_k_offset(g, kv_head, slot);
}

/*
 * Element conversion.  n elements; src and dst must not overlap.  Uses
 * F16C/AVX2 when the CPU has them (checked once at run time), else a
 * portable loop with the same results (round to nearest even).
 */
void kvp_kv_to_f32(enum kvp_kv_dtype t, const void *src, float *dst, size_t n);
void kvp_kv_from_f32(enum kvp_kv_dtype t, const float *src, void *dst,
		     size_t n);
/* Single elements (the same functions the attention code uses). */
float kvp_kv_f16_to_f32(uint16_t h);
uint16_t kvp_kv_f32_to_f16(float f);
float kvp_kv_bf16_to_f32(uint16_t h);
uint16_t kvp_kv_f32_to_bf16(float f);

/*
 * kvp_kv_pager_block_choose - a pager block size for geometry *g.
 *
 * Returns the smallest power of two that is >= 4 KiB, >= the block stride
 * and >= target_bytes (target 0: one KV block per pager block, rounded up
 * to 4 KiB).  A sparse predictor wants one KV block per pager block (no
 * read amplification: llama3-8b at G = 4 gives 16 KiB); the exact
 * predictor reads whole layers and can use large blocks (256 KiB .. 2 MiB).
 */
size_t kvp_kv_pager_block_choose(const struct kvp_kv_geometry *g,
				 size_t target_bytes);

/* Where KV blocks live in a region (see the file comment). */
struct kvp_kv_layout {
	struct kvp_kv_geometry geo;	 /* copy of the geometry */
	uint32_t capacity_blocks;	 /* physical KV blocks per layer */
	uint32_t blocks_per_pager_block; /* KV blocks in one pager block */
	size_t block_stride;		 /* kvp_kv_block_stride(geo) */
	size_t pager_block_bytes;	 /* power of two, >= 4 KiB */
	size_t layer_bytes;		 /* capacity_blocks * block_stride */
	size_t region_bytes;		 /* layers * layer_bytes */
};

/*
 * kvp_kv_layout_init - lay out at least min_capacity_blocks physical KV
 * blocks per layer in pager blocks of pager_block_bytes (0: choose with
 * kvp_kv_pager_block_choose(g, 0)).
 *
 * The capacity is rounded up to a whole number of pager blocks per layer,
 * so every layer starts on a pager block and region_bytes is a multiple of
 * the pager block.  Returns 0, or -EINVAL (bad geometry; pager block not a
 * power of two, under 4 KiB or under the stride; zero capacity), or
 * -EOVERFLOW (more than UINT32_MAX blocks or a region over SIZE_MAX); *l is
 * untouched on failure.
 */
int kvp_kv_layout_init(struct kvp_kv_layout *l, const struct kvp_kv_geometry *g,
		       uint64_t min_capacity_blocks, size_t pager_block_bytes);

/* Byte offset in the region of KV block (layer, pblock). */
static inline uint64_t kvp_kv_layout_offset(const struct kvp_kv_layout *l,
					    uint32_t layer, uint32_t pblock)
{
	return (uint64_t)layer * l->layer_bytes +
	       (uint64_t)pblock * l->block_stride;
}

/* Pager block (index in the region) holding KV block (layer, pblock). */
static inline uint64_t kvp_kv_layout_pager_block(const struct kvp_kv_layout *l,
						 uint32_t layer,
						 uint32_t pblock)
{
	return kvp_kv_layout_offset(l, layer, pblock) / l->pager_block_bytes;
}

/*
 * The inverse: the layer of pager block pb and the first physical KV block
 * in it (it holds blocks_per_pager_block consecutive ones).  pb must be
 * below region_bytes / pager_block_bytes.
 */
void kvp_kv_layout_pager_span(const struct kvp_kv_layout *l, uint64_t pb,
			      uint32_t *layer, uint32_t *first_pblock);

/*
 * kvp_cpu_simd - the CPU has AVX2, FMA and F16C: the one test behind every
 * SIMD path of the KV code (conversion, attention, the predictors, the
 * synthetic source); false off x86.  Computed once, from any thread.
 */
bool kvp_cpu_simd(void);

#endif /* KVP_KV_GEOMETRY_H */
