/*
 * test_kv_source.c - the KV cache calls its source as kv_source.h says:
 * the order of fill, query, plan_query and attended in a decode step, the
 * prefill's begin, end and layer order, and a source's errors reaching the
 * caller.  A recording source wraps the synthetic one; the cache is all in
 * RAM (the order does not depend on the backend).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kvcache.h"
#include "lib/synth/kv_synth.h"
#include "tests/helpers/helpers.h"

enum ev_kind {
	EV_FILL,
	EV_QUERY,
	EV_PLAN_QUERY,
	EV_ATTENDED,
	EV_BEGIN,
	EV_END
};

struct ev {
	enum ev_kind kind;
	uint32_t seq, layer;
	uint64_t pos; /* token (fill, begin) or pos (queries, attended) */
	uint32_t n;   /* fill: tokens; begin: tokens */
	float out0;   /* attended: out[0] */
};

struct rec {
	struct kvp_kv_source inner; /* the synthetic source */
	pthread_mutex_t lock;
	struct ev ev[1 << 14];
	size_t nev;
	int fail_query;		  /* query returns this (0: works) */
	int fail_begin;		  /* prefill_begin returns this */
	uint32_t fail_fill_layer; /* fill of this layer fails (UINT32_MAX) */
};

static void rec_add(struct rec *r, struct ev e)
{
	pthread_mutex_lock(&r->lock);
	ck_assert_uint_lt(r->nev, sizeof(r->ev) / sizeof(r->ev[0]));
	r->ev[r->nev++] = e;
	pthread_mutex_unlock(&r->lock);
}

static int rec_fill(void *arg, uint32_t seq, uint32_t layer, uint64_t token,
		    uint32_t n, void *kvblock)
{
	struct rec *r = arg;

	rec_add(r, (struct ev){ EV_FILL, seq, layer, token, n, 0 });
	if (layer == r->fail_fill_layer)
		return -EIO;
	return r->inner.ops->fill(r->inner.arg, seq, layer, token, n, kvblock);
}

static int rec_query(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
		     float *q)
{
	struct rec *r = arg;

	rec_add(r, (struct ev){ EV_QUERY, seq, layer, pos, 0, 0 });
	if (r->fail_query)
		return r->fail_query;
	return r->inner.ops->query(r->inner.arg, seq, layer, pos, q);
}

static int rec_plan_query(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
			  float *q)
{
	struct rec *r = arg;

	rec_add(r, (struct ev){ EV_PLAN_QUERY, seq, layer, pos, 0, 0 });
	return r->inner.ops->query(r->inner.arg, seq, layer, pos, q);
}

static int rec_attended(void *arg, uint32_t seq, uint32_t layer, uint64_t pos,
			const float *out)
{
	rec_add(arg, (struct ev){ EV_ATTENDED, seq, layer, pos, 0, out[0] });
	return 0;
}

static int rec_begin(void *arg, uint32_t seq, uint64_t token, uint64_t n)
{
	struct rec *r = arg;

	rec_add(r, (struct ev){ EV_BEGIN, seq, 0, token, (uint32_t)n, 0 });
	return r->fail_begin;
}

static void rec_end(void *arg, uint32_t seq)
{
	rec_add(arg, (struct ev){ EV_END, seq, 0, 0, 0, 0 });
}

static const struct kvp_kv_source_ops rec_ops = {
	.fill = rec_fill,
	.query = rec_query,
	.plan_query = rec_plan_query,
	.attended = rec_attended,
	.prefill_begin = rec_begin,
	.prefill_end = rec_end,
};

/* 4 layers of 4 KiB KV blocks (G = 4). */
static const struct kvp_kv_geometry G4 = { 4, 4, 2, 64, KVP_KV_FP32, 4 };

struct fixture {
	struct kvp_kv_synth *sy;
	struct rec *r;
	struct kvp_kv_source src;
	struct kvp_kvcache *c;
};

static void setup(struct fixture *f, enum kvp_predictor_kind kind,
		  unsigned flags)
{
	struct kvp_kv_synth_opts so;
	struct kvp_kvcache_opts o;

	kvp_kv_synth_opts_default(&so);
	ck_assert_int_eq(kvp_kv_synth_create(&G4, &so, &f->sy), 0);
	f->r = calloc(1, sizeof(*f->r));
	ck_assert_ptr_nonnull(f->r);
	pthread_mutex_init(&f->r->lock, NULL);
	f->r->fail_fill_layer = UINT32_MAX;
	kvp_kv_source_synth(&f->r->inner, f->sy);
	f->src = (struct kvp_kv_source){ &rec_ops, f->r, flags };
	kvp_kvcache_opts_default(&o, &G4);
	o.backend = KVP_KVCACHE_RAM;
	o.max_seqs = 2;
	o.capacity_tokens = 4096;
	o.attn_threads = 2; /* prefill: two layers at a time */
	o.prefetch_depth = 2;
	kvp_predictor_opts_default(&o.pred, kind);
	o.pred.rank = 16;
	o.pred.budget_tokens = 64;
	ck_assert_int_eq(kvp_kvcache_create(&o, &f->c), 0);
}

static void teardown(struct fixture *f)
{
	kvp_kvcache_destroy(f->c);
	pthread_mutex_destroy(&f->r->lock);
	free(f->r);
	kvp_kv_synth_destroy(f->sy);
}

/* Index of the first event of kind k for (seq, layer) at or after from;
 * SIZE_MAX if none. */
static size_t find(const struct rec *r, size_t from, enum ev_kind k,
		   uint32_t seq, uint32_t layer)
{
	size_t i;

	for (i = from; i < r->nev; i++)
		if (r->ev[i].kind == k && r->ev[i].seq == seq &&
		    r->ev[i].layer == layer)
			return i;
	return SIZE_MAX;
}

/*
 * A decode step of two sequences: per layer, fill of the new token after
 * the previous layer's attended, query after fill, attended right after
 * with the output the step returns; query only for the layer computing,
 * plan_query for the layers ahead (lowrank needs a query).
 */
START_TEST(step_call_order)
{
	struct fixture f;
	uint32_t a, b, seqs[2], layer, i, step, L = G4.layers;
	size_t qf = (size_t)G4.q_heads * G4.head_dim, k, plans = 0;
	float *out = calloc(2 * L * qf, sizeof(float));

	ck_assert_ptr_nonnull(out);
	setup(&f, KVP_PREDICTOR_LOWRANK, 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(f.c, &a), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(f.c, &b), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, 301, &f.src, NULL, NULL),
			 0);
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, b, 130, &f.src, NULL, NULL),
			 0);
	seqs[0] = a;
	seqs[1] = b;
	for (step = 0; step < 3; step++) {
		uint64_t pos[2] = { kvp_kvcache_seq_tokens(f.c, a) + 1,
				    kvp_kvcache_seq_tokens(f.c, b) + 1 };
		size_t prev_att[2] = { 0, 0 };

		f.r->nev = 0;
		ck_assert_int_eq(
		    kvp_kvcache_step(f.c, seqs, 2, &f.src, out, NULL), 0);
		for (layer = 0; layer < L; layer++) {
			for (i = 0; i < 2; i++) {
				size_t fi = find(f.r, prev_att[i], EV_FILL,
						 seqs[i], layer);
				size_t qi =
				    find(f.r, 0, EV_QUERY, seqs[i], layer);
				size_t ai =
				    find(f.r, 0, EV_ATTENDED, seqs[i], layer);

				ck_assert_uint_ne(fi, SIZE_MAX);
				ck_assert_uint_eq(f.r->ev[fi].pos, pos[i] - 1);
				ck_assert_uint_eq(f.r->ev[fi].n, 1);
				ck_assert_uint_lt(fi, qi);
				ck_assert_uint_eq(f.r->ev[qi].pos, pos[i]);
				ck_assert_uint_lt(qi, ai);
				ck_assert_uint_ne(ai, SIZE_MAX);
				ck_assert_uint_eq(f.r->ev[ai].pos, pos[i]);
				ck_assert(f.r->ev[ai].out0 ==
					  out[((size_t)i * L + layer) * qf]);
				/* the next layer's fill comes after this */
				prev_att[i] = ai;
				ck_assert_uint_eq(
				    find(f.r, qi + 1, EV_QUERY, seqs[i], layer),
				    SIZE_MAX);
			}
		}
		for (k = 0; k < f.r->nev; k++)
			plans += f.r->ev[k].kind == EV_PLAN_QUERY;
	}
	/* every layer of every step was planned with plan_query */
	ck_assert_uint_ge(plans, 3 * 2 * L - 2 * 2);
	teardown(&f);
	free(out);
}
END_TEST

/*
 * A prefill calls prefill_begin first and prefill_end last, fills each
 * (layer, token) once with a layer's tokens in order, and with
 * KVP_KV_SOURCE_LAYER_ORDER one layer after the other; the KV is the
 * same either way (the decode that follows gives the same output).
 */
static void prefill_order(unsigned flags, float *out)
{
	struct fixture f;
	uint32_t a, layer, L = G4.layers;
	uint64_t next[8] = { 0 }, t0 = 3, n = 297;
	size_t k;

	setup(&f, KVP_PREDICTOR_EXACT, flags);
	ck_assert_int_eq(kvp_kvcache_seq_create(f.c, &a), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, t0, &f.src, NULL, NULL),
			 0);
	f.r->nev = 0;
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, n, &f.src, NULL, NULL), 0);
	ck_assert_uint_eq(f.r->ev[0].kind, EV_BEGIN);
	ck_assert_uint_eq(f.r->ev[0].pos, t0);
	ck_assert_uint_eq(f.r->ev[0].n, n);
	ck_assert_uint_eq(f.r->ev[f.r->nev - 1].kind, EV_END);
	for (layer = 0; layer < L; layer++)
		next[layer] = t0;
	layer = 0;
	for (k = 1; k + 1 < f.r->nev; k++) {
		const struct ev *e = &f.r->ev[k];

		ck_assert_uint_eq(e->kind, EV_FILL);
		ck_assert_uint_eq(e->pos, next[e->layer]);
		next[e->layer] += e->n;
		if (flags & KVP_KV_SOURCE_LAYER_ORDER) {
			ck_assert_msg(e->layer >= layer,
				      "fill of layer %u after layer %u",
				      e->layer, layer);
			layer = e->layer;
		}
	}
	for (layer = 0; layer < L; layer++)
		ck_assert_uint_eq(next[layer], t0 + n);
	ck_assert_int_eq(kvp_kvcache_step(f.c, &a, 1, &f.src, out, NULL), 0);
	teardown(&f);
}

START_TEST(prefill_call_order)
{
	size_t nout = (size_t)G4.layers * G4.q_heads * G4.head_dim;
	float *any = calloc(nout, sizeof(float));
	float *ordered = calloc(nout, sizeof(float));

	ck_assert(any && ordered);
	prefill_order(0, any);
	prefill_order(KVP_KV_SOURCE_LAYER_ORDER, ordered);
	ck_assert(!memcmp(any, ordered, nout * sizeof(float)));
	free(any);
	free(ordered);
}
END_TEST

/*
 * A source's error reaches the caller: a failing prefill_begin appends
 * nothing; a failing fill still ends the prefill; a failing query fails
 * the step.
 */
START_TEST(source_errors)
{
	struct fixture f;
	uint32_t a;

	setup(&f, KVP_PREDICTOR_EXACT, 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(f.c, &a), 0);
	f.r->fail_begin = -ENOMEM;
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, 40, &f.src, NULL, NULL),
			 -ENOMEM);
	ck_assert_uint_eq(kvp_kvcache_seq_tokens(f.c, a), 0);
	ck_assert_uint_eq(f.r->nev, 1); /* begin only: no end, no fill */
	f.r->fail_begin = 0;
	f.r->fail_fill_layer = 2;
	f.r->nev = 0;
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, 40, &f.src, NULL, NULL),
			 -EIO);
	ck_assert_uint_eq(f.r->ev[f.r->nev - 1].kind, EV_END);
	ck_assert_int_eq(kvp_kvcache_seq_free(f.c, a), 0);
	f.r->fail_fill_layer = UINT32_MAX;
	ck_assert_int_eq(kvp_kvcache_seq_create(f.c, &a), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(f.c, a, 40, &f.src, NULL, NULL),
			 0);
	f.r->fail_query = -EPROTO;
	ck_assert_int_eq(kvp_kvcache_step(f.c, &a, 1, &f.src, NULL, NULL),
			 -EPROTO);
	/* a source without fill or query is refused */
	{
		struct kvp_kv_source_ops none = { 0 };
		struct kvp_kv_source bad = { &none, NULL, 0 };

		ck_assert_int_eq(
		    kvp_kvcache_prefill(f.c, a, 4, &bad, NULL, NULL), -EINVAL);
		ck_assert_int_eq(kvp_kvcache_step(f.c, &a, 1, &bad, NULL, NULL),
				 -EINVAL);
	}
	teardown(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kv_source");
	TCase *tc = kvp_test_tcase(s, "core", 120);

	tcase_add_test(tc, step_call_order);
	tcase_add_test(tc, prefill_call_order);
	tcase_add_test(tc, source_errors);
	return kvp_test_run(s);
}
