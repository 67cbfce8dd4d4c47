/*
 * fetch.c - fetching: GETs through the fetch link, each value verified by
 * the caller's hook before it counts as a hit; and asynchronous fetches,
 * run one after another on the tier's fetch thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/remote/remote_i.h"

/* What one reply makes of @g; counts it. */
static void take_reply(struct kvp_remote *r, struct kvp_remote_get *g,
		       const struct rop *op)
{
	const redisReply *rep = op->reply;

	RSTAT_ADD(r, lookups_total, 1);
	if (op->status) {
		g->status = op->status;
		RSTAT_ADD(r, errors_total, 1);
	} else if (rep->type == REDIS_REPLY_NIL) {
		g->status = -ENOENT;
		RSTAT_ADD(r, misses_total, 1);
	} else if (rep->type != REDIS_REPLY_STRING) {
		g->status = -EIO; /* an error reply: CLUSTERDOWN, LOADING... */
		RSTAT_ADD(r, errors_total, 1);
	} else if (!op->sunk && rep->len > g->buf_len) {
		g->status = -EMSGSIZE;
		RSTAT_ADD(r, oversize_total, 1);
	} else {
		size_t len = op->sunk ? op->dst_len : rep->len;

		/* at buf before the hook (link.c put it there, else here):
		 * the hook may open the record in place */
		if (!op->sunk && len)
			memcpy(g->buf, rep->str, len);
		if (r->verify(r->verify_arg, g->key, g->key_len, g->buf, len)) {
			g->status = -EBADMSG;
			RSTAT_ADD(r, verify_failed_total, 1);
			return;
		}
		g->len = len;
		g->status = 0;
		RSTAT_ADD(r, hits_total, 1);
		RSTAT_ADD(r, bytes_read_total, len);
	}
}

struct take_ctx {
	struct kvp_remote *r;
	struct rop *ops;	     /* fetch_many's, in the order of gets */
	struct kvp_remote_get *gets;
};

/* link_run's take hook: a value verified as it comes, while its bytes
 * are still in the CPU's cache; its reply freed at once. */
static void take_one(void *arg, struct rop *op)
{
	struct take_ctx *t = arg;
	struct kvp_remote_get *g = &t->gets[op - t->ops];

	g->len = 0;
	take_reply(t->r, g, op);
	freeReplyObject(op->reply);
	op->reply = NULL;
}

static int check_gets(const struct kvp_remote_get *gets, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!gets[i].key || !gets[i].key_len ||
		    gets[i].key_len > KVP_REMOTE_MAX_KEY ||
		    (!gets[i].buf && gets[i].buf_len))
			return -EINVAL;
	return 0;
}

int fetch_many(struct kvp_remote *r, struct kvp_remote_get *gets, size_t n)
{
	struct take_ctx tc = { r, NULL, gets };
	struct rop *ops;
	char *rkeys;
	int hits = 0;
	size_t i;

	if (check_gets(gets, n))
		return -EINVAL;
	if (!n)
		return 0;
	ops = calloc(n, sizeof(*ops));
	rkeys = malloc(n * REMOTE_RKEY_MAX);
	if (!ops || !rkeys) {
		free(ops);
		free(rkeys);
		for (i = 0; i < n; i++)
			gets[i].status = -ENOMEM;
		return 0;
	}
	for (i = 0; i < n; i++) {
		char *rkey = rkeys + i * REMOTE_RKEY_MAX;

		ops[i].kind = ROP_GET;
		ops[i].rkey = rkey;
		ops[i].rkey_len = (size_t)remote_rkey(r, gets[i].key,
						      gets[i].key_len, rkey);
		ops[i].dst = gets[i].buf;
		ops[i].dst_cap = gets[i].buf_len;
	}
	tc.ops = ops;
	link_run(&r->fetch, ops, n, take_one, &tc);
	for (i = 0; i < n; i++) {
		if (!ops[i].taken) { /* not sent, failed, or redirected */
			gets[i].len = 0;
			take_reply(r, &gets[i], &ops[i]);
		}
		hits += gets[i].status == 0;
		if (ops[i].reply)
			freeReplyObject(ops[i].reply);
	}
	free(ops);
	free(rkeys);
	return hits;
}

int fetch_submit(struct kvp_remote *r, struct kvp_remote_get *gets, size_t n,
		 kvp_remote_done_fn done, void *arg)
{
	struct fetch_job *j;

	if (check_gets(gets, n) || !done)
		return -EINVAL;
	j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	*j = (struct fetch_job){ NULL, gets, n, done, arg };
	pthread_mutex_lock(&r->flock);
	if (r->fjobs >= KVP_REMOTE_MAX_FETCHES || r->fstop) {
		pthread_mutex_unlock(&r->flock);
		free(j);
		RSTAT_ADD(r, fetches_skipped_total, 1);
		return -EAGAIN;
	}
	if (r->ftail)
		r->ftail->next = j;
	else
		r->fhead = j;
	r->ftail = j;
	r->fjobs++;
	pthread_cond_signal(&r->fcond);
	pthread_mutex_unlock(&r->flock);
	return 0;
}

static void *fetcher(void *arg)
{
	struct kvp_remote *r = arg;

	pthread_mutex_lock(&r->flock);
	for (;;) {
		struct fetch_job *j;
		int hits;

		while (!r->fhead && !r->fstop)
			pthread_cond_wait(&r->fcond, &r->flock);
		if (r->fstop)
			break;
		j = r->fhead;
		r->fhead = j->next;
		if (!r->fhead)
			r->ftail = NULL;
		r->fjobs--;
		pthread_mutex_unlock(&r->flock);
		hits = fetch_many(r, j->gets, j->n);
		j->done(j->arg, j->gets, j->n, hits);
		free(j);
		pthread_mutex_lock(&r->flock);
	}
	pthread_mutex_unlock(&r->flock);
	return NULL;
}

int fetch_start(struct kvp_remote *r)
{
	int err;

	pthread_mutex_init(&r->flock, NULL);
	pthread_cond_init(&r->fcond, NULL);
	err = pthread_create(&r->fthread, NULL, fetcher, r);
	if (err) {
		pthread_cond_destroy(&r->fcond);
		pthread_mutex_destroy(&r->flock);
		return -err;
	}
	r->fthread_started = true;
	return 0;
}

void fetch_stop(struct kvp_remote *r)
{
	struct fetch_job *j;

	if (!r->fthread_started)
		return;
	pthread_mutex_lock(&r->flock);
	r->fstop = true;
	pthread_cond_signal(&r->fcond);
	pthread_mutex_unlock(&r->flock);
	pthread_join(r->fthread, NULL); /* a fetch running ends first */
	while ((j = r->fhead)) {
		r->fhead = j->next;
		for (size_t i = 0; i < j->n; i++)
			j->gets[i].status = -ECANCELED;
		j->done(j->arg, j->gets, j->n, 0);
		free(j);
	}
	r->ftail = NULL;
	r->fthread_started = false;
	pthread_cond_destroy(&r->fcond);
	pthread_mutex_destroy(&r->flock);
}
