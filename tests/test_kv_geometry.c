/* test_kv_geometry.c - presets, sizes, layout offsets, element conversion. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kv_geometry.h"
#include "tests/helpers/helpers.h"

START_TEST(presets)
{
	struct kvp_kv_geometry g;

	ck_assert_int_eq(kvp_kv_geometry_preset("llama3-8b", &g), 0);
	ck_assert_int_eq(kvp_kv_geometry_check(&g), 0);
	ck_assert_uint_eq(kvp_kv_token_bytes(&g), 128 * 1024);
	ck_assert_uint_eq(kvp_kv_token_layer_bytes(&g), 4096);
	ck_assert_uint_eq(kvp_kv_block_bytes(&g), 4 * 4096);
	ck_assert_uint_eq(kvp_kv_group(&g), 4);
	ck_assert_int_eq(kvp_kv_geometry_preset("qwen3-8b", &g), 0);
	ck_assert_uint_eq(kvp_kv_token_bytes(&g), 144 * 1024);
	ck_assert_int_eq(kvp_kv_geometry_preset("tiny", &g), 0);
	ck_assert_int_eq(kvp_kv_geometry_check(&g), 0);
	ck_assert_int_eq(kvp_kv_geometry_preset("nope", &g), -ENOENT);
	ck_assert_str_eq(kvp_kv_geometry_presets()[0], "llama3-8b");
}
END_TEST

START_TEST(check_rejects)
{
	struct kvp_kv_geometry g;

	kvp_kv_geometry_preset("llama3-8b", &g);
	g.q_heads = 30; /* not a multiple of 8 */
	ck_assert_int_eq(kvp_kv_geometry_check(&g), -EINVAL);
	kvp_kv_geometry_preset("llama3-8b", &g);
	g.head_dim = 100;
	ck_assert_int_eq(kvp_kv_geometry_check(&g), -EINVAL);
	kvp_kv_geometry_preset("llama3-8b", &g);
	g.block_tokens = 0;
	ck_assert_int_eq(kvp_kv_geometry_check(&g), -EINVAL);
	kvp_kv_geometry_preset("llama3-8b", &g);
	g.dtype = (enum kvp_kv_dtype)7;
	ck_assert_int_eq(kvp_kv_geometry_check(&g), -EINVAL);
}
END_TEST

START_TEST(dtypes)
{
	enum kvp_kv_dtype t;

	ck_assert_int_eq(kvp_kv_dtype_parse("bf16", &t), 0);
	ck_assert_int_eq(t, KVP_KV_BF16);
	ck_assert_str_eq(kvp_kv_dtype_name(KVP_KV_FP32), "fp32");
	ck_assert_int_eq(kvp_kv_dtype_parse("int8", &t), -EINVAL);
	ck_assert_uint_eq(kvp_kv_dtype_size(KVP_KV_FP16), 2);
}
END_TEST

/* Every half converts exactly, and back; vector path == scalar path. */
START_TEST(f16_roundtrip_all)
{
	uint16_t *h = malloc(65536 * 2), *h2 = malloc(65536 * 2);
	float *f = malloc(65536 * 4);
	uint32_t i;

	for (i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	kvp_kv_to_f32(KVP_KV_FP16, h, f, 65536);
	for (i = 0; i < 65536; i++) {
		float s = kvp_kv_f16_to_f32((uint16_t)i);

		if (isnan(s)) {
			ck_assert(isnan(f[i]));
			continue;
		}
		ck_assert_msg(memcmp(&s, &f[i], 4) == 0, "half %x", i);
	}
	kvp_kv_from_f32(KVP_KV_FP16, f, h2, 65536);
	for (i = 0; i < 65536; i++) {
		if (isnan(f[i]))
			continue;
		ck_assert_msg(h2[i] == i, "half %x back %x", i, h2[i]);
		ck_assert_uint_eq(kvp_kv_f32_to_f16(f[i]), i);
	}
	free(h);
	free(h2);
	free(f);
}
END_TEST

/* Rounding of floats between halves: vector and scalar agree. */
START_TEST(f16_rounding)
{
	enum { N = 1 << 16 };
	float *f = malloc(N * 4);
	uint16_t *h = malloc(N * 2);
	uint32_t i, x = 12345;

	for (i = 0; i < N; i++) {
		x = x * 1103515245u + 12345u;
		f[i] = ldexpf((float)(x >> 8) / (1 << 24) - 0.5f,
			      (int)(x % 44) - 28);
	}
	f[0] = 65520.0f; /* rounds to inf */
	f[1] = 65519.0f; /* to 65504 */
	f[2] = 1e-8f;	 /* to a subnormal or zero */
	kvp_kv_from_f32(KVP_KV_FP16, f, h, N);
	for (i = 0; i < N; i++)
		ck_assert_msg(h[i] == kvp_kv_f32_to_f16(f[i]), "%a", f[i]);
	ck_assert_uint_eq(h[0], 0x7c00);
	ck_assert_uint_eq(h[1], 0x7bff);
	free(f);
	free(h);
}
END_TEST

START_TEST(bf16)
{
	float in[9] = { 1.0f, -2.5f, 3.14159f,	  1e-30f,     65504.f,
			0.f,  -0.f,  1.00390625f, 1.01171875f };
	uint16_t h[9];
	float out[9];
	int i;

	kvp_kv_from_f32(KVP_KV_BF16, in, h, 9);
	kvp_kv_to_f32(KVP_KV_BF16, h, out, 9);
	for (i = 0; i < 9; i++)
		ck_assert(fabsf(out[i] - in[i]) <= fabsf(in[i]) / 128);
	ck_assert_uint_eq(h[0], 0x3f80);
	ck_assert_uint_eq(h[7], 0x3f80); /* tie to even: down */
	ck_assert_uint_eq(h[8], 0x3f82); /* tie to even: up */
}
END_TEST

START_TEST(layout)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_layout l;
	uint32_t layer, first;

	kvp_kv_geometry_preset("llama3-8b", &g);
	ck_assert_uint_eq(kvp_kv_pager_block_choose(&g, 0), 16384);
	ck_assert_uint_eq(kvp_kv_pager_block_choose(&g, 100000), 131072);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 1000, 65536), 0);
	ck_assert_uint_eq(l.blocks_per_pager_block, 4);
	ck_assert_uint_eq(l.capacity_blocks, 1000);
	ck_assert_uint_eq(l.layer_bytes % 65536, 0);
	ck_assert_uint_eq(l.region_bytes, 32 * l.layer_bytes);
	ck_assert_uint_eq(kvp_kv_layout_offset(&l, 2, 5),
			  2 * l.layer_bytes + 5 * 16384);
	ck_assert_uint_eq(kvp_kv_layout_pager_block(&l, 2, 5),
			  (2 * l.layer_bytes + 5 * 16384) / 65536);
	kvp_kv_layout_pager_span(&l, kvp_kv_layout_pager_block(&l, 2, 5),
				 &layer, &first);
	ck_assert_uint_eq(layer, 2);
	ck_assert_uint_eq(first, 4);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 1001, 65536), 0);
	ck_assert_uint_eq(l.capacity_blocks, 1004);
	/* K then V, head-major inside */
	ck_assert_uint_eq(kvp_kv_k_offset(&g, 1, 2), (1 * 4 + 2) * 128 * 2);
	ck_assert_uint_eq(kvp_kv_v_offset(&g, 0, 0), 8192);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 10, 8192), -EINVAL);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 10, 3 * 16384), -EINVAL);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 0, 0), -EINVAL);
	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 1ull << 33, 0), -EOVERFLOW);
	/* a block size that is not a power of two gets a padded stride */
	g.head_dim = 96;
	ck_assert_uint_eq(kvp_kv_block_stride(&g), 16384);
	ck_assert_uint_eq(kvp_kv_block_bytes(&g), 12288);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_geometry");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_test(tc, presets);
	tcase_add_test(tc, check_rejects);
	tcase_add_test(tc, dtypes);
	tcase_add_test(tc, f16_roundtrip_all);
	tcase_add_test(tc, f16_rounding);
	tcase_add_test(tc, bf16);
	tcase_add_test(tc, layout);
	return kvp_test_run(s);
}
