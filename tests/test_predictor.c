/* test_predictor.c - exact, window and lowrank choices; recall on planted KV. */
#include <check.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/synth/kv_synth.h"
#include "lib/predict/predictor.h"
#include "tests/helpers/helpers.h"

static struct kvp_block_alloc *A;
static struct kvp_kv_geometry G = { 2, 4, 2, 16, KVP_KV_FP32, 4 };

static bool sorted_by_phys(const struct kvp_block_table *bt, const uint32_t *lb,
			   size_t n)
{
	size_t i;

	for (i = 1; i < n; i++)
		if (kvp_block_table_map(bt)[lb[i - 1]] >=
		    kvp_block_table_map(bt)[lb[i]])
			return false;
	return true;
}

/* Two interleaved sequences: physical order differs from logical. */
static struct kvp_block_table *make_table(uint32_t tokens)
{
	struct kvp_block_table *t, *other;
	uint32_t i;

	ck_assert_int_eq(kvp_block_alloc_create(4096, &A), 0);
	kvp_block_table_create(A, 4, &t);
	kvp_block_table_create(A, 4, &other);
	for (i = 0; i < tokens; i += 4) {
		/* every third block of t lands after a block of other */
		if (i % 12 == 0)
			kvp_block_table_append(other, 4, NULL, NULL);
		kvp_block_table_append(t, tokens - i < 4 ? tokens - i : 4, NULL,
				       NULL);
	}
	/* free other's blocks: t's stay where they are */
	kvp_block_table_destroy(other, NULL, NULL);
	return t;
}

START_TEST(names_and_opts)
{
	enum kvp_predictor_kind k;
	struct kvp_predictor_opts o;
	struct kvp_predictor *p;

	ck_assert_int_eq(kvp_predictor_kind_parse("lowrank", &k), 0);
	ck_assert_int_eq(k, KVP_PREDICTOR_LOWRANK);
	ck_assert_str_eq(kvp_predictor_kind_name(KVP_PREDICTOR_WINDOW),
			 "window");
	ck_assert_int_eq(kvp_predictor_kind_parse("oracle", &k), -EINVAL);
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_LOWRANK);
	ck_assert_uint_eq(o.budget_tokens, 400);
	ck_assert_uint_eq(o.rank, 128);
	/* rank 128 > kv_heads * head_dim = 32 */
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), -EINVAL);
	o.rank = 8;
	o.budget_tokens = 2;
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), -EINVAL);
	o.budget_tokens = 16;
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	ck_assert(kvp_predictor_needs_query(p));
	ck_assert_double_eq_tol(kvp_predictor_metadata_ratio(p),
				8.0 * 2 / (2 * 2 * 16 * 4), 1e-12);
	kvp_predictor_destroy(p);
	{
		struct kvp_kv_geometry l;

		kvp_kv_geometry_preset("llama3-8b", &l);
		kvp_predictor_opts_default(&o, KVP_PREDICTOR_LOWRANK);
		ck_assert_int_eq(kvp_predictor_create(&l, &o, &p), 0);
		ck_assert_double_eq_tol(kvp_predictor_metadata_ratio(p),
					1.0 / 16, 1e-12);
		kvp_predictor_destroy(p);
	}
}
END_TEST

START_TEST(exact_all_sorted)
{
	struct kvp_block_table *t = make_table(101);
	struct kvp_predictor_opts o;
	struct kvp_predictor *p;
	uint32_t lb[64], seen[26] = { 0 };
	size_t n, i;

	kvp_predictor_opts_default(&o, KVP_PREDICTOR_EXACT);
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	ck_assert_uint_eq(kvp_predictor_max_blocks(p, 26), 26);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 1, t, NULL, lb, 25, &n),
			 -ENOSPC);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 1, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 26);
	for (i = 0; i < n; i++)
		seen[lb[i]]++;
	for (i = 0; i < 26; i++)
		ck_assert_uint_eq(seen[i], 1);
	ck_assert(sorted_by_phys(t, lb, n));
	ck_assert_int_eq(kvp_predictor_select(p, 0, 2, t, NULL, lb, 64, &n),
			 -EINVAL);
	ck_assert_int_eq(kvp_predictor_select(p, 64, 0, t, NULL, lb, 64, &n),
			 -EINVAL);
	/* retuned to window, then back: the selection follows the kind */
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_WINDOW);
	o.budget_tokens = 16; /* 4 blocks */
	ck_assert_int_eq(kvp_predictor_retune(p, &o), 0);
	ck_assert_int_eq(kvp_predictor_kind(p), KVP_PREDICTOR_WINDOW);
	ck_assert_uint_eq(kvp_predictor_max_blocks(p, 26), 5);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 1, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 4);
	/* no keys kept: never lowrank; a budget under G: refused, unchanged */
	o.kind = KVP_PREDICTOR_LOWRANK;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), -EOPNOTSUPP);
	o.kind = KVP_PREDICTOR_WINDOW;
	o.budget_tokens = 2;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), -EINVAL);
	o.kind = (enum kvp_predictor_kind)3;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), -EINVAL);
	ck_assert_int_eq(kvp_predictor_kind(p), KVP_PREDICTOR_WINDOW);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 1, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 4);
	o.kind = KVP_PREDICTOR_EXACT;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), 0);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 1, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 26);
	kvp_predictor_destroy(p);
	kvp_block_table_destroy(t, NULL, NULL);
	kvp_block_alloc_destroy(A);
}
END_TEST

START_TEST(window_sinks_and_recent)
{
	struct kvp_block_table *t = make_table(203); /* 51 blocks */
	struct kvp_predictor_opts o;
	struct kvp_predictor *p;
	uint32_t lb[64];
	bool in[51] = { 0 };
	size_t n, i;

	kvp_predictor_opts_default(&o, KVP_PREDICTOR_WINDOW);
	o.budget_tokens = 40; /* 10 blocks */
	o.sink_tokens = 6;    /* 2 blocks */
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	ck_assert_int_eq(kvp_predictor_select(p, 3, 0, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 10);
	ck_assert(sorted_by_phys(t, lb, n));
	for (i = 0; i < n; i++)
		in[lb[i]] = true;
	ck_assert(in[0] && in[1]);
	for (i = 43; i < 51; i++)
		ck_assert(in[i]);
	ck_assert(!in[2] && !in[42]);
	kvp_predictor_destroy(p);
	/* a table under the budget: everything */
	o.budget_tokens = 400;
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	ck_assert_int_eq(kvp_predictor_select(p, 3, 0, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 51);
	kvp_predictor_destroy(p);
	kvp_block_table_destroy(t, NULL, NULL);
	kvp_block_alloc_destroy(A);
}
END_TEST

/*
 * Constructed keys: noise in every direction but a planted direction that
 * a few blocks carry strongly; the query points along it.
 */
START_TEST(lowrank_constructed)
{
	struct kvp_kv_geometry g = { 1, 4, 2, 16, KVP_KV_FP32, 4 };
	struct kvp_block_table *t = make_table(400); /* 100 blocks */
	struct kvp_predictor_opts o;
	struct kvp_predictor *p;
	float blk[2 * 2 * 4 * 16], q[64], dir[32];
	uint32_t lb[64], heavy[5] = { 3, 17, 42, 77, 90 }, x = 5;
	bool in[100] = { 0 };
	size_t n, i, j, s;
	uint64_t tok;

	for (i = 0; i < 32; i++)
		dir[i] = (i % 3 == 0) ? 1.0f : -0.5f;
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_LOWRANK);
	o.rank = 8;
	o.budget_tokens = 24; /* 6 blocks: 5 heavy + the last */
	o.fit_tokens = 128;   /* lazy fit from the first 128 tokens */
	ck_assert_int_eq(kvp_predictor_create(&g, &o, &p), 0);
	for (tok = 0; tok < 400; tok += 4) {
		bool hv = false;

		for (j = 0; j < 5; j++)
			hv |= heavy[j] == tok / 4;
		for (s = 0; s < 4; s++) {
			for (i = 0; i < 32; i++) {
				x = x * 1664525u + 1013904223u;
				/* K of (kv head i/16, slot s, dim i%16) */
				blk[(i / 16) * 64 + s * 16 + i % 16] =
				    ((float)(x >> 8) / (1 << 24) - 0.5f) +
				    (hv && s == 2 ? 3 * dir[i] : 0);
			}
		}
		/* one token at a time for the first block, then whole blocks */
		if (tok == 0) {
			for (s = 0; s < 4; s++)
				ck_assert_int_eq(
				    kvp_predictor_observe(p, 0, 0, s, 1, blk),
				    0);
		} else {
			ck_assert_int_eq(
			    kvp_predictor_observe(p, 0, 0, tok, 4, blk), 0);
		}
	}
	/* out of order, crossing a block */
	ck_assert_int_eq(kvp_predictor_observe(p, 0, 0, 5, 1, blk), -EINVAL);
	ck_assert_int_eq(kvp_predictor_observe(p, 0, 0, 402, 4, blk), -EINVAL);
	/* P (32 x 8 floats), and per token 8 int8 keys and a float scale,
	 * for the 1024 tokens of room the 400 were given */
	ck_assert_uint_eq(kvp_predictor_metadata_bytes(p),
			  32 * 8 * 4 + 1024 * (8 + 4));
	for (i = 0; i < 64; i++)
		q[i] = dir[(i / 32) * 16 + i % 16] * 2; /* heads 0,1 -> kv 0 */
	ck_assert_int_eq(kvp_predictor_select(p, 0, 0, t, NULL, lb, 64, &n),
			 -EINVAL);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 0, t, q, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 6);
	ck_assert(sorted_by_phys(t, lb, n));
	for (i = 0; i < n; i++)
		in[lb[i]] = true;
	for (j = 0; j < 5; j++)
		ck_assert_msg(in[heavy[j]], "heavy block %u missed", heavy[j]);
	ck_assert(in[99]);
	/* retuned to window it selects the newest blocks but keeps the keys,
	 * so that lowrank selects as before once retuned back */
	o.kind = KVP_PREDICTOR_WINDOW;
	o.sink_tokens = 0;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), 0);
	ck_assert_int_eq(kvp_predictor_kind(p), KVP_PREDICTOR_WINDOW);
	ck_assert(!kvp_predictor_needs_query(p));
	ck_assert(kvp_predictor_needs_keys(p));
	ck_assert_int_eq(kvp_predictor_select(p, 0, 0, t, NULL, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 6);
	for (i = 0; i < n; i++)
		ck_assert_uint_ge(lb[i], 94);
	o.kind = KVP_PREDICTOR_LOWRANK;
	ck_assert_int_eq(kvp_predictor_retune(p, &o), 0);
	memset(in, 0, sizeof(in));
	ck_assert_int_eq(kvp_predictor_select(p, 0, 0, t, q, lb, 64, &n), 0);
	for (i = 0; i < n; i++)
		in[lb[i]] = true;
	for (j = 0; j < 5; j++)
		ck_assert_msg(in[heavy[j]], "heavy block %u missed after retune",
			      heavy[j]);
	/* a fitted layer with keys refuses a refit */
	{
		const void *ptr = blk;
		struct kvp_attn_blocks b = { &ptr, NULL, 1 };

		ck_assert_int_eq(kvp_predictor_fit(p, 0, &b), -EBUSY);
	}
	kvp_predictor_forget(p, 0);
	ck_assert_int_eq(kvp_predictor_select(p, 0, 0, t, q, lb, 64, &n), 0);
	ck_assert_uint_eq(n, 6); /* nothing observed: the newest blocks */
	ck_assert(lb[0] >= 94);
	kvp_predictor_destroy(p);
	kvp_block_table_destroy(t, NULL, NULL);
	kvp_block_alloc_destroy(A);
}
END_TEST

/* Bytes malloc holds for the program now (glibc's counts). */
static size_t heap_held(void)
{
	struct mallinfo2 m = mallinfo2();

	return m.uordblks + m.hblkhd;
}

/*
 * The metadata lowrank reports is what it holds: its projected keys are
 * allocated by doubling (1028 tokens hold room for 2048), and that room is
 * RAM the --ram budget must count.  Before, the count was the tokens
 * projected, half of what was held here.
 */
START_TEST(lowrank_metadata_is_held)
{
	struct kvp_predictor_opts o;
	struct kvp_predictor *p;
	float blk[2 * 2 * 4 * 16];
	size_t h0, held, i, peak;
	uint64_t tok, more;
	uint32_t l;

	for (i = 0; i < sizeof(blk) / sizeof(blk[0]); i++)
		blk[i] = (float)((i * 37) % 11) - 5;
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_LOWRANK);
	o.rank = 8;
	o.fit_tokens = 16;
	o.max_seqs = 1;
	h0 = heap_held();
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	for (tok = 0; tok < 1028; tok += 4)
		for (l = 0; l < G.layers; l++)
			ck_assert_int_eq(
			    kvp_predictor_observe(p, 0, l, tok, 4, blk), 0);
	held = heap_held() - h0;
	/* all but the predictor's fixed structs and the scratch it freed
	 * that malloc keeps cached (a few KiB) */
	ck_assert_msg(kvp_predictor_metadata_bytes(p) + 4096 >= held,
		      "metadata %zu bytes, malloc holds %zu for it",
		      kvp_predictor_metadata_bytes(p), held);
	/* room for 100 more reserved: exactly 1128 tokens, what the peak
	 * said; the 100 then allocate nothing */
	more = 100;
	peak = kvp_predictor_metadata_peak(p, &more);
	ck_assert_uint_eq(peak, G.layers * (32 * 8 * 4 + 1128 * (8 + 4)));
	ck_assert_int_eq(kvp_predictor_reserve(p, &more), 0);
	ck_assert_uint_eq(kvp_predictor_metadata_bytes(p), peak);
	h0 = heap_held();
	for (; tok < 1128; tok += 4)
		for (l = 0; l < G.layers; l++)
			ck_assert_int_eq(
			    kvp_predictor_observe(p, 0, l, tok, 4, blk), 0);
	ck_assert_uint_eq(kvp_predictor_metadata_bytes(p), peak);
	ck_assert_int_le((long)heap_held() - (long)h0, 0);
	kvp_predictor_destroy(p);

	/* not fitted yet (fewer tokens than fit_tokens): the peak holds the
	 * buffered keys, the projection and the room at once, and the
	 * scratch of one layer's fit (Kt, C, Q and Z, 32-float rows) */
	o.fit_tokens = 64;
	ck_assert_int_eq(kvp_predictor_create(&G, &o, &p), 0);
	for (l = 0; l < G.layers; l++)
		ck_assert_int_eq(kvp_predictor_observe(p, 0, l, 0, 4, blk), 0);
	more = 8;
	peak = kvp_predictor_metadata_peak(p, &more);
	ck_assert_uint_eq(peak, G.layers * (32 * 8 * 4 + 12 * (8 + 4) +
					    64 * (32 * 4 + 4)) +
				    32 * 4 * (64 + 32 + 2 * 8));
	ck_assert_int_eq(kvp_predictor_reserve(p, &more), 0);
	ck_assert_uint_le(kvp_predictor_metadata_bytes(p), peak);
	for (tok = 4; tok < 12; tok += 4)
		for (l = 0; l < G.layers; l++)
			ck_assert_int_eq(
			    kvp_predictor_observe(p, 0, l, tok, 4, blk), 0);
	ck_assert_uint_le(kvp_predictor_metadata_bytes(p), peak);
	kvp_predictor_destroy(p);
}
END_TEST

/*
 * The planted workload at Llama-3.1-8B shape: lowrank at M = 400, G = 4,
 * r = 128 recalls >= 0.9 of the oracle top-M attention mass, finds the
 * heavy hitters, and reads far less than exact.
 */
START_TEST(lowrank_recall_planted)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy;
	struct kvp_predictor_opts o;
	struct kvp_predictor *p, *pw;
	struct kvp_block_alloc *a;
	struct kvp_block_table *t;
	struct kvp_attn_pool *pool;
	const uint32_t ctx = 16384, layers = 2;
	uint32_t nb = ctx / 4, lb[128], i, layer, step, nsample = ctx / 4;
	size_t bb, n;
	char *kv;
	const void **ptrs;
	float *mass, q[32 * 128], ex[32 * 128], sp[32 * 128];
	double rsum = 0, wsum = 0, esum = 0, t0, tsel = 0;
	int trials = 0, heavy_total = 0, heavy_found = 0;

	kvp_kv_geometry_preset("llama3-8b", &g);
	g.layers = layers;
	bb = kvp_kv_block_bytes(&g);
	kvp_kv_synth_opts_default(&so);
	ck_assert_int_eq(kvp_kv_synth_create(&g, &so, &sy), 0);
	kv = malloc((size_t)layers * nb * bb);
	ptrs = malloc(sizeof(*ptrs) * nb);
	mass = malloc(sizeof(float) * nb);
	ck_assert_ptr_nonnull(kv);
	kvp_block_alloc_create(nb, &a);
	kvp_block_table_create(a, 4, &t);
	kvp_block_table_append(t, ctx, NULL, NULL);
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_LOWRANK);
	ck_assert_int_eq(kvp_predictor_create(&g, &o, &p), 0);
	kvp_predictor_opts_default(&o, KVP_PREDICTOR_WINDOW);
	ck_assert_int_eq(kvp_predictor_create(&g, &o, &pw), 0);
	kvp_attn_pool_create(0, &pool);
	for (layer = 0; layer < layers; layer++) {
		char *base = kv + (size_t)layer * nb * bb;

		for (i = 0; i < nb; i++)
			kvp_kv_synth_fill(
			    sy, 0, layer, (uint64_t)i * 4, 4,
			    base + (size_t)kvp_block_table_map(t)[i] * bb);
		/* fit from the whole prefill of the layer */
		for (i = 0; i < nsample; i++)
			ptrs[i] = base + (size_t)kvp_block_table_map(t)[i] * bb;
		{
			struct kvp_attn_blocks sb = { ptrs, NULL, nsample };

			ck_assert_int_eq(kvp_predictor_fit(p, layer, &sb), 0);
		}
		for (i = 0; i < nb; i++)
			ck_assert_int_eq(
			    kvp_predictor_observe(
				p, 0, layer, (uint64_t)i * 4, 4,
				base + (size_t)kvp_block_table_map(t)[i] * bb),
			    0);
	}
	for (layer = 0; layer < layers; layer++) {
		char *base = kv + (size_t)layer * nb * bb;
		struct kvp_attn_blocks all;
		for (i = 0; i < nb; i++)
			ptrs[i] = base + (size_t)kvp_block_table_map(t)[i] * bb;
		all.ptrs = ptrs;
		all.ntokens = NULL;
		all.n = nb;
		for (step = 0; step < 4; step++) {
			const void *sptr[128];
			struct kvp_attn_blocks sb = { sptr, NULL, 0 };
			double r;

			/* queries of 4 positions, as if ctx were each */
			kvp_kv_synth_query(sy, 0, layer, ctx - 1000 * step, q);
			t0 = kvp_test_now_ns() * 1e-9;
			ck_assert_int_eq(kvp_predictor_select(p, 0, layer, t, q,
							      lb, 128, &n),
					 0);
			tsel += kvp_test_now_ns() * 1e-9 - t0;
			ck_assert_uint_le(n, 100);
			ck_assert(sorted_by_phys(t, lb, n));
			ck_assert_int_eq(
			    kvp_attn_block_mass(&g, &all, q, mass, pool), 0);
			r = kvp_attn_recall(mass, nb, lb, n, NULL);
			rsum += r;
			for (i = 0; i < n; i++)
				sptr[i] = ptrs[lb[i]];
			sb.n = n;
			kvp_attn_decode(&g, &all, q, ex, pool);
			kvp_attn_decode(&g, &sb, q, sp, pool);
			esum += kvp_attn_rel_error(sp, ex, 32 * 128);
			for (i = 0; i < nb; i++) {
				uint32_t s2, j;
				bool hv = false, got = false;

				for (s2 = 0; s2 < 4; s2++)
					hv |= kvp_kv_synth_is_heavy(sy, 0,
								    i * 4 + s2);
				if (!hv)
					continue;
				for (j = 0; j < n; j++)
					got |= lb[j] == i;
				heavy_total++;
				heavy_found += got;
			}
			ck_assert_int_eq(kvp_predictor_select(pw, 0, layer, t,
							      q, lb, 128, &n),
					 0);
			wsum += kvp_attn_recall(mass, nb, lb, n, NULL);
			trials++;
		}
	}
	printf("lowrank M=400 G=4 r=128, llama3-8b shape, %u tokens (synthetic "
	       "KV): recall %.3f (window %.3f), rel error %.3f, heavy hitters "
	       "found %d/%d, select %.2f ms per layer, metadata %.4f of KV\n",
	       ctx, rsum / trials, wsum / trials, esum / trials, heavy_found,
	       heavy_total, tsel / trials * 1e3,
	       kvp_predictor_metadata_ratio(p));
	fflush(stdout);
	ck_assert_msg(rsum / trials >= 0.9, "recall %.3f", rsum / trials);
	ck_assert_int_ge(heavy_found, heavy_total * 9 / 10);
	ck_assert(rsum > wsum);
	kvp_attn_pool_destroy(pool);
	kvp_predictor_destroy(p);
	kvp_predictor_destroy(pw);
	kvp_block_table_destroy(t, NULL, NULL);
	kvp_block_alloc_destroy(a);
	kvp_kv_synth_destroy(sy);
	free(kv);
	free(ptrs);
	free(mass);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("predictor");
	TCase *tc = kvp_test_tcase(s, "core", 60);

	tcase_add_test(tc, names_and_opts);
	tcase_add_test(tc, exact_all_sorted);
	tcase_add_test(tc, window_sinks_and_recent);
	tcase_add_test(tc, lowrank_constructed);
	tcase_add_test(tc, lowrank_metadata_is_held);
	tcase_add_test(tc, lowrank_recall_planted);
	return kvp_test_run(s);
}
