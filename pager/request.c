/*
 * request.c - handing work to the service threads from other threads.
 *
 * Each service thread has a request list (under p->lock) and an eventfd
 * that wakes its poll.  Prefetches go round robin; a store's last region
 * asks every thread to drop its queue on the store and waits for all of
 * them.  The service loop (service.c) takes the requests and runs them.
 */
#include <stdlib.h>
#include <unistd.h>

#include "pager/pager_i.h"

void kvp_service_poke(struct kvp_service *s)
{
	uint64_t one = 1;
	ssize_t n = write(s->wake_fd, &one, sizeof(one));

	(void)n; /* EAGAIN: the counter is saturated, a wake-up is pending */
}

void kvp_service_request(struct kvp_pager *p, struct kvp_req *req)
{
	struct kvp_service *s = &p->svc[p->rr++ % p->nsvc];

	req->next = s->reqs;
	s->reqs = req;
	kvp_service_poke(s);
}

void kvp_service_forget_store(struct kvp_pager *p, struct kvp_store *store)
{
	unsigned want = p->nsvc;

	p->forget_acks = 0;
	for (unsigned i = 0; i < p->nsvc; i++) {
		struct kvp_req *req = calloc(1, sizeof(*req));

		if (!req) {
			want--; /* that thread keeps its queue: a leak */
			continue;
		}
		req->kind = REQ_FORGET_STORE;
		req->store = store;
		req->next = p->svc[i].reqs;
		p->svc[i].reqs = req;
		kvp_service_poke(&p->svc[i]);
	}
	while (p->forget_acks < want)
		pthread_cond_wait(&p->idle, &p->lock);
}
