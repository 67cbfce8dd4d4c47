/*
 * test_pager_around.c - the paging engine (pager/): fault-around.  A read
 * fault that does not continue a run loads a window of its block, not the
 * block; a stream still loads whole blocks; a block resident in part is
 * made whole before it is written or dropped into, so that no write-back
 * ever writes the pages it lacks; its charge is the pages it holds.
 *
 * The fixture and helpers are tests/helpers/pager_fx.c.  The binary exits
 * 77 when this machine cannot open a pager.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pager/pager.h"
#include "tests/helpers/pager_fx.h"

#define BS    (256 * KIB) /* block */
#define FA    (16 * KIB)  /* window */
#define NBLK  64
#define SIZE  (NBLK * BS)

static struct popts around_opts(int i, uint64_t budget)
{
	struct popts po = { .budget = budget,
			    .mode = i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE,
			    .readahead = 4 * BS,
			    .fault_around = FA };
	return po;
}

/* The word at byte @off of the region, read (a fault if not resident). */
static uint64_t word_at(const char *a, size_t off)
{
	return *(volatile const uint64_t *)(a + off);
}

START_TEST(test_random_reads_load_windows)
{
	struct popts po = around_opts(_i, 8 * MIB);
	char *a = fx_seeded_region(ST_MEM, SIZE, BS, &po);
	struct kvp_stats s0 = rstats(R), s;
	unsigned seed = 7;

	size_t first = 0;

	/* One page in each of 32 blocks, at a random place in it. */
	for (unsigned k = 0; k < 32; k++) {
		size_t blk = 2 * k + 1; /* never a neighbour of the last */
		size_t off = blk * BS + (size_t)(rand_r(&seed) % (BS / PG)) * PG;
		uint64_t w = word_at(a, off);

		if (k == 0)
			first = off;

		ck_assert_int_eq(kvp_test_check(&w, sizeof(w), SEED_A, off),
				 -1);
	}
	(void)binfo(R, 63); /* the last one out of transit */
	s = rstats(R);
	ck_assert_uint_eq(s.bytes_read_total - s0.bytes_read_total, 32 * FA);
	ck_assert_uint_eq(s.resident_bytes, 32 * FA);
	/* Another page of the same window: no read.  One in another window
	 * of that block: one more window. */
	check_region(R, first / FA * FA, FA, SEED_A);
	s0 = rstats(R);
	ck_assert_uint_eq(s0.bytes_read_total, s.bytes_read_total);
	check_region(R, BS, BS, SEED_A); /* the whole of block 1 */
	(void)binfo(R, 1);
	s = rstats(R);
	ck_assert_uint_eq(s.bytes_read_total - s0.bytes_read_total,
			  BS - FA);
	ck_assert_uint_eq(s.resident_bytes, 31 * FA + BS);
}
END_TEST

START_TEST(test_stream_loads_whole_blocks)
{
	struct popts po = around_opts(_i, 8 * MIB);
	struct kvp_stats s;

	fx_seeded_region(ST_MEM, SIZE, BS, &po);
	check_region(R, 0, SIZE, SEED_A);
	s = rstats(R);
	/* The first block in growing windows, then whole blocks, most by
	 * read-ahead (which in copy mode may read a block twice under this
	 * budget, fault-around or not: a quarter more at most). */
	ck_assert_uint_ge(s.bytes_read_total, SIZE);
	ck_assert_uint_le(s.bytes_read_total, SIZE + SIZE / 4);
	/* Whole blocks: a fault a block at most (read-ahead saves most, but
	 * under load it may fall behind); windows would take five or more
	 * a block (16K, 16K, 32K, 64K, 128K). */
	ck_assert_uint_le(s.demand_faults_total, NBLK + 8);
}
END_TEST

START_TEST(test_write_makes_whole)
{
	struct popts po = around_opts(_i, 8 * MIB);
	char *a = fx_seeded_region(ST_MEM, SIZE, BS, &po);
	size_t blk = 5, rd = blk * BS + 3 * FA, wr = blk * BS + 9 * FA + PG;
	char *buf = kvp_test_xalloc(BS);

	/* A window, then a write outside it. */
	(void)word_at(a, rd);
	(void)binfo(R, blk);
	ck_assert_uint_eq(rstats(R).resident_bytes, FA);
	kvp_test_fill(a + wr, PG, SEED_B, wr);
	(void)binfo(R, blk); /* the writer may run before it is RESIDENT */
	ck_assert_msg(rstats(R).resident_bytes == BS,
		      "resident %llu, demand faults %llu, wp faults %llu, "
		      "read %llu",
		      (unsigned long long)rstats(R).resident_bytes,
		      (unsigned long long)rstats(R).demand_faults_total,
		      (unsigned long long)rstats(R).wp_faults_total,
		      (unsigned long long)rstats(R).bytes_read_total);
	ck_assert(binfo(R, blk).dirty);
	check_region(R, blk * BS, wr - blk * BS, SEED_A);
	check_region(R, wr + PG, (blk + 1) * BS - wr - PG, SEED_A);
	/* Out and back: the store holds the whole block, the write in it. */
	push_out(R, po.budget);
	ck_assert_int_ne(binfo(R, blk).state, KVP_BLOCK_RESIDENT);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S, blk * BS, wr - blk * BS, SEED_A), -1);
	ck_assert_int_eq(kvp_store_pread(S, buf, PG, wr), 0);
	ck_assert_int_eq(kvp_test_check(buf, PG, SEED_B, wr), -1);
	ck_assert_int_eq(store_check(S, wr + PG, (blk + 1) * BS - wr - PG,
				     SEED_A),
			 -1);
	free(buf);
}
END_TEST

START_TEST(test_drop_in_partial_block)
{
	struct popts po = around_opts(_i, 8 * MIB);
	char *a = fx_seeded_region(ST_MEM, SIZE, BS, &po);
	size_t blk = 9, base = blk * BS;
	/* Pages 2..5 of the window at 0 (loaded) and 6..9 after it (not). */
	size_t lo = base + 2 * PG, hi = base + 10 * PG;
	struct kvp_stats s0;

	(void)word_at(a, base);
	(void)binfo(R, blk);
	s0 = rstats(R);
	ck_assert_uint_eq(s0.resident_bytes, FA);
	ck_assert_int_eq(madvise(a + lo, hi - lo, MADV_DONTNEED), 0);
	wait_removed(R, s0.removed_bytes_total + (hi - lo));
	ck_assert(kvp_test_is_zero(a + lo, hi - lo));
	check_region(R, base, lo - base, SEED_A);
	check_region(R, hi, base + BS - hi, SEED_A);
	/* Out and back: the same. */
	push_out(R, po.budget);
	ck_assert_int_ne(binfo(R, blk).state, KVP_BLOCK_RESIDENT);
	ck_assert(kvp_test_is_zero(a + lo, hi - lo));
	check_region(R, base, lo - base, SEED_A);
	check_region(R, hi, base + BS - hi, SEED_A);
}
END_TEST

/* Threads reading and writing pages at random under a budget of a few
 * blocks: every word read is what was last written there (a shadow of
 * the pages written), and the charge stays within the budget. */
struct mixer {
	char *a;
	unsigned seed, first, n; /* its blocks: [first, first + n) */
	uint8_t *written;	 /* per page: written with SEED_B */
	size_t bad;
};

static void *mixer_main(void *arg)
{
	struct mixer *m = arg;

	for (unsigned k = 0; k < 3000 && !m->bad; k++) {
		size_t pg = m->first * (BS / PG) +
			    rand_r(&m->seed) % (m->n * (BS / PG));
		size_t off = pg * PG;

		if (rand_r(&m->seed) % 4 == 0) {
			kvp_test_fill(m->a + off, PG, SEED_B, off);
			m->written[pg] = 1;
		} else if (kvp_test_check(m->a + off, PG,
					  m->written[pg] ? SEED_B : SEED_A,
					  off) != -1) {
			m->bad = off + 1;
		}
	}
	return NULL;
}

START_TEST(test_random_mix_integrity)
{
	struct popts po = around_opts(_i, 2 * MIB);
	char *a = fx_seeded_region(ST_MEM, SIZE, BS, &po);
	uint8_t *written = calloc(SIZE / PG, 1);
	struct mixer m[2];
	pthread_t t[2];

	ck_assert_ptr_nonnull(written);
	for (unsigned i = 0; i < 2; i++) {
		m[i] = (struct mixer){ .a = a,
				       .seed = 11 + i,
				       .first = i * NBLK / 2,
				       .n = NBLK / 2,
				       .written = written };
		ck_assert_int_eq(pthread_create(&t[i], NULL, mixer_main, &m[i]),
				 0);
	}
	for (unsigned i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		ck_assert_msg(!m[i].bad, "thread %u: page at %zu off", i,
			      m[i].bad - 1);
	}
	ck_assert_uint_le(rstats(R).resident_bytes, po.budget);
	ck_assert_uint_gt(rstats(R).evictions_clean_total +
			      rstats(R).evictions_dirty_total,
			  0);
	/* Everything once more, then in the store. */
	for (size_t pg = 0; pg < SIZE / PG; pg++)
		check_region(R, pg * PG, PG, written[pg] ? SEED_B : SEED_A);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	for (size_t pg = 0; pg < SIZE / PG; pg++)
		ck_assert_int_eq(store_check(S, pg * PG, PG,
					     written[pg] ? SEED_B : SEED_A),
				 -1);
	free(written);
}
END_TEST

static Suite *pager_around_suite(void)
{
	Suite *s = suite_create("pager_around");
	TCase *t = fx_tcase(s, "around", 300);

	tcase_add_loop_test(t, test_random_reads_load_windows, 0, 2);
	tcase_add_loop_test(t, test_stream_loads_whole_blocks, 0, 2);
	tcase_add_loop_test(t, test_write_makes_whole, 0, 2);
	tcase_add_loop_test(t, test_drop_in_partial_block, 0, 2);
	tcase_add_loop_test(t, test_random_mix_integrity, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_around_suite);
}
