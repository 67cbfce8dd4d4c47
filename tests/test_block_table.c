/* test_block_table.c - allocator, tables, fork/share, copy on write, free. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "lib/kv/block_table.h"
#include "tests/helpers/helpers.h"

static struct kvp_block_alloc *A;

static void setup(void)
{
	ck_assert_int_eq(kvp_block_alloc_create(64, &A), 0);
}

static void teardown(void)
{
	kvp_block_alloc_destroy(A);
}

START_TEST(alloc_basic)
{
	uint32_t b, c;
	bool freed;

	ck_assert_int_eq(
	    kvp_block_alloc_create(0, &(struct kvp_block_alloc *){ 0 }),
	    -EINVAL);
	ck_assert_int_eq(kvp_block_alloc_get(A, &b), 0);
	ck_assert_int_eq(kvp_block_alloc_get(A, &c), 0);
	ck_assert_uint_eq(b, 0);
	ck_assert_uint_eq(c, 1);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 62);
	ck_assert_int_eq(kvp_block_alloc_ref(A, b), 0);
	ck_assert_uint_eq(kvp_block_alloc_refcount(A, b), 2);
	ck_assert_int_eq(kvp_block_alloc_put(A, b, &freed), 0);
	ck_assert(!freed);
	ck_assert_int_eq(kvp_block_alloc_put(A, b, &freed), 0);
	ck_assert(freed);
	ck_assert(kvp_block_alloc_is_free(A, b));
	ck_assert_int_eq(kvp_block_alloc_put(A, b, NULL), -EINVAL);
	ck_assert_int_eq(kvp_block_alloc_ref(A, b), -EINVAL);
	ck_assert_int_eq(kvp_block_alloc_ref(A, 64), -EINVAL);
	/* lowest free first */
	ck_assert_int_eq(kvp_block_alloc_get(A, &b), 0);
	ck_assert_uint_eq(b, 0);
}
END_TEST

START_TEST(alloc_exhaust)
{
	uint32_t b, i;

	for (i = 0; i < 64; i++)
		ck_assert_int_eq(kvp_block_alloc_get(A, &b), 0);
	ck_assert_int_eq(kvp_block_alloc_get(A, &b), -ENOSPC);
	kvp_block_alloc_put(A, 37, NULL);
	ck_assert_int_eq(kvp_block_alloc_get(A, &b), 0);
	ck_assert_uint_eq(b, 37);
}
END_TEST

START_TEST(table_append)
{
	struct kvp_block_table *t;
	uint32_t pb, slot;

	ck_assert_int_eq(kvp_block_table_create(A, 4, &t), 0);
	ck_assert_int_eq(kvp_block_table_append(t, 10, NULL, NULL), 0);
	ck_assert_uint_eq(kvp_block_table_tokens(t), 10);
	ck_assert_uint_eq(kvp_block_table_blocks(t), 3);
	ck_assert_uint_eq(kvp_block_table_valid(t, 0), 4);
	ck_assert_uint_eq(kvp_block_table_valid(t, 2), 2);
	ck_assert_uint_eq(kvp_block_table_valid(t, 3), 0);
	ck_assert_uint_eq(kvp_block_table_physical(t, 3), KVP_BLOCK_NONE);
	ck_assert_int_eq(kvp_block_table_slot(t, 9, &pb, &slot), 0);
	ck_assert_uint_eq(pb, kvp_block_table_map(t)[2]);
	ck_assert_uint_eq(slot, 1);
	ck_assert_int_eq(kvp_block_table_slot(t, 10, &pb, &slot), -ERANGE);
	/* appending into the partial block allocates nothing */
	ck_assert_int_eq(kvp_block_table_append(t, 2, NULL, NULL), 0);
	ck_assert_uint_eq(kvp_block_table_blocks(t), 3);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 61);
	/* too many: nothing changes */
	ck_assert_int_eq(kvp_block_table_append(t, 4 * 62, NULL, NULL),
			 -ENOSPC);
	ck_assert_uint_eq(kvp_block_table_tokens(t), 12);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 61);
	ck_assert_int_eq(kvp_block_table_append(t, 4 * 61, NULL, NULL), 0);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 0);
	kvp_block_table_destroy(t, NULL, NULL);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64);
}
END_TEST

struct copylog {
	int n;
	struct kvp_block_copy last;
	int fail;
};

static int copy_cb(void *arg, const struct kvp_block_copy *c)
{
	struct copylog *l = arg;

	if (l->fail)
		return l->fail;
	l->n++;
	l->last = *c;
	return 0;
}

/* An append undone: the blocks past the tokens kept are free again,
 * unless another table shares them. */
START_TEST(table_truncate)
{
	struct kvp_block_table *t, *f;

	ck_assert_int_eq(kvp_block_table_create(A, 4, &t), 0);
	ck_assert_int_eq(kvp_block_table_append(t, 8, NULL, NULL), 0);
	ck_assert_int_eq(kvp_block_table_fork(t, 8, &f), 0);
	ck_assert_int_eq(kvp_block_table_append(t, 16, NULL, NULL), 0);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64 - 6);
	ck_assert_int_eq(kvp_block_table_truncate(t, 25), -EINVAL);
	ck_assert_int_eq(kvp_block_table_truncate(t, 6), -EINVAL);
	ck_assert_uint_eq(kvp_block_table_tokens(t), 24);
	ck_assert_int_eq(kvp_block_table_truncate(t, 4), 0);
	ck_assert_uint_eq(kvp_block_table_tokens(t), 4);
	ck_assert_uint_eq(kvp_block_table_blocks(t), 1);
	/* block 1 is the fork's too: it stays taken */
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64 - 2);
	ck_assert(!kvp_block_alloc_is_free(A, 1));
	ck_assert_int_eq(kvp_block_alloc_refcount(A, 0), 2);
	/* the next append takes the lowest free blocks again */
	ck_assert_int_eq(kvp_block_table_append(t, 4, NULL, NULL), 0);
	ck_assert_uint_eq(kvp_block_table_physical(t, 1), 2);
	kvp_block_table_destroy(t, NULL, NULL);
	kvp_block_table_destroy(f, NULL, NULL);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64);
}
END_TEST

START_TEST(fork_cow)
{
	struct kvp_block_table *p, *c;
	struct kvp_block_copy cow;
	bool copied;
	uint32_t freed[16];
	size_t nf;
	uint32_t shared_last;

	kvp_block_table_create(A, 4, &p);
	kvp_block_table_append(p, 10, NULL,
			       NULL); /* blocks 0 1 2, last partial */
	ck_assert_int_eq(kvp_block_table_fork(p, 100, &c), -EINVAL);
	ck_assert_int_eq(kvp_block_table_fork(p, UINT64_MAX, &c), 0);
	ck_assert_uint_eq(kvp_block_table_tokens(c), 10);
	ck_assert(kvp_block_table_shared(c, 0));
	ck_assert_uint_eq(kvp_block_alloc_refcount(A, 2), 2);
	shared_last = kvp_block_table_physical(c, 2);
	/* no place to report the copy and no callback: refused */
	ck_assert_int_eq(kvp_block_table_append(c, 1, NULL, NULL), -EINVAL);
	ck_assert_uint_eq(kvp_block_table_tokens(c), 10);
	ck_assert_int_eq(kvp_block_table_append(c, 1, &cow, &copied), 0);
	ck_assert(copied);
	ck_assert_uint_eq(cow.src, shared_last);
	ck_assert_uint_eq(cow.ntokens, 2);
	ck_assert_uint_ne(cow.dst, shared_last);
	ck_assert_uint_eq(kvp_block_table_physical(c, 2), cow.dst);
	ck_assert_uint_eq(kvp_block_table_physical(p, 2), shared_last);
	ck_assert_uint_eq(kvp_block_alloc_refcount(A, shared_last), 1);
	ck_assert(!kvp_block_table_shared(c, 2));
	ck_assert(kvp_block_table_shared(c, 1));
	/* second append: no more copy */
	ck_assert_int_eq(kvp_block_table_append(c, 1, &cow, &copied), 0);
	ck_assert(!copied);
	/* the parent writes its own last block now: not shared, no copy */
	ck_assert_int_eq(kvp_block_table_append(p, 1, NULL, &copied), 0);
	ck_assert(!copied);
	/* destroying the child frees only its private block */
	kvp_block_table_destroy(c, freed, &nf);
	ck_assert_uint_eq(nf, 1);
	ck_assert_uint_eq(freed[0], cow.dst);
	kvp_block_table_destroy(p, freed, &nf);
	ck_assert_uint_eq(nf, 3);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64);
}
END_TEST

START_TEST(fork_prefix_callback)
{
	struct kvp_block_table *p, *c, *d;
	struct copylog log = { 0 };
	uint32_t freed[16];
	size_t nf;

	kvp_block_alloc_set_copy(A, copy_cb, &log);
	kvp_block_table_create(A, 4, &p);
	kvp_block_table_append(p, 16, NULL, NULL);
	/* prefix ends inside block 1: blocks 0 and 1 shared */
	ck_assert_int_eq(kvp_block_table_fork(p, 6, &c), 0);
	ck_assert_uint_eq(kvp_block_table_blocks(c), 2);
	ck_assert_uint_eq(kvp_block_table_valid(c, 1), 2);
	ck_assert_uint_eq(
	    kvp_block_alloc_refcount(A, kvp_block_table_map(p)[1]), 2);
	/* the callback fails: nothing changes */
	log.fail = -EIO;
	ck_assert_int_eq(kvp_block_table_append(c, 3, NULL, NULL), -EIO);
	ck_assert_uint_eq(kvp_block_table_tokens(c), 6);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 60);
	log.fail = 0;
	ck_assert_int_eq(kvp_block_table_append(c, 3, NULL, NULL), 0);
	ck_assert_int_eq(log.n, 1);
	ck_assert_uint_eq(log.last.src, kvp_block_table_map(p)[1]);
	ck_assert_uint_eq(log.last.ntokens, 2);
	ck_assert_uint_eq(kvp_block_table_blocks(c), 3);
	/* block-aligned fork: nothing to copy on append */
	ck_assert_int_eq(kvp_block_table_fork(p, 8, &d), 0);
	ck_assert_int_eq(kvp_block_table_append(d, 1, NULL, NULL), 0);
	ck_assert_int_eq(log.n, 1);
	kvp_block_table_destroy(p, freed, &nf);
	ck_assert_uint_eq(nf, 2); /* blocks 2 and 3: 0 and 1 still shared */
	kvp_block_table_destroy(d, freed, &nf);
	ck_assert_uint_eq(nf, 2); /* its own block and block 1; 0 is c's */
	kvp_block_table_destroy(c, freed, &nf);
	ck_assert_uint_eq(nf, 3);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64);
}
END_TEST

START_TEST(free_spans)
{
	struct kvp_block_table *a, *b;
	uint32_t freed[16], spans[16];
	size_t nf, ns;

	kvp_block_table_create(A, 1, &a);
	kvp_block_table_create(A, 1, &b);
	kvp_block_table_append(a, 6, NULL, NULL); /* 0..5 */
	kvp_block_table_append(b, 2, NULL, NULL); /* 6, 7 */
	kvp_block_table_destroy(a, freed, &nf);
	ck_assert_uint_eq(nf, 6);
	/* 4 per pager block: span 0 (0-3) free, span 4 (4-7) holds b's */
	ns = kvp_block_alloc_free_spans(A, 4, freed, nf, spans);
	ck_assert_uint_eq(ns, 1);
	ck_assert_uint_eq(spans[0], 0);
	kvp_block_table_destroy(b, freed, &nf);
	ns = kvp_block_alloc_free_spans(A, 4, freed, nf, spans);
	ck_assert_uint_eq(ns, 1);
	ck_assert_uint_eq(spans[0], 4);
}
END_TEST

/* Many random forks/appends/destroys: the counts stay consistent. */
START_TEST(random_ops)
{
	struct kvp_block_table *t[8] = { 0 };
	uint32_t x = 7, i, k, freed[128];
	size_t nf;
	struct kvp_block_copy cow;

	for (i = 0; i < 5000; i++) {
		x = x * 1664525u + 1013904223u;
		k = (x >> 8) % 8;
		switch ((x >> 16) % 4) {
		case 0:
			if (!t[k])
				kvp_block_table_create(A, 4, &t[k]);
			break;
		case 1:
			if (t[k])
				kvp_block_table_append(t[k], (x >> 20) % 9,
						       &cow, NULL);
			break;
		case 2:
			if (t[k] && !t[(k + 1) % 8])
				kvp_block_table_fork(
				    t[k], kvp_block_table_tokens(t[k]) / 2,
				    &t[(k + 1) % 8]);
			break;
		case 3:
			kvp_block_table_destroy(t[k], freed, &nf);
			t[k] = NULL;
			break;
		}
		/* the refcounts equal the table entries naming each block */
		{
			uint32_t cnt[64] = { 0 }, b, j;
			uint32_t used = 0;

			for (j = 0; j < 8; j++)
				for (b = 0;
				     t[j] && b < kvp_block_table_blocks(t[j]);
				     b++)
					cnt[kvp_block_table_map(t[j])[b]]++;
			for (b = 0; b < 64; b++) {
				ck_assert_uint_eq(
				    cnt[b], kvp_block_alloc_refcount(A, b));
				used += cnt[b] > 0;
			}
			ck_assert_uint_eq(64 - used,
					  kvp_block_alloc_free_count(A));
		}
	}
	for (k = 0; k < 8; k++)
		kvp_block_table_destroy(t[k], NULL, NULL);
	ck_assert_uint_eq(kvp_block_alloc_free_count(A), 64);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("block_table");
	TCase *tc = kvp_test_tcase(s, "core", 30);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, alloc_basic);
	tcase_add_test(tc, alloc_exhaust);
	tcase_add_test(tc, table_append);
	tcase_add_test(tc, table_truncate);
	tcase_add_test(tc, fork_cow);
	tcase_add_test(tc, fork_prefix_callback);
	tcase_add_test(tc, free_spans);
	tcase_add_test(tc, random_ops);
	return kvp_test_run(s);
}
