/*
 * test_pager_dirty.c - the paging engine (pager/): a block resident in part
 * keeps the program's writes (its dirty windows) through a fill that ends
 * without its install (the region destroyed meanwhile, a read error), and
 * kvp_region_peek shows them while a fill is in flight.
 *
 * Each test writes one page of a block loaded by fault-around (its window
 * dirty), then makes the pager load more of that block from a slow or
 * failing store.  Both install modes (_i: 0 move, 1 copy).  The fixture
 * and helpers are tests/helpers/pager_fx.c.  The binary exits 77 when this
 * machine cannot open a pager.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pager/pager.h"
#include "tests/helpers/pager_fx.h"

#define BS   (256 * KIB)
#define FA   (16 * KIB)
#define NBLK 64
#define SIZE (NBLK * BS)
#define BLK  5
/* Each store I/O takes this long while a test wants a fill in flight:
 * long enough to act on it on a loaded machine, never timed. */
#define SLOW_US 1500000

/* R over a faulty store on memory (S0 holds SEED_A's pattern), windows of
 * FA around a read fault; returns R's address. */
static char *dirty_region(unsigned mode)
{
	struct popts po = { .budget = 8 * MIB,
			    .mode = mode,
			    .fault_around = FA };

	make_faulty_store(SIZE);
	store_fill(S0, 0, SIZE, SEED_A);
	open_pager(&po);
	R = make_region(SIZE, BS, KVP_REGION_FROM_STORE);
	return kvp_region_addr(R);
}

static void set_plan(uint64_t delay_us, uint64_t fail_off, uint64_t fail_len)
{
	struct kvp_fault_plan plan = { .delay_us = delay_us,
				       .read_fail_off = fail_off,
				       .read_fail_len = fail_len,
				       .read_errno = fail_len ? EIO : 0 };

	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
}

/* Write page 1 of block BLK (SEED_B's pattern): read first, so that the
 * block is resident in part (a window), then written: its window dirty. */
static size_t write_window(char *a)
{
	size_t wr = BLK * BS + PG;

	touch_read(R, wr, PG);
	kvp_test_fill(a + wr, PG, SEED_B, wr);
	ck_assert(binfo(R, BLK).dirty);
	ck_assert_uint_lt(rstats(R).resident_bytes, BS); /* in part */
	return wr;
}

/* Wait (up to 30 s) for block BLK to be LOADING: a fill in flight. */
static void wait_loading(void)
{
	struct kvp_block_info bi;

	for (int i = 0; i < 30000; i++) {
		ck_assert_int_eq(kvp_region_block_info(R, BLK, &bi), 0);
		if (bi.state == KVP_BLOCK_LOADING)
			return;
		usleep(1000);
	}
	ck_abort_msg("no fill of block %d began in 30 s", BLK);
}

/* A page written (its window dirty), then another page of the block
 * dropped (MADV_DONTNEED: the block is made whole, the rest read from the
 * store), then the region destroyed while that read is in flight: destroy
 * gives up the fill, and must still write the dirty window. */
START_TEST(test_destroy_during_fill_keeps_dirty_window)
{
	char *a = dirty_region(_i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE);
	size_t wr = write_window(a), dr = BLK * BS + 8 * FA;
	struct kvp_stats s0 = rstats(R);
	int err;

	set_plan(SLOW_US, 0, 0);
	ck_assert_int_eq(madvise(a + dr, PG, MADV_DONTNEED), 0);
	wait_removed(R, s0.removed_bytes_total + PG);
	wait_loading();
	err = kvp_region_destroy(R);
	R = NULL;
	ck_assert_int_eq(err, 0);
	ck_assert_msg(store_check(S0, wr, PG, SEED_B) == -1,
		      "destroy during a fill lost the write to a dirty window");
}
END_TEST

static sigjmp_buf bus_jb;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(bus_jb, 1);
}

/* A page written (its window dirty), then a read of another window of the
 * block that the store fails: the reader gets SIGBUS, the block is
 * poisoned, but the write before it reaches the store, and nothing is left
 * counted unwritten. */
START_TEST(test_fill_read_error_keeps_dirty_window)
{
	char *a = dirty_region(_i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE);
	size_t wr = write_window(a), rd = BLK * BS + 8 * FA;
	struct sigaction sa = { .sa_handler = on_sigbus }, old;
	volatile int bus = 0;
	struct kvp_block_info bi;

	set_plan(0, rd, FA);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old);
	if (sigsetjmp(bus_jb, 1) == 0)
		(void)*(volatile uint64_t *)(a + rd);
	else
		bus = 1;
	sigaction(SIGBUS, &old, NULL);
	ck_assert_msg(bus, "no SIGBUS reading a window whose read failed");
	ck_assert_int_eq(kvp_region_block_info(R, BLK, &bi), 0);
	ck_assert_int_eq(bi.state, KVP_BLOCK_POISONED);
	ck_assert_msg(store_check(S0, wr, PG, SEED_B) == -1,
		      "a read error in a fill lost the write to a dirty "
		      "window");
	set_plan(0, 0, 0);
	ck_assert_int_eq(kvp_region_flush(R), 0);
	ck_assert_uint_eq(rstats(R).unwritten_bytes, 0);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S0, wr, PG, SEED_B), -1);
}
END_TEST

struct reader {
	char *a;
	size_t off;
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;

	(void)*(volatile uint64_t *)(rd->a + rd->off);
	return NULL;
}

/* kvp_region_peek of a block dirty in a window while a fill of another
 * window is in flight (LOADING): the peek shows the write. */
START_TEST(test_peek_during_fill_sees_dirty_window)
{
	char *a = dirty_region(_i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE);
	size_t wr = write_window(a);
	struct reader rd = { a, BLK * BS + 8 * FA };
	char *buf = kvp_test_xalloc(BS);
	pthread_t t;

	set_plan(SLOW_US, 0, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, reader_main, &rd), 0);
	wait_loading();
	/* That read stays slow; the peek's own faults (the pages the block
	 * lacks once the fill is in) need not be. */
	set_plan(0, 0, 0);
	ck_assert_int_eq(kvp_region_peek(R, BLK, buf), 0);
	pthread_join(t, NULL);
	ck_assert_msg(kvp_test_check(buf + PG, PG, SEED_B, wr) == -1,
		      "peek during a fill returned the store's bytes, not "
		      "the program's write");
	/* The rest of the block is the store's. */
	ck_assert_int_eq(kvp_test_check(buf + 2 * PG, BS - 2 * PG, SEED_A,
					BLK * BS + 2 * PG),
			 -1);
	free(buf);
}
END_TEST

/* A read fault loads a window of block BLK (slow), the program drops a
 * page elsewhere in the block meanwhile: the window goes in and the block
 * is made whole (dirty beyond its windows: the dropped page's zeros), and
 * the region is destroyed while that read is in flight.  Destroy writes
 * the block as the program sees it: the dropped page zeros, the rest the
 * store's bytes (never zeros where the block lacked pages). */
START_TEST(test_destroy_during_drop_fill_keeps_store)
{
	char *a = dirty_region(_i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE);
	struct reader rd = { a, BLK * BS + 8 * FA };
	size_t dr = BLK * BS + PG;
	struct kvp_stats s0 = rstats(R);
	static char page[PG] __attribute__((aligned(4096)));
	pthread_t t;
	int err;

	set_plan(SLOW_US, 0, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, reader_main, &rd), 0);
	wait_loading();
	ck_assert_int_eq(madvise(a + dr, PG, MADV_DONTNEED), 0);
	wait_removed(R, s0.removed_bytes_total + PG);
	pthread_join(t, NULL); /* the window is in: the rest loading */
	err = kvp_region_destroy(R);
	R = NULL;
	ck_assert_int_eq(err, 0);
	ck_assert_msg(store_check(S0, BLK * BS, PG, SEED_A) == -1 &&
			  store_check(S0, dr + PG, BS - 2 * PG, SEED_A) == -1,
		      "destroy during a fill wrote the pages the block lacked "
		      "(zeros) over the store's");
	/* The drop is a write of zeros, and reaches the store too. */
	ck_assert_int_eq(kvp_store_pread(S0, page, PG, dr), 0);
	ck_assert_msg(kvp_test_is_zero(page, PG),
		      "destroy during a fill lost the zeros of a drop");
}
END_TEST

static Suite *pager_dirty_suite(void)
{
	Suite *s = suite_create("pager_dirty");
	TCase *t = fx_tcase(s, "fill", 120);

	tcase_add_loop_test(t, test_destroy_during_fill_keeps_dirty_window, 0,
			    2);
	tcase_add_loop_test(t, test_fill_read_error_keeps_dirty_window, 0, 2);
	tcase_add_loop_test(t, test_peek_during_fill_sees_dirty_window, 0, 2);
	tcase_add_loop_test(t, test_destroy_during_drop_fill_keeps_store, 0,
			    2);
	return s;
}

int main(void)
{
	return fx_main(pager_dirty_suite);
}
