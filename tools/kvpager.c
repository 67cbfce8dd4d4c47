/*
 * kvpager - the main job: long-context decoding whose KV cache does not fit
 * the RAM budget.
 *
 *   kvpager run [--preset P] [--context N] [--batch B]
 *               [--predictor exact|window|lowrank] [--steps N]
 *               [--budget BYTES] [--path DIR] [--json] ...
 *
 * Prefills a synthetic KV (lib/synth/kv_synth.h: sink tokens, a recent window,
 * heavy hitters, topic clusters; no model runs) for `batch` sequences of
 * `context` tokens through a pager region backed by a temporary file,
 * then decodes `steps` tokens per sequence with the chosen predictor,
 * prefetching layer-ahead, and reports tokens/s, the overlap of compute
 * and loads, bytes read, faults, prefetch outcomes, the reuse rate, and
 * (sampled against exact attention) recall and relative error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/instance/instance.h"
#include "lib/synth/kv_synth.h"
#include "lib/kv/kvcache.h"
#include "lib/tunables/tunables.h"

struct run_opts {
	const char *preset;
	uint64_t context;
	uint32_t batch;
	enum kvp_predictor_kind pred;
	uint32_t steps;
	uint32_t warmup;
	uint64_t budget; /* 0: a quarter of the KV */
	const char *path;
	bool json;
	bool quiet;
	bool prefetch;
	uint32_t depth;
	uint64_t block; /* pager block bytes; 0: by predictor */
	uint32_t M;	/* predictor budget tokens */
	uint32_t G;	/* tokens per KV block */
	uint32_t sample_every;
	uint32_t sample_layers;
	uint64_t seed;
	unsigned threads;
	int install; /* -1: the pager's default */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *human(double b, char *buf, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;

	while (b >= 1024 && i < 4) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
	return buf;
}

/* ---- progress bar on stderr ---------------------------------------- */

struct bar {
	const char *what;
	bool on;
	double t0, last;
	int shown;
};

static void bar_draw(struct bar *b, uint64_t done, uint64_t total,
		     const char *unit)
{
	double t = now_s(), frac = total ? (double)done / total : 1;
	char line[64];
	int n = (int)(frac * 30), i;

	if (!b->on || (t - b->last < 0.1 && done < total))
		return;
	b->last = t;
	for (i = 0; i < 30; i++)
		line[i] = i < n ? '#' : '.';
	line[30] = 0;
	fprintf(stderr, "\r%-8s [%s] %3.0f%% %" PRIu64 "/%" PRIu64 " %s %.1fs ",
		b->what, line, frac * 100, done, total, unit, t - b->t0);
	b->shown = 1;
	if (done >= total)
		fputc('\n', stderr);
}

static void prefill_progress(void *arg, uint64_t done, uint64_t total)
{
	bar_draw(arg, done >> 20, total >> 20, "MiB");
}

static void usage(FILE *f)
{
	const char *const *p = kvp_kv_geometry_presets();

	fprintf(f, "usage: kvpager run [options]\n"
		   "  --preset P         model shape:");
	for (; *p; p++)
		fprintf(f, " %s", *p);
	fprintf(
	    f,
	    " (llama3-8b)\n"
	    "  --context N        tokens per sequence (32768)\n"
	    "  --batch B          sequences (1)\n"
	    "  --predictor K      exact | window | lowrank (exact)\n"
	    "  --steps N          decode steps (16)\n"
	    "  --warmup N         steps left out of the figures (2)\n"
	    "  --budget BYTES     RAM budget (a quarter of the KV)\n"
	    "  --path DIR         where the backing file goes ($TMPDIR "
	    "or /tmp)\n"
	    "  --depth D          prefetch depth in layers (2)\n"
	    "  --no-prefetch      demand faults only\n"
	    "  --block BYTES      pager block (exact: 2M; sparse: one KV "
	    "block)\n"
	    "  --budget-tokens M  sparse predictors' tokens per layer (400)\n"
	    "  --block-tokens G   tokens per KV block (4)\n"
	    "  --sample-every N   score the choice against exact attention "
	    "every N steps (4)\n"
	    "  --sample-layers K  layers scored per sampled step (4)\n"
	    "  --threads T        attention threads (0: all CPUs)\n"
	    "  --seed S           synthetic KV seed (1)\n"
	    "  --json             one JSON object on stdout\n"
	    "  --quiet            no progress on stderr\n"
	    "The KV is synthetic (lib/synth/kv_synth.h); no model runs.\n");
}

enum {
	O_PRESET = 256,
	O_CONTEXT,
	O_BATCH,
	O_PRED,
	O_STEPS,
	O_WARMUP,
	O_BUDGET,
	O_PATH,
	O_JSON,
	O_QUIET,
	O_DEPTH,
	O_NOPF,
	O_BLOCK,
	O_M,
	O_G,
	O_SEVERY,
	O_SLAYERS,
	O_SEED,
	O_THREADS,
	O_HELP,
	O_INSTALL
};

static const struct option long_opts[] = {
	{ "preset", required_argument, NULL, O_PRESET },
	{ "context", required_argument, NULL, O_CONTEXT },
	{ "batch", required_argument, NULL, O_BATCH },
	{ "predictor", required_argument, NULL, O_PRED },
	{ "steps", required_argument, NULL, O_STEPS },
	{ "warmup", required_argument, NULL, O_WARMUP },
	{ "budget", required_argument, NULL, O_BUDGET },
	{ "path", required_argument, NULL, O_PATH },
	{ "json", no_argument, NULL, O_JSON },
	{ "quiet", no_argument, NULL, O_QUIET },
	{ "depth", required_argument, NULL, O_DEPTH },
	{ "no-prefetch", no_argument, NULL, O_NOPF },
	{ "block", required_argument, NULL, O_BLOCK },
	{ "budget-tokens", required_argument, NULL, O_M },
	{ "block-tokens", required_argument, NULL, O_G },
	{ "sample-every", required_argument, NULL, O_SEVERY },
	{ "sample-layers", required_argument, NULL, O_SLAYERS },
	{ "seed", required_argument, NULL, O_SEED },
	{ "threads", required_argument, NULL, O_THREADS },
	{ "help", no_argument, NULL, O_HELP },
	{ "install", required_argument, NULL, O_INSTALL },
	{ NULL, 0, NULL, 0 },
};

static int parse_u64(const char *s, uint64_t *v)
{
	uint64_t b;
	int err = kvp_parse_bytes(s, &b); /* 32K for contexts too */

	if (err)
		return err;
	*v = b;
	return 0;
}

static int parse_args(int argc, char **argv, struct run_opts *o)
{
	uint64_t v;
	int c;

	while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
		const char *a = optarg;

		switch (c) {
		case O_PRESET:
			o->preset = a;
			break;
		case O_PATH:
			o->path = a;
			break;
		case O_JSON:
			o->json = true;
			break;
		case O_QUIET:
			o->quiet = true;
			break;
		case O_NOPF:
			o->prefetch = false;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		case O_INSTALL:
			if (!strcmp(a, "auto"))
				o->install = KVP_INSTALL_AUTO;
			else if (!strcmp(a, "move"))
				o->install = KVP_INSTALL_MOVE;
			else if (!strcmp(a, "copy"))
				o->install = KVP_INSTALL_COPY;
			else {
				fprintf(stderr, "kvpager: --install takes "
						"auto, move or copy\n");
				return -EINVAL;
			}
			break;
		case O_PRED:
			if (kvp_predictor_kind_parse(a, &o->pred)) {
				fprintf(stderr,
					"kvpager: unknown predictor '%s': "
					"use exact, window or lowrank\n",
					a);
				return -EINVAL;
			}
			break;
		case '?':
			usage(stderr);
			return -EINVAL;
		default:
			if (parse_u64(a, &v)) {
				fprintf(stderr,
					"kvpager: --%s: '%s' is not a number "
					"(decimal, with an optional K M G T P "
					"suffix: 32K, 512M)\n",
					long_opts[c - O_PRESET].name, a);
				return -EINVAL;
			}
			switch (c) {
			case O_CONTEXT:
				o->context = v;
				break;
			case O_BATCH:
				o->batch = (uint32_t)v;
				break;
			case O_STEPS:
				o->steps = (uint32_t)v;
				break;
			case O_WARMUP:
				o->warmup = (uint32_t)v;
				break;
			case O_BUDGET:
				o->budget = v;
				break;
			case O_DEPTH:
				o->depth = (uint32_t)v;
				break;
			case O_BLOCK:
				o->block = v;
				break;
			case O_M:
				o->M = (uint32_t)v;
				break;
			case O_G:
				o->G = (uint32_t)v;
				break;
			case O_SEVERY:
				o->sample_every = (uint32_t)v;
				break;
			case O_SLAYERS:
				o->sample_layers = (uint32_t)v;
				break;
			case O_SEED:
				o->seed = v;
				break;
			case O_THREADS:
				o->threads = (unsigned)v;
				break;
			}
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvpager: unexpected argument '%s'\n",
			argv[optind]);
		return -EINVAL;
	}
	if (!o->context || !o->batch || !o->steps) {
		fprintf(stderr, "kvpager: context, batch and steps must be "
				"at least 1\n");
		return -EINVAL;
	}
	if (o->warmup >= o->steps)
		o->warmup = o->steps > 1 ? 1 : 0;
	return 0;
}

static void sub_stats(struct kvp_kvcache_step_stats *a,
		      const struct kvp_kvcache_step_stats *b)
{
	a->steps -= b->steps;
	a->tokens -= b->tokens;
	a->t_step_s -= b->t_step_s;
	a->t_compute_s -= b->t_compute_s;
	a->t_predict_s -= b->t_predict_s;
	a->t_wait_s -= b->t_wait_s;
	a->t_fill_s -= b->t_fill_s;
	a->bytes_read -= b->bytes_read;
	a->bytes_written -= b->bytes_written;
	a->demand_faults -= b->demand_faults;
	a->prefetch_issued -= b->prefetch_issued;
	a->prefetch_hit -= b->prefetch_hit;
	a->prefetch_late -= b->prefetch_late;
	a->prefetch_wasted -= b->prefetch_wasted;
	a->chosen_blocks -= b->chosen_blocks;
	a->reused_blocks -= b->reused_blocks;
	a->flush_store -= b->flush_store;
	a->flush_region -= b->flush_region;
}

static int run(int argc, char **argv)
{
	struct run_opts o = {
		.preset = "llama3-8b",
		.context = 32768,
		.batch = 1,
		.pred = KVP_PREDICTOR_EXACT,
		.steps = 16,
		.warmup = 2,
		.prefetch = true,
		.depth = 2,
		.M = 400,
		.G = 4,
		.sample_every = 4,
		.sample_layers = 4,
		.seed = 1,
		.install = -1,
	};
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy = NULL;
	struct kvp_kv_source src;
	struct kvp_kvcache_opts co;
	struct kvp_config cfg;
	struct kvp_kvcache *c = NULL;
	struct kvp_instance *inst = NULL;
	bool budget_given;
	char why[512];
	struct kvp_kvcache_stats s_warm, s_end;
	struct kvp_kvcache_step_stats d;
	struct bar bar = { 0 };
	uint32_t *ids = NULL, i;
	uint64_t kv_bytes;
	double t_open, t_prefill, t_decode, t_quality, t0, busy;
	double recall = 0, rel = 0, mass = 0;
	uint32_t nsamp = 0;
	char h1[32], h2[32], h3[32];
	int err;

	err = parse_args(argc, argv, &o);
	if (err)
		return 2;
	if (kvp_kv_geometry_preset(o.preset, &g)) {
		fprintf(stderr, "kvpager: unknown preset '%s'\n", o.preset);
		usage(stderr);
		return 2;
	}
	g.block_tokens = o.G;
	if (kvp_kv_geometry_check(&g)) {
		fprintf(stderr, "kvpager: bad geometry (--block-tokens %u)\n",
			o.G);
		return 2;
	}
	kv_bytes = o.context * o.batch * kvp_kv_token_bytes(&g);
	budget_given = o.budget != 0;
	if (!o.budget)
		o.budget = kv_bytes / 4;
	if (!o.block)
		o.block = o.pred == KVP_PREDICTOR_EXACT ? 2u << 20 : 0;
	bar.on = !o.quiet && isatty(2);

	kvp_kv_synth_opts_default(&so);
	so.seed = o.seed;
	err = kvp_kv_synth_create(&g, &so, &sy);
	if (err) {
		fprintf(stderr, "kvpager: cannot create the synthetic KV: %s\n",
			kvp_strerror(err));
		return 1;
	}
	kvp_kv_source_synth(&src, sy);

	kvp_kvcache_opts_default(&co, &g);
	co.max_seqs = o.batch;
	co.capacity_tokens = (o.context + o.steps + g.block_tokens) * o.batch;
	co.pager_block_bytes = (size_t)o.block;
	co.dir = o.path;
	co.budget_bytes = o.budget;
	co.prefetch = o.prefetch;
	co.prefetch_depth = o.depth < g.layers ? o.depth : g.layers - 1;
	if (!co.prefetch_depth)
		co.prefetch_depth = 1;
	kvp_predictor_opts_default(&co.pred, o.pred);
	co.pred.budget_tokens = o.M;
	co.pred.max_seqs = o.batch;
	co.attn_threads = o.threads;
	co.sample_every = o.sample_every;
	co.sample_layers = o.sample_layers;
	co.max_samples = 4096;
	kvp_config_defaults(&cfg);
	if (o.install >= 0)
		cfg.install_mode = (uint64_t)o.install;
	cfg.ram_budget_bytes = o.budget < (2u << 20) ? 2u << 20 : o.budget;
	t0 = now_s();
	/* The pager comes from the instance: KVP_<TUNABLE> variables apply
	 * over these settings, and KVP_FUSE_MOUNT mounts the debug view
	 * (with seqs/<id>/block_table) for kvpctl. */
	err = kvp_instance_open(&(struct kvp_instance_opts){ .cfg = &cfg },
				&inst, why, sizeof(why));
	if (err) {
		fprintf(stderr, "kvpager: %s\n", why);
		kvp_kv_synth_destroy(sy);
		return 1;
	}
	kvp_pager_config(kvp_instance_pager(inst), &cfg);
	if (budget_given && cfg.ram_budget_bytes != o.budget) {
		/* --budget wins over KVP_RAM_BUDGET_BYTES. */
		cfg.ram_budget_bytes = o.budget;
		kvp_pager_reconfigure(kvp_instance_pager(inst), &cfg, NULL);
		kvp_pager_config(kvp_instance_pager(inst), &cfg);
	}
	o.budget = cfg.ram_budget_bytes;
	co.budget_bytes = o.budget;
	co.pager = kvp_instance_pager(inst);
	err = kvp_kvcache_create(&co, &c);
	t_open = now_s() - t0;
	if (err) {
		fprintf(stderr, "kvpager: cannot set up the KV cache: %s\n",
			kvp_strerror(err));
		kvp_instance_close(inst);
		kvp_kv_synth_destroy(sy);
		return 1;
	}
	if (kvp_instance_view(inst))
		kvp_kvcache_attach_view(c, kvp_instance_view(inst));
	ids = calloc(o.batch, sizeof(*ids));
	if (!ids)
		goto nomem;

	/* prefill */
	t0 = now_s();
	bar.what = "prefill";
	bar.t0 = t0;
	for (i = 0; i < o.batch; i++) {
		err = kvp_kvcache_seq_create(c, &ids[i]);
		if (!err)
			err = kvp_kvcache_prefill(
			    c, ids[i], o.context, &src,
			    o.batch == 1 ? prefill_progress : NULL, &bar);
		if (err) {
			fprintf(stderr,
				"kvpager: prefill of sequence %u failed: %s\n",
				i, kvp_strerror(err));
			goto fail;
		}
		if (o.batch > 1)
			bar_draw(&bar, i + 1, o.batch, "sequences");
	}
	t_prefill = now_s() - t0;

	/* decode */
	t0 = now_s();
	bar.what = "decode";
	bar.t0 = t0;
	bar.last = 0;
	memset(&s_warm, 0, sizeof(s_warm));
	for (i = 0; i < o.steps; i++) {
		if (i == o.warmup)
			kvp_kvcache_stats(c, &s_warm);
		err = kvp_kvcache_step(c, ids, o.batch, &src, NULL, NULL);
		if (err) {
			fprintf(stderr, "kvpager: decode step %u failed: %s\n",
				i, kvp_strerror(err));
			goto fail;
		}
		bar_draw(&bar, i + 1, o.steps, "steps");
	}
	kvp_kvcache_stats(c, &s_end);
	t_decode = now_s() - t0;
	t0 = now_s();
	err = kvp_kvcache_quality(c, &recall, &rel, &mass, &nsamp);
	t_quality = now_s() - t0;
	if (err) {
		fprintf(stderr,
			"kvpager: scoring against exact attention "
			"failed: %s\n",
			kvp_strerror(err));
		goto fail;
	}

	d = s_end.sum;
	sub_stats(&d, &s_warm.sum);
	busy = s_end.t_load_busy_s - s_warm.t_load_busy_s;
	{
		double n = d.steps ? (double)d.steps : 1;
		double tstep = d.t_step_s / n;
		double tcomp = (d.t_compute_s + d.t_predict_s + d.t_fill_s) / n;
		double tload = busy / n;
		double mx = tcomp > tload ? tcomp : tload;
		double eff = tstep > 0 ? mx / tstep : 0;
		double tps = d.t_step_s > 0 ? d.tokens / d.t_step_s : 0;
		double reuse = d.chosen_blocks
				   ? (double)d.reused_blocks / d.chosen_blocks
				   : 0;
		struct kvp_region *r = kvp_kvcache_region(c);
		const char *imode = r ? kvp_region_install_mode(r) : "-";
		const char *pk = kvp_predictor_kind_name(o.pred);
		uint64_t pbb = kvp_kvcache_layout(c)->pager_block_bytes;

		if (o.json) {
			printf(
			    "{\"preset\":\"%s\",\"context\":%" PRIu64
			    ",\"batch\":%u,\"predictor\":\"%s\","
			    "\"budget_bytes\":%" PRIu64 ",\"kv_bytes\":%" PRIu64
			    ",\"synthetic_kv\":true,\"steps\":%u,"
			    "\"warmup_steps\":%u,\"measured_steps\":%" PRIu64
			    ",\"tokens_per_s\":%.4f,\"t_step_s\":%.6f,"
			    "\"t_compute_s\":%.6f,\"t_load_s\":%.6f,"
			    "\"t_wait_s\":%.6f,"
			    "\"overlap_efficiency\":%.4f,"
			    "\"t_step_over_max\":%.4f,"
			    "\"bytes_read_per_step\":%.1f,"
			    "\"bytes_written_per_step\":%.1f,"
			    "\"demand_faults_per_step\":%.3f,"
			    "\"prefetch_issued\":%" PRIu64
			    ",\"prefetch_hit\":%" PRIu64
			    ",\"prefetch_late\":%" PRIu64
			    ",\"prefetch_wasted\":%" PRIu64
			    ",\"reuse_rate\":%.4f,\"recall\":%.4f,"
			    "\"rel_error\":%.5f,\"chosen_mass\":%.4f,"
			    "\"quality_samples\":%u,"
			    "\"pager_block_bytes\":%" PRIu64
			    ",\"prefetch_depth_layers\":%u,"
			    "\"install_mode\":\"%s\","
			    "\"metadata_bytes\":%zu,"
			    "\"t_open_s\":%.3f,\"t_prefill_s\":%.3f,"
			    "\"t_decode_s\":%.3f,\"t_quality_s\":%.3f,"
			    "\"rolling_flush_store\":%" PRIu64
			    ",\"rolling_flush_region\":%" PRIu64 "}\n",
			    o.preset, o.context, o.batch, pk, o.budget,
			    kv_bytes, o.steps, o.warmup, d.steps, tps, tstep,
			    tcomp, tload, d.t_wait_s / n, eff,
			    mx > 0 ? tstep / mx : 0, d.bytes_read / n,
			    d.bytes_written / n, d.demand_faults / n,
			    d.prefetch_issued, d.prefetch_hit, d.prefetch_late,
			    d.prefetch_wasted, reuse, recall, rel, mass, nsamp,
			    pbb, o.prefetch ? co.prefetch_depth : 0, imode,
			    kvp_predictor_metadata_bytes(
				kvp_kvcache_predictor(c)),
			    t_open, t_prefill, t_decode, t_quality,
			    s_end.sum.flush_store, s_end.sum.flush_region);
		} else {
			printf("kvpager run: %s (%u layers, %u q heads, %u KV "
			       "heads, head dim %u, %s, G=%u), context %" PRIu64
			       ", batch %u, predictor %s",
			       o.preset, g.layers, g.q_heads, g.kv_heads,
			       g.head_dim, kvp_kv_dtype_name(g.dtype),
			       g.block_tokens, o.context, o.batch, pk);
			if (o.pred != KVP_PREDICTOR_EXACT)
				printf(" (M=%u tokens per layer)", o.M);
			printf("\n  KV %s, SYNTHETIC (sink tokens, recent "
			       "window, heavy hitters, topic clusters; no "
			       "model runs)\n",
			       human((double)kv_bytes, h1, sizeof(h1)));
			printf(
			    "  budget %s (%.1f%% of the KV), pager block %s, "
			    "install %s, prefetch %s\n",
			    human((double)o.budget, h2, sizeof(h2)),
			    100.0 * o.budget / kv_bytes,
			    human((double)pbb, h3, sizeof(h3)), imode,
			    o.prefetch ? "layer-ahead" : "off (demand)");
			if (o.prefetch)
				printf("  prefetch depth %u layers\n",
				       co.prefetch_depth);
			printf("phases: set-up %.2f s, prefill %.2f s (%.2f "
			       "GB/s of KV), decode %.2f s (%u steps), "
			       "scoring %.2f s\n",
			       t_open, t_prefill,
			       t_prefill > 0 ? kv_bytes / t_prefill / 1e9 : 0,
			       t_decode, o.steps, t_quality);
			printf("decode, %" PRIu64 " steps after %u warm-up:\n",
			       d.steps, o.warmup);
			printf("  tokens/s              %.3f\n", tps);
			printf("  T_step                %.4f s\n", tstep);
			printf("  T_compute             %.4f s (attention "
			       "%.4f, predictor %.4f, new K/V %.4f)\n",
			       tcomp, d.t_compute_s / n, d.t_predict_s / n,
			       d.t_fill_s / n);
			printf("  T_load                %.4f s (time with a "
			       "prefetch outstanding)\n",
			       tload);
			printf("  max(T_compute,T_load) %.4f s: T_step is "
			       "%.3fx of it, overlap efficiency %.3f\n",
			       mx, mx > 0 ? tstep / mx : 0, eff);
			printf("  waiting on loads      %.4f s/step\n",
			       d.t_wait_s / n);
			printf("  bytes read/step       %s\n",
			       human(d.bytes_read / n, h1, sizeof(h1)));
			printf("  demand faults/step    %.2f\n",
			       d.demand_faults / n);
			printf("  prefetch              issued %" PRIu64
			       ", hit %" PRIu64 ", late %" PRIu64
			       ", wasted %" PRIu64 " (blocks)\n",
			       d.prefetch_issued, d.prefetch_hit,
			       d.prefetch_late, d.prefetch_wasted);
			printf("  reuse rate            %.3f (chosen blocks "
			       "already resident)\n",
			       reuse);
			printf("  recall                %.4f of the oracle's "
			       "top-k attention mass (chosen mass %.4f)\n",
			       recall, mass);
			printf("  rel_error             %.5f (output vs exact "
			       "attention, %u sampled layer-steps)\n",
			       rel, nsamp);
			if (kvp_predictor_metadata_bytes(
				kvp_kvcache_predictor(c)))
				printf(
				    "  predictor metadata    %s resident\n",
				    human((double)kvp_predictor_metadata_bytes(
					      kvp_kvcache_predictor(c)),
					  h1, sizeof(h1)));
			printf("  rolling blocks        %" PRIu64
			       " written to the store, %" PRIu64
			       " through the region\n",
			       s_end.sum.flush_store, s_end.sum.flush_region);
		}
	}
	kvp_kvcache_attach_view(c, NULL);
	kvp_kvcache_destroy(c);
	kvp_instance_close(inst);
	kvp_kv_synth_destroy(sy);
	free(ids);
	return 0;
nomem:
	err = -ENOMEM;
	fprintf(stderr, "kvpager: out of memory\n");
fail:
	kvp_kvcache_attach_view(c, NULL);
	kvp_kvcache_destroy(c);
	kvp_instance_close(inst);
	kvp_kv_synth_destroy(sy);
	free(ids);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "run"))
		return run(argc - 1, argv + 1);
	fprintf(stderr, "kvpager: unknown command '%s' (try: kvpager run)\n",
		argv[1]);
	return 2;
}
