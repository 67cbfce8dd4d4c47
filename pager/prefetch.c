/*
 * prefetch.c - asynchronous prefault of named blocks.
 *
 * kvp_prefetch_submit hands the list to a service thread (one wake-up),
 * which starts a load for every absent block in one pass, so the reads go
 * to the store in batches; each block is installed as its read completes.
 * A block already loading is joined, one already resident is only marked
 * referenced.  A prefetched block counts as a hit when the program is seen
 * to use it (a pin, a write, a COLD hint, a fault on one of its pages),
 * late when the program faulted on it before it was installed, and wasted
 * when it is evicted or dropped with no sign of use.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pager/pager_i.h"

static bool pf_done(const struct kvp_prefetch *pf)
{
	return pf->next == pf->n && pf->pending == 0;
}

static void pf_free(struct kvp_prefetch *pf)
{
	pthread_cond_destroy(&pf->cond);
	free(pf->blocks);
	free(pf);
}

/* Under p->lock: wake waiters, free a released handle once finished. */
static void pf_maybe_finish(struct kvp_prefetch *pf)
{
	if (!pf_done(pf))
		return;
	pthread_cond_broadcast(&pf->cond);
	if (pf->released)
		pf_free(pf);
}

void kvp_prefetch_all_started(struct kvp_prefetch *pf)
{
	pf->next = pf->n;
	pf_maybe_finish(pf);
}

void kvp_prefetch_block_done(struct kvp_pager *p, struct kvp_prefetch *pf,
			     bool failed)
{
	pf->pending--;
	if (failed)
		pf->failed = true;
	pf_maybe_finish(pf);
}

int kvp_prefetch_submit(struct kvp_region *r, const uint64_t *blocks, size_t n,
			struct kvp_prefetch **out)
{
	struct kvp_prefetch *pf;
	struct kvp_req *req;
	pthread_condattr_t ca;
	struct kvp_pager *p;

	if (out)
		*out = NULL;
	if (!r || (!blocks && n))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (blocks[i] >= r->nblocks)
			return -EINVAL;
	p = r->p;
	pf = calloc(1, sizeof(*pf));
	req = calloc(1, sizeof(*req));
	if (!pf || !req ||
	    !(pf->blocks = malloc((n ? n : 1) * sizeof(*blocks)))) {
		free(req);
		if (pf)
			free(pf->blocks);
		free(pf);
		return -ENOMEM;
	}
	memcpy(pf->blocks, blocks, n * sizeof(*blocks));
	pf->n = n;
	pf->r = r;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pf->cond, &ca);
	pthread_condattr_destroy(&ca);
	req->kind = REQ_PREFETCH;
	req->pf = pf;

	pthread_mutex_lock(&p->lock);
	if (r->dying) {
		pthread_mutex_unlock(&p->lock);
		pf_free(pf);
		free(req);
		return -EINVAL;
	}
	pf->released = out == NULL;
	r->pf_reqs++;
	kvp_service_request(p, req);
	pthread_mutex_unlock(&p->lock);
	if (out)
		*out = pf;
	return 0;
}

int kvp_prefetch_wait(struct kvp_prefetch *pf, int timeout_ms)
{
	struct kvp_pager *p;
	struct timespec until;
	int err = 0;

	if (!pf)
		return -EINVAL;
	p = pf->r->p;
	until = kvp_deadline_ms(timeout_ms >= 0 ? timeout_ms : 0);
	pthread_mutex_lock(&p->lock);
	while (!pf_done(pf) && !err) {
		if (timeout_ms < 0)
			pthread_cond_wait(&pf->cond, &p->lock);
		else if (pthread_cond_timedwait(&pf->cond, &p->lock, &until))
			err = pf_done(pf) ? 0 : -ETIMEDOUT;
	}
	if (!err && pf->failed)
		err = -EIO;
	pthread_mutex_unlock(&p->lock);
	return err;
}

bool kvp_prefetch_done(const struct kvp_prefetch *pf)
{
	struct kvp_pager *p = pf->r->p;
	bool done;

	pthread_mutex_lock(&p->lock);
	done = pf_done(pf);
	pthread_mutex_unlock(&p->lock);
	return done;
}

int kvp_prefetch_cancel(struct kvp_prefetch *pf)
{
	struct kvp_pager *p;

	if (!pf)
		return -EINVAL;
	p = pf->r->p;
	pthread_mutex_lock(&p->lock);
	pf->cancelled = true;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

void kvp_prefetch_release(struct kvp_prefetch *pf)
{
	struct kvp_pager *p;

	if (!pf)
		return;
	p = pf->r->p;
	pthread_mutex_lock(&p->lock);
	pf->cancelled = true;
	if (pf_done(pf)) {
		pthread_mutex_unlock(&p->lock);
		pf_free(pf);
		return;
	}
	pf->released = true;
	pthread_mutex_unlock(&p->lock);
}
