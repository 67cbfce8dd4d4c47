/*
 * region.c - regions: reserved, registered virtual memory served by the
 * pager, and the calls the program makes on them.
 *
 * A region is one private anonymous mapping, aligned to its block size (to
 * 2 MiB for blocks of 2 MiB and more, and then MADV_HUGEPAGE), marked
 * MADV_DONTFORK (a child process does not inherit it: an access there is
 * SIGSEGV, never a hang on a handler that is not in the child) and
 * registered with the pager's userfaultfd for missing faults and, where
 * the kernel has it, write protection (dirty tracking).  Each region is
 * one VMA, so the limit on regions is vm.max_map_count (65530 by default,
 * shared with the rest of the process) and address space; the pager keeps
 * no per-region file descriptor or thread.
 *
 * Per-block metadata is an array mapped MAP_NORESERVE: untouched entries
 * (blocks never accessed) cost no memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "pager/pager_i.h"

#define MAX_BLOCK_BYTES ((size_t)4096 << (KVP_SIZE_CLASSES - 1))

/*
 * auto install.  Below a THP, UFFDIO_COPY: from 4 KiB to 1 MiB the two
 * are within 20-30% of each other (`kvpbench install`), and a copy
 * installs write-protected in one step, with no window between mapping
 * and protecting.  A block of a THP and more moves as one PMD, but then
 * pays for that window: its slot digested before the move, a protection
 * (a TLB flush) and a read-back after it (load.c), two to three passes
 * over the block on the service thread.  A copy pays one pass, 4 KiB
 * pages, and the program's first touch of each page, which is free with
 * nested paging and microseconds where a hypervisor shadows page tables.
 * So it moves where a page's first touch costs more than copying the
 * page, and copies where it costs less.  `kvpbench stream` (2 MiB, 16
 * deep): copy 0.93x raw against move's 0.60x on a guest whose first
 * touch costs 0.01 us a page; 0.28x against 0.87x where it cost 7-9 us.
 */
#define AUTO_MOVE_MIN_BYTES KVP_HUGE_SIZE

bool kvp_install_auto_moves(size_t block_bytes, double first_touch_us,
			    double copy_us)
{
	return block_bytes >= AUTO_MOVE_MIN_BYTES && first_touch_us >= copy_us;
}

static bool valid_block_bytes(size_t b)
{
	return b >= KVP_PAGE_BYTES && b <= MAX_BLOCK_BYTES && !(b & (b - 1));
}

int kvp_region_create(struct kvp_pager *p, const struct kvp_region_opts *o,
		      struct kvp_region **out)
{
	struct kvp_store *st = o ? o->store : NULL;
	struct kvp_region *r;
	size_t align;
	void *addr, *meta;
	uint64_t mode;
	uint32_t oa, ma;
	int err;

	if (!p || !o || !out || !st)
		return -EINVAL;
	/* An alignment of 0 asks for none (a store's struct is public). */
	oa = st->offset_align ? st->offset_align : 1;
	ma = st->mem_align ? st->mem_align : 1;
	if (!valid_block_bytes(o->block_bytes) || !o->size ||
	    o->size % o->block_bytes || (o->flags & ~KVP_REGION_FROM_STORE) ||
	    o->store_offset % oa || o->block_bytes % oa ||
	    o->store_offset > st->size ||
	    o->size > st->size - o->store_offset)
		return -EINVAL;
	if (o->name && (strlen(o->name) >= sizeof(r->name) || !o->name[0] ||
			strchr(o->name, '/')))
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->p = p;
	r->size = o->size;
	r->block_bytes = o->block_bytes;
	r->block_shift = (unsigned)__builtin_ctzll(o->block_bytes);
	r->nblocks = o->size >> r->block_shift;
	r->store = st;
	r->store_offset = o->store_offset;
	r->flags = o->flags;
	switch (p->cfg.install_mode) {
	case KVP_INSTALL_MOVE:
	case KVP_INSTALL_COPY:
		r->install = (enum kvp_install_mode)p->cfg.install_mode;
		break;
	default:
		r->install = kvp_install_auto_moves(o->block_bytes,
						    p->touch.first_us,
						    p->touch.copy_us)
				     ? KVP_INSTALL_MOVE
				     : KVP_INSTALL_COPY;
	}

	/* A block resident in part is written back by the windows written
	 * (block / 64: one mask a block), where write protection sees the
	 * writes and the store takes writes that small (every store here
	 * takes any range at its alignment). */
	{
		size_t w = o->block_bytes / 64;

		if (w < KVP_PAGE_BYTES)
			w = KVP_PAGE_BYTES;
		if (p->have_wp && w < o->block_bytes && w % oa == 0 &&
		    w % ma == 0)
			r->win_bytes = (uint32_t)w;
	}
	r->blocks_map_len =
	    (r->nblocks * sizeof(struct kvp_block) + 4095) & ~(size_t)4095;
	meta = mmap(NULL, r->blocks_map_len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (meta == MAP_FAILED) {
		free(r);
		return -ENOMEM;
	}
	r->blocks = meta;
	if (o->flags & KVP_REGION_FROM_STORE)
		for (uint64_t i = 0; i < r->nblocks; i++)
			kvp_blk_init(&r->blocks[i], true);

	/* Blocks of 64 KiB and more in a region of 2 MiB or more: align to
	 * 2 MiB as well, so that a run of blocks can sit in a THP. */
	align = o->block_bytes;
	if (align < KVP_HUGE_SIZE && o->size >= KVP_HUGE_SIZE &&
	    o->block_bytes >= (64u << 10))
		align = KVP_HUGE_SIZE;
	err = kvp_mem_reserve(o->size, align, o->block_bytes >= KVP_HUGE_SIZE,
			      &addr);
	if (err)
		goto out_meta;
	r->addr = addr;
	(void)kvp_mem_advise(addr, o->size, MADV_DONTFORK);
	mode = UFFDIO_REGISTER_MODE_MISSING;
	if (p->have_wp)
		mode |= UFFDIO_REGISTER_MODE_WP;
	err = kvp_uffd_register(&p->uffd, addr, o->size, mode, NULL);
	if (err)
		goto out_unmap;

	pthread_mutex_lock(&p->rlock);
	pthread_mutex_lock(&p->lock);
	r->id = p->next_region_id++;
	if (o->name)
		snprintf(r->name, sizeof(r->name), "%s", o->name);
	else
		snprintf(r->name, sizeof(r->name), "region%u", r->id);
	for (struct kvp_region *x = p->regions; x; x = x->next)
		if (!strcmp(x->name, r->name)) {
			err = -EEXIST;
			break;
		}
	if (!err)
		err = kvp_store_claim(st, r->store_offset, r->size, r);
	if (!err) {
		struct kvp_region **t = &p->regions;

		while (*t)
			t = &(*t)->next;
		*t = r;
		p->nregions++;
		err = kvp_rtab_rebuild(p);
		if (err) {
			*t = NULL;
			p->nregions--;
			kvp_store_unclaim(r);
		}
	}
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->rlock);
	if (err)
		goto out_unregister;
	*out = r;
	return 0;

out_unregister:
	kvp_uffd_unregister(&p->uffd, addr, o->size);
out_unmap:
	kvp_mem_release(addr, o->size);
	if (err == -ENOMEM || err == -EINVAL)
		err = err == -EINVAL ? -EINVAL : -ENOMEM;
out_meta:
	munmap(meta, r->blocks_map_len);
	free(r);
	return err;
}

/*
 * Store one block's bytes from the region itself.  A block the program
 * unmapped in part (BLK_SPLIT, or an unmap whose event is not handled yet)
 * is copied out around the hole first (the hole reads as zeros).
 */
static int store_from_region(struct kvp_region *r, uint64_t blk)
{
	char *addr = kvp_blk_addr(r, blk);
	size_t len = r->block_bytes;
	char *bounce;
	int err;

	if (!(r->blocks[blk].flags & BLK_SPLIT) &&
	    kvp_mem_range_mapped(addr, len))
		return kvp_store_pwrite(r->store, addr, len,
					kvp_blk_store_off(r, blk));
	bounce = aligned_alloc(KVP_PAGE_BYTES, len);
	if (!bounce)
		return -ENOMEM;
	kvp_copy_own(bounce, addr, len);
	err =
	    kvp_store_pwrite(r->store, bounce, len, kvp_blk_store_off(r, blk));
	free(bounce);
	return err;
}

/* store_from_region, counted in the region's statistics. */
static int store_block(struct kvp_region *r, uint64_t blk)
{
	int err = store_from_region(r, blk);

	if (err)
		KVP_STAT_ADD(r, write_errors_total, 1);
	else
		KVP_STAT_ADD(r, bytes_written_total, r->block_bytes);
	return err;
}

/* write_block for a block resident in part: its dirty windows @wins
 * (taken by kvp_blk_write_windows_begin), each protected before it is
 * written.  A fault may load more of the block meanwhile (a fill): that
 * leaves these windows as they are. */
static int write_windows(struct kvp_region *r, uint64_t blk, uint64_t wins)
{
	struct kvp_pager *p = r->p;
	struct kvp_block *b = &r->blocks[blk];
	uint64_t left = wins;
	unsigned first, n;
	int err;

	while ((n = kvp_win_next_run(&left, &first)) != 0)
		(void)kvp_uffd_protect(p,
				       kvp_blk_addr(r, blk) +
					   (size_t)first * r->win_bytes,
				       (size_t)n * r->win_bytes, true);
	err = kvp_store_windows(r, blk, wins, r->win_bytes, NULL);
	pthread_mutex_lock(&p->lock);
	kvp_blk_write_windows_done(r, b, wins, err);
	kvp_writeback_result(r, err);
	pthread_mutex_unlock(&p->lock);
	return err;
}

/* Write back one held dirty block from the region itself, made clean by
 * kvp_blk_write_begin under the lock that held it (a fill may begin once
 * that lock is let go: the pages it lacks fault in as they are read). */
static int write_block(struct kvp_region *r, uint64_t blk)
{
	struct kvp_pager *p = r->p;
	struct kvp_block *b = &r->blocks[blk];
	int err;

	/* Protect first: a later write faults and marks it dirty again.  A
	 * split block cannot be protected over its hole: it stays dirty. */
	if (p->have_wp && !(b->flags & BLK_SPLIT))
		(void)kvp_uffd_protect(p, kvp_blk_addr(r, blk), r->block_bytes,
				       true);
	err = store_block(r, blk);
	pthread_mutex_lock(&p->lock);
	kvp_blk_write_done(r, b, err);
	kvp_writeback_result(r, err);
	pthread_mutex_unlock(&p->lock);
	return err;
}

/*
 * Must a flush wait for @b before it looks at it?  A write fault marked it
 * dirty and has yet to lift its protection (kvp_blk_late_begin: the lift
 * would undo the flush's, and the writes after it go unseen); it is
 * leaving by write-back (evict.c: moved out, to be written: its bytes are
 * in the store once that is done, or it comes back resident and dirty);
 * it is held: another flush is writing it, or the zapper is (clean_one:
 * the program may have dropped and written it since, so our write must
 * come after its), or a peek copies it; or it is resident in part with
 * dirty windows and a fill is loading more of it (written once it is in).
 */
static bool flush_must_wait(const struct kvp_block *b)
{
	return b->late || b->holds ||
	       (b->state == KVP_BLOCK_EVICTING && b->op->kind != OP_ZAP) ||
	       (b->state == KVP_BLOCK_LOADING &&
		(b->flags & (BLK_PARTIAL | BLK_DIRTY)) ==
		    (BLK_PARTIAL | BLK_DIRTY));
}

int kvp_region_flush(struct kvp_region *r)
{
	struct kvp_pager *p;
	int first = 0;

	if (!r)
		return -EINVAL;
	p = r->p;
	for (uint64_t blk = 0; blk < r->nblocks; blk++) {
		struct kvp_block *b = &r->blocks[blk];
		bool want;

		uint64_t wins = 0;

		pthread_mutex_lock(&p->lock);
		/* Until it is done, so that a flush that returns 0 leaves
		 * every byte in the store.  Looked at again each few ms: an
		 * eviction undone broadcasts nothing. */
		while (flush_must_wait(b)) {
			struct timespec until = kvp_deadline_ms(5);

			(void)pthread_cond_timedwait(&p->idle, &p->lock,
						     &until);
		}
		/* A block whose read failed keeps what the program wrote
		 * to the pages it had, never stored (load.c). */
		if (b->state == KVP_BLOCK_POISONED &&
		    (b->flags & BLK_DIRTY) && !first)
			first = -EIO;
		want = b->state == KVP_BLOCK_RESIDENT &&
		       (b->flags & BLK_DIRTY) && !(b->flags & BLK_DROP);
		if (want) {
			b->holds++; /* stays resident while written */
			b->flags |= BLK_FLUSHING;
			/* Resident in part: its dirty windows, taken now (a
			 * fill may begin once the lock is let go). */
			if (kvp_blk_dirty_windows(b))
				wins = kvp_blk_write_windows_begin(b);
			else
				kvp_blk_write_begin(b);
		}
		pthread_mutex_unlock(&p->lock);
		if (!want)
			continue;
		int err = wins ? write_windows(r, blk, wins)
			       : write_block(r, blk);

		pthread_mutex_lock(&p->lock);
		b->holds--;
		b->flags &= ~BLK_FLUSHING;
		pthread_cond_broadcast(&p->idle);
		pthread_mutex_unlock(&p->lock);
		if (err && !first)
			first = err;
	}
	return first;
}

int kvp_region_destroy(struct kvp_region *r)
{
	struct kvp_pager *p;
	int first = 0;

	if (!r)
		return -EINVAL;
	p = r->p;
	pthread_mutex_lock(&p->lock);
	r->dying = true;
	for (struct kvp_op *op = p->staged, *n; op; op = n) {
		n = op->next;
		if (op->r == r)
			kvp_stage_drop(p, op);
	}
	while (r->inflight || r->pf_reqs)
		pthread_cond_wait(&p->idle, &p->lock);
	pthread_mutex_unlock(&p->lock);

	/* Nothing of the region is in flight now.  Unregister first: a page
	 * the program dropped then reads as zeros instead of faulting to a
	 * service thread that no longer serves this region.  Then write
	 * back what is dirty straight from the region. */
	kvp_uffd_unregister(&p->uffd, r->addr, r->size);
	for (uint64_t blk = 0; blk < r->nblocks; blk++) {
		struct kvp_block *b = &r->blocks[blk];

		if (b->state == KVP_BLOCK_POISONED &&
		    (b->flags & BLK_DIRTY) && !first)
			first = -EIO;
		if (b->state != KVP_BLOCK_RESIDENT || !(b->flags & BLK_DIRTY) ||
		    (b->flags & BLK_DROP))
			continue;
		int err = kvp_blk_dirty_windows(b)
			      ? kvp_store_windows(r, blk, b->dirty_win,
						  r->win_bytes, NULL)
			      : store_block(r, blk);

		if (err && !first)
			first = err;
	}
	/* Unmap only what the program has not unmapped itself: the address
	 * of a block it unmapped may hold someone else's mapping by now. */
	for (uint64_t blk = 0; blk < r->nblocks;) {
		uint64_t end = blk;

		while (end < r->nblocks && !(r->blocks[end].flags & BLK_GONE))
			end++;
		if (end > blk)
			kvp_mem_release(kvp_blk_addr(r, blk),
					(end - blk) << r->block_shift);
		blk = end + 1;
	}

	pthread_mutex_lock(&p->rlock);
	pthread_mutex_lock(&p->lock);
	for (uint64_t blk = 0; blk < r->nblocks; blk++) {
		struct kvp_block *b = &r->blocks[blk];

		if (b->state == KVP_BLOCK_RESIDENT) {
			kvp_clock_del(p, b);
			kvp_frame_unuse(p, kvp_blk_charge(r, b));
		}
		if (b->pins)
			p->pinned_bytes -= r->block_bytes;
	}
	for (struct kvp_region **t = &p->regions; *t; t = &(*t)->next)
		if (*t == r) {
			*t = r->next;
			break;
		}
	p->nregions--;
	if (kvp_rtab_rebuild(p)) {
		/* Cannot shrink the table: drop r from it in place. */
		unsigned k = 0;

		for (unsigned i = 0; i <= p->nregions; i++)
			if (p->rtab[i] != r)
				p->rtab[k++] = p->rtab[i];
	}
	kvp_astats_fold(&p->gone, &r->st);
	bool shared = false;

	for (struct kvp_region *x = p->regions; x; x = x->next)
		shared |= x->store == r->store;
	if (!shared)
		kvp_service_forget_store(p, r->store);
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_unlock(&p->rlock);
	/* Its last write-back is done: the bytes may have a new region. */
	kvp_store_unclaim(r);
	munmap(r->blocks, r->blocks_map_len);
	free(r->zap_waits);
	free(r);
	return first;
}

void *kvp_region_addr(const struct kvp_region *r)
{
	return r->addr;
}

size_t kvp_region_size(const struct kvp_region *r)
{
	return r->size;
}

size_t kvp_region_block_bytes(const struct kvp_region *r)
{
	return r->block_bytes;
}

const char *kvp_region_name(const struct kvp_region *r)
{
	return r->name;
}

struct kvp_store *kvp_region_store(const struct kvp_region *r)
{
	return r->store;
}

const char *kvp_region_install_mode(const struct kvp_region *r)
{
	return r->install == KVP_INSTALL_MOVE ? "move" : "copy";
}

void kvp_region_stats(const struct kvp_region *r, struct kvp_stats *out)
{
	kvp_stats_snapshot(&r->st, out);
}

static int check_range(const struct kvp_region *r, uint64_t first, uint64_t n)
{
	if (!r || n == 0 || first >= r->nblocks || n > r->nblocks - first)
		return -EINVAL;
	return 0;
}

int kvp_region_pin(struct kvp_region *r, uint64_t first, uint64_t n)
{
	struct kvp_pager *p;
	uint64_t add = 0;
	int err = check_range(r, first, n);

	if (err)
		return err;
	p = r->p;
	pthread_mutex_lock(&p->lock);
	for (uint64_t i = first; i < first + n; i++)
		if (r->blocks[i].pins == 0)
			add += r->block_bytes;
	if (p->pinned_bytes + add > kvp_budget(p)) {
		pthread_mutex_unlock(&p->lock);
		return -ENOSPC;
	}
	for (uint64_t i = first; i < first + n; i++) {
		struct kvp_block *b = &r->blocks[i];

		if (b->pins == UINT16_MAX) {
			/* Undo: no partial pin. */
			for (uint64_t k = first; k < i; k++)
				r->blocks[k].pins--;
			pthread_mutex_unlock(&p->lock);
			return -EOVERFLOW;
		}
		b->pins++;
		if (b->state == KVP_BLOCK_RESIDENT) {
			kvp_blk_used(r, b);
			kvp_blk_touch(p, b);
		}
	}
	p->pinned_bytes += add;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int kvp_region_unpin(struct kvp_region *r, uint64_t first, uint64_t n)
{
	struct kvp_pager *p;
	int err = check_range(r, first, n);

	if (err)
		return err;
	p = r->p;
	pthread_mutex_lock(&p->lock);
	for (uint64_t i = first; i < first + n; i++)
		if (r->blocks[i].pins == 0) {
			pthread_mutex_unlock(&p->lock);
			return -EINVAL;
		}
	for (uint64_t i = first; i < first + n; i++)
		if (--r->blocks[i].pins == 0)
			p->pinned_bytes -= r->block_bytes;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int kvp_region_advise(struct kvp_region *r, uint64_t first, uint64_t n,
		      enum kvp_advice advice)
{
	struct kvp_pager *p;
	int err = check_range(r, first, n);

	if (err)
		return err;
	if (advice != KVP_ADVICE_COLD && advice != KVP_ADVICE_DISCARD)
		return -EINVAL;
	p = r->p;
	pthread_mutex_lock(&p->lock);
	for (uint64_t i = first; i < first + n; i++) {
		struct kvp_block *b = &r->blocks[i];

		if (advice == KVP_ADVICE_COLD) {
			kvp_blk_used(r, b);
			kvp_blk_cold(p, b);
			continue;
		}
		switch (b->state) {
		case KVP_BLOCK_RESIDENT:
			/* (a fault's late change, such as an unprotect,
			 * would land on what comes next) */
			if (b->pins || b->holds || b->late) {
				err = -EBUSY;
				break;
			}
			kvp_discard_resident(r, i);
			break;
		case KVP_BLOCK_LOADING:
		case KVP_BLOCK_EVICTING:
			if (b->pins)
				err = -EBUSY;
			else
				kvp_blk_drop_pending(b);
			break;
		case KVP_BLOCK_POISONED:
			/* Poison markers go with the pages: zap them, those
			 * the program locked too.  The REMOVE event this
			 * raises forgets the block, but comes in pieces where
			 * the program split its mapping (an mlock): forgotten
			 * here as well. */
			pthread_mutex_unlock(&p->lock);
			(void)kvp_mem_drop(kvp_blk_addr(r, i), r->block_bytes);
			pthread_mutex_lock(&p->lock);
			if (b->state == KVP_BLOCK_POISONED)
				kvp_blk_forget(r, b);
			break;
		case KVP_BLOCK_ABSENT:
			kvp_blk_contents_gone(b);
			break;
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (advice == KVP_ADVICE_DISCARD && r->store->ops->discard && !err)
		(void)r->store->ops->discard(
		    r->store, kvp_blk_store_off(r, first), n << r->block_shift);
	return err;
}

const char *kvp_block_state_name(enum kvp_block_state s)
{
	static const char *const names[] = {
		[KVP_BLOCK_ABSENT] = "absent",
		[KVP_BLOCK_LOADING] = "loading",
		[KVP_BLOCK_RESIDENT] = "resident",
		[KVP_BLOCK_EVICTING] = "evicting",
		[KVP_BLOCK_POISONED] = "poisoned",
	};

	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s]
							      : "unknown";
}

int kvp_region_block_info(struct kvp_region *r, uint64_t block,
			  struct kvp_block_info *out)
{
	struct kvp_block *b;

	if (!r || !out || block >= r->nblocks)
		return -EINVAL;
	pthread_mutex_lock(&r->p->lock);
	b = &r->blocks[block];
	out->state = (enum kvp_block_state)b->state;
	out->dirty = b->flags & BLK_DIRTY;
	out->in_store = b->flags & BLK_IN_STORE;
	out->staged = b->state == KVP_BLOCK_LOADING && b->op->staged;
	out->pins = b->pins;
	out->last_use = b->last_use;
	pthread_mutex_unlock(&r->p->lock);
	return 0;
}

int kvp_region_peek(struct kvp_region *r, uint64_t block, void *buf)
{
	struct kvp_pager *p;
	struct kvp_block *b;
	bool in_store;
	int err = 0;

	if (!r || !buf || block >= r->nblocks)
		return -EINVAL;
	p = r->p;
	b = &r->blocks[block];
	pthread_mutex_lock(&p->lock);
	for (;;) {
		if (b->state == KVP_BLOCK_RESIDENT) {
			/* Pinned, so it stays; copied outside the lock, since
			 * a page the program has just dropped (its REMOVE
			 * event not handled yet) faults, and the service
			 * thread serving that fault needs the lock. */
			b->holds++;
			pthread_mutex_unlock(&p->lock);
			memcpy(buf, kvp_blk_addr(r, block), r->block_bytes);
			pthread_mutex_lock(&p->lock);
			b->holds--;
			pthread_mutex_unlock(&p->lock);
			return 0;
		}
		if (b->state == KVP_BLOCK_POISONED) {
			pthread_mutex_unlock(&p->lock);
			return -EIO;
		}
		if (b->state == KVP_BLOCK_LOADING) {
			/* A fill of a block the program wrote: the region
			 * holds its writes, the store not yet.  Wait for the
			 * fill to end, then copy from the region. */
			if ((b->flags & (BLK_PARTIAL | BLK_DIRTY)) !=
				(BLK_PARTIAL | BLK_DIRTY) ||
			    (b->flags & BLK_DROP))
				break;
		} else if (b->state != KVP_BLOCK_EVICTING) {
			break;
		} else if (b->op->io.buf && !b->op->part) {
			/* Detached and being written back: the frame holds
			 * the newest bytes (but for a block resident in part,
			 * whose store holds the rest: wait for it). */
			memcpy(buf, b->op->slot, r->block_bytes);
			pthread_mutex_unlock(&p->lock);
			return 0;
		} else if (!(b->flags & BLK_DIRTY) && p->have_wp) {
			break; /* clean: the store has the same bytes */
		}
		/* A dirty block being detached or filled: wait a moment. */
		pthread_mutex_unlock(&p->lock);
		struct timespec ts = { 0, 50000 };

		nanosleep(&ts, NULL);
		pthread_mutex_lock(&p->lock);
	}
	/* ABSENT or LOADING: the store holds the bytes, or nothing does. */
	in_store = (b->flags & BLK_IN_STORE) && !(b->flags & BLK_DROP);
	pthread_mutex_unlock(&p->lock);
	if (in_store)
		err = kvp_store_pread(r->store, buf, r->block_bytes,
				      kvp_blk_store_off(r, block));
	else
		memset(buf, 0, r->block_bytes);
	return err;
}

int kvp_pager_foreach_region(struct kvp_pager *p,
			     int (*fn)(struct kvp_region *r, void *arg),
			     void *arg)
{
	int ret = 0;

	pthread_mutex_lock(&p->rlock);
	for (struct kvp_region *r = p->regions; r && !ret; r = r->next)
		ret = fn(r, arg);
	pthread_mutex_unlock(&p->rlock);
	return ret;
}
