/*
 * cache_store.c - a store that reads bound ranges from the prefix cache's
 * block files (cache_store.h).
 *
 * Invariants, under cs->lock:
 *   1. map[g].rec is 0 (granule g is the inner store's) or 1 + the index
 *      of an open record whose refs counts g;
 *   2. a record whose refs and inflight fell to 0 is closed (fd -1) and
 *      never bound again (a new bind opens the block afresh);
 *   3. the verifier thread runs from the first kvp_cache_store_verify_ahead
 *      until destroy sets stop; it takes the last record bound that is
 *      open, unverified and not yet tried (ahead_tried), so that a reader
 *      that verifies from the first record on meets it in the middle;
 *   4. the reader threads run from the first hand_off until destroy sets
 *      stop and no job is left (every queue is gone by then).
 * And under a queue's mu: its nready + busy (its jobs with the readers)
 * never passes its depth; queue_destroy waits until busy is 0.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lib/cache/cache_store.h"

struct record {
	struct kvp_rec_key key;
	int fd;		/* the block file, or -1 once unbound */
	uint64_t len;	/* payload bytes */
	uint64_t refs;	/* granules bound to it */
	uint32_t inflight; /* I/Os on fd outside the lock (fd_take) */
	bool verified;	/* read whole and verified once */
	bool bad;	/* failed verification: its reads fail */
	bool detached;	/* not the directory's (kvp_cache_store_bind_fd):
			   a failure is not reported to it */
	bool ahead_tried; /* the verifier took it (or need not) */
};

#define VBUFS 2 /* verification buffers kept (a service thread's and the
		   verifier's) */
#define READERS 2 /* reader threads for the queues' large bound reads */
/* A bound read this large goes to a reader thread: a pager block's copy
 * out of the page cache (2 MiB, some 0.5 ms) no longer holds up the
 * thread that submits; a sparse decode's KV block (16 KiB, 4 us) is read
 * at submit, cheaper than a hand-off. */
#define ASYNC_MIN (256u << 10)

/* A bound read handed to the reader threads. */
struct job {
	struct kvp_store_queue *q;
	struct kvp_io *io;
	struct job *next;
};

struct granule_map {
	uint32_t rec;  /* 1 + index in recs; 0: not bound */
	uint32_t unit; /* which granule of the record's payload */
};

struct cache_store {
	struct kvp_store base;	   /* first: the public part */
	struct kvp_store *inner;   /* owned */
	struct kvp_cache *cache;   /* not owned */
	size_t granule;		   /* bytes of one bound unit */
	pthread_mutex_t lock;	   /* guards what follows */
	struct granule_map *map;   /* store size / granule entries */
	uint64_t nmap;		   /* entries of map */
	struct record *recs;	   /* every record bound since create */
	uint32_t nrecs, recs_cap;  /* entries used, allocated */
	void *vbuf[VBUFS];	   /* verification buffers kept: a fresh
				      one's pages each cost a first touch
				      (22-458 us here), 2048 a record */
	size_t vbuf_bytes[VBUFS];  /* their sizes; 0: none */
	bool ahead;		   /* the verifier thread was started */
	bool stop;		   /* destroy: the verifier returns */
	pthread_cond_t wake;	   /* a bind, or stop, for the verifier */
	pthread_t verifier;	   /* valid while ahead */
	pthread_cond_t jwake;	   /* a job, or stop, for the readers */
	struct job *jhead, *jtail; /* jobs no reader took yet */
	unsigned nreaders;	   /* reader threads started */
	bool readers_tried;	   /* their start was tried (once) */
	pthread_t reader[READERS];
	struct kvp_cache_store_stats st;
};

/* A queue: the inner store's, plus reads of bound ranges done at submit
 * and handed out by reap before the inner queue's completions. */
struct kvp_store_queue {
	struct cache_store *cs;
	struct kvp_store_queue *inner;
	int efd;		     /* readable while ready holds I/Os */
	int epfd;		     /* over efd and the inner queue's fd */
	unsigned depth;		     /* ring entries */
	pthread_mutex_t mu;	     /* guards what follows and efd's count */
	pthread_cond_t idle;	     /* busy fell to 0 */
	struct kvp_io **ready;	     /* completed, not reaped */
	unsigned ready_head, nready; /* ring of depth entries */
	unsigned busy;		     /* jobs with the readers; nready + busy
					never passes depth */
};

static const struct kvp_store_ops cache_store_ops;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct cache_store *to_cs(struct kvp_store *s)
{
	return (struct cache_store *)s;
}

bool kvp_cache_store_is(const struct kvp_store *s)
{
	return s && s->ops == &cache_store_ops;
}

/* ---- bindings ----------------------------------------------------------- */

/* Drop granule g's binding.  Under lock. */
static void unbind_one(struct cache_store *cs, uint64_t g)
{
	struct record *r;

	if (g >= cs->nmap || !cs->map[g].rec)
		return;
	r = &cs->recs[cs->map[g].rec - 1];
	cs->map[g].rec = 0;
	cs->st.bound_granules--;
	cs->st.unbound++;
	if (!--r->refs && !r->inflight && r->fd >= 0) {
		close(r->fd);
		r->fd = -1;
	}
}

/* Record ri's descriptor for I/O outside the lock, or -1 (failed
 * verification, or closed); give it back with fd_put.  Under lock.  (A
 * dup(2) and close(2) per read cost twice the pread itself here.) */
static int fd_take(struct cache_store *cs, uint32_t ri)
{
	struct record *r = &cs->recs[ri];

	if (r->bad || r->fd < 0)
		return -1;
	r->inflight++;
	return r->fd;
}

/* The I/O on fd_take's descriptor is done: the last user of a record
 * that was unbound meanwhile closes it.  Under lock. */
static void fd_put(struct cache_store *cs, uint32_t ri)
{
	struct record *r = &cs->recs[ri];

	if (!--r->inflight && !r->refs && r->fd >= 0) {
		close(r->fd);
		r->fd = -1;
	}
}

/* Does [off, off + len) touch a bound granule?  Under lock. */
static bool any_bound(struct cache_store *cs, uint64_t off, uint64_t len)
{
	uint64_t g, last;

	if (!len || !cs->st.bound_granules)
		return false;
	last = (off + len - 1) / cs->granule;
	for (g = off / cs->granule; g <= last && g < cs->nmap; g++)
		if (cs->map[g].rec)
			return true;
	return false;
}

static int check_offs(struct kvp_store *s, const uint64_t *offs, size_t n)
{
	struct cache_store *cs = to_cs(s);

	if (!kvp_cache_store_is(s) || !n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (offs[i] % cs->granule || offs[i] / cs->granule >= cs->nmap)
			return -EINVAL;
	return 0;
}

/* Bind the record at fd (payload len bytes; owned, closed on failure). */
static int bind_record(struct cache_store *cs, const struct kvp_rec_key *key,
		       int fd, uint64_t len, bool detached, bool verified,
		       const uint64_t *offs, size_t n)
{
	struct record *r;
	size_t i;

	if (len != (uint64_t)n * cs->granule) {
		close(fd);
		return -EMSGSIZE;
	}
	pthread_mutex_lock(&cs->lock);
	if (cs->nrecs == cs->recs_cap) {
		uint32_t ncap = cs->recs_cap ? cs->recs_cap * 2 : 64;
		struct record *nr = realloc(cs->recs, ncap * sizeof(*nr));

		if (!nr) {
			pthread_mutex_unlock(&cs->lock);
			close(fd);
			return -ENOMEM;
		}
		cs->recs = nr;
		cs->recs_cap = ncap;
	}
	r = &cs->recs[cs->nrecs++];
	*r = (struct record){ .key = *key, .fd = fd, .len = len,
			      .detached = detached, .verified = verified };
	if (verified)
		cs->st.verified++;
	for (i = 0; i < n; i++) {
		uint64_t g = offs[i] / cs->granule;

		unbind_one(cs, g); /* an older binding there is forgotten */
		cs->map[g].rec = cs->nrecs;
		cs->map[g].unit = (uint32_t)i;
		r->refs++;
		cs->st.bound_granules++;
	}
	cs->st.records++;
	if (cs->ahead && !verified)
		pthread_cond_signal(&cs->wake);
	pthread_mutex_unlock(&cs->lock);
	return 0;
}

int kvp_cache_store_bind(struct kvp_store *s, const struct kvp_rec_key *key,
			 const uint64_t *offs, size_t n)
{
	uint64_t len;
	int fd, err = check_offs(s, offs, n);

	if (!err)
		err = kvp_cache_open_block(to_cs(s)->cache, key, &fd, &len);
	if (err)
		return err;
	return bind_record(to_cs(s), key, fd, len, false, false, offs, n);
}

int kvp_cache_store_bind_fd(struct kvp_store *s, const struct kvp_rec_key *key,
			    int fd, uint64_t len, bool verified,
			    const uint64_t *offs, size_t n)
{
	int err = check_offs(s, offs, n);

	if (err) {
		close(fd);
		return err;
	}
	return bind_record(to_cs(s), key, fd, len, true, verified, offs, n);
}

/* ---- reads -------------------------------------------------------------- */

static int pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done,
				  (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA; /* shorter than its header said */
		done += (size_t)n;
	}
	return 0;
}

/* A buffer of at least len bytes: a kept one, or malloc's.  Not under
 * lock.  Give it back with vbuf_put. */
static void *vbuf_get(struct cache_store *cs, size_t len, size_t *cap)
{
	void *b = NULL;
	int i;

	pthread_mutex_lock(&cs->lock);
	for (i = 0; i < VBUFS; i++)
		if (cs->vbuf[i] && cs->vbuf_bytes[i] >= len) {
			b = cs->vbuf[i];
			*cap = cs->vbuf_bytes[i];
			cs->vbuf[i] = NULL;
			cs->vbuf_bytes[i] = 0;
			break;
		}
	pthread_mutex_unlock(&cs->lock);
	if (!b) {
		b = malloc(len);
		*cap = len;
	}
	return b;
}

/* Keep b (cap bytes; NULL: nothing) for the next verification, or free
 * it.  Not under lock. */
static void vbuf_put(struct cache_store *cs, void *b, size_t cap)
{
	int i;

	if (!b)
		return;
	pthread_mutex_lock(&cs->lock);
	for (i = 0; i < VBUFS; i++)
		if (!cs->vbuf[i]) {
			cs->vbuf[i] = b;
			cs->vbuf_bytes[i] = cap;
			b = NULL;
			break;
		}
	pthread_mutex_unlock(&cs->lock);
	free(b);
}

/*
 * Read and verify record ri whole; on success its payload is at
 * *whole + KVP_REC_HEADER_BYTES (*whole_cap bytes: the caller gives it
 * back with vbuf_put).  A record that fails (torn, corrupt) is reported
 * to the cache once and marked bad; a read error is only returned: it
 * says nothing of the record, which stays.  Not under lock.
 */
static int verify_record(struct cache_store *cs, uint32_t ri, int fd,
			 bool ahead, void **whole, size_t *whole_cap)
{
	struct record *r;
	struct kvp_rec_key key;
	const void *p;
	uint64_t len, n;
	void *buf;
	int err;

	pthread_mutex_lock(&cs->lock);
	key = cs->recs[ri].key;
	len = cs->recs[ri].len;
	pthread_mutex_unlock(&cs->lock);
	buf = vbuf_get(cs, kvp_rec_size(len), whole_cap);
	if (!buf)
		return -ENOMEM;
	err = pread_all(fd, buf, kvp_rec_size(len), 0);
	if (err && err != -ENODATA) {
		/* a read error (EIO ...) says nothing of the record: the read
		 * fails, as a get's would, and the block stays committed (a
		 * later read tries again) */
		vbuf_put(cs, buf, *whole_cap);
		return err;
	}
	if (err)
		err = -EINVAL; /* shorter than its header: torn */
	if (!err)
		err = kvp_rec_open(buf, kvp_rec_size(len), &key, NULL, &p, &n);
	if (!err && n != len)
		err = -EINVAL;
	pthread_mutex_lock(&cs->lock);
	r = &cs->recs[ri];
	if (err && err != -ENOMEM && !r->bad) {
		bool detached = r->detached;
		char hex[65];

		r->bad = true;
		cs->st.rejected++;
		pthread_mutex_unlock(&cs->lock);
		if (!detached)
			kvp_cache_reject(cs->cache, &key, fd, err);
		kvp_rec_key_hex(&key, hex);
		/* once per record: the pager sees only a read error */
		fprintf(stderr,
			"kvpager: cache: block %.16s... failed verification "
			"when read (%s): %sthe KV it maps cannot be "
			"served, and the next run computes it again\n",
			hex, kvp_rec_strerror(err),
			detached ? "" : "dropped; ");
		pthread_mutex_lock(&cs->lock);
	} else if (!err && !r->verified) {
		r->verified = true;
		cs->st.verified++;
		if (ahead)
			cs->st.verified_ahead++;
	}
	pthread_mutex_unlock(&cs->lock);
	if (err) {
		vbuf_put(cs, buf, *whole_cap);
		return err == -ENOMEM ? err : -EBADMSG;
	}
	*whole = buf;
	return 0;
}

/*
 * The verifier thread: verifies bound records, the last bound first, at
 * the lowest CPU priority (it takes what the prefill and the decode leave
 * idle; a read that comes first verifies its record itself).
 */
static void *verifier_main(void *arg)
{
	struct cache_store *cs = arg;

	(void)pthread_setname_np(pthread_self(), "kvp-verify");
	/* raising its own nice value needs no privilege; per thread on Linux */
	(void)!setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
	pthread_mutex_lock(&cs->lock);
	while (!cs->stop) {
		uint32_t i = cs->nrecs, ri = UINT32_MAX;
		void *whole = NULL;
		size_t cap = 0;
		int fd;

		while (i-- > 0) {
			struct record *r = &cs->recs[i];

			if (!r->ahead_tried && r->refs && r->fd >= 0 &&
			    !r->verified && !r->bad) {
				ri = i;
				break;
			}
		}
		if (ri == UINT32_MAX) {
			pthread_cond_wait(&cs->wake, &cs->lock);
			continue;
		}
		cs->recs[ri].ahead_tried = true;
		fd = fd_take(cs, ri);
		pthread_mutex_unlock(&cs->lock);
		if (fd >= 0 &&
		    !verify_record(cs, ri, fd, true, &whole, &cap))
			vbuf_put(cs, whole, cap);
		pthread_mutex_lock(&cs->lock);
		if (fd >= 0)
			fd_put(cs, ri);
	}
	pthread_mutex_unlock(&cs->lock);
	return NULL;
}

int kvp_cache_store_verify_ahead(struct kvp_store *s)
{
	struct cache_store *cs = to_cs(s);
	int err = 0;

	if (!kvp_cache_store_is(s))
		return -EINVAL;
	pthread_mutex_lock(&cs->lock);
	if (!cs->ahead) {
		err = -pthread_create(&cs->verifier, NULL, verifier_main, cs);
		cs->ahead = !err;
	}
	pthread_mutex_unlock(&cs->lock);
	return err;
}

/*
 * [off, off + len) of the inner store into buf: a range that its offset
 * alignment refuses (granules smaller than it) through a bounce buffer
 * of the aligned range around it.  0 or -errno.
 */
static int inner_read(struct cache_store *cs, void *buf, size_t len,
		      uint64_t off)
{
	uint64_t a = cs->inner->offset_align ? cs->inner->offset_align : 1;
	uint64_t lo = off / a * a, hi = (off + len + a - 1) / a * a;
	void *tmp;
	int err;

	if (lo == off && hi == off + len)
		return kvp_store_pread(cs->inner, buf, len, off);
	if (hi > cs->inner->size)
		return -EINVAL;
	tmp = malloc((size_t)(hi - lo));
	if (!tmp)
		return -ENOMEM;
	err = kvp_store_pread(cs->inner, tmp, (size_t)(hi - lo), lo);
	if (!err)
		memcpy(buf, (char *)tmp + (off - lo), len);
	free(tmp);
	return err;
}

/*
 * Read [off, off + len) of the store into buf: bound granules from their
 * records (verifying each record on its first read), runs of the others
 * from the inner store.  0 or -errno.
 */
static int read_range(struct cache_store *cs, void *buf, size_t len,
		      uint64_t off)
{
	uint64_t end = off + len, pos = off;
	uint32_t held = 0; /* 1 + the record whole holds */
	void *whole = NULL;
	size_t whole_cap = 0;
	uint64_t bytes = 0; /* read from records */
	bool any = false;
	int err = 0;

	while (!err && pos < end) {
		uint64_t g = pos / cs->granule, gend = (g + 1) * cs->granule;
		uint64_t stop = gend < end ? gend : end, in;
		struct granule_map m = { 0, 0 };
		struct record r = { .fd = -1 };
		int fd = -1;

		pthread_mutex_lock(&cs->lock);
		if (g < cs->nmap)
			m = cs->map[g];
		if (m.rec) {
			r = cs->recs[m.rec - 1];
			fd = fd_take(cs, m.rec - 1);
			/* the next granules, if they follow in the record */
			while (stop < end) {
				uint64_t ng = stop / cs->granule;

				if (ng >= cs->nmap || cs->map[ng].rec != m.rec ||
				    cs->map[ng].unit != m.unit + (ng - g))
					break;
				stop = (ng + 1) * cs->granule;
				if (stop > end)
					stop = end;
			}
		}
		pthread_mutex_unlock(&cs->lock);
		if (!m.rec) {
			/* the run of unbound granules from pos */
			uint64_t run = stop;

			pthread_mutex_lock(&cs->lock);
			while (run < end) {
				uint64_t rg = run / cs->granule;

				if (rg < cs->nmap && cs->map[rg].rec)
					break;
				run = (rg + 1) * cs->granule;
				if (run > end)
					run = end;
			}
			pthread_mutex_unlock(&cs->lock);
			err = inner_read(cs, (char *)buf + (pos - off),
					 (size_t)(run - pos), pos);
			pos = run;
			continue;
		}
		any = true;
		if (fd < 0) {
			err = r.bad ? -EBADMSG : -EIO;
			break;
		}
		in = (uint64_t)m.unit * cs->granule + (pos - g * cs->granule);
		if (!r.verified && held != m.rec) {
			vbuf_put(cs, whole, whole_cap);
			whole = NULL;
			held = 0;
			err = verify_record(cs, m.rec - 1, fd, false, &whole,
					    &whole_cap);
			if (!err)
				held = m.rec;
		}
		if (!err && held == m.rec)
			memcpy((char *)buf + (pos - off),
			       (char *)whole + KVP_REC_HEADER_BYTES + in,
			       (size_t)(stop - pos));
		else if (!err)
			err = pread_all(fd, (char *)buf + (pos - off),
					(size_t)(stop - pos),
					KVP_REC_HEADER_BYTES + in);
		if (err == -ENODATA)
			err = -EIO; /* verified whole, then shorter: a read error */
		pthread_mutex_lock(&cs->lock);
		fd_put(cs, m.rec - 1);
		pthread_mutex_unlock(&cs->lock);
		if (!err)
			bytes += stop - pos;
		pos = stop;
	}
	vbuf_put(cs, whole, whole_cap);
	if (any) {
		pthread_mutex_lock(&cs->lock);
		cs->st.bound_reads++;
		cs->st.bound_bytes += bytes;
		pthread_mutex_unlock(&cs->lock);
	}
	return err;
}

/*
 * Before a write or discard of [off, off + len): unbind the granules it
 * covers; a bound granule it covers only in part is first copied whole to
 * the inner store (the write then lands on it).  0 or -errno (nothing
 * unbound of that granule).
 */
static int unbind_range(struct cache_store *cs, uint64_t off, uint64_t len)
{
	uint64_t g, first, last;
	void *tmp = NULL;
	int err = 0;

	if (!len)
		return 0;
	first = off / cs->granule;
	last = (off + len - 1) / cs->granule;
	pthread_mutex_lock(&cs->lock);
	if (!any_bound(cs, off, len)) {
		pthread_mutex_unlock(&cs->lock);
		return 0;
	}
	for (g = first; g <= last && g < cs->nmap && !err; g++) {
		uint64_t gs = g * cs->granule;

		if (!cs->map[g].rec)
			continue;
		if (off > gs || off + len < gs + cs->granule) {
			pthread_mutex_unlock(&cs->lock);
			if (!tmp)
				tmp = malloc(cs->granule);
			err = tmp ? read_range(cs, tmp, cs->granule, gs)
				  : -ENOMEM;
			if (!err)
				err = kvp_store_pwrite(cs->inner, tmp,
						       cs->granule, gs);
			pthread_mutex_lock(&cs->lock);
		}
		if (!err)
			unbind_one(cs, g);
	}
	pthread_mutex_unlock(&cs->lock);
	free(tmp);
	return err;
}

/* ---- the store's operations --------------------------------------------- */

static void mirror_counters(struct cache_store *cs)
{
	__atomic_store_n(
	    &cs->base.buffered_ios,
	    __atomic_load_n(&cs->inner->buffered_ios, __ATOMIC_RELAXED),
	    __ATOMIC_RELAXED);
}

static bool needs_us(struct cache_store *cs, uint64_t off, uint64_t len)
{
	bool yes;

	pthread_mutex_lock(&cs->lock);
	yes = any_bound(cs, off, len);
	pthread_mutex_unlock(&cs->lock);
	return yes;
}

static int cs_pread(struct kvp_store *s, void *buf, size_t len, uint64_t off)
{
	struct cache_store *cs = to_cs(s);
	int err;

	if (!needs_us(cs, off, len))
		err = kvp_store_pread(cs->inner, buf, len, off);
	else
		err = read_range(cs, buf, len, off);
	mirror_counters(cs);
	return err;
}

static int cs_pwrite(struct kvp_store *s, const void *buf, size_t len,
		     uint64_t off)
{
	struct cache_store *cs = to_cs(s);
	int err = unbind_range(cs, off, len);

	if (!err)
		err = kvp_store_pwrite(cs->inner, buf, len, off);
	mirror_counters(cs);
	return err;
}

static void cs_queue_free(struct kvp_store_queue *q)
{
	if (q->inner)
		q->cs->inner->ops->queue_destroy(q->inner);
	if (q->epfd >= 0)
		close(q->epfd);
	if (q->efd >= 0)
		close(q->efd);
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->idle);
	free(q->ready);
	free(q);
}

static int cs_queue_create(struct kvp_store *s, unsigned depth,
			   struct kvp_store_queue **out)
{
	struct cache_store *cs = to_cs(s);
	struct kvp_store_queue *q;
	struct epoll_event ev = { .events = EPOLLIN };
	int err, ifd;

	if (!out || !depth)
		return -EINVAL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->cs = cs;
	q->depth = depth;
	q->efd = q->epfd = -1;
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->idle, NULL);
	err = -ENOMEM;
	q->ready = calloc(depth, sizeof(*q->ready));
	if (!q->ready)
		goto fail;
	err = cs->inner->ops->queue_create(cs->inner, depth, &q->inner);
	if (err) {
		q->inner = NULL;
		goto fail;
	}
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->efd < 0)
		goto fail_errno;
	ifd = cs->inner->ops->queue_fd ? cs->inner->ops->queue_fd(q->inner)
				       : -1;
	if (ifd >= 0) {
		/* one descriptor that polls readable for either */
		q->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (q->epfd < 0 || epoll_ctl(q->epfd, EPOLL_CTL_ADD, ifd, &ev) ||
		    epoll_ctl(q->epfd, EPOLL_CTL_ADD, q->efd, &ev))
			goto fail_errno;
	}
	*out = q;
	return 0;
fail_errno:
	err = -errno;
fail:
	cs_queue_free(q);
	return err;
}

static void cs_queue_destroy(struct kvp_store_queue *q)
{
	if (!q)
		return;
	/* the readers' jobs on q complete first (a store's queue_destroy
	 * waits for what is in flight) */
	pthread_mutex_lock(&q->mu);
	while (q->busy)
		pthread_cond_wait(&q->idle, &q->mu);
	pthread_mutex_unlock(&q->mu);
	cs_queue_free(q);
}

/* io completed: into q's ready ring, counted by efd.  Under q->mu (so
 * that a reap that empties the ring and clears efd's count never misses
 * a completion pushed meanwhile). */
static void ready_push(struct kvp_store_queue *q, struct kvp_io *io)
{
	uint64_t one = 1;

	q->ready[(q->ready_head + q->nready) % q->depth] = io;
	q->nready++;
	(void)!write(q->efd, &one, sizeof(one));
}

/* A reader thread: the queues' large bound reads, in the order handed. */
static void *reader_main(void *arg)
{
	struct cache_store *cs = arg;

	(void)pthread_setname_np(pthread_self(), "kvp-cread");
	pthread_mutex_lock(&cs->lock);
	for (;;) {
		struct job *j = cs->jhead;
		struct kvp_store_queue *q;
		struct kvp_io *io;
		int err;

		if (!j) {
			if (cs->stop)
				break;
			pthread_cond_wait(&cs->jwake, &cs->lock);
			continue;
		}
		cs->jhead = j->next;
		if (!cs->jhead)
			cs->jtail = NULL;
		pthread_mutex_unlock(&cs->lock);
		q = j->q;
		io = j->io;
		free(j);
		err = read_range(cs, io->buf, io->len, io->off);
		io->result = err ? err : (int64_t)io->len;
		pthread_mutex_lock(&q->mu);
		ready_push(q, io);
		if (!--q->busy)
			pthread_cond_broadcast(&q->idle);
		pthread_mutex_unlock(&q->mu); /* q may be destroyed from here */
		pthread_mutex_lock(&cs->lock);
	}
	pthread_mutex_unlock(&cs->lock);
	return NULL;
}

/* Hand io (a bound read of q) to the reader threads, started at the first
 * hand-off.  false: none runs (the caller reads it at submit). */
static bool hand_off(struct kvp_store_queue *q, struct kvp_io *io)
{
	struct cache_store *cs = q->cs;
	struct job *j = malloc(sizeof(*j));
	bool ok;

	if (!j)
		return false;
	*j = (struct job){ .q = q, .io = io };
	pthread_mutex_lock(&q->mu);
	q->busy++; /* before a reader can see it */
	pthread_mutex_unlock(&q->mu);
	pthread_mutex_lock(&cs->lock);
	while (!cs->readers_tried && cs->nreaders < READERS) {
		if (pthread_create(&cs->reader[cs->nreaders], NULL,
				   reader_main, cs))
			break;
		cs->nreaders++;
	}
	cs->readers_tried = true;
	ok = cs->nreaders > 0;
	if (ok) {
		cs->st.reads_handed++;
		if (cs->jtail)
			cs->jtail->next = j;
		else
			cs->jhead = j;
		cs->jtail = j;
		pthread_cond_signal(&cs->jwake);
	}
	pthread_mutex_unlock(&cs->lock);
	if (!ok) {
		pthread_mutex_lock(&q->mu);
		q->busy--;
		pthread_mutex_unlock(&q->mu);
		free(j);
	}
	return ok;
}

/* Does io need this store (a read of a bound range), or the inner queue?
 * A write or discard unbinds its range first. */
static int prepare(struct cache_store *cs, struct kvp_io *io, bool *ours)
{
	*ours = false;
	if (io->op == KVP_IO_WRITE)
		return unbind_range(cs, io->off, io->len);
	*ours = needs_us(cs, io->off, io->len);
	return 0;
}

static int cs_submit(struct kvp_store_queue *q, struct kvp_io *const *ios,
		     unsigned n)
{
	struct cache_store *cs = q->cs;
	const struct kvp_store_ops *iops = cs->inner->ops;
	unsigned i = 0;

	while (i < n) {
		unsigned j = i;
		bool ours = false, full;
		int err = 0;

		/* the run that goes to the inner queue as it is */
		while (j < n) {
			err = prepare(cs, ios[j], &ours);
			if (err || ours)
				break;
			j++;
		}
		if (j > i) {
			int got = iops->submit(q->inner, ios + i, j - i);

			if (got < 0)
				got = 0;
			i += (unsigned)got;
			if (i < j)
				break; /* the inner queue is full */
		}
		if (i == n)
			break;
		/* ios[i]: ours (a reader's, or read here), or its unbind
		 * failed: complete it here */
		pthread_mutex_lock(&q->mu);
		full = q->nready + q->busy >= q->depth;
		pthread_mutex_unlock(&q->mu);
		if (full)
			break;
		ios[i]->submit_ns = now_ns();
		if (!err && ios[i]->op == KVP_IO_READ &&
		    ios[i]->len >= ASYNC_MIN && hand_off(q, ios[i])) {
			i++;
			continue;
		}
		if (!err)
			err = read_range(cs, ios[i]->buf, ios[i]->len,
					 ios[i]->off);
		ios[i]->result = err ? err : (int64_t)ios[i]->len;
		pthread_mutex_lock(&q->mu);
		ready_push(q, ios[i]);
		pthread_mutex_unlock(&q->mu);
		i++;
	}
	mirror_counters(cs);
	return (int)i;
}

static int cs_queue_fd(struct kvp_store_queue *q)
{
	return q->epfd >= 0 ? q->epfd : q->efd;
}

static int cs_reap(struct kvp_store_queue *q, struct kvp_io **out,
		   unsigned max, unsigned wait)
{
	for (;;) {
		struct pollfd pfd = { .fd = cs_queue_fd(q), .events = POLLIN };
		unsigned n = 0, busy;
		uint64_t cnt;
		int got;

		pthread_mutex_lock(&q->mu);
		while (n < max && q->nready) {
			out[n++] = q->ready[q->ready_head];
			q->ready_head = (q->ready_head + 1) % q->depth;
			q->nready--;
		}
		if (!q->nready)
			(void)!read(q->efd, &cnt, sizeof(cnt));
		busy = q->busy;
		pthread_mutex_unlock(&q->mu);
		if (n == max)
			return (int)n;
		/* the inner queue may wait only when no reader has a job */
		got = q->cs->inner->ops->reap(q->inner, out + n, max - n,
					      wait && !n && !busy);
		if (got < 0)
			return n ? (int)n : got;
		n += (unsigned)got;
		if (n || !wait || !busy)
			return (int)n;
		/* a reader's job, or the inner queue's, completes first */
		(void)poll(&pfd, 1, 100);
	}
}

static int cs_discard(struct kvp_store *s, uint64_t off, uint64_t len)
{
	struct cache_store *cs = to_cs(s);
	uint64_t g, last;

	if (!len)
		return 0;
	/* what is discarded may read as zeros: no copy needed */
	last = (off + len - 1) / cs->granule;
	pthread_mutex_lock(&cs->lock);
	for (g = off / cs->granule; g <= last && g < cs->nmap; g++)
		unbind_one(cs, g);
	pthread_mutex_unlock(&cs->lock);
	return cs->inner->ops->discard
		   ? cs->inner->ops->discard(cs->inner, off, len)
		   : 0;
}

static void cs_destroy(struct kvp_store *s)
{
	struct cache_store *cs = to_cs(s);
	uint32_t i;

	pthread_mutex_lock(&cs->lock);
	cs->stop = true;
	pthread_cond_signal(&cs->wake);
	pthread_cond_broadcast(&cs->jwake);
	pthread_mutex_unlock(&cs->lock);
	if (cs->ahead)
		pthread_join(cs->verifier, NULL);
	for (i = 0; i < cs->nreaders; i++)
		pthread_join(cs->reader[i], NULL);
	for (i = 0; i < cs->nrecs; i++)
		if (cs->recs[i].fd >= 0)
			close(cs->recs[i].fd);
	kvp_store_destroy(cs->inner);
	pthread_mutex_destroy(&cs->lock);
	pthread_cond_destroy(&cs->wake);
	pthread_cond_destroy(&cs->jwake);
	for (i = 0; i < VBUFS; i++)
		free(cs->vbuf[i]);
	free(cs->recs);
	free(cs->map);
	free(cs);
}

static const struct kvp_store_ops cache_store_ops = {
	.kind = "cache",
	.pread = cs_pread,
	.pwrite = cs_pwrite,
	.queue_create = cs_queue_create,
	.queue_destroy = cs_queue_destroy,
	.submit = cs_submit,
	.reap = cs_reap,
	.queue_fd = cs_queue_fd,
	.discard = cs_discard,
	.destroy = cs_destroy,
};

int kvp_cache_store_create(struct kvp_store *inner, struct kvp_cache *cache,
			   size_t granule, struct kvp_store **out)
{
	struct cache_store *cs;

	if (!inner || !cache || !out || !granule) {
		kvp_store_destroy(inner);
		return -EINVAL;
	}
	cs = calloc(1, sizeof(*cs));
	if (!cs) {
		kvp_store_destroy(inner);
		return -ENOMEM;
	}
	cs->inner = inner;
	cs->cache = cache;
	cs->granule = granule;
	cs->nmap = (inner->size + granule - 1) / granule;
	cs->map = calloc(cs->nmap ? cs->nmap : 1, sizeof(*cs->map));
	if (!cs->map) {
		free(cs);
		kvp_store_destroy(inner);
		return -ENOMEM;
	}
	pthread_mutex_init(&cs->lock, NULL);
	pthread_cond_init(&cs->wake, NULL);
	pthread_cond_init(&cs->jwake, NULL);
	cs->base = *inner; /* size, alignment, direct, desc */
	cs->base.ops = &cache_store_ops;
	cs->base.buffered_ios = 0;
	snprintf(cs->base.desc, sizeof(cs->base.desc), "cache over %.100s",
		 inner->desc);
	*out = &cs->base;
	return 0;
}

void kvp_cache_store_stats(struct kvp_store *s,
			   struct kvp_cache_store_stats *out)
{
	struct cache_store *cs = to_cs(s);

	pthread_mutex_lock(&cs->lock);
	*out = cs->st;
	pthread_mutex_unlock(&cs->lock);
}
