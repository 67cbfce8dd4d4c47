/*
 * backend_pager.c - the KV cache on a pager region (kv_backend_i.h): the
 * product.
 *
 * The region (KVP_REGION_FROM_STORE) faults KV blocks in from the store
 * under the pager's RAM budget; plans prefetch their pager blocks
 * asynchronously (the waiter thread of plan.c waits) and pin them while
 * the layer computes.  Writes bypass the region where they can: a pager
 * block ABSENT and clean in the store is written to the store directly,
 * so it is never faulted in only to be overwritten (THE ROLLING BUFFER in
 * kvcache.h); reads for quality and forks peek frames or read the store,
 * so they change no residency.
 *
 * The pager, store and region are the cache's own unless the options
 * bring a pager or a store.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/kv/kvcache_i.h"

#define WRITE_CHUNK (16u << 20) /* largest single store write */
#define READ_CHUNK  (8u << 20)	/* largest single store read (quality) */

#define FLUSHES 64 /* rolling flushes in flight at most */

/* One rolling flush in flight: a copy of the block, written by the queue. */
struct pg_flush {
	struct kvp_io io; /* buf: its copy */
	uint64_t pb;	  /* the pager block it writes */
	bool busy;	  /* in flight */
};

struct pg_state {
	struct kvp_store *store; /* the region's */
	bool own_store;		 /* made here: destroy it */
	bool own_pager;		 /* made here: close it */
	struct kvp_stats s0;	 /* the region's counters at step_begin */
	/* ROLLING FLUSHES IN FLIGHT (the driving thread's queue) */
	struct kvp_store_queue *fq; /* NULL: flushes are written at once */
	bool fq_tried;		    /* made, or found impossible */
	struct pg_flush *fl;	    /* FLUSHES of them */
	char *flbuf;		    /* their copies, FLUSHES x stride */
	unsigned fl_busy;	    /* in flight */
	int fl_err;		    /* a flush that failed twice: sticky */
};

static int pg_open(struct kvp_kvcache *c)
{
	const struct kvp_kvcache_opts *o = &c->o;
	struct pg_state *ps = calloc(1, sizeof(*ps));
	struct kvp_region_opts ro;
	struct kvp_config cur;
	int err;

	if (!ps)
		return -ENOMEM;
	c->bs = ps;
	if (o->pager) {
		c->pager = o->pager;
	} else {
		struct kvp_config cfg;

		if (o->cfg)
			cfg = *o->cfg;
		else
			kvp_config_defaults(&cfg);
		cfg.ram_budget_bytes = c->budget;
		if (cfg.ram_budget_bytes < (2u << 20))
			cfg.ram_budget_bytes = 2u << 20;
		err = kvp_pager_open(&cfg, &c->pager);
		if (err)
			return err;
		ps->own_pager = true;
	}
	kvp_pager_config(c->pager, &cur);
	c->budget = cur.ram_budget_bytes;
	if (o->store) {
		ps->store = o->store;
	} else {
		err =
		    kvp_store_file_temp(o->dir, c->l.region_bytes, &ps->store);
		if (err)
			return err;
		ps->own_store = true;
	}
	memset(&ro, 0, sizeof(ro));
	ro.name = o->region_name ? o->region_name : "kv";
	ro.size = c->l.region_bytes;
	ro.block_bytes = c->l.pager_block_bytes;
	ro.store = ps->store;
	ro.store_offset = o->store_offset;
	ro.flags = KVP_REGION_FROM_STORE;
	err = kvp_region_create(c->pager, &ro, &c->region);
	if (err)
		return err;
	c->base = kvp_region_addr(c->region);
	return 0;
}

static void flush_fini(struct kvp_kvcache *c);

static void pg_close(struct kvp_kvcache *c)
{
	struct pg_state *ps = c->bs;

	if (ps)
		flush_fini(c);
	if (c->region)
		kvp_region_destroy(c->region);
	c->region = NULL;
	if (!ps)
		return;
	if (ps->own_pager)
		kvp_pager_close(c->pager);
	if (ps->own_store)
		kvp_store_destroy(ps->store);
	free(ps);
	c->bs = NULL;
}

/* ---- rolling flushes in flight -----------------------------------------
 *
 * A full rolling block whose pager block is absent and in the store is
 * written there (THE ROLLING BUFFER in kvcache.h).  All layers' rolling
 * blocks fill in the same step, so writing each at once stalled every
 * G-th step by a layer count of synchronous writes (32 x 16 KiB: 9-21 ms
 * of a 25 ms lowrank step at 32K on this project's VM).  Instead the block
 * is copied and its write queued; the copy is the data until the write
 * completes.  Anything that reads or writes that pager block again waits
 * for it first (pg_write_wait: a plan before it reads, a write, a read,
 * a discard, a bind, the close), so no read sees the store without it.  A
 * failed write is tried once more, synchronously, from the copy; a second
 * failure is kept and returned by every later wait: the cache has lost
 * that block and says so, never serving what the store holds instead.
 */

static void flush_done(struct kvp_kvcache *c, struct pg_flush *f)
{
	struct pg_state *ps = c->bs;

	if (f->io.result != (int64_t)f->io.len) {
		int err = kvp_store_pwrite(ps->store, f->io.buf, f->io.len,
					   f->io.off);

		if (err && !ps->fl_err)
			ps->fl_err = err;
	}
	f->busy = false;
	ps->fl_busy--;
}

/* Reap completed flushes; wait for one if asked and any is in flight. */
static void flush_reap(struct kvp_kvcache *c, bool wait)
{
	struct pg_state *ps = c->bs;
	struct kvp_io *done[FLUSHES];
	int n, k;

	if (!ps->fl_busy)
		return;
	n = ps->store->ops->reap(ps->fq, done, FLUSHES, wait);
	if (n < 0 && wait)
		usleep(1000); /* still in flight: not in a spin */
	for (k = 0; k < n; k++)
		flush_done(c, done[k]->cookie);
}

/* Is a flush of a pager block in [pb, pb + n) in flight?  (pb sorted
 * ascending, n blocks; list NULL: any at all.) */
static bool flush_pending(const struct pg_state *ps, const uint64_t *list,
			  size_t n)
{
	unsigned i;

	for (i = 0; i < FLUSHES && ps->fl_busy; i++) {
		size_t lo = 0, hi = n;

		if (!ps->fl[i].busy)
			continue;
		if (!list)
			return true;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;

			if (list[mid] < ps->fl[i].pb)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < n && list[lo] == ps->fl[i].pb)
			return true;
	}
	return false;
}

static int pg_write_wait(struct kvp_kvcache *c, const uint64_t *pb, size_t n)
{
	struct pg_state *ps = c->bs;

	if (!ps || !ps->fq)
		return 0;
	flush_reap(c, false);
	while (flush_pending(ps, pb, n))
		flush_reap(c, true);
	return ps->fl_err;
}

/* Wait for flushes of pager blocks [first, last]. */
static int write_wait_range(struct kvp_kvcache *c, uint64_t first,
			    uint64_t last)
{
	struct pg_state *ps = c->bs;
	unsigned i;
	bool any = true;

	if (!ps->fq)
		return 0;
	while (any) {
		any = false;
		for (i = 0; i < FLUSHES && ps->fl_busy; i++)
			if (ps->fl[i].busy && ps->fl[i].pb >= first &&
			    ps->fl[i].pb <= last)
				any = true;
		if (any)
			flush_reap(c, true);
	}
	return ps->fl_err;
}

static void flush_fini(struct kvp_kvcache *c)
{
	struct pg_state *ps = c->bs;

	if (ps->fq) {
		(void)pg_write_wait(c, NULL, 0);
		ps->store->ops->queue_destroy(ps->fq);
	}
	ps->fq = NULL;
	free(ps->fl);
	free(ps->flbuf);
}

/* The queue and copies, at the first flush; false: flush at once. */
static bool flush_ready(struct kvp_kvcache *c)
{
	struct pg_state *ps = c->bs;
	size_t ma = ps->store->mem_align > 4096 ? ps->store->mem_align : 4096;
	size_t stride = (c->stride + ma - 1) / ma * ma;

	if (ps->fq_tried)
		return ps->fq != NULL;
	ps->fq_tried = true;
	if (!ps->store->ops->queue_create)
		return false;
	ps->fl = calloc(FLUSHES, sizeof(*ps->fl));
	ps->flbuf = aligned_alloc(ma, FLUSHES * stride);
	if (!ps->fl || !ps->flbuf ||
	    ps->store->ops->queue_create(ps->store, FLUSHES, &ps->fq)) {
		free(ps->fl);
		free(ps->flbuf);
		ps->fl = NULL;
		ps->flbuf = NULL;
		ps->fq = NULL;
		return false;
	}
	for (unsigned i = 0; i < FLUSHES; i++)
		ps->fl[i].io.buf = ps->flbuf + (size_t)i * stride;
	return true;
}

/* Queue the write of len bytes at region offset off (pager block pb). */
static int flush_async(struct kvp_kvcache *c, uint64_t pb, uint64_t off,
		       const char *data, size_t len)
{
	struct pg_state *ps = c->bs;
	struct pg_flush *f = NULL;
	struct kvp_io *io;
	unsigned i;
	int got;

	while (ps->fl_busy == FLUSHES)
		flush_reap(c, true);
	for (i = 0; i < FLUSHES && !f; i++)
		if (!ps->fl[i].busy)
			f = &ps->fl[i];
	io = &f->io;
	memcpy(io->buf, data, len);
	io->op = KVP_IO_WRITE;
	io->len = len;
	io->off = c->o.store_offset + off;
	io->result = 0;
	io->cookie = f;
	f->pb = pb;
	got = ps->store->ops->submit(ps->fq, &io, 1);
	if (got != 1) /* refused: written at once */
		return kvp_store_pwrite(ps->store, io->buf, len, io->off);
	f->busy = true;
	ps->fl_busy++;
	return 0;
}

/* Absent, clean and in the store: the store's copy is the block. */
static int pb_in_store(struct kvp_kvcache *c, uint64_t pb)
{
	struct kvp_block_info bi;
	int err = kvp_region_block_info(c->region, pb, &bi);

	if (err)
		return err;
	return bi.state == KVP_BLOCK_ABSENT && bi.in_store && !bi.dirty;
}

/*
 * Write bytes [off, off + len) of the region from data: the pieces whose
 * pager block is absent and in the store by store writes (coalesced),
 * the others through the region (see THE ROLLING BUFFER in kvcache.h).
 */
static int pg_write(struct kvp_kvcache *c, uint64_t off, const char *data,
		    size_t len, bool flush)
{
	struct pg_state *ps = c->bs;
	size_t pbb = c->l.pager_block_bytes;
	uint32_t align = ps->store->offset_align ? ps->store->offset_align : 1;
	uint64_t pend_off = 0, end = off + len;
	const char *pend = NULL;
	size_t pend_len = 0;
	int err = write_wait_range(c, off / pbb, (end - 1) / pbb);

	if (err)
		return err;
	if (flush && len <= pbb && off / pbb == (end - 1) / pbb &&
	    off % align == 0 && len % align == 0 &&
	    pb_in_store(c, off / pbb) == 1 && flush_ready(c)) {
		err = flush_async(c, off / pbb, off, data, len);
		if (!err) {
			c->cur.bytes_written += len;
			c->cur.flush_store++;
		}
		return err;
	}
	while (off < end) {
		uint64_t pb = off / pbb;
		uint64_t pend_b = (pb + 1) * pbb < end ? (pb + 1) * pbb : end;
		size_t n = (size_t)(pend_b - off);
		bool direct = off % align == 0 && n % align == 0 &&
			      pb_in_store(c, pb) == 1;

		if (direct && pend && pend_off + pend_len == off &&
		    pend_len + n <= WRITE_CHUNK) {
			pend_len += n;
		} else {
			if (pend) {
				err = kvp_store_pwrite(
				    ps->store, pend, pend_len,
				    c->o.store_offset + pend_off);
				if (err)
					return err;
				c->cur.bytes_written += pend_len;
				pend = NULL;
			}
			if (direct) {
				pend = data;
				pend_off = off;
				pend_len = n;
			} else {
				memcpy(c->base + off, data, n);
				if (flush)
					c->cur.flush_region++;
			}
		}
		if (direct && flush)
			c->cur.flush_store++;
		data += n;
		off += n;
	}
	if (pend) {
		err = kvp_store_pwrite(ps->store, pend, pend_len,
				       c->o.store_offset + pend_off);
		if (!err)
			c->cur.bytes_written += pend_len;
	}
	return err;
}

/*
 * Physical blocks phys[0..n) of layer into dst (n * stride), leaving the
 * pager's state alone: runs of absent blocks are read from the store,
 * others copied from their frames by kvp_region_peek (through pbbuf, a
 * pager block).  Only thread-safe calls (the region's, the store's): any
 * thread may run it on blocks whose writes are done.
 */
static int pg_read_shared(struct kvp_kvcache *c, uint32_t layer,
			  const uint32_t *phys, size_t n, char *dst,
			  char *pbbuf)
{
	struct pg_state *ps = c->bs;
	size_t pbb = c->l.pager_block_bytes, i = 0;
	uint64_t cached = UINT64_MAX;
	uint32_t align = ps->store->offset_align ? ps->store->offset_align : 1;
	int err;

	while (i < n) {
		uint64_t off = kvp_kv_layout_offset(&c->l, layer, phys[i]);
		uint64_t pb = off / pbb;
		size_t j = i + 1;

		if (pb != cached && off % align == 0 &&
		    c->stride % align == 0) {
			err = pb_in_store(c, pb);
			if (err < 0)
				return err;
			if (err) {
				uint64_t lastpb = pb;

				/* extend over consecutive, store-readable */
				while (j < n && phys[j] == phys[j - 1] + 1 &&
				       (j - i) * c->stride < READ_CHUNK) {
					uint64_t q = kvp_kv_layout_pager_block(
					    &c->l, layer, phys[j]);

					if (q != lastpb) {
						if (pb_in_store(c, q) != 1)
							break;
						lastpb = q;
					}
					j++;
				}
				err = kvp_store_pread(ps->store,
						      dst + i * c->stride,
						      (j - i) * c->stride,
						      c->o.store_offset + off);
				if (err)
					return err;
				i = j;
				continue;
			}
		}
		if (pb != cached) {
			err = kvp_region_peek(c->region, pb, pbbuf);
			if (err)
				return err;
			cached = pb;
		}
		memcpy(dst + i * c->stride, pbbuf + (off - pb * pbb),
		       c->stride);
		i++;
	}
	return 0;
}

/* pg_read_shared on the driver, after the writes in flight. */
static int pg_read(struct kvp_kvcache *c, uint32_t layer, const uint32_t *phys,
		   size_t n, char *dst)
{
	int err = pg_write_wait(c, NULL, 0);

	return err ? err : pg_read_shared(c, layer, phys, n, dst, c->pbbuf);
}

static bool pg_resident(struct kvp_kvcache *c, uint64_t pb)
{
	struct kvp_block_info bi;

	return !kvp_region_block_info(c->region, pb, &bi) &&
	       bi.state == KVP_BLOCK_RESIDENT;
}

static bool pg_in_store(struct kvp_kvcache *c, uint64_t pb)
{
	return pb_in_store(c, pb) == 1;
}

static int pg_prefetch(struct kvp_kvcache *c, struct kvc_plan *pl)
{
	int err;

	pl->t_submit = kvc_now_s();
	err = kvp_prefetch_submit(c->region, pl->pb, pl->npb, &pl->pf);
	if (err) {
		pl->pf = NULL;
		return err;
	}
	c->cur.prefetch_issued += pl->npb;
	return 0;
}

static int pg_pin(struct kvp_kvcache *c, uint64_t pb, uint64_t n)
{
	return kvp_region_pin(c->region, pb, n);
}

static void pg_unpin(struct kvp_kvcache *c, uint64_t pb, uint64_t n)
{
	kvp_region_unpin(c->region, pb, n);
}

static void pg_advise_cold(struct kvp_kvcache *c, uint64_t pb, uint64_t n)
{
	kvp_region_advise(c->region, pb, n, KVP_ADVICE_COLD);
}

static int pg_discard(struct kvp_kvcache *c, uint64_t pb)
{
	(void)write_wait_range(c, pb, pb); /* its error stays for a wait */
	return kvp_region_advise(c->region, pb, 1, KVP_ADVICE_DISCARD);
}

static void pg_step_begin(struct kvp_kvcache *c)
{
	struct pg_state *ps = c->bs;

	kvp_region_stats(c->region, &ps->s0);
}

static void pg_step_end(struct kvp_kvcache *c,
			struct kvp_kvcache_step_stats *st, bool completed)
{
	struct pg_state *ps = c->bs;
	const struct kvp_stats *s0 = &ps->s0;
	struct kvp_stats s1;

	kvp_region_stats(c->region, &s1);
	st->bytes_read += s1.bytes_read_total - s0->bytes_read_total;
	st->bytes_written += s1.bytes_written_total - s0->bytes_written_total;
	st->demand_faults = s1.demand_faults_total - s0->demand_faults_total;
	st->prefetch_hit = s1.prefetch_hit_total - s0->prefetch_hit_total;
	st->prefetch_late = s1.prefetch_late_total - s0->prefetch_late_total;
	st->prefetch_wasted =
	    s1.prefetch_wasted_total - s0->prefetch_wasted_total;
}

static struct kvp_store *pg_store(struct kvp_kvcache *c)
{
	return ((struct pg_state *)c->bs)->store;
}

static const char *pg_where(struct kvp_kvcache *c, uint64_t pb)
{
	struct kvp_block_info bi;

	if (kvp_region_block_info(c->region, pb, &bi))
		return "file";
	return kvp_block_state_name(bi.state);
}

const struct kvc_backend_ops kvc_backend_pager = {
	.name = "kvpager",
	.open = pg_open,
	.close = pg_close,
	.write = pg_write,
	.read = pg_read,
	.read_shared = pg_read_shared,
	.resident = pg_resident,
	.in_store = pg_in_store,
	.prefetch = pg_prefetch,
	.async_prefetch = true,
	.pin = pg_pin,
	.unpin = pg_unpin,
	.advise_cold = pg_advise_cold,
	.discard = pg_discard,
	.step_begin = pg_step_begin,
	.step_end = pg_step_end,
	.write_wait = pg_write_wait,
	.store = pg_store,
	.where = pg_where,
};
