/* test_kv_synth.c - determinism, planted structure, dtypes (the fill rate
 * is kvpbench compute's). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/attention.h"
#include "lib/synth/kv_synth.h"
#include "tests/helpers/helpers.h"

START_TEST(deterministic)
{
	struct kvp_kv_geometry g = { 2, 4, 2, 16, KVP_KV_FP32, 4 };
	struct kvp_kv_synth_opts o;
	struct kvp_kv_synth *a, *b, *c;
	size_t bb = kvp_kv_block_bytes(&g);
	char *x = calloc(1, bb), *y = calloc(1, bb), *z = calloc(1, bb);
	float q1[64], q2[64];

	kvp_kv_synth_opts_default(&o);
	ck_assert_int_eq(kvp_kv_synth_create(&g, &o, &a), 0);
	ck_assert_int_eq(kvp_kv_synth_create(&g, &o, &b), 0);
	o.seed = 2;
	ck_assert_int_eq(kvp_kv_synth_create(&g, &o, &c), 0);
	ck_assert_int_eq(kvp_kv_synth_fill(a, 3, 1, 8, 4, x), 0);
	ck_assert_int_eq(kvp_kv_synth_fill(b, 3, 1, 8, 4, y), 0);
	ck_assert_int_eq(kvp_kv_synth_fill(c, 3, 1, 8, 4, z), 0);
	ck_assert(memcmp(x, y, bb) == 0);
	ck_assert(memcmp(x, z, bb) != 0);
	/* token by token gives the same block */
	memset(y, 0, bb);
	for (int t = 8; t < 12; t++)
		ck_assert_int_eq(kvp_kv_synth_fill(b, 3, 1, t, 1, y), 0);
	ck_assert(memcmp(x, y, bb) == 0);
	/* another sequence differs */
	kvp_kv_synth_fill(a, 4, 1, 8, 4, y);
	ck_assert(memcmp(x, y, bb) != 0);
	kvp_kv_synth_query(a, 0, 1, 100, q1);
	kvp_kv_synth_query(b, 0, 1, 100, q2);
	ck_assert(memcmp(q1, q2, sizeof(q1)) == 0);
	/* errors */
	ck_assert_int_eq(kvp_kv_synth_fill(a, 0, 2, 0, 4, x), -EINVAL);
	ck_assert_int_eq(kvp_kv_synth_fill(a, 0, 0, 2, 3, x), -EINVAL);
	ck_assert_int_eq(kvp_kv_synth_fill(a, 0, 0, 0, 0, x), -EINVAL);
	kvp_kv_synth_destroy(c);
	o.clusters = 0;
	ck_assert_int_eq(kvp_kv_synth_create(&g, &o, &c), -EINVAL);
	kvp_kv_synth_destroy(a);
	kvp_kv_synth_destroy(b);
	kvp_kv_synth_destroy(NULL);
	free(x);
	free(y);
	free(z);
}
END_TEST

/* fp16 and bf16 blocks hold the fp32 values, rounded. */
START_TEST(dtypes)
{
	struct kvp_kv_geometry g = { 1, 8, 2, 32, KVP_KV_FP32, 4 }, h = g,
			       b = g;
	struct kvp_kv_synth_opts o;
	struct kvp_kv_synth *s32, *s16, *sb;
	size_t n = kvp_kv_block_bytes(&g) / 4, i;
	float *f = malloc(n * 4), *f16 = malloc(n * 4), *fb = malloc(n * 4);
	uint16_t *x16 = malloc(n * 2), *xb = malloc(n * 2);

	h.dtype = KVP_KV_FP16;
	b.dtype = KVP_KV_BF16;
	kvp_kv_synth_opts_default(&o);
	kvp_kv_synth_create(&g, &o, &s32);
	kvp_kv_synth_create(&h, &o, &s16);
	kvp_kv_synth_create(&b, &o, &sb);
	kvp_kv_synth_fill(s32, 0, 0, 0, 4, f);
	kvp_kv_synth_fill(s16, 0, 0, 0, 4, x16);
	kvp_kv_synth_fill(sb, 0, 0, 0, 4, xb);
	kvp_kv_to_f32(KVP_KV_FP16, x16, f16, n);
	kvp_kv_to_f32(KVP_KV_BF16, xb, fb, n);
	for (i = 0; i < n; i++) {
		ck_assert(fabsf(f16[i] - f[i]) <= fabsf(f[i]) / 1024 + 1e-7f);
		ck_assert(fabsf(fb[i] - f[i]) <= fabsf(f[i]) / 128 + 1e-30f);
	}
	kvp_kv_synth_destroy(s32);
	kvp_kv_synth_destroy(s16);
	kvp_kv_synth_destroy(sb);
	free(f);
	free(f16);
	free(fb);
	free(x16);
	free(xb);
}
END_TEST

/*
 * The planted structure shows in exact attention: sinks and heavy hitters
 * score high, the query's topic beats other topics, recent beats old.
 */
START_TEST(planted_structure)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts o;
	struct kvp_kv_synth *s;
	const uint32_t ctx = 8192, nb = ctx / 4;
	size_t bb;
	char *kv;
	const void **ptrs;
	float *mass, q[32 * 128];
	struct kvp_attn_blocks all;
	double sink = 0, heavy = 0, topic = 0, other = 0, recent = 0;
	uint32_t i, zq, nheavy = 0, ntopic = 0, nother = 0;

	kvp_kv_geometry_preset("llama3-8b", &g);
	g.layers = 1;
	bb = kvp_kv_block_bytes(&g);
	kvp_kv_synth_opts_default(&o);
	o.heavy_every = 512;
	ck_assert_int_eq(kvp_kv_synth_create(&g, &o, &s), 0);
	kv = malloc((size_t)nb * bb);
	ptrs = malloc(sizeof(*ptrs) * nb);
	mass = malloc(sizeof(float) * nb);
	for (i = 0; i < nb; i++) {
		kvp_kv_synth_fill(s, 0, 0, (uint64_t)i * 4, 4,
				  kv + (size_t)i * bb);
		ptrs[i] = kv + (size_t)i * bb;
	}
	all.ptrs = ptrs;
	all.ntokens = NULL;
	all.n = nb;
	kvp_kv_synth_query(s, 0, 0, ctx, q);
	zq = kvp_kv_synth_query_topic(s, 0, 0, ctx);
	ck_assert_int_eq(kvp_attn_block_mass(&g, &all, q, mass, NULL), 0);
	for (i = 0; i < nb; i++) {
		bool hv = false;
		uint32_t t;

		for (t = 0; t < 4; t++)
			hv |= kvp_kv_synth_is_heavy(s, 0, i * 4 + t);
		if (i == 0) {
			sink += mass[i];
		} else if (hv) {
			heavy += mass[i];
			nheavy++;
		} else if (i >= nb - 8) {
			recent += mass[i] / 8;
		} else if (kvp_kv_synth_topic(s, 0, 0, i * 4) == zq) {
			topic += mass[i];
			ntopic++;
		} else {
			other += mass[i];
			nother++;
		}
	}
	printf("synthetic KV, 8K tokens: mass per block: sink %.4f, heavy "
	       "%.5f (%u), topic %.6f (%u), recent %.6f, other %.7f (%u)\n",
	       sink, heavy / nheavy, nheavy, topic / ntopic, ntopic, recent,
	       other / nother, nother);
	fflush(stdout);
	ck_assert_uint_gt(nheavy, 4);
	ck_assert_uint_gt(ntopic, 16);
	ck_assert(sink > 10 * topic / ntopic);
	ck_assert(heavy / nheavy > 10 * topic / ntopic);
	ck_assert(topic / ntopic > 10 * other / nother);
	ck_assert(recent > 1.3 * other / nother);
	kvp_kv_synth_destroy(s);
	free(kv);
	free(ptrs);
	free(mass);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_synth");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_test(tc, deterministic);
	tcase_add_test(tc, dtypes);
	tcase_add_test(tc, planted_structure);
	return kvp_test_run(s);
}
