/*
 * decode.c - `kvpbench decode`: the same decode work side by side.
 *
 * One synthetic KV (lib/synth/kv_synth.h), one predictor, one budget; each mode
 * prefills its own backing and decodes the same steps:
 *
 *   ram             everything in anonymous memory (the compute bound)
 *   mmap            the kernel's mmap of a file, cold, no prediction
 *   mmap-willneed   the same with madvise(MADV_WILLNEED) on the blocks
 *                   the predictor chose, layer-ahead
 *   kvpager-demand  a pager region, demand faults only
 *   kvpager         a pager region with layer-ahead prefetch
 *
 * The mmap modes keep the budget by dropping (MADV_DONTNEED and
 * POSIX_FADV_DONTNEED) the least recently used pager blocks over it, and
 * at each step's end whatever the kernel read around them (kvcache.c).
 * Attention reads the predictor's blocks in every mode, so the work is the
 * same; modes differ only in where the KV is and how it gets there.
 *
 * Every mode is opened and prefilled first; the measured steps then run in
 * --rounds rounds, the modes taking turns, and each ratio is the median of
 * the rounds' ratios (decode_rounds, paired_ratio): on a shared, noisy host
 * a slow spell falls on every mode alike.
 *
 * With --model (lib/model/model.h: a llama2.c checkpoint or random:PRESET)
 * the model makes the KV instead: each mode prefills the same prompt of
 * --context tokens (a checkpoint's own sampled text, a random model's
 * random tokens) and generates --steps tokens
 * greedily, tokens/s counting the whole model step; the tokens are
 * compared with an all-in-RAM exact run's (column agree: the share
 * generated alike, and top-1, the share of steps whose greedy token on
 * the exact run's own context is the exact run's).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/synth/kv_synth.h"
#include "lib/cli/cli.h"
#include "lib/kv/device_pool.h"
#include "lib/cli/progress.h"
#include "lib/device/device.h"
#include "lib/kv/kvcache.h"
#include "lib/model/model.h"
#include "lib/tunables/tunables.h"
#include "tools/kvpbench/kvpbench.h"

struct dmode {
	const char *name;
	enum kvp_kvcache_backend be;
	bool prefetch;
	bool exact; /* exact whatever --predictor says: the reference */
	int dev;    /* --device: 0 the CPU, 1 the whole KV on the device,
		       2 the device pool fed by the pager */
};

/* With --device, the device modes (the first is the compute bound):
 *   device-all      the whole KV in the device pool, preloaded
 *   device-kvpager  the pool (--device-pool) fed by the pager with
 *                   the predictor's layer-ahead prefetch
 *   device-demand   the same pool fed on demand: no prefetch */
static const struct dmode dmodes[] = {
	{ "ram", KVP_KVCACHE_RAM, false, false, 0 },
	{ "mmap", KVP_KVCACHE_MMAP, false, false, 0 },
	{ "mmap-willneed", KVP_KVCACHE_MMAP, true, false, 0 },
	{ "kvpager-demand", KVP_KVCACHE_PAGER, false, false, 0 },
	{ "kvpager", KVP_KVCACHE_PAGER, true, false, 0 },
	{ "device-all", KVP_KVCACHE_RAM, false, false, 1 },
	{ "device-kvpager", KVP_KVCACHE_PAGER, true, false, 2 },
	{ "device-demand", KVP_KVCACHE_PAGER, false, false, 2 },
	/* --model only, run first: the tokens the others are held to */
	{ "ram-exact", KVP_KVCACHE_RAM, false, true, 0 },
};
#define REF_MODE (sizeof(dmodes) / sizeof(dmodes[0]) - 1)
#define NDMODES (sizeof(dmodes) / sizeof(dmodes[0]))
#define DEV_ALL 5 /* index of device-all */
#define CPU_MODES ((1u << DEV_ALL) - 1)
#define DEV_MODES (7u << DEV_ALL)

/* Rounds of steps, the modes taking turns (see decode_rounds). */
#define MAX_ROUNDS 64

struct dres {
	bool ran;
	uint32_t *tokens;      /* --model: the tokens generated */
	double agree, top1;    /* --model: against the exact run's */
	double tps, t_step, t_compute, t_load, t_prefill;
	double bytes_read, faults, reuse, recall, rel;
	double slot_reads, slot_ios; /* per step: blocks into reuse slots,
					and the I/Os they took */
	double t_gpu;	   /* --device: attention on it, per step */
	double dev_reuse;  /* --device: of the blocks read, already there */
	double dev_mib;	   /* --device: MiB to the device per step */
	double stage_s;	   /* --device: host staging copy per step */
	uint64_t hit, late, wasted;
	double t_attn, t_pred, t_fill, t_wait; /* parts of T_step */
	double raw_gbps; /* pager modes: random reads of a pager block from
			    the same store at RAW_DEPTH, GB/s (0: none) */
	size_t raw_block; /* their size */
	char install[8];
	struct kvp_kvcache_ram ram; /* what the cache held at the end */
	double round_tps[MAX_ROUNDS]; /* synthetic: tokens/s per round */
	uint32_t rounds;		/* rounds measured (0: --model) */
};

struct dopts {
	const char *preset, *path;
	uint64_t context, budget, block;
	uint64_t ram; /* --ram: every part counted (0: --budget is frames) */
	uint32_t batch, steps, warmup, depth, M;
	uint32_t rounds; /* --rounds: measured steps in turns of the modes */
	uint32_t rank; /* --rank: lowrank r (0: the predictor's) */
	uint32_t pager_threads; /* --pager-threads (0: the pager's) */
	enum kvp_predictor_kind pred;
	int install;
	bool json, quiet;
	unsigned modes;
	const char *device;   /* --device, or NULL */
	const char *plot;     /* --plot FILE, or NULL */
	uint64_t device_pool; /* --device-pool bytes; 0: default */
	uint64_t seed_prompt;	 /* --model: the prompt's seed */
	struct kvp_model *model; /* --model, or NULL: synthetic KV */
	uint32_t *prompt;	 /* --model: context tokens */
};

/* The model's greedy decode of one mode: tokens/s over whole steps, the
 * cache's totals at the warm-up's end in *s0 and at the end in *s1;
 * forced (may be NULL): feed these instead, and count the greedy token's
 * agreement with them in *top1 (s0, s1 NULL). */
static int model_decode(const struct dopts *o, const struct dmode *m,
			struct kvp_kvcache *c, uint32_t id,
			const uint32_t *forced, struct dres *r,
			struct kvp_kvcache_stats *s0,
			struct kvp_kvcache_stats *s1)
{
	uint32_t vocab = kvp_model_config(o->model)->vocab, i, same = 0;
	struct kvp_model_seq *s;
	struct kvp_progress pg;
	double wall = 0, t0;
	char what[48];
	int err;

	snprintf(what, sizeof(what), "decode %s", m->name);
	kvp_progress_start(&pg, "kvpbench", what, o->quiet);
	err = kvp_model_seq_create(o->model, c, id, 0, &s);
	if (!err)
		err = kvp_model_prefill(s, o->prompt, (uint32_t)o->context);
	for (i = 0; i < o->steps && !err; i++) {
		uint32_t t = kvp_model_sample(kvp_model_logits(s), vocab, 0,
					      NULL);

		if (forced)
			same += t == forced[i];
		else
			r->tokens[i] = t;
		if (s0 && i == o->warmup)
			kvp_kvcache_stats(c, s0);
		t0 = kvpb_now();
		err = kvp_model_step(s, forced ? forced[i] : t, NULL);
		if (i >= o->warmup)
			wall += kvpb_now() - t0;
		kvp_progress_update(&pg, i + 1, o->steps, "steps");
	}
	kvp_progress_done(&pg, i, o->steps, "steps");
	r->top1 = (double)same / o->steps;
	if (!err && !forced)
		r->tps = (o->steps - o->warmup) / wall;
	if (s1)
		kvp_kvcache_stats(c, s1);
	kvp_model_seq_destroy(s);
	return err;
}

static void prefill_progress(void *arg, uint64_t done, uint64_t total)
{
	kvp_progress_update(arg, done >> 20, total >> 20, "MiB");
}

/* What --device is, for the header. */
static void device_name(const char *dev, char *buf, size_t len)
{
	struct kvp_device *d;

	if (kvp_device_open(dev, &d, buf, len))
		return;
	kvp_device_describe(d, buf, len);
	kvp_device_close(d);
}

/* --ram: the pager's budget is what the rest leaves (after the prefill,
 * when the predictor's metadata holds the context), the metadata as the
 * steps will grow it. */
static int fit_ram(const struct dopts *o, const struct dmode *m,
		   struct kvp_kvcache *c)
{
	struct kvp_kvcache_ram ram;
	int err = kvp_kvcache_fit_ram(c, o->ram, o->steps);

	if (err == -ENOSPC) {
		kvp_kvcache_ram(c, &ram);
		/* as the fit counts them: the metadata at the last step,
		 * the staging without the prefill's area (given back) */
		ram.metadata = kvp_kvcache_metadata_peak(c, o->steps);
		ram.staging = kvp_kvcache_layout(c)->pager_block_bytes;
		ram.total = ram.metadata + ram.rolling + ram.staging +
			    (2u << 20);
		if (ram.total < ram.metadata)
			ram.total = UINT64_MAX;
		fprintf(stderr,
			"kvpbench decode: %s: --ram %.0f MiB leaves no frames: "
			"predictor metadata %.1f MiB by the last step, rolling "
			"%.1f, staging %.1f; they and the 2 MiB of frames the "
			"pager needs take at least %" PRIu64 " bytes: give "
			"that --ram or more, or a smaller --rank (the metadata "
			"is rank / (kv_heads * head_dim) of the keys)\n",
			m->name, o->ram / 1048576.0, ram.metadata / 1048576.0,
			ram.rolling / 1048576.0, ram.staging / 1048576.0,
			ram.total);
	} else if (err) {
		fprintf(stderr, "kvpbench decode: %s: cannot set the budget "
				"--ram leaves: %s\n",
			m->name, strerror(-err));
	}
	return err;
}

#define RAW_DEPTH 64    /* reads in flight of the raw anchor */
#define RAW_READS 4096u /* reads it times */

/*
 * The disk's random-read rate at the pager block, on the store the mode
 * decoded from (written whole by the prefill): RAW_READS reads of block
 * bytes at random block offsets below len, RAW_DEPTH in flight, through
 * the store's queue (io_uring, O_DIRECT).  GB/s, or 0 if it cannot run.
 */
static double raw_rate(struct kvp_store *st, size_t block, uint64_t len)
{
	struct kvp_io ios[RAW_DEPTH], *q[RAW_DEPTH], *done[RAW_DEPTH];
	uint64_t nblk = len / block, seed = 0x9e3779b97f4a7c15ull, i;
	unsigned issued = 0, completed = 0, free_n = RAW_DEPTH, k;
	struct kvp_store_queue *sq = NULL;
	char *buf;
	double t0, rate = 0;
	int n;

	if (!st || !st->ops->queue_create || nblk < 2 ||
	    st->ops->queue_create(st, RAW_DEPTH, &sq))
		return 0;
	buf = aligned_alloc(4096, block);
	if (!buf) {
		st->ops->queue_destroy(sq);
		return 0;
	}
	for (k = 0; k < RAW_DEPTH; k++)
		q[k] = &ios[k];
	t0 = kvpb_now();
	while (completed < RAW_READS) {
		unsigned want = 0;

		while (free_n && issued + want < RAW_READS) {
			struct kvp_io *io = q[--free_n];

			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			i = (seed >> 17) % nblk;
			memset(io, 0, sizeof(*io));
			io->op = KVP_IO_READ;
			io->buf = buf; /* the data is not looked at */
			io->len = block;
			io->off = i * block;
			q[RAW_DEPTH - 1 - want] = io;
			want++;
		}
		if (want) {
			n = st->ops->submit(sq, &q[RAW_DEPTH - want], want);
			if (n < 0)
				break;
			issued += (unsigned)n;
			for (k = (unsigned)n; k < want; k++)
				q[free_n++] = q[RAW_DEPTH - want + k];
		}
		n = st->ops->reap(sq, done, RAW_DEPTH, true);
		if (n < 0)
			break;
		for (k = 0; k < (unsigned)n; k++) {
			if (done[k]->result != (int64_t)block)
				completed = RAW_READS + 1; /* failed: none */
			q[free_n++] = done[k];
		}
		completed += (unsigned)n;
	}
	if (completed == RAW_READS)
		rate = (double)RAW_READS * block / (kvpb_now() - t0) / 1e9;
	st->ops->queue_destroy(sq); /* waits for what is in flight */
	free(buf);
	return rate;
}

/* One mode's cache, open from its prefill to its results. */
struct mrun {
	const struct dmode *m;
	struct kvp_kvcache *c;
	struct kvp_kv_source src;
	uint32_t *ids;
	uint32_t steps;			 /* synthetic: steps run */
	struct kvp_kvcache_stats s0, s1; /* at the warm-up's end, the end */
	struct kvp_kvcache_device_stats ds0;
};

/* Mode @m's cache options into @co, its pager's settings into @cfg
 * (which @co points to). */
static void mode_opts(const struct dopts *o, const struct dmode *m,
		      const struct kvp_kv_geometry *g,
		      struct kvp_kvcache_opts *co, struct kvp_config *cfg)
{
	kvp_kvcache_opts_default(co, g);
	co->backend = m->be;
	co->prefetch = m->prefetch;
	co->prefetch_depth = o->depth;
	co->max_seqs = o->batch;
	co->capacity_tokens = (o->context + o->steps + 8) * o->batch;
	co->pager_block_bytes = (size_t)o->block;
	co->budget_bytes = o->budget;
	co->dir = o->path;
	kvp_predictor_opts_default(&co->pred,
				   m->exact ? KVP_PREDICTOR_EXACT : o->pred);
	co->pred.budget_tokens = o->M;
	if (o->rank)
		co->pred.rank = o->rank;
	else if (co->pred.rank > kvp_predictor_max_rank(g))
		co->pred.rank = kvp_predictor_max_rank(g) / 2;
	co->sample_every = 4;
	co->sample_layers = 2;
	co->max_samples = 256;
	kvp_config_defaults(cfg);
	if (o->install >= 0)
		cfg->install_mode = (uint64_t)o->install;
	if (o->pager_threads)
		cfg->service_threads = o->pager_threads;
	co->cfg = cfg;
	if (m->dev) {
		co->device = o->device;
		co->device_pool_bytes =
		    m->dev == 1 ? UINT64_MAX / 2 : o->device_pool;
	}
}

/*
 * Before any mode runs: a --device-pool too small for one layer's chosen
 * blocks would fail the fed modes' first step that chooses more; the
 * check kvpager run makes (device_pool.h).  0, or -E2BIG said.
 */
static int check_device_pool(const struct dopts *o,
			     const struct kvp_kv_geometry *g)
{
	struct kvp_kvcache_opts co;
	struct kvp_config cfg;
	uint32_t i;

	for (i = 0; i < NDMODES; i++) {
		if (!(o->modes & (1u << i)) || dmodes[i].dev != 2)
			continue;
		mode_opts(o, &dmodes[i], g, &co, &cfg);
		if (kvp_kv_device_pool_check("kvpbench decode", &co,
					      o->context + o->steps))
			return -E2BIG;
	}
	return 0;
}

/* Open mode @m's cache and prefill its sequences (the synthetic KV @sy,
 * or --model's prompt later, in model_decode).  0, or -errno. */
static int mode_open(const struct dopts *o, const struct dmode *m,
		     const struct kvp_kv_geometry *g, struct kvp_kv_synth *sy,
		     struct mrun *mr, struct dres *r)
{
	struct kvp_kvcache_opts co;
	struct kvp_config cfg;
	struct kvp_progress pg;
	uint32_t i;
	double t0;
	char what[48];
	int err;

	memset(mr, 0, sizeof(*mr));
	mr->m = m;
	if (sy)
		kvp_kv_source_synth(&mr->src, sy);
	mode_opts(o, m, g, &co, &cfg);
	err = kvp_kvcache_create(&co, &mr->c);
	if (err)
		return err;
	mr->ids = calloc(o->batch, sizeof(*mr->ids));
	if (!mr->ids) {
		kvp_kvcache_destroy(mr->c);
		mr->c = NULL;
		return -ENOMEM;
	}
	t0 = kvpb_now();
	snprintf(what, sizeof(what), "prefill %s", m->name);
	kvp_progress_start(&pg, "kvpbench", what, o->quiet || o->model);
	for (i = 0; i < o->batch && !err; i++) {
		err = kvp_kvcache_seq_create(mr->c, &mr->ids[i]);
		if (!err && !o->model)
			err = kvp_kvcache_prefill(
			    mr->c, mr->ids[i], o->context, &mr->src,
			    o->batch == 1 ? prefill_progress : NULL, &pg);
		if (o->batch > 1)
			kvp_progress_update(&pg, i + 1, o->batch, "sequences");
	}
	if (!err && m->dev == 1 && !o->model)
		err = kvp_kvcache_device_preload(mr->c);
	if (!err && o->ram && kvp_kvcache_pager(mr->c))
		err = fit_ram(o, m, mr->c);
	r->t_prefill = kvpb_now() - t0;
	return err;
}

/* @n more synthetic steps of @mr; the warm-up's end is marked in s0. */
static int mode_steps(const struct dopts *o, struct mrun *mr, uint32_t n)
{
	int err = 0;

	for (; n && !err; n--, mr->steps++) {
		if (mr->steps == o->warmup) {
			kvp_kvcache_stats(mr->c, &mr->s0);
			kvp_kvcache_device_stats(mr->c, &mr->ds0);
		}
		err = kvp_kvcache_step(mr->c, mr->ids, o->batch, &mr->src,
				       NULL, NULL);
	}
	return err;
}

/* The figures of @mr's measured steps (s0 to s1) into @r (unless @err),
 * then close it.  Returns @err, or the first error of this. */
static int mode_close(const struct dopts *o, struct mrun *mr, struct dres *r,
		      int err)
{
	struct kvp_kvcache *c = mr->c;
	struct kvp_kvcache_stats *s0 = &mr->s0, *s1 = &mr->s1;
	struct kvp_kvcache_device_stats ds1, *ds0 = &mr->ds0;
	struct kvp_kvcache_step_stats d;
	double n;

	if (!c)
		return err;
	if (!err) {
		if (!o->model)
			kvp_kvcache_stats(c, s1);
		err = kvp_kvcache_quality(c, &r->recall, &r->rel, NULL, NULL);
	}
	if (!err) {
		d = s1->sum;
		n = (double)(d.steps - s0->sum.steps);
		if (n < 1)
			n = 1;
		r->t_step = (d.t_step_s - s0->sum.t_step_s) / n;
		if (!o->model)
			r->tps = (d.tokens - s0->sum.tokens) /
				 (d.t_step_s - s0->sum.t_step_s);
		r->t_attn = (d.t_compute_s - s0->sum.t_compute_s) / n;
		r->t_pred = (d.t_predict_s - s0->sum.t_predict_s) / n;
		r->t_fill = (d.t_fill_s - s0->sum.t_fill_s) / n;
		r->t_wait = (d.t_wait_s - s0->sum.t_wait_s) / n;
		r->t_compute = r->t_attn + r->t_pred + r->t_fill;
		if (o->model && r->tps > 0) {
			/* the model's last layer and logits run outside
			 * the cache's step: a token is the whole step */
			r->t_compute += 1 / r->tps - r->t_step;
			r->t_step = 1 / r->tps;
		}
		r->t_load = (s1->t_load_busy_s - s0->t_load_busy_s) / n;
		r->bytes_read = (d.bytes_read - s0->sum.bytes_read) / n;
		r->faults = (d.demand_faults - s0->sum.demand_faults) / n;
		r->slot_reads = (double)(s1->slot_reads - s0->slot_reads) / n;
		r->slot_ios = (double)(s1->slot_ios - s0->slot_ios) / n;
		r->hit = d.prefetch_hit - s0->sum.prefetch_hit;
		r->late = d.prefetch_late - s0->sum.prefetch_late;
		r->wasted = d.prefetch_wasted - s0->sum.prefetch_wasted;
		r->reuse =
		    d.chosen_blocks - s0->sum.chosen_blocks
			? (double)(d.reused_blocks - s0->sum.reused_blocks) /
			      (d.chosen_blocks - s0->sum.chosen_blocks)
			: 0;
		if (!kvp_kvcache_device_stats(c, &ds1)) {
			double seen = (double)(ds1.reused + ds1.copied -
					       ds0->reused - ds0->copied);

			r->t_gpu = (d.t_compute_s - s0->sum.t_compute_s) / n;
			r->dev_reuse =
			    seen > 0 ? (ds1.reused - ds0->reused) / seen : 0;
			r->dev_mib = (ds1.bytes_to_device -
				      ds0->bytes_to_device) /
				     1048576.0 / n;
			r->stage_s = (ds1.t_stage_s - ds0->t_stage_s) / n;
		}
		snprintf(r->install, sizeof(r->install), "%s",
			 kvp_kvcache_region(c)
			     ? kvp_region_install_mode(kvp_kvcache_region(c))
			     : "-");
		kvp_kvcache_ram(c, &r->ram);
		if (mr->m->be == KVP_KVCACHE_PAGER && !mr->m->dev) {
			r->raw_block = kvp_kvcache_layout(c)->pager_block_bytes;
			r->raw_gbps = raw_rate(
			    kvp_region_store(kvp_kvcache_region(c)),
			    r->raw_block, kvp_kvcache_layout(c)->region_bytes);
		}
		r->ran = true;
	}
	free(mr->ids);
	kvp_kvcache_destroy(c);
	mr->c = NULL;
	return err;
}

/* --model: mode @m alone, its model's greedy decode; forced: the exact
 * run's tokens (NULL when this is that run). */
static int model_mode(const struct dopts *o, const struct dmode *m,
		      const struct kvp_kv_geometry *g, const uint32_t *forced,
		      struct dres *r)
{
	struct mrun mr;
	int err = mode_open(o, m, g, NULL, &mr, r);

	if (!err) {
		r->tokens = calloc(o->steps, sizeof(uint32_t));
		err = r->tokens ? model_decode(o, m, mr.c, mr.ids[0], NULL, r,
					       &mr.s0, &mr.s1)
				: -ENOMEM;
	}
	if (!err && forced && !m->exact && o->pred != KVP_PREDICTOR_EXACT) {
		/* top-1 on the exact run's context, a fresh sequence of
		 * its own */
		kvp_kvcache_seq_free(mr.c, mr.ids[0]);
		err = kvp_kvcache_seq_create(mr.c, &mr.ids[0]);
		if (!err)
			err = model_decode(o, m, mr.c, mr.ids[0], forced, r,
					   NULL, NULL);
	}
	return mode_close(o, &mr, r, err);
}

/*
 * The synthetic decode: every mode in @want opens (prefill, warm-up
 * steps), then the measured steps run in o->rounds rounds, the modes
 * taking turns round by round, so that a slow spell of a shared, noisy
 * host falls on every mode alike; each round's tokens/s is kept for the
 * ratios (paired_ratio).  A mode that fails is said and left out; the
 * others go on.  Returns the number of modes that failed.
 */
static int decode_rounds(const struct dopts *o, unsigned want,
			 const struct kvp_kv_geometry *g,
			 struct kvp_kv_synth *sy, struct dres *res)
{
	struct mrun mr[NDMODES];
	int err[NDMODES] = { 0 }, failed = 0;
	uint32_t meas = o->steps - o->warmup, k, per, done = 0;
	struct kvp_progress pg;
	unsigned i, nopen = 0;

	for (i = 0; i < NDMODES; i++) {
		mr[i].c = NULL;
		if (!(want & (1u << i)))
			continue;
		err[i] = mode_open(o, &dmodes[i], g, sy, &mr[i], &res[i]);
		if (!err[i])
			err[i] = mode_steps(o, &mr[i], o->warmup);
		nopen += !err[i];
	}
	kvp_progress_start(&pg, "kvpbench", "decode", o->quiet);
	for (k = 0; k < o->rounds; k++) {
		/* rounds differ by at most one step */
		per = meas / o->rounds + (k < meas % o->rounds);
		for (i = 0; i < NDMODES; i++) {
			struct kvp_kvcache_stats a, b;
			double t;

			if (!mr[i].c || err[i])
				continue;
			kvp_kvcache_stats(mr[i].c, &a);
			err[i] = mode_steps(o, &mr[i], per);
			kvp_kvcache_stats(mr[i].c, &b);
			t = b.sum.t_step_s - a.sum.t_step_s;
			res[i].round_tps[k] =
			    t > 0 ? (b.sum.tokens - a.sum.tokens) / t : 0;
			res[i].rounds = k + 1;
			done += per;
			kvp_progress_update(&pg, done, (uint64_t)meas * nopen,
					    "steps");
		}
	}
	kvp_progress_done(&pg, done, (uint64_t)meas * nopen, "steps");
	for (i = 0; i < NDMODES; i++) {
		if (!(want & (1u << i)))
			continue;
		err[i] = mode_close(o, &mr[i], &res[i], err[i]);
		if (err[i]) {
			fprintf(stderr, "kvpbench decode: mode %s failed: %s\n",
				dmodes[i].name, kvp_strerror(err[i]));
			failed++;
		}
	}
	return failed;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/*
 * @a's tokens/s over @b's: the median of the rounds' ratios (each round
 * of @a beside the same round of @b), or the ratio of the whole runs
 * (--model, whose modes run one after the other); -1 when @b did not
 * run.  @each, if not NULL, gets the rounds' ratios (MAX_ROUNDS).
 */
static double paired_ratio(const struct dres *a, const struct dres *b,
			   double *each)
{
	double v[MAX_ROUNDS];
	uint32_t k, n = a->rounds < b->rounds ? a->rounds : b->rounds;

	if (!b->ran || b->tps <= 0)
		return -1;
	if (!n)
		return a->tps / b->tps;
	for (k = 0; k < n; k++) {
		v[k] = b->round_tps[k] > 0 ? a->round_tps[k] / b->round_tps[k]
					   : 0;
		if (each)
			each[k] = v[k];
	}
	qsort(v, n, sizeof(v[0]), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * --plot: tokens/s per mode (all in RAM as a line), and T_step beside
 * max(T_compute, T_load), the bound a step that overlaps its loads with
 * its compute would reach.  0, or -errno (said on stderr).
 */
static int decode_plot(const struct dopts *o, const struct dres *res,
		       uint64_t kv)
{
	struct kvp_plot p;
	char title[256];
	unsigned i, n = 0;
	FILE *f;
	int err;

	snprintf(title, sizeof(title),
		 "kvpbench decode: %s, context %" PRIu64 ", predictor %s, "
		 "budget %.0f of %.0f MiB of KV, %s KV",
		 o->preset, o->context, kvp_predictor_kind_name(o->pred),
		 o->budget / 1048576.0, kv / 1048576.0,
		 o->model ? "model" : "synthetic");
	for (i = 0; i < NDMODES; i++)
		n += res[i].ran;
	if (!n) {
		fprintf(stderr, "kvpbench decode: --plot %s: no mode ran, "
				"nothing to draw\n", o->plot);
		return -ENODATA;
	}
	n = 0;
	err = kvp_plot_begin(&p, o->plot, title);
	if (err)
		return err;
	f = p.f;
	fputs("set xtics rotate by -25\nset xtics (", f);
	for (i = 0; i < NDMODES; i++) {
		if (!res[i].ran)
			continue;
		fputs(n ? ", " : "", f);
		kvp_plot_str(f, dmodes[i].name);
		fprintf(f, " %u", n++);
	}
	fprintf(f, ")\nset xrange [-0.6:%u.6]\n$d << EOD\n", n ? n - 1 : 0);
	for (i = 0, n = 0; i < NDMODES; i++) {
		const struct dres *r = &res[i];

		if (r->ran)
			fprintf(f, "%u %.4f %.4f %.4f\n", n++, r->tps,
				r->t_step * 1e3,
				(r->t_compute > r->t_load ? r->t_compute
							  : r->t_load) *
				    1e3);
	}
	fputs("EOD\n", f);
	fprintf(f, "set multiplot layout 1,2 title ");
	kvp_plot_str(f, title);
	fputs("\nset title 'tokens/s per mode'\nset ylabel 'tokens/s'\n"
	      "plot $d using 1:2:(0.6) with boxes lc rgb '#1f77b4' "
	      "title 'tokens/s', "
	      "$d using 1:2:(sprintf('%.1f', $2)) with labels offset 0,0.6 "
	      "notitle",
	      f);
	if (res[0].ran)
		fprintf(f,
			", %.4f with lines lw 2 dt 2 lc rgb 'black' "
			"title 'ram (all in RAM)'",
			res[0].tps);
	fputs("\nset title 'T_step against max(T_compute, T_load)'\n"
	      "set ylabel 'ms per step'\n"
	      "plot $d using ($1-0.2):3:(0.4) with boxes lc rgb '#ff7f0e' "
	      "title 'T_step', "
	      "$d using ($1+0.2):4:(0.4) with boxes lc rgb '#2ca02c' "
	      "title 'max(T_compute, T_load)'\n"
	      "unset multiplot\n",
	      f);
	return kvp_plot_end(&p, "kvpbench decode");
}

enum {
	D_PRESET = 300,
	D_CONTEXT,
	D_BATCH,
	D_PRED,
	D_M,
	D_STEPS,
	D_WARMUP,
	D_ROUNDS,
	D_BUDGET,
	D_BLOCK,
	D_DEPTH,
	D_INSTALL,
	D_MODES,
	D_PATH,
	D_SHORT,
	D_JSON,
	D_QUIET,
	D_HELP,
	D_MODEL,
	D_DEVICE,
	D_DEVPOOL,
	D_PLOT,
	D_RAM,
	D_RANK,
	D_PTHREADS
};

/* The numeric options: whole values, range checked before they reach a
 * field of their real width (--batch 4294967298 was a batch of 2). */
#define FIELD(f) KVPB_FIELD(struct dopts, f)
static const struct kvpb_num_opt num_opts[] = {
	{ D_CONTEXT, "context", true, 1, UINT32_MAX, FIELD(context) },
	{ D_BATCH, "batch", false, 1, 4096, FIELD(batch) },
	{ D_M, "budget-tokens", false, 1, UINT32_MAX, FIELD(M) },
	{ D_STEPS, "steps", false, 1, UINT32_MAX, FIELD(steps) },
	{ D_WARMUP, "warmup", false, 0, UINT32_MAX, FIELD(warmup) },
	{ D_ROUNDS, "rounds", false, 1, MAX_ROUNDS, FIELD(rounds) },
	{ D_BUDGET, "budget", true, 2u << 20, 1ull << 50, FIELD(budget) },
	{ D_RAM, "ram", true, 4u << 20, 1ull << 50, FIELD(ram) },
	{ D_RANK, "rank", false, 1, 4096, FIELD(rank) },
	{ D_BLOCK, "block", true, 4096, 1u << 30, FIELD(block) },
	{ D_DEPTH, "depth", false, 1, 1024, FIELD(depth) },
	{ D_PTHREADS, "pager-threads", false, 1, 64, FIELD(pager_threads) },
	{ D_DEVPOOL, "device-pool", true, 4096, 1ull << 50,
	  FIELD(device_pool) },
	{ 0, NULL, false, 0, 0, 0, 0 },
};
#undef FIELD

static const struct kvp_cli_opt dopts_table[] = {
	{ "preset", D_PRESET, 0, "P", "llama3-8b | qwen3-8b | tiny (llama3-8b)" },
	{ "context", D_CONTEXT, 0, "N", "tokens per sequence, 32K allowed (32768)" },
	{ "batch", D_BATCH, 0, "B", "sequences (1)" },
	{ "predictor", D_PRED, 0, "K", "exact | window | lowrank (lowrank)" },
	{ "budget-tokens", D_M, 0, "M", "sparse predictors' tokens per layer (400)" },
	{ "steps", D_STEPS, 0, "N", "decode steps per mode (22)" },
	{ "warmup", D_WARMUP, 0, "N", "steps left out (2)" },
	{ "rounds", D_ROUNDS, 0, "N",
	  "the measured steps in N rounds, the modes taking\n"
	  "turns; ratios are the median of the rounds' (5)" },
	{ "budget", D_BUDGET, 0, "BYTES", "RAM budget (a quarter of the KV)" },
	{ "ram", D_RAM, 0, "BYTES",
	  "kvpager modes: all the RAM, counted whole (frames,\n"
	  "predictor metadata, rolling, staging); the budget is\n"
	  "what the rest leaves after the prefill" },
	{ "rank", D_RANK, 0, "R", "lowrank: the projection's rank (128 on llama3-8b)" },
	{ "block", D_BLOCK, 0, "BYTES", "pager block (exact: 2M, sparse: one KV block)" },
	{ "depth", D_DEPTH, 0, "D",
	  "prefetch depth in layers (2; window and lowrank: 8)" },
	{ "install", D_INSTALL, 0, "M", "auto | move | copy (copy: see the report)" },
	{ "pager-threads", D_PTHREADS, 0, "N", "the pager's service_threads (its default)" },
	{ "modes", D_MODES, 0, "LIST",
	  "comma list of ram,mmap,mmap-willneed,kvpager-demand,kvpager\n"
	  "(device-all,device-kvpager,device-demand with --device)" },
	{ "device", D_DEVICE, 0, "NAME",
	  "cuda (or emu: the CPU emulation) runs attention;\n"
	  "the default modes become the device ones" },
	{ "device-pool", D_DEVPOOL, 0, "B",
	  "the device block pool of the fed modes (two layers'\n"
	  "chosen blocks)" },
	{ "path", D_PATH, 0, "DIR", "backing files' directory" },
	{ "short", D_SHORT, 0, NULL, "context 8192, 8 steps" },
	{ "json", D_JSON, 0, NULL, "one JSON object per mode" },
	{ "plot", D_PLOT, 0, "FILE",
	  "also draw tokens/s and T_step against max(T_compute,\n"
	  "T_load) per mode into FILE, an .svg or a .png (gnuplot)" },
	{ "quiet", D_QUIET, 0, NULL, "no progress on stderr" },
	{ "help", D_HELP, 0, NULL, "this text" },
	{ "model", D_MODEL, 0, "M",
	  "a llama2.c checkpoint or random:PRESET makes the KV\n"
	  "(--context tokens of its own text, or random ones)" },
	{ 0 },
};
#define NDOPTS (sizeof(dopts_table) / sizeof(dopts_table[0]))

static void dusage(FILE *f)
{
	fprintf(f, "usage: kvpbench decode [options]\n");
	kvp_cli_usage(f, dopts_table);
	fprintf(f, "Without --model the KV is synthetic "
		   "(lib/synth/kv_synth.h).\n");
}

/* ROUNDS line: mode @m's ratio to all-in-RAM @ram, round by round. */
static void print_rounds(const struct dmode *m, const struct dres *r,
			 const struct dres *ram)
{
	double each[MAX_ROUNDS], med = paired_ratio(r, ram, each);
	uint32_t k, n = r->rounds < ram->rounds ? r->rounds : ram->rounds;

	printf("ROUNDS %-12s vs ram, round by round:", m->name);
	for (k = 0; k < n; k++)
		printf(" %.3f", each[k]);
	printf(" (median %.3f)\n", med);
}

/* The JSON line's end: the rounds' ratios to all-in-RAM @ram. */
static void json_rounds(const struct dres *r, const struct dres *ram)
{
	double each[MAX_ROUNDS];
	uint32_t k, n = r->rounds < ram->rounds ? r->rounds : ram->rounds;

	if (ram->ran)
		(void)paired_ratio(r, ram, each);
	else
		n = 0;
	printf(",\"rounds\":%u,\"ratio_vs_ram_rounds\":[", r->rounds);
	for (k = 0; k < n; k++)
		printf("%s%.4f", k ? "," : "", each[k]);
	printf("]}\n");
}

int kvpbench_decode(int argc, char **argv)
{
	struct option lo[NDOPTS];
	char shorts[3 * NDOPTS + 1];
	struct dopts o = {
		.preset = "llama3-8b",
		.context = 32768,
		.batch = 1,
		.steps = 22,
		.warmup = 2,
		.rounds = 5,
		.depth = 0, /* by the predictor */
		.M = 400,
		.pred = KVP_PREDICTOR_LOWRANK,
		.install = -1,
		.modes = 0, /* by --device */
		.seed_prompt = 1,
	};
	struct dres res[NDMODES];
	struct kvp_kv_geometry g;
	struct kvp_kv_synth_opts so;
	struct kvp_kv_synth *sy = NULL;
	uint64_t v, kv;
	unsigned i;
	int c, err, failed = 0;
	bool shortrun = false, warmup_given = false;
	const char *model = NULL;
	const uint32_t *ref = NULL; /* --model: the exact run's tokens */
	char why[512], devname[160] = "";

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_table_print(stdout, "decode", dopts_table);
		return 0;
	}
	memset(res, 0, sizeof(res));
	kvp_cli_getopt(dopts_table, "", lo, shorts);
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		switch (c) {
		case D_PRESET:
			o.preset = optarg;
			continue;
		case D_PATH:
			o.path = optarg;
			continue;
		case D_SHORT:
			shortrun = true;
			continue;
		case D_JSON:
			o.json = true;
			continue;
		case D_QUIET:
			o.quiet = true;
			continue;
		case D_MODEL:
			model = optarg;
			continue;
		case D_DEVICE:
			o.device = optarg;
			continue;
		case D_PLOT:
			o.plot = optarg;
			continue;
		case D_HELP:
			dusage(stdout);
			return 0;
		case D_PRED:
			if (kvp_predictor_kind_parse(optarg, &o.pred)) {
				fprintf(stderr,
					"kvpbench decode: unknown "
					"predictor '%s'\n",
					optarg);
				return 2;
			}
			continue;
		case D_INSTALL:
			o.install = !strcmp(optarg, "auto")   ? KVP_INSTALL_AUTO
				    : !strcmp(optarg, "move") ? KVP_INSTALL_MOVE
				    : !strcmp(optarg, "copy") ? KVP_INSTALL_COPY
							      : -2;
			if (o.install == -2) {
				fprintf(stderr, "kvpbench decode: --install "
						"takes auto, move or copy\n");
				return 2;
			}
			continue;
		case D_MODES: {
			char *s = strdup(optarg), *tok, *save = NULL;

			o.modes = 0;
			for (tok = strtok_r(s, ",", &save); tok;
			     tok = strtok_r(NULL, ",", &save)) {
				for (i = 0; i < NDMODES; i++)
					if (!strcmp(tok, dmodes[i].name))
						break;
				if (i == NDMODES) {
					fprintf(stderr,
						"kvpbench decode: unknown mode "
						"'%s'\n",
						tok);
					free(s);
					return 2;
				}
				o.modes |= 1u << i;
			}
			free(s);
			continue;
		}
		case '?':
			dusage(stderr);
			return 2;
		}
		if (kvpb_num_opt_set(num_opts, c, optarg, &o))
			return 2;
		warmup_given |= c == D_WARMUP;
	}
	if (optind < argc) { /* no operand: it was run, ignored, before */
		fprintf(stderr, "kvpbench decode: unexpected '%s'\n",
			argv[optind]);
		dusage(stderr);
		return 2;
	}
	if (shortrun) {
		o.context = 8192;
		o.steps = 8;
	}
	/* as kvpager run: a --warmup given is kept or refused, the default
	 * lowered to leave a step */
	if (o.warmup >= o.steps) {
		if (warmup_given) {
			fprintf(stderr,
				"kvpbench decode: --warmup %u leaves no step to "
				"measure: use fewer than --steps %u\n",
				o.warmup, o.steps);
			return 2;
		}
		o.warmup = o.steps > 1 ? 1 : 0;
	}
	/* before the runs: a plot that cannot be made is said now */
	if (o.plot && kvp_plot_check("kvpbench decode", o.plot))
		return 2;
	if (!o.modes)
		o.modes = o.device ? DEV_MODES : CPU_MODES;
	if ((o.modes & DEV_MODES) && !o.device) {
		fprintf(stderr, "kvpbench decode: the device modes need "
				"--device cuda (or emu)\n");
		return 2;
	}
	if (o.device &&
	    (err = kvp_kvcache_device_probe(o.device, why, sizeof(why)))) {
		fprintf(stderr, "kvpbench decode: %s\n", why);
		return err == -EINVAL ? 2 : 1; /* a name that is none */
	}
	if (o.device)
		device_name(o.device, devname, sizeof(devname));
	if (o.rounds > o.steps - o.warmup)
		o.rounds = o.steps - o.warmup; /* no round without a step */
	if (model) {
		struct kvp_kv_geometry pg;
		const struct kvp_model_config *mc;
		uint64_t x = o.seed_prompt;

		err = kvp_model_open(model, NULL, &o.model, why, sizeof(why));
		if (err) {
			fprintf(stderr, "kvpbench decode: %s\n", why);
			return 2;
		}
		mc = kvp_model_config(o.model);
		if (o.batch != 1 ||
		    (mc->seq_len && o.context + o.steps > mc->seq_len)) {
			fprintf(stderr,
				"kvpbench decode: --model runs one sequence of "
				"at most %u tokens: --context and --steps "
				"pass it, or --batch is not 1\n",
				mc->seq_len);
			kvp_model_close(o.model);
			return 2;
		}
		o.prompt = malloc(sizeof(uint32_t) * o.context);
		if (!o.prompt) {
			kvp_model_close(o.model);
			return 1;
		}
		/* a checkpoint's prompt is its own text; a random model's
		 * random tokens (its text would take O(context^2)) */
		o.prompt[0] = 1;
		for (v = 1; v < o.context; v++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			o.prompt[v] = (uint32_t)(x % mc->vocab);
		}
		if (mc->seq_len && kvp_model_text(o.model, (uint32_t)o.context,
						  0.8f, o.seed_prompt,
						  o.prompt)) {
			fprintf(stderr, "kvpbench decode: the model's prompt "
					"text failed\n");
			free(o.prompt);
			kvp_model_close(o.model);
			return 1;
		}
		kvp_model_geometry(o.model,
				   strncmp(model, "random:", 7) ||
					   kvp_kv_geometry_preset(model + 7,
								  &pg)
				       ? KVP_KV_FP32
				       : pg.dtype,
				   4, &g);
		o.preset = kvp_model_name(o.model);
		/* exact's own ram mode is the reference */
		if (o.pred != KVP_PREDICTOR_EXACT || !(o.modes & 1u))
			o.modes |= 1u << REF_MODE;
	} else if (kvp_kv_geometry_preset(o.preset, &g)) {
		fprintf(stderr, "kvpbench decode: unknown preset '%s'\n",
			o.preset);
		return 2;
	}
	if (o.ram && o.model) {
		fprintf(stderr, "kvpbench decode: --ram is for the synthetic "
				"KV (the model's prefill runs inside its decode); "
				"use --budget with --model\n");
		return 2;
	}
	if (o.rank > kvp_predictor_max_rank(&g)) {
		fprintf(stderr,
			"kvpbench decode: --rank %u: at most %u for this "
			"geometry (kv_heads * head_dim)\n",
			o.rank, kvp_predictor_max_rank(&g));
		return 2;
	}
	if (!o.depth)
		o.depth = o.pred == KVP_PREDICTOR_EXACT
			      ? 2
			      : KVP_KVCACHE_SPARSE_DEPTH;
	if (o.depth >= g.layers)
		o.depth = g.layers - 1;
	if (!o.depth)
		o.depth = 1;
	kv = o.context * o.batch * kvp_kv_token_bytes(&g);
	if (!o.budget)
		o.budget = kv / 4;
	if (!o.block)
		o.block = o.pred == KVP_PREDICTOR_EXACT ? 2u << 20 : 0;
	if (check_device_pool(&o, &g))
		return 2;
	kvp_kv_synth_opts_default(&so);
	err = o.model ? 0 : kvp_kv_synth_create(&g, &so, &sy);
	if (err) {
		fprintf(stderr, "kvpbench decode: synthetic KV: %s\n",
			kvp_strerror(err));
		return 1;
	}
	for (c = 0; c < (int)NDMODES && o.model; c++) {
		/* the reference first, so that the others can be held to it */
		i = c ? (unsigned)c - 1 : REF_MODE;
		if (!(o.modes & (1u << i)))
			continue;
		err = model_mode(&o, &dmodes[i], &g, ref, &res[i]);
		if (!err && !ref)
			ref = res[i].tokens; /* the first run is exact */
		if (!err) {
			uint32_t k, same = 0;

			for (k = 0; k < o.steps; k++)
				same += res[i].tokens[k] == ref[k];
			res[i].agree = (double)same / o.steps;
			if (dmodes[i].exact || o.pred == KVP_PREDICTOR_EXACT)
				res[i].top1 = res[i].agree;
		}
		if (err) {
			fprintf(stderr, "kvpbench decode: mode %s failed: %s\n",
				dmodes[i].name, kvp_strerror(err));
			failed++;
		}
	}
	if (!o.model)
		failed += decode_rounds(&o, o.modes, &g, sy, res);
	kvp_kv_synth_destroy(sy);

	if (!o.json) {
		if (o.model)
			printf("kvpbench decode: model %s (dim %u): the model "
			       "makes the KV; prompt: %s\n",
			       o.preset, kvp_model_config(o.model)->dim,
			       kvp_model_config(o.model)->seq_len
				   ? "its own text (temperature 0.8)"
				   : "random tokens");
		char mtok[32] = "", rounds[64] = "";

		if (o.pred != KVP_PREDICTOR_EXACT && o.rank)
			snprintf(mtok, sizeof(mtok), " (M=%u, r=%u)", o.M,
				 o.rank);
		else if (o.pred != KVP_PREDICTOR_EXACT)
			snprintf(mtok, sizeof(mtok), " (M=%u)", o.M);
		if (!o.model)
			snprintf(rounds, sizeof(rounds),
				 " in %u rounds, the modes taking turns",
				 o.rounds);
		if (o.ram)
			printf("kvpbench decode: --ram %.0f MiB: kvpager modes "
			       "hold that in all, frames what the rest leaves "
			       "(RAM lines below)\n",
			       o.ram / 1048576.0);
		printf("kvpbench decode: %s, context %" PRIu64
		       ", batch %u, predictor %s%s, budget %.0f MiB of %.0f "
		       "MiB of KV, %u steps (%u warm-up left out)%s; %s KV\n",
		       o.preset, o.context, o.batch,
		       kvp_predictor_kind_name(o.pred), mtok,
		       o.budget / 1048576.0, kv / 1048576.0, o.steps, o.warmup,
		       rounds, o.model ? "MODEL" : "SYNTHETIC");
		if (o.device)
			printf("device: %s\n", devname);
		printf("%-15s %9s %9s %9s %9s %11s %9s %7s %7s %8s %8s%s%s\n",
		       "mode", "tokens/s", "T_step", "T_comp", "T_load",
		       "MiB read/st", "faults/st", "reuse", "recall", "vs_ram",
		       "vs_mmwn", o.model ? "   agree    top1" : "",
		       o.device ? "    T_gpu dev_reuse vs_dev step/max" : "");
	}
	for (i = 0; i < NDMODES; i++) {
		struct dres *r = &res[i];
		double rr = paired_ratio(r, &res[0], NULL);
		double rw = paired_ratio(r, &res[2], NULL);
		double rd = dmodes[i].dev ? paired_ratio(r, &res[DEV_ALL], NULL)
					  : -1;
		double mx = r->t_gpu > r->t_load ? r->t_gpu : r->t_load;
		double sm = dmodes[i].dev && mx > 0 ? r->t_step / mx : -1;

		if (!r->ran)
			continue;
		if (o.json) {
			printf("{\"scenario\":\"decode\",\"mode\":\"%s\","
			       "\"preset\":\"%s\",\"context\":%" PRIu64
			       ",\"batch\":%u,\"predictor\":\"%s\","
			       "\"budget_bytes\":%" PRIu64
			       ",\"synthetic_kv\":%s,\"token_agreement\":%.4f,"
			       "\"top1_agreement\":%.4f,"
			       "\"tokens_per_s\":%.4f,\"t_step_s\":%.6f,"
			       "\"t_compute_s\":%.6f,\"t_load_s\":%.6f,"
			       "\"bytes_read_per_step\":%.1f,"
			       "\"demand_faults_per_step\":%.2f,"
			       "\"prefetch_hit\":%" PRIu64
			       ",\"prefetch_late\":%" PRIu64
			       ",\"prefetch_wasted\":%" PRIu64
			       ",\"reuse_rate\":%.4f,\"recall\":%.4f,"
			       "\"rel_error\":%.5f,\"t_prefill_s\":%.3f,"
			       "\"install_mode\":\"%s\","
			       "\"ratio_vs_ram\":%.4f,"
			       "\"ratio_vs_mmap_willneed\":%.4f,"
			       "\"device\":\"%s\",\"t_gpu_s\":%.6f,"
			       "\"device_reuse_rate\":%.4f,"
			       "\"device_mib_per_step\":%.3f,"
			       "\"staging_copy_s_per_step\":%.6f,"
			       "\"ratio_vs_device\":%.4f,"
			       "\"t_step_over_max_gpu_load\":%.4f,"
			       "\"raw_random_gbps\":%.4f,"
			       "\"ram_frames_bytes\":%" PRIu64
			       ",\"ram_slots_bytes\":%" PRIu64
			       ",\"ram_metadata_bytes\":%" PRIu64
			       ",\"ram_rolling_bytes\":%" PRIu64
			       ",\"ram_staging_bytes\":%" PRIu64
			       ",\"ram_total_bytes\":%" PRIu64,
			       dmodes[i].name, o.preset, o.context, o.batch,
			       kvp_predictor_kind_name(
				   dmodes[i].exact ? KVP_PREDICTOR_EXACT
						   : o.pred),
			       o.budget, o.model ? "false" : "true",
			       o.model ? r->agree : -1, o.model ? r->top1 : -1,
			       r->tps, r->t_step, r->t_compute, r->t_load,
			       r->bytes_read, r->faults, r->hit, r->late,
			       r->wasted, r->reuse, r->recall, r->rel,
			       r->t_prefill, r->install, rr, rw,
			       dmodes[i].dev ? o.device : "cpu", r->t_gpu,
			       r->dev_reuse, r->dev_mib, r->stage_s, rd, sm,
			       r->raw_gbps, r->ram.frames, r->ram.slots, r->ram.metadata,
			       r->ram.rolling, r->ram.staging, r->ram.total);
			json_rounds(r, &res[0]);
		} else {
			printf("%-15s %9.3f %9.4f %9.4f %9.4f %11.2f %9.1f "
			       "%7.3f %7.4f %8.3f %8.3f",
			       dmodes[i].name, r->tps, r->t_step, r->t_compute,
			       r->t_load, r->bytes_read / 1048576.0, r->faults,
			       r->reuse, r->recall, rr, rw);
			if (o.model)
				printf(" %7.3f %7.3f", r->agree, r->top1);
			if (o.device && dmodes[i].dev)
				printf(" %8.4f %9.3f %6.3f %8.3f", r->t_gpu,
				       r->dev_reuse, rd, sm);
			printf("\n");
		}
	}
	for (i = 1; i < NDMODES && !o.json && res[0].ran; i++)
		if (res[i].ran && res[i].rounds)
			print_rounds(&dmodes[i], &res[i], &res[0]);
	for (i = 0; i < NDMODES && !o.json; i++)
		if (res[i].ran && !o.model)
			printf("STEP %-14s %.4f s = attention %.4f + predictor "
			       "%.4f + new K/V %.4f + waiting on loads %.4f + "
			       "the rest %.4f\n",
			       dmodes[i].name, res[i].t_step, res[i].t_attn,
			       res[i].t_pred, res[i].t_fill, res[i].t_wait,
			       res[i].t_step - res[i].t_attn - res[i].t_pred -
				   res[i].t_fill - res[i].t_wait);
	for (i = 0; i < NDMODES && !o.json; i++)
		if (res[i].ran && res[i].raw_gbps > 0)
			printf("DISK %-14s %.2f GB/s raw: random %zu KiB reads, "
			       "%d in flight, from its file after the run; the "
			       "decode read %.2f GB/s while loading (MiB "
			       "read/st over T_load), %.0f blocks a step in "
			       "%.0f reads\n",
			       dmodes[i].name, res[i].raw_gbps,
			       res[i].raw_block >> 10, RAW_DEPTH,
			       res[i].t_load > 0 ? res[i].bytes_read /
						       res[i].t_load / 1e9
						 : 0,
			       res[i].slot_reads, res[i].slot_ios);
	for (i = 0; i < NDMODES && !o.json; i++)
		if (res[i].ran)
			printf("RAM %-15s %8.1f MiB: frames %.1f (the budget, "
			       "or the KV in RAM; reuse slots %.1f of it), "
			       "predictor metadata %.1f, rolling %.1f, staging "
			       "%.1f\n",
			       dmodes[i].name, res[i].ram.total / 1048576.0,
			       res[i].ram.frames / 1048576.0,
			       res[i].ram.slots / 1048576.0,
			       res[i].ram.metadata / 1048576.0,
			       res[i].ram.rolling / 1048576.0,
			       res[i].ram.staging / 1048576.0);
	fflush(stdout);
	if (o.plot && decode_plot(&o, res, kv))
		failed++;
	for (i = 0; i < NDMODES; i++)
		free(res[i].tokens);
	free(o.prompt);
	kvp_model_close(o.model);
	return failed ? 1 : 0;
}
