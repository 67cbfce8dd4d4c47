/* test_attention.c - paged decode attention against the dense reference
 * (its speed is kvpbench compute's). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/attention.h"
#include "tests/helpers/helpers.h"

static uint32_t rng = 99;

static float frand(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)(rng >> 8) / (1 << 24) * 2 - 1;
}

/* A pool of nphys KV blocks filled with random values of g's dtype. */
static void *random_pool(const struct kvp_kv_geometry *g, uint32_t nphys)
{
	size_t bb = kvp_kv_block_bytes(g), n = bb / kvp_kv_dtype_size(g->dtype);
	float *tmp = malloc(n * sizeof(float));
	char *pool = malloc(bb * nphys);
	uint32_t b;
	size_t i;

	for (b = 0; b < nphys; b++) {
		for (i = 0; i < n; i++)
			tmp[i] = frand() * 2;
		kvp_kv_from_f32(g->dtype, tmp, pool + b * bb, n);
	}
	free(tmp);
	return pool;
}

struct shape {
	uint32_t q, kv, dim;
	enum kvp_kv_dtype t;
	uint32_t G;
};

static const struct shape shapes[] = {
	{ 4, 2, 16, KVP_KV_FP32, 4 },  /* tiny */
	{ 8, 2, 128, KVP_KV_FP16, 4 }, /* llama-like groups of 4 */
	{ 8, 8, 64, KVP_KV_BF16, 16 }, /* MHA */
	{ 12, 2, 32, KVP_KV_FP16, 3 }, /* group 6: 4 + 2 heads in registers */
	{ 8, 1, 8, KVP_KV_BF16, 1 },   /* one token per block, group 8 */
	{ 5, 5, 24, KVP_KV_FP32, 7 },
};

static double max_rel(const float *a, const float *b, size_t n)
{
	double e = kvp_attn_rel_error(a, b, n);

	return e;
}

/* All blocks, a subset, any order, partial last block, 1 or 2 threads. */
START_TEST(against_dense)
{
	const struct shape *sh = &shapes[_i];
	struct kvp_kv_geometry g = { 1, sh->q, sh->kv, sh->dim, sh->t, sh->G };
	uint32_t nphys = 300, nlist = 257, i;
	size_t qn = (size_t)sh->q * sh->dim, bb = kvp_kv_block_bytes(&g);
	char *pool;
	const void **ptrs = malloc(nlist * sizeof(*ptrs));
	uint32_t *ntok = malloc(nlist * 4);
	float *q = malloc(qn * 4), *ref = malloc(qn * 4), *out = malloc(qn * 4);
	size_t maxtok = (size_t)nlist * sh->G * sh->kv * sh->dim;
	float *K = malloc(maxtok * 4), *V = malloc(maxtok * 4);
	struct kvp_attn_pool *p2;
	struct kvp_attn_blocks b;
	size_t ntoks;
	int pass;

	ck_assert_int_eq(kvp_kv_geometry_check(&g), 0);
	pool = random_pool(&g, nphys);
	ck_assert_int_eq(kvp_attn_pool_create(2, &p2), 0);
	ck_assert_uint_eq(kvp_attn_pool_threads(p2), 2);
	for (i = 0; i < qn; i++)
		q[i] = frand() * 3;
	for (pass = 0; pass < 3; pass++) {
		uint32_t n = pass == 0 ? nlist : pass == 1 ? 37 : 1;

		/* a scattered, unordered choice of physical blocks */
		for (i = 0; i < n; i++) {
			ptrs[i] =
			    pool + (size_t)((i * 97 + 13 * pass) % nphys) * bb;
			ntok[i] = sh->G;
		}
		ntok[n - 1] = 1 + (uint32_t)(rng >> 3) % sh->G; /* partial */
		b.ptrs = ptrs;
		b.ntokens = ntok;
		b.n = n;
		ntoks = kvp_attn_gather(&g, &b, K, V);
		ck_assert_uint_eq(ntoks, (size_t)(n - 1) * sh->G + ntok[n - 1]);
		ck_assert_int_eq(kvp_attn_dense_ref(&g, K, V, ntoks, q, ref),
				 0);
		ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, NULL), 0);
		ck_assert_msg(max_rel(out, ref, qn) < 2e-5, "simd 1t %g",
			      max_rel(out, ref, qn));
		ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, p2), 0);
		ck_assert_msg(max_rel(out, ref, qn) < 2e-5, "simd 2t %g",
			      max_rel(out, ref, qn));
		ck_assert_int_eq(kvp_attn_decode_scalar(&g, &b, q, out, p2), 0);
		ck_assert_msg(max_rel(out, ref, qn) < 2e-5, "scalar %g",
			      max_rel(out, ref, qn));
	}
	kvp_attn_pool_destroy(p2);
	free(pool);
	free(ptrs);
	free(ntok);
	free(q);
	free(ref);
	free(out);
	free(K);
	free(V);
}
END_TEST

/* Big scores: the online softmax must not overflow. */
START_TEST(large_scores)
{
	struct kvp_kv_geometry g = { 1, 2, 1, 8, KVP_KV_FP32, 2 };
	float blk[2][2 * 2 * 8] = { { 0 } }, q[16], out[16], ref[16];
	float K[4 * 8], V[4 * 8];
	const void *ptrs[2] = { blk[0], blk[1] };
	struct kvp_attn_blocks b = { ptrs, NULL, 2 };
	int i, t;

	for (t = 0; t < 2; t++)
		for (i = 0; i < 8; i++) {
			blk[t][i] = 100.0f * (t + 1);	      /* K slot 0 */
			blk[t][8 + i] = -50.0f;		      /* K slot 1 */
			blk[t][16 + i] = (float)(t * 10 + i); /* V slot 0 */
			blk[t][24 + i] = 7;		      /* V slot 1 */
		}
	for (i = 0; i < 16; i++)
		q[i] = i < 8 ? 1.0f : -1.0f;
	ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, NULL), 0);
	kvp_attn_gather(&g, &b, K, V);
	kvp_attn_dense_ref(&g, K, V, 4, q, ref);
	for (i = 0; i < 16; i++)
		ck_assert(isfinite(out[i]));
	ck_assert(kvp_attn_rel_error(out, ref, 16) < 1e-5);
	/* head 0 attends to block 1 slot 0 only */
	ck_assert_float_eq_tol(out[0], 10.0f, 1e-3);
}
END_TEST

START_TEST(errors)
{
	struct kvp_kv_geometry g = { 1, 4, 2, 16, KVP_KV_FP32, 4 };
	float blk[2 * 2 * 4 * 16] = { 0 }, q[64] = { 0 }, out[64];
	const void *ptrs[1] = { blk };
	uint32_t nt[1] = { 0 };
	struct kvp_attn_blocks b = { ptrs, nt, 1 };

	out[0] = 42;
	ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, NULL), -EINVAL);
	nt[0] = 5;
	ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, NULL), -EINVAL);
	ck_assert_float_eq(out[0], 42);
	b.n = 0;
	ck_assert_int_eq(kvp_attn_decode(&g, &b, q, out, NULL), -EINVAL);
	ck_assert_int_eq(kvp_attn_dense_ref(&g, blk, blk, 0, q, out), -EINVAL);
}
END_TEST

/* Through a block table in a laid-out region, all or chosen blocks. */
START_TEST(through_table)
{
	struct kvp_kv_geometry g = { 3, 8, 2, 32, KVP_KV_FP16, 4 };
	struct kvp_kv_layout l;
	struct kvp_block_alloc *a;
	struct kvp_block_table *t1, *t2;
	size_t qn = 8 * 32;
	float q[256], out[256], ref[256];
	float *K = malloc(64 * 4 * 64 * 4), *V = malloc(64 * 4 * 64 * 4);
	const void *ptrs[64];
	uint32_t ntok[64], chosen[3] = { 5, 0, 9 };
	struct kvp_attn_blocks b;
	char *region;
	size_t i, n;

	ck_assert_int_eq(kvp_kv_layout_init(&l, &g, 40, 0), 0);
	region = malloc(l.region_bytes);
	for (i = 0; i < l.region_bytes / 2; i++)
		((uint16_t *)region)[i] = kvp_kv_f32_to_f16(frand());
	kvp_block_alloc_create(l.capacity_blocks, &a);
	kvp_block_table_create(a, 4, &t1);
	kvp_block_table_create(a, 4, &t2);
	/* interleave two sequences so that t2's blocks are scattered */
	for (i = 0; i < 10; i++) {
		kvp_block_table_append(t1, 4, NULL, NULL);
		kvp_block_table_append(t2, i == 9 ? 3 : 4, NULL, NULL);
	}
	for (i = 0; i < qn; i++)
		q[i] = frand();
	ck_assert_int_eq(kvp_attn_blocks_from_table(&l, region, t2, 2, NULL, 0,
						    ptrs, ntok, &b),
			 0);
	ck_assert_uint_eq(b.n, 10);
	ck_assert_uint_eq(ntok[9], 3);
	ck_assert_ptr_eq(
	    ptrs[1],
	    region + kvp_kv_layout_offset(&l, 2, kvp_block_table_map(t2)[1]));
	n = kvp_attn_gather(&g, &b, K, V);
	ck_assert_uint_eq(n, 39);
	kvp_attn_dense_ref(&g, K, V, n, q, ref);
	ck_assert_int_eq(
	    kvp_attn_decode_table(&l, region, t2, 2, NULL, 0, q, out, NULL), 0);
	ck_assert(kvp_attn_rel_error(out, ref, qn) < 2e-5);
	/* chosen blocks, in any order */
	kvp_attn_blocks_from_table(&l, region, t2, 2, chosen, 3, ptrs, ntok,
				   &b);
	n = kvp_attn_gather(&g, &b, K, V);
	ck_assert_uint_eq(n, 11);
	kvp_attn_dense_ref(&g, K, V, n, q, ref);
	ck_assert_int_eq(
	    kvp_attn_decode_table(&l, region, t2, 2, chosen, 3, q, out, NULL),
	    0);
	ck_assert(kvp_attn_rel_error(out, ref, qn) < 2e-5);
	chosen[0] = 10;
	ck_assert_int_eq(
	    kvp_attn_decode_table(&l, region, t2, 2, chosen, 3, q, out, NULL),
	    -EINVAL);
	ck_assert_int_eq(
	    kvp_attn_decode_table(&l, region, t2, 3, NULL, 0, q, out, NULL),
	    -EINVAL);
	kvp_block_table_destroy(t1, NULL, NULL);
	kvp_block_table_destroy(t2, NULL, NULL);
	kvp_block_alloc_destroy(a);
	free(region);
	free(K);
	free(V);
}
END_TEST

START_TEST(mass_and_recall)
{
	struct kvp_kv_geometry g = { 1, 4, 2, 16, KVP_KV_FP16, 4 };
	uint32_t n = 200, i, top[3] = { 0 }, h, d;
	size_t bb = kvp_kv_block_bytes(&g);
	char *pool = random_pool(&g, n);
	const void **ptrs = malloc(n * sizeof(*ptrs));
	float *mass = malloc(n * 4), *mass2 = malloc(n * 4), q[64];
	float *K = malloc(n * 4 * 32 * 4), *V = malloc(n * 4 * 32 * 4);
	struct kvp_attn_blocks b = { ptrs, NULL, n };
	struct kvp_attn_pool *p2;
	double sum = 0, abs_mass, want[200] = { 0 };

	for (i = 0; i < n; i++)
		ptrs[i] = pool + (size_t)i * bb;
	for (i = 0; i < 64; i++)
		q[i] = frand() * 4;
	ck_assert_int_eq(kvp_attn_pool_create(2, &p2), 0);
	ck_assert_int_eq(kvp_attn_block_mass(&g, &b, q, mass, NULL), 0);
	ck_assert_int_eq(kvp_attn_block_mass(&g, &b, q, mass2, p2), 0);
	for (i = 0; i < n; i++) {
		sum += mass[i];
		ck_assert_float_eq_tol(mass[i], mass2[i], 1e-6);
	}
	ck_assert_double_eq_tol(sum, 1.0, 1e-4);
	/* against softmax in double */
	kvp_attn_gather(&g, &b, K, V);
	for (h = 0; h < 4; h++) {
		double s[800], mx = -1e300, z = 0;
		uint32_t t;

		for (t = 0; t < n * 4; t++) {
			s[t] = 0;
			for (d = 0; d < 16; d++)
				s[t] += (double)q[h * 16 + d] *
					K[t * 32 + (h / 2) * 16 + d];
			s[t] /= 4.0;
			mx = s[t] > mx ? s[t] : mx;
		}
		for (t = 0; t < n * 4; t++)
			z += exp(s[t] - mx);
		for (t = 0; t < n * 4; t++)
			want[t / 4] += exp(s[t] - mx) / z / 4;
	}
	for (i = 0; i < n; i++)
		ck_assert_float_eq_tol(mass[i], want[i], 1e-5);
	/* the three heaviest blocks: recall 1 */
	for (i = 0; i < n; i++) {
		if (mass[i] > mass[top[0]]) {
			top[2] = top[1];
			top[1] = top[0];
			top[0] = i;
		} else if (i != top[0] && mass[i] > mass[top[1]]) {
			top[2] = top[1];
			top[1] = i;
		} else if (i != top[0] && i != top[1] &&
			   mass[i] > mass[top[2]]) {
			top[2] = i;
		}
	}
	ck_assert_double_eq_tol(kvp_attn_recall(mass, n, top, 3, &abs_mass),
				1.0, 1e-9);
	ck_assert_double_eq_tol(
	    abs_mass, (double)mass[top[0]] + mass[top[1]] + mass[top[2]], 1e-6);
	top[0] =
	    (top[0] + 1) % n == top[1] ? (top[0] + 2) % n : (top[0] + 1) % n;
	ck_assert(kvp_attn_recall(mass, n, top, 3, NULL) < 1.0);
	ck_assert_double_eq(kvp_attn_recall(mass, n, top, 0, NULL), 0);
	ck_assert_double_eq(kvp_attn_rel_error(mass, mass, n), 0);
	kvp_attn_pool_destroy(p2);
	free(pool);
	free(ptrs);
	free(mass);
	free(mass2);
	free(K);
	free(V);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("attention");
	TCase *tc = kvp_test_tcase(s, "core", 60);

	tcase_add_loop_test(tc, against_dense, 0,
			    sizeof(shapes) / sizeof(shapes[0]));
	tcase_add_test(tc, large_scores);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, through_table);
	tcase_add_test(tc, mass_and_recall);
	return kvp_test_run(s);
}
