/*
 * publish.c - the publish queue and the thread that drains it.
 *
 * publish_push copies a value into the queue or, when the queue holds
 * url.queue entries or url.queue_bytes, drops it (publishes_skipped_total):
 * the caller is a decode step and never waits on the network.  The thread
 * pops up to LINK_PIPELINE entries at a time, makes each value its parts
 * (part.c), all marked with a random publish id, and SETs them, pipelined,
 * on the publish link; a failure is counted and the entry dropped (a block
 * not published is only a later miss elsewhere; a part that did go is
 * never served without the rest, nor beside another publish's).
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

	/* never queued, however empty the queue: not "full", said why */
	if (len > r->url.queue_bytes) {
		RSTAT_ADD(r, publishes_skipped_total, 1);
		/* no size of its own in it: each would be a cause said
		 * anew, taking the WARN_MAX the server's failures need */
		remote_note(r,
			    "a value larger than the URL's queue_bytes "
			    "(%llu) is never published (raise ?queue_bytes=)",
			    (unsigned long long)r->url.queue_bytes);
		return -EMSGSIZE;
	}
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

/* A value made ready to SET: its parts, headers and bytes, laid out one
 * after another in @buf (one allocation: the value copied once). */
struct pub_value {
	char *buf;	  /* the parts, each KVP_REMOTE_PART_HEADER + bytes */
	uint32_t nparts;
	size_t len;	  /* the value's bytes, headers not counted */
	bool failed;	  /* encode failed, or a part's SET */
};

/* @e's value (through the encode hook) as parts into @v; false (counted)
 * when it cannot be made. */
static bool value_make(struct kvp_remote *r, const struct pub_entry *e,
		       struct pub_value *v)
{
	const char *val = e->val;
	void *encoded = NULL;
	uint64_t tag = part_tag(e->rkey, e->rkey_len), publish;
	size_t len = e->val_len, off = 0;

	if (r->encode && r->encode(r->encode_arg, e->key, e->key_len, e->val,
				   e->val_len, &encoded, &len)) {
		RSTAT_ADD(r, publish_errors_total, 1);
		return false;
	}
	if (encoded)
		val = encoded;
	v->nparts = part_count(len);
	v->len = len;
	v->failed = false;
	v->buf = len <= KVP_REMOTE_MAX_VALUE
			 ? malloc(len + (size_t)v->nparts * KVP_REMOTE_PART_HEADER)
			 : NULL;
	if (!v->buf) {
		free(encoded);
		RSTAT_ADD(r, publish_errors_total, 1);
		return false;
	}
	/* another publish of the key may race this one part by part: a
	 * fetch takes only parts of one publish */
	arc4random_buf(&publish, sizeof(publish));
	for (uint32_t i = 0; i < v->nparts; i++) {
		size_t plen = part_len(len, i);

		part_header(v->buf + off, i, len, tag, publish);
		memcpy(v->buf + off + KVP_REMOTE_PART_HEADER,
		       val + (size_t)i * KVP_REMOTE_PART_BYTES, plen);
		off += KVP_REMOTE_PART_HEADER + plen;
	}
	free(encoded);
	return true;
}

/* SET the parts of @v[0..@n) (their keys at @rkeys), pipelined; count
 * each value stored or failed (a part refused fails its value), free. */
static void values_send(struct kvp_remote *r, struct pub_value *v,
			struct pub_entry **ents, size_t n, char *rkeys,
			struct rop *ops)
{
	size_t i, o = 0, nops = 0;

	for (i = 0; i < n; i++) {
		size_t off = 0;

		for (uint32_t j = 0; j < v[i].nparts; j++, o++) {
			char *rkey = rkeys + o * REMOTE_RKEY_MAX;
			size_t plen = part_len(v[i].len, j);

			memcpy(rkey, ents[i]->rkey, ents[i]->rkey_len);
			memset(&ops[o], 0, sizeof(ops[o]));
			ops[o].kind = ROP_SET;
			ops[o].rkey = rkey;
			ops[o].rkey_len = (size_t)remote_part_key(
				rkey, ents[i]->rkey_len, j);
			ops[o].val = v[i].buf + off;
			ops[o].val_len = KVP_REMOTE_PART_HEADER + plen;
			off += ops[o].val_len;
		}
	}
	nops = o;
	link_run(&r->pub, ops, nops, NULL, NULL);
	for (i = o = 0; i < n; i++) {
		for (uint32_t j = 0; j < v[i].nparts; j++, o++) {
			redisReply *rep = ops[o].reply;

			/* OOM (maxmemory, noeviction), READONLY,
			 * CLUSTERDOWN... */
			if (ops[o].status || rep->type != REDIS_REPLY_STATUS)
				v[i].failed = true;
			if (!ops[o].status && rep->type != REDIS_REPLY_STATUS)
				remote_warn_reply(r, "SET", rep);
			if (rep)
				freeReplyObject(rep);
		}
		if (v[i].failed) {
			RSTAT_ADD(r, publish_errors_total, 1);
		} else {
			RSTAT_ADD(r, publishes_total, 1);
			RSTAT_ADD(r, bytes_written_total, v[i].len);
		}
		free(v[i].buf);
	}
}

/* Publish the @n entries of @list: their values made into parts and SET
 * a round of about LINK_FLIGHT_BYTES at a time, so that no more than that
 * (and one value) is held beside the queue. */
static void publish_batch(struct kvp_remote *r, struct pub_entry *list,
			  size_t n)
{
	/* before a value is added: fewer than LINK_PIPELINE values, under
	 * LINK_FLIGHT_BYTES of them; then the value's own parts */
	static const size_t max_parts =
		LINK_PIPELINE + LINK_FLIGHT_BYTES / KVP_REMOTE_PART_BYTES +
		KVP_REMOTE_MAX_VALUE / KVP_REMOTE_PART_BYTES + 1;
	struct pub_value v[LINK_PIPELINE];
	struct pub_entry *ents[LINK_PIPELINE];
	struct rop *ops = malloc(max_parts * sizeof(*ops));
	char *rkeys = malloc(max_parts * REMOTE_RKEY_MAX);
	size_t k = 0, bytes = 0;

	for (struct pub_entry *e = list; e; e = e->next) {
		if (!ops || !rkeys) {
			RSTAT_ADD(r, publish_errors_total, 1);
			continue;
		}
		if (!value_make(r, e, &v[k]))
			continue;
		ents[k] = e;
		bytes += v[k].len;
		if (++k == LINK_PIPELINE || bytes >= LINK_FLIGHT_BYTES) {
			values_send(r, v, ents, k, rkeys, ops);
			k = bytes = 0;
		}
	}
	if (k)
		values_send(r, v, ents, k, rkeys, ops);
	free(ops);
	free(rkeys);
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
