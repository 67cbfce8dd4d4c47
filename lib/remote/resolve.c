/*
 * resolve.c - a host name's addresses, within a connection's deadline.
 *
 * getaddrinfo takes no timeout: with a DNS server that does not answer it
 * waits out the resolver's tries (5 s each, twice, per server by default),
 * far past a URL's connect_timeout_ms.  So a name is looked up on a thread
 * of its own, which the caller waits for until its deadline and then
 * leaves running: the lookup stays its node's, and the node's next
 * connection takes its answer (a resolver slower than the deadline still
 * gets there) rather than starting another.  The lookup frees itself once
 * both the thread and the node are done with it.  A numeric address needs
 * no resolver and takes no thread (a cluster's nodes are named so).
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/remote/remote_i.h"

static const struct addrinfo stream_hints = { .ai_family = AF_UNSPEC,
					      .ai_socktype = SOCK_STREAM };

struct lookup {
	pthread_mutex_t lock;
	pthread_cond_t done_cond; /* CLOCK_MONOTONIC */
	int refs;		  /* the thread's and the node's */
	bool done;		  /* the thread has the answer: */
	int rv;			  /* getaddrinfo's return */
	int errnum;		  /* ... and errno, for EAI_SYSTEM */
	struct addrinfo *addrs;	  /* with rv 0, until taken */
	char port[8];
	char host[];
};

static void lookup_put(struct lookup *lk)
{
	bool last;

	pthread_mutex_lock(&lk->lock);
	last = !--lk->refs;
	pthread_mutex_unlock(&lk->lock);
	if (!last)
		return;
	if (lk->addrs)
		freeaddrinfo(lk->addrs);
	pthread_cond_destroy(&lk->done_cond);
	pthread_mutex_destroy(&lk->lock);
	free(lk);
}

static void *lookup_thread(void *arg)
{
	struct lookup *lk = arg;
	struct addrinfo *addrs = NULL;
	int rv = getaddrinfo(lk->host, lk->port, &stream_hints, &addrs);

	pthread_mutex_lock(&lk->lock);
	lk->rv = rv;
	lk->errnum = errno;
	lk->addrs = rv ? NULL : addrs;
	lk->done = true;
	pthread_cond_broadcast(&lk->done_cond);
	pthread_mutex_unlock(&lk->lock);
	lookup_put(lk);
	return NULL;
}

/* The remedy for getaddrinfo's failure @rv, said after its message. */
static const char *lookup_remedy(int rv)
{
	switch (rv) {
	case EAI_NONAME:
	case EAI_NODATA:
	case EAI_ADDRFAMILY:
		return " (check the URL's host)";
	case EAI_AGAIN: /* no server reachable, or none answered in time */
		return " (is the DNS server answering?)";
	default:
		return "";
	}
}

static int lookup_start(const char *host, const char *port,
			struct lookup **out)
{
	size_t len = strlen(host) + 1;
	struct lookup *lk = calloc(1, sizeof(*lk) + len);
	pthread_condattr_t ca;
	pthread_attr_t ta;
	pthread_t t;
	int err;

	if (!lk)
		return -ENOMEM;
	memcpy(lk->host, host, len);
	snprintf(lk->port, sizeof(lk->port), "%s", port);
	lk->refs = 2;
	pthread_mutex_init(&lk->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&lk->done_cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_attr_init(&ta);
	pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&t, &ta, lookup_thread, lk);
	pthread_attr_destroy(&ta);
	if (err) {
		lk->refs = 1;
		lookup_put(lk);
		return -err;
	}
	*out = lk;
	return 0;
}

int resolve_host(struct lookup **pending, const char *host, int port,
		 uint64_t deadline_ns, struct addrinfo **addrs, char *why,
		 size_t len)
{
	struct timespec until = { .tv_sec = (time_t)(deadline_ns / 1000000000u),
				  .tv_nsec = (long)(deadline_ns % 1000000000u) };
	struct addrinfo numeric = stream_hints;
	struct lookup *lk;
	char port_s[8];
	int err = 0;

	snprintf(port_s, sizeof(port_s), "%d", port);
	numeric.ai_flags = AI_NUMERICHOST; /* asks no resolver: at once */
	if (!*pending) {
		if (!getaddrinfo(host, port_s, &numeric, addrs))
			return 0;
		err = lookup_start(host, port_s, pending);
		if (err) {
			snprintf(why, len, "cannot start a lookup: %s",
				 strerror(-err));
			return err;
		}
	}
	lk = *pending;
	pthread_mutex_lock(&lk->lock);
	while (!lk->done && !err)
		err = pthread_cond_timedwait(&lk->done_cond, &lk->lock, &until);
	if (!lk->done) {
		pthread_mutex_unlock(&lk->lock);
		snprintf(why, len, "the resolver did not answer in time");
		return -ETIMEDOUT;
	}
	*addrs = lk->addrs;
	lk->addrs = NULL;
	err = lk->rv;
	if (err)
		snprintf(why, len, "%s%s",
			 err == EAI_SYSTEM ? strerror(lk->errnum)
					   : gai_strerror(err),
			 lookup_remedy(err));
	pthread_mutex_unlock(&lk->lock);
	resolve_leave(pending);
	return err ? -EHOSTUNREACH : 0;
}

void resolve_leave(struct lookup **pending)
{
	if (*pending)
		lookup_put(*pending);
	*pending = NULL;
}
