/*
 * pager_fx.c - the fixture and helpers the pager suites share; see
 * pager_fx.h.
 */
#include "tests/helpers/pager_fx.h"

#include "tests/helpers/helpers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct kvp_pager *P;
struct kvp_region *R;
struct kvp_store *S;  /* what regions use */
struct kvp_store *S0; /* the inner store under a faulty one */

void fx_setup(void)
{
	P = NULL;
	R = NULL;
	S = S0 = NULL;
}

void fx_teardown(void)
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

/* Write the pattern over the store range [off, off+len). */
void store_fill(struct kvp_store *s, uint64_t off, size_t len, uint64_t seed)
{
	size_t chunk = 1 * MIB;
	char *buf = kvp_test_xalloc(chunk);

	for (size_t at = 0; at < len; at += chunk) {
		size_t n = len - at < chunk ? len - at : chunk;

		kvp_test_fill(buf, n, seed, off + at);
		ck_assert_int_eq(kvp_store_pwrite(s, buf, n, off + at), 0);
	}
	free(buf);
}

/* Offset of the first store word in [off, off+len) off the pattern, or -1. */
int64_t store_check(struct kvp_store *s, uint64_t off, size_t len,
		    uint64_t seed)
{
	size_t chunk = 1 * MIB;
	char *buf = kvp_test_xalloc(chunk);
	int64_t bad = -1;

	for (size_t at = 0; at < len && bad < 0; at += chunk) {
		size_t n = len - at < chunk ? len - at : chunk;
		int64_t b;

		ck_assert_int_eq(kvp_store_pread(s, buf, n, off + at), 0);
		b = kvp_test_check(buf, n, seed, off + at);
		if (b >= 0)
			bad = (int64_t)at + b;
	}
	free(buf);
	return bad;
}

void make_store(enum store_kind k, uint64_t size)
{
	if (k == ST_MEM)
		ck_assert_int_eq(kvp_store_memory_create(size, &S), 0);
	else
		ck_assert_int_eq(kvp_store_file_temp("/var/tmp", size, &S), 0);
}

/* Memory store under a faulty store: S is the faulty one, S0 the inner. */
void make_faulty_store(uint64_t size)
{
	ck_assert_int_eq(kvp_store_memory_create(size, &S0), 0);
	ck_assert_int_eq(kvp_store_faulty_create(S0, &S), 0);
}

void open_pager(const struct popts *o)
{
	struct kvp_config c;

	kvp_config_defaults(&c);
	c.ram_budget_bytes = o->budget;
	c.install_mode = o->mode;
	c.readahead_bytes = o->readahead;
	c.fault_around_bytes = o->fault_around;
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

struct kvp_region *make_region(size_t size, size_t bs, unsigned flags)
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

char *fx_seeded_region(enum store_kind k, size_t size, size_t bs,
		       const struct popts *o)
{
	make_store(k, size);
	store_fill(S, 0, size, SEED_A);
	open_pager(o);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	return kvp_region_addr(R);
}

char *fx_faulty_region(size_t size, size_t bs, const struct popts *o)
{
	make_faulty_store(size);
	store_fill(S0, 0, size, SEED_A);
	open_pager(o);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	return kvp_region_addr(R);
}

struct kvp_stats pstats(void)
{
	struct kvp_stats s;

	kvp_pager_stats(P, &s);
	return s;
}

struct kvp_stats rstats(struct kvp_region *r)
{
	struct kvp_stats s;

	kvp_region_stats(r, &s);
	return s;
}

/* Wait until background eviction has settled: the region's residency and
 * eviction counts unchanged over a few samples 20 ms apart. */
void settle(struct kvp_region *r)
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
void await_state(struct kvp_region *r, uint64_t blk, int state,
		 const char *what)
{
	struct kvp_block_info bi;

	for (int k = 0; k < 2000; k++) {
		ck_assert_int_eq(kvp_region_block_info(r, blk, &bi), 0);
		if ((int)bi.state == state)
			return;
		usleep(500);
	}
	ck_abort_msg("%s (block %llu)", what, (unsigned long long)blk);
}

struct kvp_block_info binfo(struct kvp_region *r, uint64_t blk)
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
uint64_t wait_removed(struct kvp_region *r, uint64_t want)
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
uint64_t touch_read(struct kvp_region *r, size_t off, size_t len)
{
	volatile uint64_t *p = (volatile uint64_t *)kvp_region_addr(r);
	uint64_t sum = 0;

	for (size_t at = off; at < off + len; at += PG)
		sum += p[at / 8];
	return sum;
}

void check_region(struct kvp_region *r, size_t off, size_t len, uint64_t seed)
{
	int64_t bad =
	    kvp_test_check((char *)kvp_region_addr(r) + off, len, seed, off);

	ck_assert_msg(bad < 0, "region word at %lld differs (seed %llx)",
		      (long long)(off + (size_t)bad), (unsigned long long)seed);
}

/* Evict everything that can be: COLD on all, then stream a second region
 * of the budget's size over it.  (Used where the test must see blocks go.) */
void push_out(struct kvp_region *r, uint64_t budget)
{
	struct kvp_store *ms = NULL;
	struct kvp_region *x = NULL;
	struct kvp_region_opts o = { .size = budget,
				     .block_bytes = 64 * KIB,
				     .flags = 0 };
	uint64_t nb = kvp_region_size(r) / kvp_region_block_bytes(r);

	/* A block still in transit (a moved-in block's read-back, with its
	 * faults woken already) keeps the hint and takes it only when it
	 * lands, which on a busy machine can be after the stream below:
	 * it would stay.  Up to 5 s for all to land; staged read-ahead
	 * lands only when asked for, and the stream drops it. */
	for (int k = 0;; k++) {
		uint64_t moving = 0, first = 0;

		for (uint64_t b = nb; b-- > 0;) {
			struct kvp_block_info bi;

			ck_assert_int_eq(kvp_region_block_info(r, b, &bi), 0);
			if ((bi.state == KVP_BLOCK_LOADING && !bi.staged) ||
			    bi.state == KVP_BLOCK_EVICTING) {
				moving++;
				first = b;
			}
		}
		if (!moving)
			break;
		ck_assert_msg(k < 5000,
			      "push_out: %llu blocks still in transit after "
			      "5 s, block %llu first",
			      (unsigned long long)moving,
			      (unsigned long long)first);
		usleep(1000);
	}
	ck_assert_int_eq(kvp_region_advise(r, 0, nb, KVP_ADVICE_COLD), 0);
	ck_assert_int_eq(kvp_store_memory_create(budget, &ms), 0);
	o.store = ms;
	ck_assert_int_eq(kvp_region_create(P, &o, &x), 0);
	memset(kvp_region_addr(x), 0x5a, budget);
	ck_assert_int_eq(kvp_region_destroy(x), 0);
	kvp_store_destroy(ms); /* engine bug 1 (fixed) crashed here */
}

/* R: @nblocks blocks of @bs from a faulty store over memory (S0 holds the
 * pattern SEED_A, each I/O delayed @delay_us), under @budget. */
void prefetch_fixture(size_t nblocks, size_t bs, uint64_t budget,
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

TCase *fx_tcase(Suite *s, const char *name, int timeout)
{
	TCase *t = kvp_test_tcase(s, name, timeout);

	tcase_add_checked_fixture(t, fx_setup, fx_teardown);
	return t;
}

int kvp_test_pager_err(void)
{
	struct kvp_config c;
	struct kvp_pager *p = NULL;
	int err;

	kvp_config_defaults(&c);
	c.ram_budget_bytes = 4 * MIB;
	err = kvp_pager_open(&c, &p);
	if (!err)
		kvp_pager_close(p);
	return err;
}

int fx_main(Suite *(*make_suite)(void))
{
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	err = kvp_test_pager_err();
	if (err == -EPERM || err == -EOPNOTSUPP || err == -ENOSYS) {
		return kvp_test_skip("cannot open a pager here: %s",
				     kvp_strerror(err));
	}
	if (err) {
		printf("kvp_pager_open: %s\n", kvp_strerror(err));
		return 1;
	}
	return kvp_test_run(make_suite());
}
