/*
 * fuse_view.c - the debug view: libfuse3's high-level API, one thread.
 *
 * The thread runs its own loop over the session's /dev/fuse descriptor and
 * an eventfd (fuse_session_receive_buf + fuse_session_process_buf), so that
 * unmounting is "signal the eventfd, join, unmount": it never waits for a
 * request that may not come.
 *
 * Every open builds the whole content of a file (struct snap) and reads
 * serve from it; the view holds no pointer to a region between calls, and
 * everything it reads of a region it reads inside kvp_pager_foreach_region,
 * so a region destroyed meanwhile is simply gone from the tree.
 *
 * Locks: cfg_lock serialises writes to tunables (read engine config, check,
 * reconfigure) and guards kv, kv_apply and last_error; seq_lock (a rwlock)
 * is held for reading around the KV layer's callbacks and for writing by
 * kvp_fuse_view_set_seqs.  Neither is held across a call into libfuse.
 */
#define FUSE_USE_VERSION 31

#include "lib/view/fuse_view.h"
#include "lib/instance/paths.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"

extern char **environ;

#define APPLY_MAX     (64u << 10) /* largest `name = value` text for apply */
#define NAME_MAX_VIEW 256	  /* longest region name shown */

struct kvp_fuse_view {
	struct kvp_pager *pager;  /* what is shown; outlives the view */
	struct fuse *fuse;	  /* the libfuse handle */
	pthread_t thread;	  /* serves the mount */
	int stopfd;		  /* eventfd: the thread stops when set */
	char path[PATH_MAX];	  /* absolute mount point */
	pthread_mutex_t cfg_lock; /* writes, kv, kv_apply, last_error */
	struct kvp_kv_config kv;  /* KV tunables shown */
	kvp_kv_apply_fn kv_apply; /* NULL: KV tunables read-only */
	void *kv_arg;
	char last_error[KVP_TUNABLE_ERR_MAX]; /* of the last failed write */
	pthread_rwlock_t seq_lock;	      /* around seq_ops calls */
	struct kvp_fuse_seq_ops seq_ops;
	bool have_seqs;
	void *seq_arg;
	pthread_mutex_t snap_lock; /* guards snaps */
	struct snap *snaps;	   /* files open now */
};

/* The statistics, from KVP_STATS. */
static const struct stat_desc {
	const char *name;
	enum kvp_stat_kind kind;
	const char *doc;
	size_t off;
} stat_descs[] = {
#define X(n, k, d) { #n, k, d, offsetof(struct kvp_stats, n) },
	KVP_STATS(X)
#undef X
};
#define NSTATS (sizeof(stat_descs) / sizeof(stat_descs[0]))

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

enum node_kind {
	N_ROOT,
	N_TOP,	    /* top[] */
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
};

struct node {
	enum node_kind kind;
	int idx;		       /* top, stat or rfile index */
	const struct kvp_tunable *tun; /* N_TUNABLE */
	char region[NAME_MAX_VIEW];    /* shown name, N_REGION and below */
	uint64_t nblocks;	       /* the region's */
	size_t block_bytes;	       /* the region's */
	uint64_t block;		       /* N_RBLOCK */
	uint32_t seq;		       /* N_SEQ, N_SEQ_TABLE */
};

/* What an open file reads, fixed at open.  Linked into the view's list
 * so that unmounting frees those whose release never came (the kernel
 * sends RELEASE asynchronously after close). */
struct snap {
	struct snap *prev, *next; /* in kvp_fuse_view.snaps, under snap_lock */
	char *buf;
	size_t len;
	const struct kvp_tunable *tun; /* writable tunable, or NULL */
	bool apply;		       /* the apply file */
};

static struct kvp_fuse_view *view(void)
{
	return fuse_get_context()->private_data;
}

static void set_last_error(struct kvp_fuse_view *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Called with cfg_lock held. */
static void set_last_error(struct kvp_fuse_view *v, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v->last_error, sizeof(v->last_error), fmt, ap);
	va_end(ap);
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
	const char *name;
	int (*fn)(struct kvp_region *r, void *arg);
	void *arg;
	bool found;
	int rc;
};

static int with_cb(struct kvp_region *r, void *arg)
{
	struct with_ctx *c = arg;
	char name[NAME_MAX_VIEW];

	shown_name(r, name, sizeof(name));
	if (strcmp(name, c->name))
		return 0;
	c->found = true;
	c->rc = c->fn ? c->fn(r, c->arg) : 0;
	return 1;
}

/* Run @fn on the region shown as @name: its result, or -ENOENT. */
static int with_region(struct kvp_fuse_view *v, const char *name,
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
static int seq_ids(struct kvp_fuse_view *v, uint32_t **ids, uint32_t *n)
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

static bool seq_exists(struct kvp_fuse_view *v, uint32_t id)
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

	for (i = 0; i < NSTATS; i++)
		if (!strcmp(stat_descs[i].name, s))
			return (int)i;
	return -1;
}

#define MAX_COMPS 5

static int resolve(struct kvp_fuse_view *v, const char *path, struct node *n)
{
	char copy[PATH_MAX], *comp[MAX_COMPS], *save = NULL, *t;
	int nc = 0;
	uint64_t x;

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
		return true;
	default:
		return false;
	}
}

/* Whether a tunable's file takes writes now. */
static bool tunable_writable(struct kvp_fuse_view *v,
			     const struct kvp_tunable *t)
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

static mode_t node_mode(struct kvp_fuse_view *v, const struct node *n)
{
	if (is_dir(n->kind))
		return S_IFDIR | 0555;
	if (n->kind == N_TOP && n->idx == TOP_APPLY)
		return S_IFREG | 0200;
	if (n->kind == N_TUNABLE && tunable_writable(v, n->tun))
		return S_IFREG | 0644;
	return S_IFREG | 0444;
}

/* ---- content ---- */

static void put_stat_value(FILE *f, const struct kvp_stats *s, int i)
{
	fprintf(f, "%llu\n",
		(unsigned long long)*(const uint64_t *)((const char *)s +
							stat_descs[i].off));
}

static uint64_t tunable_value(struct kvp_fuse_view *v,
			      const struct kvp_tunable *t)
{
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kv };
	uint64_t x = 0;

	kvp_pager_config(v->pager, &cfg);
	pthread_mutex_lock(&v->cfg_lock);
	kv = v->kv;
	pthread_mutex_unlock(&v->cfg_lock);
	kvp_tunable_get(&tg, t, &x);
	return x;
}

struct rfile_ctx {
	FILE *f;
	int which;
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

struct rstat_ctx {
	struct kvp_stats st;
};

static int rstat_cb(struct kvp_region *r, void *arg)
{
	kvp_region_stats(r, &((struct rstat_ctx *)arg)->st);
	return 0;
}

struct peek_ctx {
	uint64_t block;
	void *buf;
	size_t len;
};

static int peek_cb(struct kvp_region *r, void *arg)
{
	struct peek_ctx *c = arg;

	c->len = kvp_region_block_bytes(r);
	c->buf = malloc(c->len ? c->len : 1);
	if (!c->buf)
		return -ENOMEM;
	return kvp_region_peek(r, c->block, c->buf);
}

/* Prometheus label value: \ " and newline escaped. */
static void put_label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

struct region_row {
	char name[NAME_MAX_VIEW];
	struct kvp_stats st;
	size_t size, block_bytes;
};

struct rows {
	struct region_row *v;
	size_t n, cap;
	int err;
};

static int rows_cb(struct kvp_region *r, void *arg)
{
	struct rows *rs = arg;
	struct region_row *nv;

	if (rs->n == rs->cap) {
		rs->cap = rs->cap ? rs->cap * 2 : 16;
		nv = realloc(rs->v, rs->cap * sizeof(*nv));
		if (!nv) {
			rs->err = -ENOMEM;
			return 1;
		}
		rs->v = nv;
	}
	nv = &rs->v[rs->n++];
	snprintf(nv->name, sizeof(nv->name), "%s", kvp_region_name(r));
	kvp_region_stats(r, &nv->st);
	nv->size = kvp_region_size(r);
	nv->block_bytes = kvp_region_block_bytes(r);
	return 0;
}

static void put_metrics(struct kvp_fuse_view *v, FILE *f)
{
	struct kvp_stats st;
	struct rows rs = { 0 };
	uint64_t cum = 0;
	size_t i, k;
	int pid = (int)getpid();

	kvp_pager_stats(v->pager, &st);
	kvp_pager_foreach_region(v->pager, rows_cb, &rs);

	fprintf(f,
		"# HELP kvpager_info the pager serving this view\n"
		"# TYPE kvpager_info gauge\n"
		"kvpager_info{pid=\"%d\",uffd_mode=\"%s\"} 1\n",
		pid, kvp_pager_uffd_mode(v->pager));
	for (i = 0; i < NSTATS; i++) {
		const struct stat_desc *d = &stat_descs[i];
		const char *type = d->kind == KVP_COUNTER ? "counter" : "gauge";

		fprintf(f, "# HELP kvpager_%s %s\n# TYPE kvpager_%s %s\n",
			d->name, d->doc, d->name, type);
		fprintf(
		    f, "kvpager_%s{pid=\"%d\"} %llu\n", d->name, pid,
		    (unsigned long long)*(uint64_t *)((char *)&st + d->off));
	}
	fprintf(f, "# HELP kvpager_io_latency_seconds store read latency\n"
		   "# TYPE kvpager_io_latency_seconds histogram\n");
	for (k = 0; k < KVP_LATENCY_BUCKETS; k++) {
		cum += st.io_latency_us[k];
		fprintf(f,
			"kvpager_io_latency_seconds_bucket{pid=\"%d\","
			"le=\"%g\"} %llu\n",
			pid, (double)(1ULL << (k + 1)) * 1e-6,
			(unsigned long long)cum);
	}
	fprintf(f,
		"kvpager_io_latency_seconds_bucket{pid=\"%d\",le=\"+Inf\"} "
		"%llu\n"
		"kvpager_io_latency_seconds_count{pid=\"%d\"} %llu\n",
		pid, (unsigned long long)cum, pid, (unsigned long long)cum);

	fprintf(f, "# HELP kvpager_tunable a tunable's value (a choice: its "
		   "index)\n# TYPE kvpager_tunable gauge\n");
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);

		fprintf(f, "kvpager_tunable{pid=\"%d\",name=\"%s\"} %llu\n",
			pid, t->name, (unsigned long long)tunable_value(v, t));
	}

	fprintf(f, "# HELP kvpager_region_size_bytes the region's size\n"
		   "# TYPE kvpager_region_size_bytes gauge\n");
	for (k = 0; k < rs.n; k++) {
		fprintf(f, "kvpager_region_size_bytes{pid=\"%d\",region=\"",
			pid);
		put_label(f, rs.v[k].name);
		fprintf(f, "\"} %zu\n", rs.v[k].size);
	}
	fprintf(f, "# HELP kvpager_region_block_size_bytes the region's "
		   "block size\n"
		   "# TYPE kvpager_region_block_size_bytes gauge\n");
	for (k = 0; k < rs.n; k++) {
		fprintf(f,
			"kvpager_region_block_size_bytes{pid=\"%d\","
			"region=\"",
			pid);
		put_label(f, rs.v[k].name);
		fprintf(f, "\"} %zu\n", rs.v[k].block_bytes);
	}
	for (i = 0; i < NSTATS; i++) {
		const struct stat_desc *d = &stat_descs[i];
		const char *type = d->kind == KVP_COUNTER ? "counter" : "gauge";

		fprintf(f,
			"# HELP kvpager_region_%s %s, per region\n"
			"# TYPE kvpager_region_%s %s\n",
			d->name, d->doc, d->name, type);
		for (k = 0; k < rs.n; k++) {
			fprintf(f, "kvpager_region_%s{pid=\"%d\",region=\"",
				d->name, pid);
			put_label(f, rs.v[k].name);
			fprintf(f, "\"} %llu\n",
				(unsigned long long)*(
				    uint64_t *)((char *)&rs.v[k].st + d->off));
		}
	}
	free(rs.v);
}

/* Builds the content of a file node into @s.  0 or -errno. */
static int build(struct kvp_fuse_view *v, const struct node *n, struct snap *s)
{
	char val[KVP_TUNABLE_VALUE_MAX];
	struct kvp_stats st;
	FILE *f;
	int r = 0;

	if (n->kind == N_RBLOCK) {
		struct peek_ctx c = { .block = n->block };

		r = with_region(v, n->region, peek_cb, &c);
		if (r) {
			free(c.buf);
			return r == -ENOENT ? -ENOENT : -EIO;
		}
		s->buf = c.buf;
		s->len = c.len;
		return 0;
	}
	if (n->kind == N_SEQ_TABLE) {
		size_t len = 4096;
		int need;

		for (;;) {
			char *b = realloc(s->buf, len);

			if (!b)
				return -ENOMEM;
			s->buf = b;
			pthread_rwlock_rdlock(&v->seq_lock);
			need = v->have_seqs && v->seq_ops.format_block_table
				   ? v->seq_ops.format_block_table(
					 v->seq_arg, n->seq, b, len)
				   : -ENOENT;
			pthread_rwlock_unlock(&v->seq_lock);
			if (need < 0)
				return need == -EINVAL ? -ENOENT : need;
			if ((size_t)need < len)
				break;
			len = (size_t)need + 1;
		}
		s->len = (size_t)need;
		return 0;
	}

	f = open_memstream(&s->buf, &s->len);
	if (!f)
		return -ENOMEM;
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
		case TOP_METRICS:
			put_metrics(v, f);
			break;
		default: /* apply: nothing to read */
			break;
		}
		break;
	case N_TUNABLE:
		kvp_tunable_format(n->tun, tunable_value(v, n->tun), val,
				   sizeof(val));
		fprintf(f, "%s\n", val);
		break;
	case N_STAT:
		kvp_pager_stats(v->pager, &st);
		put_stat_value(f, &st, n->idx);
		break;
	case N_RSTAT: {
		struct rstat_ctx c;

		r = with_region(v, n->region, rstat_cb, &c);
		if (!r)
			put_stat_value(f, &c.st, n->idx);
		break;
	}
	case N_RFILE: {
		struct rfile_ctx c = { .f = f, .which = n->idx };

		r = with_region(v, n->region, rfile_cb, &c);
		break;
	}
	default:
		r = -EISDIR;
	}
	if (fclose(f) && !r)
		r = -ENOMEM;
	return r;
}

/* ---- writes ---- */

static int write_tunable(struct kvp_fuse_view *v, const struct kvp_tunable *t,
			 const char *text)
{
	char err[KVP_TUNABLE_ERR_MAX];
	struct kvp_config cfg;
	struct kvp_kv_config kv;
	const char *bad = NULL;
	uint64_t x;
	int r;

	pthread_mutex_lock(&v->cfg_lock);
	r = kvp_tunable_parse(t, text, &x, err, sizeof(err));
	if (r)
		goto fail;
	if (t->owner == KVP_TUNABLE_PAGER) {
		struct kvp_tunable_target tg = { .pager = &cfg };

		kvp_pager_config(v->pager, &cfg);
		r = kvp_tunable_set(&tg, t, x, err, sizeof(err));
		if (r)
			goto fail;
		r = kvp_pager_reconfigure(v->pager, &cfg, &bad);
		if (r) {
			snprintf(err, sizeof(err),
				 "%s: the pager refused it: %s",
				 bad ? bad : t->name, kvp_strerror(r));
			goto fail;
		}
	} else {
		struct kvp_tunable_target tg = { .kv = &kv };

		kv = v->kv;
		r = kvp_tunable_set(&tg, t, x, err, sizeof(err));
		if (r)
			goto fail;
		r = v->kv_apply ? v->kv_apply(v->kv_arg, &kv, &bad) : -EACCES;
		if (r) {
			snprintf(err, sizeof(err),
				 "%s: the kv layer refused it (%s)",
				 bad ? bad : t->name, strerror(-r));
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
	return r == -EACCES || r == -ENOMEM ? r : -EINVAL;
}

/* All of @text's `name = value` lines, or none of them. */
static int write_apply(struct kvp_fuse_view *v, const char *text)
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
	r = kvp_tunables_apply_lines(&tg, text, KVP_TUNABLES_RUNTIME_ONLY, NULL,
				     err, sizeof(err));
	if (r)
		goto fail;
	engine_changed = memcmp(&cfg, &old, sizeof(cfg)) != 0;
	kv_changed = memcmp(&kv, &v->kv, sizeof(kv)) != 0;
	if (kv_changed && !v->kv_apply) {
		snprintf(err, sizeof(err),
			 "kv tunables are read-only here: no kv layer is "
			 "attached to this pager");
		r = -EINVAL;
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

/* ---- FUSE operations ---- */

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->direct_io = 1;
	cfg->kernel_cache = 0;
	cfg->auto_cache = 0;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->use_ino = 0;
	return fuse_get_context()->private_data;
}

static int op_getattr(const char *path, struct stat *st,
		      struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct node n;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	memset(st, 0, sizeof(*st));
	st->st_mode = node_mode(v, &n);
	st->st_nlink = is_dir(n.kind) ? 2 : 1;
	st->st_uid = getuid();
	st->st_gid = getgid();
	/* Like sysfs: a nominal size; reads are direct and go to EOF. */
	st->st_size = n.kind == N_RBLOCK ? (off_t)n.block_bytes
					 : (is_dir(n.kind) ? 0 : 4096);
	st->st_blksize = 4096;
	clock_gettime(CLOCK_REALTIME, &st->st_mtim);
	st->st_atim = st->st_ctim = st->st_mtim;
	return 0;
}

static int fill(void *buf, fuse_fill_dir_t filler, const char *name)
{
	return filler(buf, name, NULL, 0, 0);
}

struct names_ctx {
	void *buf;
	fuse_fill_dir_t filler;
};

static int names_cb(struct kvp_region *r, void *arg)
{
	struct names_ctx *c = arg;
	char name[NAME_MAX_VIEW];

	shown_name(r, name, sizeof(name));
	if (name[0])
		fill(c->buf, c->filler, name);
	return 0;
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t filler,
		      off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	struct kvp_fuse_view *v = view();
	char name[32];
	struct node n;
	size_t i;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	if (!is_dir(n.kind))
		return -ENOTDIR;
	if (n.kind == N_RDATA) {
		/* Offsets, so that a region of many blocks lists in pieces:
		   0 ".", 1 "..", 2 + k block k. */
		uint64_t k;

		for (k = (uint64_t)off; k < n.nblocks + 2; k++) {
			if (k < 2)
				snprintf(name, sizeof(name), "%s",
					 k ? ".." : ".");
			else
				snprintf(name, sizeof(name), "%llu",
					 (unsigned long long)(k - 2));
			if (filler(buf, name, NULL, (off_t)(k + 1), 0))
				break;
		}
		return 0;
	}
	fill(buf, filler, ".");
	fill(buf, filler, "..");
	switch (n.kind) {
	case N_ROOT:
		fill(buf, filler, "tunables");
		fill(buf, filler, "stats");
		fill(buf, filler, "regions");
		fill(buf, filler, "seqs");
		for (i = 0; i < TOP_COUNT; i++)
			fill(buf, filler, top_names[i]);
		break;
	case N_TUNABLES:
		for (i = 0; i < kvp_tunables_count(); i++)
			fill(buf, filler, kvp_tunable_at(i)->name);
		break;
	case N_STATS:
	case N_RSTATS:
		for (i = 0; i < NSTATS; i++)
			fill(buf, filler, stat_descs[i].name);
		break;
	case N_REGIONS: {
		struct names_ctx c = { buf, filler };

		kvp_pager_foreach_region(v->pager, names_cb, &c);
		break;
	}
	case N_REGION:
		for (i = 0; i < RF_COUNT; i++)
			fill(buf, filler, rfile_names[i]);
		fill(buf, filler, "stats");
		fill(buf, filler, "data");
		break;
	case N_SEQS: {
		uint32_t *ids, cnt, k;

		if (seq_ids(v, &ids, &cnt))
			break;
		for (k = 0; k < cnt; k++) {
			snprintf(name, sizeof(name), "%u", ids[k]);
			fill(buf, filler, name);
		}
		free(ids);
		break;
	}
	case N_SEQ:
		fill(buf, filler, "block_table");
		break;
	default:
		break;
	}
	return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	int acc = fi->flags & O_ACCMODE;
	struct snap *s;
	struct node n;
	mode_t mode;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	if (is_dir(n.kind))
		return -EISDIR;
	mode = node_mode(v, &n);
	if ((acc != O_RDONLY && !(mode & 0200)) ||
	    (acc != O_WRONLY && !(mode & 0400)))
		return -EACCES;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	if (n.kind == N_TUNABLE && (mode & 0200))
		s->tun = n.tun;
	s->apply = n.kind == N_TOP && n.idx == TOP_APPLY;
	if (acc != O_WRONLY) {
		r = build(v, &n, s);
		if (r) {
			free(s->buf);
			free(s);
			return r;
		}
	}
	pthread_mutex_lock(&v->snap_lock);
	s->next = v->snaps;
	if (s->next)
		s->next->prev = s;
	v->snaps = s;
	pthread_mutex_unlock(&v->snap_lock);
	fi->fh = (uint64_t)(uintptr_t)s;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	return 0;
}

static int op_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;

	if (off < 0)
		return -EINVAL;
	if (!s->buf || (size_t)off >= s->len)
		return 0;
	if (size > s->len - (size_t)off)
		size = s->len - (size_t)off;
	memcpy(buf, s->buf + off, size);
	return (int)size;
}

static int op_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;
	size_t max = s->apply ? APPLY_MAX : KVP_TUNABLE_VALUE_MAX;
	char *text;
	int r;

	if (!s->tun && !s->apply)
		return -EACCES;
	if (size >= max) {
		pthread_mutex_lock(&v->cfg_lock);
		set_last_error(v,
			       "write of %zu bytes too long (at most %zu in "
			       "one write)",
			       size, max - 1);
		pthread_mutex_unlock(&v->cfg_lock);
		return -EINVAL;
	}
	text = malloc(size + 1);
	if (!text)
		return -ENOMEM;
	memcpy(text, buf, size);
	text[size] = '\0';
	r = s->apply ? write_apply(v, text) : write_tunable(v, s->tun, text);
	free(text);
	return r ? r : (int)size;
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct node n;
	int r = resolve(v, path, &n);

	if (r)
		return r;
	if (is_dir(n.kind))
		return -EISDIR;
	/* O_TRUNC of a value file: nothing to cut, the write says it all */
	return node_mode(v, &n) & 0200 ? 0 : -EACCES;
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;

	if (!s)
		return 0;
	pthread_mutex_lock(&v->snap_lock);
	if (s->prev)
		s->prev->next = s->next;
	else
		v->snaps = s->next;
	if (s->next)
		s->next->prev = s->prev;
	pthread_mutex_unlock(&v->snap_lock);
	free(s->buf);
	free(s);
	return 0;
}

static int op_flush(const char *path, struct fuse_file_info *fi)
{
	return 0;
}

static int op_no_create(const char *path, mode_t mode,
			struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_no_path(const char *path, mode_t mode)
{
	return -EACCES;
}

static int op_no_unlink(const char *path)
{
	return -EACCES;
}

static int op_no_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_no_chown(const char *path, uid_t uid, gid_t gid,
		       struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_utimens(const char *path, const struct timespec tv[2],
		      struct fuse_file_info *fi)
{
	return 0; /* touch(1) of a tunable: harmless */
}

static const struct fuse_operations view_ops = {
	.init = op_init,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.truncate = op_truncate,
	.release = op_release,
	.flush = op_flush,
	.create = op_no_create,
	.mkdir = op_no_path,
	.unlink = op_no_unlink,
	.rmdir = op_no_unlink,
	.chmod = op_no_chmod,
	.chown = op_no_chown,
	.utimens = op_utimens,
};

/* ---- the thread ---- */

static void *loop_main(void *arg)
{
	struct kvp_fuse_view *v = arg;
	struct fuse_session *se = fuse_get_session(v->fuse);
	struct fuse_buf buf;
	struct pollfd pfd[2];
	int r;

	memset(&buf, 0, sizeof(buf));
	pfd[0].fd = fuse_session_fd(se);
	pfd[0].events = POLLIN;
	pfd[1].fd = v->stopfd;
	pfd[1].events = POLLIN;
	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL))
			break; /* unmounted from outside */
		if (!(pfd[0].revents & POLLIN))
			continue;
		r = fuse_session_receive_buf(se, &buf);
		if (r == -EINTR || r == -EAGAIN)
			continue;
		if (r <= 0)
			break;
		fuse_session_process_buf(se, &buf);
	}
	free(buf.mem);
	return NULL;
}

/* ---- mounting ---- */

int kvp_fuse_available(char *why, size_t len)
{
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	int e;

	if (fd >= 0) {
		close(fd);
		return 0;
	}
	e = errno;
	if (why && len)
		snprintf(why, len,
			 "/dev/fuse cannot be opened (%s): load the fuse "
			 "module (modprobe fuse) or give the container the "
			 "device",
			 strerror(e));
	return -e;
}

static int run_fusermount(const char *path)
{
	char *const argv[] = { "fusermount3", "-u", "-z", (char *)path, NULL };
	posix_spawn_file_actions_t fa;
	int status, r;
	pid_t pid;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	r = posix_spawnp(&pid, "fusermount3", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r)
		return -r;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

int kvp_fuse_view_cleanup_stale(const char *path)
{
	struct stat st;
	int r;

	if (!path || !*path)
		return -EINVAL;
	if (stat(path, &st) == 0 || errno != ENOTCONN)
		return 0;
	r = run_fusermount(path);
	if (r && umount2(path, MNT_DETACH))
		return r == -ENOENT ? -errno : r;
	if (stat(path, &st) && errno == ENOTCONN)
		return -EBUSY;
	return 1;
}

static bool is_mountpoint(const char *path)
{
	char parent[PATH_MAX + 4];
	struct stat a, b;

	snprintf(parent, sizeof(parent), "%s/..", path);
	if (stat(path, &a) || stat(parent, &b))
		return false;
	return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

int kvp_fuse_view_mount(struct kvp_pager *p,
			const struct kvp_fuse_view_opts *opts,
			struct kvp_fuse_view **out)
{
	char optstr[128];
	char *argv[] = { "kvpager", "-o", optstr, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct kvp_fuse_view *v;
	sigset_t all, old;
	struct stat st;
	int r;

	*out = NULL;
	if (!p || !opts || !opts->mountpoint || !opts->mountpoint[0])
		return -EINVAL;
	r = kvp_fuse_available(NULL, 0);
	if (r)
		return r == -ENOENT ? -ENODEV : r;
	r = kvp_fuse_view_cleanup_stale(opts->mountpoint);
	if (r < 0)
		return r;
	r = kvp_mkdir_p(opts->mountpoint);
	if (r)
		return r;
	if (stat(opts->mountpoint, &st))
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;

	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->pager = p;
	v->stopfd = -1;
	if (!realpath(opts->mountpoint, v->path)) {
		r = -errno;
		goto err_free;
	}
	if (is_mountpoint(v->path)) {
		r = -EBUSY;
		goto err_free;
	}
	pthread_mutex_init(&v->cfg_lock, NULL);
	pthread_mutex_init(&v->snap_lock, NULL);
	pthread_rwlock_init(&v->seq_lock, NULL);
	if (opts->kv)
		v->kv = *opts->kv;
	else
		kvp_kv_config_defaults(&v->kv);
	v->kv_apply = opts->kv_apply;
	v->kv_arg = opts->kv_arg;
	v->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (v->stopfd < 0) {
		r = -errno;
		goto err_locks;
	}
	snprintf(optstr, sizeof(optstr), "fsname=kvpager,subtype=kvpager%s",
		 opts->allow_other ? ",allow_other" : "");
	v->fuse = fuse_new(&args, &view_ops, sizeof(view_ops), v);
	fuse_opt_free_args(&args);
	if (!v->fuse) {
		r = -EINVAL;
		goto err_fd;
	}
	if (fuse_mount(v->fuse, v->path)) {
		r = -EIO;
		goto err_fuse;
	}
	/* The thread takes no signal: they are the program's business. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&v->thread, NULL, loop_main, v);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r)
		goto err_unmount;
	*out = v;
	return 0;

err_unmount:
	fuse_unmount(v->fuse);
err_fuse:
	fuse_destroy(v->fuse);
err_fd:
	close(v->stopfd);
err_locks:
	pthread_rwlock_destroy(&v->seq_lock);
	pthread_mutex_destroy(&v->snap_lock);
	pthread_mutex_destroy(&v->cfg_lock);
err_free:
	free(v);
	return r;
}

void kvp_fuse_view_unmount(struct kvp_fuse_view *v)
{
	uint64_t one = 1;

	if (!v)
		return;
	if (write(v->stopfd, &one, sizeof(one)) != sizeof(one))
		abort(); /* an eventfd write of 1 cannot fail */
	pthread_join(v->thread, NULL);
	fuse_unmount(v->fuse);
	fuse_destroy(v->fuse);
	close(v->stopfd);
	while (v->snaps) {
		struct snap *s = v->snaps;

		v->snaps = s->next;
		free(s->buf);
		free(s);
	}
	pthread_rwlock_destroy(&v->seq_lock);
	pthread_mutex_destroy(&v->snap_lock);
	pthread_mutex_destroy(&v->cfg_lock);
	free(v);
}

const char *kvp_fuse_view_path(const struct kvp_fuse_view *v)
{
	return v->path;
}

void kvp_fuse_view_set_kv(struct kvp_fuse_view *v,
			  const struct kvp_kv_config *cur,
			  kvp_kv_apply_fn apply, void *arg)
{
	pthread_mutex_lock(&v->cfg_lock);
	if (cur)
		v->kv = *cur;
	v->kv_apply = apply;
	v->kv_arg = arg;
	pthread_mutex_unlock(&v->cfg_lock);
}

void kvp_fuse_view_kv_config(struct kvp_fuse_view *v, struct kvp_kv_config *out)
{
	pthread_mutex_lock(&v->cfg_lock);
	*out = v->kv;
	pthread_mutex_unlock(&v->cfg_lock);
}

void kvp_fuse_view_set_seqs(struct kvp_fuse_view *v,
			    const struct kvp_fuse_seq_ops *ops, void *arg)
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
