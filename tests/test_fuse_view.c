/*
 * test_fuse_view.c - lib/view/fuse_view.c: the debug view, on a real mount.
 *
 * Each test (a checked fixture, in its own child) opens a pager, makes a
 * region on a memory store, writes a pattern into its first blocks and
 * mounts the view in a fresh folder.  Then: every file reads, every tunable
 * takes valid writes and refuses invalid ones, a smaller budget shows in
 * the engine's statistics, data/<block> equals what was written, reading
 * the view changes no residency, metrics is Prometheus text, sequences
 * appear once registered, unmounting is clean and a stale mount (a server
 * killed) is recovered.
 *
 * Skipped (77) where /dev/fuse or fusermount3 is missing or the pager
 * cannot open a userfaultfd.
 *
 * Also a helper for tests/t_kvpctl.sh: `test_fuse_view --serve` opens a
 * pager from the environment (kvp_instance_open: KVP_* tunables,
 * KVP_FUSE_MOUNT), makes region "demo", writes a pattern, prints
 * "ready <mount>" and touches blocks until SIGTERM.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/view/fuse_view.h"
#include "lib/instance/instance.h"
#include "lib/tunables/tunables.h"
#include "pager/pager.h"
#include "tests/helpers/helpers.h"

#define KIB	1024u
#define MIB	(1024u * 1024u)
#define BLOCK	(64 * KIB)
#define NBLOCKS 64u /* region of 4 MiB */
#define WRITTEN 16u /* blocks 0..15 hold the pattern */
#define BUDGET	(8 * MIB)

static char base[64]; /* fresh folder */
static char mnt[128]; /* base/mnt */
static struct kvp_pager *pager;
static struct kvp_store *store;
static struct kvp_region *region;
static struct kvp_fuse_view *fv;
/* What kv_apply (called on the view's thread) got last: under
 * applied_lock, since the test thread reads it. */
static pthread_mutex_t applied_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_kv_config applied;
static _Atomic int kv_applies;
static _Atomic bool kv_refuse;

static uint64_t pattern(uint64_t off)
{
	uint64_t z = off * 0x9e3779b97f4a7c15ull + 0x1234567;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	return z ^ (z >> 27);
}

static void write_pattern(void *addr, size_t len)
{
	uint64_t *w = addr;
	size_t i;

	for (i = 0; i < len / 8; i++)
		w[i] = pattern(i * 8);
}

static int kv_apply(void *arg, const struct kvp_kv_config *cfg,
		    const char **bad)
{
	if (kv_refuse) {
		*bad = "predictor";
		return -EINVAL;
	}
	pthread_mutex_lock(&applied_lock);
	applied = *cfg;
	pthread_mutex_unlock(&applied_lock);
	kv_applies++;
	return 0;
}

static uint64_t applied_depth(void)
{
	uint64_t v;

	pthread_mutex_lock(&applied_lock);
	v = applied.prefetch_depth_layers;
	pthread_mutex_unlock(&applied_lock);
	return v;
}

static void path_of(char *buf, size_t len, const char *rel)
{
	snprintf(buf, len, "%s/%s", mnt, rel);
}

/* The whole file at @rel under the mount, NUL-terminated, in a malloc'd
 * buffer; *len its length.  NULL and errno on failure. */
static char *slurp(const char *rel, size_t *len)
{
	char path[1024], *buf = NULL, *nb;
	size_t cap = 0, n = 0;
	ssize_t r;
	int fd;

	path_of(path, sizeof(path), rel);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return NULL;
	for (;;) {
		if (cap - n < 65536) {
			cap = cap ? cap * 2 : 131072;
			nb = realloc(buf, cap + 1);
			ck_assert_ptr_nonnull(nb);
			buf = nb;
		}
		r = read(fd, buf + n, cap - n);
		if (r < 0) {
			int e = errno;

			free(buf);
			close(fd);
			errno = e;
			return NULL;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}

static uint64_t read_u64(const char *rel)
{
	char *s = slurp(rel, NULL);
	uint64_t v;

	ck_assert_msg(s != NULL, "read %s: %s", rel, strerror(errno));
	v = strtoull(s, NULL, 10);
	free(s);
	return v;
}

/* 0 or -errno of open(O_WRONLY|O_TRUNC) + one write + close. */
static int put(const char *rel, const char *text)
{
	char path[1024];
	ssize_t w;
	int fd, r = 0;

	path_of(path, sizeof(path), rel);
	fd = open(path, O_WRONLY | O_TRUNC);
	if (fd < 0)
		return -errno;
	w = write(fd, text, strlen(text));
	if (w < 0)
		r = -errno;
	else if ((size_t)w != strlen(text))
		r = -EIO;
	if (close(fd) && !r)
		r = -errno;
	return r;
}

static void setup(void)
{
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	struct kvp_region_opts ro = { 0 };
	struct kvp_fuse_view_opts vo = { 0 };

	snprintf(base, sizeof(base), "/tmp/kvp-fv-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(mnt, sizeof(mnt), "%s/mnt", base);
	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = BUDGET;
	ck_assert_int_eq(kvp_pager_open(&cfg, &pager), 0);
	ck_assert_int_eq(kvp_store_memory_create(NBLOCKS * BLOCK, &store), 0);
	ro.name = "kv0";
	ro.size = NBLOCKS * BLOCK;
	ro.block_bytes = BLOCK;
	ro.store = store;
	ck_assert_int_eq(kvp_region_create(pager, &ro, &region), 0);
	write_pattern(kvp_region_addr(region), WRITTEN * BLOCK);
	kvp_kv_config_defaults(&kv);
	pthread_mutex_lock(&applied_lock);
	memset(&applied, 0, sizeof(applied));
	pthread_mutex_unlock(&applied_lock);
	kv_applies = 0;
	kv_refuse = false;
	vo.mountpoint = mnt;
	vo.kv = &kv;
	vo.kv_apply = kv_apply;
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &fv, NULL, 0), 0);
}

static void teardown(void)
{
	char cmd[128];

	kvp_fuse_view_unmount(fv);
	fv = NULL;
	if (region)
		kvp_region_destroy(region);
	region = NULL;
	kvp_pager_close(pager);
	pager = NULL;
	kvp_store_destroy(store);
	store = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	if (system(cmd))
		fprintf(stderr, "cleanup of %s failed\n", base);
}

/* ---- every file ---- */

static int nfiles, ndirs;

static void walk(const char *rel)
{
	char path[1024], child[512];
	struct dirent *de;
	struct stat st;
	DIR *d;

	path_of(path, sizeof(path), rel);
	d = opendir(path);
	ck_assert_msg(d != NULL, "opendir %s: %s", path, strerror(errno));
	ndirs++;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(child, sizeof(child), "%s%s%s", rel, *rel ? "/" : "",
			 de->d_name);
		path_of(path, sizeof(path), child);
		ck_assert_int_eq(stat(path, &st), 0);
		if (S_ISDIR(st.st_mode)) {
			ck_assert_uint_eq(st.st_mode & 0777, 0555);
			walk(child);
			continue;
		}
		ck_assert(S_ISREG(st.st_mode));
		nfiles++;
		if (!strcmp(child, "apply")) {
			ck_assert_uint_eq(st.st_mode & 0777, 0200);
			ck_assert_ptr_null(slurp(child, NULL));
			ck_assert_int_eq(errno, EACCES);
			continue;
		}
		{
			size_t len;
			char *s = slurp(child, &len);
			size_t i;

			ck_assert_msg(s != NULL, "read %s: %s", child,
				      strerror(errno));
			if (strstr(child, "/data/")) {
				ck_assert_uint_eq(len, BLOCK);
			} else if (strcmp(child, "last_error")) {
				ck_assert_msg(len > 0, "%s is empty", child);
				ck_assert_int_eq(s[len - 1], '\n');
				for (i = 0; i < len; i++)
					ck_assert_msg(
					    isprint((unsigned char)s[i]) ||
						s[i] == '\n',
					    "%s: byte %zu not ASCII", child, i);
			}
			/* one value per file, except the listings */
			if (!strstr(child, "/data/") &&
			    strcmp(child, "metrics") &&
			    !strstr(child, "/blocks") &&
			    strcmp(child, "last_error"))
				ck_assert_msg(strchr(s, '\n') == s + len - 1,
					      "%s has several lines", child);
			free(s);
		}
	}
	closedir(d);
}

START_TEST(read_every_file)
{
	struct stat st;
	char path[1024];
	size_t i;

	nfiles = ndirs = 0;
	walk("");
	/* tunables, stats x 2, region files, data, top files */
	ck_assert_int_ge(nfiles, (int)(kvp_tunables_count() + NBLOCKS + 7 + 5));
	ck_assert_int_ge(ndirs, 7);
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		char rel[128];

		snprintf(rel, sizeof(rel), "tunables/%s", t->name);
		path_of(path, sizeof(path), rel);
		ck_assert_int_eq(stat(path, &st), 0);
		ck_assert_uint_eq(st.st_mode & 0777, t->runtime ? 0644 : 0444);
	}
	path_of(path, sizeof(path), "stats/demand_faults_total");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0444);
	path_of(path, sizeof(path), "regions/kv0/data/64");
	ck_assert_int_eq(stat(path, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	path_of(path, sizeof(path), "regions/nope");
	ck_assert_int_eq(stat(path, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	ck_assert_uint_eq(read_u64("regions/kv0/size_bytes"), NBLOCKS * BLOCK);
	ck_assert_uint_eq(read_u64("regions/kv0/block_size_bytes"), BLOCK);
	ck_assert_uint_eq(read_u64("regions/kv0/nr_blocks"), NBLOCKS);
	ck_assert_uint_eq(read_u64("pid"), (uint64_t)getpid());
	{
		char *s = slurp("regions/kv0/install_mode", NULL);

		ck_assert(!strcmp(s, "move\n") || !strcmp(s, "copy\n"));
		free(s);
		s = slurp("tunables/install_mode", NULL);
		ck_assert_str_eq(s, "[auto] move copy\n");
		free(s);
		s = slurp("regions/kv0/store", NULL);
		ck_assert_uint_gt(strlen(s), 1); /* the store's description */
		free(s);
	}
}
END_TEST

/* What the registry says a write of @v to @t must do, on copies. */
static bool registry_accepts(const struct kvp_tunable *t, uint64_t v)
{
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kv };

	kvp_pager_config(pager, &cfg);
	kvp_view_kv_config(kvp_fuse_view_tree(fv), &kv);
	return kvp_tunable_set(&tg, t, v, NULL, 0) == 0;
}

static void format_for_write(const struct kvp_tunable *t, uint64_t v, char *buf,
			     size_t len)
{
	const char *s = t->choices, *e;
	uint64_t i = 0;

	if (t->type != KVP_T_CHOICE) {
		snprintf(buf, len, "%llu\n", (unsigned long long)v);
		return;
	}
	for (;;) {
		e = strchr(s, ' ');
		if (i == v || !e)
			break;
		s = e + 1;
		i++;
	}
	snprintf(buf, len, "%.*s\n", e ? (int)(e - s) : (int)strlen(s), s);
}

START_TEST(write_each_tunable)
{
	char rel[128], text[KVP_TUNABLE_VALUE_MAX], want[KVP_TUNABLE_VALUE_MAX];
	char *s;
	size_t i;

	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		uint64_t cands[4];
		int k;

		snprintf(rel, sizeof(rel), "tunables/%s", t->name);
		s = slurp(rel, NULL);
		ck_assert_ptr_nonnull(s);
		free(s);
		if (!t->runtime) {
			ck_assert_int_eq(put(rel, "1\n"), -EACCES);
			continue;
		}
		/* valid candidates: the default and the bounds; budgets
		   the machine can hold */
		cands[0] = t->def;
		cands[1] = t->min;
		cands[2] = t->type == KVP_T_BYTES ? BUDGET / 2 : t->max;
		cands[3] = t->type == KVP_T_BYTES ? BUDGET : t->min + 1;
		for (k = 0; k < 4; k++) {
			bool ok = registry_accepts(t, cands[k]);
			int r;

			format_for_write(t, cands[k], text, sizeof(text));
			r = put(rel, text);
			ck_assert_msg(r == (ok ? 0 : -EINVAL),
				      "%s <- %s: %d (registry %d)", t->name,
				      text, r, ok);
			if (!ok)
				continue;
			kvp_tunable_format(t, cands[k], want, sizeof(want));
			strcat(want, "\n");
			s = slurp(rel, NULL);
			ck_assert_str_eq(s, want);
			free(s);
		}
		/* invalid: nothing changes, last_error says why */
		s = slurp(rel, NULL);
		ck_assert_int_eq(put(rel, "bogus\n"), -EINVAL);
		{
			char *after = slurp(rel, NULL), *le;

			ck_assert_str_eq(after, s);
			free(after);
			le = slurp("last_error", NULL);
			ck_assert_msg(strstr(le, t->name) &&
					  strstr(le, "bogus"),
				      "last_error '%s'", le);
			free(le);
		}
		if (t->type != KVP_T_CHOICE && t->max < UINT64_MAX) {
			snprintf(text, sizeof(text), "%llu\n",
				 (unsigned long long)t->max + 1);
			ck_assert_int_eq(put(rel, text), -EINVAL);
			{
				char *after = slurp(rel, NULL);

				ck_assert_str_eq(after, s);
				free(after);
			}
		}
		free(s);
	}
	/* KV writes reached the KV layer */
	ck_assert_int_gt(kv_applies, 0);
	ck_assert_int_eq(put("tunables/prefetch_depth_layers", "7"), 0);
	ck_assert_uint_eq(applied_depth(), 7);
	kv_refuse = true;
	ck_assert_int_eq(put("tunables/prefetch_depth_layers", "3"), -EINVAL);
	ck_assert_uint_eq(read_u64("tunables/prefetch_depth_layers"), 7);
	kv_refuse = false;
	/* without a KV layer its tunables are read-only */
	kvp_view_set_kv(kvp_fuse_view_tree(fv), NULL, NULL, NULL);
	ck_assert_int_eq(put("tunables/prefetch_depth_layers", "3"), -EACCES);
	/* read-only files refuse writes, even for root */
	ck_assert_int_eq(put("stats/demand_faults_total", "0"), -EACCES);
	ck_assert_int_eq(put("regions/kv0/size_bytes", "0"), -EACCES);
	ck_assert_int_eq(put("regions/kv0/data/0", "x"), -EACCES);
	ck_assert_int_eq(put("metrics", "x"), -EACCES);
	{
		char path[1024];

		path_of(path, sizeof(path), "tunables/new_thing");
		ck_assert_int_eq(open(path, O_WRONLY | O_CREAT, 0644), -1);
		ck_assert_int_eq(errno, EACCES);
		ck_assert_int_eq(truncate(path, 0), -1);
		ck_assert_int_eq(errno, ENOENT);
	}
}
END_TEST

START_TEST(apply_all_or_nothing)
{
	char *le;

	ck_assert_int_eq(put("apply", "ram_budget_bytes = 4M\n"
				      "prefetch_depth_layers = 5\n"
				      "install_mode = frob\n"),
			 -EINVAL);
	ck_assert_uint_eq(read_u64("tunables/ram_budget_bytes"), BUDGET);
	ck_assert_uint_eq(read_u64("tunables/prefetch_depth_layers"), 2);
	le = slurp("last_error", NULL);
	ck_assert_msg(strstr(le, "line 3") != NULL, "%s", le);
	free(le);
	ck_assert_int_eq(put("apply", "io_depth = 8\n"), -EINVAL);
	ck_assert_int_eq(put("apply", "# comment\nram_budget_bytes = 4M\n"
				      "prefetch_depth_layers = 5\n"),
			 0);
	ck_assert_uint_eq(read_u64("tunables/ram_budget_bytes"), 4 * MIB);
	ck_assert_uint_eq(read_u64("tunables/prefetch_depth_layers"), 5);
	ck_assert_uint_eq(applied_depth(), 5);
	/* the KV layer refuses: the engine change is rolled back */
	kv_refuse = true;
	ck_assert_int_eq(put("apply", "ram_budget_bytes = 6M\n"
				      "predictor = window\n"),
			 -EINVAL);
	ck_assert_uint_eq(read_u64("tunables/ram_budget_bytes"), 4 * MIB);
	{
		struct kvp_config cfg;

		kvp_pager_config(pager, &cfg);
		ck_assert_uint_eq(cfg.ram_budget_bytes, 4 * MIB);
	}
}
END_TEST

/* A write means one thing: one write(2) per open, at offset 0, of text.
 * Before, a second write on one open file was applied too ("1" then "6"),
 * a write at an offset was taken whole, and "5\0junk" was read as 5. */
START_TEST(one_write_per_open)
{
	char path[1024], *le;
	int fd;

	path_of(path, sizeof(path), "tunables/io_batch");
	ck_assert_int_eq(put("tunables/io_batch", "3"), 0);
	fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "1", 1), 1);
	ck_assert_int_eq(write(fd, "6", 1), -1);
	ck_assert_int_eq(errno, EINVAL);
	close(fd);
	ck_assert_uint_eq(read_u64("tunables/io_batch"), 1);
	le = slurp("last_error", NULL);
	ck_assert_msg(strstr(le, "second write") != NULL, "%s", le);
	free(le);

	fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "7", 1, 1), -1);
	ck_assert_int_eq(errno, EINVAL);
	close(fd);
	ck_assert_uint_eq(read_u64("tunables/io_batch"), 1);
	le = slurp("last_error", NULL);
	ck_assert_msg(strstr(le, "offset 1") != NULL, "%s", le);
	free(le);

	fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "5\0junk", 6), -1);
	ck_assert_int_eq(errno, EINVAL);
	close(fd);
	ck_assert_uint_eq(read_u64("tunables/io_batch"), 1);

	path_of(path, sizeof(path), "apply");
	fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "io_batch = 2\n\x01\n", 15), -1);
	ck_assert_int_eq(errno, EINVAL);
	close(fd);
	ck_assert_uint_eq(read_u64("tunables/io_batch"), 1);
	le = slurp("last_error", NULL);
	ck_assert_msg(strstr(le, "not text") != NULL, "%s", le);
	free(le);
}
END_TEST

/* Wait until no block is in transit (read-ahead the pattern's writes set
 * off may still be loading), so that a later difference is the view's. */
static void settle(void)
{
	struct kvp_block_info bi;
	int tries;
	uint64_t i;

	for (tries = 0; tries < 5000; tries++) {
		for (i = 0; i < NBLOCKS; i++) {
			ck_assert_int_eq(kvp_region_block_info(region, i, &bi),
					 0);
			if (bi.state == KVP_BLOCK_LOADING ||
			    bi.state == KVP_BLOCK_EVICTING)
				break;
		}
		if (i == NBLOCKS)
			return;
		usleep(1000);
	}
	ck_abort_msg("block %llu still in transit after 5 s",
		     (unsigned long long)i);
}

/* A smaller budget through the view shows in the engine at once. */
START_TEST(budget_takes_effect)
{
	volatile uint8_t *a = kvp_region_addr(region);
	uint64_t ev0, res;
	uint64_t i;

	/* touch every block: 4 MiB, inside the 8 MiB budget */
	for (i = 0; i < NBLOCKS; i++)
		(void)a[i * BLOCK];
	settle();
	/* most of it resident now (the engine may already trim a block) */
	ck_assert_uint_gt(read_u64("stats/resident_bytes"), 3 * MIB);
	ev0 = read_u64("stats/evictions_clean_total") +
	      read_u64("stats/evictions_dirty_total");
	ck_assert_int_eq(put("tunables/ram_budget_bytes", "2M"), 0);
	{
		struct kvp_config cfg;

		kvp_pager_config(pager, &cfg);
		ck_assert_uint_eq(cfg.ram_budget_bytes, 2 * MIB);
	}
	/* the service threads evict once poked: give them a moment */
	for (i = 0; i < 5000; i++) {
		res = read_u64("stats/resident_bytes");
		if (res <= 2 * MIB + BLOCK)
			break;
		usleep(1000);
	}
	ck_assert_msg(res <= 2 * MIB + BLOCK, "resident %llu after 2M budget",
		      (unsigned long long)res);
	ck_assert_uint_le(read_u64("regions/kv0/resident_bytes"),
			  2 * MIB + BLOCK);
	ck_assert_uint_gt(read_u64("stats/evictions_clean_total") +
			      read_u64("stats/evictions_dirty_total"),
			  ev0);
	/* dirty blocks were written back: the data survives */
	for (i = 0; i < WRITTEN * BLOCK / 8; i += 4099)
		ck_assert_uint_eq(((volatile uint64_t *)a)[i], pattern(i * 8));
	ck_assert_uint_le(read_u64("stats/resident_bytes"), 2 * MIB + BLOCK);
}
END_TEST

START_TEST(data_equals_written)
{
	uint64_t i, j;
	char rel[64];

	for (i = 0; i < NBLOCKS; i++) {
		size_t len;
		uint64_t *w;

		snprintf(rel, sizeof(rel), "regions/kv0/data/%llu",
			 (unsigned long long)i);
		w = (uint64_t *)slurp(rel, &len);
		ck_assert_ptr_nonnull(w);
		ck_assert_uint_eq(len, BLOCK);
		for (j = 0; j < BLOCK / 8; j++)
			ck_assert_uint_eq(
			    w[j], i < WRITTEN ? pattern(i * BLOCK + j * 8) : 0);
		free(w);
	}
	/* after eviction the bytes come from the store */
	ck_assert_int_eq(put("tunables/ram_budget_bytes", "2M"), 0);
	for (i = 0; i < WRITTEN; i++) {
		size_t len;
		uint64_t *w;

		snprintf(rel, sizeof(rel), "regions/kv0/data/%llu",
			 (unsigned long long)i);
		w = (uint64_t *)slurp(rel, &len);
		ck_assert_uint_eq(len, BLOCK);
		for (j = 0; j < BLOCK / 8; j += 31)
			ck_assert_uint_eq(w[j], pattern(i * BLOCK + j * 8));
		free(w);
	}
}
END_TEST

START_TEST(reading_changes_no_residency)
{
	struct kvp_block_info before[NBLOCKS], after;
	struct kvp_stats s0, s1;
	uint64_t i;
	char rel[64];

	settle();
	for (i = 0; i < NBLOCKS; i++)
		ck_assert_int_eq(kvp_region_block_info(region, i, &before[i]),
				 0);
	kvp_region_stats(region, &s0);
	for (i = 0; i < NBLOCKS; i++) {
		char *s;

		snprintf(rel, sizeof(rel), "regions/kv0/data/%llu",
			 (unsigned long long)i);
		s = slurp(rel, NULL);
		ck_assert_ptr_nonnull(s);
		free(s);
	}
	free(slurp("regions/kv0/blocks", NULL));
	free(slurp("metrics", NULL));
	for (i = 0; i < NBLOCKS; i++) {
		ck_assert_int_eq(kvp_region_block_info(region, i, &after), 0);
		ck_assert_int_eq(after.state, before[i].state);
		ck_assert_int_eq(after.dirty, before[i].dirty);
		ck_assert_uint_eq(after.last_use, before[i].last_use);
	}
	kvp_region_stats(region, &s1);
	ck_assert_uint_eq(s1.demand_faults_total, s0.demand_faults_total);
	ck_assert_uint_eq(s1.zero_fills_total, s0.zero_fills_total);
	ck_assert_uint_eq(s1.resident_bytes, s0.resident_bytes);
	ck_assert_uint_eq(s1.bytes_read_total, s0.bytes_read_total);
}
END_TEST

START_TEST(blocks_listing)
{
	char *s = slurp("regions/kv0/blocks", NULL), *line, *save = NULL;
	uint64_t n = 0;

	ck_assert_ptr_nonnull(s);
	for (line = strtok_r(s, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save), n++) {
		unsigned long long idx, last;
		char state[32];
		int dirty, stored;
		unsigned pins;

		ck_assert_int_eq(sscanf(line,
					"%llu %31s dirty=%d pins=%u stored=%d "
					"last_use=%llu",
					&idx, state, &dirty, &pins, &stored,
					&last),
				 6);
		ck_assert_uint_eq(idx, n);
		if (n < WRITTEN) {
			ck_assert_str_eq(state, "resident");
			ck_assert_int_eq(dirty, 1);
		} else {
			ck_assert_str_eq(state, "absent");
		}
	}
	ck_assert_uint_eq(n, NBLOCKS);
	free(s);
}
END_TEST

/* ---- metrics: a strict reading of the Prometheus text format ---- */

static bool metric_name_ok(const char *s, size_t n)
{
	size_t i;

	if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
		return false;
	for (i = 1; i < n; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_' ||
		      s[i] == ':'))
			return false;
	return true;
}

struct family {
	char name[128];
	char type[16];
};

START_TEST(metrics_parse)
{
	struct family fam[256];
	char *s = slurp("metrics", NULL), *line, *save = NULL;
	int nfam = 0, samples = 0, k;
	bool saw_region = false, saw_total = false, saw_sum = false;
	double inf_count = -1, count = -2, last_bucket = -1;

	ck_assert_ptr_nonnull(s);
	for (line = strtok_r(s, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		const char *p = line, *name;
		size_t nlen;
		char *end;
		double val;

		if (!strncmp(line, "# HELP ", 7)) {
			p = line + 7;
			nlen = strcspn(p, " ");
			ck_assert(metric_name_ok(p, nlen));
			ck_assert(!strncmp(p, "kvpager_", 8));
			ck_assert(p[nlen] == ' ' && p[nlen + 1]);
			continue;
		}
		if (!strncmp(line, "# TYPE ", 7)) {
			p = line + 7;
			nlen = strcspn(p, " ");
			ck_assert(metric_name_ok(p, nlen));
			ck_assert_int_lt(nfam, 256);
			for (k = 0; k < nfam; k++)
				ck_assert_msg(strncmp(fam[k].name, p, nlen) ||
						  fam[k].name[nlen],
					      "TYPE twice: %s", line);
			snprintf(fam[nfam].name, sizeof(fam[nfam].name), "%.*s",
				 (int)nlen, p);
			snprintf(fam[nfam].type, sizeof(fam[nfam].type), "%s",
				 p + nlen + 1);
			ck_assert(!strcmp(fam[nfam].type, "counter") ||
				  !strcmp(fam[nfam].type, "gauge") ||
				  !strcmp(fam[nfam].type, "histogram"));
			nfam++;
			continue;
		}
		ck_assert_msg(line[0] != '#', "stray comment: %s", line);
		/* sample: name{l="v",...} value */
		name = p;
		nlen = strcspn(p, "{ ");
		ck_assert_msg(metric_name_ok(name, nlen), "name: %s", line);
		p += nlen;
		if (*p == '{') {
			p++;
			while (*p != '}') {
				size_t ln = strcspn(p, "=");

				ck_assert(metric_name_ok(p, ln));
				p += ln;
				ck_assert_int_eq(*p++, '=');
				ck_assert_int_eq(*p++, '"');
				while (*p != '"') {
					ck_assert(*p);
					if (*p == '\\')
						p++;
					p++;
				}
				p++;
				if (*p == ',')
					p++;
				else
					ck_assert_int_eq(*p, '}');
			}
			p++;
		}
		ck_assert_int_eq(*p++, ' ');
		if (!strcmp(p, "+Inf"))
			val = 1e300;
		else {
			val = strtod(p, &end);
			ck_assert_msg(end != p && *end == '\0', "value: %s",
				      line);
		}
		/* its family was declared before it */
		for (k = nfam - 1; k >= 0; k--) {
			size_t fl = strlen(fam[k].name);

			if (!strncmp(name, fam[k].name, fl) &&
			    (name + fl == name + nlen ||
			     (!strcmp(fam[k].type, "histogram") &&
			      (!strncmp(name + fl, "_bucket", 7) ||
			       !strncmp(name + fl, "_count", 6) ||
			       !strncmp(name + fl, "_sum", 4)))))
				break;
		}
		ck_assert_msg(k >= 0, "no TYPE before %s", line);
		if (!strncmp(name, "kvpager_region_", 15) &&
		    strstr(line, "region=\"kv0\""))
			saw_region = true;
		if (!strncmp(name, "kvpager_demand_faults_total{", 28))
			saw_total = true;
		if (!strncmp(name, "kvpager_io_latency_seconds_bucket", 33)) {
			ck_assert(val >= last_bucket); /* cumulative */
			last_bucket = val;
			if (strstr(line, "le=\"+Inf\""))
				inf_count = val;
		}
		if (!strncmp(name, "kvpager_io_latency_seconds_count", 32))
			count = val;
		if (!strncmp(name, "kvpager_io_latency_seconds_sum", 30))
			saw_sum = val >= 0;
		samples++;
	}
	ck_assert(saw_region && saw_total);
	ck_assert_msg(saw_sum, "the histogram has no _sum");
	ck_assert(inf_count == count);
	ck_assert_int_gt(samples, 2 * 20);
	free(s);
}
END_TEST

/* ---- sequences ---- */

static uint32_t fake_list(void *arg, uint32_t *ids, uint32_t max)
{
	static const uint32_t live[] = { 3, 9, 100 };
	uint32_t i;

	for (i = 0; i < 3 && i < max; i++)
		ids[i] = live[i];
	return 3;
}

static int fake_table(void *arg, uint32_t id, char *buf, size_t len)
{
	if (id != 3 && id != 9 && id != 100)
		return -EINVAL;
	return snprintf(buf, len, "0 %u 16 1 resident\n1 %u 5 1 rolling\n",
			id * 2, id * 2 + 1);
}

START_TEST(seqs_hook)
{
	struct kvp_view_seq_ops ops = { fake_list, fake_table };
	char path[1024], *s;
	struct stat st;
	int n = 0;
	DIR *d;
	struct dirent *de;

	path_of(path, sizeof(path), "seqs");
	d = opendir(path);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	ck_assert_int_eq(n, 0);
	kvp_view_set_seqs(kvp_fuse_view_tree(fv), &ops, NULL);
	d = opendir(path);
	n = 0;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	ck_assert_int_eq(n, 3);
	s = slurp("seqs/9/block_table", NULL);
	ck_assert_str_eq(s, "0 18 16 1 resident\n1 19 5 1 rolling\n");
	free(s);
	path_of(path, sizeof(path), "seqs/4");
	ck_assert_int_eq(stat(path, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	kvp_view_set_seqs(kvp_fuse_view_tree(fv), NULL, NULL);
	path_of(path, sizeof(path), "seqs/9/block_table");
	ck_assert_int_eq(stat(path, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
}
END_TEST

/* ---- mounting ---- */

static bool is_mounted(const char *path)
{
	char parent[600];
	struct stat a, b;

	snprintf(parent, sizeof(parent), "%s/..", path);
	if (stat(path, &a) || stat(parent, &b))
		return errno == ENOTCONN;
	return a.st_dev != b.st_dev;
}

START_TEST(clean_unmount)
{
	struct kvp_fuse_view_opts vo = { .mountpoint = mnt };
	struct kvp_fuse_view *again;
	char path[1024];
	struct stat st;
	DIR *d;
	int n = 0;

	ck_assert(is_mounted(mnt));
	/* a second view on the same path is refused, the first stays */
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &again, NULL, 0), -EBUSY);
	ck_assert_ptr_null(again);
	ck_assert_str_eq(kvp_fuse_view_path(fv), mnt);
	kvp_fuse_view_unmount(fv);
	fv = NULL;
	ck_assert(!is_mounted(mnt));
	ck_assert_int_eq(stat(mnt, &st), 0);
	d = opendir(mnt);
	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	ck_assert_int_eq(n, 2); /* . and .. */
	path_of(path, sizeof(path), "pid");
	ck_assert_int_eq(access(path, F_OK), -1);
	/* and it mounts again */
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &fv, NULL, 0), 0);
	ck_assert_uint_eq(read_u64("pid"), (uint64_t)getpid());
}
END_TEST

/*
 * A mount point another user controls is refused, and nothing is made:
 * before, a symlink planted as another uid was followed (the view hid its
 * target) and a missing path was made with all its parents.
 */
START_TEST(hostile_mountpoints)
{
	struct kvp_fuse_view_opts vo = { 0 };
	struct kvp_fuse_view *v = NULL;
	char target[160], link[160], theirs[160], path[200], err[512];
	struct stat st;

	if (geteuid() != 0) { /* planting as another uid needs chown */
		printf("hostile_mountpoints: not run: needs root\n");
		return;
	}
	snprintf(target, sizeof(target), "%s/target", base);
	snprintf(link, sizeof(link), "%s/link", base);
	snprintf(theirs, sizeof(theirs), "%s/theirs", base);
	ck_assert_int_eq(mkdir(target, 0700), 0);
	ck_assert_int_eq(symlink(target, link), 0);
	ck_assert_int_eq(lchown(link, 65534, 65534), 0);
	vo.mountpoint = link;
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, err, sizeof(err)),
			 -ELOOP);
	ck_assert_ptr_null(v);
	ck_assert(!is_mounted(target));
	ck_assert_msg(strstr(err, "symbolic link") != NULL, "%s", err);

	vo.mountpoint = "/nonexistent-kvp-view/x";
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, err, sizeof(err)),
			 -ENOENT);
	ck_assert_int_eq(stat("/nonexistent-kvp-view", &st), -1);
	ck_assert_msg(strstr(err, "does not make parents") != NULL, "%s", err);

	ck_assert_int_eq(mkdir(theirs, 0755), 0);
	ck_assert_int_eq(chown(theirs, 65534, 65534), 0);
	vo.mountpoint = theirs;
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, err, sizeof(err)),
			 -EPERM);
	ck_assert(!is_mounted(theirs));
	ck_assert_msg(strstr(err, "belongs to uid 65534") != NULL, "%s", err);
	snprintf(path, sizeof(path), "%s/x", theirs);
	vo.mountpoint = path;
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, err, sizeof(err)),
			 -EPERM);
	ck_assert_int_eq(stat(path, &st), -1);

	/* a folder of ours, missing, in a folder of ours: made 0700 */
	snprintf(path, sizeof(path), "%s/mine", base);
	vo.mountpoint = path;
	ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, err, sizeof(err)),
			 0);
	ck_assert(is_mounted(path));
	kvp_fuse_view_unmount(v);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0700);
}
END_TEST

START_TEST(stale_mount_recovered)
{
	char stale[128];
	int pfd[2], status;
	struct stat st;
	pid_t pid;
	char c;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
	/* The child starts a pager after fork from a threaded process: TSan
	 * does not support that, and under ASan the child can deadlock on
	 * the sanitizer allocator's lock taken at fork time by another
	 * thread (seen).  Plain builds test it. */
	printf("stale_mount_recovered: not run under a sanitizer\n");
	return;
#endif
	snprintf(stale, sizeof(stale), "%s/stale", base);
	ck_assert_int_eq(pipe(pfd), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_fuse_view_opts vo = { .mountpoint = stale };
		struct kvp_fuse_view *v;
		struct kvp_pager *p;
		struct kvp_config cfg;

		kvp_config_defaults(&cfg);
		cfg.ram_budget_bytes = 4 * MIB;
		if (kvp_pager_open(&cfg, &p) || kvp_fuse_view_mount(p, &vo, &v, NULL, 0))
			_exit(2);
		if (write(pfd[1], "r", 1) != 1)
			_exit(3);
		for (;;)
			pause(); /* killed without unmounting */
	}
	close(pfd[1]);
	ck_assert_int_eq(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	ck_assert(is_mounted(stale));
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	ck_assert_int_eq(stat(stale, &st), -1);
	ck_assert_int_eq(errno, ENOTCONN);
	/* the next mount there cleans it up */
	{
		struct kvp_fuse_view_opts vo = { .mountpoint = stale };
		struct kvp_fuse_view *v;
		char *s;

		ck_assert_int_eq(kvp_fuse_view_mount(pager, &vo, &v, NULL, 0), 0);
		ck_assert_int_eq(stat(stale, &st), 0);
		snprintf(mnt, sizeof(mnt), "%s", stale);
		ck_assert_uint_eq(read_u64("pid"), (uint64_t)getpid());
		s = slurp("regions/kv0/size_bytes", NULL);
		ck_assert_ptr_nonnull(s);
		free(s);
		kvp_fuse_view_unmount(v);
		snprintf(mnt, sizeof(mnt), "%s/mnt", base);
	}
	/* and the explicit call: nothing stale is 0, a stale one 1 */
	ck_assert_int_eq(kvp_fuse_view_cleanup_stale(stale), 0);
	ck_assert_int_eq(kvp_fuse_view_cleanup_stale(""), -EINVAL);
}
END_TEST

/* The region is destroyed while mounted: it leaves the tree. */
START_TEST(region_destroyed)
{
	char path[1024];
	struct stat st;

	path_of(path, sizeof(path), "regions/kv0");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(kvp_region_destroy(region), 0);
	region = NULL;
	ck_assert_int_eq(stat(path, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	/* totals still count the destroyed region's work */
	ck_assert_uint_gt(read_u64("stats/bytes_written_total") +
			      read_u64("stats/zero_fills_total"),
			  0);
}
END_TEST

/* ---- the --serve helper of tests/t_kvpctl.sh ---- */

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	stop = 1;
}

static int serve(void)
{
	struct kvp_instance_opts io = { 0 };
	struct kvp_region_opts ro = { 0 };
	struct kvp_instance *inst;
	struct kvp_region *r;
	struct kvp_store *s;
	char err[KVP_TUNABLE_ERR_MAX];
	struct sigaction sa;
	volatile uint8_t *a;
	uint64_t i = 0;
	int rc;

	rc = kvp_instance_open(&io, &inst, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "serve: %s\n", err);
		return 1;
	}
	if (kvp_store_memory_create(NBLOCKS * BLOCK * 4, &s))
		return 1;
	ro.name = "demo";
	ro.size = NBLOCKS * BLOCK * 4;
	ro.block_bytes = BLOCK;
	ro.store = s;
	if (kvp_region_create(kvp_instance_pager(inst), &ro, &r))
		return 1;
	write_pattern(kvp_region_addr(r), WRITTEN * BLOCK);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	printf("ready %s\n",
	       kvp_instance_mount(inst) ? kvp_instance_mount(inst) : "-");
	fflush(stdout);
	a = kvp_region_addr(r);
	/* a slow scan, so that the statistics move */
	while (!stop) {
		(void)a[(i++ % (NBLOCKS * 4)) * BLOCK];
		usleep(2000);
	}
	kvp_region_destroy(r);
	kvp_instance_close(inst);
	kvp_store_destroy(s);
	return 0;
}

/* ---- main ---- */

static Suite *fuse_view_suite(void)
{
	Suite *s = suite_create("fuse_view");
	TCase *tc = tcase_create("mounted");

	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, read_every_file);
	tcase_add_test(tc, write_each_tunable);
	tcase_add_test(tc, apply_all_or_nothing);
	tcase_add_test(tc, one_write_per_open);
	tcase_add_test(tc, budget_takes_effect);
	tcase_add_test(tc, data_equals_written);
	tcase_add_test(tc, reading_changes_no_residency);
	tcase_add_test(tc, blocks_listing);
	tcase_add_test(tc, metrics_parse);
	tcase_add_test(tc, seqs_hook);
	tcase_add_test(tc, clean_unmount);
	tcase_add_test(tc, hostile_mountpoints);
	tcase_add_test(tc, stale_mount_recovered);
	tcase_add_test(tc, region_destroyed);
	suite_add_tcase(s, tc);
	return s;
}

/* A failed test's child dies with its view mounted: unmount what such
 * children left under /tmp/kvp-fv-* and remove their folders. */
static void sweep_stale(void)
{
	char line[1024], dev[256], dir[512], cmd[600];
	FILE *f = fopen("/proc/self/mounts", "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%255s %511s", dev, dir) == 2 &&
		    !strncmp(dir, "/tmp/kvp-fv-", 12) &&
		    kvp_fuse_view_cleanup_stale(dir) == 1) {
			char *slash = strrchr(dir, '/');

			*slash = '\0';
			snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
			if (system(cmd))
				fprintf(stderr, "cannot remove %s\n", dir);
		}
	fclose(f);
}

/* Why the tests cannot run here, or NULL. */
static const char *missing(char *why, size_t len)
{
	struct kvp_config cfg;
	struct kvp_pager *p;
	int r;

	if (kvp_fuse_available(why, len))
		return why;
	if (system("command -v fusermount3 >/dev/null 2>&1")) {
		snprintf(why, len,
			 "fusermount3 not found: apt-get install "
			 "fuse3");
		return why;
	}
	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = 4 * MIB;
	r = kvp_pager_open(&cfg, &p);
	if (r) {
		snprintf(why, len, "cannot open a pager: %s", kvp_strerror(r));
		return why;
	}
	kvp_pager_close(p);
	return NULL;
}

int main(int argc, char **argv)
{
	char why[512];
	int failed;

	if (argc > 1 && !strcmp(argv[1], "--serve"))
		return serve();
	if (missing(why, sizeof(why)))
		return kvp_test_skip("%s", why);
	failed = kvp_test_run(fuse_view_suite());
	sweep_stale();
	return failed;
}
