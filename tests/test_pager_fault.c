/*
 * test_pager_fault.c - the paging engine (pager/): faults: data integrity over block size x install mode x store, and many threads faulting at once.
 *
 * The fixture and helpers are tests/helpers/pager_fx.c.  The binary exits
 * 77 when this machine cannot open a pager.
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
#include "tests/helpers/pager_fx.h"

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
	uint64_t t0 = (kvp_test_now_ns() / 1000000);

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
	       (unsigned long long)((kvp_test_now_ns() / 1000000) - t0));
	/* Write a new pattern over everything (evicting as it goes). */
	kvp_test_fill(kvp_region_addr(R), size, SEED_B, 0);
	printf("integrity %zu: written %llu ms\n", bs,
	       (unsigned long long)((kvp_test_now_ns() / 1000000) - t0));
	/* Touch it all again (evicts the dirty tail), then check. */
	touch_read(R, 0, size);
	check_region(R, 0, size, SEED_B);
	printf("integrity %zu: checked %llu ms\n", bs,
	       (unsigned long long)((kvp_test_now_ns() / 1000000) - t0));

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
		if (*(volatile uint64_t *)(base + off) !=
		    kvp_test_pattern(SEED_A, off)) {
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

		if (v == kvp_test_pattern(seed, base + i * 8))
			continue;
		wrong++;
		as_other += v == kvp_test_pattern(other, base + i * 8);
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
			uint64_t blk =
			    ((pass & 1) ? n - 1 - k : k) * NTHREADS + t->id;
			char *p = base + blk * bs;
			int64_t x = kvp_test_check(p, bs, seed, blk * bs);

			if (x >= 0) {
				atomic_fetch_add(t->bad, 1);
				t->bad_off = blk * bs + (size_t)x;
				describe_bad(t->bad_what, sizeof(t->bad_what),
					     p, bs, seed, blk * bs, pass);
			}
			if (pass == 0)
				kvp_test_fill(p, bs, SEED_B, blk * bs);
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

	(void)fx_seeded_region(ST_MEM, size, bs, &po);
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

static Suite *pager_fault_suite(void)
{
	Suite *s = suite_create("pager_fault");
	TCase *t;

	t = fx_tcase(s, "integrity", 120);
	tcase_add_loop_test(t, test_integrity, 0, 4 * NBS);
	t = fx_tcase(s, "threads", 120);
	tcase_add_loop_test(t, test_threads_same_block, 0, 2);
	tcase_add_loop_test(t, test_threads_diff_blocks, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_fault_suite);
}
