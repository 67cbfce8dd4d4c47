/*
 * prefix.c - chunk keys of a prompt and the writer thread (prefix.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "lib/cache/prefix.h"

#define RA_SLOTS	    4 /* chunks read ahead of the gets */

/* A chunk read ahead: free, being read, or ready (err and data set). */
enum ra_state { RA_FREE = 0, RA_READING, RA_READY };

struct ra_slot {
	enum ra_state state;
	uint32_t chunk;
	int err;   /* kvp_prefix_get's result for it */
	void *buf; /* ra_len bytes */
};

#define SPARE_JOBS 8 /* payload buffers kept for the next puts */
/* A job's buffer is kvp_mem_io_alloc's: huge pages from 2 MiB on, where
 * the kernel gives them (transparent huge pages, "madvise"): a fresh
 * 8 MiB buffer cost the putting thread 23-27 ms of first touches in
 * 4 KiB pages on this project's VM, 0.6-0.7 ms in 2 MiB ones. */

struct job {
	struct job *next;
	struct kvp_rec_key key;
	size_t len;	      /* payload bytes */
	size_t cap;	      /* bytes of data: counted in queued_bytes */
	int fd;		      /* -1, or the record is there (put_fd) */
	bool held;	      /* queued under a hold or after its release */
	uint64_t gen;	      /* the hold it was queued under */
	bool notify;	      /* call the stored hook when done */
	uint64_t use;	      /* its recency, taken when queued (the
				 prompt's order, kvp_cache_use_now) */
	unsigned char *data;  /* the payload (cap bytes), or NULL */
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
	struct job *spare;	   /* done jobs kept for reuse: a fresh
				      buffer's pages cost a first touch
				      each, in the putting thread */
	unsigned nspare;	   /* entries of spare */
	bool stop;
	bool hold;		   /* write behind: store only for room */
	uint64_t hold_gen;	   /* holds so far: the current one's number */
	unsigned room_wanted;	   /* puts waiting for room */
	uint64_t held_jobs;	   /* jobs of the current hold not yet done */
	unsigned fd_jobs;	   /* put_fd jobs queued: a descriptor each */
	unsigned fd_cap;	   /* past this many a held writer stores */
	double release_t;	   /* when the hold was released */
	kvp_prefix_stored_fn stored_fn; /* kvp_prefix_on_stored's */
	void *stored_arg;
	pthread_t writer;
	struct kvp_prefix_stats st; /* under lock */
	/* read-ahead, under lock: chunks ra_next .. ra_stop - 1 are read in
	 * order into free slots by the reader, from the first get on */
	pthread_t reader;
	struct ra_slot ra[RA_SLOTS];
	size_t ra_len;	  /* payload bytes; 0: no get yet */
	uint32_t ra_next; /* the next chunk to read */
	uint32_t ra_stop; /* first chunk not to read (past the prompt, or
			     after a miss) */
	uint32_t ra_limit; /* chunks before the prompt's last token */
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->fd >= 0)
		close(j->fd);
	kvp_mem_io_free(j->data, j->cap);
	free(j);
}

/* A job with a buffer of len bytes (huge pages when large: the queue
 * counts the bytes it takes), or NULL. */
static struct job *job_new(size_t len)
{
	struct job *j = calloc(1, sizeof(*j));
	void *d;

	if (!j)
		return NULL;
	j->fd = -1;
	d = kvp_mem_io_alloc(len);
	if (!d) {
		free(j);
		return NULL;
	}
	j->data = d;
	j->cap = kvp_mem_io_bytes(len);
	return j;
}

/* Queued bytes past which a held writer stores: three quarters. */
static uint64_t high_water(const struct kvp_prefix *p)
{
	return p->o.queue_bytes / 4 * 3;
}

/*
 * Whether the writer may store the queue's head now.  Under lock.  Held,
 * only a job queued before the current hold (the queue is in order: an
 * earlier request's chunks must not wait for this one's first token), or
 * for room: past the high water mark, a put waiting, or too many
 * descriptors held by put_fd jobs.
 */
static bool writer_may_store(const struct kvp_prefix *p)
{
	const struct job *h = p->head;

	if (!h)
		return false;
	if (!p->hold || !h->held || h->gen != p->hold_gen)
		return true;
	return p->room_wanted || p->queued_bytes > high_water(p) ||
	       p->fd_jobs > p->fd_cap;
}

static void *writer_main(void *arg)
{
	struct kvp_prefix *p = arg;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct job *j;
		kvp_prefix_stored_fn fn;
		void *fn_arg;
		bool by_fd, behind;
		int err;

		/* at stop, everything (destroy stores what is held) */
		while (!p->stop && !writer_may_store(p))
			pthread_cond_wait(&p->cond, &p->lock);
		if (!p->head)
			break; /* stop, and nothing left */
		j = p->head;
		p->head = j->next;
		if (!p->head)
			p->tail = NULL;
		p->busy = true;
		fn = j->notify ? p->stored_fn : NULL;
		fn_arg = p->stored_arg;
		pthread_mutex_unlock(&p->lock);
		by_fd = j->fd >= 0;
		if (by_fd) {
			err = kvp_cache_put_fd_at(p->o.cache, &j->key, j->fd,
						  j->len, j->use);
			close(j->fd);
			j->fd = -1;
		} else {
			err = kvp_cache_put_at(p->o.cache, &j->key, j->data,
					       j->len, j->use);
		}
		/* stored or not, the next tier gets it, behind the first
		 * token as the directory does */
		if (fn && j->data)
			fn(fn_arg, &j->key, j->data, j->len);
		pthread_mutex_lock(&p->lock);
		if (err)
			p->st.failed++;
		else
			p->st.stored++;
		/* behind: of a hold that has been released */
		behind = j->held && (!p->hold || j->gen != p->hold_gen);
		if (behind && !err)
			p->st.behind++;
		if (j->held && j->gen == p->hold_gen && !--p->held_jobs &&
		    !p->hold)
			p->st.behind_s = now_s() - p->release_t;
		if (by_fd)
			p->fd_jobs--;
		if (j->data)
			p->queued_bytes -= j->cap;
		p->busy = false;
		if (j->data && p->nspare < SPARE_JOBS) {
			j->next = p->spare;
			p->spare = j;
			p->nspare++;
		} else {
			job_free(j);
		}
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static struct ra_slot *ra_free_slot(struct kvp_prefix *p)
{
	for (int i = 0; i < RA_SLOTS; i++)
		if (p->ra[i].state == RA_FREE)
			return &p->ra[i];
	return NULL;
}

static bool ra_reading(const struct kvp_prefix *p)
{
	for (int i = 0; i < RA_SLOTS; i++)
		if (p->ra[i].state == RA_READING)
			return true;
	return false;
}

/* Read the prompt's chunks ahead of kvp_prefix_get, in order, while
 * slots are free; a miss stops it (the prefill computes from there). */
static void *reader_main(void *arg)
{
	struct kvp_prefix *p = arg;
	struct ra_slot *sl = NULL;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct kvp_rec_key key;
		uint64_t got = 0;
		int err;

		while (!p->stop && !(p->ra_len && p->ra_next < p->ra_stop &&
				     (sl = ra_free_slot(p))))
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->stop)
			break;
		if (!sl->buf && !(sl->buf = malloc(p->ra_len))) {
			p->ra_stop = p->ra_next; /* the gets read alone */
			continue;
		}
		sl->state = RA_READING;
		sl->chunk = p->ra_next++;
		key = p->keys[sl->chunk];
		pthread_mutex_unlock(&p->lock);
		err = kvp_cache_get(p->o.cache, &key, sl->buf, p->ra_len, &got);
		if (!err && got != p->ra_len)
			err = -EMSGSIZE;
		pthread_mutex_lock(&p->lock);
		sl->err = err;
		sl->state = RA_READY;
		if (err)
			p->ra_stop = sl->chunk + 1;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* Forget what was read ahead (a new prompt).  Under lock. */
static void ra_reset(struct kvp_prefix *p)
{
	while (ra_reading(p))
		pthread_cond_wait(&p->cond, &p->lock);
	for (int i = 0; i < RA_SLOTS; i++) {
		free(p->ra[i].buf);
		p->ra[i].buf = NULL;
		p->ra[i].state = RA_FREE;
	}
	p->ra_len = 0;
	p->ra_next = p->ra_stop = 0;
}

/* put_fd jobs a held writer lets wait: a quarter of the descriptors the
 * process may open (each bound chunk keeps one more of its own), 16 to
 * 4096; a put_fd waits for room past twice that. */
static unsigned fd_cap(void)
{
	struct rlimit rl;
	rlim_t n = 1024;

	if (!getrlimit(RLIMIT_NOFILE, &rl))
		n = rl.rlim_cur == RLIM_INFINITY ? 16384 : rl.rlim_cur;
	n /= 4;
	return n < 16 ? 16 : n > 4096 ? 4096 : (unsigned)n;
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
	/* a cipher key's blocks are named apart from every other key's */
	err = kvp_cache_keyctx(o->cache, &p->o.ctx);
	if (err) {
		free(p);
		return err;
	}
	if (!p->o.queue_bytes)
		p->o.queue_bytes = KVP_PREFIX_QUEUE_BYTES;
	p->fd_cap = fd_cap();
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	err = -pthread_create(&p->writer, NULL, writer_main, p);
	if (err) {
		pthread_cond_destroy(&p->cond);
		pthread_mutex_destroy(&p->lock);
		free(p);
		return err;
	}
	err = -pthread_create(&p->reader, NULL, reader_main, p);
	if (err) {
		pthread_mutex_lock(&p->lock);
		p->stop = true;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->writer, NULL);
		pthread_cond_destroy(&p->cond);
		pthread_mutex_destroy(&p->lock);
		free(p);
		return err;
	}
	*out = p;
	return 0;
}

void kvp_prefix_hold(struct kvp_prefix *p)
{
	pthread_mutex_lock(&p->lock);
	if (!p->hold) {
		/* a new hold: jobs of an earlier one are stored at once */
		p->hold = true;
		p->hold_gen++;
		p->held_jobs = 0;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
}

void kvp_prefix_release(struct kvp_prefix *p)
{
	pthread_mutex_lock(&p->lock);
	if (p->hold) {
		p->hold = false;
		p->release_t = now_s();
		if (!p->held_jobs)
			p->st.behind_s = 0;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
}

void kvp_prefix_drain(struct kvp_prefix *p)
{
	kvp_prefix_release(p); /* a held writer would never drain */
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
	pthread_join(p->reader, NULL);
	for (int i = 0; i < RA_SLOTS; i++)
		free(p->ra[i].buf);
	while (p->spare) {
		struct job *j = p->spare;

		p->spare = j->next;
		job_free(j);
	}
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
	pthread_mutex_lock(&p->lock);
	ra_reset(p);
	/* a prompt's chunks are used from the first on: first is newest.
	 * After ra_reset: a read ahead of the last prompt still in flight
	 * is a use of that prompt's lookup, not the newest of this one's
	 * (the reader waits on this lock before it reads again) */
	kvp_cache_new_lookup(p->o.cache);
	free(p->keys);
	p->keys = keys;
	p->nkeys = nk;
	p->ra_limit = n ? (n - 1) / chunk_tokens : 0;
	pthread_mutex_unlock(&p->lock);
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

/* Chunk's read-ahead result into buf: true, with *err set; false when
 * it will not be read ahead (read it alone).  Under lock. */
static bool ra_take(struct kvp_prefix *p, uint32_t chunk, void *buf,
		    size_t len, int *err)
{
	int i;

	if (!p->ra_len) { /* the first get: start from here */
		p->ra_len = len;
		p->ra_next = chunk;
		p->ra_stop = p->ra_limit;
		pthread_cond_broadcast(&p->cond);
	}
	if (len != p->ra_len)
		return false;
	for (;;) {
		for (i = 0; i < RA_SLOTS; i++) {
			struct ra_slot *sl = &p->ra[i];

			/* chunks skipped by the caller free their slots */
			if (sl->state == RA_READY && sl->chunk < chunk) {
				sl->state = RA_FREE;
				pthread_cond_broadcast(&p->cond);
			}
			if (sl->state != RA_FREE && sl->chunk == chunk)
				break;
		}
		if (i < RA_SLOTS && p->ra[i].state == RA_READY) {
			*err = p->ra[i].err;
			if (!*err)
				memcpy(buf, p->ra[i].buf, len);
			p->ra[i].state = RA_FREE;
			pthread_cond_broadcast(&p->cond);
			return true;
		}
		if (i == RA_SLOTS &&
		    (chunk < p->ra_next || chunk >= p->ra_stop))
			return false;
		pthread_cond_wait(&p->cond, &p->lock);
	}
}

int kvp_prefix_get(void *arg, uint32_t chunk, void *buf, size_t len)
{
	struct kvp_prefix *p = arg;
	uint64_t got = 0;
	int err = -ENOENT;
	bool done;

	pthread_mutex_lock(&p->lock);
	done = chunk < p->nkeys && ra_take(p, chunk, buf, len, &err);
	pthread_mutex_unlock(&p->lock);
	if (!done && chunk < p->nkeys) {
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

/* A spare job of at least len bytes, or NULL.  Under lock. */
static struct job *take_spare(struct kvp_prefix *p, size_t len)
{
	struct job **at;

	for (at = &p->spare; *at; at = &(*at)->next)
		if ((*at)->cap >= len) {
			struct job *j = *at;

			*at = j->next;
			p->nspare--;
			return j;
		}
	return NULL;
}

/* j at the queue's tail.  Under lock. */
static void enqueue(struct kvp_prefix *p, struct job *j)
{
	j->next = NULL;
	/* its place in recency is its prompt's, taken now in queue order:
	 * the writer may store it after the next prompt's lookup began */
	j->use = kvp_cache_use_now(p->o.cache);
	/* a job of the last hold: queued while it holds, or after its
	 * release (a run offers its computed chunks at its first token) */
	j->held = p->hold || p->hold_gen;
	j->gen = p->hold_gen;
	p->held_jobs += j->held;
	p->fd_jobs += j->fd >= 0;
	if (p->tail)
		p->tail->next = j;
	else
		p->head = j;
	p->tail = j;
	pthread_cond_broadcast(&p->cond);
}

/* put and try_put: with @wait, room in a full queue is waited for; without,
 * -EAGAIN and nothing queued. */
static int put(struct kvp_prefix *p, uint32_t chunk, const void *payload,
	       size_t len, bool wait, bool notify)
{
	struct job *j = NULL;
	size_t need = kvp_mem_io_bytes(len); /* the memory it takes queued */

	pthread_mutex_lock(&p->lock);
	if (!wait && p->queued_bytes &&
	    p->queued_bytes + need > p->o.queue_bytes) {
		pthread_mutex_unlock(&p->lock);
		return -EAGAIN;
	}
	p->st.queued++;
	if (chunk >= p->nkeys) {
		p->st.failed++;
		pthread_mutex_unlock(&p->lock);
		return -ENOENT;
	}
	if (p->queued_bytes && p->queued_bytes + need > p->o.queue_bytes) {
		p->st.queue_waits++;
		p->room_wanted++; /* a held writer stores for it */
		pthread_cond_broadcast(&p->cond);
		while (p->queued_bytes &&
		       p->queued_bytes + need > p->o.queue_bytes)
			pthread_cond_wait(&p->cond, &p->lock);
		p->room_wanted--;
	}
	p->queued_bytes += need; /* reserved while the copy is made */
	j = take_spare(p, len);
	if (j) /* a spare is counted whole, as the writer gives it back */
		p->queued_bytes += j->cap - need;
	pthread_mutex_unlock(&p->lock);
	if (!j)
		j = job_new(len);
	if (!j) {
		pthread_mutex_lock(&p->lock);
		p->st.failed++;
		p->queued_bytes -= need;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		return -ENOMEM;
	}
	j->key = p->keys[chunk];
	j->len = len;
	j->notify = notify;
	memcpy(j->data, payload, len);
	pthread_mutex_lock(&p->lock);
	enqueue(p, j);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

void kvp_prefix_put(void *arg, uint32_t chunk, const void *payload,
		    size_t len)
{
	put(arg, chunk, payload, len, true, true);
}

int kvp_prefix_put_local(struct kvp_prefix *p, uint32_t chunk,
			 const void *payload, size_t len)
{
	return put(p, chunk, payload, len, true, false);
}

uint32_t kvp_prefix_queue_fits(const struct kvp_prefix *p, size_t len)
{
	size_t need = kvp_mem_io_bytes(len); /* 0: too large to round */
	uint64_t n = p->o.queue_bytes / (need ? need : 1);

	return n < 1 ? 1 : n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void kvp_prefix_on_stored(struct kvp_prefix *p, kvp_prefix_stored_fn fn,
			  void *arg)
{
	pthread_mutex_lock(&p->lock);
	while (p->busy) /* a call in progress finishes with the old hook */
		pthread_cond_wait(&p->cond, &p->lock);
	p->stored_fn = fn;
	p->stored_arg = arg;
	pthread_mutex_unlock(&p->lock);
}

int kvp_prefix_try_put(struct kvp_prefix *p, uint32_t chunk,
		       const void *payload, size_t len)
{
	return put(p, chunk, payload, len, false, true);
}

int kvp_prefix_put_fd(struct kvp_prefix *p, uint32_t chunk, int fd,
		      size_t len)
{
	struct job *j = NULL;
	int err = 0;

	pthread_mutex_lock(&p->lock);
	p->st.queued++;
	if (p->fd_jobs >= 2 * p->fd_cap) {
		/* bounded descriptors: wait for the writer, as put for room */
		p->st.queue_waits++;
		p->room_wanted++;
		pthread_cond_broadcast(&p->cond);
		while (p->fd_jobs >= 2 * p->fd_cap)
			pthread_cond_wait(&p->cond, &p->lock);
		p->room_wanted--;
	}
	if (chunk >= p->nkeys)
		err = -ENOENT;
	else if (!(j = calloc(1, sizeof(*j))))
		err = -ENOMEM;
	else if ((j->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		err = -errno;
	if (err) {
		free(j);
		p->st.failed++;
		pthread_mutex_unlock(&p->lock);
		return err;
	}
	j->key = p->keys[chunk];
	j->len = len;
	enqueue(p, j);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

void kvp_prefix_stats(struct kvp_prefix *p, struct kvp_prefix_stats *out)
{
	pthread_mutex_lock(&p->lock);
	*out = p->st;
	pthread_mutex_unlock(&p->lock);
}
