/*
 * prom.c - the Prometheus exposition of a pager (prom.h).
 *
 * Written with open_memstream: the text grows as needed, and a failed
 * allocation shows as fclose failing, checked once at the end.
 */
#include "lib/view/prom.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/tunables/tunables.h"

const struct kvp_stat_desc kvp_stat_descs[] = {
#define X(n, k, d) { #n, k, d, offsetof(struct kvp_stats, n) },
	KVP_STATS(X)
#undef X
};
const size_t kvp_stat_count =
    sizeof(kvp_stat_descs) / sizeof(kvp_stat_descs[0]);

uint64_t kvp_stat_value(const struct kvp_stats *s, size_t i)
{
	return kvp_stat_desc_value(s, &kvp_stat_descs[i]);
}

/* A label value: \ " and newline escaped. */
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

/* What is shown of one region, copied under the region list lock. */
struct region_row {
	char *name;	     /* malloc'd */
	struct kvp_stats st; /* kvp_region_stats */
	size_t size;	     /* bytes */
	size_t block_bytes;  /* its block size */
};

struct rows {
	struct region_row *v; /* rows[0..n) */
	size_t n, cap;	      /* used, allocated */
	int err;	      /* -ENOMEM if a row was lost */
};

static int rows_cb(struct kvp_region *r, void *arg)
{
	struct rows *rs = arg;
	struct region_row *row;
	const char *name = kvp_region_name(r);

	if (rs->n == rs->cap) {
		size_t cap = rs->cap ? rs->cap * 2 : 16;

		row = realloc(rs->v, cap * sizeof(*row));
		if (!row) {
			rs->err = -ENOMEM;
			return 1;
		}
		rs->v = row;
		rs->cap = cap;
	}
	row = &rs->v[rs->n];
	row->name = strdup(name ? name : "");
	if (!row->name) {
		rs->err = -ENOMEM;
		return 1;
	}
	kvp_region_stats(r, &row->st);
	row->size = kvp_region_size(r);
	row->block_bytes = kvp_region_block_bytes(r);
	rs->n++;
	return 0;
}

static void rows_free(struct rows *rs)
{
	size_t i;

	for (i = 0; i < rs->n; i++)
		free(rs->v[i].name);
	free(rs->v);
}

/* What a per-region family shows: a statistic's index, or one of these. */
#define ROW_SIZE       ((size_t)-1)
#define ROW_BLOCK_SIZE ((size_t)-2)

static uint64_t row_value(const struct region_row *row, size_t which)
{
	if (which == ROW_SIZE)
		return row->size;
	if (which == ROW_BLOCK_SIZE)
		return row->block_bytes;
	return kvp_stat_value(&row->st, which);
}

/* One family over the regions: @which picks the number (row_value). */
static void put_region_family(FILE *f, int pid, const struct rows *rs,
			      const char *name, const char *type,
			      const char *doc, size_t which)
{
	size_t k;

	fprintf(f, "# HELP kvpager_region_%s %s\n# TYPE kvpager_region_%s %s\n",
		name, doc, name, type);
	for (k = 0; k < rs->n; k++) {
		fprintf(f, "kvpager_region_%s{pid=\"%d\",region=\"", name, pid);
		put_label(f, rs->v[k].name);
		fprintf(f, "\"} %llu\n",
			(unsigned long long)row_value(&rs->v[k], which));
	}
}

static void put_tunables(FILE *f, int pid, struct kvp_pager *p,
			 const struct kvp_kv_config *kv)
{
	struct kvp_config cfg;
	struct kvp_kv_config kvc;
	struct kvp_tunable_target tg = { .pager = &cfg, .kv = &kvc };
	size_t i;

	kvp_pager_config(p, &cfg);
	if (kv)
		kvc = *kv;
	else
		kvp_kv_config_defaults(&kvc);
	fprintf(f, "# HELP kvpager_tunable a tunable's value (a choice: its "
		   "index)\n# TYPE kvpager_tunable gauge\n");
	for (i = 0; i < kvp_tunables_count(); i++) {
		const struct kvp_tunable *t = kvp_tunable_at(i);
		uint64_t x = 0;

		kvp_tunable_get(&tg, t, &x);
		fprintf(f, "kvpager_tunable{pid=\"%d\",name=\"%s\"} %llu\n",
			pid, t->name, (unsigned long long)x);
	}
}

/*
 * A latency histogram kvpager_@name: bucket k counts [2^k, 2^(k+1)) us
 * (pager/stats.h), so its upper bound is le 2^(k+1) us; the last one also
 * counts every longer time, so it shows only in +Inf.
 */
static void put_latency(FILE *f, int pid, const char *name, const char *doc,
			const uint64_t *buckets, uint64_t sum_ns)
{
	uint64_t cum = 0;
	size_t k;

	fprintf(f, "# HELP kvpager_%s %s\n# TYPE kvpager_%s histogram\n", name,
		doc, name);
	for (k = 0; k < KVP_LATENCY_BUCKETS; k++) {
		cum += buckets[k];
		if (k == KVP_LATENCY_BUCKETS - 1)
			break;
		fprintf(f, "kvpager_%s_bucket{pid=\"%d\",le=\"%g\"} %llu\n",
			name, pid, (double)(1ULL << (k + 1)) * 1e-6,
			(unsigned long long)cum);
	}
	fprintf(f,
		"kvpager_%s_bucket{pid=\"%d\",le=\"+Inf\"} %llu\n"
		"kvpager_%s_sum{pid=\"%d\"} %.9f\n"
		"kvpager_%s_count{pid=\"%d\"} %llu\n",
		name, pid, (unsigned long long)cum, name, pid,
		(double)sum_ns * 1e-9, name, pid, (unsigned long long)cum);
}

/* One family of one sample, kvpager_<@prefix><@name>. */
static void put_single(FILE *f, int pid, const char *prefix, const char *name,
		       enum kvp_stat_kind kind, const char *doc, uint64_t x)
{
	fprintf(f,
		"# HELP kvpager_%s%s %s\n# TYPE kvpager_%s%s %s\n"
		"kvpager_%s%s{pid=\"%d\"} %llu\n",
		prefix, name, doc, prefix, name,
		kind == KVP_COUNTER ? "counter" : "gauge", prefix, name, pid,
		(unsigned long long)x);
}

int kvp_prom_render(struct kvp_pager *p, const struct kvp_kv_config *kv,
		    char **buf, size_t *len)
{
	struct kvp_stats st;
	struct rows rs = { 0 };
	int pid = (int)getpid();
	size_t i;
	FILE *f;
	int r;

	*buf = NULL;
	*len = 0;
	f = open_memstream(buf, len);
	if (!f)
		return -ENOMEM;
	kvp_pager_stats(p, &st);
	kvp_pager_foreach_region(p, rows_cb, &rs);

	fprintf(f,
		"# HELP kvpager_info the pager serving this view\n"
		"# TYPE kvpager_info gauge\n"
		"kvpager_info{pid=\"%d\",uffd_mode=\"%s\"} 1\n",
		pid, kvp_pager_uffd_mode(p));
	for (i = 0; i < kvp_stat_count; i++) {
		const struct kvp_stat_desc *d = &kvp_stat_descs[i];

		fprintf(f, "# HELP kvpager_%s %s\n# TYPE kvpager_%s %s\n",
			d->name, d->doc, d->name,
			d->kind == KVP_COUNTER ? "counter" : "gauge");
		fprintf(f, "kvpager_%s{pid=\"%d\"} %llu\n", d->name, pid,
			(unsigned long long)kvp_stat_value(&st, i));
	}
	put_latency(f, pid, "io_latency_seconds", "store read latency",
		    st.io_latency_us, st.io_latency_sum_ns);
	put_tunables(f, pid, p, kv);
	put_region_family(f, pid, &rs, "size_bytes", "gauge",
			  "the region's size", ROW_SIZE);
	put_region_family(f, pid, &rs, "block_size_bytes", "gauge",
			  "the region's block size", ROW_BLOCK_SIZE);
	for (i = 0; i < kvp_stat_count; i++) {
		const struct kvp_stat_desc *d = &kvp_stat_descs[i];
		char doc[256];

		snprintf(doc, sizeof(doc), "%s, per region", d->doc);
		put_region_family(f, pid, &rs, d->name,
				  d->kind == KVP_COUNTER ? "counter" : "gauge",
				  doc, i);
	}
	r = rs.err;
	rows_free(&rs);
	if (fclose(f) && !r)
		r = -ENOMEM;
	if (r) {
		free(*buf);
		*buf = NULL;
		*len = 0;
	}
	return r;
}

/* Append what @put writes (with @arg) to *buf, *len bytes: 0, or -ENOMEM
 * with *buf as it was. */
static int append(char **buf, size_t *len, void (*put)(FILE *, int, const void *),
		  const void *arg)
{
	char *more = NULL, *nb;
	size_t n = 0;
	FILE *f = open_memstream(&more, &n);

	if (!f)
		return -ENOMEM;
	put(f, (int)getpid(), arg);
	if (fclose(f)) {
		free(more);
		return -ENOMEM;
	}
	nb = realloc(*buf, *len + n + 1);
	if (!nb) {
		free(more);
		return -ENOMEM;
	}
	memcpy(nb + *len, more, n + 1);
	*buf = nb;
	*len += n;
	free(more);
	return 0;
}

/* Every figure of table @d (@n entries) of @st, kvpager_<@prefix><name>. */
static void put_table(FILE *f, int pid, const char *prefix,
		      const struct kvp_stat_desc *d, size_t n, const void *st)
{
	for (size_t i = 0; i < n; i++)
		put_single(f, pid, prefix, d[i].name, d[i].kind, d[i].doc,
			   kvp_stat_desc_value(st, &d[i]));
}

static void put_cache(FILE *f, int pid, const void *arg)
{
	put_table(f, pid, "cache_", kvp_cache_stat_descs, kvp_cache_stat_count,
		  arg);
}

int kvp_prom_append_cache(const struct kvp_cache_stats *st, char **buf,
			  size_t *len)
{
	return append(buf, len, put_cache, st);
}

static void put_remote(FILE *f, int pid, const void *arg)
{
	const struct kvp_remote_stats *st = arg;

	put_table(f, pid, "remote_", kvp_remote_stat_descs,
		  kvp_remote_stat_count, st);
	put_latency(f, pid, "remote_fetch_latency_seconds",
		    "remote tier fetch round trip latency", st->fetch_latency_us,
		    st->fetch_latency_sum_ns);
}

int kvp_prom_append_remote(const struct kvp_remote_stats *st, char **buf,
			   size_t *len)
{
	return append(buf, len, put_remote, st);
}
