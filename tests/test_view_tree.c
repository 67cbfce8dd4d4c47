/*
 * test_view_tree.c - lib/view/view_tree.c and prom.c without FUSE.
 *
 * Each test (a checked fixture, in its own child) opens a pager with one
 * region "kv0" on a memory store and the tree over it, with a fake KV
 * layer that can be told to refuse.  Then: every listed path stats and
 * reads, listings resume from a position, bad paths name nothing, a write
 * commits all it names or nothing (a refusal by the KV layer or a KV
 * tunable with no KV layer puts the engine change back), written bytes
 * must be text, and the Prometheus text escapes region names.
 *
 * Skipped (77) where the pager cannot open a userfaultfd.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"
#include "tests/helpers/helpers.h"
#include "lib/view/prom.h"
#include "lib/view/view_tree.h"
#include "pager/pager.h"

#define KIB	1024u
#define MIB	(1024u * 1024u)
#define BLOCK	(64 * KIB)
#define NBLOCKS 64u
#define BUDGET	(8 * MIB)

static struct kvp_pager *pager;
static struct kvp_store *store;
static struct kvp_region *region;
static struct kvp_view *tree;
static _Atomic bool kv_refuse;	     /* the fake KV layer says no */
static _Atomic int kv_applies;	     /* configs it took */
static struct kvp_kv_config applied; /* the last one */

static int kv_apply(void *arg, const struct kvp_kv_config *cfg,
		    const char **bad)
{
	if (kv_refuse) {
		*bad = "predictor";
		return -EINVAL;
	}
	applied = *cfg;
	kv_applies++;
	return 0;
}

static void setup(void)
{
	struct kvp_config cfg;
	struct kvp_region_opts ro = { 0 };

	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = BUDGET;
	ck_assert_int_eq(kvp_pager_open(&cfg, &pager), 0);
	ck_assert_int_eq(kvp_store_memory_create(NBLOCKS * BLOCK, &store), 0);
	ro.name = "kv0";
	ro.size = NBLOCKS * BLOCK;
	ro.block_bytes = BLOCK;
	ro.store = store;
	ck_assert_int_eq(kvp_region_create(pager, &ro, &region), 0);
	memset(kvp_region_addr(region), 0x5a, 2 * BLOCK);
	kv_refuse = false;
	kv_applies = 0;
	ck_assert_int_eq(kvp_view_create(pager, NULL, kv_apply, NULL, &tree),
			 0);
}

static void teardown(void)
{
	kvp_view_destroy(tree);
	kvp_region_destroy(region);
	kvp_pager_close(pager);
	kvp_store_destroy(store);
}

static char *read_ok(const char *path)
{
	char *buf;
	size_t len;
	int r = kvp_view_read(tree, path, &buf, &len);

	ck_assert_msg(r == 0, "read %s: %d", path, r);
	ck_assert_uint_eq(strlen(buf) <= len, 1);
	return buf;
}

/* File @path reads @want. */
static void expect_text(const char *path, const char *want)
{
	char *s = read_ok(path);

	ck_assert_msg(!strcmp(s, want), "%s: '%s', not '%s'", path, s, want);
	free(s);
}

static uint64_t budget_now(void)
{
	struct kvp_config cfg;

	kvp_pager_config(pager, &cfg);
	return cfg.ram_budget_bytes;
}

static int write_str(const char *path, const char *text)
{
	return kvp_view_write(tree, path, text, strlen(text));
}

/* last_error holds @what */
static void refused_for(const char *what)
{
	char *le = read_ok("last_error");

	ck_assert_msg(strstr(le, what) != NULL, "last_error '%s' lacks '%s'",
		      le, what);
	free(le);
}

/* ---- the paths ---- */

struct names {
	char name[64][128]; /* collected */
	int n;		    /* how many */
	int stop_after;	    /* fill says "full" after this many; 0 never */
	uint64_t last_pos;  /* the position fill got last */
};

static int collect(void *arg, const char *name, uint64_t pos)
{
	struct names *c = arg;

	ck_assert_int_lt(c->n, 64);
	snprintf(c->name[c->n++], sizeof(c->name[0]), "%s", name);
	c->last_pos = pos;
	return c->stop_after && c->n >= c->stop_after;
}

static int nfiles, ndirs;

static void walk(const char *path)
{
	struct kvp_view_attr a;
	struct names *c = calloc(1, sizeof(*c));
	char child[512];
	int i;

	ck_assert_int_eq(kvp_view_stat(tree, path, &a), 0);
	if (!a.dir) {
		char *buf;
		size_t len;
		int r = kvp_view_read(tree, path, &buf, &len);

		nfiles++;
		if (a.mode & 0400) {
			ck_assert_msg(r == 0, "%s: %d", path, r);
			free(buf);
		} else {
			ck_assert_int_eq(r, -EACCES); /* apply */
		}
		free(c);
		return;
	}
	ndirs++;
	ck_assert_int_eq(a.mode, 0555);
	ck_assert_int_eq(kvp_view_list(tree, path, 0, collect, c), 0);
	for (i = 0; i < c->n; i++) {
		/* data/ has a block per name: two of them are enough */
		if (strstr(path, "/data") && i >= 2)
			break;
		snprintf(child, sizeof(child), "%s/%s", path, c->name[i]);
		walk(child);
	}
	free(c);
}

START_TEST(every_path_reads)
{
	struct kvp_view_attr a;
	char *s;

	nfiles = ndirs = 0;
	walk("");
	/* root, tunables, stats, regions, kv0, its stats and data, seqs,
	 * cache, remote */
	ck_assert_int_eq(ndirs, 10);
	ck_assert_int_gt(nfiles, 5 + 20 + 7);
	ck_assert_int_eq(kvp_view_stat(tree, "/apply", &a), 0);
	ck_assert_int_eq(a.mode, 0200);
	ck_assert_int_eq(kvp_view_stat(tree, "tunables/io_depth", &a), 0);
	ck_assert_int_eq(a.mode, 0444); /* not runtime */
	ck_assert_int_eq(kvp_view_stat(tree, "tunables/ram_budget_bytes", &a),
			 0);
	ck_assert_int_eq(a.mode, 0644);
	ck_assert_int_eq(kvp_view_stat(tree, "regions/kv0/data/1", &a), 0);
	ck_assert_uint_eq(a.size, BLOCK);
	s = read_ok("//regions//kv0/nr_blocks");
	ck_assert_str_eq(s, "64\n");
	free(s);
	s = read_ok("regions/kv0/data/1");
	ck_assert_int_eq((unsigned char)s[BLOCK - 1], 0x5a);
	free(s);
}
END_TEST

START_TEST(listing_resumes)
{
	struct names a = { .stop_after = 3 }, b = { 0 };

	ck_assert_int_eq(
	    kvp_view_list(tree, "regions/kv0/data", 0, collect, &a), 0);
	ck_assert_int_eq(a.n, 3);
	ck_assert_str_eq(a.name[2], "2");
	ck_assert_uint_eq(a.last_pos, 3);
	b.stop_after = 2;
	ck_assert_int_eq(
	    kvp_view_list(tree, "regions/kv0/data", a.last_pos, collect, &b),
	    0);
	ck_assert_str_eq(b.name[0], "3");
	ck_assert_str_eq(b.name[1], "4");
	b.n = 0;
	b.stop_after = 0;
	ck_assert_int_eq(kvp_view_list(tree, "", 2, collect, &b), 0);
	ck_assert_str_eq(b.name[0], "last_error");
	ck_assert_int_eq(kvp_view_list(tree, "pid", 0, collect, &b), -ENOTDIR);
}
END_TEST

START_TEST(bad_paths_name_nothing)
{
	static const char *const bad[] = {
		"nosuch",
		"tunables/nosuch",
		"tunables/io_depth/x",
		"stats/nosuch",
		"regions/nosuch",
		"regions/kv0/nosuch",
		"regions/kv0/data/64",
		"regions/kv0/data/01",
		"regions/kv0/data/-1",
		"regions/kv0/data/1x",
		"regions/kv0/stats/x",
		"seqs/1",
		"seqs/x",
		"..",
		"regions/kv0/../kv0",
		"pid/x",
		"a/b/c/d/e/f",
	};
	struct kvp_view_attr a;
	char *buf, longp[5000];
	size_t i, len;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(kvp_view_stat(tree, bad[i], &a) == -ENOENT, "%s",
			      bad[i]);
		ck_assert_int_eq(kvp_view_read(tree, bad[i], &buf, &len),
				 -ENOENT);
		ck_assert_int_eq(write_str(bad[i], "1"), -ENOENT);
	}
	memset(longp, 'a', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	ck_assert_int_eq(kvp_view_stat(tree, longp, &a), -ENAMETOOLONG);
	ck_assert_int_eq(kvp_view_read(tree, "regions", &buf, &len), -EISDIR);
	ck_assert_int_eq(write_str("stats/demand_faults_total", "0"), -EACCES);
	ck_assert_int_eq(write_str("tunables/io_depth", "8"), -EACCES);
}
END_TEST

/* ---- the commit ---- */

START_TEST(tunable_write_commits)
{
	char *s;

	ck_assert_int_eq(write_str("tunables/ram_budget_bytes", "4M\n"), 0);
	ck_assert_uint_eq(budget_now(), 4 * MIB);
	s = read_ok("tunables/ram_budget_bytes");
	ck_assert_str_eq(s, "4194304\n");
	free(s);
	ck_assert_int_eq(write_str("tunables/prefetch_depth_layers", "7"), 0);
	ck_assert_uint_eq(applied.prefetch_depth_layers, 7);
	ck_assert_int_eq(write_str("tunables/ram_budget_bytes", "1K"), -EINVAL);
	refused_for("ram_budget_bytes: '1K' is out of range");
	ck_assert_uint_eq(budget_now(), 4 * MIB);
	/* a good write clears the reason */
	ck_assert_int_eq(write_str("tunables/io_batch", "4"), 0);
	s = read_ok("last_error");
	ck_assert_str_eq(s, "");
	free(s);
}
END_TEST

START_TEST(apply_rolls_back_on_kv_refusal)
{
	struct kvp_kv_config kv;

	kv_refuse = true;
	ck_assert_int_eq(write_str("apply", "ram_budget_bytes = 6M\n"
					    "predictor = window\n"),
			 -EINVAL);
	refused_for("predictor: the kv layer refused it");
	ck_assert_uint_eq(budget_now(), BUDGET);
	kvp_view_kv_config(tree, &kv);
	ck_assert_uint_eq(kv.predictor, 0);
	/* a single KV tunable: the same path */
	ck_assert_int_eq(write_str("tunables/prefetch_depth_layers", "3"),
			 -EINVAL);
	kv_refuse = false;
	ck_assert_int_eq(write_str("apply", "ram_budget_bytes = 6M\n"
					    "prefetch_depth_layers = 1\n"),
			 0);
	ck_assert_uint_eq(budget_now(), 6 * MIB);
	ck_assert_uint_eq(applied.prefetch_depth_layers, 1);
}
END_TEST

/* kvpctl set ram_budget_bytes=6M prefetch_depth_layers=1 on a pager with
 * no KV layer failed yet left the budget changed. */
START_TEST(kv_tunable_without_kv_layer_changes_nothing)
{
	struct kvp_view_attr a;

	kvp_view_set_kv(tree, NULL, NULL, NULL);
	ck_assert_int_eq(
	    kvp_view_stat(tree, "tunables/prefetch_depth_layers", &a), 0);
	ck_assert_int_eq(a.mode, 0444);
	ck_assert_int_eq(write_str("apply", "ram_budget_bytes = 6M\n"
					    "prefetch_depth_layers = 1\n"),
			 -EINVAL);
	refused_for("no kv layer is attached");
	ck_assert_uint_eq(budget_now(), BUDGET);
	/* the same value is no change: accepted */
	ck_assert_int_eq(write_str("apply", "ram_budget_bytes = 6M\n"
					    "prefetch_depth_layers = 2\n"),
			 0);
	ck_assert_uint_eq(budget_now(), 6 * MIB);
	ck_assert_int_eq(kv_applies, 0);
}
END_TEST

/* "5\0junk" was read as 5: a write holds text or is refused whole. */
START_TEST(writes_must_be_text)
{
	static const char nul[] = "5\0junk";

	ck_assert_int_eq(kvp_view_write(tree, "tunables/io_batch", nul, 6),
			 -EINVAL);
	refused_for("io_batch: byte 1 is 0x00, not text");
	ck_assert_int_eq(kvp_view_write(tree, "apply", "io_batch = 5\n\0", 14),
			 -EINVAL);
	ck_assert_int_eq(write_str("apply", "io_batch = 5\n# \x1b[0m\n"),
			 -EINVAL);
	refused_for("apply: byte 15 is 0x1b");
	ck_assert_int_eq(
	    write_str("apply", "io_batch = 5\r\n\t# caf\xc3\xa9\n"), 0);
}
END_TEST

/* ---- the Prometheus text ---- */

START_TEST(prom_escapes_region_names)
{
	struct kvp_region_opts ro = { 0 };
	struct kvp_region *odd;
	struct kvp_store *st;
	char *buf;
	size_t len;

	ck_assert_int_eq(kvp_store_memory_create(4 * BLOCK, &st), 0);

	ro.name = "a\"b\\c\nd";
	ro.size = 4 * BLOCK;
	ro.block_bytes = BLOCK;
	ro.store = st;
	ck_assert_int_eq(kvp_region_create(pager, &ro, &odd), 0);
	ck_assert_int_eq(kvp_prom_render(pager, NULL, &buf, &len), 0);
	ck_assert_uint_eq(strlen(buf), len);
	ck_assert_ptr_nonnull(strstr(buf, "kvpager_region_size_bytes{pid=\""));
	ck_assert_ptr_nonnull(
	    strstr(buf, "region=\"a\\\"b\\\\c\\nd\"} 262144\n"));
	ck_assert_ptr_nonnull(strstr(buf, "region=\"kv0\"} 4194304\n"));
	ck_assert_ptr_nonnull(
	    strstr(buf, "name=\"ram_budget_bytes\"} 8388608\n"));
	free(buf);
	kvp_region_destroy(odd);
	kvp_store_destroy(st);
}
END_TEST

START_TEST(cache_figures)
{
	char dir[] = "/tmp/kvp-view-cache-XXXXXX", *s;
	struct kvp_cache *c = NULL;
	struct kvp_rec_key k = { { 1 } };
	struct kvp_view_attr a;
	uint64_t len;

	/* none registered: an empty folder, no file */
	ck_assert_int_eq(kvp_view_stat(tree, "cache/hits_total", &a), -ENOENT);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, NULL, 0, NULL, 0), 0);
	ck_assert_int_eq(kvp_cache_put(c, &k, "kv", 2), 0);
	ck_assert_int_eq(kvp_cache_get(c, &k, dir, 2, &len), 0);
	kvp_view_set_cache(tree, c);
	expect_text("cache/hits_total", "1\n");
	expect_text("cache/blocks", "1\n");
	ck_assert_int_eq(kvp_view_stat(tree, "cache/hits_total", &a), 0);
	ck_assert_int_eq(a.mode, 0444);
	s = read_ok("metrics");
	ck_assert_ptr_nonnull(strstr(s, "# TYPE kvpager_cache_hits_total "
					"counter\nkvpager_cache_hits_total{"));
	ck_assert_ptr_nonnull(strstr(s, "kvpager_cache_bytes_written_total{"));
	free(s);
	kvp_view_set_cache(tree, NULL);
	ck_assert_int_eq(kvp_view_stat(tree, "cache/hits_total", &a), -ENOENT);
	s = NULL;
	ck_assert_int_eq(kvp_view_read(tree, "cache/hits_total", &s, &len),
			 -ENOENT);
	kvp_cache_close(c);
	kvp_test_rm_tree(dir);
}
END_TEST

static int refuse_value(void *arg, const void *key, size_t keylen, void *val,
			size_t len)
{
	return -1;
}

START_TEST(remote_figures)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct kvp_remote_config rc = { .ns = "t", .ns_len = 1,
					.verify = refuse_value };
	struct kvp_remote *r = NULL;
	struct kvp_remote_get g[3];
	unsigned char bufs[3][8];
	struct kvp_view_attr a;
	struct names c = { .n = 0 };
	char url[64], want[128], *s;
	size_t len, i;

	/* a port bound, never listened on: every connection is refused */
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(url, sizeof(url), "redis://127.0.0.1:%u",
		 (unsigned)ntohs(sa.sin_port));
	rc.url = url;

	/* none registered: an empty folder, no file */
	ck_assert_int_eq(kvp_view_stat(tree, "remote/hits_total", &a),
			 -ENOENT);
	ck_assert_int_eq(kvp_view_list(tree, "remote", 0, collect, &c), 0);
	ck_assert_int_eq(c.n, 0);
	ck_assert_int_eq(kvp_remote_open(&rc, &r, NULL, 0), 0);
	for (i = 0; i < 3; i++)
		g[i] = (struct kvp_remote_get){ .key = "k", .key_len = 1,
						.buf = bufs[i],
						.buf_len = sizeof(bufs[i]) };
	ck_assert_int_eq(kvp_remote_get_many(r, g, 3), 0);
	kvp_view_set_remote(tree, r);

	expect_text("remote/lookups_total", "3\n");
	expect_text("remote/errors_total", "3\n");
	expect_text("remote/fetch_latency_mean_us", "0\n"); /* no trip */
	ck_assert_int_eq(kvp_view_stat(tree, "remote/hits_total", &a), 0);
	ck_assert_int_eq(a.mode, 0444);
	ck_assert_int_eq(kvp_view_list(tree, "remote", 0, collect, &c), 0);
	ck_assert_int_eq(c.n, (int)kvp_remote_stat_count + 1);
	s = read_ok("metrics");
	snprintf(want, sizeof(want),
		 "# TYPE kvpager_remote_errors_total counter\n"
		 "kvpager_remote_errors_total{pid=\"%d\"} 3\n",
		 (int)getpid());
	ck_assert_msg(strstr(s, want), "no '%s' in metrics", want);
	ck_assert_ptr_nonnull(strstr(
	    s, "# TYPE kvpager_remote_fetch_latency_seconds histogram\n"));
	ck_assert_ptr_nonnull(
	    strstr(s, "kvpager_remote_fetch_latency_seconds_count{"));
	free(s);

	kvp_view_set_remote(tree, NULL);
	ck_assert_int_eq(kvp_view_stat(tree, "remote/hits_total", &a),
			 -ENOENT);
	s = NULL;
	ck_assert_int_eq(kvp_view_read(tree, "remote/hits_total", &s, &len),
			 -ENOENT);
	s = read_ok("metrics");
	ck_assert_ptr_null(strstr(s, "kvpager_remote_"));
	free(s);
	kvp_remote_close(r);
	close(fd);
}
END_TEST

static Suite *view_tree_suite(void)
{
	Suite *s = suite_create("view_tree");
	TCase *tc = tcase_create("tree");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, every_path_reads);
	tcase_add_test(tc, listing_resumes);
	tcase_add_test(tc, bad_paths_name_nothing);
	tcase_add_test(tc, tunable_write_commits);
	tcase_add_test(tc, apply_rolls_back_on_kv_refusal);
	tcase_add_test(tc, kv_tunable_without_kv_layer_changes_nothing);
	tcase_add_test(tc, writes_must_be_text);
	tcase_add_test(tc, prom_escapes_region_names);
	tcase_add_test(tc, cache_figures);
	tcase_add_test(tc, remote_figures);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	struct kvp_config cfg;
	struct kvp_pager *p;
	int r;

	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = 4 * MIB;
	r = kvp_pager_open(&cfg, &p);
	if (r)
		return kvp_test_skip("cannot open a pager: %s",
				     kvp_strerror(r));
	kvp_pager_close(p);
	return kvp_test_run(view_tree_suite());
}
