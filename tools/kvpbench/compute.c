/*
 * compute.c - `kvpbench compute`: the CPU-bound rates the other scenarios
 * rest on, with no disk: the synthetic KV's fill rate (it must outrun the
 * disk, or every benchmark that prefills from it measures the generator)
 * and paged decode attention, one thread, two threads and the scalar path.
 *
 * Llama-3.1-8B's shape, fp16; attention over 8 MiB of blocks that the
 * fill just wrote (L2-warm at best).  Each figure is the median of
 * --repeat runs after an untimed first pass (which takes the page faults).  Nothing is
 * asserted: a unit test that timed these failed on a busy machine.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cli/cli.h"
#include "lib/kv/attention.h"
#include "lib/synth/kv_synth.h"
#include "tools/kvpbench/kvpbench.h"

#define NBLOCKS	     2048u /* blocks the fill writes: 32 MiB */
#define ATTN_BLOCKS  512u  /* blocks one attention call reads: 8 MiB */
#define ATTN_CALLS   20u   /* calls per timed attention run (SIMD) */
#define SCALAR_CALLS 2u	   /* the scalar path is ten times slower */

struct crate {
	const char *what; /* "synth_fill", "attention" */
	const char *path; /* the code path: "avx2+f16c", "scalar" */
	unsigned threads; /* threads working */
	double gb_per_s;  /* median */
	double min, max;  /* over the runs */
};

/* The kind of work a timed run does, and what it needs. */
struct cjob {
	const struct kvp_kv_geometry *g;
	const struct kvp_kv_synth *sy;
	char *kv;			 /* NBLOCKS blocks */
	const struct kvp_attn_blocks *b; /* the first ATTN_BLOCKS */
	const float *q;
	float *out;
	struct kvp_attn_pool *pool; /* NULL: the caller's thread only */
	bool scalar;
};

static void fill_all(const struct cjob *j)
{
	size_t bb = kvp_kv_block_bytes(j->g);
	uint32_t layers = j->g->layers, per = j->g->block_tokens;

	for (size_t i = 0; i < NBLOCKS; i++)
		kvp_kv_synth_fill(j->sy, 0, (uint32_t)(i % layers),
				  (uint32_t)(i / layers) * per, per,
				  j->kv + i * bb);
}

/* Bytes one run of @j's kind moves: the fill writes, attention reads. */
static double run_once(const struct cjob *j, bool attention)
{
	unsigned k, calls = j->scalar ? SCALAR_CALLS : ATTN_CALLS;

	if (!attention) {
		fill_all(j);
		return (double)NBLOCKS * (double)kvp_kv_block_bytes(j->g);
	}
	for (k = 0; k < calls; k++)
		if (j->scalar)
			kvp_attn_decode_scalar(j->g, j->b, j->q, j->out, NULL);
		else
			kvp_attn_decode(j->g, j->b, j->q, j->out, j->pool);
	return (double)calls * ATTN_BLOCKS * (double)kvp_kv_block_bytes(j->g);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void measure(const struct cjob *j, bool attention, unsigned repeat,
		    struct crate *r)
{
	double rate[KVPB_MAX_REPEAT];
	unsigned i;

	run_once(j, attention); /* untimed: faults, caches */
	for (i = 0; i < repeat; i++) {
		double t0 = kvpb_now(), bytes = run_once(j, attention);

		rate[i] = bytes / (kvpb_now() - t0) / 1e9;
	}
	qsort(rate, repeat, sizeof(rate[0]), cmp_double);
	r->gb_per_s = rate[repeat / 2];
	r->min = rate[0];
	r->max = rate[repeat - 1];
}

static const struct kvp_cli_opt copts_table[] = {
	{ "repeat", 'k', 0, "N", "timed runs per figure, the median shown (3)" },
	{ "json", 'j', 0, NULL, "one JSON object per line" },
	{ "help", 'h', 0, NULL, "this text" },
	{ 0 },
};
#define NCOPTS (sizeof(copts_table) / sizeof(copts_table[0]))

static void cusage(FILE *f)
{
	fprintf(f, "usage: kvpbench compute [options]\n");
	kvp_cli_usage(f, copts_table);
	fprintf(f,
		"--repeat takes 1 to %u.  Rates of the CPU-bound parts, "
		"Llama-3.1-8B shape,\nfp16: the synthetic KV's fill (one "
		"thread) and decode attention (one\nthread, two, scalar).\n",
		KVPB_MAX_REPEAT);
}

int kvpbench_compute(int argc, char **argv)
{
	struct option lo[NCOPTS];
	char shorts[3 * NCOPTS + 1];
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy = NULL;
	struct kvp_attn_pool *pool = NULL;
	const void **ptrs = NULL;
	float *q = NULL, *out = NULL;
	char *kv = NULL;
	struct crate rates[4];
	struct kvp_attn_blocks b;
	struct cjob j;
	bool json = false;
	uint64_t repeat = 3;
	unsigned i, n = 0;
	size_t bb, qn;
	int c, err;

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_table_print(stdout, "compute", copts_table);
		return 0;
	}
	kvp_cli_getopt(copts_table, "", lo, shorts);
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		switch (c) {
		case 'k':
			if (kvpb_parse_opt("repeat", optarg, false, 1,
					   KVPB_MAX_REPEAT, &repeat))
				return 2;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			cusage(stdout);
			return 0;
		default:
			cusage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvpbench compute: unexpected '%s'\n",
			argv[optind]);
		cusage(stderr);
		return 2;
	}
	kvp_kv_geometry_preset("llama3-8b", &g);
	bb = kvp_kv_block_bytes(&g);
	qn = (size_t)g.q_heads * g.head_dim;
	kvp_kv_synth_opts_default(&so);
	err = kvp_kv_synth_create(&g, &so, &sy);
	if (!err)
		err = kvp_attn_pool_create(2, &pool);
	kv = malloc(NBLOCKS * bb);
	ptrs = malloc(ATTN_BLOCKS * sizeof(*ptrs));
	q = malloc(qn * sizeof(*q));
	out = malloc(qn * sizeof(*out));
	if (!err && !(kv && ptrs && q && out))
		err = -ENOMEM;
	if (err) {
		fprintf(stderr, "kvpbench compute: cannot set up: %s\n",
			strerror(-err));
		goto out;
	}
	for (i = 0; i < ATTN_BLOCKS; i++)
		ptrs[i] = kv + (size_t)i * bb;
	b = (struct kvp_attn_blocks){ ptrs, NULL, ATTN_BLOCKS };
	kvp_kv_synth_query(sy, 0, 0, NBLOCKS, q);
	j = (struct cjob){ &g, sy, kv, &b, q, out, NULL, false };

	rates[n] = (struct crate){ "synth_fill", "", 1, 0, 0, 0 };
	measure(&j, false, (unsigned)repeat, &rates[n++]);
	rates[n] =
	    (struct crate){ "attention", kvp_attn_simd_name(), 1, 0, 0, 0 };
	measure(&j, true, (unsigned)repeat, &rates[n++]);
	j.pool = pool;
	rates[n] =
	    (struct crate){ "attention", kvp_attn_simd_name(), 2, 0, 0, 0 };
	measure(&j, true, (unsigned)repeat, &rates[n++]);
	j.pool = NULL;
	j.scalar = true;
	rates[n] = (struct crate){ "attention", "scalar", 1, 0, 0, 0 };
	measure(&j, true, (unsigned)repeat, &rates[n++]);

	if (!json)
		printf("%-10s %-10s %3s %7s %11s  (llama3-8b, fp16)\n", "what",
		       "path", "thr", "GB/s", "min-max");
	for (i = 0; i < n; i++) {
		const struct crate *r = &rates[i];

		if (json)
			printf("{\"scenario\":\"compute\",\"what\":\"%s\","
			       "\"path\":\"%s\",\"threads\":%u,\"preset\":"
			       "\"llama3-8b\",\"dtype\":\"fp16\",\"runs\":%u,"
			       "\"gb_per_s\":%.4f,\"gb_per_s_min\":%.4f,"
			       "\"gb_per_s_max\":%.4f}\n",
			       r->what, r->path, r->threads, (unsigned)repeat,
			       r->gb_per_s, r->min, r->max);
		else
			printf("%-10s %-10s %3u %7.3f %5.2f-%.2f\n", r->what,
			       r->path, r->threads, r->gb_per_s, r->min,
			       r->max);
	}
out:
	kvp_attn_pool_destroy(pool);
	kvp_kv_synth_destroy(sy);
	free(kv);
	free(ptrs);
	free(q);
	free(out);
	return err ? 1 : 0;
}
