/*
 * kvpsoak - a long data-integrity run of the pager, for races too rare
 * for the unit tests.
 *
 *   kvpsoak [--seconds S] [--mode auto|move|copy] [--service-threads N]
 *           [--churn]
 *
 * Over and over until S seconds have passed (default 300): a memory store
 * of 32 MiB holding a pattern, a pager with an 8 MiB budget, a 64 KiB
 * region with 1 MiB readahead, and 8 threads.  Each thread owns every
 * eighth block; in each of 4 passes (odd passes walk backwards) it checks
 * every word of its blocks against the pattern the last pass wrote, then
 * rewrites them with the next, so that every block is evicted dirty and
 * reloaded again and again under two service threads by default.
 *
 * The first bad block ends the run: it prints the pass, the block, how
 * many words are wrong, how many are zero and how many still hold the
 * pattern before (a lost write), and the block's state, and exits 1.
 * Exits 0 after S seconds with no bad word, 2 on a setup error or a
 * command line refused (an unknown option, a bad value, an operand).
 *
 * --churn runs the program's other calls against the pager instead, in
 * rounds of CHURN_SECONDS: a copy-mode and a move-mode region four times
 * the budget (64 KiB blocks and 2 MiB ones, round by round), three
 * writers and a sweeper rewriting words at random, a dropper
 * (MADV_DONTNEED of one page, which must read zeros at once) and a
 * flipper that keeps up to 8 single pages mlocked or read-only (splitting
 * the mappings under the pager's moves and zaps).  Every word is kept in
 * a shadow; at the end of a round the regions are checked, flushed and
 * checked again, destroyed, and their stores checked.  The first round
 * with a bad word prints its runs of bad pages and exits 1.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"
#include "pager/pager.h"
#include "pager/store.h"

#define NTHREADS 8
#define PASSES 4
#define BLOCK (64u << 10)
#define SIZE (32u << 20)
#define MAX_SECONDS (366u * 86400) /* --seconds: a year at most */

static struct kvp_region *region;
static pthread_barrier_t start;
static atomic_bool failed;

static uint64_t seed_of(int pass)
{
	return 0x1111111111111111ull * (uint64_t)(pass % 15 + 1);
}

static uint64_t word(uint64_t seed, uint64_t off)
{
	return (off * 0x9E3779B97F4A7C15ull) ^ seed;
}

/* Check one block against @pass's pattern; on a bad word, report. */
static bool check_block(const volatile uint64_t *w, uint64_t blk, int pass)
{
	uint64_t seed = seed_of(pass), before = seed_of(pass - 1);
	size_t wrong = 0, zero = 0, stale = 0;
	struct kvp_block_info bi;

	for (size_t i = 0; i < BLOCK / 8; i++) {
		uint64_t v = w[i], off = blk * BLOCK + i * 8;

		if (v == word(seed, off))
			continue;
		wrong++;
		zero += v == 0;
		stale += pass > 0 && v == word(before, off);
	}
	if (!wrong)
		return true;
	memset(&bi, 0, sizeof(bi));
	(void)kvp_region_block_info(region, blk, &bi);
	fprintf(stderr,
		"kvpsoak: BAD pass %d block %llu: %zu of %u words wrong, %zu "
		"zero, %zu from the pass before; block %s, dirty %d, in "
		"store %d\n",
		pass, (unsigned long long)blk, wrong, BLOCK / 8, zero, stale,
		kvp_block_state_name(bi.state), bi.dirty, bi.in_store);
	return false;
}

static void *worker(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg, n = SIZE / BLOCK / NTHREADS;
	char *base = kvp_region_addr(region);

	pthread_barrier_wait(&start);
	for (int pass = 0; pass < PASSES && !atomic_load(&failed); pass++) {
		for (unsigned k = 0; k < n && !atomic_load(&failed); k++) {
			uint64_t blk =
			    (uint64_t)((pass & 1) ? n - 1 - k : k) * NTHREADS +
			    id;
			volatile uint64_t *w = (void *)(base + blk * BLOCK);

			if (!check_block(w, blk, pass)) {
				atomic_store(&failed, true);
				break;
			}
			for (size_t i = 0; i < BLOCK / 8; i++)
				w[i] = word(seed_of(pass + 1),
					    blk * BLOCK + i * 8);
		}
	}
	return NULL;
}

/* One round: a fresh store, pager and region.  0, 1 (bad data) or 2. */
static int round_once(unsigned install, unsigned service_threads)
{
	struct kvp_region_opts ro = { .size = SIZE,
				      .block_bytes = BLOCK,
				      .flags = KVP_REGION_FROM_STORE };
	pthread_t t[NTHREADS];
	struct kvp_store *store;
	struct kvp_pager *pager;
	struct kvp_config cfg;
	uint64_t *buf;
	int err;

	err = kvp_store_memory_create(SIZE, &store);
	if (err) {
		fprintf(stderr, "kvpsoak: memory store: %s\n",
			kvp_strerror(err));
		return 2;
	}
	buf = malloc(SIZE);
	if (!buf) {
		kvp_store_destroy(store);
		fprintf(stderr, "kvpsoak: out of memory\n");
		return 2;
	}
	for (size_t i = 0; i < SIZE / 8; i++)
		buf[i] = word(seed_of(0), i * 8);
	err = kvp_store_pwrite(store, buf, SIZE, 0);
	free(buf);
	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = 8u << 20;
	cfg.install_mode = install;
	cfg.readahead_bytes = 1u << 20;
	cfg.service_threads = service_threads;
	if (!err)
		err = kvp_pager_open(&cfg, &pager);
	if (err) {
		kvp_store_destroy(store);
		fprintf(stderr, "kvpsoak: pager: %s\n", kvp_strerror(err));
		return 2;
	}
	ro.store = store;
	err = kvp_region_create(pager, &ro, &region);
	if (err) {
		kvp_pager_close(pager);
		kvp_store_destroy(store);
		fprintf(stderr, "kvpsoak: region: %s\n", kvp_strerror(err));
		return 2;
	}
	pthread_barrier_init(&start, NULL, NTHREADS);
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&start);
	if (!atomic_load(&failed)) {
		kvp_region_destroy(region);
		kvp_pager_close(pager);
		kvp_store_destroy(store);
	}
	return atomic_load(&failed) ? 1 : 0;
}

/* --churn: one region of a round, its shadow and its page locks. */
#define CHURN_SECONDS 5
#define CHURN_HELD 8
#define PG 4096u
#define WPP (PG / 8)

struct churn_reg {
	struct kvp_region *r;
	struct kvp_store *store;
	uint64_t *a, *shadow;
	size_t npages;
	pthread_mutex_t *lk; /* per page: its words and shadow agree */
	unsigned char *ro;   /* per page: read-only now */
};

static struct churn_reg churn[2];
static atomic_bool churn_stop;
static atomic_ulong churn_bad_drops;

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void *churn_writer(void *arg)
{
	uint64_t x = (uintptr_t)arg * 2654435761u + 1;

	while (!atomic_load(&churn_stop)) {
		struct churn_reg *g = &churn[rnd(&x) % 2];
		size_t pg = rnd(&x) % g->npages;

		pthread_mutex_lock(&g->lk[pg]);
		for (int k = 0; k < 4 && !g->ro[pg]; k++) {
			size_t w = pg * WPP + rnd(&x) % WPP;

			g->a[w] = g->shadow[w] = rnd(&x) | 1;
		}
		pthread_mutex_unlock(&g->lk[pg]);
	}
	return NULL;
}

/* One word of every page in turn: every block comes back in. */
static void *churn_sweeper(void *arg)
{
	uint64_t x = (uintptr_t)arg * 77 + 3;

	while (!atomic_load(&churn_stop))
		for (int i = 0; i < 2; i++)
			for (size_t pg = 0; pg < churn[i].npages &&
					    !atomic_load(&churn_stop);
			     pg++) {
				struct churn_reg *g = &churn[i];
				size_t w = pg * WPP + rnd(&x) % WPP;

				pthread_mutex_lock(&g->lk[pg]);
				if (!g->ro[pg])
					g->a[w] = g->shadow[w] = rnd(&x) | 1;
				pthread_mutex_unlock(&g->lk[pg]);
			}
	return NULL;
}

static void *churn_dropper(void *arg)
{
	uint64_t x = (uintptr_t)arg * 131 + 11;

	while (!atomic_load(&churn_stop)) {
		struct churn_reg *g = &churn[rnd(&x) % 2];
		size_t pg = rnd(&x) % g->npages;
		struct timespec ts = { 0, (long)(1 + rnd(&x) % 3) * 1000000 };

		pthread_mutex_lock(&g->lk[pg]);
		/* EINVAL: a page the flipper mlocked */
		if (!g->ro[pg] &&
		    madvise((char *)g->a + pg * PG, PG, MADV_DONTNEED) == 0) {
			memset(&g->shadow[pg * WPP], 0, PG);
			if (g->a[pg * WPP + rnd(&x) % WPP] != 0)
				atomic_fetch_add(&churn_bad_drops, 1);
		}
		pthread_mutex_unlock(&g->lk[pg]);
		nanosleep(&ts, NULL);
	}
	return NULL;
}

struct churn_held {
	struct churn_reg *g;
	size_t pg;
	bool locked; /* mlocked, else read-only */
};

static void churn_release(struct churn_held *h)
{
	char *addr = (char *)h->g->a + h->pg * PG;

	pthread_mutex_lock(&h->g->lk[h->pg]);
	if (h->locked) {
		(void)syscall(SYS_munlock, addr, PG);
	} else if (mprotect(addr, PG, PROT_READ | PROT_WRITE) == 0) {
		h->g->ro[h->pg] = 0;
	} else {
		fprintf(stderr, "kvpsoak: mprotect: %s\n", strerror(errno));
		exit(2);
	}
	pthread_mutex_unlock(&h->g->lk[h->pg]);
}

static void *churn_flipper(void *arg)
{
	uint64_t x = (uintptr_t)arg * 31 + 7;
	struct churn_held h[CHURN_HELD];
	int n = 0;

	while (!atomic_load(&churn_stop)) {
		struct churn_held c = { &churn[rnd(&x) % 2], 0, rnd(&x) % 2 };
		struct timespec ts = { 0, (long)(1 + rnd(&x) % 4) * 1000000 };
		char *addr;
		int rc;

		if (n == CHURN_HELD) {
			int i = (int)(rnd(&x) % CHURN_HELD);

			churn_release(&h[i]);
			h[i] = h[--n];
		}
		c.pg = rnd(&x) % c.g->npages;
		addr = (char *)c.g->a + c.pg * PG;
		rc = 0;
		for (int i = 0; i < n; i++) /* one hold a page */
			if (h[i].g == c.g && h[i].pg == c.pg)
				rc = -1;
		pthread_mutex_lock(&c.g->lk[c.pg]);
		if (rc) {
			/* held already */
		} else if (c.locked) {
			/* the system call: a sanitizer's mlock does nothing */
			rc = (int)syscall(SYS_mlock, addr, PG);
		} else {
			rc = mprotect(addr, PG, PROT_READ);
			if (!rc)
				c.g->ro[c.pg] = 1;
		}
		pthread_mutex_unlock(&c.g->lk[c.pg]);
		if (!rc)
			h[n++] = c;
		nanosleep(&ts, NULL);
	}
	while (n)
		churn_release(&h[--n]);
	return NULL;
}

/* Print the runs of pages of @g whose words differ from @got (the region,
 * or its store read back); the number of bad words. */
static size_t churn_check(const char *what, struct churn_reg *g,
			  const uint64_t *got, size_t block)
{
	size_t bad = 0, run = 0, first = 0;

	for (size_t pg = 0; pg <= g->npages; pg++) {
		size_t wrong = 0;

		for (size_t w = pg * WPP; pg < g->npages && w < (pg + 1) * WPP;
		     w++)
			wrong += got[w] != g->shadow[w];
		bad += wrong;
		if (wrong && !run++)
			first = pg;
		if (!wrong && run) {
			fprintf(stderr,
				"kvpsoak: BAD %s: pages %zu-%zu (block %zu, "
				"its pages %zu-%zu)\n",
				what, first, pg - 1, first * PG / block,
				first % (block / PG), (pg - 1) % (block / PG));
			run = 0;
		}
	}
	return bad;
}

/* One --churn round of @block-byte blocks.  0, 1 (bad data) or 2. */
static int churn_round(size_t block, unsigned service_threads)
{
	size_t budget = block >= (2u << 20) ? 16u << 20 : 4u << 20;
	size_t size = 4 * budget, bad = 0;
	struct timespec ts = { CHURN_SECONDS, 0 };
	pthread_t t[6];
	struct kvp_pager *pager;
	struct kvp_config cfg;
	const char *why = NULL;
	int err;

	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = budget;
	cfg.service_threads = service_threads;
	err = kvp_pager_open(&cfg, &pager);
	if (err) {
		fprintf(stderr, "kvpsoak: pager: %s\n", kvp_strerror(err));
		return 2;
	}
	for (int i = 0; i < 2 && !err; i++) {
		struct churn_reg *g = &churn[i];
		struct kvp_region_opts ro = { .name = i ? "move" : "copy",
					      .size = size,
					      .block_bytes = block,
					      .flags = KVP_REGION_FROM_STORE };

		memset(g, 0, sizeof(*g));
		cfg.install_mode = i ? KVP_INSTALL_MOVE : KVP_INSTALL_COPY;
		err = kvp_pager_reconfigure(pager, &cfg, &why);
		if (!err)
			err = kvp_store_memory_create(size, &g->store);
		g->shadow = err ? NULL : malloc(size);
		g->npages = size / PG;
		g->lk = err ? NULL : calloc(g->npages, sizeof(*g->lk));
		g->ro = err ? NULL : calloc(g->npages, 1);
		if (!err && (!g->shadow || !g->lk || !g->ro))
			err = -ENOMEM;
		for (size_t w = 0; !err && w < size / 8; w++)
			g->shadow[w] = word(seed_of(i), w * 8);
		if (!err)
			err = kvp_store_pwrite(g->store, g->shadow, size, 0);
		ro.store = g->store;
		if (!err)
			err = kvp_region_create(pager, &ro, &g->r);
		for (size_t k = 0; !err && k < g->npages; k++)
			pthread_mutex_init(&g->lk[k], NULL);
		if (!err)
			g->a = kvp_region_addr(g->r);
	}
	if (err) {
		fprintf(stderr, "kvpsoak: churn set-up: %s\n",
			kvp_strerror(err));
		return 2;
	}
	atomic_store(&churn_stop, false);
	atomic_store(&churn_bad_drops, 0);
	for (uintptr_t i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, churn_writer, (void *)(i + 1));
	pthread_create(&t[3], NULL, churn_sweeper, (void *)1);
	pthread_create(&t[4], NULL, churn_dropper, (void *)1);
	pthread_create(&t[5], NULL, churn_flipper, (void *)1);
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	atomic_store(&churn_stop, true);
	for (int i = 0; i < 6; i++)
		pthread_join(t[i], NULL);
	if (atomic_load(&churn_bad_drops))
		fprintf(stderr,
			"kvpsoak: BAD: %lu pages read other than zeros right "
			"after their MADV_DONTNEED\n",
			atomic_load(&churn_bad_drops));
	bad += atomic_load(&churn_bad_drops);
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < 2; i++) {
			bad += churn_check(i ? "move region" : "copy region",
					   &churn[i], churn[i].a, block);
			if (!pass && (err = kvp_region_flush(churn[i].r))) {
				fprintf(stderr, "kvpsoak: flush: %s\n",
					kvp_strerror(err));
				bad++;
			}
		}
	for (int i = 0; i < 2; i++) {
		struct churn_reg *g = &churn[i];
		uint64_t *back = malloc(size);

		err = kvp_region_destroy(g->r);
		if (!err && back)
			err = kvp_store_pread(g->store, back, size, 0);
		if (err || !back) {
			fprintf(stderr, "kvpsoak: destroy and read back: %s\n",
				back ? kvp_strerror(err) : "out of memory");
			bad++;
		} else {
			bad += churn_check(i ? "move store" : "copy store", g,
					   back, block);
		}
		free(back);
		kvp_store_destroy(g->store);
		for (size_t k = 0; k < g->npages; k++)
			pthread_mutex_destroy(&g->lk[k]);
		free(g->lk);
		free(g->ro);
		free(g->shadow);
	}
	kvp_pager_close(pager);
	return bad ? 1 : 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvpsoak [--seconds S] [--mode auto|move|copy] "
		   "[--service-threads N] [--churn]\n");
}

/*
 * @text as the value of option @opt: of the pager tunable @name (its
 * range and words) or, @name NULL, seconds.  The message names @opt.
 */
static bool parse_opt(const char *opt, const char *name, const char *text,
		      uint64_t *out)
{
	struct kvp_tunable t = { .type = KVP_T_UINT,
				 .min = 1,
				 .max = MAX_SECONDS };
	char msg[KVP_TUNABLE_ERR_MAX];

	if (name)
		t = *kvp_tunable_find(name);
	t.name = opt;
	if (kvp_tunable_parse(&t, text, out, msg, sizeof(msg)) == 0)
		return true;
	fprintf(stderr, "kvpsoak: %s\n", msg);
	return false;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seconds", required_argument, NULL, 's' },
		{ "mode", required_argument, NULL, 'm' },
		{ "service-threads", required_argument, NULL, 't' },
		{ "churn", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	uint64_t install = KVP_INSTALL_MOVE, svc = 2, seconds = 300;
	long rounds = 0;
	bool churn_mode = false;
	time_t end;
	int c, rc = 0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!parse_opt("--seconds", NULL, optarg, &seconds))
				return 2;
			break;
		case 'm':
			if (!parse_opt("--mode", "install_mode", optarg,
				       &install))
				return 2;
			break;
		case 't':
			if (!parse_opt("--service-threads", "service_threads",
				       optarg, &svc))
				return 2;
			break;
		case 'c':
			churn_mode = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) { /* --churn x ran, x ignored, before */
		fprintf(stderr,
			"kvpsoak: unexpected argument '%s' (--churn takes "
			"no value)\n",
			argv[optind]);
		usage(stderr);
		return 2;
	}
	end = time(NULL) + (time_t)seconds;
	while (!rc && time(NULL) < end) {
		rc = churn_mode ? churn_round(rounds % 2 ? 2u << 20 : 64u << 10,
					      (unsigned)svc)
				: round_once((unsigned)install, (unsigned)svc);
		rounds++;
		if (!rc && rounds % (churn_mode ? 10 : 50) == 0)
			fprintf(stderr, "kvpsoak: %ld rounds, no bad word\n",
				rounds);
	}
	printf("kvpsoak: %ld rounds, %s\n", rounds,
	       rc == 1 ? "BAD DATA" : rc ? "setup error" : "no bad word");
	return rc;
}
