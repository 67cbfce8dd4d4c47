/*
 * fetch.c - fetching: a GET per part through the fetch link (a GETRANGE
 * up to the part's room, link.c), each part straight into its place in
 * the caller's buffer, each value checked part by part (part.c) and then
 * verified by the caller's hook before it counts as a hit; and
 * asynchronous fetches, run one after another on the tier's fetch thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/remote/remote_i.h"

/* One key of a fetch: its parts are ops [op0, op0 + nparts). */
struct fkey {
	size_t op0;	  /* its first op */
	uint32_t nparts;  /* parts asked for: those that fit its buffer */
	uint32_t pending; /* of them, not yet taken */
	uint64_t tag;	  /* what its parts' headers must carry */
};

/* One part of a fetch, as taken. */
struct fpart {
	unsigned char head[KVP_REMOTE_PART_HEADER]; /* its header */
	int outcome;	  /* 0 header and bytes there; -ENOENT absent;
			     -EBADMSG no header; -EMSGSIZE larger than its
			     room (header there); -EIO an error reply;
			     link_run's -errno */
	size_t len;	  /* with outcome 0: its bytes at its place */
	uint32_t key;	  /* the entry of gets it is a part of */
};

struct fetch_ctx {
	struct kvp_remote *r;
	struct kvp_remote_get *gets;
	struct rop *ops;     /* every key's parts, in the order of gets */
	struct fpart *parts; /* one per op */
	struct fkey *keys;   /* one per entry of gets */
};

static bool link_error(int outcome)
{
	return outcome && outcome != -ENOENT && outcome != -EBADMSG &&
	       outcome != -EMSGSIZE;
}

/*
 * What @k's parts make of its entry @g, counted once: an error when a part
 * needed was not fetched; too large for @g's buffer; a failed verification
 * when a part is not of this value; a miss when a part is absent, or
 * stored by another publish than the first good one (two publishes of the
 * key raced: no value is whole); a failed verification when the whole
 * fails the hook; else a hit.  Runs as its last part comes, so the
 * hook reads a value whose end is still in the CPU's cache.
 */
static void key_done(struct fetch_ctx *f, struct fkey *k,
		     struct kvp_remote_get *g)
{
	struct kvp_remote *r = f->r;
	struct fpart *p = &f->parts[k->op0];
	uint32_t i, need = k->nparts, missing = 0, bad = 0, mixed = 0;
	uint64_t total = 0, publish = 0;
	bool known = false;
	int err = 0;

	RSTAT_ADD(r, lookups_total, 1);
	g->len = 0;
	/* the value's length: from the first part whose header is right */
	for (i = 0; i < k->nparts && !known; i++)
		if ((p[i].outcome == 0 || p[i].outcome == -EMSGSIZE) &&
		    !part_check(p[i].head, i, k->tag, &total, &publish))
			known = true;
	if (known && part_count(total) < need)
		need = part_count(total);
	for (i = 0; i < need && !err; i++)
		if (link_error(p[i].outcome))
			err = p[i].outcome;
	if (err) {
		g->status = err;
		RSTAT_ADD(r, errors_total, 1);
		return;
	}
	if (known && total > g->buf_len) {
		g->status = -EMSGSIZE;
		RSTAT_ADD(r, oversize_total, 1);
		return;
	}
	for (i = 0; i < need; i++) {
		bool headed = p[i].outcome == 0 || p[i].outcome == -EMSGSIZE;
		uint64_t t, pub;

		if (p[i].outcome == -ENOENT)
			missing++;
		else if (!headed || part_check(p[i].head, i, k->tag, &t, &pub))
			bad++;
		else if (pub != publish) /* its length may differ too */
			mixed++;
		else if (p[i].outcome || t != total ||
			 p[i].len != part_len(total, i))
			bad++;
	}
	if (bad) {
		g->status = -EBADMSG;
		RSTAT_ADD(r, verify_failed_total, 1);
		RSTAT_ADD(r, parts_bad_total, bad);
		RSTAT_ADD(r, parts_missing_total, known ? missing : 0);
		return;
	}
	if (missing || mixed) {
		/* none there is a plain miss; some, a value torn */
		g->status = -ENOENT;
		RSTAT_ADD(r, misses_total, 1);
		RSTAT_ADD(r, parts_missing_total, known ? missing : 0);
		RSTAT_ADD(r, values_mixed_total, mixed ? 1 : 0);
		return;
	}
	if (r->verify(r->verify_arg, g->key, g->key_len, g->buf, total)) {
		g->status = -EBADMSG;
		RSTAT_ADD(r, verify_failed_total, 1);
		return;
	}
	g->len = total;
	g->status = 0;
	RSTAT_ADD(r, hits_total, 1);
	RSTAT_ADD(r, bytes_read_total, total);
}

/* link_run's take hook (and fetch_many's for the ops it did not take):
 * what @op's reply makes of its part; the reply freed at once, the key
 * settled with its last part. */
static void take_one(void *arg, struct rop *op)
{
	struct fetch_ctx *f = arg;
	struct fpart *p = &f->parts[op - f->ops];
	const redisReply *rep = op->reply;
	struct fkey *k = &f->keys[p->key];

	p->len = 0;
	if (op->status) {
		p->outcome = op->status;
	} else if (rep->type == REDIS_REPLY_NIL) {
		p->outcome = -ENOENT;
	} else if (rep->type == REDIS_REPLY_ERROR &&
		   !strncmp(rep->str, "WRONGTYPE", 9)) {
		/* another client's list or hash under our key: a foreign
		 * value, as one of the wrong bytes is; the server is fine */
		p->outcome = -EBADMSG;
	} else if (rep->type != REDIS_REPLY_STRING) {
		p->outcome = -EIO; /* an error reply: CLUSTERDOWN, LOADING... */
		remote_warn_reply(f->r, "GET", rep);
	} else if (op->sunk) {
		p->outcome = 0; /* link.c put the header and bytes there */
		p->len = op->dst_len;
	} else if (rep->len == 0) {
		p->outcome = -ENOENT; /* GETRANGE's answer for no key */
	} else if (rep->len < KVP_REMOTE_PART_HEADER) {
		p->outcome = -EBADMSG;
	} else {
		/* larger than its room: the header may say by how much */
		memcpy(p->head, rep->str, KVP_REMOTE_PART_HEADER);
		p->outcome = -EMSGSIZE;
	}
	if (op->reply)
		freeReplyObject(op->reply);
	op->reply = NULL;
	op->taken = true;
	if (!--k->pending)
		key_done(f, k, &f->gets[p->key]);
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

/* The parts asked for a buffer of @len bytes: those that fit in it. */
static uint32_t parts_for(size_t len)
{
	return part_count(len > KVP_REMOTE_MAX_VALUE ? KVP_REMOTE_MAX_VALUE
						     : len);
}

int fetch_many(struct kvp_remote *r, struct kvp_remote_get *gets, size_t n)
{
	struct fetch_ctx f = { r, gets, NULL, NULL, NULL };
	size_t i, nops = 0, o = 0;
	char *rkeys = NULL;
	int hits = 0;

	if (check_gets(gets, n))
		return -EINVAL;
	if (!n)
		return 0;
	for (i = 0; i < n; i++)
		nops += parts_for(gets[i].buf_len);
	f.keys = calloc(n, sizeof(*f.keys));
	f.ops = calloc(nops, sizeof(*f.ops));
	f.parts = calloc(nops, sizeof(*f.parts));
	rkeys = malloc(nops * REMOTE_RKEY_MAX);
	if (!f.keys || !f.ops || !f.parts || !rkeys) {
		for (i = 0; i < n; i++)
			gets[i].status = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		struct fkey *k = &f.keys[i];
		char base[REMOTE_RKEY_MAX];
		int blen = remote_rkey(r, gets[i].key, gets[i].key_len, base);

		k->op0 = o;
		k->nparts = k->pending = parts_for(gets[i].buf_len);
		k->tag = part_tag(base, (size_t)blen);
		for (uint32_t j = 0; j < k->nparts; j++, o++) {
			struct rop *op = &f.ops[o];
			char *rkey = rkeys + o * REMOTE_RKEY_MAX;
			size_t off = (size_t)j * KVP_REMOTE_PART_BYTES;

			memcpy(rkey, base, (size_t)blen);
			op->kind = ROP_GET;
			op->rkey = rkey;
			op->rkey_len = (size_t)remote_part_key(rkey,
							       (size_t)blen, j);
			op->head = f.parts[o].head;
			op->head_len = KVP_REMOTE_PART_HEADER;
			op->dst = (char *)gets[i].buf + off;
			op->dst_cap = part_len(gets[i].buf_len, j);
			f.parts[o].key = (uint32_t)i;
		}
	}
	link_run(&r->fetch, f.ops, nops, take_one, &f);
	for (o = 0; o < nops; o++)
		if (!f.ops[o].taken) /* not sent, failed, or redirected */
			take_one(&f, &f.ops[o]);
	for (i = 0; i < n; i++)
		hits += gets[i].status == 0;
out:
	free(f.keys);
	free(f.ops);
	free(f.parts);
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
