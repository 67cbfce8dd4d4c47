/* test_kvcache_device.c - the KV cache's device path (kvcache.h, ON A
 * DEVICE) on the emulated device: the same outputs as the CPU's for every
 * backend and predictor, through forks, copy on write and a freed
 * sequence whose blocks a new one reuses (no stale device copy), with a
 * pool tight enough that slots are evicted and the overlap sometimes
 * waits; and --device cuda's error where there is no GPU. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/kv/kvcache.h"
#include "lib/synth/kv_synth.h"
#include "lib/tunables/tunables.h"
#include "pager/pager.h"
#include "tests/helpers/helpers.h"
#include "tests/helpers/pager_fx.h"

#define STEPS 8

/* emu, unless KVP_TEST_DEVICE names another (tests/gpu/run.sh: cuda) */
static const char *test_device(void)
{
	const char *d = getenv("KVP_TEST_DEVICE");

	return d && *d ? d : "emu";
}

static struct kvp_kv_synth *synth(const struct kvp_kv_geometry *g)
{
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *s;

	kvp_kv_synth_opts_default(&so);
	ck_assert_int_eq(kvp_kv_synth_create(g, &so, &s), 0);
	return s;
}

/* prefill, fork, steps, free, a new sequence in the freed blocks, steps */
static void script(struct kvp_kvcache *c, const struct kvp_kv_source *src,
		   float *out, size_t per_step)
{
	uint32_t a, b, d, pair[2], step;

	ck_assert_int_eq(kvp_kvcache_seq_create(c, &a), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, a, 1001, src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &d), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, d, 600, src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_seq_fork(c, a, 998, &b), 0);
	pair[0] = a;
	pair[1] = b;
	for (step = 0; step < STEPS / 2; step++)
		ck_assert_int_eq(kvp_kvcache_step(c, pair, 2, src,
						  out + step * per_step, NULL),
				 0);
	/* d's blocks come back to a new sequence with other contents */
	pair[0] = d;
	ck_assert_int_eq(kvp_kvcache_step(c, pair, 1, src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_seq_free(c, d), 0);
	ck_assert_int_eq(kvp_kvcache_seq_free(c, b), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &d), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, d, 1203, src, NULL, NULL), 0);
	pair[0] = a;
	pair[1] = d;
	for (; step < STEPS; step++)
		ck_assert_int_eq(kvp_kvcache_step(c, pair, 2, src,
						  out + step * per_step, NULL),
				 0);
}

static const struct {
	enum kvp_kvcache_backend be;
	bool prefetch;
	enum kvp_predictor_kind kind;
	uint64_t pool_blocks; /* 0: the default pool */
} cases[] = {
	{ KVP_KVCACHE_RAM, false, KVP_PREDICTOR_EXACT, 0 },
	{ KVP_KVCACHE_PAGER, true, KVP_PREDICTOR_EXACT, 0 },
	{ KVP_KVCACHE_PAGER, true, KVP_PREDICTOR_EXACT, 700 }, /* tight */
	{ KVP_KVCACHE_PAGER, false, KVP_PREDICTOR_EXACT, 700 },
	{ KVP_KVCACHE_PAGER, true, KVP_PREDICTOR_WINDOW, 0 },
	{ KVP_KVCACHE_PAGER, true, KVP_PREDICTOR_LOWRANK, 0 },
	{ KVP_KVCACHE_RAM, false, KVP_PREDICTOR_LOWRANK, 60 },
};

static void opts(struct kvp_kvcache_opts *o, const struct kvp_kv_geometry *g,
		 int k)
{
	kvp_kvcache_opts_default(o, g);
	o->backend = cases[k].be;
	o->prefetch = cases[k].prefetch;
	o->max_seqs = 4;
	o->capacity_tokens = 4000;
	o->budget_bytes = 2u << 20;
	o->attn_threads = 1;
	o->prefetch_depth = 1;
	kvp_predictor_opts_default(&o->pred, cases[k].kind);
	o->pred.budget_tokens = 64;
	o->pred.rank = 32; /* tiny's keys have 64 elements */
}

START_TEST(same_as_cpu)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_synth *sy;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;
	struct kvp_kvcache_device_stats ds;
	size_t per_step, n, qf, i;
	float *cpu, *dev;

	kvp_kv_geometry_preset("tiny", &g);
	g.layers = 3;
	g.head_dim = 32; /* an odd kernel width for the CUDA path too */
	sy = synth(&g);
	kvp_kv_source_synth(&src, sy);
	qf = (size_t)g.q_heads * g.head_dim;
	per_step = 2 * (size_t)g.layers * qf;
	n = per_step * STEPS;
	cpu = calloc(n, sizeof(float));
	dev = calloc(n, sizeof(float));

	opts(&o, &g, _i);
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	script(c, &src, cpu, per_step);
	ck_assert_int_eq(kvp_kvcache_device_stats(c, &ds), -ENODEV);
	kvp_kvcache_destroy(c);

	opts(&o, &g, _i);
	o.device = test_device();
	o.device_pool_bytes =
	    cases[_i].pool_blocks * kvp_kv_block_bytes(&g);
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	script(c, &src, dev, per_step);
	ck_assert_int_eq(kvp_kvcache_device_stats(c, &ds), 0);
	if (!strcmp(test_device(), "emu"))
		ck_assert_ptr_nonnull(strstr(ds.name, "emu"));
	ck_assert_uint_eq(ds.stages, (STEPS + 1) * g.layers);
	ck_assert_uint_gt(ds.copied, 0);
	ck_assert_uint_gt(ds.reused, 0);
	if (cases[_i].pool_blocks) {
		ck_assert_uint_eq(ds.pool_slots, cases[_i].pool_blocks);
		ck_assert_uint_gt(ds.evicted, 0);
	}
	kvp_kvcache_destroy(c);

	for (i = 0; i < n; i += qf) {
		double e = kvp_attn_rel_error(dev + i, cpu + i, qf);

		if (!(e < 1e-4))
			ck_abort_msg("case %d, output %zu: relative error %g",
				     _i, i / qf, e);
	}
	free(cpu);
	free(dev);
	kvp_kv_synth_destroy(sy);
}
END_TEST

/* The whole KV preloaded: steps copy nothing but rolling blocks. */
START_TEST(preload_all)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_synth *sy;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;
	struct kvp_kvcache_device_stats d0, d1;
	uint32_t id, i;

	kvp_kv_geometry_preset("tiny", &g);
	sy = synth(&g);
	kvp_kv_source_synth(&src, sy);
	opts(&o, &g, 0);
	o.device = test_device();
	o.device_pool_bytes = UINT64_MAX / 2; /* all of it */
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, id, 999, &src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_device_preload(c), 0);
	kvp_kvcache_device_stats(c, &d0);
	ck_assert_uint_eq(d0.copied, 2 * (999 / 4));
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src, NULL, NULL),
				 0);
	kvp_kvcache_device_stats(c, &d1);
	/* the block that filled at token 1000 is the only new one */
	ck_assert_uint_eq(d1.copied - d0.copied, 2);
	ck_assert_uint_eq(d1.rolling - d0.rolling, 3 * 2);
	kvp_kvcache_destroy(c);
	kvp_kv_synth_destroy(sy);
}
END_TEST

/*
 * A retune on a device run: the device path holds, a layer and sequence,
 * the blocks the predictor it was created with may choose, so a change to
 * one choosing more (exact, or a larger budget) is refused, naming the
 * tunable, and the run goes on; one choosing as many or fewer is taken.
 * Before, the check passed them and the next step failed with -E2BIG.
 */
START_TEST(retune_within_device)
{
	struct kvp_kv_geometry g;
	struct kvp_kv_synth *sy;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c;
	struct kvp_kv_config kv, more;
	const char *bad = NULL;
	uint32_t id;

	kvp_kv_geometry_preset("tiny", &g);
	sy = synth(&g);
	kvp_kv_source_synth(&src, sy);
	opts(&o, &g, 4); /* window, budget 64: 17 blocks */
	o.device = test_device();
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), 0);
	ck_assert_int_eq(kvp_kvcache_seq_create(c, &id), 0);
	ck_assert_int_eq(kvp_kvcache_prefill(c, id, 1001, &src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src, NULL, NULL), 0);

	kvp_kv_config_defaults(&kv);
	kv.attention_threads = o.attn_threads;
	kv.kv_block_tokens = g.block_tokens;
	kv.lowrank_rank = o.pred.rank;
	kv.lowrank_fit_tokens = o.pred.fit_tokens;
	kv.prefetch_depth_layers = 1;
	kv.predictor = KVP_PREDICTOR_WINDOW;
	kv.predict_budget_tokens = 64;
	more = kv;
	more.predictor = KVP_PREDICTOR_EXACT;
	ck_assert_int_eq(kvp_kvcache_retune_check(c, &more, &bad), -E2BIG);
	ck_assert_str_eq(bad, "predictor");
	ck_assert_int_eq(kvp_kvcache_retune(c, &more, &bad), -E2BIG);
	ck_assert_int_eq(kvp_predictor_kind(kvp_kvcache_predictor(c)),
			 KVP_PREDICTOR_WINDOW);
	more = kv;
	more.predict_budget_tokens = 128;
	bad = NULL;
	ck_assert_int_eq(kvp_kvcache_retune(c, &more, &bad), -E2BIG);
	ck_assert_str_eq(bad, "predict_budget_tokens");
	ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src, NULL, NULL), 0);
	/* fewer, then as many again: taken, and the steps run */
	more.predict_budget_tokens = 32;
	ck_assert_int_eq(kvp_kvcache_retune(c, &more, &bad), 0);
	ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src, NULL, NULL), 0);
	ck_assert_int_eq(kvp_kvcache_retune(c, &kv, &bad), 0);
	ck_assert_int_eq(kvp_kvcache_step(c, &id, 1, &src, NULL, NULL), 0);
	kvp_kvcache_destroy(c);
	kvp_kv_synth_destroy(sy);
}
END_TEST

/* --device cuda without a GPU: create fails, the probe says why. */
START_TEST(cuda_without_gpu)
{
	struct kvp_kv_geometry g;
	struct kvp_kvcache_opts o;
	struct kvp_kvcache *c = NULL;
	char msg[512] = "";
	int err;

	kvp_kv_geometry_preset("tiny", &g);
	opts(&o, &g, 0);
	o.device = "cuda";
	err = kvp_kvcache_device_probe("cuda", msg, sizeof(msg));
	if (!err) {
		printf("a CUDA device is here: the GPU tests are "
		       "tests/gpu/run.sh\n");
		return;
	}
	ck_assert_int_eq(err, -ENODEV);
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), -ENODEV);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(msg, "--device cuda: "));
	o.device = "tpu";
	ck_assert_int_eq(kvp_kvcache_create(&o, &c), -EINVAL);
	ck_assert_int_eq(kvp_kvcache_device_probe("cpu", msg, sizeof(msg)), 0);
	ck_assert_int_eq(kvp_kvcache_device_probe(NULL, msg, sizeof(msg)), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("kvcache_device");
	TCase *tc = kvp_test_tcase(s, "core", 300);
	int err = kvp_test_pager_err();

	if (err)
		return kvp_test_skip("cannot open a pager: %s",
				     kvp_strerror(err));
	tcase_add_loop_test(tc, same_as_cpu, 0,
			    sizeof(cases) / sizeof(cases[0]));
	tcase_add_test(tc, preload_all);
	tcase_add_test(tc, retune_within_device);
	tcase_add_test(tc, cuda_without_gpu);
	return kvp_test_run(s);
}
