/*
 * test_pager_drop.c - the paging engine (pager/): the program's drops: MADV_DONTNEED, munmap and DISCARD over blocks in every state read back as zeros.
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
#include "pager/pager_i.h"
#include "tests/helpers/pager_fx.h"

/* ------------------------------------------------------------------ */
/* REMOVE and UNMAP */

START_TEST(test_remove_whole_block)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;
	struct kvp_stats s0, s1;

	a = fx_seeded_region(ST_MEM, size, bs, &po);
	/* Block 3 resident (clean), block 4 resident and dirty. */
	check_region(R, 3 * bs, 2 * bs, SEED_A);
	kvp_test_fill(a + 4 * bs, bs, SEED_B, 4 * bs);
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_RESIDENT);
	ck_assert(binfo(R, 4).dirty);
	settle(R);
	s0 = rstats(R);
	ck_assert_int_eq(madvise(a + 3 * bs, 2 * bs, MADV_DONTNEED), 0);
	/* Block 7 never loaded: dropped whole too. */
	ck_assert_int_eq(madvise(a + 7 * bs, bs, MADV_DONTNEED), 0);
	ck_assert(kvp_test_is_zero(a + 3 * bs, 2 * bs));
	ck_assert(kvp_test_is_zero(a + 7 * bs, bs));
	s1 = rstats(R);
	ck_assert_uint_eq(s1.bytes_read_total, s0.bytes_read_total);
	ck_assert_uint_ge(wait_removed(R, s0.removed_bytes_total + 3 * bs),
			  s0.removed_bytes_total + 3 * bs);
	/* Still zeros after being pushed out and faulted in again. */
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 3).state, KVP_BLOCK_RESIDENT);
	ck_assert(kvp_test_is_zero(a + 3 * bs, 2 * bs));
	ck_assert(kvp_test_is_zero(a + 7 * bs, bs));
	ck_assert_uint_eq(rstats(R).bytes_read_total, s0.bytes_read_total);
	/* Neighbours untouched. */
	check_region(R, 2 * bs, bs, SEED_A);
	check_region(R, 5 * bs, 2 * bs, SEED_A);
	check_region(R, 8 * bs, bs, SEED_A);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	/* Nothing of the dropped blocks was written back as data. */
	char *buf = kvp_test_xalloc(bs);

	ck_assert_int_eq(kvp_store_pread(S, buf, bs, 4 * bs), 0);
	ck_assert_int_ne(kvp_test_check(buf, bs, SEED_B, 4 * bs), -1);
	free(buf);
}
END_TEST

/*
 * madvise returns once its REMOVE is read, and the kernel zaps the range
 * after that: a move that evicts the block in between takes the dropped
 * page with its bytes, the zap finds nothing, and the store's bytes come
 * back where the program reads zeros.  MADV_FREE raises the same REMOVE
 * and leaves the page there, a zap that does not come: block 2 is no
 * victim while it waits (the wait set to a minute), and leaves once the
 * page is gone (a DONTNEED now), zeros there.  _i 2-3: past the wait (set
 * to none), a page still there is MADV_FREE's, and a write made to it
 * after the free is kept.  _i odd: copy mode.
 */
START_TEST(test_dropped_page_still_there)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	size_t pg3 = 2 * bs + 3 * PG, pg5 = 2 * bs + 5 * PG;
	struct popts opts = { .budget = 4 * MIB,
			      .mode = (_i & 1) ? KVP_INSTALL_COPY
					       : KVP_INSTALL_MOVE };
	bool past = _i >= 2;
	char *a = fx_seeded_region(ST_MEM, size, bs, &opts);
	uint64_t removed = rstats(R).removed_bytes_total;

	kvp_zap_wait_ns = past ? 0 : 60 * 1000000000ull;
	kvp_test_fill(a + pg5, PG, SEED_B, pg5);
	ck_assert_int_eq(madvise(a + pg3, PG, MADV_FREE), 0);
	ck_assert_uint_ge(wait_removed(R, removed + PG), removed + PG);
	if (past) {
		kvp_test_fill(a + pg3, PG, SEED_B, pg3);
	} else {
		push_out(R, 4 * MIB);
		ck_assert_msg(binfo(R, 2).state == KVP_BLOCK_RESIDENT,
			      "block 2 left with a dropped page still there");
		ck_assert_int_eq(madvise(a + pg3, PG, MADV_DONTNEED), 0);
	}
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 2).state, KVP_BLOCK_RESIDENT);
	if (past)
		check_region(R, pg3, PG, SEED_B);
	else
		ck_assert(kvp_test_is_zero(a + pg3, PG));
	check_region(R, pg5, PG, SEED_B);
	check_region(R, 2 * bs, 3 * PG, SEED_A);
	check_region(R, 2 * bs + 6 * PG, bs - 6 * PG, SEED_A);
}
END_TEST

/* A page dropped from a resident block reads as zeros (a hole, filled
 * writable at its next fault); the block is dirty.  A flush stores it
 * (reading the hole, which fills it) and counted it clean: a write to
 * that page after the flush went unseen, and the clean block left without
 * it.  A block with holes stays dirty after its write-back. */
START_TEST(test_write_to_hole_after_flush)
{
	size_t bs = 64 * KIB, size = 64 * bs, po = 2 * bs + 7 * PG;
	struct popts opts = { .budget = 4 * MIB,
			      .mode = _i ? KVP_INSTALL_COPY
					 : KVP_INSTALL_MOVE };
	char *a = fx_seeded_region(ST_MEM, size, bs, &opts);

	check_region(R, 2 * bs, bs, SEED_A);
	ck_assert_int_eq(madvise(a + po, PG, MADV_DONTNEED), 0);
	ck_assert_uint_ge(wait_removed(R, PG), PG);
	ck_assert_int_eq(kvp_region_flush(R), 0);
	kvp_test_fill(a + po, PG, SEED_B, po);
	ck_assert(binfo(R, 2).dirty);
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 2).state, KVP_BLOCK_RESIDENT);
	check_region(R, po, PG, SEED_B);
	check_region(R, 2 * bs, 7 * PG, SEED_A);
}
END_TEST

START_TEST(test_remove_part_of_block)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;

	a = fx_seeded_region(ST_MEM, size, bs, &po);
	/* Resident block 2: drop its 4th and 5th pages. */
	check_region(R, 2 * bs, bs, SEED_A);
	ck_assert_int_eq(madvise(a + 2 * bs + 3 * PG, 2 * PG, MADV_DONTNEED),
			 0);
	ck_assert(kvp_test_is_zero(a + 2 * bs + 3 * PG, 2 * PG));
	check_region(R, 2 * bs, 3 * PG, SEED_A);
	check_region(R, 2 * bs + 5 * PG, bs - 5 * PG, SEED_A);
	/* Never-loaded block 9: drop its first page. */
	ck_assert_int_eq(madvise(a + 9 * bs, PG, MADV_DONTNEED), 0);
	ck_assert(kvp_test_is_zero(a + 9 * bs, PG));
	check_region(R, 9 * bs + PG, bs - PG, SEED_A);
	/* Both survive eviction and a reload. */
	push_out(R, 4 * MIB);
	ck_assert_int_ne(binfo(R, 2).state, KVP_BLOCK_RESIDENT);
	ck_assert(kvp_test_is_zero(a + 2 * bs + 3 * PG, 2 * PG));
	check_region(R, 2 * bs, 3 * PG, SEED_A);
	check_region(R, 2 * bs + 5 * PG, bs - 5 * PG, SEED_A);
	ck_assert(kvp_test_is_zero(a + 9 * bs, PG));
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
 * store.  The write is held 300 ms so that the drops land during it.
 * _i: bit 0 copy, else move; bit 1 blocks of 2 MiB (a copy-mode one is
 * written from a huge page its pages were copied into, evict.c's
 * gather, and written again from there, zeroed).
 */
START_TEST(test_remove_during_writeback)
{
	size_t bs = (_i & 2) ? 2 * MIB : 64 * KIB, nb = 64;
	struct popts po = { .budget = 32 * bs,
			    .mode = (_i & 1) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE,
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
	kvp_test_fill(a + 2 * bs, bs, SEED_B, 2 * bs);
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
	/* A second drop, apart from the first: the pages between the two
	 * keep their data (they were zeroed with the span of both). */
	ck_assert_int_eq(madvise(a + 2 * bs + 10 * PG, 2 * PG, MADV_DONTNEED),
			 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(binfo(R, 2).state, KVP_BLOCK_ABSENT);
	/* Loaded from the store again: the dropped pages zero, the rest
	 * kept. */
	ck_assert(kvp_test_is_zero(a + 2 * bs + 5 * PG, 3 * PG));
	ck_assert(kvp_test_is_zero(a + 2 * bs + 10 * PG, 2 * PG));
	check_region(R, 2 * bs, 5 * PG, SEED_B);
	check_region(R, 2 * bs + 8 * PG, 2 * PG, SEED_B);
	check_region(R, 2 * bs + 12 * PG, bs - 12 * PG, SEED_B);
}
END_TEST

/*
 * All of a block dropped while its load waits for a frame (the budget is
 * full of pinned blocks): the load is given up, and the block must read
 * zeros from then on.  It read the store's data again: giving the load up
 * forgot the drop.
 */
START_TEST(test_remove_while_waiting_for_frame)
{
	size_t bs = 64 * KIB, nb = 64;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .exact_budget = true };
	struct kvp_block_info bi;
	pthread_t t;
	char *a;
	int k;

	a = fx_seeded_region(ST_MEM, nb * bs, bs, &po);
	touch_read(R, 0, 32 * bs);
	ck_assert_int_eq(kvp_region_pin(R, 0, 32), 0); /* the budget */
	ck_assert_int_eq(pthread_create(&t, NULL, touch_block_main,
					(void *)(uintptr_t)(40 * bs)),
			 0);
	/* (block_info, not binfo: that one waits for LOADING to end) */
	for (k = 0; k < 10000; k++) {
		ck_assert_int_eq(kvp_region_block_info(R, 40, &bi), 0);
		if (bi.state == KVP_BLOCK_LOADING)
			break;
		usleep(1000);
	}
	ck_assert_int_eq(bi.state, KVP_BLOCK_LOADING);
	ck_assert_int_eq(madvise(a + 40 * bs, bs, MADV_DONTNEED), 0);
	usleep(50000);
	ck_assert_int_eq(kvp_region_unpin(R, 0, 32), 0);
	pthread_join(t, NULL);
	ck_assert(kvp_test_is_zero(a + 40 * bs, bs));
	check_region(R, 41 * bs, 8 * bs, SEED_A);
}
END_TEST

/*
 * Part of a read-ahead block dropped while it is staged (read, waiting for
 * its first fault): then frames are needed and the stage is emptied.  The
 * dropped pages must read zeros and the rest the store's data; the drop
 * was noted in the staged load and lost with it.
 */
START_TEST(test_remove_part_of_staged)
{
	size_t bs = 64 * KIB, nb = 128;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 2 * bs };
	struct kvp_block_info bi;
	char *a;
	int k;

	a = fx_seeded_region(ST_MEM, nb * bs, bs, &po);
	/* Two faults in a row: blocks 2 and 3 are read ahead, staged. */
	touch_read(R, 0, 2 * bs);
	for (k = 0; k < 10000; k++) {
		ck_assert_int_eq(kvp_region_block_info(R, 3, &bi), 0);
		if (bi.state == KVP_BLOCK_LOADING &&
		    rstats(R).bytes_read_total >= 4 * bs)
			break;
		usleep(1000);
	}
	ck_assert_int_eq(bi.state, KVP_BLOCK_LOADING);
	ck_assert_int_eq(madvise(a + 3 * bs, 4 * PG, MADV_DONTNEED), 0);
	/* Frames for blocks far away, backwards (no read-ahead): the
	 * budget twice over, so that every staged block is dropped. */
	for (size_t b = nb - 1; b >= nb - 64; b--)
		touch_read(R, b * bs, bs);
	ck_assert(kvp_test_is_zero(a + 3 * bs, 4 * PG));
	check_region(R, 3 * bs + 4 * PG, bs - 4 * PG, SEED_A);
	check_region(R, 2 * bs, bs, SEED_A);
}
END_TEST

START_TEST(test_unmap)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	char *a;

	a = fx_seeded_region(ST_MEM, size, bs, &po);
	/* Blocks 4..7 resident and dirty, then unmapped; 20..23 never loaded,
	 * unmapped; the last two blocks unmapped. */
	kvp_test_fill(a + 4 * bs, 4 * bs, SEED_B, 4 * bs);
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
	kvp_test_fill(a + 30 * bs, bs, SEED_B, 30 * bs);
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

	a = fx_seeded_region(ST_MEM, size, bs, &po);
	kvp_test_fill(a + 3 * bs, bs, SEED_B, 3 * bs);
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

/*
 * A dirty block the program unmapped in part: its last page (0) or its
 * first (1).  UFFDIO_MOVE refuses a range that crosses the end of its
 * source mapping with EINVAL, not ENOENT as where the range starts in
 * the hole, so eviction's detach must go page by page on both: else the
 * block was given up on every clock round, never left, and held its
 * memory.
 */
START_TEST(test_evict_block_unmapped_in_part)
{
	size_t bs = 64 * KIB, size = 64 * bs, lo = 0, hi = bs;
	struct popts po = { .budget = 2 * MIB };
	char *a, *b;

	a = fx_seeded_region(ST_MEM, size, bs, &po);
	b = a + 3 * bs;
	kvp_test_fill(b, bs, SEED_B, 3 * bs);
	if (_i == 0) {
		ck_assert_int_eq(munmap(b + bs - PG, PG), 0);
		hi = bs - PG;
	} else {
		ck_assert_int_eq(munmap(b, PG), 0);
		lo = PG;
	}
	wait_removed(R, PG);
	ck_assert(binfo(R, 3).dirty);
	push_out(R, 2 * MIB);
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_ABSENT);
	check_region(R, 3 * bs + lo, hi - lo, SEED_B);
	ck_assert_int_eq(store_check(S, 3 * bs + lo, hi - lo, SEED_B), -1);
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
	kvp_test_fill(a + 10 * bs, bs, SEED_B, 10 * bs);
	ck_assert_int_eq(kvp_region_advise(R, 10, 1, KVP_ADVICE_COLD), 0);
	touch_read(R, 20 * bs, 40 * bs);
	ck_assert_int_eq(binfo(R, 10).state, KVP_BLOCK_ABSENT);
	ck_assert(binfo(R, 10).in_store);
	kvp_test_fill(a + 4 * bs, bs, SEED_B, 4 * bs);
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
	ck_assert(kvp_test_is_zero(a + 4 * bs, bs));
	ck_assert(kvp_test_is_zero(a + 6 * bs, bs));
	ck_assert(kvp_test_is_zero(a + 8 * bs, bs));
	ck_assert(kvp_test_is_zero(a + 10 * bs, bs));
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
	ck_assert(kvp_test_is_zero(a + 4 * bs, bs));
	ck_assert(kvp_test_is_zero(a + 10 * bs, bs));
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
		lost += !kvp_test_is_zero(p, bs);
	}
	ck_assert_msg(!lost, "%u of %zu discards right after a fault lost",
		      lost, nb);
}
END_TEST

static Suite *pager_drop_suite(void)
{
	Suite *s = suite_create("pager_drop");
	TCase *t;

	t = fx_tcase(s, "remove_unmap", 120);
	tcase_add_loop_test(t, test_remove_whole_block, 0, 2);
	tcase_add_loop_test(t, test_remove_part_of_block, 0, 2);
	tcase_add_loop_test(t, test_dropped_page_still_there, 0, 4);
	tcase_add_loop_test(t, test_write_to_hole_after_flush, 0, 2);
	tcase_add_loop_test(t, test_remove_during_writeback, 0, 4);
	tcase_add_loop_test(t, test_remove_while_waiting_for_frame, 0, 2);
	tcase_add_loop_test(t, test_remove_part_of_staged, 0, 2);
	tcase_add_loop_test(t, test_unmap, 0, 2);
	tcase_add_test(t, test_unmap_part_of_block);
	tcase_add_loop_test(t, test_evict_block_unmapped_in_part, 0, 2);
	t = fx_tcase(s, "discard", 120);
	tcase_add_test(t, test_discard);
	tcase_add_test(t, test_bug_discard_after_fault);
	return s;
}

int main(void)
{
	return fx_main(pager_drop_suite);
}
