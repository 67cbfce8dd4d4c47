/*
 * kvpsoak - a long data-integrity run of the pager, for races too rare
 * for the unit tests.
 *
 *   kvpsoak [--seconds S] [--mode auto|move|copy] [--service-threads N]
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
 * Exits 0 after S seconds with no bad word, 2 on a setup error.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static void usage(FILE *f)
{
	fprintf(f, "usage: kvpsoak [--seconds S] [--mode auto|move|copy] "
		   "[--service-threads N]\n");
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
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	uint64_t install = KVP_INSTALL_MOVE, svc = 2, seconds = 300;
	long rounds = 0;
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
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	end = time(NULL) + (time_t)seconds;
	while (!rc && time(NULL) < end) {
		rc = round_once((unsigned)install, (unsigned)svc);
		rounds++;
		if (!rc && rounds % 50 == 0)
			fprintf(stderr, "kvpsoak: %ld rounds, no bad word\n",
				rounds);
	}
	printf("kvpsoak: %ld rounds, %s\n", rounds,
	       rc == 1 ? "BAD DATA" : rc ? "setup error" : "no bad word");
	return rc;
}
