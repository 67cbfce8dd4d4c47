/*
 * request.c - handing work to the service threads from other threads.
 *
 * Each service thread has a request list (under p->lock) and an eventfd
 * that wakes its poll.  Prefetches go round robin; a store's last region
 * asks every thread to drop its queue on the store and waits for all of
 * them.  The service loop (service.c) takes the requests and runs them.
 * The threads that run them (service.c, zap.c) start in kvp_thread_begin.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pager/pager_i.h"

/*
 * Under load (an inference process computing on every CPU) a service
 * thread that waits for a CPU leaves every faulting thread waiting with it:
 * the kernel serves its own faults' I/O from interrupts, above any thread.
 * A lower nice value, per thread (Linux's nice is per task).
 */
/*
 * A pager thread blocks every signal, from its creation: a process-directed
 * signal goes to any thread that does not block it, and a program's handler
 * run on a service thread that touches a region page faults where only the
 * service threads serve faults (all of them in the handler: a hang).
 */
int kvp_thread_create(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int err;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited by the thread */
	err = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}

void kvp_thread_begin(struct kvp_pager *p, const char *name)
{
	static bool said;
	sigset_t all;
	int base, want;

	/* Threads of others that serve loads (kvp_pager_thread_begin) too. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);

	errno = 0;
	base = getpriority(PRIO_PROCESS, 0);
	want = base - (int)p->cfg.service_priority;
	if (want < -20)
		want = -20;
	if (p->cfg.service_priority && !(base == -1 && errno) &&
	    setpriority(PRIO_PROCESS, (id_t)gettid(), want) &&
	    !__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
		fprintf(stderr,
			"kvpager: note: the pager's threads stay at nice %d "
			"(service_priority %u: setpriority: %s; it needs "
			"CAP_SYS_NICE or RLIMIT_NICE, or set "
			"KVP_SERVICE_PRIORITY=0)\n",
			base, (unsigned)p->cfg.service_priority,
			strerror(errno));
	/* Named last: a thread that has its name has its priority. */
	(void)pthread_setname_np(pthread_self(), name);
}

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
