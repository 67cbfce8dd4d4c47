/*
 * view_path.c - fuzz the debug view's tree (lib/view/view_tree.c): path
 * resolution, listings, reads and the one write commit path.
 *
 * One pager per process (opened on the first input, as root: it needs a
 * userfaultfd) with regions "kv0" and "kv1" on memory stores, a fake KV layer that refuses when told and a fake sequence
 * list.  Each input first puts the runtime tunables back to the defaults.
 * Input: one byte of mode (bit 0: the KV layer refuses), then NUL-separated
 * parts: paths to look at, or, after a part "=", a path and the text to
 * write to it.  Checked:
 *   - a path stats as 0, -ENOENT or -ENAMETOOLONG, and the same with a
 *     leading '/' and every '/' doubled;
 *   - a folder lists, every name it lists stats, and it does not read;
 *     a file reads (unless write-only, -EACCES) and does not list; a
 *     block's data is as long as its size; nothing reads that does not
 *     stat;
 *   - a write that fails changes neither the engine config nor the KV
 *     config, and one refused as -EINVAL leaves a reason in last_error;
 *     after any write both configs check and the KV layer holds the KV
 *     config the tree shows; a write never changes a tunable that cannot
 *     change at run time.
 */
#include <errno.h>
#include <string.h>

#include "lib/tunables/tunables.h"
#include "lib/view/view_tree.h"
#include "pager/pager.h"
#include "tests/fuzz/fuzz.h"

#define BLOCK	(64u * 1024)
#define NBLOCKS 8u
#define PATH_MAX_FUZZ 600 /* past the tree's own limit */

static struct kvp_pager *pager;
static struct kvp_view *tree;
static bool kv_refuse;		     /* the fake KV layer says no */
static struct kvp_kv_config kv_held; /* what it took last */
static char defaults_text[4096];     /* runtime tunables = defaults */

static int kv_apply(void *arg, const struct kvp_kv_config *cfg,
		    const char **bad)
{
	if (kv_refuse) {
		*bad = "predictor";
		return -EINVAL;
	}
	kv_held = *cfg;
	return 0;
}

static uint32_t seq_list(void *arg, uint32_t *ids, uint32_t max)
{
	static const uint32_t live[] = { 0, 7, UINT32_MAX - 1 };

	for (uint32_t i = 0; i < max && i < 3; i++)
		ids[i] = live[i];
	return 3;
}

static int seq_format(void *arg, uint32_t id, char *buf, size_t len)
{
	if (id != 0 && id != 7 && id != UINT32_MAX - 1)
		return -ENOENT;
	return snprintf(buf, len, "0 %u\n1 %u\n", id, id + 1);
}

static void region_on_memory(const char *name)
{
	struct kvp_region_opts ro = { 0 };
	struct kvp_store *store;
	struct kvp_region *r;

	FUZZ_CHECK(kvp_store_memory_create(NBLOCKS * BLOCK, &store) == 0,
		   "memory store");
	ro.name = name;
	ro.size = NBLOCKS * BLOCK;
	ro.block_bytes = BLOCK;
	ro.store = store;
	FUZZ_CHECK(kvp_region_create(pager, &ro, &r) == 0, "region %s", name);
	memset(kvp_region_addr(r), 0x5a, BLOCK); /* one block resident */
}

/* Opened once; the process exits with it open. */
static void open_once(void)
{
	static const struct kvp_view_seq_ops seqs = { seq_list, seq_format };
	struct kvp_config cfg;
	size_t used = 0;

	if (tree)
		return;
	kvp_config_defaults(&cfg);
	cfg.ram_budget_bytes = 8u << 20;
	if (kvp_pager_open(&cfg, &pager)) {
		/* as the Check suites do where there is no userfaultfd */
		printf("skipped: cannot open a pager here (it needs a "
		       "userfaultfd: root or /dev/userfaultfd)\n");
		exit(77);
	}
	region_on_memory("kv0");
	region_on_memory("kv1");
	kvp_kv_config_defaults(&kv_held);
	FUZZ_CHECK(kvp_view_create(pager, &kv_held, kv_apply, NULL, &tree) ==
			   0,
		   "view");
	kvp_view_set_seqs(tree, &seqs, NULL);
	/* The budget stays this pager's; the other runtime ones to defaults. */
	for (size_t i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		char shown[KVP_TUNABLE_VALUE_MAX], *v = shown;

		if (!t->runtime)
			continue;
		kvp_tunable_format(t, !strcmp(t->name, "ram_budget_bytes")
					      ? cfg.ram_budget_bytes
					      : t->def,
				   shown, sizeof(shown));
		if (t->type == KVP_T_CHOICE) {
			v = strchr(shown, '[') + 1;
			*strchr(v, ']') = '\0';
		}
		used += (size_t)snprintf(defaults_text + used,
					 sizeof(defaults_text) - used,
					 "%s = %s\n", t->name, v);
	}
}

struct listing {
	char names[16][256]; /* the first names listed */
	int n;		     /* how many kept */
};

static int keep_name(void *arg, const char *name, uint64_t pos)
{
	struct listing *l = arg;

	FUZZ_CHECK(name[0] && strcmp(name, ".") && strcmp(name, "..") &&
		       !strchr(name, '/'),
		   "listed name '%s'", name);
	if (l->n < 16)
		snprintf(l->names[l->n++], sizeof(l->names[0]), "%s", name);
	return 0;
}

/* @path with a leading '/' and every '/' doubled. */
static void respelt(const char *path, char *out, size_t len)
{
	size_t o = 0;

	out[o++] = '/';
	for (; *path && o + 3 < len; path++) {
		out[o++] = *path;
		if (*path == '/')
			out[o++] = '/';
	}
	out[o] = '\0';
}

static void look(const char *path, int depth)
{
	struct kvp_view_attr at, at2;
	struct listing l = { .n = 0 };
	char other[2 * PATH_MAX_FUZZ + 4];
	char *buf = NULL;
	size_t len = 0;
	int r = kvp_view_stat(tree, path, &at), r2;

	FUZZ_CHECK(r == 0 || r == -ENOENT || r == -ENAMETOOLONG,
		   "stat '%s': %d", path, r);
	if (strlen(path) < PATH_MAX_FUZZ) {
		respelt(path, other, sizeof(other));
		r2 = kvp_view_stat(tree, other, &at2);
		FUZZ_CHECK(r2 == r || (r && r2 == -ENAMETOOLONG),
			   "stat '%s': %d, '%s': %d", path, r, other, r2);
		FUZZ_CHECK(r || (at.dir == at2.dir && at.mode == at2.mode),
			   "'%s' and '%s' differ", path, other);
	}
	if (r) {
		r = kvp_view_read(tree, path, &buf, &len);
		FUZZ_CHECK(r < 0 && r != -EISDIR && r != -EACCES,
			   "'%s' does not stat, reads: %d", path, r);
		r = kvp_view_list(tree, path, 0, keep_name, &l);
		FUZZ_CHECK(r < 0 && !l.n, "'%s' does not stat, lists: %d",
			   path, r);
		return;
	}
	if (at.dir) {
		FUZZ_CHECK(at.mode == 0555, "folder '%s' mode %o", path,
			   at.mode);
		FUZZ_CHECK(kvp_view_read(tree, path, &buf, &len) == -EISDIR,
			   "folder '%s' reads", path);
		FUZZ_CHECK(kvp_view_list(tree, path, 0, keep_name, &l) == 0,
			   "folder '%s' does not list", path);
		for (int i = 0; i < l.n && depth < 3; i++) {
			char child[PATH_MAX_FUZZ + 300];

			if (snprintf(child, sizeof(child), "%s/%s", path,
				     l.names[i]) >= (int)sizeof(child))
				continue;
			FUZZ_CHECK(kvp_view_stat(tree, child, &at2) == 0,
				   "'%s' is listed, does not stat", child);
			if (depth < 1)
				look(child, depth + 1);
		}
		return;
	}
	FUZZ_CHECK(kvp_view_list(tree, path, 0, keep_name, &l) == -ENOTDIR,
		   "file '%s' lists", path);
	r = kvp_view_read(tree, path, &buf, &len);
	if (!(at.mode & 0444)) {
		FUZZ_CHECK(r == -EACCES, "write-only '%s' reads: %d", path, r);
		return;
	}
	FUZZ_CHECK(r == 0, "file '%s' (mode %o) does not read: %d", path,
		   at.mode, r);
	FUZZ_CHECK(buf[len] == '\0', "'%s' not terminated", path);
	FUZZ_CHECK(!at.size || len == at.size, "'%s': %zu bytes of %llu",
		   path, len, (unsigned long long)at.size);
	free(buf);
}

static bool configs_equal(const struct kvp_config *a,
			  const struct kvp_kv_config *ak,
			  const struct kvp_config *b,
			  const struct kvp_kv_config *bk)
{
	return !memcmp(a, b, sizeof(*a)) && !memcmp(ak, bk, sizeof(*ak));
}

static void write_one(const char *path, const char *text)
{
	struct kvp_config pc0, pc1;
	struct kvp_kv_config kc0, kc1;
	struct kvp_tunable_target tg = { &pc1, &kc1 };
	char err[KVP_TUNABLE_ERR_MAX], *le;
	size_t len;
	int r;

	kvp_pager_config(pager, &pc0);
	kvp_view_kv_config(tree, &kc0);
	r = kvp_view_write(tree, path, text, strlen(text));
	kvp_pager_config(pager, &pc1);
	kvp_view_kv_config(tree, &kc1);
	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -EACCES || r == -ENOENT ||
			   r == -EISDIR || r == -ENAMETOOLONG,
		   "write '%s': %d", path, r);
	if (r)
		FUZZ_CHECK(configs_equal(&pc0, &kc0, &pc1, &kc1),
			   "write to '%s' failed (%d) yet changed a config",
			   path, r);
	if (r == -EINVAL) {
		FUZZ_CHECK(kvp_view_read(tree, "last_error", &le, &len) == 0 &&
			       len > 1,
			   "refused write to '%s' left no reason", path);
		free(le);
	}
	FUZZ_CHECK(kvp_tunables_check(&tg, err, sizeof(err)) == 0,
		   "after a write to '%s': %s", path, err);
	FUZZ_CHECK(!memcmp(&kv_held, &kc1, sizeof(kc1)),
		   "the KV layer holds another config than the view shows");
	for (size_t i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		uint64_t a, b;
		struct kvp_tunable_target t0 = { &pc0, &kc0 };

		kvp_tunable_get(&t0, t, &a);
		kvp_tunable_get(&tg, t, &b);
		FUZZ_CHECK(t->runtime || a == b,
			   "a write to '%s' changed %s, not a runtime tunable",
			   path, t->name);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_input in = { data, size };
	uint8_t mode = fuzz_u8(&in);
	char *text, *part, *end;
	bool writing = false;

	open_once();
	kv_refuse = false;
	FUZZ_CHECK(kvp_view_write(tree, "apply", defaults_text,
				  strlen(defaults_text)) == 0,
		   "defaults do not apply");
	kv_refuse = mode & 1;
	text = malloc(in.left + 1);
	FUZZ_CHECK(text, "out of memory");
	memcpy(text, in.data, in.left);
	text[in.left] = '\0';
	end = text + in.left;
	/* NUL-separated parts; a part "=" makes the next two a write. */
	for (part = text; part <= end; part += strlen(part) + 1) {
		if (!strcmp(part, "=")) {
			writing = true;
			continue;
		}
		if (writing) {
			const char *what = part + strlen(part) + 1;

			write_one(part, what <= end ? what : "");
			if (what <= end)
				part += strlen(part) + 1;
			writing = false;
			continue;
		}
		look(part, 0);
	}
	free(text);
	return 0;
}
