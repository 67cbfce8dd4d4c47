/*
 * publish.c - the publish queue and the thread that drains it.
 *
 * publish_push copies a value into the queue or, when the queue holds
 * url.queue entries or url.queue_bytes, drops it (publishes_skipped_total): the caller is a
 * decode step and never waits on the network.  The thread pops up to
 * LINK_PIPELINE entries at a time and SETs them, pipelined, on the
 * publish link; a failure is counted and the entry dropped (a block not
 * published is only a later miss elsewhere).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/remote/remote_i.h"

int publish_push(struct kvp_remote *r, const char *rkey, size_t rkey_len,
		 const void *key, size_t key_len, const void *val, size_t len)
{
	struct pub_entry *e;

	/* A cheap look first: a full queue costs no copy. */
	if (__atomic_load_n(&r->st.queue_entries, __ATOMIC_RELAXED) >=
		    r->url.queue ||
	    __atomic_load_n(&r->st.queue_bytes, __ATOMIC_RELAXED) + len >
		    r->url.queue_bytes) {
		RSTAT_ADD(r, publishes_skipped_total, 1);
		return -EAGAIN;
	}
	e = malloc(sizeof(*e) + rkey_len + key_len + len);
	if (!e)
		return -ENOMEM;
	e->next = NULL;
	e->rkey_len = rkey_len;
	e->key_len = key_len;
	e->val_len = len;
	memcpy(e->rkey, rkey, rkey_len);
	e->key = e->rkey + rkey_len;
	memcpy(e->key, key, key_len);
	e->val = e->key + key_len;
	memcpy(e->val, val, len);
	pthread_mutex_lock(&r->qlock);
	if (r->qlen >= r->url.queue || r->stop ||
	    r->st.queue_bytes + len > r->url.queue_bytes) {
		pthread_mutex_unlock(&r->qlock);
		free(e);
		RSTAT_ADD(r, publishes_skipped_total, 1);
		return -EAGAIN;
	}
	if (r->qtail)
		r->qtail->next = e;
	else
		r->qhead = e;
	r->qtail = e;
	r->qlen++;
	RSTAT_ADD(r, queue_entries, 1);
	RSTAT_ADD(r, queue_bytes, len);
	pthread_cond_broadcast(&r->qcond);
	pthread_mutex_unlock(&r->qlock);
	return 0;
}

static void publish_batch(struct kvp_remote *r, struct pub_entry *list,
			  size_t n)
{
	struct rop ops[LINK_PIPELINE];
	void *encoded[LINK_PIPELINE] = { NULL };
	struct pub_entry *e = list;
	size_t i, k = 0;

	for (i = 0; i < n; i++, e = e->next) {
		memset(&ops[k], 0, sizeof(ops[k]));
		ops[k].kind = ROP_SET;
		ops[k].rkey = e->rkey;
		ops[k].rkey_len = e->rkey_len;
		ops[k].val = e->val;
		ops[k].val_len = e->val_len;
		if (r->encode &&
		    r->encode(r->encode_arg, e->key, e->key_len, e->val,
			      e->val_len, &encoded[k], &ops[k].val_len)) {
			RSTAT_ADD(r, publish_errors_total, 1);
			continue;
		}
		if (encoded[k])
			ops[k].val = encoded[k];
		k++;
	}
	n = k;
	link_run(&r->pub, ops, n, NULL, NULL);
	for (i = 0; i < n; i++) {
		redisReply *rep = ops[i].reply;

		free(encoded[i]);
		/* OOM (maxmemory, noeviction), READONLY, CLUSTERDOWN... */
		if (ops[i].status || rep->type != REDIS_REPLY_STATUS) {
			RSTAT_ADD(r, publish_errors_total, 1);
		} else {
			RSTAT_ADD(r, publishes_total, 1);
			RSTAT_ADD(r, bytes_written_total, ops[i].val_len);
		}
		if (rep)
			freeReplyObject(rep);
	}
}

static void *publisher(void *arg)
{
	struct kvp_remote *r = arg;

	pthread_mutex_lock(&r->qlock);
	for (;;) {
		struct pub_entry *list, *last;
		size_t n;

		while (!r->qhead && !r->stop)
			pthread_cond_wait(&r->qcond, &r->qlock);
		if (r->stop)
			break;
		list = last = r->qhead;
		for (n = 1; n < LINK_PIPELINE && last->next; n++)
			last = last->next;
		r->qhead = last->next;
		if (!r->qhead)
			r->qtail = NULL;
		last->next = NULL;
		r->qlen -= (unsigned)n;
		RSTAT_SUB(r, queue_entries, n);
		for (struct pub_entry *e = list; e; e = e->next)
			RSTAT_SUB(r, queue_bytes, e->val_len);
		r->busy = true;
		pthread_mutex_unlock(&r->qlock);

		publish_batch(r, list, n);
		while (list) {
			struct pub_entry *next = list->next;

			free(list);
			list = next;
		}
		pthread_mutex_lock(&r->qlock);
		r->busy = false;
		pthread_cond_broadcast(&r->qcond);
	}
	pthread_mutex_unlock(&r->qlock);
	return NULL;
}

int publish_start(struct kvp_remote *r)
{
	pthread_condattr_t ca;
	int err;

	pthread_mutex_init(&r->qlock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->qcond, &ca);
	pthread_condattr_destroy(&ca);
	err = pthread_create(&r->thread, NULL, publisher, r);
	if (err)
		return -err;
	r->thread_started = true;
	return 0;
}

void publish_stop(struct kvp_remote *r)
{
	struct pub_entry *e;

	pthread_mutex_lock(&r->qlock);
	r->stop = true;
	pthread_cond_broadcast(&r->qcond);
	pthread_mutex_unlock(&r->qlock);
	if (r->thread_started)
		pthread_join(r->thread, NULL);
	for (e = r->qhead; e;) {
		struct pub_entry *next = e->next;

		free(e);
		e = next;
	}
	r->qhead = r->qtail = NULL;
	pthread_cond_destroy(&r->qcond);
	pthread_mutex_destroy(&r->qlock);
}

int publish_flush(struct kvp_remote *r, unsigned timeout_ms)
{
	struct timespec until;
	int err = 0;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&r->qlock);
	while ((r->qhead || r->busy) && !err)
		err = pthread_cond_timedwait(&r->qcond, &r->qlock, &until);
	pthread_mutex_unlock(&r->qlock);
	return err ? -ETIMEDOUT : 0;
}
