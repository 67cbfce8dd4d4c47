/*
 * test_pager_errors.c - the paging engine (pager/): store errors: a failed read is SIGBUS, never a hang; a failed write-back keeps the data.
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
	static const char m[] = "test_pager: an access neither returned nor "
				"raised SIGBUS in 30 s: the thread hangs\n";
	(void)sig;
	(void)!write(2, m, sizeof(m) - 1);
	_exit(3);
}

/* Read @p, or write @v there if @write; true if that raised SIGBUS.  A
 * hang ends the test (alarm). */
static bool access_bus(volatile char *p, bool write, char v, uint64_t *ms)
{
	struct sigaction sa = { .sa_handler = on_sigbus }, old, olda;
	struct sigaction al = { .sa_handler = on_alarm };
	uint64_t t0 = (kvp_test_now_ns() / 1000000);
	bool bus;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old);
	sigaction(SIGALRM, &al, &olda);
	bus_seen = 0;
	alarm(30);
	if (sigsetjmp(bus_jb, 1) == 0) {
		if (write)
			*p = v;
		else
			(void)*p;
	}
	alarm(0);
	bus = bus_seen;
	sigaction(SIGBUS, &old, NULL);
	sigaction(SIGALRM, &olda, NULL);
	if (ms)
		*ms = (kvp_test_now_ns() / 1000000) - t0;
	return bus;
}

static bool touch_bus(volatile char *p, uint64_t *ms)
{
	return access_bus(p, false, 0, ms);
}

/* Fault-around: a fill of a block resident in part whose read fails.  The
 * reader gets SIGBUS; a writer to a page the block has, which waits on
 * the fill, is woken and its write goes on: never a hang. */
static volatile char *fill_writer_at;

static void *fill_writer_main(void *arg)
{
	(void)arg;
	usleep(50000); /* while the failing fill is in flight */
	*fill_writer_at = 7;
	return NULL;
}

START_TEST(test_fill_read_error)
{
	size_t bs = 256 * KIB, size = 16 * bs, fa = 16 * KIB;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .fault_around = fa };
	struct kvp_fault_plan plan = { 0 };
	pthread_t t;
	char *a;

	a = fx_faulty_region(size, bs, &po);
	(void)*(volatile char *)(a + 3 * bs); /* block 3's first window */
	(void)binfo(R, 3);
	plan.read_errno = EIO;
	plan.read_fail_off = 3 * bs + 8 * fa;
	plan.read_fail_len = fa;
	plan.delay_us = 200000;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	fill_writer_at = a + 3 * bs + 100;
	ck_assert_int_eq(pthread_create(&t, NULL, fill_writer_main, NULL), 0);
	ck_assert_msg(touch_bus(a + 3 * bs + 8 * fa, NULL),
		      "no SIGBUS reading a window whose read failed");
	pthread_join(t, NULL); /* a writer never woken hangs here */
	ck_assert_int_eq(a[3 * bs + 100], 7);
	ck_assert_uint_eq(rstats(R).read_errors_total, 1);
	/* That write is never stored: a flush says so (it returned 0). */
	ck_assert_int_eq(kvp_region_flush(R), -EIO);
}
END_TEST

/*
 * DISCARD of a poisoned block one of whose kept pages the program locked:
 * the drop of its poison markers stopped at the locked page's VMA
 * (MADV_DONTNEED refuses locked pages), so once the store read again the
 * pages past it still raised SIGBUS.
 */
START_TEST(test_discard_poisoned_locked)
{
	size_t bs = 256 * KIB, size = 16 * bs, fa = 16 * KIB;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .fault_around = fa };
	struct kvp_fault_plan plan = { .read_errno = EIO,
				       .read_fail_off = 3 * bs + 8 * fa,
				       .read_fail_len = fa };
	char *a = fx_faulty_region(size, bs, &po);

	(void)*(volatile char *)(a + 3 * bs); /* block 3's first window */
	(void)binfo(R, 3);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert(touch_bus(a + 3 * bs + 8 * fa, NULL));
	ck_assert_int_eq(binfo(R, 3).state, KVP_BLOCK_POISONED);
	ck_assert_int_eq(kvp_test_mlock(a + 3 * bs + PG, PG), 0);
	plan.read_errno = 0;
	plan.read_fail_len = 0;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(kvp_region_advise(R, 3, 1, KVP_ADVICE_DISCARD), 0);
	ck_assert_int_eq(kvp_test_munlock(a + 3 * bs + PG, PG), 0);
	ck_assert_msg(!touch_bus(a + 3 * bs + 8 * fa, NULL),
		      "SIGBUS past a locked page after DISCARD");
	ck_assert(kvp_test_is_zero(a + 3 * bs, bs));
}
END_TEST

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
	bi = binfo(R, 5);
	ck_assert_int_eq(bi.state, KVP_BLOCK_POISONED);
	s = rstats(R);
	/* Poisoned at the first failure, not after retries of it. */
	ck_assert_uint_eq(s.read_errors_total, 1);
	ck_assert_uint_eq(s.poisoned_blocks, 1);
	/* Again, on another page of it, and a write: SIGBUS at once. */
	ck_assert(touch_bus(a + 5 * bs + bs - 8, NULL));
	ck_assert(touch_bus(a + 5 * bs + 3 * PG, NULL));
	/* Other blocks are served, before and after it. */
	check_region(R, 0, 5 * bs, SEED_A);
	check_region(R, 6 * bs, size - 6 * bs, SEED_A);
	ck_assert_uint_eq(rstats(R).poisoned_blocks, 1);
	/* peek says EIO; a prefetch of it fails. */
	buf = kvp_test_xalloc(bs);
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

/* _i: bit 0 at destroy, else by flush; bit 1 copy, else move; bit 2
 * blocks of 2 MiB (a copy-mode one is written from a huge page its
 * pages were copied into, evict.c's gather, and put back from there). */
START_TEST(test_writeback_failure)
{
	bool big = _i & 4;
	size_t bs = big ? 2 * MIB : 64 * KIB;
	uint64_t budget = big ? 16 * MIB : 4 * MIB;
	size_t size = 2 * budget, dirty = budget / 2;
	bool at_destroy = _i & 1;
	struct popts po = { .budget = budget,
			    .mode = (_i & 2) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .write_errno = ENOSPC };
	struct kvp_stats s;
	char *a;

	a = fx_faulty_region(size, bs, &po);
	/* Half the budget dirty, then the store refuses writes. */
	kvp_test_fill(a, dirty, SEED_B, 0);
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
/* a store that refuses writes never hangs a program */

/*
 * Write the pattern of @seed over [from, to) of R block by block, each
 * block's first byte written alone first (its fault) and timed: the
 * longest goes to *max_ns.  Returns the offset of the block whose fault
 * raised SIGBUS, or @to when none did.
 */
static size_t write_blocks(size_t from, size_t to, uint64_t seed,
			   uint64_t *max_ns)
{
	char *a = kvp_region_addr(R);
	size_t bs = kvp_region_block_bytes(R);
	char first[8];

	for (size_t off = from; off < to; off += bs) {
		uint64_t t0 = kvp_test_now_ns(), ns;

		kvp_test_fill(first, sizeof(first), seed, off);
		if (access_bus(a + off, true, first[0], NULL))
			return off;
		ns = kvp_test_now_ns() - t0;
		if (max_ns && ns > *max_ns)
			*max_ns = ns;
		kvp_test_fill(a + off, bs, seed, off);
	}
	return to;
}

/* Wait up to 30 s for the region's unwritten_bytes to reach 0. */
static uint64_t wait_written(void)
{
	uint64_t v = 0;

	for (int k = 0; k < 3000; k++) {
		v = rstats(R).unwritten_bytes;
		if (!v)
			break;
		usleep(10000);
	}
	return v;
}

/*
 * Dirty data past the budget while the store refuses every write: the
 * faults are served from the overdraft (no hang, nothing dropped), the
 * failures are counted, and when the store recovers the back-off's retry
 * writes the blocks back by itself.  Without the fix the writer waited
 * in the kernel for ever once the budget held only unwritable blocks.
 */
START_TEST(test_writeback_stall)
{
	size_t bs = 64 * KIB;
	uint64_t budget = 8 * MIB, cap = 4 * MIB; /* the overdraft's floor */
	size_t size = 32 * MIB, dirty = budget + cap / 2;
	struct popts po = { .budget = budget,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .write_errno = EIO };
	uint64_t max_ns = 0;
	struct kvp_stats s;

	make_faulty_store(size);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(size, bs, 0);
	ck_assert_uint_eq(write_blocks(0, dirty, SEED_B, &max_ns), dirty);
	printf("writeback_stall %s: longest fault with writes failing: "
	       "%.1f ms\n",
	       kvp_region_install_mode(R), (double)max_ns / 1e6);
	s = rstats(R);
	ck_assert_uint_gt(s.write_errors_total, 0);
	ck_assert_uint_gt(s.overdraft_loads_total, 0);
	ck_assert_uint_eq(s.unservable_faults_total, 0);
	ck_assert_uint_gt(s.unwritten_bytes, 0);
	ck_assert_uint_eq(s.evictions_dirty_total, 0);
	check_region(R, 0, dirty, SEED_B);

	/* The store recovers: more faults need frames, the retries write
	 * the old blocks back, and every byte reaches the store. */
	plan.write_errno = 0;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_uint_eq(write_blocks(dirty, size, SEED_B, NULL), size);
	ck_assert_uint_eq(wait_written(), 0);
	s = rstats(R);
	ck_assert_uint_gt(s.evictions_dirty_total, 0);
	ck_assert_uint_eq(s.unservable_faults_total, 0);
	check_region(R, 0, size, SEED_B);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S0, 0, size, SEED_B), -1);
}
END_TEST

/*
 * Past the budget and its overdraft, with every write refused, a fault
 * gets SIGBUS (bounded, never a hang) and its block is poisoned; nothing
 * written before is lost, and after the store recovers the poisoned
 * block is usable again once dropped.
 */
START_TEST(test_writeback_stall_sigbus)
{
	size_t bs = 64 * KIB;
	uint64_t budget = 8 * MIB, cap = 4 * MIB;
	size_t size = 32 * MIB, bus;
	struct popts po = { .budget = budget,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .write_errno = ENOSPC };
	uint64_t max_ns = 0;

	make_faulty_store(size);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	open_pager(&po);
	R = make_region(size, bs, 0);
	bus = write_blocks(0, size, SEED_B, &max_ns);
	printf("writeback_stall_sigbus %s: SIGBUS at %zu MiB, longest fault "
	       "before it %.1f ms\n",
	       kvp_region_install_mode(R), bus / MIB, (double)max_ns / 1e6);
	ck_assert_uint_ge(bus, budget);
	ck_assert_uint_le(bus, budget + cap + bs);
	ck_assert_uint_eq(rstats(R).unservable_faults_total, 1);
	ck_assert_int_eq(binfo(R, bus / bs).state, KVP_BLOCK_POISONED);
	check_region(R, 0, bus, SEED_B);

	plan.write_errno = 0;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(kvp_region_advise(R, bus / bs, 1, KVP_ADVICE_DISCARD),
			 0);
	ck_assert_uint_eq(write_blocks(bus, size, SEED_B, NULL), size);
	check_region(R, 0, size, SEED_B);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S0, 0, size, SEED_B), -1);
}
END_TEST

/*
 * A flush that returns 0 leaves every byte written before it in the store,
 * a block's on its way out by eviction too (its write-back in flight, here
 * held 300 ms by the store): before, the flush passed over such a block
 * and returned at once, and a write that then failed left the block's
 * only copy in RAM.
 */
static void *touch_main(void *arg)
{
	(void)*(volatile char *)arg;
	return NULL;
}

START_TEST(test_flush_waits_for_writeback)
{
	size_t bs = 64 * KIB, size = 64 * bs;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .exact_budget = true };
	struct kvp_fault_plan plan = { .delay_us = 300000 };
	struct kvp_block_info bi;
	pthread_t t;
	char *a;

	a = fx_faulty_region(size, bs, &po);
	kvp_test_fill(a, bs, SEED_B, 0); /* block 0, dirty */
	check_region(R, bs, 2 * MIB - bs, SEED_A); /* the budget full */
	settle(R);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD), 0);
	/* A fault past the budget: block 0 leaves, its write held. */
	ck_assert_int_eq(pthread_create(&t, NULL, touch_main, a + 40 * bs), 0);
	await_state(R, 0, KVP_BLOCK_EVICTING, "block 0 did not leave");
	ck_assert_int_eq(kvp_region_flush(R), 0);
	/* (This store writes through at once and holds the completion: the
	 * write is done only once the block is out.) */
	ck_assert_int_eq(kvp_region_block_info(R, 0, &bi), 0);
	ck_assert_msg(bi.state != KVP_BLOCK_EVICTING,
		      "the flush returned with block 0's write in flight");
	ck_assert_int_eq(store_check(S0, 0, bs, SEED_B), -1);
	pthread_join(t, NULL);
	plan.delay_us = 0;
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	check_region(R, 0, bs, SEED_B);
}
END_TEST

/* The same for a block another flush is writing (held 300 ms): the second
 * flush saw it clean and returned before that write was in (found by a
 * soak). */
static void *flush_main(void *arg)
{
	*(int *)arg = kvp_region_flush(R);
	return NULL;
}

START_TEST(test_flush_waits_for_flush)
{
	size_t bs = 64 * KIB, size = 16 * bs;
	struct popts po = { .budget = 4 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .delay_us = 300000 };
	struct kvp_block_info bi;
	pthread_t t;
	int rc = -1, k;
	char *a;

	a = fx_faulty_region(size, bs, &po);
	kvp_test_fill(a, bs, SEED_B, 0); /* block 0, dirty */
	ck_assert(binfo(R, 0).dirty);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, flush_main, &rc), 0);
	for (k = 0; k < 2000; k++) { /* the first flush took it */
		ck_assert_int_eq(kvp_region_block_info(R, 0, &bi), 0);
		if (!bi.dirty)
			break;
		usleep(500);
	}
	ck_assert_msg(!bi.dirty, "the first flush did not take block 0");
	ck_assert_int_eq(kvp_region_flush(R), 0);
	ck_assert_msg(store_check(S0, 0, bs, SEED_B) == -1,
		      "the second flush returned before block 0 was in");
	pthread_join(t, NULL);
	ck_assert_int_eq(rc, 0);
}
END_TEST

static Suite *pager_errors_suite(void)
{
	Suite *s = suite_create("pager_errors");
	TCase *t;

	t = fx_tcase(s, "errors", 120);
	tcase_add_loop_test(t, test_read_error_sigbus, 0, 4);
	tcase_add_loop_test(t, test_fill_read_error, 0, 2);
	tcase_add_loop_test(t, test_discard_poisoned_locked, 0, 2);
	tcase_add_test(t, test_read_error_threads);
	tcase_add_loop_test(t, test_writeback_failure, 0, 8);
	t = fx_tcase(s, "writeback_stall", 120);
	tcase_add_loop_test(t, test_writeback_stall, 0, 2);
	tcase_add_loop_test(t, test_writeback_stall_sigbus, 0, 2);
	tcase_add_loop_test(t, test_flush_waits_for_writeback, 0, 2);
	tcase_add_loop_test(t, test_flush_waits_for_flush, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_errors_suite);
}
