/*
 * view_tree.c - the debug view's tree (view_tree.h): paths resolved to
 * nodes, a node's text built whole, writes committed all or nothing.
 *
 * The tree holds no pointer to a region between calls: everything it reads
 * of a region it reads inside kvp_pager_foreach_region, so a region
 * destroyed meanwhile is simply gone from the tree.
 *
 * Locks: cfg_lock serialises commits (read the engine config, check,
 * reconfigure, kv_apply, roll back) and guards kv, kv_apply, kv_arg and
 * last_error; seq_lock (a rwlock) is held for reading around the KV
 * layer's sequence callbacks and for writing by kvp_view_set_seqs;
 * tier_lock (a rwlock) likewise around the tiers' statistics (the prefix
 * cache's, the remote tier's) and for writing by kvp_view_set_cache and
 * kvp_view_set_remote.  The region list lock (the pager's) is taken
 * inside any of them, never around.
 */
#include "lib/view/view_tree.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"
#include "lib/view/prom.h"

#define APPLY_MAX     (64u << 10) /* largest text for apply */
#define NAME_MAX_VIEW 256	  /* longest region name shown */

struct kvp_view {
	struct kvp_pager *pager;	      /* shown; outlives the tree */
	pthread_mutex_t cfg_lock;	      /* commits and the four below */
	struct kvp_kv_config kv;	      /* KV tunables shown */
	kvp_kv_apply_fn kv_apply;	      /* NULL: KV tunables read-only */
	void *kv_arg;			      /* kv_apply's */
	char last_error[KVP_TUNABLE_ERR_MAX]; /* of the last refused write */
	pthread_rwlock_t seq_lock;	      /* around seq_ops calls */
	struct kvp_view_seq_ops seq_ops;      /* valid when have_seqs */
	bool have_seqs;			      /* a KV layer registered */
	void *seq_arg;			      /* seq_ops' */
	pthread_rwlock_t tier_lock;	      /* around the two below */
	struct kvp_cache *cache;	      /* the prefix cache, or NULL */
	struct kvp_remote *remote;	      /* the remote tier, or NULL */
};

/* A region's one-value files. */
enum rfile {
	RF_SIZE,
	RF_BLOCK_SIZE,
	RF_NR_BLOCKS,
	RF_STORE,
	RF_RESIDENT,
	RF_INSTALL_MODE,
	RF_BLOCKS,
	RF_COUNT
};
static const char *const rfile_names[RF_COUNT] = {
	[RF_SIZE] = "size_bytes",	  [RF_BLOCK_SIZE] = "block_size_bytes",
	[RF_NR_BLOCKS] = "nr_blocks",	  [RF_STORE] = "store",
	[RF_RESIDENT] = "resident_bytes", [RF_INSTALL_MODE] = "install_mode",
	[RF_BLOCKS] = "blocks",
};

/* Top-level files. */
enum top {
	TOP_PID,
	TOP_UFFD_MODE,
	TOP_LAST_ERROR,
	TOP_APPLY,
	TOP_METRICS,
	TOP_COUNT
};
static const char *const top_names[TOP_COUNT] = {
	[TOP_PID] = "pid",
	[TOP_UFFD_MODE] = "uffd_mode",
	[TOP_LAST_ERROR] = "last_error",
	[TOP_APPLY] = "apply",
	[TOP_METRICS] = "metrics",
};

/* The root's folders, listed after the top-level files. */
static const char *const root_dirs[] = { "tunables", "stats", "regions",
					 "seqs", "cache", "remote" };
#define NROOT_DIRS (sizeof(root_dirs) / sizeof(root_dirs[0]))

/* The tiers' folders: one file per figure while the tier is registered. */
enum tier { TIER_CACHE, TIER_REMOTE, TIER_COUNT };
static const char *const tier_dirs[TIER_COUNT] = {
	[TIER_CACHE] = "cache",
	[TIER_REMOTE] = "remote",
};

/* The remote tier's one figure beyond its table, shown by the view only
 * (Prometheus has the histogram): the mean fetch round trip. */
#define REMOTE_MEAN_US "fetch_latency_mean_us"

enum node_kind {
	N_ROOT,
	N_TOP,	    /* top_names[idx] */
	N_TUNABLES, /* tunables/ */
	N_TUNABLE,
	N_STATS, /* stats/ */
	N_STAT,
	N_REGIONS, /* regions/ */
	N_REGION,
	N_RFILE,
	N_RSTATS,
	N_RSTAT,
	N_RDATA,
	N_RBLOCK,
	N_SEQS, /* seqs/ */
	N_SEQ,
	N_SEQ_TABLE,
	N_TIER, /* cache/, remote/ */
	N_TIER_STAT,
};

/* What a path names. */
struct node {
	enum node_kind kind;	       /* what it is */
	int idx;		       /* top, stat or rfile index */
	const struct kvp_tunable *tun; /* N_TUNABLE */
	char region[NAME_MAX_VIEW];    /* shown name, N_REGION and below */
	uint64_t nblocks;	       /* the region's */
	size_t block_bytes;	       /* the region's */
	uint64_t block;		       /* N_RBLOCK */
	uint32_t seq;		       /* N_SEQ, N_SEQ_TABLE */
	enum tier tier;		       /* N_TIER, N_TIER_STAT */
};

int kvp_view_create(struct kvp_pager *p, const struct kvp_kv_config *kv,
		    kvp_kv_apply_fn kv_apply, void *kv_arg,
		    struct kvp_view **out)
{
	struct kvp_view *v;

	*out = NULL;
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->pager = p;
	pthread_mutex_init(&v->cfg_lock, NULL);
	pthread_rwlock_init(&v->seq_lock, NULL);
	pthread_rwlock_init(&v->tier_lock, NULL);
	if (kv)
		v->kv = *kv;
	else
		kvp_kv_config_defaults(&v->kv);
	v->kv_apply = kv_apply;
	v->kv_arg = kv_arg;
	*out = v;
	return 0;
}

void kvp_view_destroy(struct kvp_view *v)
{
	if (!v)
		return;
	pthread_rwlock_destroy(&v->tier_lock);
	pthread_rwlock_destroy(&v->seq_lock);
	pthread_mutex_destroy(&v->cfg_lock);
	free(v);
}

void kvp_view_set_kv(struct kvp_view *v, const struct kvp_kv_config *cur,
		     kvp_kv_apply_fn apply, void *arg)
{
	pthread_mutex_lock(&v->cfg_lock);
	if (cur)
		v->kv = *cur;
	v->kv_apply = apply;
	v->kv_arg = arg;
	pthread_mutex_unlock(&v->cfg_lock);
}

void kvp_view_kv_config(struct kvp_view *v, struct kvp_kv_config *out)
{
	pthread_mutex_lock(&v->cfg_lock);
	*out = v->kv;
	pthread_mutex_unlock(&v->cfg_lock);
}

void kvp_view_set_seqs(struct kvp_view *v, const struct kvp_view_seq_ops *ops,
		       void *arg)
{
	pthread_rwlock_wrlock(&v->seq_lock);
	if (ops) {
		v->seq_ops = *ops;
		v->seq_arg = arg;
		v->have_seqs = true;
	} else {
		memset(&v->seq_ops, 0, sizeof(v->seq_ops));
		v->seq_arg = NULL;
		v->have_seqs = false;
	}
	pthread_rwlock_unlock(&v->seq_lock);
}

void kvp_view_set_cache(struct kvp_view *v, struct kvp_cache *c)
{
	pthread_rwlock_wrlock(&v->tier_lock);
	v->cache = c;
	pthread_rwlock_unlock(&v->tier_lock);
}

void kvp_view_set_remote(struct kvp_view *v, struct kvp_remote *r)
{
	pthread_rwlock_wrlock(&v->tier_lock);
	v->remote = r;
	pthread_rwlock_unlock(&v->tier_lock);
}

/* A tier's figures, as read at one time. */
struct tier_snap {
	struct kvp_cache_stats cache;	/* TIER_CACHE */
	struct kvp_remote_stats remote; /* TIER_REMOTE */
};

/* Tier @t's figures now into @s (NULL: only whether there are any): 0,
 * or -ENOENT when the tier is not registered. */
static int tier_stats(struct kvp_view *v, enum tier t, struct tier_snap *s)
{
	int r = -ENOENT;

	pthread_rwlock_rdlock(&v->tier_lock);
	if (t == TIER_CACHE && v->cache) {
		if (s)
			kvp_cache_stats(v->cache, &s->cache);
		r = 0;
	} else if (t == TIER_REMOTE && v->remote) {
		if (s)
			kvp_remote_stats_read(v->remote, &s->remote);
		r = 0;
	}
	pthread_rwlock_unlock(&v->tier_lock);
	return r;
}

static size_t tier_count(enum tier t)
{
	return t == TIER_CACHE ? kvp_cache_stat_count
			       : kvp_remote_stat_count + 1;
}

static const char *tier_name(enum tier t, size_t i)
{
	if (t == TIER_CACHE)
		return kvp_cache_stat_descs[i].name;
	return i < kvp_remote_stat_count ? kvp_remote_stat_descs[i].name
					 : REMOTE_MEAN_US;
}

static uint64_t tier_value(enum tier t, const struct tier_snap *s, size_t i)
{
	const struct kvp_remote_stats *rs = &s->remote;

	if (t == TIER_CACHE)
		return kvp_cache_stat_value(&s->cache, i);
	if (i < kvp_remote_stat_count)
		return kvp_stat_desc_value(rs, &kvp_remote_stat_descs[i]);
	return rs->fetch_round_trips_total
		   ? rs->fetch_latency_sum_ns / 1000 /
			 rs->fetch_round_trips_total
		   : 0;
}

static void set_last_error(struct kvp_view *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Called with cfg_lock held. */
static void set_last_error(struct kvp_view *v, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v->last_error, sizeof(v->last_error), fmt, ap);
	va_end(ap);
}

int kvp_view_refuse(struct kvp_view *v, const char *why)
{
	pthread_mutex_lock(&v->cfg_lock);
	set_last_error(v, "%s", why);
	pthread_mutex_unlock(&v->cfg_lock);
	return -EINVAL;
}

/* ---- regions, looked up and used under the region list lock ---- */

/* A region's name as shown: '/' would split the path, so it becomes '_'. */
static void shown_name(struct kvp_region *r, char *buf, size_t len)
{
	const char *n = kvp_region_name(r);
	size_t i;

	snprintf(buf, len, "%s", n ? n : "");
	for (i = 0; buf[i]; i++)
		if (buf[i] == '/')
			buf[i] = '_';
	if (!strcmp(buf, ".") || !strcmp(buf, ".."))
		buf[0] = '_';
}

struct with_ctx {
	const char *name;			    /* shown name sought */
	int (*fn)(struct kvp_region *r, void *arg); /* run on it */
	void *arg;				    /* fn's */
	bool found;				    /* it was there */
	int rc;					    /* fn's result */
};

static int with_cb(struct kvp_region *r, void *arg)
{
	struct with_ctx *c = arg;
	char name[NAME_MAX_VIEW];

	shown_name(r, name, sizeof(name));
	if (strcmp(name, c->name))
		return 0;
	c->found = true;
	c->rc = c->fn(r, c->arg);
	return 1;
}

/* Run @fn on the region shown as @name: its result, or -ENOENT. */
static int with_region(struct kvp_view *v, const char *name,
		       int (*fn)(struct kvp_region *r, void *arg), void *arg)
{
	struct with_ctx c = { .name = name, .fn = fn, .arg = arg };

	kvp_pager_foreach_region(v->pager, with_cb, &c);
	return c.found ? c.rc : -ENOENT;
}

static int facts_cb(struct kvp_region *r, void *arg)
{
	struct node *n = arg;

	n->block_bytes = kvp_region_block_bytes(r);
	n->nblocks = n->block_bytes ? kvp_region_size(r) / n->block_bytes : 0;
	return 0;
}

/* ---- sequences ---- */

/* Live sequence ids, malloc'd into *ids; -ENOENT when none registered. */
static int seq_ids(struct kvp_view *v, uint32_t **ids, uint32_t *n)
{
	uint32_t cap = 64, got;
	uint32_t *a = NULL, *na;
	int r = 0;

	pthread_rwlock_rdlock(&v->seq_lock);
	if (!v->have_seqs || !v->seq_ops.list) {
		r = -ENOENT;
		goto out;
	}
	for (;;) {
		na = realloc(a, cap * sizeof(*a));
		if (!na) {
			r = -ENOMEM;
			goto out;
		}
		a = na;
		got = v->seq_ops.list(v->seq_arg, a, cap);
		if (got <= cap)
			break;
		cap = got;
	}
	*ids = a;
	*n = got;
	a = NULL;
out:
	pthread_rwlock_unlock(&v->seq_lock);
	free(a);
	return r;
}

static bool seq_exists(struct kvp_view *v, uint32_t id)
{
	uint32_t *ids, n, i;
	bool found = false;

	if (seq_ids(v, &ids, &n))
		return false;
	for (i = 0; i < n; i++)
		if (ids[i] == id)
			found = true;
	free(ids);
	return found;
}

/* ---- path resolution ---- */

/* Strict decimal: digits only, no sign, no leading zero (but "0"). */
static bool parse_index(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!isdigit((unsigned char)*s) || (s[0] == '0' && s[1]))
		return false;
	for (; *s; s++) {
		if (!isdigit((unsigned char)*s) || v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

static int find_name(const char *const *names, int n, const char *s)
{
	int i;

	for (i = 0; i < n; i++)
		if (!strcmp(names[i], s))
			return i;
	return -1;
}

static int find_stat(const char *s)
{
	size_t i;

	for (i = 0; i < kvp_stat_count; i++)
		if (!strcmp(kvp_stat_descs[i].name, s))
			return (int)i;
	return -1;
}

#define MAX_COMPS 5

static int resolve(struct kvp_view *v, const char *path, struct node *n)
{
	char copy[PATH_MAX], *comp[MAX_COMPS], *save = NULL, *t;
	int nc = 0, k;
	uint64_t x;
	size_t i;

	memset(n, 0, sizeof(*n));
	if (strlen(path) >= sizeof(copy))
		return -ENAMETOOLONG;
	strcpy(copy, path);
	for (t = strtok_r(copy, "/", &save); t;
	     t = strtok_r(NULL, "/", &save)) {
		if (nc == MAX_COMPS)
			return -ENOENT;
		comp[nc++] = t;
	}
	if (nc == 0) {
		n->kind = N_ROOT;
		return 0;
	}
	if (nc == 1 &&
	    (n->idx = find_name(top_names, TOP_COUNT, comp[0])) >= 0) {
		n->kind = N_TOP;
		return 0;
	}
	if (!strcmp(comp[0], "tunables")) {
		n->kind = N_TUNABLES;
		if (nc == 1)
			return 0;
		n->tun = kvp_tunable_find(comp[1]);
		if (nc > 2 || !n->tun)
			return -ENOENT;
		n->kind = N_TUNABLE;
		return 0;
	}
	if (!strcmp(comp[0], "stats")) {
		n->kind = N_STATS;
		if (nc == 1)
			return 0;
		n->idx = find_stat(comp[1]);
		if (nc > 2 || n->idx < 0)
			return -ENOENT;
		n->kind = N_STAT;
		return 0;
	}
	k = find_name(tier_dirs, TIER_COUNT, comp[0]);
	if (k >= 0) {
		n->tier = (enum tier)k;
		n->kind = N_TIER;
		if (nc == 1)
			return 0;
		for (i = 0; i < tier_count(n->tier); i++)
			if (!strcmp(tier_name(n->tier, i), comp[1]))
				break;
		/* files only while the tier is registered */
		if (nc > 2 || i == tier_count(n->tier) ||
		    tier_stats(v, n->tier, NULL))
			return -ENOENT;
		n->idx = (int)i;
		n->kind = N_TIER_STAT;
		return 0;
	}
	if (!strcmp(comp[0], "seqs")) {
		n->kind = N_SEQS;
		if (nc == 1)
			return 0;
		if (!parse_index(comp[1], &x) || x > UINT32_MAX ||
		    !seq_exists(v, (uint32_t)x))
			return -ENOENT;
		n->seq = (uint32_t)x;
		n->kind = N_SEQ;
		if (nc == 2)
			return 0;
		if (nc > 3 || strcmp(comp[2], "block_table"))
			return -ENOENT;
		n->kind = N_SEQ_TABLE;
		return 0;
	}
	if (strcmp(comp[0], "regions"))
		return -ENOENT;
	n->kind = N_REGIONS;
	if (nc == 1)
		return 0;
	if (strlen(comp[1]) >= sizeof(n->region) ||
	    with_region(v, comp[1], facts_cb, n))
		return -ENOENT;
	strcpy(n->region, comp[1]);
	n->kind = N_REGION;
	if (nc == 2)
		return 0;
	if (nc == 3 &&
	    (n->idx = find_name(rfile_names, RF_COUNT, comp[2])) >= 0) {
		n->kind = N_RFILE;
		return 0;
	}
	if (!strcmp(comp[2], "stats")) {
		n->kind = N_RSTATS;
		if (nc == 3)
			return 0;
		n->idx = find_stat(comp[3]);
		if (nc > 4 || n->idx < 0)
			return -ENOENT;
		n->kind = N_RSTAT;
		return 0;
	}
	if (!strcmp(comp[2], "data")) {
		n->kind = N_RDATA;
		if (nc == 3)
			return 0;
		if (nc > 4 || !parse_index(comp[3], &n->block) ||
		    n->block >= n->nblocks)
			return -ENOENT;
		n->kind = N_RBLOCK;
		return 0;
	}
	return -ENOENT;
}

static bool is_dir(enum node_kind k)
{
	switch (k) {
	case N_ROOT:
	case N_TUNABLES:
	case N_STATS:
	case N_REGIONS:
	case N_REGION:
	case N_RSTATS:
	case N_RDATA:
	case N_SEQS:
	case N_SEQ:
	case N_TIER:
		return true;
	default:
		return false;
	}
}

/* Whether a tunable's file takes writes now. */
static bool tunable_writable(struct kvp_view *v, const struct kvp_tunable *t)
{
	bool w;

	if (!t->runtime)
		return false;
	if (t->owner == KVP_TUNABLE_PAGER)
		return true;
	pthread_mutex_lock(&v->cfg_lock);
	w = v->kv_apply != NULL;
	pthread_mutex_unlock(&v->cfg_lock);
	return w;
}

static mode_t node_mode(struct kvp_view *v, const struct node *n)
{
	if (is_dir(n->kind))
		return 0555;
	if (n->kind == N_TOP && n->idx == TOP_APPLY)
		return 0200;
	if (n->kind == N_TUNABLE && tunable_writable(v, n->tun))
		return 0644;
	return 0444;
}

int kvp_view_stat(struct kvp_view *v, const char *path,
		  struct kvp_view_attr *out)
{
	struct node n;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	out->dir = is_dir(n.kind);
	out->mode = node_mode(v, &n);
	out->size = n.kind == N_RBLOCK ? n.block_bytes : 0;
	return 0;
}

/* ---- listing ---- */

/* Fills a listing from position @from; stops when fill asks. */
struct lister {
	kvp_view_fill_fn fill; /* the caller's */
	void *arg;	       /* fill's */
	uint64_t pos;	       /* position of the next name */
	uint64_t from;	       /* first position wanted */
	bool full;	       /* fill asked to stop */
};

static void list_name(struct lister *l, const char *name)
{
	if (l->full || l->pos++ < l->from)
		return;
	if (l->fill(l->arg, name, l->pos))
		l->full = true;
}

static void list_names(struct lister *l, const char *const *names, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		list_name(l, names[i]);
}

static int region_names_cb(struct kvp_region *r, void *arg)
{
	struct lister *l = arg;
	char name[NAME_MAX_VIEW];

	shown_name(r, name, sizeof(name));
	if (name[0])
		list_name(l, name);
	return l->full;
}

int kvp_view_list(struct kvp_view *v, const char *path, uint64_t from,
		  kvp_view_fill_fn fill, void *arg)
{
	struct lister l = { .fill = fill, .arg = arg, .from = from };
	char name[32];
	struct node n;
	uint64_t k;
	size_t i;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	switch (n.kind) {
	case N_ROOT:
		list_names(&l, top_names, TOP_COUNT);
		list_names(&l, root_dirs, NROOT_DIRS);
		break;
	case N_TUNABLES:
		for (i = 0; i < kvp_tunables_count(); i++)
			list_name(&l, kvp_tunable_at(i)->name);
		break;
	case N_STATS:
	case N_RSTATS:
		for (i = 0; i < kvp_stat_count; i++)
			list_name(&l, kvp_stat_descs[i].name);
		break;
	case N_REGIONS:
		kvp_pager_foreach_region(v->pager, region_names_cb, &l);
		break;
	case N_REGION:
		list_names(&l, rfile_names, RF_COUNT);
		list_name(&l, "stats");
		list_name(&l, "data");
		break;
	case N_RDATA:
		/* a region of many blocks lists in pieces: skip to @from */
		l.pos = from;
		for (k = from; k < n.nblocks && !l.full; k++) {
			snprintf(name, sizeof(name), "%llu",
				 (unsigned long long)k);
			list_name(&l, name);
		}
		break;
	case N_SEQS: {
		uint32_t *ids, cnt, j;

		if (seq_ids(v, &ids, &cnt))
			break;
		for (j = 0; j < cnt; j++) {
			snprintf(name, sizeof(name), "%u", ids[j]);
			list_name(&l, name);
		}
		free(ids);
		break;
	}
	case N_SEQ:
		list_name(&l, "block_table");
		break;
	case N_TIER:
		if (!tier_stats(v, n.tier, NULL))
			for (i = 0; i < tier_count(n.tier); i++)
				list_name(&l, tier_name(n.tier, i));
		break;
	default:
		return -ENOTDIR;
	}
	return 0;
}

/* ---- content ---- */

static uint64_t tunable_value(struct kvp_view *v, const struct kvp_tunable *t)
{
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kv };
	uint64_t x = 0;

	kvp_pager_config(v->pager, &cfg);
	kvp_view_kv_config(v, &kv);
	kvp_tunable_get(&tg, t, &x);
	return x;
}

struct rfile_ctx {
	FILE *f;   /* the text */
	int which; /* enum rfile */
};

static int rfile_cb(struct kvp_region *r, void *arg)
{
	struct rfile_ctx *c = arg;
	size_t bb = kvp_region_block_bytes(r);
	struct kvp_block_info bi;
	struct kvp_stats st;
	struct kvp_store *s;
	uint64_t i, nb = bb ? kvp_region_size(r) / bb : 0;
	int e;

	switch (c->which) {
	case RF_SIZE:
		fprintf(c->f, "%zu\n", kvp_region_size(r));
		break;
	case RF_BLOCK_SIZE:
		fprintf(c->f, "%zu\n", bb);
		break;
	case RF_NR_BLOCKS:
		fprintf(c->f, "%llu\n", (unsigned long long)nb);
		break;
	case RF_STORE:
		s = kvp_region_store(r);
		fprintf(c->f, "%s\n", s ? s->desc : "none");
		break;
	case RF_RESIDENT:
		kvp_region_stats(r, &st);
		fprintf(c->f, "%llu\n", (unsigned long long)st.resident_bytes);
		break;
	case RF_INSTALL_MODE:
		fprintf(c->f, "%s\n", kvp_region_install_mode(r));
		break;
	case RF_BLOCKS:
		for (i = 0; i < nb; i++) {
			e = kvp_region_block_info(r, i, &bi);
			if (e)
				return e;
			fprintf(c->f,
				"%llu %s dirty=%d pins=%u stored=%d "
				"last_use=%llu\n",
				(unsigned long long)i,
				kvp_block_state_name(bi.state),
				bi.dirty ? 1 : 0, bi.pins, bi.in_store ? 1 : 0,
				(unsigned long long)bi.last_use);
		}
		break;
	}
	return 0;
}

static int rstat_cb(struct kvp_region *r, void *arg)
{
	kvp_region_stats(r, arg);
	return 0;
}

struct peek_ctx {
	uint64_t block; /* which */
	char *buf;	/* its bytes, malloc'd, NUL after them */
	size_t len;	/* the block's size */
};

static int peek_cb(struct kvp_region *r, void *arg)
{
	struct peek_ctx *c = arg;

	c->len = kvp_region_block_bytes(r);
	c->buf = malloc(c->len + 1);
	if (!c->buf)
		return -ENOMEM;
	c->buf[c->len] = '\0';
	return kvp_region_peek(r, c->block, c->buf);
}

/* The block table of a sequence, into *buf. */
static int seq_table(struct kvp_view *v, uint32_t seq, char **buf, size_t *len)
{
	size_t cap = 4096;
	char *b = NULL;
	int need;

	for (;;) {
		char *nb = realloc(b, cap);

		if (!nb) {
			free(b);
			return -ENOMEM;
		}
		b = nb;
		pthread_rwlock_rdlock(&v->seq_lock);
		need =
		    v->have_seqs && v->seq_ops.format_block_table
			? v->seq_ops.format_block_table(v->seq_arg, seq, b, cap)
			: -ENOENT;
		pthread_rwlock_unlock(&v->seq_lock);
		if (need < 0) {
			free(b);
			return need == -EINVAL ? -ENOENT : need;
		}
		if ((size_t)need < cap)
			break;
		cap = (size_t)need + 1;
	}
	*buf = b;
	*len = (size_t)need;
	return 0;
}

/* The text of a one-value or listing file into @f. */
static int put_text(struct kvp_view *v, const struct node *n, FILE *f)
{
	char val[KVP_TUNABLE_VALUE_MAX];
	struct kvp_stats st;
	int r;

	switch (n->kind) {
	case N_TOP:
		switch (n->idx) {
		case TOP_PID:
			fprintf(f, "%d\n", (int)getpid());
			break;
		case TOP_UFFD_MODE:
			fprintf(f, "%s\n", kvp_pager_uffd_mode(v->pager));
			break;
		case TOP_LAST_ERROR:
			pthread_mutex_lock(&v->cfg_lock);
			if (v->last_error[0])
				fprintf(f, "%s\n", v->last_error);
			pthread_mutex_unlock(&v->cfg_lock);
			break;
		}
		return 0;
	case N_TUNABLE:
		kvp_tunable_format(n->tun, tunable_value(v, n->tun), val,
				   sizeof(val));
		fprintf(f, "%s\n", val);
		return 0;
	case N_STAT:
		kvp_pager_stats(v->pager, &st);
		fprintf(
		    f, "%llu\n",
		    (unsigned long long)kvp_stat_value(&st, (size_t)n->idx));
		return 0;
	case N_RSTAT:
		r = with_region(v, n->region, rstat_cb, &st);
		if (!r)
			fprintf(f, "%llu\n",
				(unsigned long long)kvp_stat_value(
				    &st, (size_t)n->idx));
		return r;
	case N_RFILE: {
		struct rfile_ctx c = { .f = f, .which = n->idx };

		return with_region(v, n->region, rfile_cb, &c);
	}
	case N_TIER_STAT: {
		struct tier_snap ts;

		r = tier_stats(v, n->tier, &ts);
		if (!r)
			fprintf(f, "%llu\n",
				(unsigned long long)tier_value(n->tier, &ts,
							       (size_t)n->idx));
		return r;
	}
	default:
		return -EISDIR;
	}
}

int kvp_view_read(struct kvp_view *v, const char *path, char **buf, size_t *len)
{
	struct kvp_kv_config kv;
	struct node n;
	FILE *f;
	int r = resolve(v, path, &n);

	*buf = NULL;
	*len = 0;
	if (r)
		return r;
	if (is_dir(n.kind))
		return -EISDIR;
	if (!(node_mode(v, &n) & 0400))
		return -EACCES;
	if (n.kind == N_RBLOCK) {
		struct peek_ctx c = { .block = n.block };

		r = with_region(v, n.region, peek_cb, &c);
		if (r) {
			free(c.buf);
			return r == -ENOENT || r == -ENOMEM ? r : -EIO;
		}
		*buf = c.buf;
		*len = c.len;
		return 0;
	}
	if (n.kind == N_SEQ_TABLE)
		return seq_table(v, n.seq, buf, len);
	if (n.kind == N_TOP && n.idx == TOP_METRICS) {
		struct tier_snap ts;

		kvp_view_kv_config(v, &kv);
		r = kvp_prom_render(v->pager, &kv, buf, len);
		if (!r && !tier_stats(v, TIER_CACHE, &ts))
			r = kvp_prom_append_cache(&ts.cache, buf, len);
		if (!r && !tier_stats(v, TIER_REMOTE, &ts))
			r = kvp_prom_append_remote(&ts.remote, buf, len);
		if (r) {
			free(*buf);
			*buf = NULL;
			*len = 0;
		}
		return r;
	}
	f = open_memstream(buf, len);
	if (!f)
		return -ENOMEM;
	r = put_text(v, &n, f);
	if (fclose(f) && !r)
		r = -ENOMEM;
	if (r) {
		free(*buf);
		*buf = NULL;
		*len = 0;
	}
	return r;
}

/* ---- the commit ---- */

/*
 * Stage @text onto @tg: one value of @t, or (@t NULL) the lines of apply.
 * 0, or -EINVAL with the reason in @err.
 */
static int stage(const struct kvp_tunable_target *tg,
		 const struct kvp_tunable *t, const char *text, char *err,
		 size_t errlen)
{
	uint64_t x;
	int r;

	if (!t)
		return kvp_tunables_apply_lines(
		    tg, text, KVP_TUNABLES_RUNTIME_ONLY, NULL, err, errlen);
	r = kvp_tunable_parse(t, text, &x, err, errlen);
	if (r)
		return r;
	return kvp_tunable_set(tg, t, x, err, errlen);
}

/*
 * The one commit path: @text staged on copies of the engine and KV
 * configs, then the engine reconfigured and the KV layer told; a refusal
 * of either puts back what was applied.
 */
static int commit(struct kvp_view *v, const struct kvp_tunable *t,
		  const char *text)
{
	char err[KVP_TUNABLE_ERR_MAX];
	struct kvp_config cfg, old;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kv };
	const char *bad = NULL;
	bool engine_changed, kv_changed;
	int r;

	pthread_mutex_lock(&v->cfg_lock);
	kvp_pager_config(v->pager, &cfg);
	old = cfg;
	kv = v->kv;
	r = stage(&tg, t, text, err, sizeof(err));
	if (r)
		goto fail;
	engine_changed = memcmp(&cfg, &old, sizeof(cfg)) != 0;
	kv_changed = memcmp(&kv, &v->kv, sizeof(kv)) != 0;
	if (kv_changed && !v->kv_apply) {
		snprintf(err, sizeof(err),
			 "kv tunables are read-only here: no kv layer is "
			 "attached to this pager");
		r = -EACCES;
		goto fail;
	}
	if (engine_changed) {
		r = kvp_pager_reconfigure(v->pager, &cfg, &bad);
		if (r) {
			snprintf(err, sizeof(err),
				 "%s: the pager refused it: %s",
				 bad ? bad : "config", kvp_strerror(r));
			goto fail;
		}
	}
	if (kv_changed) {
		r = v->kv_apply(v->kv_arg, &kv, &bad);
		if (r) {
			snprintf(err, sizeof(err),
				 "%s: the kv layer refused it (%s)",
				 bad ? bad : "kv config", strerror(-r));
			/* the old config was accepted before: it is again */
			if (engine_changed)
				kvp_pager_reconfigure(v->pager, &old, NULL);
			goto fail;
		}
		v->kv = kv;
	}
	v->last_error[0] = '\0';
	pthread_mutex_unlock(&v->cfg_lock);
	return 0;
fail:
	set_last_error(v, "%s", err);
	pthread_mutex_unlock(&v->cfg_lock);
	return r == -ENOMEM ? r : -EINVAL;
}

/* Whether @buf is text: no NUL, no control character but \t \r \n. */
static bool is_text(const char *buf, size_t len, size_t *at)
{
	size_t i;

	for (i = 0; i < len; i++) {
		unsigned char c = (unsigned char)buf[i];

		if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') ||
		    c == 0x7f) {
			*at = i;
			return false;
		}
	}
	return true;
}

int kvp_view_write(struct kvp_view *v, const char *path, const char *buf,
		   size_t len)
{
	char why[KVP_TUNABLE_ERR_MAX];
	struct node n;
	size_t max, at;
	char *text;
	bool apply;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	if (is_dir(n.kind))
		return -EISDIR;
	if (!(node_mode(v, &n) & 0200))
		return -EACCES;
	apply = n.kind == N_TOP;
	max = apply ? APPLY_MAX : KVP_TUNABLE_VALUE_MAX;
	if (len >= max) {
		snprintf(why, sizeof(why),
			 "write of %zu bytes too long (at most %zu in one "
			 "write)",
			 len, max - 1);
		return kvp_view_refuse(v, why);
	}
	if (!is_text(buf, len, &at)) {
		snprintf(why, sizeof(why),
			 "%s: byte %zu is 0x%02x, not text: write "
			 "`name = value` lines (apply) or one value",
			 apply ? "apply" : n.tun->name, at,
			 (unsigned)(unsigned char)buf[at]);
		return kvp_view_refuse(v, why);
	}
	text = malloc(len + 1);
	if (!text)
		return -ENOMEM;
	memcpy(text, buf, len);
	text[len] = '\0';
	r = commit(v, apply ? NULL : n.tun, text);
	free(text);
	return r;
}
