/*
 * pager_modes.c - the modes kvpager-move and kvpager-copy, and the install
 * micro-scenario.
 *
 * Each run opens its own pager with ram_budget_bytes = the budget and
 * install_mode forced (other tunables from their KVP_<NAME> environment
 * variables, else their defaults), a file store on the backing file and one
 * region over the job's range with KVP_REGION_FROM_STORE.  The threads
 * touch one word per 4 KiB page, as mmap's do, and check the pattern.  Only
 * the touching is timed: opening the pager (which pre-touches its frame
 * pool) and creating the region are not.
 */
#include "tools/kvpbench/kvpbench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/tunables/tunables.h"
#include "pager/pager.h"

#define RA_DEFAULT UINT64_MAX /* leave readahead_bytes as it is */

/*
 * Open a pager: tunables from the environment (over the fault-around of a
 * program's memory, for @program's touches), then the budget, the install
 * mode and (unless RA_DEFAULT) readahead_bytes forced.  readahead_bytes is
 * set by name through the registry, so that a pager without it still runs.
 */
static int pager_open(struct kvpb_ctx *c, uint64_t budget, unsigned install,
		      uint64_t ra_bytes, bool program, struct kvp_pager **out)
{
	struct kvp_config cfg;
	struct kvp_tunable_target tg = { .pager = &cfg };
	const struct kvp_tunable *t;
	char msg[KVP_TUNABLE_ERR_MAX];
	static bool said, named;
	size_t pos = 0;
	int err;

	/* a misspelt variable would be ignored without a word: said once */
	while (!named && kvp_env_unknown_next(&pos, msg, sizeof(msg)))
		fprintf(stderr, "kvpbench: warning: %s\n", msg);
	named = true;
	kvp_config_defaults(&cfg);
	/* A program's touches: the shim's fault-around, unless set. */
	if (program)
		cfg.fault_around_bytes = KVP_FAULT_AROUND_PROGRAM;
	if (kvp_tunables_load_env(&tg, msg, sizeof(msg))) {
		fprintf(stderr, "kvpbench: %s\n", msg);
		return -EINVAL;
	}
	cfg.ram_budget_bytes = budget;
	cfg.install_mode = install;
	if (c->opts.pager_threads)
		cfg.service_threads = c->opts.pager_threads;
	if (ra_bytes != RA_DEFAULT) {
		t = kvp_tunable_find("readahead_bytes");
		if (!t && !said)
			fprintf(stderr, "kvpbench: warning: the pager has no "
					"readahead_bytes tunable; its window "
					"is not set\n");
		said = true;
		if (t && kvp_tunable_set(&tg, t, ra_bytes, msg, sizeof(msg))) {
			fprintf(stderr, "kvpbench: %s\n", msg);
			return -EINVAL;
		}
	}
	err = kvp_pager_open(&cfg, out);
	if (err)
		fprintf(stderr, "kvpbench: cannot open a pager: %s\n",
			kvp_strerror(err));
	return err;
}

/* Stream with --prefetch: keep the next depth blocks asked for. */
struct pf_state {
	struct kvp_region *r;
	uint64_t *blocks; /* depth entries, one batch */
};

static void *pager_worker(void *arg)
{
	struct kvpb_worker *w = arg;
	const struct kvpb_job *j = w->j;
	struct pf_state *pf = w->arg;
	uint64_t i, next_pf = 0, half = j->depth > 1 ? j->depth / 2 : 1;
	int err;

	pthread_barrier_wait(w->start);
	w->what = "prefetch";
	for (i = 0; i < j->reads; i++) {
		uint64_t off = kvpb_job_off(j, w->t, i);

		if (pf && next_pf < j->reads && next_pf < i + j->depth &&
		    (next_pf <= i + half || !i)) {
			uint64_t end = i + j->depth, n = 0;

			if (end > j->reads)
				end = j->reads;
			if (next_pf <= i)
				next_pf = i + 1;
			while (next_pf < end)
				pf->blocks[n++] = next_pf++;
			if (n) {
				err = kvp_prefetch_submit(pf->r, pf->blocks, n,
							  NULL);
				if (err && !w->err)
					w->err = err;
			}
		}
		kvpb_worker_at(w, off);
		w->bad += kvpb_consume(w->base + (off - j->off), off, j->block);
		if (j->writes) {
			/* The word it holds: dirty, with the same data. */
			volatile uint64_t *word =
			    (volatile uint64_t *)(w->base + (off - j->off));

			*word = kvpb_pattern(off);
		}
		kvpb_worker_done(w, j->block);
	}
	return NULL;
}

/*
 * A run that wrote ends when its writes are in the file, as raw's and
 * the mmap child's (msync) do: the region's last flush, up to a budget of
 * dirty blocks, is timed with it.
 */
static int flush_timed(struct kvp_region *reg, struct kvpb_result *r)
{
	struct kvpb_cpu a, b;
	struct kvpb_result f = { 0 };
	double t0 = kvpb_now();
	int err;

	kvpb_cpu_sample(&a);
	err = kvp_region_flush(reg);
	kvpb_cpu_sample(&b);
	if (err) {
		fprintf(stderr, "kvpbench: region flush: %s\n",
			kvp_strerror(err));
		return err;
	}
	r->seconds += kvpb_now() - t0;
	r->gb_per_s = r->seconds > 0 ? r->bytes / r->seconds / 1e9 : 0;
	kvpb_cpu_account(&a, &b, &f);
	if (r->cpu_s >= 0 && f.cpu_s >= 0)
		r->cpu_s += f.cpu_s;
	if (r->cpu_pager_s >= 0 && f.cpu_pager_s >= 0)
		r->cpu_pager_s += f.cpu_pager_s;
	return 0;
}

static void fill_stats(struct kvp_region *reg, struct kvpb_result *r)
{
	kvp_region_stats(reg, &r->stats);
	r->has_stats = true;
	snprintf(r->install_mode, sizeof(r->install_mode), "%s",
		 kvp_region_install_mode(reg));
}

int kvpb_pager_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		   unsigned install_mode, struct kvpb_result *r)
{
	struct kvp_pager *p = NULL;
	struct kvp_store *s = NULL;
	struct kvp_region *reg = NULL;
	struct kvp_region_opts ro;
	struct pf_state pf = { 0 };
	bool use_pf = c->opts.prefetch && !j->order && j->threads == 1;
	int err, derr;

	/* Stream: the window is --depth blocks, raw's depth.  Random and
	 * touch: the pager's own (its readahead should not fire on random
	 * faults, and touch measures what the pager does by itself). */
	err = pager_open(c, c->opts.budget, install_mode,
			 j->order || j->region_block
			     ? RA_DEFAULT
			     : (uint64_t)j->depth * j->block,
			 !strcmp(j->scenario, "touch"), &p);
	if (err)
		return err;
	err = kvp_store_file_open(c->file.path, 0, 0, &s);
	if (err) {
		fprintf(stderr,
			"kvpbench: cannot open a file store on %s: %s\n",
			c->file.path, kvp_strerror(err));
		goto out;
	}
	ro = (struct kvp_region_opts){
		.name = "kvpbench",
		.size = j->len,
		.block_bytes = j->region_block ? j->region_block : j->block,
		.store = s,
		.store_offset = j->off,
		.flags = KVP_REGION_FROM_STORE,
	};
	err = kvp_region_create(p, &ro, &reg);
	if (err) {
		fprintf(stderr,
			"kvpbench: cannot create a region of %llu "
			"bytes in %llu-byte blocks: %s\n",
			(unsigned long long)j->len,
			(unsigned long long)j->block, kvp_strerror(err));
		goto out;
	}
	if (use_pf) {
		pf.r = reg;
		pf.blocks = calloc(j->depth, sizeof(*pf.blocks));
		if (!pf.blocks) {
			err = -ENOMEM;
			goto out;
		}
	}
	kvpb_drop_cache(&c->file);
	err = kvpb_run_threads(c, j, pager_worker, kvp_region_addr(reg),
			       use_pf ? &pf : NULL, r);
	if (!err && j->writes)
		err = flush_timed(reg, r);
	fill_stats(reg, r);
	if (use_pf)
		snprintf(r->mode + strlen(r->mode),
			 sizeof(r->mode) - strlen(r->mode), "+pf");
out:
	if (reg) {
		derr = kvp_region_destroy(reg);
		if (derr && !err) {
			fprintf(stderr, "kvpbench: region destroy: %s\n",
				kvp_strerror(derr));
			err = derr;
		}
	}
	/* The pager's service threads hold queues on the store until it
	 * closes: the store goes last. */
	kvp_pager_close(p);
	kvp_store_destroy(s);
	free(pf.blocks);
	return err;
}

/* One install run: a fresh pager, a region over the memory store @s. */
static int install_once(struct kvpb_ctx *c, struct kvp_store *s,
			uint64_t budget, const struct kvpb_job *j,
			unsigned install, struct kvpb_result *r)
{
	struct kvp_region_opts ro = {
		.name = "kvpbench-install",
		.size = j->len,
		.block_bytes = j->block,
		.store = s,
		.flags = KVP_REGION_FROM_STORE,
	};
	struct kvp_pager *p = NULL;
	struct kvp_region *reg = NULL;
	int err;

	/* No readahead: one fault, one install. */
	err = pager_open(c, budget, install, 0, false, &p);
	if (err)
		return err;
	err = kvp_region_create(p, &ro, &reg);
	if (err) {
		fprintf(stderr, "kvpbench: install: region: %s\n",
			kvp_strerror(err));
		goto out;
	}
	err =
	    kvpb_run_threads(c, j, pager_worker, kvp_region_addr(reg), NULL, r);
	fill_stats(reg, r);
	kvp_region_destroy(reg);
out:
	kvp_pager_close(p);
	return err;
}

/*
 * install: what one install costs, MOVE against COPY, per block size.  The
 * store is memory (no disk in the way), the region twice the budget so that
 * the second half also pays eviction (a MOVE back, or a zap), as a pager in
 * steady state does.  Modes interleave per round; the median is kept.
 */
int kvpb_install(struct kvpb_ctx *c)
{
	static const uint64_t sizes[] = { 4u << 10,   16u << 10, 64u << 10,
					  256u << 10, 1u << 20,	 2u << 20 };
	static const struct {
		unsigned install;
		const char *name;
	} modes[] = { { KVP_INSTALL_MOVE, "kvpager-move" },
		      { KVP_INSTALL_COPY, "kvpager-copy" } };
	static struct kvpb_result runs[2][KVPB_MAX_REPEAT];
	uint64_t budget = c->opts.short_run ? (64u << 20) : (256u << 20);
	uint64_t len = 2 * budget, off;
	unsigned k, m, n, round, nruns[2];
	struct kvp_store *s = NULL;
	void *buf = NULL;
	int err;

	err = kvp_store_memory_create(len, &s);
	if (err) {
		fprintf(stderr, "kvpbench: install: memory store: %s\n",
			kvp_strerror(err));
		return err;
	}
	buf = malloc(8u << 20);
	if (!buf) {
		err = -ENOMEM;
		goto out;
	}
	kvpb_progress(c, "install: filling a %llu MiB memory store",
		      (unsigned long long)(len >> 20));
	for (off = 0; off < len; off += 8u << 20) {
		kvpb_fill(buf, off, 8u << 20);
		err = kvp_store_pwrite(s, buf, 8u << 20, off);
		if (err) {
			fprintf(stderr, "kvpbench: install: store write: %s\n",
				kvp_strerror(err));
			goto out;
		}
	}
	for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct kvpb_job j = {
			.scenario = "install",
			.off = 0,
			.len = len,
			.block = sizes[k],
			.threads = 1,
			.depth = 1,
			.reads = len / sizes[k],
			.group = c->next_group++,
		};

		nruns[0] = nruns[1] = 0;
		for (round = 0; round < c->opts.repeat; round++) {
			for (m = 0; m < 2; m++) {
				struct kvpb_result *r = &runs[m][nruns[m]];

				kvpb_result_init(r, &j, modes[m].name);
				kvpb_progress(
				    c,
				    "install %s: %llu KiB blocks "
				    "(run %u/%u)",
				    modes[m].name,
				    (unsigned long long)(sizes[k] >> 10),
				    round + 1, c->opts.repeat);
				if (install_once(c, s, budget, &j,
						 modes[m].install, r)) {
					c->failures++;
					continue;
				}
				if (r->bad) {
					fprintf(stderr,
						"kvpbench: install %s: %llu "
						"pattern mismatches: the data "
						"read is wrong\n",
						modes[m].name,
						(unsigned long long)r->bad);
					c->failures++;
				}
				nruns[m]++;
			}
		}
		for (m = 0; m < 2; m++) {
			struct kvpb_result *r;

			n = nruns[m];
			if (!n)
				continue;
			qsort(runs[m], n, sizeof(runs[m][0]), kvpb_cmp_gbps);
			r = kvpb_result_new(c, &j, modes[m].name);
			if (!r)
				goto out;
			*r = runs[m][n / 2];
			r->runs = n;
			r->gb_per_s_min = runs[m][0].gb_per_s;
			r->gb_per_s_max = runs[m][n - 1].gb_per_s;
		}
	}
out:
	free(buf);
	kvp_store_destroy(s);
	return err;
}
