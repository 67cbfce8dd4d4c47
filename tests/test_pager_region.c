/*
 * test_pager_region.c - the paging engine (pager/): regions: many at once, bad arguments, error strings, block_info and peek.
 *
 * The fixture and helpers are tests/helpers/pager_fx.c.  The binary exits
 * 77 when this machine cannot open a pager.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "pager/pager.h"
#include "pager/pager_i.h" /* P->touch: what the pager measured */
#include "tests/helpers/pager_fx.h"

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
		kvp_test_fill(kvp_region_addr(rs[i]), rsize, SEED_B + i, 0);
	for (unsigned i = 0; i < N; i++)
		ck_assert_msg(kvp_test_check(kvp_region_addr(rs[i]), rsize,
					     SEED_B + i, 0) < 0,
			      "region %u lost its data", i);
	for (unsigned i = 0; i < N; i++)
		ck_assert_int_eq(kvp_region_destroy(rs[i]), 0);
	ck_assert_uint_eq(count_regions(), 0);
	s = pstats();
	ck_assert_uint_eq(s.resident_bytes, 0);
	ck_assert_uint_gt(s.evictions_dirty_total, 0);
	for (unsigned i = 0; i < N; i += 97) {
		char *buf = kvp_test_xalloc(rsize);

		ck_assert_int_eq(kvp_store_pread(S, buf, rsize, i * rsize), 0);
		ck_assert_int_eq(kvp_test_check(buf, rsize, SEED_B + i, 0), -1);
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
		ck_assert_int_eq(kvp_test_check(kvp_region_addr(rs[i]), rsize,
						SEED_B + i, 0),
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
		{ "over kv's store bytes",
		  { .size = 1 * MIB,
		    .block_bytes = 64 * KIB,
		    .store_offset = 960 * KIB },
		  -EBUSY },
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

/* This process's address space in use (VmSize), in bytes. */
static uint64_t vm_size(void)
{
	char line[256];
	uint64_t kb = 0;
	FILE *f = fopen("/proc/self/status", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmSize: %lu kB", &kb) == 1)
			break;
	fclose(f);
	ck_assert_uint_gt(kb, 0);
	return kb << 10;
}

/* Open a pager of @budget with @free bytes of address space left
 * (RLIMIT_AS); 0 or -errno. */
static int open_with_address_space(uint64_t budget, uint64_t free)
{
	struct rlimit rl;
	struct kvp_config c;
	struct kvp_pager *p = NULL;
	int err;

	ck_assert_int_eq(getrlimit(RLIMIT_AS, &rl), 0);
	rl.rlim_cur = vm_size() + free;
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
	kvp_config_defaults(&c);
	c.ram_budget_bytes = budget;
	c.pool_prefault_bytes = 0;
	err = kvp_pager_open(&c, &p);
	kvp_pager_close(p);
	rl.rlim_cur = RLIM_INFINITY;
	ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
	return err;
}

/*
 * Under ulimit -v a pager of budget B starts with 5 B of address space
 * free (the README's figure: the arena reserves 4.5 B), and with too
 * little says so with ENOMEM, not EPERM ("no permission to use
 * userfaultfd"), which the raw mmap reported for every failure.  The
 * arena used to reserve 4 B + 64 GiB.
 */
START_TEST(test_address_space_limit)
{
	uint64_t budget = 1ull << 30;

	ck_assert_int_eq(open_with_address_space(budget, 2 * budget), -ENOMEM);
	ck_assert_int_eq(open_with_address_space(budget, 5 * budget), 0);
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

	a = fx_seeded_region(ST_MEM, nb * bs, bs, &po);
	buf = kvp_test_xalloc(bs);
	/* 2: written, then evicted; 1: resident dirty; 4: resident clean;
	 * 3: never loaded. */
	kvp_test_fill(a + 2 * bs, bs, SEED_B, 2 * bs);
	ck_assert_int_eq(kvp_region_advise(R, 2, 1, KVP_ADVICE_COLD), 0);
	touch_read(R, 20 * bs, 40 * bs);
	kvp_test_fill(a + 1 * bs, bs, SEED_B, 1 * bs);
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
		ck_assert_msg(kvp_test_check(buf, bs, seed, b * bs) < 0,
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
	/* A region that does not start from the store: zeros.  (Not over
	 * R's bytes of S: a region over another's store bytes is refused.) */
	struct kvp_region_opts o = { .size = 1 * MIB,
				     .block_bytes = bs,
				     .store = S,
				     .store_offset = 0 };
	struct kvp_region *z = NULL;
	struct kvp_store *zs = NULL;

	ck_assert_int_eq(kvp_region_create(P, &o, &z), -EBUSY);
	ck_assert_int_eq(kvp_store_memory_create(1 * MIB, &zs), 0);
	o.store = zs;
	ck_assert_int_eq(kvp_region_create(P, &o, &z), 0);
	ck_assert_int_eq(kvp_region_peek(z, 3, buf), 0);
	ck_assert(kvp_test_is_zero(buf, bs));
	ck_assert_int_eq(kvp_region_peek(z, 16, buf), -EINVAL);
	ck_assert_int_eq(
	    kvp_region_block_info(z, 16, &(struct kvp_block_info){ 0 }),
	    -EINVAL);
	ck_assert_int_eq(kvp_region_destroy(z), 0);
	kvp_store_destroy(zs);
	free(buf);
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

/* A store's alignments of 0 ask for none (struct kvp_store is public, and
 * a caller's own store may leave them 0): a region on it is made, used and
 * written back, never a division by zero. */
START_TEST(test_store_align_zero)
{
	struct popts po = { .budget = 4 * MIB, .fault_around = 16 * KIB };
	size_t size = 2 * MIB, bs = 256 * KIB;
	char *a;

	make_store(ST_MEM, size);
	store_fill(S, 0, size, SEED_A);
	S->mem_align = 0;
	S->offset_align = 0;
	open_pager(&po);
	R = make_region(size, bs, KVP_REGION_FROM_STORE);
	a = kvp_region_addr(R);
	touch_read(R, bs + PG, PG);
	kvp_test_fill(a + bs + PG, PG, SEED_B, bs + PG);
	check_region(R, 0, PG, SEED_A);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	ck_assert_int_eq(store_check(S, bs + PG, PG, SEED_B), -1);
	ck_assert_int_eq(store_check(S, 0, bs, SEED_A), -1);
}
END_TEST

/*
 * Two pagers handed one store: a region of the second over bytes a
 * region of the first holds would write its blocks back over the first's
 * (the second's data read back from the first region after an eviction).
 * Refused until the first region is destroyed; bytes of their own are
 * fine.
 */
START_TEST(test_store_shared_by_two_pagers)
{
	struct popts po = { .budget = 4 * MIB };
	struct kvp_region_opts o = { .size = 1 * MIB, .block_bytes = 64 * KIB };
	struct kvp_region *r2 = NULL;
	struct kvp_pager *p2 = NULL;
	struct kvp_config c;

	make_store(ST_MEM, 3 * MIB);
	open_pager(&po);
	R = make_region(2 * MIB, 64 * KIB, 0);
	kvp_config_defaults(&c);
	c.ram_budget_bytes = 4 * MIB;
	ck_assert_int_eq(kvp_pager_open(&c, &p2), 0);
	o.store = S;
	o.store_offset = 1 * MIB;
	ck_assert_int_eq(kvp_region_create(p2, &o, &r2), -EBUSY);
	o.store_offset = 2 * MIB;
	ck_assert_int_eq(kvp_region_create(p2, &o, &r2), 0);
	ck_assert_int_eq(kvp_region_destroy(r2), 0);
	ck_assert_int_eq(kvp_region_destroy(R), 0);
	R = NULL;
	o.store_offset = 1 * MIB;
	ck_assert_int_eq(kvp_region_create(p2, &o, &r2), 0);
	ck_assert_int_eq(kvp_region_destroy(r2), 0);
	kvp_pager_close(p2);
}
END_TEST

/*
 * A region being destroyed writes its dirty blocks back once nothing of it
 * is in flight, while another region's faults need frames.  Its resident
 * blocks were still on the clock then, so evictions started on it and
 * finished after it was freed (a settle reading freed memory: SIGSEGV in
 * test_zap_follows_reader's teardown about once in 150 runs; here every
 * run under ASan).  The dying region's blocks are never victims now.
 */
struct evictor {
	struct kvp_region *r;
	atomic_bool stop;
};

static void *evictor_main(void *arg)
{
	struct evictor *e = arg;

	while (!atomic_load(&e->stop))
		touch_read(e->r, 0, kvp_region_size(e->r));
	return NULL;
}

START_TEST(test_destroy_while_others_evict)
{
	size_t bs = 64 * KIB, mib = 1 * MIB;
	struct popts po = { .budget = 2 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	struct kvp_fault_plan plan = { .delay_us = 50000 };
	struct kvp_region_opts o = { .size = 2 * mib, .block_bytes = bs };
	struct evictor e = { 0 };
	struct kvp_region *a = NULL;
	pthread_t t;

	make_faulty_store(16 * mib);
	open_pager(&po);
	o.store = S;
	ck_assert_int_eq(kvp_region_create(P, &o, &a), 0);
	/* The whole budget: 16 blocks dirty, 16 clean.  B's faults wait
	 * for the frames a's destroy gives back. */
	memset(kvp_region_addr(a), 7, mib);
	touch_read(a, mib, mib);
	o.size = 8 * mib;
	o.store_offset = 2 * mib;
	ck_assert_int_eq(kvp_region_create(P, &o, &e.r), 0);
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, evictor_main, &e), 0);
	usleep(20000);
	ck_assert_int_eq(kvp_region_destroy(a), 0); /* 16 slow writes */
	atomic_store(&e.stop, true);
	pthread_join(t, NULL);
	ck_assert_int_eq(kvp_region_destroy(e.r), 0);
	ck_assert_uint_eq(pstats().resident_bytes, 0);
}
END_TEST


/*
 * service_priority: the service and zapper threads run that many nice
 * levels above the process where it may (root, CAP_SYS_NICE), and at its
 * own level otherwise or at 0; the process's other threads stay.
 */
START_TEST(test_service_priority)
{
	struct kvp_config c;
	struct kvp_pager *p = NULL;
	int base = getpriority(PRIO_PROCESS, 0), want, zap;

	kvp_config_defaults(&c);
	ck_assert_uint_eq(c.service_priority, 10);
	c.ram_budget_bytes = 4 * MIB;
	c.service_priority = 7;
	ck_assert_int_eq(kvp_pager_open(&c, &p), 0);
	want = kvp_test_boosted_nice(7);
	ck_assert_int_eq(kvp_test_thread_nice("kvp-svc0"), want);
	zap = kvp_test_thread_nice("kvp-zap"); /* none without
						   process_madvise */
	ck_assert(zap == want || zap == INT_MIN);
	ck_assert_int_eq(getpriority(PRIO_PROCESS, 0), base);
	kvp_pager_close(p);
	c.service_priority = 0;
	ck_assert_int_eq(kvp_pager_open(&c, &p), 0);
	ck_assert_int_eq(kvp_test_thread_nice("kvp-svc0"), base);
	kvp_pager_close(p);
	c.service_priority = 20;
	ck_assert_int_eq(kvp_pager_open(&c, &p), -EINVAL);
}
END_TEST

/*
 * install_mode auto: copy below 2 MiB; from 2 MiB, move where a page's
 * first touch costs more than copying it (a shadow-paging guest), copy
 * where it costs less (nested paging).  Regions take what the rule says
 * for the costs the pager measured at open: set here to each kind of
 * guest in turn, so that both branches run on any machine, and each
 * region's installs go the way it says.
 */
START_TEST(test_install_auto)
{
	static const struct {
		struct kvp_mem_touch_cost cost;
		const char *mode;
	} guests[] = {
		{ { .first_us = 8.0, .again_us = 0.01, .copy_us = 0.2 }, "move" },
		{ { .first_us = 0.01, .again_us = 0.0, .copy_us = 0.2 }, "copy" },
	};
	struct kvp_mem_touch_cost c;
	struct kvp_store *ms = NULL;
	struct kvp_region_opts o = { .size = 4 * MIB };
	struct kvp_region *r = NULL;
	struct kvp_stats st;
	struct popts po = { .budget = 16 * MIB };
	size_t b;

	for (b = 4 * KIB; b < 2 * MIB; b *= 2) {
		ck_assert(!kvp_install_auto_moves(b, 8.0, 0.2));
		ck_assert(!kvp_install_auto_moves(b, 0.01, 0.2));
	}
	for (b = 2 * MIB; b <= 8 * MIB; b *= 2) {
		ck_assert(kvp_install_auto_moves(b, 8.0, 0.2));
		ck_assert(!kvp_install_auto_moves(b, 0.01, 0.2));
	}
	ck_assert_int_eq(kvp_mem_touch_cost(KVP_MEM_TOUCH_COST_PAGES, &c), 0);
	ck_assert(c.first_us >= 0 && c.again_us >= 0 && c.copy_us >= 0);
	ck_assert(c.first_us < 1e5 && c.copy_us < 1e5);
	printf("first touch %.3f us, again %.3f us, copy %.3f us a page\n",
	       c.first_us, c.again_us, c.copy_us);

	open_pager(&po);
	ck_assert_int_eq(kvp_store_memory_create(4 * MIB, &ms), 0);
	o.store = ms;
	for (size_t g = 0; g < sizeof(guests) / sizeof(*guests); g++) {
		P->touch = guests[g].cost;
		o.block_bytes = 64 * KIB;
		ck_assert_int_eq(kvp_region_create(P, &o, &r), 0);
		ck_assert_str_eq(kvp_region_install_mode(r), "copy");
		ck_assert_int_eq(kvp_region_destroy(r), 0);
		o.block_bytes = 2 * MIB;
		ck_assert_int_eq(kvp_region_create(P, &o, &r), 0);
		ck_assert_str_eq(kvp_region_install_mode(r), guests[g].mode);
		memset(kvp_region_addr(r), 3 + (int)g, 4 * MIB);
		ck_assert_int_eq(((char *)kvp_region_addr(r))[3 * MIB],
				 3 + (int)g);
		kvp_region_stats(r, &st);
		ck_assert_uint_eq(!strcmp(guests[g].mode, "move")
					  ? st.installs_move_total
					  : st.installs_copy_total,
				  2);
		ck_assert_uint_eq(st.installs_move_total +
					  st.installs_copy_total,
				  2);
		ck_assert_int_eq(kvp_region_destroy(r), 0);
	}
	kvp_store_destroy(ms);
}
END_TEST

/* /proc/self/status's @key ("VmLck:"), in bytes. */
static uint64_t status_bytes(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key)) &&
		    sscanf(line + strlen(key), "%llu", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb << 10;
}

/*
 * Under mlockall(MCL_FUTURE) a new mapping is locked and filled at once: a
 * region's range was filled with zero pages before the pager registered
 * it, so no fault ever came and it read all zeros, and the frame arena
 * (gigabytes of address space) would be filled as well.  Found by review.
 */
START_TEST(test_region_under_mlockall)
{
	struct popts po = { .budget = 16 * MIB };
	size_t size = 8 * MIB;

	if (mlockall(MCL_FUTURE)) {
		printf("region_under_mlockall: mlockall: %s: nothing to "
		       "check\n",
		       strerror(errno));
		return;
	}
	(void)fx_seeded_region(ST_MEM, size, 64 * KIB, &po);
	check_region(R, 0, size, SEED_A);
	ck_assert_uint_gt(rstats(R).demand_faults_total, 0);
	/* The stores, the tables and the pre-touched budget: not the
	 * arena's reservation. */
	ck_assert_msg(status_bytes("VmLck:") < 256 * MIB,
		      "%llu MiB locked",
		      (unsigned long long)(status_bytes("VmLck:") >> 20));
	ck_assert_int_eq(munlockall(), 0);
}
END_TEST

static Suite *pager_region_suite(void)
{
	Suite *s = suite_create("pager_region");
	TCase *t;

	t = fx_tcase(s, "limits", 120);
	tcase_add_test(t, test_many_regions);
	tcase_add_test(t, test_bad_args);
	tcase_add_test(t, test_strerror);
	tcase_add_test(t, test_address_space_limit);
	tcase_add_test(t, test_service_priority);
	tcase_add_test(t, test_install_auto);
	tcase_add_test(t, test_region_under_mlockall);
	t = fx_tcase(s, "introspection", 120);
	tcase_add_loop_test(t, test_peek, 0, 2);
	tcase_add_test(t, test_bug_store_outlives_last_region);
	tcase_add_test(t, test_store_align_zero);
	tcase_add_test(t, test_store_shared_by_two_pagers);
	tcase_add_loop_test(t, test_destroy_while_others_evict, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_region_suite);
}
