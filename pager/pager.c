/*
 * pager.c - a pager's life: open, configure, observe, close.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "pager/pager_i.h"

/* What the engine asks of userfaultfd.  MOVE is needed to evict without
 * MADV_DONTNEED on a registered range (whose REMOVE event would block the
 * evicting thread until a service thread read it); REMOVE and UNMAP make
 * dropped ranges read back as zeros and unmapped ones be forgotten. */
#define WANTED                                                                 \
	(UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |                \
	 UFFD_FEATURE_MOVE | UFFD_FEATURE_POISON |                             \
	 UFFD_FEATURE_PAGEFAULT_FLAG_WP)
#define REQUIRED                                                               \
	(UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |                \
	 UFFD_FEATURE_MOVE)

int kvp_pager_open(const struct kvp_config *cfg, struct kvp_pager **out)
{
	struct kvp_pager *p;
	pthread_condattr_t ca;
	pthread_rwlockattr_t ra;
	int err;

	if (!cfg || !out)
		return -EINVAL;
	*out = NULL;
	err = kvp_config_check(cfg, NULL);
	if (err)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->uffd.fd = -1;
	p->frames.land.fd = -1;
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->rlock, NULL);
	/* Writers first: installs go on side by side, and a reader
	 * waiting behind a stream of them would hold up every fault. */
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(
	    &ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&p->evlock, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->idle, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&p->zap_cond, NULL);
	p->zap_reader_cpu = -1;
	p->pidfd = -1;
	p->maps_fd = -1;
	p->mem_fd = -1;

	err = kvp_uffd_open(&p->uffd, 0);
	if (err)
		goto fail;
	if (p->uffd.mode == KVP_UFFD_USER_ONLY)
		fprintf(stderr,
			"kvpager: warning: userfaultfd is user-mode-only (%s): "
			"read(2), write(2) or O_DIRECT I/O on a non-resident "
			"region page fails with EFAULT; run as root, with "
			"CAP_SYS_PTRACE, or with access to /dev/userfaultfd "
			"for full mode\n",
			p->uffd.source);
	err = kvp_uffd_api(&p->uffd, WANTED, REQUIRED);
	if (err)
		goto fail;
	p->have_wp = p->uffd.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	p->have_poison = p->uffd.features & UFFD_FEATURE_POISON;
	/* Unmeasured (no memory to try), blocks of a THP move as before. */
	if (kvp_mem_touch_cost(KVP_MEM_TOUCH_COST_PAGES, &p->touch))
		p->touch = (struct kvp_mem_touch_cost){ .first_us = 1 };
	err = kvp_frames_init(p);
	if (err)
		goto fail;
	p->zero_page = mmap(NULL, KVP_PAGE_BYTES, PROT_READ,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p->zero_page == MAP_FAILED) {
		p->zero_page = NULL;
		err = -ENOMEM;
		goto fail;
	}
	err = kvp_service_start(p);
	if (err)
		goto fail;
	err = kvp_zap_start(p);
	if (err)
		goto fail;
	*out = p;
	return 0;
fail:
	kvp_pager_close(p);
	return err;
}

void kvp_pager_thread_begin(struct kvp_pager *p, const char *name)
{
	if (p && name)
		kvp_thread_begin(p, name);
}

void kvp_pager_close(struct kvp_pager *p)
{
	if (!p)
		return;
	while (p->regions) {
		struct kvp_region *r = p->regions;

		/* Dirty data is not written back on close (see pager.h):
		 * drop it so destroy does not. */
		pthread_mutex_lock(&p->lock);
		for (uint64_t i = 0; i < r->nblocks; i++)
			if (r->blocks[i].state == KVP_BLOCK_RESIDENT)
				kvp_blk_abandon_dirty(&r->blocks[i]);
		pthread_mutex_unlock(&p->lock);
		kvp_region_destroy(r);
	}
	kvp_zap_stop(p);
	kvp_service_stop(p);
	kvp_frames_fini(p);
	if (p->zero_page)
		munmap(p->zero_page, KVP_PAGE_BYTES);
	kvp_uffd_close(&p->uffd);
	free(p->rtab);
	pthread_cond_destroy(&p->idle);
	pthread_cond_destroy(&p->zap_cond);
	pthread_mutex_destroy(&p->rlock);
	pthread_rwlock_destroy(&p->evlock);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

void kvp_pager_config(const struct kvp_pager *p, struct kvp_config *out)
{
	pthread_mutex_lock((pthread_mutex_t *)&p->lock);
	*out = p->cfg;
	pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
}

int kvp_pager_reconfigure(struct kvp_pager *p, const struct kvp_config *cfg,
			  const char **bad)
{
	int err;

	if (bad)
		*bad = NULL;
	if (!p || !cfg)
		return -EINVAL;
	err = kvp_config_check(cfg, bad);
	if (err)
		return err;
	pthread_mutex_lock(&p->lock);
#define FROZEN(name, type, min, max, def, runtime, choices, doc)               \
	if (!(runtime) && cfg->name != p->cfg.name && !err) {                  \
		err = -EINVAL;                                                 \
		if (bad)                                                       \
			*bad = #name;                                          \
	}
	KVP_PAGER_TUNABLES(FROZEN)
#undef FROZEN
	if (!err && cfg->ram_budget_bytes > p->frames.arena_len / 2) {
		err = -EINVAL; /* beyond the frame arena reserved at open */
		if (bad)
			*bad = "ram_budget_bytes";
	}
	if (!err && cfg->ram_budget_bytes < p->pinned_bytes) {
		err = -EBUSY; /* more is pinned than the new budget */
		if (bad)
			*bad = "ram_budget_bytes";
	}
	if (!err) {
		p->cfg = *cfg;
		kvp_frames_shrink(p, cfg->ram_budget_bytes);
		/* Regions keep the install mode they were created with. */
	}
	pthread_mutex_unlock(&p->lock);
	if (!err)
		for (unsigned i = 0; i < p->nsvc; i++)
			kvp_service_poke(&p->svc[i]); /* evicts to budget */
	return err;
}

void kvp_pager_stats(const struct kvp_pager *p, struct kvp_stats *out)
{
	struct kvp_pager *mp = (struct kvp_pager *)p;

	pthread_mutex_lock(&mp->rlock);
	kvp_stats_snapshot(&p->gone, out);
	for (struct kvp_region *r = p->regions; r; r = r->next) {
		struct kvp_stats s;

		kvp_stats_snapshot(&r->st, &s);
		kvp_stats_add(out, &s);
	}
	/* The store counts I/Os it had to do buffered; sum each store once. */
	out->buffered_io_total = 0;
	for (struct kvp_region *r = p->regions; r; r = r->next) {
		bool seen = false;

		for (struct kvp_region *q = p->regions; q != r; q = q->next)
			seen |= q->store == r->store;
		if (!seen)
			out->buffered_io_total += __atomic_load_n(
			    &r->store->buffered_ios, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&mp->rlock);
}

const char *kvp_pager_uffd_mode(const struct kvp_pager *p)
{
	return p->uffd.mode == KVP_UFFD_FULL ? "full" : "user-mode-only";
}
