/*
 * test_pager_prefetch.c - the paging engine (pager/): prefetch, pins, hints and read-ahead.
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
/* prefetch, pins and hints */

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

/* ------------------------------------------------------------------ */
/* readahead */

START_TEST(test_readahead)
{
	size_t bs = 64 * KIB, size = 64 * MIB, nb = size / bs;
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 4 * MIB };
	struct kvp_stats s;

	(void)fx_seeded_region(ST_FILE, size, bs, &po);
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

START_TEST(test_bug_readahead_copy)
{
	size_t bs = 64 * KIB, size = 32 * MIB, nb = size / bs;
	struct popts po = { .budget = 16 * MIB,
			    .mode = KVP_INSTALL_COPY,
			    .readahead = 4 * MIB };

	(void)fx_seeded_region(ST_MEM, size, bs, &po);
	touch_read(R, 0, size);
	ck_assert_uint_le(rstats(R).demand_faults_total * 4, nb);
}
END_TEST

/*
 * Read-ahead grows once per window consumed, not once per block used.  A
 * predictor's chosen blocks come as short ascending runs (here 6 blocks
 * every 32): each run looks sequential and starts read-ahead, and before
 * the fix every fault on a read-ahead block doubled the window again, so a
 * run of 6 read about 38 blocks (the decode benchmark's demand mode read
 * 8x what it used).  Now the window doubles only when the reader reaches
 * the end of the window it grew to, and a run of 6 reads 10.
 */
START_TEST(test_readahead_sparse_runs)
{
	size_t bs = 64 * KIB, size = 64 * MIB, run = 6, every = 32;
	struct popts po = { .budget = 64 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 4 * MIB };
	size_t touched = 0;
	uint64_t read;

	(void)fx_seeded_region(ST_MEM, size, bs, &po);
	for (size_t b = 0; b + run <= size / bs; b += every) {
		touch_read(R, b * bs, run * bs);
		touched += run * bs;
	}
	read = rstats(R).bytes_read_total;
	printf("readahead_sparse_runs %s: touched %zu MiB, read %llu MiB, "
	       "%llu read-ahead blocks\n",
	       kvp_region_install_mode(R), touched / MIB,
	       (unsigned long long)(read / MIB),
	       (unsigned long long)rstats(R).readahead_blocks_total);
	ck_assert_uint_ge(read, touched);
	ck_assert_uint_le(read, 2 * touched);
	check_region(R, 0, size, SEED_A);
}
END_TEST

/*
 * Read-ahead never starves the working set (a quarter of the issue's
 * pattern: 128 MiB of 2 MiB blocks under a 64 MiB budget, two threads
 * reading blocks 4g and 4g+1 for g < 14, 56 MiB, under the high
 * watermark but over the low one).  The faults look sequential and
 * read-ahead loads the untouched blocks; before the fix those held their
 * frames while the working set was evicted on every pass, and each pass
 * read it again (on a loaded machine, where read-ahead runs further ahead
 * of the readers, for ever).  Now unused read-ahead goes first and
 * shrinks, and a block loaded again soon after its eviction is working
 * set, taken last by the clock: the next passes may still load what the
 * first one lost, once each, and then read nothing.  (Read-ahead the
 * readers skip stays staged and holds frames: with it the set passes the
 * high watermark, and blocks not yet known as the working set are
 * evicted once more, so how soon the reads stop depends on timing.)
 */
struct ws_reader {
	pthread_t t;
	char *base;
	unsigned first; /* 0 or 1: blocks 4g + first */
	unsigned passes;
};

static void *ws_reader_main(void *arg)
{
	struct ws_reader *w = arg;
	volatile char *a = (volatile char *)w->base;
	uint64_t sum = 0;

	for (unsigned p = 0; p < w->passes; p++)
		for (unsigned g = 0; g < 14; g++)
			for (size_t off = 0; off < 2 * MIB; off += PG)
				sum += a[(4 * g + w->first) * 2 * MIB + off];
	return (void *)(uintptr_t)sum;
}

static void ws_passes(unsigned passes)
{
	struct ws_reader w[2];

	for (unsigned i = 0; i < 2; i++) {
		w[i] = (struct ws_reader){ .base = kvp_region_addr(R),
					   .first = i,
					   .passes = passes };
		ck_assert_int_eq(
		    pthread_create(&w[i].t, NULL, ws_reader_main, &w[i]), 0);
	}
	for (unsigned i = 0; i < 2; i++)
		pthread_join(w[i].t, NULL);
}

START_TEST(test_readahead_working_set)
{
	size_t bs = 2 * MIB, size = 128 * MIB, ws = 28 * bs;
	struct popts po = { .budget = 64 * MIB,
			    .readahead = 32 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	uint64_t first, settle = 0, last = 1;
	unsigned rounds;

	(void)fx_seeded_region(ST_FILE, size, bs, &po);
	ws_passes(1);
	first = rstats(R).bytes_read_total;
	/* Two passes at a time, so that the readers drift apart as they
	 * do in one long run, until two passes read nothing. */
	for (rounds = 0; last && rounds < 15; rounds++) {
		uint64_t before = rstats(R).bytes_read_total;

		ws_passes(2);
		last = rstats(R).bytes_read_total - before;
		settle += last;
	}
	printf("readahead_working_set %s: first pass read %llu MiB, then "
	       "%llu MiB in %u passes until two read nothing, %llu "
	       "read-ahead blocks wasted\n",
	       kvp_region_install_mode(R), (unsigned long long)(first / MIB),
	       (unsigned long long)(settle / MIB), 2 * rounds,
	       (unsigned long long)rstats(R).readahead_wasted_total);
	ck_assert_uint_ge(first, ws);
	/* Each block of the working set is read again at most once before
	 * it is known (active), and read-ahead around those reads is
	 * bounded: less than two passes' worth in all ... */
	ck_assert_uint_le(settle, 2 * ws);
	/* ... and then nothing.  How many passes that takes depends on how
	 * the readers interleave (with the other CPU busy, 2 to 12). */
	ck_assert_uint_eq(last, 0);
	check_region(R, 0, size, SEED_A);
}
END_TEST

/*
 * A sequential writer reads each block once.  Its blocks leave by
 * write-back, so loads wait for frames while read-ahead is staged ahead
 * of it; before the fix a load took the frame of the oldest staged block,
 * the very next one the writer needed (a read-ahead load did so too), and
 * the touch benchmark's sequential read-write line read 1.13-1.17x what it
 * touched.  Now a load waits for the write-backs in flight, and where it
 * must take a staged block's frame takes the one its stream needs last.
 * With two service threads, a fault's load queued behind read-ahead loads
 * (on either thread) found the write-backs "taken" by them and dropped
 * staged read-ahead: 1-2 blocks read twice in 11 runs of 16.  Now loads a
 * fault asked for go first.  Iterations: move, copy; one thread, two.
 */
START_TEST(test_readahead_writer)
{
	size_t bs = 256 * KIB, size = 64 * MIB;
	struct popts po = { .budget = 8 * MIB,
			    .mode = (_i & 1) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE,
			    .readahead = 2 * MIB,
			    .threads = 1 + (unsigned)(_i >> 1) };
	volatile uint64_t *a;
	struct kvp_stats s;

	a = (volatile uint64_t *)fx_seeded_region(ST_FILE, size, bs, &po);
	for (size_t off = 0; off < size; off += PG)
		a[off / 8] = a[off / 8]; /* dirty, same data */
	s = rstats(R);
	printf("readahead_writer %s, %u thread(s): read %llu MiB of %zu, "
	       "%llu read-ahead blocks, %llu wasted\n",
	       kvp_region_install_mode(R), po.threads,
	       (unsigned long long)(s.bytes_read_total / MIB), size / MIB,
	       (unsigned long long)s.readahead_blocks_total,
	       (unsigned long long)s.readahead_wasted_total);
	ck_assert_uint_gt(s.readahead_blocks_total, size / bs / 2);
	ck_assert_uint_eq(s.readahead_wasted_total, 0);
	ck_assert_uint_eq(s.bytes_read_total, size);
	ck_assert_uint_eq(s.read_errors_total, 0);
	check_region(R, 0, size, SEED_A);
}
END_TEST

/*
 * A prefetch that joins a read-ahead read still in flight ends when the
 * read does.  Before the fix the block kept its read-ahead mark, so the
 * read went to the stage instead of the region, and the prefetch waited
 * until a fault or a frame-hungry load came (here: its 2 s, then
 * -ETIMEDOUT, both blocks still LOADING).
 */
static void *touch_block_1(void *arg)
{
	touch_read(R, *(size_t *)arg, *(size_t *)arg);
	return NULL;
}

START_TEST(test_prefetch_joins_readahead)
{
	size_t bs = 64 * KIB, nb = 64;
	struct kvp_prefetch *pf = NULL;
	uint64_t want[] = { 2, 3 };
	struct kvp_block_info bi;
	pthread_t t;
	int k;

	struct popts po = { .budget = 16 * MIB, .readahead = 1 * MIB };
	/* every I/O takes 50 ms: read-ahead is in flight a while */
	struct kvp_fault_plan plan = { .delay_us = 50000 };

	make_faulty_store(nb * bs);
	store_fill(S0, 0, nb * bs, SEED_A);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(nb * bs, bs, KVP_REGION_FROM_STORE);
	touch_read(R, 0, bs);
	/* the next block, from another thread: a sequential run, so
	 * read-ahead starts past it */
	ck_assert_int_eq(pthread_create(&t, NULL, touch_block_1, &bs), 0);
	for (k = 0; k < 20000; k++) {
		ck_assert_int_eq(kvp_region_block_info(R, 3, &bi), 0);
		if (bi.state == KVP_BLOCK_LOADING)
			break;
		usleep(100);
	}
	ck_assert_int_eq(bi.state, KVP_BLOCK_LOADING);
	ck_assert(!bi.staged);
	ck_assert_int_eq(kvp_prefetch_submit(R, want, 2, &pf), 0);
	ck_assert_int_eq(kvp_prefetch_wait(pf, 2000), 0);
	kvp_prefetch_release(pf);
	pthread_join(t, NULL);
	ck_assert_int_eq(binfo(R, 2).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_RESIDENT);
	check_region(R, 0, 4 * bs, SEED_A);
}
END_TEST

/*
 * A region's destroy never waits for ever on its own loads.  Every frame
 * is pinned: region R2's blocks 0-15 and R's.  A fault on R's block 16
 * waits for a frame with R's read-ahead of 17 and 18 queued behind it,
 * and a prefetch of R2's block 16 waits too.  Destroying R gives up its
 * loads and frees the frames the prefetch needs.  Before the fix the
 * service thread looked only at the load it would serve next, a load
 * asked for (the prefetch, once R's fault was given up): R's read-ahead
 * behind it was never given up, and the destroy waited for it while the
 * prefetch waited for the destroy (5 runs of 5 hung).  Iterations: the
 * fault first, the prefetch first (which hung before the loads asked for
 * went first, too).
 */
static int destroy_pipe[2];

static void *fault_block_16(void *arg)
{
	/* From inside a syscall: EFAULT, not SIGSEGV, once R is gone. */
	ssize_t n = write(destroy_pipe[1], (char *)arg, 4096);

	return (void *)(intptr_t)n;
}

static void *destroy_r(void *arg)
{
	(void)arg;
	kvp_region_destroy(R);
	return NULL;
}

static void wait_loading(struct kvp_region *r, uint64_t blk)
{
	for (int k = 0; k < 5000 && binfo(r, blk).state != KVP_BLOCK_LOADING;
	     k++)
		usleep(1000);
	ck_assert_int_eq(binfo(r, blk).state, KVP_BLOCK_LOADING);
}

START_TEST(test_destroy_behind_asked_load)
{
	size_t bs = 256 * KIB, size = 16 * MIB;
	struct popts po = { .budget = 8 * MIB, .readahead = 2 * MIB,
			    .threads = 1, .exact_budget = true };
	struct kvp_region *r2;
	struct kvp_prefetch *pf;
	uint64_t blk16 = 16;
	struct timespec ts;
	pthread_t t, d;

	make_store(ST_MEM, 2 * size);
	store_fill(S, 0, 2 * size, SEED_A);
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	struct kvp_region_opts o = { .size = size, .block_bytes = bs,
				     .store = S, .store_offset = size,
				     .flags = KVP_REGION_FROM_STORE };

	ck_assert_int_eq(kvp_region_create(P, &o, &r2), 0);
	/* Descending: no read-ahead; then every frame pinned. */
	for (int k = 15; k >= 0; k--) {
		touch_read(r2, (size_t)k * bs, PG);
		touch_read(R, (size_t)k * bs, PG);
	}
	ck_assert_int_eq(kvp_region_pin(r2, 0, 16), 0);
	ck_assert_int_eq(kvp_region_pin(R, 0, 16), 0);
	if (_i) {
		ck_assert_int_eq(kvp_prefetch_submit(r2, &blk16, 1, &pf), 0);
		wait_loading(r2, 16);
	}
	ck_assert_int_eq(pipe(destroy_pipe), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, fault_block_16,
					(char *)kvp_region_addr(R) + 16 * bs),
			 0);
	wait_loading(R, 17); /* read-ahead behind the fault's load */
	if (!_i) {
		ck_assert_int_eq(kvp_prefetch_submit(r2, &blk16, 1, &pf), 0);
		wait_loading(r2, 16);
	}
	ck_assert_int_eq(pthread_create(&d, NULL, destroy_r, NULL), 0);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 5;
	if (pthread_timedjoin_np(d, NULL, &ts)) {
		/* The pager cannot be closed now: leave. */
		fprintf(stderr, "destroy_behind_asked_load: the destroy "
				"hung for 5 s\n");
		_exit(3);
	}
	R = NULL;
	ck_assert_int_eq(kvp_prefetch_wait(pf, 5000), 0);
	kvp_prefetch_release(pf);
	pthread_join(t, NULL);
	ck_assert_int_eq(binfo(r2, 16).state, KVP_BLOCK_RESIDENT);
	/* r2 maps the store from @size on: its pattern runs from there. */
	ck_assert_int_lt(kvp_test_check(kvp_region_addr(r2), 17 * bs,
					SEED_A, size),
			 0);
	kvp_region_destroy(r2);
	close(destroy_pipe[0]);
	close(destroy_pipe[1]);
}
END_TEST

static Suite *pager_prefetch_suite(void)
{
	Suite *s = suite_create("pager_prefetch");
	TCase *t;

	t = fx_tcase(s, "prefetch", 120);
	tcase_add_test(t, test_prefetch_basic);
	tcase_add_test(t, test_prefetch_timeout_cancel);
	tcase_add_test(t, test_pin);
	tcase_add_test(t, test_cold_hint);
	t = fx_tcase(s, "readahead", 120);
	tcase_add_loop_test(t, test_readahead, 0, 2);
	tcase_add_test(t, test_bug_readahead_copy);
	tcase_add_loop_test(t, test_readahead_sparse_runs, 0, 2);
	tcase_add_loop_test(t, test_readahead_working_set, 0, 2);
	tcase_add_loop_test(t, test_readahead_writer, 0, 4);
	tcase_add_test(t, test_prefetch_joins_readahead);
	tcase_add_loop_test(t, test_destroy_behind_asked_load, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_prefetch_suite);
}
