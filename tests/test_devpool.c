/* test_devpool.c - the device block pool, the device block tables and the
 * overlap schedule (lib/device/), on the emulated device: the GPU path's
 * host side, checked against the CPU attention (lib/kv/attention.c). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cuda/paged_attn.h"
#include "lib/device/devattn.h"
#include "lib/device/device.h"
#include "lib/device/devpool.h"
#include "lib/kv/attention.h"
#include "tests/helpers/helpers.h"

static uint32_t rng = 7;

static uint32_t urand(void)
{
	rng = rng * 1664525u + 1013904223u;
	return rng >> 8;
}

static float frand(void)
{
	return (float)urand() / (1 << 24) * 2 - 1;
}

/* ---- the pool's bookkeeping ---- */

START_TEST(pool_reuse_and_lru)
{
	struct kvp_devpool *p;
	struct kvp_devpool_stats st;
	uint32_t s0, s1, s2, s3, x;

	ck_assert_int_eq(kvp_devpool_create(0, &p), -EINVAL);
	ck_assert_int_eq(kvp_devpool_create(3, &p), 0);
	ck_assert_int_eq(kvp_devpool_assign(p, 0, 10, 0, &s0), 1);
	ck_assert_int_eq(kvp_devpool_assign(p, 0, 11, 0, &s1), 1);
	ck_assert_int_eq(kvp_devpool_assign(p, 1, 10, 0, &s2), 1);
	ck_assert(s0 != s1 && s1 != s2 && s0 != s2);
	/* the same block again in the same stage: reuse, same slot */
	ck_assert_int_eq(kvp_devpool_assign(p, 0, 10, 0, &x), 0);
	ck_assert_uint_eq(x, s0);
	ck_assert_uint_eq(kvp_devpool_held(p), 3);
	/* all held by stage 0: a new block waits for its release */
	ck_assert_int_eq(kvp_devpool_assign(p, 2, 1, 1, &x), -ENOSPC);
	ck_assert_uint_eq(kvp_devpool_lookup(p, 2, 1), KVP_DEVPOOL_NONE);
	kvp_devpool_release(p, 0);
	ck_assert_uint_eq(kvp_devpool_held(p), 0);
	/* reuse in stage 1 refreshes (0,11); the LRU is then (0,10)...
	 * no: (0,10) was used last at its second assign; order of last
	 * use is (0,11) (1,10) (0,10) before this reuse */
	ck_assert_int_eq(kvp_devpool_assign(p, 0, 11, 1, &x), 0);
	ck_assert_uint_eq(x, s1);
	ck_assert_int_eq(kvp_devpool_assign(p, 2, 1, 1, &s3), 1);
	ck_assert_uint_eq(s3, s2); /* (1,10) was the least recent */
	ck_assert_uint_eq(kvp_devpool_lookup(p, 1, 10), KVP_DEVPOOL_NONE);
	/* stages only go forward */
	ck_assert_int_eq(kvp_devpool_assign(p, 0, 10, 0, &x), -EINVAL);
	/* forget: refused while held, done once released */
	ck_assert(!kvp_devpool_forget(p, 2, 1));
	kvp_devpool_release(p, 1);
	ck_assert(kvp_devpool_forget(p, 2, 1));
	ck_assert(kvp_devpool_forget(p, 9, 9)); /* never there */
	ck_assert_int_eq(kvp_devpool_assign(p, 3, 3, 2, &x), 1);
	ck_assert_uint_eq(x, s2); /* the emptied slot first */
	kvp_devpool_unassign(p, x);
	ck_assert_uint_eq(kvp_devpool_lookup(p, 3, 3), KVP_DEVPOOL_NONE);
	kvp_devpool_stats(p, &st);
	ck_assert_uint_eq(st.reused, 2);
	ck_assert_uint_eq(st.copied, 4);
	ck_assert_uint_eq(st.evicted, 1);
	ck_assert_uint_eq(st.forgot, 1);
	kvp_devpool_destroy(p);
}
END_TEST

/* Many keys through a small pool: the map and the LRU list stay whole. */
START_TEST(pool_churn)
{
	struct kvp_devpool *p;
	uint32_t owner[64], i, slot;
	uint64_t stage;

	ck_assert_int_eq(kvp_devpool_create(64, &p), 0);
	for (i = 0; i < 64; i++)
		owner[i] = UINT32_MAX;
	for (stage = 0; stage < 2000; stage++) {
		for (i = 0; i < 20; i++) {
			uint32_t pb = urand() % 300;
			int r = kvp_devpool_assign(p, 1, pb, stage, &slot);

			ck_assert_int_ge(r, 0);
			if (r == 0)
				ck_assert_uint_eq(owner[slot], pb);
			owner[slot] = pb;
			ck_assert_uint_eq(kvp_devpool_lookup(p, 1, pb), slot);
		}
		if (stage % 7 == 0) {
			uint32_t pb = urand() % 300;

			kvp_devpool_release(p, stage);
			if (kvp_devpool_lookup(p, 1, pb) != KVP_DEVPOOL_NONE) {
				slot = kvp_devpool_lookup(p, 1, pb);
				ck_assert(kvp_devpool_forget(p, 1, pb));
				owner[slot] = UINT32_MAX;
			}
		}
		kvp_devpool_release(p, stage);
	}
	for (i = 0; i < 64; i++)
		if (owner[i] != UINT32_MAX)
			ck_assert_uint_eq(kvp_devpool_lookup(p, 1, owner[i]),
					  i);
	kvp_devpool_destroy(p);
}
END_TEST

/* ---- the shared indexing against kv_geometry.h's layout ---- */

START_TEST(indexing_matches_layout)
{
	struct kvp_kv_geometry g = { 1, 8, 2, 64, KVP_KV_BF16, 16 };
	struct kvp_paged_shape s = { 8, 2, 64, 16, KVP_ATTN_BF16, 0 };
	uint32_t j, t;

	s.slot_bytes = kvp_kv_block_bytes(&g) + 512;
	ck_assert_uint_eq(kvp_paged_block_bytes(&s), kvp_kv_block_bytes(&g));
	for (j = 0; j < 2; j++)
		for (t = 0; t < 16; t++) {
			ck_assert_uint_eq(kvp_paged_k_off(&s, 3, j, t),
					  3 * s.slot_bytes +
					      kvp_kv_k_offset(&g, j, t));
			ck_assert_uint_eq(kvp_paged_v_off(&s, 0, j, t),
					  kvp_kv_v_offset(&g, j, t));
		}
	ck_assert_uint_eq(kvp_paged_kv_head(&s, 3), 0);
	ck_assert_uint_eq(kvp_paged_kv_head(&s, 4), 1);
	/* the splits cover every entry once */
	{
		uint32_t n = 37, sp, lo, hi, next = 0;

		for (sp = 0; sp < 5; sp++) {
			kvp_paged_split_range(n, sp, 5, &lo, &hi);
			ck_assert_uint_eq(lo, next);
			next = hi;
		}
		ck_assert_uint_eq(next, n);
	}
}
END_TEST

/* ---- the engine on the emulated device (or $KVP_TEST_DEVICE) ---- */

/* The device the engine tests run on: emu, unless KVP_TEST_DEVICE names
 * another (tests/gpu/run.sh sets cuda). */
static const char *test_device(void)
{
	const char *d = getenv("KVP_TEST_DEVICE");

	return d && *d ? d : "emu";
}

static struct kvp_device *open_test_device(void)
{
	struct kvp_device *d = NULL;
	char msg[512];

	if (kvp_device_open(test_device(), &d, msg, sizeof(msg)))
		ck_abort_msg("%s", msg);
	return d;
}

struct shape {
	uint32_t q, kv, dim;
	enum kvp_kv_dtype t;
	uint32_t G;
};

/* fp16, bf16, fp32; GQA groups 1, 2, 3, 4, 8; G from 1 to 64; the
 * presets' attention shapes (llama3-8b and qwen3-8b: 32 q heads, 8 KV
 * heads, head dim 128; tiny); rows over 256 elements (the CUDA kernel's
 * 16-per-lane path) */
static const struct shape shapes[] = {
	{ 8, 2, 32, KVP_KV_FP32, 4 },	{ 8, 2, 128, KVP_KV_FP16, 4 },
	{ 8, 8, 64, KVP_KV_BF16, 16 },	{ 8, 1, 32, KVP_KV_BF16, 1 },
	{ 4, 4, 64, KVP_KV_FP16, 8 },	{ 4, 2, 16, KVP_KV_FP32, 4 },
	{ 32, 8, 128, KVP_KV_FP16, 4 }, { 32, 8, 128, KVP_KV_BF16, 16 },
	{ 32, 8, 128, KVP_KV_FP32, 64 }, { 6, 2, 264, KVP_KV_FP16, 2 },
	{ 4, 1, 512, KVP_KV_FP32, 4 },
};
#define MAXQ (32 * 128)
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

struct world {
	struct kvp_kv_geometry g;
	uint32_t layers, nphys;	/* host blocks per layer */
	size_t bb;
	char *host;		/* layers x nphys blocks */
	char *roll;		/* nseq rolling blocks per layer */
};

static void world_init(struct world *w, const struct shape *sh,
		       uint32_t layers, uint32_t nphys, uint32_t nseq)
{
	size_t n, i;
	float *tmp;

	memset(&w->g, 0, sizeof(w->g));
	w->g.layers = layers;
	w->g.q_heads = sh->q;
	w->g.kv_heads = sh->kv;
	w->g.head_dim = sh->dim;
	w->g.dtype = sh->t;
	w->g.block_tokens = sh->G;
	ck_assert_int_eq(kvp_kv_geometry_check(&w->g), 0);
	w->layers = layers;
	w->nphys = nphys;
	w->bb = kvp_kv_block_bytes(&w->g);
	n = w->bb / kvp_kv_dtype_size(sh->t);
	tmp = malloc(n * sizeof(float));
	w->host = malloc(w->bb * layers * nphys);
	w->roll = malloc(w->bb * layers * nseq);
	for (i = 0; i < (size_t)layers * (nphys + nseq); i++) {
		size_t k;

		for (k = 0; k < n; k++)
			tmp[k] = frand() * 2;
		kvp_kv_from_f32(sh->t, tmp,
				i < (size_t)layers * nphys
				    ? w->host + i * w->bb
				    : w->roll + (i - (size_t)layers * nphys) *
						    w->bb,
				n);
	}
	free(tmp);
}

static void world_free(struct world *w)
{
	free(w->host);
	free(w->roll);
}

static const void *host_block(const struct world *w, uint32_t layer,
			      uint32_t pb)
{
	return w->host + ((size_t)layer * w->nphys + pb) * w->bb;
}

static struct kvp_paged_shape paged_of(const struct kvp_kv_geometry *g)
{
	struct kvp_paged_shape s = { g->q_heads, g->kv_heads, g->head_dim,
				     g->block_tokens, (int)g->dtype, 0 };

	return s;
}

/* What one stage reads: per sequence, distinct blocks and a rolling one. */
struct plan {
	uint32_t nseq, layer;
	uint32_t off[5], pb[5 * 40];
	const void *host[5 * 40];
	const void *roll[5];
	uint32_t rntok[5];
	float q[5 * MAXQ];
};

static void plan_make(struct plan *p, const struct world *w, uint32_t layer,
		      uint32_t nseq, uint32_t per, uint32_t range)
{
	uint32_t i, k, qf = w->g.q_heads * w->g.head_dim;

	p->nseq = nseq;
	p->layer = layer;
	p->off[0] = 0;
	for (i = 0; i < nseq; i++) {
		uint32_t n = per / 2 + urand() % (per / 2 + 1), base = p->off[i];

		for (k = 0; k < n; k++) {
			uint32_t pb, j;
again:
			pb = urand() % range;
			for (j = base; j < base + k; j++)
				if (p->pb[j] == pb)
					goto again;
			p->pb[base + k] = pb;
			p->host[base + k] = host_block(w, layer, pb);
		}
		p->off[i + 1] = base + n;
		p->roll[i] = i == 1 ? NULL
				    : w->roll + ((size_t)layer * nseq + i) *
						    w->bb;
		p->rntok[i] = 1 + urand() % w->g.block_tokens;
		if (!n && !p->roll[i]) /* every sequence reads something */
			p->roll[i] = w->roll + (size_t)layer * nseq * w->bb;
	}
	for (k = 0; k < nseq * qf; k++)
		p->q[k] = frand() * 3;
}

/* The CPU's answer for sequence i of plan p. */
static void cpu_ref(const struct world *w, const struct plan *p, uint32_t i,
		    float *out)
{
	struct kvp_kv_geometry g1 = w->g;
	const void *ptrs[41];
	uint32_t ntok[41], n = 0, k;
	struct kvp_attn_blocks b;

	g1.layers = 1;
	for (k = p->off[i]; k < p->off[i + 1]; k++) {
		ptrs[n] = p->host[k];
		ntok[n++] = w->g.block_tokens;
	}
	if (p->roll[i]) {
		ptrs[n] = p->roll[i];
		ntok[n++] = p->rntok[i];
	}
	b.ptrs = ptrs;
	b.ntokens = ntok;
	b.n = n;
	ck_assert_int_eq(kvp_attn_decode_scalar(&g1, &b,
						p->q + (size_t)i * w->g.q_heads *
							   w->g.head_dim,
						out, NULL),
			 0);
}

static void check_out(const struct world *w, const struct plan *p,
		      const float *out, double tol)
{
	uint32_t qf = w->g.q_heads * w->g.head_dim, i;
	float ref[MAXQ];

	for (i = 0; i < p->nseq; i++) {
		double e;

		cpu_ref(w, p, i, ref);
		e = kvp_attn_rel_error(out + (size_t)i * qf, ref, qf);
		if (!(e < tol))
			ck_abort_msg("seq %u layer %u: relative error %g over "
				     "%g",
				     i, p->layer, e, tol);
	}
}

/*
 * Steps x layers through the overlap schedule (stage l+1 between launch
 * l and finish l), a pool smaller than the KV so that slots are evicted
 * while a kernel is queued, every emulation order: each output equals
 * the CPU's.  _i: shape x order.
 */
START_TEST(schedule_matches_cpu)
{
	const struct shape *sh = &shapes[_i % NSHAPES];
	enum kvp_emu_order order = (enum kvp_emu_order)(_i / NSHAPES);
	uint32_t layers = 3, nseq = 3, per = 12, steps = 6;
	struct world w;
	struct kvp_device *d;
	struct kvp_devattn *a;
	struct kvp_devattn_opts o;
	struct kvp_devattn_stats st;
	struct plan *pl = calloc(2, sizeof(*pl));
	float *out = malloc(sizeof(float) * 5 * MAXQ);
	char keep[8];
	uint64_t s, nst = (uint64_t)steps * layers;

	world_init(&w, sh, layers, 50, nseq);
	d = open_test_device();
	kvp_device_emu_order(d, order);
	memset(&o, 0, sizeof(o));
	o.shape = paged_of(&w.g);
	o.nslots = nseq * per + 8; /* one stage's worth and a few */
	o.max_seqs = nseq;
	o.max_entries = per;
	o.splits = 1 + _i % 3;
	ck_assert_int_eq(kvp_devattn_create(d, &o, &a), 0);
	plan_make(&pl[0], &w, 0, nseq, per, w.nphys);
	ck_assert_int_eq(kvp_devattn_stage(a, 0, 0, nseq, pl[0].off, pl[0].pb,
					   pl[0].host),
			 0);
	for (s = 0; s < nst; s++) {
		struct plan *cur = &pl[s % 2], *next = &pl[(s + 1) % 2];
		bool finished = false;
		int err;

		ck_assert_int_eq(kvp_devattn_launch(a, s, cur->roll,
						    cur->rntok, cur->q),
				 0);
		/* the rolling block and query are taken at launch */
		memcpy(keep, cur->roll[0], sizeof(keep));
		memset((void *)cur->roll[0], 0x7f, sizeof(keep));
		if (s + 1 < nst) {
			plan_make(next, &w, (uint32_t)((s + 1) % layers), nseq,
				  per, w.nphys);
			err = kvp_devattn_stage(a, s + 1, next->layer, nseq,
						next->off, next->pb,
						next->host);
			/* the pool is tight: the stage in flight may hold
			 * the slots the next one needs */
			if (err == -ENOSPC) {
				ck_assert_int_eq(kvp_devattn_finish(a, s, out),
						 0);
				finished = true;
				err = kvp_devattn_stage(a, s + 1, next->layer,
							nseq, next->off,
							next->pb, next->host);
			}
			ck_assert_int_eq(err, 0);
			if (!finished) /* two in flight at most */
				ck_assert_int_eq(
				    kvp_devattn_stage(a, s + 2, next->layer,
						      nseq, next->off,
						      next->pb, next->host),
				    -EBUSY);
		}
		if (!finished)
			ck_assert_int_eq(kvp_devattn_finish(a, s, out), 0);
		memcpy((void *)cur->roll[0], keep, sizeof(keep));
		check_out(&w, cur, out,
			  sh->t == KVP_KV_FP32 && !strcmp(test_device(), "emu")
			      ? 2e-5
			      : 1e-4);
	}
	kvp_devattn_stats(a, &st);
	ck_assert_uint_eq(st.stages, nst);
	ck_assert_uint_gt(st.evicted, 0);
	ck_assert_uint_gt(st.reused, 0);
	ck_assert_uint_gt(st.retries, 0);
	ck_assert_uint_lt(st.retries, nst - 1); /* and mostly overlapped */
	kvp_devattn_destroy(a);
	kvp_device_close(d);
	world_free(&w);
	free(pl);
	free(out);
}
END_TEST

/* The same blocks again: nothing is copied, all is reused. */
START_TEST(reuse_counted)
{
	struct world w;
	struct kvp_device *d;
	struct kvp_devattn *a;
	struct kvp_devattn_opts o;
	struct kvp_devattn_stats st;
	struct plan *pl = calloc(1, sizeof(*pl));
	float out[2 * 8 * 32];
	uint32_t n, i;
	const uint32_t *tab;

	world_init(&w, &shapes[0], 1, 40, 2);
	d = open_test_device();
	memset(&o, 0, sizeof(o));
	o.shape = paged_of(&w.g);
	o.nslots = 40;
	o.max_seqs = 2;
	o.max_entries = 12;
	ck_assert_int_eq(kvp_devattn_create(d, &o, &a), 0);
	plan_make(pl, &w, 0, 2, 12, 40);
	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(kvp_devattn_stage(a, i, 0, 2, pl->off, pl->pb,
						   pl->host),
				 0);
		/* the device block table: entry k of sequence 0 is the slot
		 * of its k-th block */
		tab = kvp_devattn_table(a, 0, &n);
		ck_assert_uint_eq(n, pl->off[1]);
		for (uint32_t k = 0; k < n; k++)
			ck_assert_uint_eq(tab[k],
					  kvp_devattn_slot(a, 0, pl->pb[k]));
		ck_assert_int_eq(kvp_devattn_launch(a, i, pl->roll, pl->rntok,
						    pl->q),
				 0);
		ck_assert_int_eq(kvp_devattn_finish(a, i, out), 0);
		check_out(&w, pl, out, 2e-5);
		kvp_devattn_stats(a, &st);
		if (i == 0)
			ck_assert_uint_eq(st.reused,
					  pl->off[2] - st.copied); /* shared */
	}
	kvp_devattn_stats(a, &st);
	/* copied once (distinct blocks), then reused every time */
	ck_assert_uint_le(st.copied, pl->off[2]);
	ck_assert_uint_eq(st.copied + st.reused, 3 * pl->off[2]);
	ck_assert_uint_ge(st.reused, 2 * pl->off[2]);
	ck_assert_uint_eq(st.evicted, 0);
	/* forget: the next stage copies that block again */
	ck_assert_int_eq(kvp_devattn_forget(a, 0, pl->pb[0]), 0);
	ck_assert_uint_eq(kvp_devattn_slot(a, 0, pl->pb[0]), KVP_DEVPOOL_NONE);
	ck_assert_int_eq(kvp_devattn_stage(a, 3, 0, 2, pl->off, pl->pb,
					   pl->host),
			 0);
	ck_assert_int_eq(kvp_devattn_forget(a, 0, pl->pb[0]), -EBUSY);
	ck_assert_int_eq(kvp_devattn_launch(a, 3, pl->roll, pl->rntok, pl->q),
			 0);
	ck_assert_int_eq(kvp_devattn_finish(a, 3, out), 0);
	check_out(&w, pl, out, 2e-5);
	kvp_devattn_stats(a, &st);
	ck_assert_uint_eq(st.copied + st.reused, 4 * pl->off[2]);
	kvp_devattn_destroy(a);
	kvp_device_close(d);
	world_free(&w);
	free(pl);
}
END_TEST

/* A pool too small: -ENOSPC while a stage holds the slots, nothing
 * changed, fine after its finish; -E2BIG when a stage can never fit. */
START_TEST(pool_full)
{
	struct world w;
	struct kvp_device *d;
	struct kvp_devattn *a;
	struct kvp_devattn_opts o;
	struct kvp_devattn_stats st;
	uint32_t off[2] = { 0, 6 }, pb[6] = { 0, 1, 2, 3, 4, 5 };
	uint32_t pb2[6] = { 6, 7, 8, 9, 10, 11 }, big[9], k;
	const void *host[9];
	float q[8 * 32], out[8 * 32];
	const void *roll[1] = { NULL };
	uint32_t rn[1] = { 0 };

	world_init(&w, &shapes[0], 1, 20, 1);
	for (k = 0; k < 8 * 32; k++)
		q[k] = frand();
	for (k = 0; k < 9; k++) {
		big[k] = k;
		host[k] = host_block(&w, 0, k);
	}
	d = open_test_device();
	memset(&o, 0, sizeof(o));
	o.shape = paged_of(&w.g);
	o.nslots = 8;
	o.max_seqs = 1;
	o.max_entries = 9;
	ck_assert_int_eq(kvp_devattn_create(d, &o, &a), 0);
	ck_assert_int_eq(kvp_devattn_stage(a, 0, 0, 1, off, pb, host), 0);
	ck_assert_int_eq(kvp_devattn_launch(a, 0, roll, rn, q), 0);
	for (k = 0; k < 6; k++)
		host[k] = host_block(&w, 0, pb2[k]);
	ck_assert_int_eq(kvp_devattn_stage(a, 1, 0, 1, off, pb2, host),
			 -ENOSPC);
	ck_assert_uint_eq(kvp_devattn_slot(a, 0, 6), KVP_DEVPOOL_NONE);
	ck_assert_int_eq(kvp_devattn_finish(a, 0, out), 0);
	ck_assert_int_eq(kvp_devattn_stage(a, 1, 0, 1, off, pb2, host), 0);
	ck_assert_int_eq(kvp_devattn_launch(a, 1, roll, rn, q), 0);
	ck_assert_int_eq(kvp_devattn_finish(a, 1, out), 0);
	/* 9 blocks in 8 slots, nothing in flight: never */
	for (k = 0; k < 9; k++)
		host[k] = host_block(&w, 0, k);
	off[1] = 9;
	ck_assert_int_eq(kvp_devattn_stage(a, 2, 0, 1, off, big, host),
			 -E2BIG);
	off[1] = 10;
	ck_assert_int_eq(kvp_devattn_stage(a, 2, 0, 1, off, big, host),
			 -E2BIG);
	/* errors: not staged, stage going back, empty sequence */
	ck_assert_int_eq(kvp_devattn_launch(a, 2, roll, rn, q), -EINVAL);
	ck_assert_int_eq(kvp_devattn_finish(a, 2, out), -EINVAL);
	off[1] = 1;
	ck_assert_int_eq(kvp_devattn_stage(a, 1, 0, 1, off, big, host),
			 -EINVAL);
	off[1] = 0;
	ck_assert_int_eq(kvp_devattn_stage(a, 2, 0, 1, off, big, host), 0);
	ck_assert_int_eq(kvp_devattn_launch(a, 2, roll, rn, q), -EINVAL);
	kvp_devattn_stats(a, &st);
	ck_assert_uint_eq(st.retries, 1);
	kvp_devattn_destroy(a);
	/* bad shapes */
	o.shape.head_dim = 44;
	ck_assert_int_eq(kvp_devattn_create(d, &o, &a), -EINVAL);
	o.shape.head_dim = 32;
	o.shape.kv_heads = 3;
	ck_assert_int_eq(kvp_devattn_create(d, &o, &a), -EINVAL);
	kvp_device_close(d);
	world_free(&w);
}
END_TEST

/* Without a GPU: a clear error naming what is missing. */
START_TEST(cuda_missing_is_clear)
{
	struct kvp_device *d = NULL;
	char msg[512] = "";
	int err;

	ck_assert_int_eq(kvp_device_open("tpu", &d, msg, sizeof(msg)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(msg, "unknown device 'tpu'"));
	/* a library that is not there: built without nvcc */
	setenv("KVP_CUDA_LIB", "/nonexistent/libkvpager-cuda.so", 1);
	ck_assert_int_eq(kvp_device_open("cuda", &d, msg, sizeof(msg)),
			 -ENODEV);
	ck_assert_ptr_nonnull(strstr(msg, "libkvpager-cuda.so"));
	ck_assert_ptr_nonnull(strstr(msg, "nvcc"));
	unsetenv("KVP_CUDA_LIB");
	/* the real one: no GPU here says which part is missing */
	err = kvp_device_open("cuda", &d, msg, sizeof(msg));
	if (err == 0) {
		kvp_device_describe(d, msg, sizeof(msg));
		printf("a CUDA device: %s\n", msg);
		kvp_device_close(d);
		return;
	}
	ck_assert_int_eq(err, -ENODEV);
	ck_assert_ptr_nonnull(strstr(msg, "--device cuda: "));
	ck_assert(strstr(msg, "no CUDA") || strstr(msg, "nvcc") ||
		  strstr(msg, "libcudart"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("devpool");
	TCase *tc = kvp_test_tcase(s, "pool", 60);
	TCase *te = kvp_test_tcase(s, "engine", 120);

	tcase_add_test(tc, pool_reuse_and_lru);
	tcase_add_test(tc, pool_churn);
	tcase_add_test(tc, indexing_matches_layout);
	tcase_add_loop_test(te, schedule_matches_cpu, 0, NSHAPES * 3);
	tcase_add_test(te, reuse_counted);
	tcase_add_test(te, pool_full);
	tcase_add_test(te, cuda_missing_is_clear);
	return kvp_test_run(s);
}
