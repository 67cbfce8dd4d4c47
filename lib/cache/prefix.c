/*
 * prefix.c - chunk keys of a prompt and the writer thread (prefix.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cache/prefix.h"

#define DEFAULT_QUEUE_BYTES (256ull << 20)

struct job {
	struct job *next;
	struct kvp_rec_key key;
	size_t len;
	unsigned char data[]; /* the payload */
};

struct kvp_prefix {
	struct kvp_prefix_opts o;
	struct kvp_rec_key *keys; /* the prompt's chunk keys */
	uint32_t nkeys;
	/* the queue, under lock */
	pthread_mutex_t lock;
	pthread_cond_t cond;	   /* work queued, room made, idle, stop */
	struct job *head, *tail;
	uint64_t queued_bytes;
	bool busy;		   /* the writer holds a job */
	bool stop;
	pthread_t writer;
	struct kvp_prefix_stats st; /* under lock */
};

static void *writer_main(void *arg)
{
	struct kvp_prefix *p = arg;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct job *j;
		int err;

		while (!p->head && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		if (!p->head)
			break; /* stop, and nothing left */
		j = p->head;
		p->head = j->next;
		if (!p->head)
			p->tail = NULL;
		p->busy = true;
		pthread_mutex_unlock(&p->lock);
		err = kvp_cache_put(p->o.cache, &j->key, j->data, j->len);
		pthread_mutex_lock(&p->lock);
		if (err)
			p->st.failed++;
		else
			p->st.stored++;
		p->queued_bytes -= j->len;
		p->busy = false;
		free(j);
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int kvp_prefix_create(const struct kvp_prefix_opts *o, struct kvp_prefix **out)
{
	struct kvp_prefix *p;
	int err;

	if (!o->cache)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->o = *o;
	if (!p->o.queue_bytes)
		p->o.queue_bytes = DEFAULT_QUEUE_BYTES;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	err = -pthread_create(&p->writer, NULL, writer_main, p);
	if (err) {
		pthread_cond_destroy(&p->cond);
		pthread_mutex_destroy(&p->lock);
		free(p);
		return err;
	}
	*out = p;
	return 0;
}

void kvp_prefix_drain(struct kvp_prefix *p)
{
	pthread_mutex_lock(&p->lock);
	while (p->head || p->busy)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

void kvp_prefix_destroy(struct kvp_prefix *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->writer, NULL); /* it empties the queue first */
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->keys);
	free(p);
}

int kvp_prefix_set_prompt(struct kvp_prefix *p, const uint32_t *tokens,
			  uint32_t n, uint32_t chunk_tokens)
{
	uint32_t i, nk;
	struct kvp_rec_key *keys;
	int err;

	if (!chunk_tokens)
		return -EINVAL;
	nk = n / chunk_tokens;
	keys = calloc(nk ? nk : 1, sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	for (i = 0; i < nk; i++) {
		err = kvp_rec_block_key(&p->o.ctx, i ? &keys[i - 1] : NULL,
					tokens + (size_t)i * chunk_tokens,
					chunk_tokens, &keys[i]);
		if (err) {
			free(keys);
			return err;
		}
	}
	free(p->keys);
	p->keys = keys;
	p->nkeys = nk;
	return 0;
}

int kvp_prefix_key(struct kvp_prefix *p, uint32_t chunk,
		   struct kvp_rec_key *out)
{
	if (chunk >= p->nkeys)
		return -ENOENT;
	*out = p->keys[chunk];
	return 0;
}

int kvp_prefix_get(void *arg, uint32_t chunk, void *buf, size_t len)
{
	struct kvp_prefix *p = arg;
	uint64_t got = 0;
	int err = -ENOENT;

	if (chunk < p->nkeys) {
		err = kvp_cache_get(p->o.cache, &p->keys[chunk], buf, len,
				    &got);
		if (!err && got != len)
			err = -EMSGSIZE;
	}
	pthread_mutex_lock(&p->lock);
	p->st.lookups++;
	if (!err)
		p->st.hit_chunks++;
	pthread_mutex_unlock(&p->lock);
	return err;
}

void kvp_prefix_put(void *arg, uint32_t chunk, const void *payload,
		    size_t len)
{
	struct kvp_prefix *p = arg;
	struct job *j = NULL;

	if (chunk < p->nkeys)
		j = malloc(sizeof(*j) + len);
	pthread_mutex_lock(&p->lock);
	p->st.queued++;
	if (!j) {
		p->st.failed++;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	if (p->queued_bytes && p->queued_bytes + len > p->o.queue_bytes) {
		p->st.queue_waits++;
		while (p->queued_bytes &&
		       p->queued_bytes + len > p->o.queue_bytes)
			pthread_cond_wait(&p->cond, &p->lock);
	}
	p->queued_bytes += len; /* reserved while the copy is made */
	pthread_mutex_unlock(&p->lock);
	j->next = NULL;
	j->key = p->keys[chunk];
	j->len = len;
	memcpy(j->data, payload, len);
	pthread_mutex_lock(&p->lock);
	if (p->tail)
		p->tail->next = j;
	else
		p->head = j;
	p->tail = j;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

void kvp_prefix_stats(struct kvp_prefix *p, struct kvp_prefix_stats *out)
{
	pthread_mutex_lock(&p->lock);
	*out = p->st;
	pthread_mutex_unlock(&p->lock);
}
