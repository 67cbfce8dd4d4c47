/*
 * test_pager.c - the paging engine (pager/): regions served by userfaultfd
 * from stores under a RAM budget.
 *
 * Every test opens its own pager inside the forked child Check runs it in
 * (a userfaultfd registration and its service threads do not survive
 * fork); the checked fixture resets the handles and the teardown closes
 * whatever a failed test left open.  Budgets are small (2-16 MiB) and
 * regions several times larger, so that eviction runs all the time on a
 * 2-core machine.  Data is a pattern of 64-bit words, a function of a seed
 * and the byte offset, checked word by word.
 *
 * The binary exits 77 when kvp_pager_open says userfaultfd is not allowed
 * (-EPERM) or lacks what the engine needs (-EOPNOTSUPP).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "pager/pager.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define PG  (4 * KIB)

#define SEED_A 0x1111111111111111ull
#define SEED_B 0x2222222222222222ull

static struct kvp_pager *P;
static struct kvp_region *R;
static struct kvp_store *S;  /* what regions use */
static struct kvp_store *S0; /* the inner store under a faulty one */

static void fx_setup(void)
{
	P = NULL;
	R = NULL;
	S = S0 = NULL;
}

static void fx_teardown(void)
{
	if (R)
		kvp_region_destroy(R);
	kvp_pager_close(P);
	if (S && S != S0)
		kvp_store_destroy(S);
	if (S0)
		kvp_store_destroy(S0);
	P = NULL;
	R = NULL;
	S = S0 = NULL;
}

/* ------------------------------------------------------------------ */
/* helpers */

static inline uint64_t pat(uint64_t seed, uint64_t off)
{
	return (off * 0x9E3779B97F4A7C15ull) ^ seed;
}

static void fill_words(void *buf, size_t len, uint64_t seed, uint64_t base)
{
	uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		w[i] = pat(seed, base + i * 8);
}

/* Offset of the first word of @buf that differs from the pattern, or -1. */
static int64_t check_words(const void *buf, size_t len, uint64_t seed,
			   uint64_t base)
{
	const volatile uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i] != pat(seed, base + i * 8))
			return (int64_t)(i * 8);
	return -1;
}

static bool is_zero(const void *buf, size_t len)
{
	const volatile uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i])
			return false;
	return true;
}

static void *xalloc(size_t len)
{
	void *p = NULL;

	ck_assert_int_eq(posix_memalign(&p, 4096, len), 0);
	return p;
}

/* Write the pattern over the store range [off, off+len). */
static void store_fill(struct kvp_store *s, uint64_t off, size_t len,
		       uint64_t seed)
{
	size_t chunk = 1 * MIB;
	char *buf = xalloc(chunk);

	for (size_t at = 0; at < len; at += chunk) {
		size_t n = len - at < chunk ? len - at : chunk;

		fill_words(buf, n, seed, off + at);
		ck_assert_int_eq(kvp_store_pwrite(s, buf, n, off + at), 0);
	}
	free(buf);
}

/* Offset of the first store word in [off, off+len) off the pattern, or -1. */
static int64_t store_check(struct kvp_store *s, uint64_t off, size_t len,
			   uint64_t seed)
{
	size_t chunk = 1 * MIB;
	char *buf = xalloc(chunk);
	int64_t bad = -1;

	for (size_t at = 0; at < len && bad < 0; at += chunk) {
		size_t n = len - at < chunk ? len - at : chunk;
		int64_t b;

		ck_assert_int_eq(kvp_store_pread(s, buf, n, off + at), 0);
		b = check_words(buf, n, seed, off + at);
		if (b >= 0)
			bad = (int64_t)at + b;
	}
	free(buf);
	return bad;
}

enum store_kind { ST_MEM, ST_FILE };

static void make_store(enum store_kind k, uint64_t size)
{
	if (k == ST_MEM)
		ck_assert_int_eq(kvp_store_memory_create(size, &S), 0);
	else
		ck_assert_int_eq(kvp_store_file_temp("/var/tmp", size, &S), 0);
}

/* Memory store under a faulty store: S is the faulty one, S0 the inner. */
static void make_faulty_store(uint64_t size)
{
	ck_assert_int_eq(kvp_store_memory_create(size, &S0), 0);
	ck_assert_int_eq(kvp_store_faulty_create(S0, &S), 0);
}

struct popts {
	uint64_t budget;
	unsigned mode; /* KVP_INSTALL_* */
	uint64_t readahead;
	unsigned threads;
	bool exact_budget; /* watermarks 100/99: evict on demand only */
	bool no_prefault;  /* pool_prefault_bytes 0: every frame fresh */
};

static void open_pager(const struct popts *o)
{
	struct kvp_config c;

	kvp_config_defaults(&c);
	c.ram_budget_bytes = o->budget;
	c.install_mode = o->mode;
	c.readahead_bytes = o->readahead;
	if (o->threads)
		c.service_threads = o->threads;
	if (o->no_prefault)
		c.pool_prefault_bytes = 0;
	if (o->exact_budget) {
		c.evict_high_watermark_percent = 100;
		c.evict_low_watermark_percent = 99;
	}
	ck_assert_int_eq(kvp_pager_open(&c, &P), 0);
}

static struct kvp_region *make_region(size_t size, size_t bs, unsigned flags)
{
	struct kvp_region_opts o = { .size = size,
				     .block_bytes = bs,
				     .store = S,
				     .store_offset = 0,
				     .flags = flags };
	struct kvp_region *r = NULL;

	ck_assert_int_eq(kvp_region_create(P, &o, &r), 0);
	ck_assert_ptr_nonnull(r);
	return r;
}

static struct kvp_stats pstats(void)
{
	struct kvp_stats s;

	kvp_pager_stats(P, &s);
	return s;
}

static struct kvp_stats rstats(struct kvp_region *r)
{
	struct kvp_stats s;

	kvp_region_stats(r, &s);
	return s;
}

/* Wait until background eviction has settled: the region's residency and
 * eviction counts unchanged over a few samples 20 ms apart. */
static void settle(struct kvp_region *r)
{
	struct kvp_stats a = rstats(r), b;
	int same = 0;

	for (int i = 0; i < 250 && same < 3; i++) {
		usleep(20000);
		b = rstats(r);
		if (b.resident_bytes == a.resident_bytes &&
		    b.evictions_clean_total == a.evictions_clean_total &&
		    b.evictions_dirty_total == a.evictions_dirty_total)
			same++;
		else
			same = 0;
		a = b;
	}
}

/*
 * A block's info once it is out of transit.  The engine wakes a faulting
 * thread before it marks the block RESIDENT (install, then the state under
 * the lock), so right after an access the block may still read LOADING
 * for a moment; no test asks about a block it expects in transit.
 */
static struct kvp_block_info binfo(struct kvp_region *r, uint64_t blk)
{
	struct kvp_block_info bi;

	for (int k = 0; k < 5000; k++) {
		ck_assert_int_eq(kvp_region_block_info(r, blk, &bi), 0);
		if (bi.state != KVP_BLOCK_LOADING &&
		    bi.state != KVP_BLOCK_EVICTING)
			break;
		usleep(1000);
	}
	return bi;
}

/* removed_bytes_total once it reaches @want (munmap and madvise return
 * when a service thread has read the event, not handled it): up to 5 s. */
static uint64_t wait_removed(struct kvp_region *r, uint64_t want)
{
	uint64_t v = 0;

	for (int k = 0; k < 5000; k++) {
		struct kvp_stats s;

		kvp_region_stats(r, &s);
		v = s.removed_bytes_total;
		if (v >= want)
			break;
		usleep(1000);
	}
	return v;
}

/* Read one word per page of [off, off+len) of the region (faults it in). */
static uint64_t touch_read(struct kvp_region *r, size_t off, size_t len)
{
	volatile uint64_t *p = (volatile uint64_t *)kvp_region_addr(r);
	uint64_t sum = 0;

	for (size_t at = off; at < off + len; at += PG)
		sum += p[at / 8];
	return sum;
}

static void check_region(struct kvp_region *r, size_t off, size_t len,
			 uint64_t seed)
{
	int64_t bad =
	    check_words((char *)kvp_region_addr(r) + off, len, seed, off);

	ck_assert_msg(bad < 0, "region word at %lld differs (seed %llx)",
		      (long long)(off + (size_t)bad), (unsigned long long)seed);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Evict everything that can be: COLD on all, then stream a second region
 * of the budget's size over it.  (Used where the test must see blocks go.) */
static void push_out(struct kvp_region *r, uint64_t budget)
{
	struct kvp_store *ms = NULL;
	struct kvp_region *x = NULL;
	struct kvp_region_opts o = { .size = budget,
				     .block_bytes = 64 * KIB,
				     .flags = 0 };
	uint64_t nb = kvp_region_size(r) / kvp_region_block_bytes(r);

	ck_assert_int_eq(kvp_region_advise(r, 0, nb, KVP_ADVICE_COLD), 0);
	ck_assert_int_eq(kvp_store_memory_create(budget, &ms), 0);
	o.store = ms;
	ck_assert_int_eq(kvp_region_create(P, &o, &x), 0);
	memset(kvp_region_addr(x), 0x5a, budget);
	ck_assert_int_eq(kvp_region_destroy(x), 0);
	kvp_store_destroy(ms); /* engine bug 1 (fixed) crashed here */
}

/* ------------------------------------------------------------------ */
/* data integrity: block size x install mode x store */

static const size_t block_sizes[] = { 4 * KIB, 16 * KIB, 64 * KIB, 1 * MIB,
				      2 * MIB };
#define NBS (sizeof(block_sizes) / sizeof(block_sizes[0]))

START_TEST(test_integrity)
{
	size_t bs = block_sizes[_i % NBS];
	unsigned mode = (_i / NBS) % 2 ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE;
	enum store_kind sk = _i / (2 * NBS) ? ST_FILE : ST_MEM;
	uint64_t budget = 8 * MIB;
	size_t size = 4 * budget;
	struct popts po = { .budget = budget,
			    .mode = mode,
			    .readahead = 2 * MIB };
	struct kvp_stats s;
	const char *only = getenv("KVP_TEST_ONLY");
	uint64_t t0 = now_ms();

	if (only && atoi(only) != _i)
		return; /* KVP_TEST_ONLY=<i>: run one combination */
	make_store(sk, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	ck_assert_str_eq(kvp_region_install_mode(R),
			 mode == KVP_INSTALL_MOVE ? "move" : "copy");
	ck_assert_uint_eq(kvp_region_block_bytes(R), bs);
	ck_assert_uint_eq(
	    (uintptr_t)kvp_region_addr(R) % (bs >= 2 * MIB ? 2 * MIB : bs), 0);

	/* Read everything: the store's pattern. */
	check_region(R, 0, size, SEED_A);
	printf("integrity %zu %s %s: read %llu ms\n", bs,
	       kvp_region_install_mode(R), sk == ST_FILE ? "file" : "memory",
	       (unsigned long long)(now_ms() - t0));
	/* Write a new pattern over everything (evicting as it goes). */
	fill_words(kvp_region_addr(R), size, SEED_B, 0);
	printf("integrity %zu: written %llu ms\n", bs,
	       (unsigned long long)(now_ms() - t0));
	/* Touch it all again (evicts the dirty tail), then check. */
	touch_read(R, 0, size);
	check_region(R, 0, size, SEED_B);
	printf("integrity %zu: checked %llu ms\n", bs,
	       (unsigned long long)(now_ms() - t0));

	s = rstats(R);
	ck_assert_uint_gt(s.evictions_dirty_total, 0);
	ck_assert_uint_ge(s.bytes_read_total, size);
	ck_assert_uint_gt(s.bytes_written_total, 0);
	ck_assert_uint_eq(s.read_errors_total, 0);
	ck_assert_uint_eq(s.write_errors_total, 0);
	ck_assert_uint_le(s.resident_bytes, budget);
	if (mode == KVP_INSTALL_MOVE) {
		ck_assert_uint_gt(s.installs_move_total, 0);
		ck_assert_uint_eq(s.installs_copy_total, 0);
	} else {
		ck_assert_uint_gt(s.installs_copy_total, 0);
		ck_assert_uint_eq(s.installs_move_total, 0);
	}

	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	int64_t bad = store_check(S, 0, size, SEED_B);

	ck_assert_msg(bad < 0, "store word at %lld is not the new data",
		      (long long)bad);
}
END_TEST

/* ------------------------------------------------------------------ */
/* many threads */

#define NTHREADS 8

struct thr {
	pthread_t t;
	unsigned id;
	pthread_barrier_t *bar;
	struct kvp_region *r;
	uint64_t nblocks;
	unsigned rounds;
	atomic_int *bad;
	size_t bad_off;
	char bad_what[160];
};

static void *same_block_main(void *arg)
{
	struct thr *t = arg;
	size_t bs = kvp_region_block_bytes(t->r);
	char *base = kvp_region_addr(t->r);

	for (unsigned k = 0; k < t->rounds; k++) {
		size_t off = k * bs + (t->id * PG) % bs + 8 * t->id;

		pthread_barrier_wait(t->bar);
		if (*(volatile uint64_t *)(base + off) != pat(SEED_A, off)) {
			atomic_fetch_add(t->bad, 1);
			t->bad_off = off;
		}
	}
	return NULL;
}

START_TEST(test_threads_same_block)
{
	size_t bs = 64 * KIB;
	unsigned rounds = 6;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .delay_us = 50000 };
	pthread_barrier_t bar;
	atomic_int bad = 0;
	struct thr th[NTHREADS];
	struct kvp_stats s;

	make_faulty_store(16 * bs);
	store_fill(S0, 0, 16 * bs, SEED_A);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(16 * bs, bs, KVP_REGION_FROM_STORE);
	pthread_barrier_init(&bar, NULL, NTHREADS);
	for (unsigned i = 0; i < NTHREADS; i++) {
		th[i] = (struct thr){ .id = i,
				      .bar = &bar,
				      .r = R,
				      .rounds = rounds,
				      .bad = &bad };
		ck_assert_int_eq(
		    pthread_create(&th[i].t, NULL, same_block_main, &th[i]), 0);
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i].t, NULL);
	pthread_barrier_destroy(&bar);
	ck_assert_int_eq(atomic_load(&bad), 0);
	s = rstats(R);
	/* Eight threads on one block at once: one load, one read each. */
	ck_assert_uint_gt(s.coalesced_faults_total, 0);
	ck_assert_uint_eq(s.demand_faults_total, rounds);
	ck_assert_uint_eq(s.bytes_read_total, rounds * bs);
	check_region(R, 0, 16 * bs, SEED_A);
}
END_TEST

/*
 * Say what a bad block holds instead of @seed's pattern: how many words
 * are wrong, and whether they hold the other seed (a lost or a stale
 * write), zeros, or something else.
 */
static void describe_bad(char *out, size_t n, const char *p, size_t bs,
			 uint64_t seed, uint64_t base, unsigned pass)
{
	const volatile uint64_t *w = (const void *)p;
	uint64_t other = seed == SEED_A ? SEED_B : SEED_A;
	size_t wrong = 0, as_other = 0, zero = 0, first = SIZE_MAX, last = 0;

	for (size_t i = 0; i < bs / 8; i++) {
		uint64_t v = w[i];

		if (v == pat(seed, base + i * 8))
			continue;
		wrong++;
		as_other += v == pat(other, base + i * 8);
		zero += v == 0;
		if (first == SIZE_MAX)
			first = i * 8;
		last = i * 8;
	}
	snprintf(out, n,
		 "pass %u: %zu words wrong in [%zu, %zu], %zu of the other "
		 "seed, %zu zero",
		 pass, wrong, first, last, as_other, zero);
}

static void *diff_blocks_main(void *arg)
{
	struct thr *t = arg;
	size_t bs = kvp_region_block_bytes(t->r);
	char *base = kvp_region_addr(t->r);
	uint64_t n = t->nblocks / NTHREADS; /* blocks of this thread */

	pthread_barrier_wait(t->bar);
	for (unsigned pass = 0; pass < 3; pass++) {
		uint64_t seed = pass == 0 ? SEED_A : SEED_B;

		for (uint64_t k = 0; k < n; k++) {
			/* The thread's own blocks (id, id + NTHREADS, ...),
			 * walked from the other end on odd passes. */
			uint64_t blk = ((pass & 1) ? n - 1 - k : k) * NTHREADS +
				       t->id;
			char *p = base + blk * bs;
			int64_t x = check_words(p, bs, seed, blk * bs);

			if (x >= 0) {
				atomic_fetch_add(t->bad, 1);
				t->bad_off = blk * bs + (size_t)x;
				describe_bad(t->bad_what, sizeof(t->bad_what),
					     p, bs, seed, blk * bs, pass);
			}
			if (pass == 0)
				fill_words(p, bs, SEED_B, blk * bs);
		}
	}
	return NULL;
}

START_TEST(test_threads_diff_blocks)
{
	size_t bs = 64 * KIB, size = 32 * MIB;
	struct popts po = { .budget = 8 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 1 * MIB,
			    .threads = 2 };
	pthread_barrier_t bar;
	atomic_int bad = 0;
	struct thr th[NTHREADS];
	struct kvp_stats st;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	pthread_barrier_init(&bar, NULL, NTHREADS);
	for (unsigned i = 0; i < NTHREADS; i++) {
		th[i] = (struct thr){ .id = i,
				      .bar = &bar,
				      .r = R,
				      .nblocks = size / bs,
				      .bad = &bad };
		ck_assert_int_eq(
		    pthread_create(&th[i].t, NULL, diff_blocks_main, &th[i]),
		    0);
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i].t, NULL);
	pthread_barrier_destroy(&bar);
	kvp_region_stats(R, &st);
	for (unsigned i = 0; i < NTHREADS; i++)
		ck_assert_msg(th[i].bad_off == 0,
			      "thread %u: word at %zu bad (%s; %lu zero fills, "
			      "%lu bytes removed, %lu zaps)",
			      i, th[i].bad_off, th[i].bad_what,
			      (unsigned long)st.zero_fills_total,
			      (unsigned long)st.removed_bytes_total,
			      (unsigned long)st.evictions_zap_total);
	ck_assert_int_eq(atomic_load(&bad), 0);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S, 0, size, SEED_B), -1);
}
END_TEST

/* ------------------------------------------------------------------ */
/* the budget */

static uint64_t vm_rss_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

struct sampler {
	pthread_t t;
	atomic_bool stop;
	uint64_t max_resident, max_rss, samples;
};

static void *sampler_main(void *arg)
{
	struct sampler *sm = arg;

	while (!atomic_load(&sm->stop)) {
		struct kvp_stats s;
		uint64_t rss;

		kvp_pager_stats(P, &s);
		rss = vm_rss_bytes();
		if (s.resident_bytes > sm->max_resident)
			sm->max_resident = s.resident_bytes;
		if (rss > sm->max_rss)
			sm->max_rss = rss;
		sm->samples++;
	}
	return NULL;
}

struct streamer {
	pthread_t t;
	struct kvp_region *r;
	unsigned passes;
};

static void *streamer_main(void *arg)
{
	struct streamer *st = arg;
	size_t size = kvp_region_size(st->r);
	volatile uint64_t *p = kvp_region_addr(st->r);

	for (unsigned pass = 0; pass < st->passes; pass++)
		for (size_t at = 0; at < size; at += PG) {
			if (pass == 1)
				p[at / 8] = at; /* one dirty pass */
			else
				(void)p[at / 8];
		}
	return NULL;
}

/*
 * Slack documented in frames.c: one block per service thread (a
 * UFFDIO_COPY install holds a block twice for a moment).  The allowance
 * for the process's own memory while the pager runs (service thread and
 * test thread stacks, malloc arenas of the new threads, io_uring rings,
 * block metadata, /proc reads) is stated here: 8 MiB.
 */
#define RSS_ALLOWANCE (8 * MIB)

START_TEST(test_budget)
{
	size_t bs = (_i % 2) ? 2 * MIB : 64 * KIB;
	unsigned mode = (_i / 2) ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE;
	uint64_t budget = 16 * MIB, size = 4 * budget, base_rss, slack;
	struct popts po = { .budget = budget,
			    .mode = mode,
			    .readahead = 4 * MIB,
			    .threads = 2 };
	struct sampler sm = { 0 };
	struct streamer st = { .passes = 3 };

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	base_rss = vm_rss_bytes();
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	st.r = R;
	ck_assert_int_eq(pthread_create(&sm.t, NULL, sampler_main, &sm), 0);
	ck_assert_int_eq(pthread_create(&st.t, NULL, streamer_main, &st), 0);
	pthread_join(st.t, NULL);
	atomic_store(&sm.stop, true);
	pthread_join(sm.t, NULL);

	slack = po.threads * bs;
	printf(
	    "budget %s bs %zu: max resident %llu, max rss over baseline "
	    "%lld (budget %llu + slack %llu + allowance %zu), %llu samples\n",
	    mode == KVP_INSTALL_MOVE ? "move" : "copy", bs,
	    (unsigned long long)sm.max_resident,
	    (long long)(sm.max_rss - base_rss), (unsigned long long)budget,
	    (unsigned long long)slack, RSS_ALLOWANCE,
	    (unsigned long long)sm.samples);
	ck_assert_uint_gt(sm.samples, 0);
	ck_assert_uint_gt(sm.max_resident, 0);
	ck_assert_uint_le(sm.max_resident, budget + slack);
	ck_assert_uint_gt(rstats(R).evictions_dirty_total, 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* The sanitizers' shadow memory grows VmRSS with every byte touched:
	 * only the pager's own accounting is checked in that build. */
	return;
#endif
	ck_assert_msg(sm.max_rss <= base_rss + budget + slack + RSS_ALLOWANCE,
		      "VmRSS %llu over a baseline of %llu: more than budget "
		      "%llu + slack %llu + allowance %zu",
		      (unsigned long long)sm.max_rss,
		      (unsigned long long)base_rss, (unsigned long long)budget,
		      (unsigned long long)slack, RSS_ALLOWANCE);
}
END_TEST

/*
 * The frame pool's arena is MADV_HUGEPAGE for 2 MiB blocks.  A fresh frame
 * of a small block must fault in its own pages only: a whole huge page
 * would be 2 MiB of RSS the budget does not see, and would fill the frames
 * carved after it, which eviction takes for empty.
 */
START_TEST(test_small_frames_not_huge)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = KVP_INSTALL_COPY,
			    .no_prefault = true };
	volatile uint64_t *p;
	uint64_t before, after;
	char thp[16];

	if (kvp_thp_mode(thp, sizeof(thp)) || strcmp(thp, "never") == 0) {
		printf("small_frames_not_huge: THP off, nothing to check\n");
		return;
	}
	make_store(ST_MEM, 4 * MIB);
	store_fill(S, 0, 4 * MIB, SEED_A);
	open_pager(&po);
	R = make_region(4 * MIB, 64 * KIB, KVP_REGION_FROM_STORE);
	p = kvp_region_addr(R);
	before = vm_rss_bytes();
	(void)p[0]; /* one frame read into, one block installed */
	after = vm_rss_bytes();
	ck_assert_uint_eq(rstats(R).demand_faults_total, 1);
	ck_assert_msg(after - before < 1 * MIB,
		      "one 64 KiB block grew VmRSS by %llu bytes",
		      (unsigned long long)(after - before));
}
END_TEST

/* ------------------------------------------------------------------ */
/* writes racing with eviction */

#define WTHREADS 4

struct writer {
	pthread_t t;
	unsigned id;
	struct kvp_region *r;
	unsigned rounds;
	size_t bad_at;
	uint64_t bad_val;
	bool bad;
};

/* Thread @id owns word @id of every page; it writes the round number there,
 * page by page over the whole region (4x the budget), reading each write
 * straight back. */
static void *writer_main(void *arg)
{
	struct writer *w = arg;
	size_t size = kvp_region_size(w->r);
	volatile uint64_t *p = kvp_region_addr(w->r);
	size_t start = (size / WTHREADS) * w->id;

	for (unsigned i = 1; i <= w->rounds; i++)
		for (size_t k = 0; k < size; k += PG) {
			size_t at = (start + k) % size;
			size_t word = at / 8 + w->id;

			p[word] = i;
			if (p[word] != i && !w->bad) {
				w->bad = true;
				w->bad_at = word * 8;
				w->bad_val = p[word];
			}
		}
	return NULL;
}

START_TEST(test_write_during_eviction)
{
	size_t bs = (_i % 2) ? 4 * KIB : 64 * KIB;
	unsigned mode = (_i / 2) ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE;
	uint64_t budget = 2 * MIB;
	size_t size = 4 * budget;
	unsigned rounds = 12;
	struct popts po = { .budget = budget, .mode = mode, .threads = 2 };
	struct writer w[WTHREADS];
	char *buf;
	unsigned lost = 0;
	size_t first_lost = 0;

	make_store(ST_MEM, size);
	open_pager(&po);
	R = make_region(size, bs, 0);
	for (unsigned i = 0; i < WTHREADS; i++) {
		w[i] = (struct writer){ .id = i, .r = R, .rounds = rounds };
		ck_assert_int_eq(
		    pthread_create(&w[i].t, NULL, writer_main, &w[i]), 0);
	}
	for (unsigned i = 0; i < WTHREADS; i++)
		pthread_join(w[i].t, NULL);
	for (unsigned i = 0; i < WTHREADS; i++)
		ck_assert_msg(!w[i].bad,
			      "thread %u read %llu right after writing at %zu",
			      i, (unsigned long long)w[i].bad_val, w[i].bad_at);
	ck_assert_uint_gt(rstats(R).evictions_dirty_total, 0);
	/* Every page's words hold the last round, through the region... */
	volatile uint64_t *p = kvp_region_addr(R);

	for (size_t at = 0; at < size; at += PG)
		for (unsigned t = 0; t < WTHREADS; t++)
			if (p[at / 8 + t] != rounds) {
				if (!lost++)
					first_lost = at + 8 * t;
			}
	ck_assert_msg(!lost, "%u writes lost (%s, bs %zu), first at %zu", lost,
		      kvp_region_install_mode(R), bs, first_lost);
	/* ... and through the store once destroyed. */
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	buf = xalloc(size);
	ck_assert_int_eq(kvp_store_pread(S, buf, size, 0), 0);
	for (size_t at = 0; at < size; at += PG)
		for (unsigned t = 0; t < WTHREADS; t++)
			ck_assert_uint_eq(((uint64_t *)(buf + at))[t], rounds);
	free(buf);
}
END_TEST

/*
 * Clean blocks of a copy-mode region leave by batched MADV_DONTNEED (the
 * zapper): read-only passes over a region four times the budget, each
 * evicting, must read the store's data back and write nothing.
 */
START_TEST(test_zap_clean_eviction)
{
	enum store_kind k = _i & 1 ? ST_FILE : ST_MEM;
	unsigned threads = _i & 2 ? 2 : 1, passes = _i & 2 ? 8 : 3;
	uint64_t budget = 4 * MIB;
	size_t size = 4 * budget, bs = 64 * KIB;
	struct popts po = { .budget = budget,
			    .mode = KVP_INSTALL_COPY,
			    .threads = threads };
	struct kvp_stats st;

	make_store(k, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	/* With two service threads, one may settle a zap while the other
	 * still holds its REMOVE: taken for the program's, it zeroes. */
	for (unsigned pass = 0; pass < passes; pass++)
		check_region(R, 0, size, SEED_A);
	st = rstats(R);
	ck_assert_uint_eq(st.zero_fills_total, 0);
	ck_assert_uint_ge(st.evictions_clean_total,
			  (passes - 1) * (size - budget) / bs);
	ck_assert_uint_gt(st.evictions_zap_total, st.evictions_clean_total / 2);
	ck_assert_uint_eq(st.evictions_dirty_total, 0);
	ck_assert_uint_eq(st.bytes_written_total, 0);
	ck_assert_uint_eq(st.removed_bytes_total, 0); /* ours are not counted */
	ck_assert_uint_le(st.resident_bytes, budget);
	ck_assert_int_eq(store_check(S, 0, size, SEED_A), -1);
}
END_TEST

/* Cpus_allowed_list of the thread whose status file is @path; false if
 * it is gone.  With @name, only if the thread is named so. */
static bool status_cpus(const char *path, const char *name, char *out,
			size_t len)
{
	char line[256];
	bool named = !name, found = false;
	FILE *f = fopen(path, "r");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		char *v = strchr(line, ':');

		if (!v)
			continue;
		*v++ = 0;
		v += strspn(v, " \t");
		v[strcspn(v, "\n")] = 0;
		if (!strcmp(line, "Name"))
			named = !name || !strcmp(v, name);
		else if (named && !strcmp(line, "Cpus_allowed_list")) {
			snprintf(out, len, "%s", v);
			found = true;
		}
	}
	fclose(f);
	return found;
}

/* The CPUs this process's thread @name may run on. */
static bool thread_cpus(const char *name, char *out, size_t len)
{
	char path[320];
	bool found = false;
	DIR *d = opendir("/proc/self/task");

	ck_assert_ptr_nonnull(d);
	for (struct dirent *e; !found && (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status",
			 e->d_name);
		found = status_cpus(path, name, out, len);
	}
	closedir(d);
	return found;
}

/*
 * The zapper runs on the CPU of the service thread that reads its REMOVE
 * events (zap_follow_reader), and goes back to the process's CPUs when that
 * is turned off on the live pager.
 */
START_TEST(test_zap_follows_reader)
{
	uint64_t budget = 4 * MIB;
	size_t size = 4 * budget, bs = 64 * KIB;
	struct popts po = { .budget = budget, .mode = KVP_INSTALL_COPY };
	char own[256], zap[256];
	struct kvp_config c;

	ck_assert(status_cpus("/proc/thread-self/status", NULL, own,
			      sizeof(own)));
	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	check_region(R, 0, size, SEED_A);
	check_region(R, 0, size, SEED_A);
	ck_assert_uint_gt(rstats(R).evictions_zap_total, 0);
	ck_assert(thread_cpus("kvp-zap", zap, sizeof(zap)));
	/* One CPU: no range, no list. */
	ck_assert_msg(strpbrk(zap, ",-") == NULL,
		      "zapper on CPUs %s, not one (process: %s)", zap, own);

	kvp_pager_config(P, &c);
	c.zap_follow_reader = 0;
	ck_assert_int_eq(kvp_pager_reconfigure(P, &c, NULL), 0);
	check_region(R, 0, size, SEED_A);
	ck_assert(thread_cpus("kvp-zap", zap, sizeof(zap)));
	ck_assert_str_eq(zap, own);
}
END_TEST

/*
 * The program's MADV_DONTNEED racing the zapper's: a reader streams over
 * the region (evicting all the time), a dropper drops whole and half
 * blocks of the upper half, a writer writes a word per block of the lower
 * half (write-protect faults, whose ioctls the kernel refuses while a
 * REMOVE waits to be read).  Dropped pages read zeros, the rest the
 * store's pattern or the last write: a REMOVE taken for the wrong owner
 * shows as stale data or lost data, a refused ioctl as a hang.
 */
#define RACE_MS 1500

struct race {
	struct kvp_region *r;
	size_t size, bs;
	atomic_bool stop;
	uint8_t *dropped; /* per page of the upper half */
	uint64_t *written; /* per block of the lower half: last value */
	unsigned long drops, writes;
	atomic_size_t at; /* the reader's offset */
};

static void *race_reader(void *arg)
{
	struct race *x = arg;
	volatile uint64_t *p = kvp_region_addr(x->r);

	while (!atomic_load(&x->stop))
		for (size_t off = 0; off < x->size; off += PG) {
			(void)p[off / 8];
			atomic_store(&x->at, off);
		}
	return NULL;
}

static void *race_dropper(void *arg)
{
	struct race *x = arg;
	char *a = kvp_region_addr(x->r);
	size_t half = x->size / 2, nb = half / x->bs;
	unsigned seed = 12345;

	while (!atomic_load(&x->stop)) {
		/* Mostly the blocks the reader left a budget behind: the
		 * clock's next victims, often being zapped right now. */
		size_t behind = (atomic_load(&x->at) - half) / x->bs;
		size_t blk = rand_r(&seed) % 4 && behind < nb && behind > 40
				 ? behind - 28 - (size_t)rand_r(&seed) % 12
				 : (size_t)rand_r(&seed) % nb;
		size_t len = rand_r(&seed) % 2 ? x->bs : x->bs / 2;
		size_t off = half + blk * x->bs;

		ck_assert_int_eq(madvise(a + off, len, MADV_DONTNEED), 0);
		memset(x->dropped + (off - half) / PG, 1, len / PG);
		x->drops++;
		usleep(50);
	}
	return NULL;
}

static void *race_writer(void *arg)
{
	struct race *x = arg;
	volatile uint64_t *p = kvp_region_addr(x->r);
	size_t nb = x->size / 2 / x->bs;
	uint64_t v = 1;

	while (!atomic_load(&x->stop))
		for (size_t blk = 0; blk < nb; blk += 3, v++) {
			p[blk * x->bs / 8] = v;
			x->written[blk] = v;
			x->writes++;
		}
	return NULL;
}

START_TEST(test_zap_drop_race)
{
	uint64_t budget = 2 * MIB;
	struct race x = { .size = 8 * budget, .bs = 64 * KIB };
	struct popts po = { .budget = budget, .mode = KVP_INSTALL_COPY };
	pthread_t t[3];
	size_t half = x.size / 2;
	const char *base;

	make_store(ST_MEM, x.size);
	store_fill(S, 0, x.size, SEED_B);
	open_pager(&po);
	R = make_region(x.size, x.bs, KVP_REGION_FROM_STORE);
	x.r = R;
	x.dropped = calloc(half / PG, 1);
	x.written = calloc(half / x.bs, sizeof(uint64_t));
	ck_assert(x.dropped && x.written);
	ck_assert_int_eq(pthread_create(&t[0], NULL, race_reader, &x), 0);
	ck_assert_int_eq(pthread_create(&t[1], NULL, race_dropper, &x), 0);
	ck_assert_int_eq(pthread_create(&t[2], NULL, race_writer, &x), 0);
	usleep(RACE_MS * 1000);
	atomic_store(&x.stop, true);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	ck_assert_uint_gt(x.drops, 10);
	ck_assert_uint_gt(x.writes, 10);
	ck_assert_uint_gt(rstats(R).evictions_zap_total, 0);

	base = kvp_region_addr(R);
	for (size_t off = 0; off < half; off += PG) {
		size_t blk = off / x.bs;
		const uint64_t *w = (const uint64_t *)(base + off);

		if (off % x.bs == 0 && x.written[blk]) {
			ck_assert_msg(w[0] == x.written[blk],
				      "block %zu: write %llu lost (reads %llu)",
				      blk, (unsigned long long)x.written[blk],
				      (unsigned long long)w[0]);
			ck_assert_int_eq(check_words(w + 1, PG - 8, SEED_B,
						     off + 8),
					 -1);
		} else {
			check_region(R, off, PG, SEED_B);
		}
	}
	for (size_t off = half; off < x.size; off += PG) {
		if (x.dropped[(off - half) / PG])
			ck_assert_msg(is_zero(base + off, PG),
				      "page at %zu was dropped but reads data",
				      off);
		else
			check_region(R, off, PG, SEED_B);
	}
	free(x.dropped);
	free(x.written);
}
END_TEST

/* ------------------------------------------------------------------ */
/* REMOVE and UNMAP */

START_TEST(test_remove_whole_block)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;
	struct kvp_stats s0, s1;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	/* Block 3 resident (clean), block 4 resident and dirty. */
	check_region(R, 3 * bs, 2 * bs, SEED_A);
	fill_words(a + 4 * bs, bs, SEED_B, 4 * bs);
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_RESIDENT);
	ck_assert(binfo(R, 4).dirty);
	settle(R);
	s0 = rstats(R);
	ck_assert_int_eq(madvise(a + 3 * bs, 2 * bs, MADV_DONTNEED), 0);
	/* Block 7 never loaded: dropped whole too. */
	ck_assert_int_eq(madvise(a + 7 * bs, bs, MADV_DONTNEED), 0);
	ck_assert(is_zero(a + 3 * bs, 2 * bs));
	ck_assert(is_zero(a + 7 * bs, bs));
	s1 = rstats(R);
	ck_assert_uint_eq(s1.bytes_read_total, s0.bytes_read_total);
	ck_assert_uint_ge(wait_removed(R, s0.removed_bytes_total + 3 * bs),
			  s0.removed_bytes_total + 3 * bs);
	/* Still zeros after being pushed out and faulted in again. */
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 3).state, KVP_BLOCK_RESIDENT);
	ck_assert(is_zero(a + 3 * bs, 2 * bs));
	ck_assert(is_zero(a + 7 * bs, bs));
	ck_assert_uint_eq(rstats(R).bytes_read_total, s0.bytes_read_total);
	/* Neighbours untouched. */
	check_region(R, 2 * bs, bs, SEED_A);
	check_region(R, 5 * bs, 2 * bs, SEED_A);
	check_region(R, 8 * bs, bs, SEED_A);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	/* Nothing of the dropped blocks was written back as data. */
	char *buf = xalloc(bs);

	ck_assert_int_eq(kvp_store_pread(S, buf, bs, 4 * bs), 0);
	ck_assert_int_ne(check_words(buf, bs, SEED_B, 4 * bs), -1);
	free(buf);
}
END_TEST

START_TEST(test_remove_part_of_block)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	/* Resident block 2: drop its 4th and 5th pages. */
	check_region(R, 2 * bs, bs, SEED_A);
	ck_assert_int_eq(madvise(a + 2 * bs + 3 * PG, 2 * PG, MADV_DONTNEED),
			 0);
	ck_assert(is_zero(a + 2 * bs + 3 * PG, 2 * PG));
	check_region(R, 2 * bs, 3 * PG, SEED_A);
	check_region(R, 2 * bs + 5 * PG, bs - 5 * PG, SEED_A);
	/* Never-loaded block 9: drop its first page. */
	ck_assert_int_eq(madvise(a + 9 * bs, PG, MADV_DONTNEED), 0);
	ck_assert(is_zero(a + 9 * bs, PG));
	check_region(R, 9 * bs + PG, bs - PG, SEED_A);
	/* Both survive eviction and a reload. */
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 2).state, KVP_BLOCK_RESIDENT);
	ck_assert(is_zero(a + 2 * bs + 3 * PG, 2 * PG));
	check_region(R, 2 * bs, 3 * PG, SEED_A);
	check_region(R, 2 * bs + 5 * PG, bs - 5 * PG, SEED_A);
	ck_assert(is_zero(a + 9 * bs, PG));
	check_region(R, 9 * bs + PG, bs - PG, SEED_A);
}
END_TEST

/* Reads one block of the global region (the one at arg): needs a frame. */
static void *touch_block_main(void *arg)
{
	size_t off = (size_t)(uintptr_t)arg;

	touch_read(R, off, kvp_region_block_bytes(R));
	return NULL;
}

/*
 * Pages dropped while their dirty block is being written back: the
 * write-back already took the old bytes; they must not come back from the
 * store.  The write is held 300 ms so that the drop lands during it.
 */
START_TEST(test_remove_during_writeback)
{
	size_t bs = 64 * KIB, nb = 64;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .exact_budget = true };
	struct kvp_fault_plan plan = { .delay_us = 300000 };
	struct kvp_block_info bi;
	pthread_t t;
	char *a;
	int k;

	make_faulty_store(nb * bs);
	open_pager(&po);
	R = make_region(nb * bs, bs, 0);
	a = kvp_region_addr(R);
	/* Block 2 dirty, then the budget full (32 blocks, zero fills). */
	fill_words(a + 2 * bs, bs, SEED_B, 2 * bs);
	touch_read(R, 3 * bs, 31 * bs);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(kvp_region_advise(R, 2, 1, KVP_ADVICE_COLD), 0);
	/* One more block: block 2 leaves, its write held by the store. */
	ck_assert_int_eq(pthread_create(&t, NULL, touch_block_main,
					(void *)(uintptr_t)(40 * bs)),
			 0);
	for (k = 0; k < 10000; k++) {
		ck_assert_int_eq(kvp_region_block_info(R, 2, &bi), 0);
		if (bi.state == KVP_BLOCK_EVICTING)
			break;
		usleep(1000);
	}
	ck_assert_int_eq(bi.state, KVP_BLOCK_EVICTING);
	ck_assert_int_eq(madvise(a + 2 * bs + 5 * PG, 3 * PG, MADV_DONTNEED),
			 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(binfo(R, 2).state, KVP_BLOCK_ABSENT);
	/* Loaded from the store again: the dropped pages zero, the rest
	 * kept. */
	ck_assert(is_zero(a + 2 * bs + 5 * PG, 3 * PG));
	check_region(R, 2 * bs, 5 * PG, SEED_B);
	check_region(R, 2 * bs + 8 * PG, bs - 8 * PG, SEED_B);
}
END_TEST

START_TEST(test_unmap)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	/* Blocks 4..7 resident and dirty, then unmapped; 20..23 never loaded,
	 * unmapped; the last two blocks unmapped. */
	fill_words(a + 4 * bs, 4 * bs, SEED_B, 4 * bs);
	ck_assert_int_eq(munmap(a + 4 * bs, 4 * bs), 0);
	ck_assert_int_eq(munmap(a + 20 * bs, 4 * bs), 0);
	ck_assert_int_eq(munmap(a + 62 * bs, 2 * bs), 0);
	/* munmap returns once the event is read, not handled: wait. */
	ck_assert_uint_ge(wait_removed(R, 10 * bs), 10 * bs);
	ck_assert_int_eq(binfo(R, 5).state, KVP_BLOCK_ABSENT);
	/* The rest works, through eviction (the budget is 32 blocks). */
	for (unsigned pass = 0; pass < 2; pass++) {
		check_region(R, 0, 4 * bs, SEED_A);
		check_region(R, 8 * bs, 12 * bs, SEED_A);
		check_region(R, 24 * bs, 38 * bs, SEED_A);
	}
	fill_words(a + 30 * bs, bs, SEED_B, 30 * bs);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S, 30 * bs, bs, SEED_B), -1);
	ck_assert_int_eq(store_check(S, 31 * bs, bs, SEED_A), -1);
}
END_TEST

/* munmap of part of a resident, dirty block: the rest of the block keeps
 * its data through eviction, and destroy does not touch the hole (engine
 * bug 5 at the end of this file). */
START_TEST(test_unmap_part_of_block)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 2 * MIB };
	char *a;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	fill_words(a + 3 * bs, bs, SEED_B, 3 * bs);
	ck_assert_int_eq(munmap(a + 3 * bs + 4 * PG, PG), 0);
	wait_removed(R, PG);
	push_out(R, 2 * MIB);
	check_region(R, 3 * bs, 4 * PG, SEED_B);
	check_region(R, 3 * bs + 5 * PG, bs - 5 * PG, SEED_B);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S, 3 * bs, 4 * PG, SEED_B), -1);
}
END_TEST

/* ------------------------------------------------------------------ */
/* read errors: SIGBUS, never a hang */

static sigjmp_buf bus_jb;
static volatile sig_atomic_t bus_seen;

static void on_sigbus(int sig)
{
	(void)sig;
	bus_seen++;
	siglongjmp(bus_jb, 1);
}

static void on_alarm(int sig)
{
	static const char m[] = "test_pager: no SIGBUS 30 s after touching a "
				"block whose read failed: the thread hangs\n";
	(void)sig;
	(void)!write(2, m, sizeof(m) - 1);
	_exit(3);
}

/* Touch @p; true if that raised SIGBUS.  A hang ends the test (alarm). */
static bool touch_bus(volatile char *p, uint64_t *ms)
{
	struct sigaction sa = { .sa_handler = on_sigbus }, old, olda;
	struct sigaction al = { .sa_handler = on_alarm };
	uint64_t t0 = now_ms();
	bool bus;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old);
	sigaction(SIGALRM, &al, &olda);
	bus_seen = 0;
	alarm(30);
	if (sigsetjmp(bus_jb, 1) == 0)
		(void)*p;
	alarm(0);
	bus = bus_seen;
	sigaction(SIGBUS, &old, NULL);
	sigaction(SIGALRM, &olda, NULL);
	if (ms)
		*ms = now_ms() - t0;
	return bus;
}

START_TEST(test_read_error_sigbus)
{
	size_t bs = 64 * KIB, size = 32 * bs;
	bool shortread = _i % 2;
	unsigned mode = (_i / 2) ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE;
	struct popts po = { .budget = 4 * MIB, .mode = mode };
	struct kvp_fault_plan plan = { 0 };
	struct kvp_block_info bi;
	struct kvp_stats s;
	uint64_t ms = 0;
	char *a, *buf;

	make_faulty_store(size);
	store_fill(S0, 0, size, SEED_A);
	/* Block 5 fails: EIO, or a read that comes back half short. */
	plan.read_errno = shortread ? 0 : EIO;
	plan.read_fail_off = 5 * bs + (shortread ? bs / 2 : 0);
	plan.read_fail_len = shortread ? PG : bs;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);

	ck_assert_msg(touch_bus(a + 5 * bs + 100, &ms),
		      "no SIGBUS reading a block whose read failed");
	printf("sigbus (%s, %s) after %llu ms\n", shortread ? "short" : "EIO",
	       kvp_region_install_mode(R), (unsigned long long)ms);
	ck_assert_uint_lt(ms, 10000);
	bi = binfo(R, 5);
	ck_assert_int_eq(bi.state, KVP_BLOCK_POISONED);
	s = rstats(R);
	ck_assert_uint_ge(s.read_errors_total, 1);
	ck_assert_uint_eq(s.poisoned_blocks, 1);
	/* Again, on another page of it, and a write: SIGBUS at once. */
	ck_assert(touch_bus(a + 5 * bs + bs - 8, NULL));
	ck_assert(touch_bus(a + 5 * bs + 3 * PG, NULL));
	/* Other blocks are served, before and after it. */
	check_region(R, 0, 5 * bs, SEED_A);
	check_region(R, 6 * bs, size - 6 * bs, SEED_A);
	ck_assert_uint_eq(rstats(R).poisoned_blocks, 1);
	/* peek says EIO; a prefetch of it fails. */
	buf = xalloc(bs);
	ck_assert_int_eq(kvp_region_peek(R, 5, buf), -EIO);
	free(buf);
	struct kvp_prefetch *pf = NULL;
	uint64_t blocks[] = { 4, 5, 6 };

	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, 3, &pf), 0);
	ck_assert_int_eq(kvp_prefetch_wait(pf, -1), -EIO);
	kvp_prefetch_release(pf);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
}
END_TEST

/* A read error on a block faulted by several threads at once: all of them
 * get SIGBUS (each thread has its own handler frame here). */
struct busthr {
	pthread_t t;
	volatile char *p;
	pthread_barrier_t *bar;
	bool bus;
};

static __thread sigjmp_buf tbus_jb;

static void on_tsigbus(int sig)
{
	(void)sig;
	siglongjmp(tbus_jb, 1);
}

static void *bus_thread(void *arg)
{
	struct busthr *b = arg;

	pthread_barrier_wait(b->bar);
	if (sigsetjmp(tbus_jb, 1) == 0)
		(void)*b->p;
	else
		b->bus = true;
	return NULL;
}

START_TEST(test_read_error_threads)
{
	size_t bs = 64 * KIB, size = 16 * bs;
	struct popts po = { .budget = 4 * MIB };
	struct kvp_fault_plan plan = { .read_errno = EIO,
				       .read_fail_off = 2 * bs,
				       .read_fail_len = bs,
				       .delay_us = 30000 };
	struct sigaction sa = { .sa_handler = on_tsigbus };
	struct sigaction al = { .sa_handler = on_alarm };
	struct busthr th[4];
	pthread_barrier_t bar;

	make_faulty_store(size);
	store_fill(S0, 0, size, SEED_A);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGALRM, &al, NULL);
	alarm(30);
	pthread_barrier_init(&bar, NULL, 4);
	for (unsigned i = 0; i < 4; i++) {
		th[i] = (struct busthr){ .p = (char *)kvp_region_addr(R) +
					      2 * bs + i * PG,
					 .bar = &bar };
		ck_assert_int_eq(
		    pthread_create(&th[i].t, NULL, bus_thread, &th[i]), 0);
	}
	for (unsigned i = 0; i < 4; i++)
		pthread_join(th[i].t, NULL);
	alarm(0);
	pthread_barrier_destroy(&bar);
	for (unsigned i = 0; i < 4; i++)
		ck_assert_msg(th[i].bus, "thread %u got no SIGBUS", i);
	ck_assert_uint_eq(rstats(R).poisoned_blocks, 1);
	check_region(R, 3 * bs, bs, SEED_A);
}
END_TEST

/* ------------------------------------------------------------------ */
/* write-back failure */

START_TEST(test_writeback_failure)
{
	size_t bs = 64 * KIB;
	uint64_t budget = 4 * MIB;
	size_t size = 2 * budget, dirty = budget / 2;
	bool at_destroy = _i % 2;
	struct popts po = { .budget = budget,
			    .mode = (_i / 2) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .write_errno = ENOSPC };
	struct kvp_stats s;
	char *a;

	make_faulty_store(size);
	store_fill(S0, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	/* Half the budget dirty, then the store refuses writes. */
	fill_words(a, dirty, SEED_B, 0);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	/* Read the rest twice over: evictions try the dirty blocks too. */
	for (unsigned pass = 0; pass < 2; pass++)
		check_region(R, dirty, size - dirty, SEED_A);
	s = rstats(R);
	ck_assert_uint_gt(s.write_errors_total, 0);
	ck_assert_uint_eq(s.evictions_dirty_total, 0);
	/* The data was not lost: the blocks stay resident and dirty. */
	for (uint64_t b = 0; b < dirty / bs; b++) {
		struct kvp_block_info bi = binfo(R, b);

		ck_assert_int_eq(bi.state, KVP_BLOCK_RESIDENT);
		ck_assert(bi.dirty);
	}
	check_region(R, 0, dirty, SEED_B);
	/* The store still has the old data. */
	ck_assert_int_eq(store_check(S0, 0, dirty, SEED_A), -1);
	if (at_destroy) {
		ck_assert_int_eq(kvp_region_destroy(R), -ENOSPC);
		R = NULL;
		ck_assert_uint_gt(pstats().write_errors_total, 0);
		return;
	}
	ck_assert_int_eq(kvp_region_flush(R), -ENOSPC);
	check_region(R, 0, dirty, SEED_B);
	/* The store comes back: a flush writes everything. */
	plan.write_errno = 0;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(kvp_region_flush(R), 0);
	ck_assert_int_eq(store_check(S0, 0, dirty, SEED_B), -1);
	ck_assert(!binfo(R, 0).dirty);
	/* And eviction works again. */
	check_region(R, dirty, size - dirty, SEED_A);
	check_region(R, 0, dirty, SEED_B);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
}
END_TEST

/* ------------------------------------------------------------------ */
/* prefetch, pins and hints */

static void prefetch_fixture(size_t nblocks, size_t bs, uint64_t budget,
			     uint64_t delay_us, bool exact)
{
	struct popts po = { .budget = budget, .exact_budget = exact };
	struct kvp_fault_plan plan = { .delay_us = delay_us };

	make_faulty_store(nblocks * bs);
	store_fill(S0, 0, nblocks * bs, SEED_A);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(nblocks * bs, bs, KVP_REGION_FROM_STORE);
}

START_TEST(test_prefetch_basic)
{
	size_t bs = 64 * KIB;
	uint64_t blocks[] = { 3, 9, 10, 11, 40, 41, 63, 0 };
	size_t n = sizeof(blocks) / sizeof(blocks[0]);
	struct kvp_prefetch *pf = NULL;
	struct kvp_stats s0, s1;

	prefetch_fixture(64, bs, 8 * MIB, 0, false);
	settle(R);
	s0 = rstats(R);
	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, n, &pf), 0);
	ck_assert_ptr_nonnull(pf);
	ck_assert_int_eq(kvp_prefetch_wait(pf, -1), 0);
	ck_assert(kvp_prefetch_done(pf));
	kvp_prefetch_release(pf);
	s1 = rstats(R);
	ck_assert_uint_eq(s1.prefetch_issued_total - s0.prefetch_issued_total,
			  n);
	ck_assert_uint_eq(s1.bytes_read_total - s0.bytes_read_total, n * bs);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(binfo(R, blocks[i]).state, KVP_BLOCK_RESIDENT);
	/* Reading them takes no fault. */
	for (size_t i = 0; i < n; i++)
		check_region(R, blocks[i] * bs, bs, SEED_A);
	s1 = rstats(R);
	ck_assert_uint_eq(s1.demand_faults_total, s0.demand_faults_total);
	ck_assert_uint_eq(s1.coalesced_faults_total, s0.coalesced_faults_total);
	/* A write to one is a use: a hit. */
	*(volatile uint64_t *)((char *)kvp_region_addr(R) + 9 * bs) = 1;
	ck_assert_uint_ge(rstats(R).prefetch_hit_total, 1);

	/* Prefetch of resident blocks reads nothing again. */
	settle(R);
	s0 = rstats(R);
	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, n, &pf), 0);
	ck_assert_int_eq(kvp_prefetch_wait(pf, 5000), 0);
	kvp_prefetch_release(pf);
	s1 = rstats(R);
	ck_assert_uint_eq(s1.bytes_read_total, s0.bytes_read_total);
	ck_assert_uint_eq(s1.prefetch_issued_total, s0.prefetch_issued_total);

	/* Fire and forget: no handle, the blocks still arrive. */
	uint64_t more[] = { 20, 21 };

	ck_assert_int_eq(kvp_prefetch_submit(R, more, 2, NULL), 0);
	for (int k = 0; k < 2000 && binfo(R, 21).state != KVP_BLOCK_RESIDENT;
	     k++)
		usleep(1000);
	ck_assert_int_eq(binfo(R, 20).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(binfo(R, 21).state, KVP_BLOCK_RESIDENT);
	/* Bad arguments. */
	uint64_t out_of_range = 64;

	ck_assert_int_eq(kvp_prefetch_submit(R, &out_of_range, 1, &pf),
			 -EINVAL);
	ck_assert_int_eq(kvp_prefetch_submit(R, NULL, 1, &pf), -EINVAL);
}
END_TEST

START_TEST(test_prefetch_timeout_cancel)
{
	size_t bs = 64 * KIB, n = 32;
	uint64_t blocks[32];
	struct kvp_prefetch *pf = NULL;

	for (size_t i = 0; i < n; i++)
		blocks[i] = i;
	prefetch_fixture(64, bs, 8 * MIB, 300000, false);
	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, n, &pf), 0);
	ck_assert_int_eq(kvp_prefetch_wait(pf, 20), -ETIMEDOUT);
	ck_assert(!kvp_prefetch_done(pf));
	ck_assert_int_eq(kvp_prefetch_wait(pf, -1), 0);
	ck_assert(kvp_prefetch_done(pf));
	kvp_prefetch_release(pf);
	check_region(R, 0, n * bs, SEED_A);

	/* Cancel: the wait ends, whatever was loaded is good, the rest loads
	 * on demand. */
	for (size_t i = 0; i < n; i++)
		blocks[i] = 32 + i;
	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, n, &pf), 0);
	ck_assert_int_eq(kvp_prefetch_cancel(pf), 0);
	ck_assert_int_eq(kvp_prefetch_wait(pf, -1), 0);
	ck_assert(kvp_prefetch_done(pf));
	kvp_prefetch_release(pf);
	check_region(R, 32 * bs, n * bs, SEED_A);
	/* Release while in flight: no wait, no leak, no crash. */
	struct kvp_fault_plan plan = { .delay_us = 100000 };

	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	push_out(R, 8 * MIB);
	ck_assert_int_eq(kvp_prefetch_submit(R, blocks, n, &pf), 0);
	kvp_prefetch_release(pf);
	check_region(R, 32 * bs, n * bs, SEED_A);
}
END_TEST

START_TEST(test_pin)
{
	size_t bs = 64 * KIB, nb = 128;
	uint64_t budget = 2 * MIB; /* 32 blocks */
	struct kvp_stats s0;

	prefetch_fixture(nb, bs, budget, 0, false);
	/* More than the budget: -ENOSPC, nothing pinned. */
	ck_assert_int_eq(kvp_region_pin(R, 0, 33), -ENOSPC);
	for (uint64_t b = 0; b < 33; b++)
		ck_assert_uint_eq(binfo(R, b).pins, 0);
	ck_assert_int_eq(kvp_region_unpin(R, 0, 1), -EINVAL);
	ck_assert_int_eq(kvp_region_pin(R, nb, 1), -EINVAL);
	/* Pin 8 blocks (twice: pins nest), load them, stream the rest. */
	ck_assert_int_eq(kvp_region_pin(R, 10, 8), 0);
	ck_assert_int_eq(kvp_region_pin(R, 10, 8), 0);
	ck_assert_uint_eq(binfo(R, 12).pins, 2);
	check_region(R, 10 * bs, 8 * bs, SEED_A);
	settle(R);
	s0 = rstats(R);
	for (unsigned pass = 0; pass < 3; pass++)
		touch_read(R, 20 * bs, (nb - 20) * bs);
	ck_assert_uint_gt(rstats(R).evictions_clean_total,
			  s0.evictions_clean_total);
	for (uint64_t b = 10; b < 18; b++)
		ck_assert_int_eq(binfo(R, b).state, KVP_BLOCK_RESIDENT);
	settle(R);
	s0 = rstats(R);
	check_region(R, 10 * bs, 8 * bs, SEED_A);
	ck_assert_uint_eq(rstats(R).demand_faults_total,
			  s0.demand_faults_total);
	/* Pinned bytes count against further pins. */
	ck_assert_int_eq(kvp_region_pin(R, 40, 25), -ENOSPC);
	ck_assert_int_eq(kvp_region_pin(R, 40, 24), 0);
	ck_assert_int_eq(kvp_region_unpin(R, 40, 24), 0);
	/* Unpinned (both levels), they can go. */
	ck_assert_int_eq(kvp_region_unpin(R, 10, 8), 0);
	ck_assert_uint_eq(binfo(R, 12).pins, 1);
	ck_assert_int_eq(kvp_region_unpin(R, 10, 8), 0);
	ck_assert_uint_eq(binfo(R, 12).pins, 0);
	for (unsigned pass = 0; pass < 2; pass++)
		touch_read(R, 20 * bs, (nb - 20) * bs);
	unsigned gone = 0;

	for (uint64_t b = 10; b < 18; b++)
		gone += binfo(R, b).state != KVP_BLOCK_RESIDENT;
	ck_assert_uint_gt(gone, 0);
	check_region(R, 0, nb * bs, SEED_A);
}
END_TEST

START_TEST(test_cold_hint)
{
	size_t bs = 64 * KIB, nb = 64;
	/* 32 blocks. */
	uint64_t budget = 2 * MIB;

	prefetch_fixture(nb, bs, budget, 0, true);
	/* Fill the budget exactly: blocks 0..31. */
	touch_read(R, 0, 32 * bs);
	for (uint64_t b = 0; b < 32; b++)
		ck_assert_int_eq(binfo(R, b).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(kvp_region_advise(R, 17, 1, KVP_ADVICE_COLD), 0);
	ck_assert_int_eq(kvp_region_advise(R, 5, 1, KVP_ADVICE_COLD), 0);
	/* Two more blocks: the two cold ones leave, the rest stays. */
	touch_read(R, 40 * bs, bs);
	touch_read(R, 41 * bs, bs);
	ck_assert_int_eq(binfo(R, 5).state, KVP_BLOCK_ABSENT);
	ck_assert_int_eq(binfo(R, 17).state, KVP_BLOCK_ABSENT);
	for (uint64_t b = 0; b < 32; b++)
		if (b != 5 && b != 17)
			ck_assert_msg(binfo(R, b).state == KVP_BLOCK_RESIDENT,
				      "block %llu evicted before the cold ones",
				      (unsigned long long)b);
	check_region(R, 0, nb * bs, SEED_A);
}
END_TEST

START_TEST(test_discard)
{
	size_t bs = 64 * KIB, nb = 64;
	struct kvp_stats s0, s1;
	char *a;

	prefetch_fixture(nb, bs, 2 * MIB, 0, false);
	a = kvp_region_addr(R);
	/* 4: resident dirty; 6: resident clean; 8: never loaded; 10: written
	 * and evicted (in the store). */
	fill_words(a + 10 * bs, bs, SEED_B, 10 * bs);
	ck_assert_int_eq(kvp_region_advise(R, 10, 1, KVP_ADVICE_COLD), 0);
	touch_read(R, 20 * bs, 40 * bs);
	ck_assert_int_eq(binfo(R, 10).state, KVP_BLOCK_ABSENT);
	ck_assert(binfo(R, 10).in_store);
	fill_words(a + 4 * bs, bs, SEED_B, 4 * bs);
	check_region(R, 6 * bs, bs, SEED_A);
	/* Settled first: a DISCARD in the window between the wake-up and
	 * RESIDENT is lost (engine bug 6). */
	ck_assert_int_eq(binfo(R, 4).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(binfo(R, 6).state, KVP_BLOCK_RESIDENT);
	ck_assert(binfo(R, 4).dirty);
	settle(R);
	s0 = rstats(R);
	ck_assert_int_eq(kvp_region_advise(R, 4, 1, KVP_ADVICE_DISCARD), 0);
	ck_assert_int_eq(kvp_region_advise(R, 6, 1, KVP_ADVICE_DISCARD), 0);
	ck_assert_int_eq(kvp_region_advise(R, 8, 1, KVP_ADVICE_DISCARD), 0);
	ck_assert_int_eq(kvp_region_advise(R, 10, 1, KVP_ADVICE_DISCARD), 0);
	s1 = rstats(R);
	ck_assert_uint_eq(s1.bytes_written_total, s0.bytes_written_total);
	ck_assert(is_zero(a + 4 * bs, bs));
	ck_assert(is_zero(a + 6 * bs, bs));
	ck_assert(is_zero(a + 8 * bs, bs));
	ck_assert(is_zero(a + 10 * bs, bs));
	s1 = rstats(R);
	ck_assert_uint_eq(s1.bytes_read_total, s0.bytes_read_total);
	ck_assert_uint_eq(s1.bytes_written_total, s0.bytes_written_total);
	/* Neighbours keep their data. */
	check_region(R, 5 * bs, bs, SEED_A);
	check_region(R, 7 * bs, bs, SEED_A);
	check_region(R, 9 * bs, bs, SEED_A);
	/* Still zeros after eviction and reload; a discard of a pinned block
	 * is refused. */
	push_out(R, 2 * MIB);
	ck_assert(is_zero(a + 4 * bs, bs));
	ck_assert(is_zero(a + 10 * bs, bs));
	ck_assert_int_eq(kvp_region_pin(R, 12, 1), 0);
	touch_read(R, 12 * bs, bs);
	ck_assert_int_eq(binfo(R, 12).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(kvp_region_advise(R, 12, 1, KVP_ADVICE_DISCARD),
			 -EBUSY);
	check_region(R, 12 * bs, bs, SEED_A);
	ck_assert_int_eq(kvp_region_advise(R, 0, nb + 1, KVP_ADVICE_COLD),
			 -EINVAL);
	ck_assert_int_eq(kvp_region_advise(R, 0, 1, (enum kvp_advice)7),
			 -EINVAL);
}
END_TEST

/* ------------------------------------------------------------------ */
/* region limits and bad arguments */

static int count_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;

	ck_assert_ptr_nonnull(f);
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static int count_fn(struct kvp_region *r, void *arg)
{
	(void)r;
	(*(unsigned *)arg)++;
	return 0;
}

static unsigned count_regions(void)
{
	unsigned n = 0;

	kvp_pager_foreach_region(P, count_fn, &n);
	return n;
}

START_TEST(test_many_regions)
{
	enum { N = 1000 };
	size_t rsize = 64 * KIB;
	struct kvp_region **rs = calloc(N, sizeof(*rs));
	struct popts po = { .budget = 16 * MIB };
	struct kvp_stats s;

	ck_assert_ptr_nonnull(rs);
	make_store(ST_MEM, N * rsize);
	open_pager(&po);
	for (unsigned i = 0; i < N; i++) {
		struct kvp_region_opts o = { .size = rsize,
					     .block_bytes =
						 (i % 2) ? 4 * KIB : 16 * KIB,
					     .store = S,
					     .store_offset = i * rsize };
		int err = kvp_region_create(P, &o, &rs[i]);

		ck_assert_msg(err == 0, "region %u: %s", i, kvp_strerror(err));
	}
	ck_assert_uint_eq(count_regions(), N);
	/* Write each (4x the budget in total), then read all back. */
	for (unsigned i = 0; i < N; i++)
		fill_words(kvp_region_addr(rs[i]), rsize, SEED_B + i, 0);
	for (unsigned i = 0; i < N; i++)
		ck_assert_msg(check_words(kvp_region_addr(rs[i]), rsize,
					  SEED_B + i, 0) < 0,
			      "region %u lost its data", i);
	for (unsigned i = 0; i < N; i++)
		ck_assert_int_eq(kvp_region_destroy(rs[i]), 0);
	ck_assert_uint_eq(count_regions(), 0);
	s = pstats();
	ck_assert_uint_eq(s.resident_bytes, 0);
	ck_assert_uint_gt(s.evictions_dirty_total, 0);
	for (unsigned i = 0; i < N; i += 97) {
		char *buf = xalloc(rsize);

		ck_assert_int_eq(kvp_store_pread(S, buf, rsize, i * rsize), 0);
		ck_assert_int_eq(check_words(buf, rsize, SEED_B + i, 0), -1);
		free(buf);
	}
	/* And again: creating after destroying works. */
	for (unsigned i = 0; i < N; i++) {
		struct kvp_region_opts o = { .size = rsize,
					     .block_bytes = 4 * KIB,
					     .store = S,
					     .store_offset = i * rsize,
					     .flags = KVP_REGION_FROM_STORE };

		ck_assert_int_eq(kvp_region_create(P, &o, &rs[i]), 0);
	}
	for (unsigned i = 0; i < N; i += 7)
		ck_assert_int_eq(
		    check_words(kvp_region_addr(rs[i]), rsize, SEED_B + i, 0),
		    -1);
	for (unsigned i = 0; i < N; i++)
		ck_assert_int_eq(kvp_region_destroy(rs[i]), 0);
	free(rs);
}
END_TEST

START_TEST(test_bad_args)
{
	struct popts po = { .budget = 4 * MIB };
	struct kvp_region *r = NULL, *x = (struct kvp_region *)0x1;
	struct kvp_store *fs = NULL;
	struct kvp_stats s0, s1;
	int maps;
	struct kvp_region_opts ok = { .name = "kv",
				      .size = 1 * MIB,
				      .block_bytes = 64 * KIB };

	make_store(ST_MEM, 4 * MIB);
	ok.store = S;
	open_pager(&po);
	ck_assert_int_eq(kvp_region_create(P, &ok, &r), 0);
	ck_assert_str_eq(kvp_region_name(r), "kv");
	ck_assert_ptr_eq(kvp_region_store(r), S);
	ck_assert_uint_eq(kvp_region_size(r), 1 * MIB);
	memset(kvp_region_addr(r), 7, 1 * MIB);
	ck_assert_int_eq(kvp_store_file_temp("/var/tmp", 4 * MIB, &fs), 0);
	settle(r);
	s0 = pstats();
	maps = count_maps();

	struct {
		const char *what;
		struct kvp_region_opts o;
		int want;
	} bad[] = {
		{ "block 12 KiB",
		  { .size = 1 * MIB, .block_bytes = 12 * KIB },
		  -EINVAL },
		{ "block 2 KiB",
		  { .size = 1 * MIB, .block_bytes = 2 * KIB },
		  -EINVAL },
		{ "block 0", { .size = 1 * MIB, .block_bytes = 0 }, -EINVAL },
		{ "block 64 MiB",
		  { .size = 64 * MIB, .block_bytes = 64 * MIB },
		  -EINVAL },
		{ "size 0", { .size = 0, .block_bytes = 64 * KIB }, -EINVAL },
		{ "size not a multiple",
		  { .size = 1 * MIB + 8 * KIB, .block_bytes = 64 * KIB },
		  -EINVAL },
		{ "store too small",
		  { .size = 8 * MIB, .block_bytes = 64 * KIB },
		  -EINVAL },
		{ "offset past the store",
		  { .size = 1 * MIB,
		    .block_bytes = 64 * KIB,
		    .store_offset = 3584 * KIB },
		  -EINVAL },
		{ "bad flag",
		  { .size = 1 * MIB,
		    .block_bytes = 64 * KIB,
		    .flags = 1u << 7 },
		  -EINVAL },
		{ "empty name",
		  { .name = "", .size = 1 * MIB, .block_bytes = 64 * KIB },
		  -EINVAL },
		{ "name with a slash",
		  { .name = "a/b", .size = 1 * MIB, .block_bytes = 64 * KIB },
		  -EINVAL },
		{ "duplicate name",
		  { .name = "kv", .size = 1 * MIB, .block_bytes = 64 * KIB },
		  -EEXIST },
		{ "no store",
		  { .size = 1 * MIB, .block_bytes = 64 * KIB },
		  -EINVAL },
	};
	size_t nbad = sizeof(bad) / sizeof(bad[0]);

	for (size_t i = 0; i < nbad; i++) {
		struct kvp_region_opts o = bad[i].o;

		if (i != nbad - 1)
			o.store = S;
		x = (struct kvp_region *)0x1;
		int err = kvp_region_create(P, &o, &x);

		ck_assert_msg(err == bad[i].want, "%s: got %d (%s), want %d",
			      bad[i].what, err, kvp_strerror(err), bad[i].want);
		ck_assert_msg(x == (struct kvp_region *)0x1,
			      "%s: *out written on failure", bad[i].what);
	}
	/* A file store: an offset off its O_DIRECT alignment. */
	printf("file store offset_align %u\n", fs->offset_align);
	struct kvp_region_opts mis = { .size = 1 * MIB,
				       .block_bytes = 64 * KIB,
				       .store = fs,
				       .store_offset = 8 * KIB + 100 };

	ck_assert_int_eq(kvp_region_create(P, &mis, &x), -EINVAL);
	if (fs->offset_align > 4096) {
		mis.store_offset = 0;
		mis.block_bytes = 4 * KIB;
		ck_assert_int_eq(kvp_region_create(P, &mis, &x), -EINVAL);
	}
	ck_assert_int_eq(kvp_region_create(NULL, &ok, &x), -EINVAL);
	ck_assert_int_eq(kvp_region_create(P, NULL, &x), -EINVAL);
	/* Nothing changed: one region, no new mapping, same statistics. */
	ck_assert_uint_eq(count_regions(), 1);
	ck_assert_int_eq(count_maps(), maps);
	s1 = pstats();
	ck_assert_int_eq(memcmp(&s0, &s1, sizeof(s0)), 0);
	for (size_t i = 0; i < 1 * MIB; i += PG)
		ck_assert_int_eq(((char *)kvp_region_addr(r))[i], 7);
	/* The bad config of a pager. */
	struct kvp_config c;
	struct kvp_pager *p2 = (struct kvp_pager *)0x1;

	kvp_config_defaults(&c);
	c.ram_budget_bytes = 4096;
	ck_assert_int_eq(kvp_pager_open(&c, &p2), -EINVAL);
	kvp_config_defaults(&c);
	c.evict_low_watermark_percent = 96;
	c.evict_high_watermark_percent = 95;
	ck_assert_int_eq(kvp_pager_open(&c, &p2), -EINVAL);
	ck_assert_int_eq(kvp_region_destroy(r), 0);
	kvp_store_destroy(fs);
	ck_assert_int_eq(kvp_region_destroy(NULL), -EINVAL);
	ck_assert_int_eq(kvp_region_flush(NULL), -EINVAL);
}
END_TEST

START_TEST(test_strerror)
{
	static const int codes[] = { 0,		EINVAL,	    EPERM,  EACCES,
				     ENOMEM,	ENOSPC,	    EEXIST, EIO,
				     ETIMEDOUT, EOPNOTSUPP, EBUSY,  ENOSYS,
				     EOVERFLOW, ENOENT,	    EAGAIN };

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		const char *m = kvp_strerror(-codes[i]);

		ck_assert_ptr_nonnull(m);
		ck_assert_msg(m[0], "kvp_strerror(%d) is empty", -codes[i]);
		ck_assert_str_eq(m, kvp_strerror(codes[i]));
	}
	ck_assert_ptr_nonnull(strstr(kvp_strerror(-EPERM), "userfaultfd"));
	ck_assert_ptr_nonnull(kvp_strerror(-123456));
	ck_assert_str_eq(kvp_block_state_name(KVP_BLOCK_POISONED), "poisoned");
}
END_TEST

/* ------------------------------------------------------------------ */
/* block_info and peek */

static bool same_info(const struct kvp_block_info *a,
		      const struct kvp_block_info *b)
{
	return a->state == b->state && a->dirty == b->dirty &&
	       a->in_store == b->in_store && a->pins == b->pins &&
	       a->last_use == b->last_use;
}

START_TEST(test_peek)
{
	size_t bs = 64 * KIB, nb = 64;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a, *buf;
	struct kvp_stats s0, s1;
	const uint64_t blks[] = { 1, 2, 3, 4 };

	make_store(ST_MEM, nb * bs);
	store_fill(S, 0, nb * bs, SEED_A);
	open_pager(&po);
	R = make_region(nb * bs, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	buf = xalloc(bs);
	/* 2: written, then evicted; 1: resident dirty; 4: resident clean;
	 * 3: never loaded. */
	fill_words(a + 2 * bs, bs, SEED_B, 2 * bs);
	ck_assert_int_eq(kvp_region_advise(R, 2, 1, KVP_ADVICE_COLD), 0);
	touch_read(R, 20 * bs, 40 * bs);
	fill_words(a + 1 * bs, bs, SEED_B, 1 * bs);
	check_region(R, 4 * bs, bs, SEED_A);
	ck_assert_int_eq(binfo(R, 2).state, KVP_BLOCK_ABSENT);
	ck_assert(binfo(R, 2).in_store);
	ck_assert_int_eq(binfo(R, 1).state, KVP_BLOCK_RESIDENT);
	ck_assert(binfo(R, 1).dirty);
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_ABSENT);
	ck_assert_int_eq(binfo(R, 4).state, KVP_BLOCK_RESIDENT);
	ck_assert(!binfo(R, 4).dirty);

	settle(R);
	s0 = rstats(R);
	for (size_t i = 0; i < 4; i++) {
		uint64_t b = blks[i];
		uint64_t seed = (b == 1 || b == 2) ? SEED_B : SEED_A;
		struct kvp_block_info before = binfo(R, b), after;

		memset(buf, 0xee, bs);
		ck_assert_int_eq(kvp_region_peek(R, b, buf), 0);
		after = binfo(R, b);
		ck_assert_msg(check_words(buf, bs, seed, b * bs) < 0,
			      "peek of block %llu (%s) differs",
			      (unsigned long long)b,
			      kvp_block_state_name(before.state));
		ck_assert_msg(same_info(&before, &after),
			      "peek changed block %llu's info",
			      (unsigned long long)b);
	}
	s1 = rstats(R);
	ck_assert_uint_eq(s1.demand_faults_total, s0.demand_faults_total);
	ck_assert_uint_eq(s1.resident_bytes, s0.resident_bytes);
	ck_assert_uint_eq(s1.evictions_clean_total + s1.evictions_dirty_total,
			  s0.evictions_clean_total + s0.evictions_dirty_total);
	/* A region that does not start from the store: zeros. */
	struct kvp_region_opts o = { .size = 1 * MIB,
				     .block_bytes = bs,
				     .store = S,
				     .store_offset = 0 };
	struct kvp_region *z = NULL;

	ck_assert_int_eq(kvp_region_create(P, &o, &z), 0);
	ck_assert_int_eq(kvp_region_peek(z, 3, buf), 0);
	ck_assert(is_zero(buf, bs));
	ck_assert_int_eq(kvp_region_peek(z, 16, buf), -EINVAL);
	ck_assert_int_eq(
	    kvp_region_block_info(z, 16, &(struct kvp_block_info){ 0 }),
	    -EINVAL);
	ck_assert_int_eq(kvp_region_destroy(z), 0);
	free(buf);
}
END_TEST

/* ------------------------------------------------------------------ */
/* readahead */

START_TEST(test_readahead)
{
	size_t bs = 64 * KIB, size = 64 * MIB, nb = size / bs;
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 4 * MIB };
	struct kvp_stats s;

	make_store(ST_FILE, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	check_region(R, 0, size, SEED_A);
	s = rstats(R);
	printf("readahead %s: %llu demand faults, %llu read ahead, %llu "
	       "coalesced over %zu blocks\n",
	       kvp_region_install_mode(R),
	       (unsigned long long)s.demand_faults_total,
	       (unsigned long long)s.readahead_blocks_total,
	       (unsigned long long)s.coalesced_faults_total, nb);
	ck_assert_uint_gt(s.readahead_blocks_total, nb / 4);
	ck_assert_uint_le(s.demand_faults_total * 4, nb);
	ck_assert_uint_eq(s.read_errors_total, 0);
}
END_TEST

/* ------------------------------------------------------------------ */
/*
 * Engine bugs found by these tests, all fixed; each keeps its test in the
 * "regressions" case:
 *
 * 1. A service thread kept its queue on every store it served after the
 *    last region on it was destroyed; destroying the store then (allowed
 *    by store.h) left a dangling s->queues[i].store and the thread crashed
 *    in service_main building its poll set.
 * 2. install() took a UFFDIO_MOVE error other than EAGAIN/EEXIST/ENOENT
 *    for success: UFFDIO_MOVE of a frame an O_DIRECT read had just filled
 *    failed with EBUSY (file store, move mode, 1 MiB blocks), the block
 *    became RESIDENT with none of its pages and the faulting thread
 *    livelocked (fault -> RESIDENT -> UFFDIO_WAKE -> fault) at 100% CPU.
 * 3. The watermarks are budget / 100 * percent (service.c,
 *    watermark_stage): at 100% a budget that is not a multiple of 100
 *    counts an exactly full budget as over the high watermark and evicts
 *    with nothing waiting for a frame.
 * 4. Readahead never grows in copy mode: readahead() sets ra_next to the
 *    faulting block + 1, and a read-ahead block installed before the
 *    program reaches it takes no fault, so the next fault (just past the
 *    window) is not seen as sequential and resets the window: a scan
 *    demand-faults every other block.  Move mode stages read-ahead blocks
 *    until their fault, so its window grows (1 demand fault per scan).
 * 5. kvp_region_destroy (and kvp_region_flush's write_block) write a dirty
 *    resident block back straight from the region; when the program has
 *    munmapped a page of it, that pwrite reads unmapped memory: SIGSEGV
 *    in mem_pwrite's memcpy (region.c destroy loop) with a memory store,
 *    EFAULT (the data reported lost) with a file store
 *    (test_unmap_part_of_block).
 * 6. install_finish (service.c) wakes the faulting thread (install's
 *    UFFDIO_WAKE) before it takes the lock and makes the block RESIDENT,
 *    and kvp_blk_installed clears BLK_DROP.  A KVP_ADVICE_DISCARD made
 *    right after the access that loaded the block returns (block still
 *    LOADING) is lost: the block reads its old data, not zeros; and a
 *    DISCARD of a pinned block in that window returns 0, not -EBUSY.
 *    block_info shows LOADING there too (tests wait for it to settle).
 */

START_TEST(test_bug_store_outlives_last_region)
{
	struct popts po = { .budget = 4 * MIB };
	struct kvp_store *ms = NULL;
	struct kvp_region_opts o = { .size = 1 * MIB, .block_bytes = 64 * KIB };
	struct kvp_region *r = NULL;

	open_pager(&po);
	ck_assert_int_eq(kvp_store_memory_create(1 * MIB, &ms), 0);
	o.store = ms;
	ck_assert_int_eq(kvp_region_create(P, &o, &r), 0);
	memset(kvp_region_addr(r), 1, 1 * MIB);
	ck_assert_int_eq(kvp_region_destroy(r), 0);
	kvp_store_destroy(ms); /* allowed: no region uses it */
	/* Any later work wakes the service thread: it crashes (a memory
	 * store here could reuse the freed one's memory and hide it). */
	make_store(ST_FILE, 1 * MIB);
	R = make_region(1 * MIB, 64 * KIB, 0);
	memset(kvp_region_addr(R), 2, 1 * MIB);
	ck_assert_int_eq(((char *)kvp_region_addr(R))[4096], 2);
}
END_TEST

START_TEST(test_bug_move_ebusy)
{
	size_t bs = 1 * MIB, size = 32 * MIB;
	struct popts po = { .budget = 8 * MIB,
			    .mode = KVP_INSTALL_MOVE,
			    .readahead = 2 * MIB };

	make_store(ST_FILE, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	for (int k = 0; k < 8; k++) {
		R = make_region(size, bs, KVP_REGION_FROM_STORE);
		check_region(R, 0, size, SEED_A); /* hangs, now and then */
		ck_assert_int_eq(kvp_region_destroy(R), 0);
		R = NULL;
	}
}
END_TEST

START_TEST(test_bug_watermark_100)
{
	size_t bs = 64 * KIB;
	struct popts po = { .budget = 2 * MIB, .exact_budget = true };

	make_store(ST_MEM, 4 * MIB);
	open_pager(&po);
	R = make_region(4 * MIB, bs, 0);
	touch_read(R, 0, 2 * MIB); /* exactly the budget */
	for (int k = 0; k < 500 && !rstats(R).evictions_clean_total; k++)
		usleep(1000);
	ck_assert_uint_eq(rstats(R).evictions_clean_total, 0);
}
END_TEST

START_TEST(test_bug_readahead_copy)
{
	size_t bs = 64 * KIB, size = 32 * MIB, nb = size / bs;
	struct popts po = { .budget = 16 * MIB,
			    .mode = KVP_INSTALL_COPY,
			    .readahead = 4 * MIB };

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	touch_read(R, 0, size);
	ck_assert_uint_le(rstats(R).demand_faults_total * 4, nb);
}
END_TEST

START_TEST(test_bug_discard_after_fault)
{
	size_t bs = 64 * KIB, nb = 64;
	unsigned lost = 0;

	prefetch_fixture(nb, bs, 8 * MIB, 0, false);
	for (uint64_t b = 0; b < nb; b++) {
		char *p = (char *)kvp_region_addr(R) + b * bs;

		(void)*(volatile char *)p; /* loads it */
		ck_assert_int_eq(kvp_region_advise(R, b, 1, KVP_ADVICE_DISCARD),
				 0);
		lost += !is_zero(p, bs);
	}
	ck_assert_msg(!lost, "%u of %zu discards right after a fault lost",
		      lost, nb);
}
END_TEST

/* ------------------------------------------------------------------ */

static TCase *tc(Suite *s, const char *name, int timeout)
{
	TCase *t = tcase_create(name);

	tcase_add_checked_fixture(t, fx_setup, fx_teardown);
	tcase_set_timeout(t, timeout);
	suite_add_tcase(s, t);
	return t;
}

static Suite *pager_suite(void)
{
	Suite *s = suite_create("pager");
	TCase *t;

	t = tc(s, "integrity", 120);
	tcase_add_loop_test(t, test_integrity, 0, 4 * NBS);
	t = tc(s, "threads", 120);
	tcase_add_loop_test(t, test_threads_same_block, 0, 2);
	tcase_add_loop_test(t, test_threads_diff_blocks, 0, 2);
	t = tc(s, "budget", 120);
	tcase_add_loop_test(t, test_budget, 0, 4);
	tcase_add_test(t, test_small_frames_not_huge);
	t = tc(s, "write_race", 120);
	tcase_add_loop_test(t, test_write_during_eviction, 0, 4);
	t = tc(s, "zap", 120);
	tcase_add_loop_test(t, test_zap_clean_eviction, 0, 4);
	tcase_add_test(t, test_zap_drop_race);
	tcase_add_test(t, test_zap_follows_reader);
	t = tc(s, "remove_unmap", 120);
	tcase_add_loop_test(t, test_remove_whole_block, 0, 2);
	tcase_add_loop_test(t, test_remove_part_of_block, 0, 2);
	tcase_add_loop_test(t, test_remove_during_writeback, 0, 2);
	tcase_add_loop_test(t, test_unmap, 0, 2);
	t = tc(s, "errors", 120);
	tcase_add_loop_test(t, test_read_error_sigbus, 0, 4);
	tcase_add_test(t, test_read_error_threads);
	tcase_add_loop_test(t, test_writeback_failure, 0, 4);
	t = tc(s, "prefetch", 120);
	tcase_add_test(t, test_prefetch_basic);
	tcase_add_test(t, test_prefetch_timeout_cancel);
	tcase_add_test(t, test_pin);
	tcase_add_test(t, test_cold_hint);
	tcase_add_test(t, test_discard);
	t = tc(s, "limits", 120);
	tcase_add_test(t, test_many_regions);
	tcase_add_test(t, test_bad_args);
	tcase_add_test(t, test_strerror);
	t = tc(s, "introspection", 120);
	tcase_add_loop_test(t, test_peek, 0, 2);
	tcase_add_loop_test(t, test_readahead, 0, 2);
	t = tc(s, "regressions", 120);
	tcase_add_test(t, test_bug_store_outlives_last_region);
	tcase_add_test(t, test_bug_move_ebusy);
	tcase_add_test(t, test_unmap_part_of_block);
	tcase_add_test(t, test_bug_watermark_100);
	tcase_add_test(t, test_bug_discard_after_fault);
	tcase_add_test(t, test_bug_readahead_copy);
	return s;
}

int main(void)
{
	struct kvp_config c;
	struct kvp_pager *p = NULL;
	SRunner *sr;
	int err, failed;

	setvbuf(stdout, NULL, _IOLBF, 0);
	kvp_config_defaults(&c);
	c.ram_budget_bytes = 4 * MIB;
	err = kvp_pager_open(&c, &p);
	if (err == -EPERM || err == -EOPNOTSUPP || err == -ENOSYS) {
		printf("test_pager: cannot open a pager here: %s\n",
		       kvp_strerror(err));
		return 77;
	}
	if (err) {
		printf("test_pager: kvp_pager_open: %s\n", kvp_strerror(err));
		return 1;
	}
	kvp_pager_close(p);
	sr = srunner_create(pager_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
