/*
 * test_pager_evict.c - the paging engine (pager/): the budget and eviction: resident memory under the budget, writes racing with eviction, clean eviction by the zapper.
 *
 * The fixture and helpers are tests/helpers/pager_fx.c.  The binary exits
 * 77 when this machine cannot open a pager.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include "pager/pager_i.h" /* P->frames.arena: where the frames are */
#include "tests/helpers/pager_fx.h"

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
	p = (volatile uint64_t *)fx_seeded_region(ST_MEM, 4 * MIB, 64 * KIB,
						  &po);
	before = vm_rss_bytes();
	(void)p[0]; /* one frame read into, one block installed */
	after = vm_rss_bytes();
	ck_assert_uint_eq(rstats(R).demand_faults_total, 1);
	ck_assert_msg(after - before < 1 * MIB,
		      "one 64 KiB block grew VmRSS by %llu bytes",
		      (unsigned long long)(after - before));
}
END_TEST

/* Bytes of [a, a + len) resident, and of those in huge pages: the VMAs of
 * /proc/self/smaps within it. */
static void range_rss(const char *a, size_t len, uint64_t *rss, uint64_t *huge)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[256];
	unsigned long long lo, hi, kb;
	bool in = false;

	ck_assert_ptr_nonnull(f);
	*rss = *huge = 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2)
			in = lo >= (uintptr_t)a && hi <= (uintptr_t)a + len;
		else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1)
			*rss += kb << 10;
		else if (in && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1)
			*huge += kb << 10;
	}
	fclose(f);
}

#define HUGE_FRAMES 4

/* Of HUGE_FRAMES 2 MiB frames handed out now and written, how many are
 * huge pages?  (Nothing else of the arena is resident: the test's region
 * is settled, and a copy-mode pager at its budget keeps no free frame.) */
static unsigned fresh_frames_huge(void)
{
	void *f[HUGE_FRAMES];
	struct kvp_config cfg;
	uint64_t rss, huge, budget;
	unsigned i;

	/* Room for them beside the region's blocks, for a moment. */
	kvp_pager_config(P, &cfg);
	budget = cfg.ram_budget_bytes;
	cfg.ram_budget_bytes = budget + HUGE_FRAMES * 2 * MIB;
	ck_assert_int_eq(kvp_pager_reconfigure(P, &cfg, NULL), 0);
	pthread_mutex_lock(&P->lock);
	for (i = 0; i < HUGE_FRAMES; i++)
		ck_assert_ptr_nonnull(f[i] = kvp_frame_get(P, 2 * MIB));
	pthread_mutex_unlock(&P->lock);
	for (i = 0; i < HUGE_FRAMES; i++)
		ck_assert_int_eq(kvp_mem_populate(f[i], 2 * MIB), 0);
	range_rss(P->frames.arena, P->frames.arena_len, &rss, &huge);
	pthread_mutex_lock(&P->lock);
	for (i = 0; i < HUGE_FRAMES; i++) {
		kvp_frame_unuse(P, 2 * MIB);
		kvp_frame_put(P, f[i], 2 * MIB, true);
	}
	pthread_mutex_unlock(&P->lock);
	cfg.ram_budget_bytes = budget;
	ck_assert_int_eq(kvp_pager_reconfigure(P, &cfg, NULL), 0);
	ck_assert_uint_eq(rss, HUGE_FRAMES * 2 * MIB);
	return (unsigned)(huge / (2 * MIB));
}

/* Does MADV_DONTNEED over 2 MiB of small pages free their page table, so
 * that the range takes a huge page next (page-table reclaim, 6.14)? */
static bool dontneed_frees_page_table(void)
{
	uint64_t rss, huge;
	void *a;

	ck_assert_int_eq(kvp_mem_reserve(2 * MIB, 2 * MIB, false, &a), 0);
	ck_assert_int_eq(madvise(a, 2 * MIB, MADV_NOHUGEPAGE), 0);
	memset(a, 1, 2 * MIB);
	ck_assert_int_eq(madvise(a, 2 * MIB, MADV_DONTNEED), 0);
	ck_assert_int_eq(madvise(a, 2 * MIB, MADV_HUGEPAGE), 0);
	memset(a, 1, 2 * MIB);
	range_rss(a, 2 * MIB, &rss, &huge);
	kvp_mem_release(a, 2 * MIB);
	return huge == 2 * MIB;
}

/*
 * A dirty block of a copy-mode region leaves by moving its pages into a
 * slot, and UFFDIO_COPY put those pages there 4 KiB at a time.  Kept as a
 * frame, they would be read into next, each read split into requests of
 * 254 pages at most (virtio-blk), three for a 2 MiB block where a huge
 * page takes one.  So frames handed out after dirty evictions are huge
 * pages, as before them.
 */
START_TEST(test_dirty_eviction_keeps_huge_frames)
{
	struct popts po = { .budget = 16 * MIB, .mode = KVP_INSTALL_COPY };
	size_t size = 64 * MIB;
	volatile uint64_t *p;
	unsigned before, after;
	char thp[16];

	if (kvp_thp_mode(thp, sizeof(thp)) || strcmp(thp, "never") == 0) {
		printf("dirty_eviction_keeps_huge_frames: THP off, nothing "
		       "to check\n");
		return;
	}
	if (!dontneed_frees_page_table()) {
		printf("dirty_eviction_keeps_huge_frames: this kernel keeps "
		       "emptied page tables: nothing to check\n");
		return;
	}
	p = (volatile uint64_t *)fx_seeded_region(ST_MEM, size, 2 * MIB, &po);
	(void)touch_read(R, 0, size);
	settle(R);
	before = fresh_frames_huge();
	if (before < HUGE_FRAMES) {
		printf("dirty_eviction_keeps_huge_frames: %u of %u fresh "
		       "frames are huge pages (THP short): nothing to check\n",
		       before, HUGE_FRAMES);
		return;
	}
	for (int pass = 0; pass < 2; pass++)
		for (size_t at = 0; at < size; at += PG)
			p[at / 8] = p[at / 8]; /* dirty, same data */
	settle(R);
	ck_assert_uint_ge(rstats(R).evictions_dirty_total, size / (2 * MIB));
	after = fresh_frames_huge();
	ck_assert_msg(after == HUGE_FRAMES,
		      "after dirty evictions %u of %u frames are huge pages",
		      after, HUGE_FRAMES);
	check_region(R, 0, size, SEED_A);
}
END_TEST

static atomic_uint wb_all, wb_huge, wb_hidden;

static void count_write_back(enum kvp_test_point at, void *buf)
{
	int huge;

	if (at != KVP_TEST_WRITE_BACK)
		return;
	huge = kvp_test_one_huge_page(buf);
	atomic_fetch_add(&wb_all, 1);
	if (huge < 0)
		atomic_fetch_add(&wb_hidden, 1);
	else if (huge)
		atomic_fetch_add(&wb_huge, 1);
}

/*
 * The pages of a dirty 2 MiB block of a copy-mode region are the small
 * pages UFFDIO_COPY put there, scattered in memory.  Written from them,
 * virtio-blk splits the write into requests of 254 pages, and a device
 * without indirect descriptors (Firecracker's) takes one such request
 * at a time: a sequential writer ran at 0.83x raw (kvpbench touch).  So a
 * write-back goes from one huge page, the block's bytes copied there,
 * and what reaches the store is what the program wrote.
 */
START_TEST(test_dirty_writeback_from_huge_page)
{
	struct popts po = { .budget = 16 * MIB, .mode = KVP_INSTALL_COPY };
	size_t size = 64 * MIB;
	unsigned all, huge;
	char thp[16], *a;

	if (kvp_thp_mode(thp, sizeof(thp)) || strcmp(thp, "never") == 0) {
		printf("dirty_writeback_from_huge_page: THP off, nothing to "
		       "check\n");
		return;
	}
	a = fx_seeded_region(ST_MEM, size, 2 * MIB, &po);
	(void)touch_read(R, 0, size);
	settle(R);
	if (fresh_frames_huge() < HUGE_FRAMES) {
		printf("dirty_writeback_from_huge_page: THP short, nothing to "
		       "check\n");
		return;
	}
	kvp_test_hook = count_write_back;
	kvp_test_fill(a, size, SEED_B, 0); /* each block dirty, then out */
	settle(R);
	kvp_test_hook = NULL;
	if (atomic_load(&wb_hidden)) {
		printf("dirty_writeback_from_huge_page: frame numbers hidden "
		       "(no CAP_SYS_ADMIN), nothing to check\n");
		return;
	}
	all = atomic_load(&wb_all);
	huge = atomic_load(&wb_huge);
	printf("dirty_writeback_from_huge_page: %u of %u write-backs from "
	       "one huge page\n", huge, all);
	ck_assert_uint_ge(all, (size - po.budget) / (2 * MIB));
	ck_assert_msg(huge * 2 >= all,
		      "%u of %u write-backs from one huge page", huge, all);
	ck_assert_int_eq(kvp_region_flush(R), 0);
	ck_assert_int_eq(store_check(S, 0, size, SEED_B), -1);
	check_region(R, 0, size, SEED_B);
}
END_TEST

/*
 * A page the program mlocked in a clean block: a batched MADV_DONTNEED
 * stopped at its VMA, having dropped the pages before it, and the move
 * that followed refused the locked page too, so the block stayed resident
 * without the pages the zap had dropped: they read back as zeros.  (Found
 * by review; the program's lock is the program's business, the block's
 * data is ours.)
 */
START_TEST(test_zap_locked_page)
{
	struct popts po = { .budget = 16 * MIB, .mode = KVP_INSTALL_COPY };
	size_t size = 64 * MIB;
	char *a = fx_seeded_region(ST_MEM, size, 2 * MIB, &po);

	(void)touch_read(R, 0, size);
	settle(R);
	ck_assert_int_eq(kvp_test_mlock(a + PG, PG), 0); /* in block 0 */
	for (int pass = 0; pass < 20; pass++) {
		(void)touch_read(R, 0, size);
		ck_assert_int_eq(kvp_region_flush(R), 0);
	}
	settle(R);
	ck_assert_int_eq(kvp_test_munlock(a + PG, PG), 0);
	check_region(R, 0, size, SEED_A);
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
	buf = kvp_test_xalloc(size);
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

	ck_assert(
	    status_cpus("/proc/thread-self/status", NULL, own, sizeof(own)));
	(void)fx_seeded_region(ST_MEM, size, bs, &po);
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
	uint8_t *dropped;  /* per page of the upper half */
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
			ck_assert_int_eq(
			    kvp_test_check(w + 1, PG - 8, SEED_B, off + 8), -1);
		} else {
			check_region(R, off, PG, SEED_B);
		}
	}
	for (size_t off = half; off < x.size; off += PG) {
		if (x.dropped[(off - half) / PG])
			ck_assert_msg(kvp_test_is_zero(base + off, PG),
				      "page at %zu was dropped but reads data",
				      off);
		else
			check_region(R, off, PG, SEED_B);
	}
	free(x.dropped);
	free(x.written);
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


/*
 * Blocks holding a page the program mlocked (_i 0-3) or made read-only
 * (_i 4-5), most of the budget, clean or dirty, move or copy mode.
 * UFFDIO_MOVE refuses such pages (it wants one plain VMA), and dirty
 * blocks and move-mode blocks left only by a move: once they held the
 * budget, faults waited for a frame for ever (this test timed out).  Now
 * they leave by a zap, written from the region first when dirty, and
 * keep their data.  (Found by review.)
 */
START_TEST(test_locked_blocks_leave)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = (_i & 1) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE };
	size_t size = 64 * MIB, bs = 2 * MIB, nlocked = 6;
	bool dirty = _i >= 2, lock = _i < 4;
	char *a = fx_seeded_region(ST_MEM, size, bs, &po);

	for (size_t off = 0; off < nlocked * bs; off += bs) {
		if (dirty)
			a[off + 2 * PG + 8] ^= 1;
		else
			(void)touch_read(R, off, bs);
		if (lock)
			ck_assert_int_eq(kvp_test_mlock(a + off + PG, PG), 0);
		else
			ck_assert_int_eq(mprotect(a + off + PG, PG, PROT_READ),
					 0);
	}
	for (int pass = 0; pass < 3; pass++)
		(void)touch_read(R, nlocked * bs, size - nlocked * bs);
	settle(R);
	for (size_t blk = 0; blk < nlocked; blk++)
		ck_assert_msg(binfo(R, blk).state == KVP_BLOCK_ABSENT,
			      "block %zu with a %s page stayed (state %d)",
			      blk, lock ? "locked" : "read-only",
			      (int)binfo(R, blk).state);
	if (lock)
		ck_assert_int_eq(kvp_test_munlock(a, size), 0);
	else
		ck_assert_int_eq(mprotect(a, size, PROT_READ | PROT_WRITE), 0);
	if (dirty)
		for (size_t off = 0; off < nlocked * bs; off += bs)
			a[off + 2 * PG + 8] ^= 1;
	check_region(R, 0, size, SEED_A);
}
END_TEST

/* Block @blk's flags, read under the pager's lock. */
static uint32_t block_flags(uint64_t blk)
{
	uint32_t f;

	pthread_mutex_lock(&P->lock);
	f = R->blocks[blk].flags;
	pthread_mutex_unlock(&P->lock);
	return f;
}

static char *cleaned_at;
static atomic_int cleaned_drops;

/* At the zapper's write of a block it cleans: the program drops all of
 * it, and the drop is handled, before the zapper takes its lock again. */
static void drop_at_clean(enum kvp_test_point at, void *addr)
{
	uint64_t before;

	if (at != KVP_TEST_CLEANED || addr != cleaned_at || cleaned_drops)
		return;
	before = rstats(R).removed_bytes_total;
	if (madvise(cleaned_at, 2 * MIB, MADV_DONTNEED) == 0)
		(void)wait_removed(R, before + 2 * MIB);
	cleaned_drops = 1;
}

/*
 * The program drops a whole block the zapper is writing from the region
 * (a block the move refused).  The drop forgot the block, and the
 * zapper's write then marked it stored again: it read the store's old
 * bytes where the program must read zeros.  (Found by review, with the
 * reproducer this test follows.)
 */
START_TEST(test_drop_during_clean)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	size_t size = 64 * MIB, bs = 2 * MIB;
	char *a = fx_seeded_region(ST_MEM, size, bs, &po);
	size_t i;

	a[2 * PG + 8] ^= 1;
	ck_assert_int_eq(kvp_test_mlock(a + PG, PG), 0);
	for (i = 0; i < 64 && !(block_flags(0) & BLK_NOMOVE); i++) {
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	ck_assert_msg(block_flags(0) & BLK_NOMOVE, "no move of block 0 refused");
	/* One VMA again, so that a drop may take all of it. */
	ck_assert_int_eq(kvp_test_munlock(a + PG, PG), 0);
	cleaned_at = a;
	cleaned_drops = 0;
	kvp_test_hook = drop_at_clean;
	for (i = 0; i < 64 && !cleaned_drops; i++) {
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	settle(R);
	kvp_test_hook = NULL;
	ck_assert_msg(cleaned_drops, "block 0 was never written to leave");
	ck_assert_msg(kvp_test_is_zero(a, bs),
		      "block 0, dropped whole, reads the store's bytes");
	check_region(R, bs, size - bs, SEED_A);
}
END_TEST

/* COLD hints on block 0 and reads of the others until block 0 is marked
 * as refusing its move (or has left: false). */
static bool refuse_move_of_block0(size_t bs)
{
	for (size_t i = 0; i < 64 && !(block_flags(0) & BLK_NOMOVE); i++) {
		if (binfo(R, 0).state == KVP_BLOCK_ABSENT)
			return false;
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	return block_flags(0) & BLK_NOMOVE;
}

/*
 * The clock keeps a victim that stays resident.  Chosen alone in the
 * list, it left the hand on NULL though still in it: when it stayed (the
 * zapper writes a dirty block that refused its move first; no slot), the
 * next block added began a new list and it was lost from the clock, and
 * its removal later orphaned that list.  Every resident block then out of
 * the clock, a load waiting for a frame waited for ever (kvpsoak --churn
 * hung so, 8 blocks resident, 6 loads waiting, the hand on NULL).
 */
START_TEST(test_clock_keeps_a_lone_victim)
{
	static struct kvp_pager p;
	static struct kvp_region r;
	static struct kvp_block b[2];
	struct kvp_region *rp = NULL;
	struct kvp_block *x;
	unsigned n = 0;

	r.p = &p;
	r.blocks = b;
	r.nblocks = 2;
	for (unsigned i = 0; i < 2; i++) {
		b[i].owner = &r;
		b[i].state = KVP_BLOCK_RESIDENT;
	}
	kvp_clock_add(&p, &b[0]);
	ck_assert_ptr_eq(kvp_clock_victim(&p, &rp, false), &b[0]);
	ck_assert_ptr_eq(rp, &r);
	kvp_clock_add(&p, &b[1]); /* b[0] stayed resident */
	x = p.clock;
	do {
		n++;
		x = x->next;
	} while (x && x != p.clock && n < 4);
	ck_assert_msg(n == 2, "%u blocks in the clock, 2 resident", n);
	kvp_clock_del(&p, &b[0]);
	kvp_clock_del(&p, &b[1]);
	ck_assert_ptr_null(p.clock);
}
END_TEST

/*
 * A move refused while the program had locked a page of the block (_i 0)
 * remembers the split (BLK_VMAS): the block is zapped a page at a time
 * from then on, even once the lock is undone.  One refused while the
 * whole block was locked (_i 1: one VMA) does not: it keeps one range a
 * call.  Either way the data stays right.
 */
START_TEST(test_refused_move_keeps_split)
{
	struct popts po = { .budget = 16 * MIB, .mode = KVP_INSTALL_MOVE };
	size_t bs = 2 * MIB, lock = _i ? bs : PG;
	char *a = fx_seeded_region(ST_MEM, 64 * MIB, bs, &po);
	char *at = a + (_i ? 0 : PG);

	ck_assert_int_eq(kvp_test_mlock(at, lock), 0);
	ck_assert(refuse_move_of_block0(bs));
	ck_assert_msg(!(block_flags(0) & BLK_VMAS) == (_i == 1),
		      "block 0's split %s", _i ? "taken from a whole lock"
					       : "not kept");
	ck_assert_int_eq(kvp_test_munlock(at, lock), 0);
	for (size_t i = 0; i < 32; i++) {
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	settle(R);
	check_region(R, 0, 64 * MIB, SEED_A);
}
END_TEST

/*
 * A dirty block with a page the program made inaccessible (PROT_NONE):
 * the zapper's copy could not read that page and wrote zeros for it, then
 * zapped the block, so the page read zeros once accessible again.  Now
 * the copy reads it through /proc/self/mem, and a block that still does
 * not read whole is not written, and stays.  (Found by review.)
 */
START_TEST(test_protnone_page_kept)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	size_t bs = 2 * MIB;
	char *a = fx_seeded_region(ST_MEM, 64 * MIB, bs, &po);

	a[2 * PG + 8] ^= 1;
	ck_assert_int_eq(mprotect(a + PG, PG, PROT_NONE), 0);
	(void)refuse_move_of_block0(bs);
	for (size_t i = 0; i < 32; i++) { /* chances to leave */
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	settle(R);
	ck_assert_int_eq(mprotect(a + PG, PG, PROT_READ | PROT_WRITE), 0);
	a[2 * PG + 8] ^= 1;
	check_region(R, 0, bs, SEED_A);
}
END_TEST

/*
 * The program drops a block whole while the zapper's write of its copy
 * waits on the store, writes it anew and flushes: the flush passed over
 * the block (the drop had forgotten the zapper's mark), and the zapper's
 * late write of the old copy landed over the new bytes.  A flush now
 * waits for any holder of the block.  (Found by review.)
 */
START_TEST(test_flush_after_drop_during_clean)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	size_t bs = 2 * MIB;
	struct kvp_fault_plan plan = { .delay_us = 1000000 }, none = { 0 };
	char *a = fx_faulty_region(64 * MIB, bs, &po);
	struct kvp_config c;
	uint64_t before;

	a[2 * PG + 8] ^= 1;
	ck_assert_int_eq(kvp_test_mlock(a + PG, PG), 0);
	ck_assert(refuse_move_of_block0(bs));
	ck_assert_int_eq(kvp_test_munlock(a + PG, PG), 0);
	a[2 * PG + 8] ^= 1; /* dirty, if a clean went meanwhile */
	ck_assert_int_eq(kvp_store_faulty_set(S, &plan), 0);
	(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
	kvp_pager_config(P, &c);
	c.ram_budget_bytes = 8 * MIB; /* the watermark stage evicts */
	ck_assert_int_eq(kvp_pager_reconfigure(P, &c, NULL), 0);
	for (int k = 0; k < 2000 && !(block_flags(0) & BLK_FLUSHING); k++)
		usleep(1000);
	ck_assert_msg(block_flags(0) & BLK_FLUSHING, "no clean of block 0");
	usleep(200000); /* copied; its write waits in the store */
	before = rstats(R).removed_bytes_total;
	ck_assert_int_eq(madvise(a, bs, MADV_DONTNEED), 0);
	(void)wait_removed(R, before + bs);
	memset(a, 0x5a, bs);
	ck_assert_int_eq(kvp_store_faulty_set(S, &none), 0);
	ck_assert_int_eq(kvp_region_flush(R), 0);
	for (size_t i = 0; i < 64 && binfo(R, 0).state != KVP_BLOCK_ABSENT;
	     i++) {
		(void)kvp_region_advise(R, 0, 1, KVP_ADVICE_COLD);
		(void)touch_read(R, bs * (1 + i % 31), bs);
	}
	ck_assert_int_eq(binfo(R, 0).state, KVP_BLOCK_ABSENT);
	for (size_t o = 0; o < bs; o += 8)
		ck_assert_msg(*(volatile uint64_t *)(a + o) ==
				  0x5a5a5a5a5a5a5a5aull,
			      "block 0 reads the old copy at %zu", o);
}
END_TEST

/*
 * Blocks the move refuses that no zap can take either: a locked page and
 * a page the program dropped (holes).  Six of the budget's eight blocks:
 * the clock kept choosing them, and faults waited for a frame for ever.
 * The others come and go (the zapper's copy takes these too now:
 * test_stuck_budget_leaves); once unlocked, they move again (passed over
 * for good, they had kept a read waiting once the budget shrank to
 * them).  (Found by review.)
 */
START_TEST(test_stuck_blocks_skipped)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = _i ? KVP_INSTALL_COPY : KVP_INSTALL_MOVE };
	size_t size = 64 * MIB, bs = 2 * MIB, nstuck = 6;
	char *a = fx_seeded_region(ST_MEM, size, bs, &po);
	struct kvp_config c;

	for (size_t off = 0; off < nstuck * bs; off += bs) {
		a[off + 2 * PG + 8] ^= 1;
		ck_assert_int_eq(kvp_test_mlock(a + off + PG, PG), 0);
		ck_assert_int_eq(madvise(a + off + 4 * PG, PG, MADV_DONTNEED),
				 0);
	}
	for (int pass = 0; pass < 3; pass++)
		check_region(R, nstuck * bs, size - nstuck * bs, SEED_A);
	/* Unlocked, they may move again: with the budget shrunk to them,
	 * the next read needs one to leave (it waited for ever). */
	ck_assert_int_eq(kvp_test_munlock(a, size), 0);
	kvp_pager_config(P, &c);
	c.ram_budget_bytes = nstuck * bs;
	ck_assert_int_eq(kvp_pager_reconfigure(P, &c, NULL), 0);
	check_region(R, 24 * bs, 4 * bs, SEED_A);
	kvp_pager_config(P, &c);
	c.ram_budget_bytes = 16 * MIB;
	ck_assert_int_eq(kvp_pager_reconfigure(P, &c, NULL), 0);
	for (size_t off = 0; off < nstuck * bs; off += bs) {
		ck_assert(kvp_test_is_zero(a + off + 4 * PG, PG));
		a[off + 2 * PG + 8] ^= 1;
		check_region(R, off, 4 * PG, SEED_A);
		check_region(R, off + 5 * PG, bs - 5 * PG, SEED_A);
	}
}
END_TEST

/*
 * Every block of the budget holds a page the program locked (_i 0-1) or
 * made inaccessible (_i 2-3), a page it dropped, and a write.  No move
 * takes them, and a zap alone would bring the store's old bytes back
 * where the program dropped: they were no victim, and the next read
 * outside them waited for a frame for ever (kvpsoak --churn hung so).
 * Now the zapper fills their holes with write-protected zeros, writes a
 * copy read through /proc/self/mem (which reads what the program cannot)
 * and zaps them, and they come back as they were.
 */
START_TEST(test_stuck_budget_leaves)
{
	struct popts po = { .budget = 16 * MIB,
			    .mode = (_i & 1) ? KVP_INSTALL_COPY
					     : KVP_INSTALL_MOVE };
	size_t size = 64 * MIB, bs = 2 * MIB, nstuck = 8, left = 0;
	bool lock = _i < 2;
	char *a = fx_seeded_region(ST_MEM, size, bs, &po);

	for (size_t off = 0; off < nstuck * bs; off += bs) {
		a[off + 2 * PG + 8] ^= 1;
		ck_assert_int_eq(madvise(a + off + 4 * PG, PG, MADV_DONTNEED),
				 0);
		if (lock)
			ck_assert_int_eq(kvp_test_mlock(a + off + PG, PG), 0);
		else
			ck_assert_int_eq(mprotect(a + off + PG, PG, PROT_NONE),
					 0);
	}
	for (int pass = 0; pass < 2; pass++)
		check_region(R, nstuck * bs, size - nstuck * bs, SEED_A);
	settle(R);
	/* Most leave; one loaded again early on is the working set (the
	 * clock keeps it while others can go). */
	for (size_t blk = 0; blk < nstuck; blk++)
		left += binfo(R, blk).state == KVP_BLOCK_ABSENT;
	ck_assert_msg(left >= nstuck / 2, "%zu of %zu blocks left", left,
		      nstuck);
	if (lock)
		ck_assert_int_eq(kvp_test_munlock(a, size), 0);
	else
		ck_assert_int_eq(mprotect(a, size, PROT_READ | PROT_WRITE), 0);
	for (size_t off = 0; off < nstuck * bs; off += bs) {
		ck_assert_msg(kvp_test_is_zero(a + off + 4 * PG, PG),
			      "the page dropped in block %zu reads bytes",
			      off / bs);
		a[off + 2 * PG + 8] ^= 1;
		check_region(R, off, 4 * PG, SEED_A);
		check_region(R, off + 5 * PG, bs - 5 * PG, SEED_A);
	}
}
END_TEST

static Suite *pager_evict_suite(void)
{
	Suite *s = suite_create("pager_evict");
	TCase *t;

	t = fx_tcase(s, "budget", 120);
	tcase_add_loop_test(t, test_budget, 0, 4);
	tcase_add_test(t, test_small_frames_not_huge);
	tcase_add_test(t, test_dirty_eviction_keeps_huge_frames);
	tcase_add_test(t, test_dirty_writeback_from_huge_page);
	t = fx_tcase(s, "write_race", 120);
	tcase_add_loop_test(t, test_write_during_eviction, 0, 4);
	t = fx_tcase(s, "zap", 120);
	tcase_add_loop_test(t, test_zap_clean_eviction, 0, 4);
	tcase_add_test(t, test_zap_drop_race);
	tcase_add_test(t, test_zap_locked_page);
	tcase_add_test(t, test_zap_follows_reader);
	t = fx_tcase(s, "regressions", 120);
	tcase_add_test(t, test_bug_move_ebusy);
	tcase_add_test(t, test_bug_watermark_100);
	tcase_add_loop_test(t, test_locked_blocks_leave, 0, 6);
	tcase_add_loop_test(t, test_drop_during_clean, 0, 2);
	tcase_add_loop_test(t, test_stuck_blocks_skipped, 0, 2);
	tcase_add_loop_test(t, test_stuck_budget_leaves, 0, 4);
	tcase_add_loop_test(t, test_protnone_page_kept, 0, 2);
	tcase_add_loop_test(t, test_refused_move_keeps_split, 0, 2);
	tcase_add_test(t, test_clock_keeps_a_lone_victim);
	tcase_add_loop_test(t, test_flush_after_drop_during_clean, 0, 2);
	return s;
}

int main(void)
{
	return fx_main(pager_evict_suite);
}
