/*
 * backend_mmap.c - the KV cache on the kernel's mmap of a file
 * (kv_backend_i.h): what a user gets from mmap without kvpager, the
 * baselines of kvpbench decode (with MADV_WILLNEED from the same
 * predictor when prefetch is on, without it otherwise).
 *
 * The kernel has no RAM budget for one mapping, so this backend emulates
 * one: an LRU over the pager blocks each step read; past the budget the
 * least recent is dropped (MADV_DONTNEED and POSIX_FADV_DONTNEED), and at
 * the end of a step whatever else is in the page cache (readahead, the
 * rolling flushes) is dropped too (mm_sweep).  Writes go by pwrite, so
 * nothing is read to be overwritten; a prefill ends with the file synced
 * and cold, as a user's mmap of it would start.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "lib/kv/kvcache_i.h"

struct mm_state {
	int fd;		     /* the backing file (unlinked) */
	uint32_t *lru_prev;  /* per pager block; UINT32_MAX: none */
	uint32_t *lru_next;  /* per pager block; UINT32_MAX: none */
	uint8_t *lru_in;     /* per pager block: in the LRU */
	uint32_t lru_head;   /* most recent */
	uint32_t lru_tail;   /* least recent, dropped first */
	uint64_t lru_bytes;  /* pager blocks in the LRU, bytes */
	unsigned char *resv; /* mincore's vector over the region */
	uint64_t read0;	     /* /proc/self/io read_bytes at step_begin */
	uint64_t majflt0;    /* major faults at step_begin */
};

static void mm_drop(struct kvp_kvcache *c, uint64_t pb)
{
	struct mm_state *m = c->bs;
	size_t pbb = c->l.pager_block_bytes;

	kvp_mem_advise(c->base + pb * pbb, pbb, MADV_DONTNEED);
	posix_fadvise(m->fd, (off_t)(pb * pbb), (off_t)pbb,
		      POSIX_FADV_DONTNEED);
	c->st.mmap_dropped_bytes += pbb;
}

static void lru_unlink(struct kvp_kvcache *c, uint32_t pb)
{
	struct mm_state *m = c->bs;
	uint32_t p = m->lru_prev[pb], n = m->lru_next[pb];

	if (p != UINT32_MAX)
		m->lru_next[p] = n;
	else
		m->lru_head = n;
	if (n != UINT32_MAX)
		m->lru_prev[n] = p;
	else
		m->lru_tail = p;
	m->lru_in[pb] = 0;
	m->lru_bytes -= c->l.pager_block_bytes;
}

static void lru_touch(struct kvp_kvcache *c, uint32_t pb)
{
	struct mm_state *m = c->bs;

	if (m->lru_in[pb])
		lru_unlink(c, pb);
	m->lru_prev[pb] = UINT32_MAX;
	m->lru_next[pb] = m->lru_head;
	if (m->lru_head != UINT32_MAX)
		m->lru_prev[m->lru_head] = pb;
	m->lru_head = pb;
	if (m->lru_tail == UINT32_MAX)
		m->lru_tail = pb;
	m->lru_in[pb] = 1;
	m->lru_bytes += c->l.pager_block_bytes;
}

/* A layer's blocks were read: most recent now; drop past the budget. */
static void mm_layer_done(struct kvp_kvcache *c, const struct kvc_plan *pl)
{
	struct mm_state *m = c->bs;
	size_t k;

	for (k = 0; k < pl->npb; k++)
		lru_touch(c, (uint32_t)pl->pb[k]);
	while (m->lru_bytes > c->budget && m->lru_tail != UINT32_MAX) {
		uint32_t pb = m->lru_tail;

		lru_unlink(c, pb);
		mm_drop(c, pb);
	}
}

/*
 * End of step: pages the kernel read around what we touched (readahead)
 * and pages of rolling flushes are not in the LRU; drop them, so that the
 * page cache holds no more of the file than the budget across steps.
 */
static void mm_sweep(struct kvp_kvcache *c)
{
	struct mm_state *m = c->bs;
	size_t pbb = c->l.pager_block_bytes, per = pbb / 4096, i;
	uint64_t pb;

	if (mincore(c->base, c->l.region_bytes, m->resv))
		return;
	for (pb = 0; pb < c->npb; pb++) {
		if (m->lru_in[pb])
			continue;
		for (i = 0; i < per; i++) {
			if (m->resv[pb * per + i] & 1) {
				mm_drop(c, pb);
				break;
			}
		}
	}
}

static int mm_open(struct kvp_kvcache *c)
{
	const char *dir = c->o.dir ? c->o.dir : getenv("TMPDIR");
	struct mm_state *m = calloc(1, sizeof(*m));
	char path[4096];
	int fd, err;

	if (!m)
		return -ENOMEM;
	m->fd = -1;
	c->bs = m;
	if (!dir || !*dir)
		dir = "/tmp";
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(path, sizeof(path), "%s/kvcache-XXXXXX", dir);
		fd = mkostemp(path, O_CLOEXEC);
		if (fd < 0)
			return -errno;
		unlink(path);
	}
	m->fd = fd;
	err = posix_fallocate(fd, 0, (off_t)c->l.region_bytes);
	if (err)
		return -err;
	c->base = mmap(NULL, c->l.region_bytes, PROT_READ | PROT_WRITE,
		       MAP_SHARED, fd, 0);
	if (c->base == MAP_FAILED) {
		c->base = NULL;
		return -errno;
	}
	m->lru_prev = malloc(sizeof(uint32_t) * c->npb);
	m->lru_next = malloc(sizeof(uint32_t) * c->npb);
	m->lru_in = calloc(c->npb, 1);
	m->resv = malloc(c->l.region_bytes / 4096);
	if (!m->lru_prev || !m->lru_next || !m->lru_in || !m->resv)
		return -ENOMEM;
	m->lru_head = m->lru_tail = UINT32_MAX;
	return 0;
}

static void mm_close(struct kvp_kvcache *c)
{
	struct mm_state *m = c->bs;

	if (c->base)
		munmap(c->base, c->l.region_bytes);
	if (!m)
		return;
	if (m->fd >= 0)
		close(m->fd);
	free(m->lru_prev);
	free(m->lru_next);
	free(m->lru_in);
	free(m->resv);
	free(m);
	c->bs = NULL;
}

static int mm_write(struct kvp_kvcache *c, uint64_t off, const char *data,
		    size_t len, bool flush)
{
	struct mm_state *m = c->bs;
	size_t done = 0;
	ssize_t w;

	while (done < len) {
		w = pwrite(m->fd, data + done, len - done, (off_t)(off + done));
		if (w < 0)
			return -errno;
		done += (size_t)w;
	}
	if (flush)
		c->cur.flush_store++;
	c->cur.bytes_written += len;
	return 0;
}

static int mm_read(struct kvp_kvcache *c, uint32_t layer, const uint32_t *phys,
		   size_t n, char *dst)
{
	struct mm_state *m = c->bs;
	size_t i;

	for (i = 0; i < n; i++) {
		ssize_t r =
		    pread(m->fd, dst + i * c->stride, c->stride,
			  (off_t)kvp_kv_layout_offset(&c->l, layer, phys[i]));
		if (r != (ssize_t)c->stride)
			return r < 0 ? -errno : -EIO;
	}
	return 0;
}

static bool mm_resident(struct kvp_kvcache *c, uint64_t pb)
{
	struct mm_state *m = c->bs;

	return m->lru_in[pb];
}

/* MADV_WILLNEED over runs of the plan's blocks not known resident. */
static int mm_prefetch(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	size_t pbb = c->l.pager_block_bytes, i, j;

	for (i = 0; i < pl->npb; i = j) {
		for (j = i + 1; j < pl->npb && pl->pb[j] == pl->pb[j - 1] + 1;
		     j++)
			;
		if (!pl->res[i] || j - i > 1)
			kvp_mem_advise(c->base + pl->pb[i] * pbb, (j - i) * pbb,
				       MADV_WILLNEED);
	}
	return 0;
}

/* Make the file cold: everything written reaches the disk and leaves the
 * page cache (the cold start that a user's mmap would have). */
static void mm_settle(struct kvp_kvcache *c)
{
	struct mm_state *m = c->bs;

	fdatasync(m->fd);
	posix_fadvise(m->fd, 0, 0, POSIX_FADV_DONTNEED);
	kvp_mem_advise(c->base, c->l.region_bytes, MADV_DONTNEED);
	while (m->lru_tail != UINT32_MAX)
		lru_unlink(c, m->lru_tail);
}

static uint64_t proc_read_bytes(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	char line[128];
	unsigned long long v = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "read_bytes: %llu", &v) == 1)
			break;
	fclose(f);
	return v;
}

static uint64_t majflt(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_majflt;
}

static void mm_step_begin(struct kvp_kvcache *c)
{
	struct mm_state *m = c->bs;

	m->read0 = proc_read_bytes();
	m->majflt0 = majflt();
}

static void mm_step_end(struct kvp_kvcache *c,
			struct kvp_kvcache_step_stats *st, bool completed)
{
	struct mm_state *m = c->bs;

	if (completed)
		mm_sweep(c);
	st->bytes_read += proc_read_bytes() - m->read0;
	st->demand_faults = majflt() - m->majflt0;
}

static const char *mm_where(struct kvp_kvcache *c, uint64_t pb)
{
	return "file";
}

const struct kvc_backend_ops kvc_backend_mmap = {
	.name = "mmap",
	.open = mm_open,
	.close = mm_close,
	.write = mm_write,
	.read = mm_read,
	.resident = mm_resident,
	.prefetch = mm_prefetch,
	.prefilled = mm_settle,
	.step_begin = mm_step_begin,
	.layer_done = mm_layer_done,
	.step_end = mm_step_end,
	.where = mm_where,
};
