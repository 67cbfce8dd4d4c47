/*
 * model_remote.c - a model's prompts through the remote tier, below the
 * prefix cache directory (model_remote.h).
 *
 * Read-ahead: two windows of up to `window` chunks each.  A get that
 * misses the directory takes its chunk from the window that holds it
 * (waiting for the fetch if it is still running) and, when the window
 * after it is not yet asked for, submits it; a chunk in no window starts
 * one at that chunk.  A window's keys are compared with the prompt's at
 * each get, so a new prompt never takes an old prompt's chunk.  A bind
 * takes its chunk the same way, then hands the record to the KV cache's
 * store in a memfd.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lib/cache/cache_store.h"
#include "lib/model/model_remote.h"

struct window {
	uint32_t first, n;	/* chunks [first, first + n) */
	size_t rec_len;		/* bytes of each record */
	bool busy;		/* submitted, not yet done */
	bool valid;		/* done: gets[] say what came */
	struct kvp_rec_key keys[KVP_MODEL_REMOTE_MAX_WINDOW];
	struct kvp_remote_get gets[KVP_MODEL_REMOTE_MAX_WINDOW];
	unsigned char *bufs;	/* n records, rec_len apart */
	size_t cap;		/* bytes at bufs */
	struct kvp_model_remote *mr;
};

struct kvp_model_remote {
	struct kvp_remote *r;
	struct kvp_prefix *prefix;
	struct kvp_rec_cipher cipher;	/* a copy, if has_cipher */
	bool has_cipher;
	uint32_t window;
	char shown_url[512];		/* without the password */
	pthread_mutex_t lock;		/* windows' busy/valid, stats */
	pthread_cond_t cond;		/* a window done */
	struct window win[2];
	struct kvp_model_remote_stats st;
	bool hooked;			/* kvp_prefix_on_stored set */
	/* the chunk the last get took from Redis and queued for the
	 * directory (the prefill's thread alone): a bind of it that
	 * follows (a prompt that attends to its history reads each chunk,
	 * then maps it) does not queue it again */
	struct kvp_rec_key got_key;
	bool got_queued;
	/* the chunk the last get fetched (counted), which a bind of it
	 * next maps without fetching again: counted once */
	uint32_t got_chunk;
	bool got_counted;
};

static void stored(void *arg, const struct kvp_rec_key *k, const void *payload,
		   size_t len);

/* The tier's verify hook: the value is the record of the key asked for
 * (opened in place: a sealed one is decrypted), and nothing after it: a
 * record's check covers only the payload it says it has, and the value's
 * every byte past the header is served as the chunk. */
static int verify(void *arg, const void *key, size_t keylen, void *val,
		  size_t len)
{
	struct kvp_model_remote *mr = arg;
	struct kvp_rec_key k;
	const void *payload;
	uint64_t plen;
	int err;

	if (keylen != sizeof(k))
		return -EINVAL;
	memcpy(&k, key, sizeof(k));
	err = kvp_rec_open(val, len, &k, mr->has_cipher ? &mr->cipher : NULL,
			   &payload, &plen);
	if (!err && plen != len - KVP_REC_HEADER_BYTES)
		return -EBADMSG;
	return err;
}

/* The tier's encode hook, on its publisher thread: seal the record. */
static int encode(void *arg, const void *key, size_t keylen, const void *val,
		  size_t len, void **out, size_t *outlen)
{
	struct kvp_model_remote *mr = arg;
	struct kvp_rec_key k;
	void *rec;
	int err;

	if (keylen != sizeof(k))
		return -EINVAL;
	memcpy(&k, key, sizeof(k));
	rec = malloc(kvp_rec_size(len));
	if (!rec)
		return -ENOMEM;
	err = kvp_rec_seal(&k, val, len, mr->has_cipher ? &mr->cipher : NULL,
			   rec);
	if (err) {
		free(rec);
		return err;
	}
	*out = rec;
	*outlen = kvp_rec_size(len);
	return 0;
}

int kvp_model_remote_open(const struct kvp_model_remote_opts *o,
			  struct kvp_model_remote **out, char *err,
			  size_t errlen)
{
	struct kvp_remote_config rc = { .url = o->url, .verify = verify,
					.encode = encode };
	struct kvp_model_remote *mr;
	uint8_t ns[32];
	int e;

	*out = NULL;
	if (!o->prefix || !o->ctx || o->window > KVP_MODEL_REMOTE_MAX_WINDOW)
		return -EINVAL;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->prefix = o->prefix;
	mr->window = o->window ? o->window : KVP_MODEL_REMOTE_WINDOW;
	if (o->cipher) {
		mr->cipher = *o->cipher;
		mr->has_cipher = true;
	}
	kvp_remote_url_redact(o->url, mr->shown_url, sizeof(mr->shown_url));
	pthread_mutex_init(&mr->lock, NULL);
	pthread_cond_init(&mr->cond, NULL);
	mr->win[0].mr = mr->win[1].mr = mr;
	/* The namespace: a hash of the whole key context, so that no
	 * other model, geometry or salt shares a Redis key with this one. */
	e = kvp_rec_hash(o->ctx, sizeof(*o->ctx), ns);
	if (e) {
		snprintf(err, errlen, "remote: cannot hash the key context");
		goto fail;
	}
	rc.ns = ns;
	rc.ns_len = 16;
	rc.verify_arg = rc.encode_arg = mr;
	e = kvp_remote_open(&rc, &mr->r, err, errlen);
	if (e)
		goto fail;
	kvp_prefix_on_stored(mr->prefix, stored, mr);
	mr->hooked = true;
	*out = mr;
	return 0;
fail:
	kvp_model_remote_close(mr, 0);
	return e;
}

void kvp_model_remote_close(struct kvp_model_remote *mr, unsigned flush_ms)
{
	if (!mr)
		return;
	if (mr->hooked) {
		/* the chunks still queued are published first (A's are what
		 * B will read), then the hook goes */
		kvp_prefix_drain(mr->prefix);
		kvp_prefix_on_stored(mr->prefix, NULL, NULL);
	}
	if (mr->r && flush_ms)
		kvp_remote_flush(mr->r, flush_ms);
	/* completes every window still asked for (running or cancelled) */
	kvp_remote_close(mr->r);
	for (int i = 0; i < 2; i++)
		free(mr->win[i].bufs);
	pthread_cond_destroy(&mr->cond);
	pthread_mutex_destroy(&mr->lock);
	memset(&mr->cipher, 0, sizeof(mr->cipher));
	free(mr);
}

static void window_done(void *arg, struct kvp_remote_get *gets, size_t n,
			int hits)
{
	struct window *w = arg;

	pthread_mutex_lock(&w->mr->lock);
	w->busy = false;
	w->valid = true;
	pthread_cond_broadcast(&w->mr->cond);
	pthread_mutex_unlock(&w->mr->lock);
}

/* Under mr->lock: wait until @w's fetch, if any, is over. */
static void window_wait(struct kvp_model_remote *mr, struct window *w)
{
	while (w->busy)
		pthread_cond_wait(&mr->cond, &mr->lock);
}

/* Under mr->lock, @w not busy: ask for the chunks from @first (as far as
 * the prompt has full chunks).  False when there is none or it fails. */
static bool window_submit(struct kvp_model_remote *mr, struct window *w,
			  uint32_t first, size_t rec_len)
{
	uint32_t n = 0;

	w->valid = false;
	while (n < mr->window &&
	       !kvp_prefix_key(mr->prefix, first + n, &w->keys[n]))
		n++;
	if (!n)
		return false;
	if (w->cap < n * rec_len) {
		free(w->bufs);
		w->bufs = malloc(n * rec_len);
		w->cap = w->bufs ? n * rec_len : 0;
		if (!w->bufs)
			return false;
	}
	w->first = first;
	w->n = n;
	w->rec_len = rec_len;
	for (uint32_t i = 0; i < n; i++)
		w->gets[i] = (struct kvp_remote_get){
			.key = &w->keys[i], .key_len = sizeof(w->keys[i]),
			.buf = w->bufs + i * rec_len, .buf_len = rec_len };
	w->busy = true;
	if (kvp_remote_fetch_submit(mr->r, w->gets, n, window_done, w)) {
		w->busy = false;
		return false;
	}
	return true;
}

/* Under mr->lock: does @w hold (or fetch) @chunk of this prompt? */
static bool window_has(struct kvp_model_remote *mr, const struct window *w,
		       uint32_t chunk, size_t rec_len)
{
	struct kvp_rec_key k;

	if (!(w->busy || w->valid) || w->rec_len != rec_len ||
	    chunk < w->first || chunk >= w->first + w->n)
		return false;
	return !kvp_prefix_key(mr->prefix, chunk, &k) &&
	       !memcmp(&k, &w->keys[chunk - w->first], sizeof(k));
}

/*
 * Under mr->lock: chunk's record (rec_len bytes) from its window, the
 * window after it asked for meanwhile (read-ahead); waits for the fetch.
 * The verified record, opened in place, or NULL (a miss).  It stays
 * valid until the next call: only the prefilling thread submits.
 */
static const unsigned char *window_take(struct kvp_model_remote *mr,
					uint32_t chunk, size_t rec_len)
{
	struct window *w = NULL, *other;
	struct kvp_remote_get *g;

	for (int i = 0; i < 2 && !w; i++)
		if (window_has(mr, &mr->win[i], chunk, rec_len))
			w = &mr->win[i];
	if (!w) {
		/* a window of its own: the one not running, else wait */
		w = mr->win[0].busy ? &mr->win[1] : &mr->win[0];
		window_wait(mr, w);
		if (!window_submit(mr, w, chunk, rec_len))
			return NULL;
	}
	other = w == &mr->win[0] ? &mr->win[1] : &mr->win[0];
	/* read ahead: the window after this one, fetched meanwhile */
	if (!window_has(mr, other, w->first + w->n, rec_len) && !other->busy)
		window_submit(mr, other, w->first + w->n, rec_len);
	window_wait(mr, w);
	g = &w->gets[chunk - w->first];
	return !g->status && g->len == rec_len ? g->buf : NULL;
}

/* Chunk @chunk from Redis into @buf (@len bytes of payload). */
static int remote_get(struct kvp_model_remote *mr, uint32_t chunk, void *buf,
		      size_t len)
{
	const unsigned char *rec;
	int err = -ENOENT;

	pthread_mutex_lock(&mr->lock);
	rec = window_take(mr, chunk, kvp_rec_size(len));
	if (rec) {
		/* verify opened the record: its payload follows the header */
		memcpy(buf, rec + KVP_REC_HEADER_BYTES, len);
		err = 0;
	}
	if (err) {
		mr->st.chunks_missed++;
	} else {
		mr->st.chunks_fetched++;
		mr->got_chunk = chunk;
		mr->got_counted = true;
	}
	pthread_mutex_unlock(&mr->lock);
	return err;
}

static int write_all(int fd, const void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write(fd, (const char *)buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	return 0;
}

int kvp_model_remote_bind(struct kvp_model_remote *mr, uint32_t chunk,
			  struct kvp_store *store, size_t len,
			  const uint64_t *offs, size_t n)
{
	size_t rec_len = kvp_rec_size(len);
	const unsigned char *rec;
	struct kvp_rec_key k;
	int fd, err, dir_err;

	/* a sealed record is decrypted whole: read and copied (get) */
	if (mr->has_cipher)
		return -EOPNOTSUPP;
	err = kvp_prefix_key(mr->prefix, chunk, &k);
	if (err)
		return err;
	pthread_mutex_lock(&mr->lock);
	rec = window_take(mr, chunk, rec_len);
	pthread_mutex_unlock(&mr->lock);
	if (!rec)
		return -ENOENT; /* counted by the get that follows */
	/* its window is not asked for again until this thread's next
	 * call: the record is read outside the lock */
	fd = memfd_create("kvp-remote-chunk", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	err = write_all(fd, rec, rec_len);
	if (err) {
		close(fd);
		return err;
	}
	/* next time from the directory: the writer stores this memfd's
	 * record as it is (no copy, no second checksum; queued before the
	 * store owns fd, which may close it), behind the first token when
	 * the run holds the writer.  Copying it into the writer's queue
	 * here cost B 8.7-20.6 s of first touches, checksums and syncs at
	 * 16K tokens of random:llama3-8b. */
	dir_err = mr->got_queued && !memcmp(&mr->got_key, &k, sizeof(k))
			  ? 0
			  : kvp_prefix_put_fd(mr->prefix, chunk, fd, len);
	mr->got_queued = false;
	/* verified by the tier's hook (kvp_rec_open against k) */
	err = kvp_cache_store_bind_fd(store, &k, fd, len, true, offs, n);
	if (err)
		return err;
	pthread_mutex_lock(&mr->lock);
	/* a model that attends to its prefix in prefill read it (get) */
	if (!mr->got_counted || mr->got_chunk != chunk)
		mr->st.chunks_fetched++;
	mr->got_counted = false;
	mr->st.chunks_mapped++;
	mr->st.dir_skipped += dir_err != 0;
	pthread_mutex_unlock(&mr->lock);
	return 0;
}

int kvp_model_remote_get(void *arg, uint32_t chunk, void *buf, size_t len)
{
	struct kvp_model_remote *mr = arg;
	int err = kvp_prefix_get(mr->prefix, chunk, buf, len);

	if (!err)
		return 0;
	err = remote_get(mr, chunk, buf, len);
	if (!err) { /* next time from the directory, not published back */
		/* only a chunk queued spares the bind its put_fd: one that
		 * failed to queue (no memory) goes to the directory that way */
		mr->got_queued =
		    !kvp_prefix_put_local(mr->prefix, chunk, buf, len) &&
		    !kvp_prefix_key(mr->prefix, chunk, &mr->got_key);
	}
	return err;
}

void kvp_model_remote_put(void *arg, uint32_t chunk, const void *payload,
			  size_t len)
{
	struct kvp_model_remote *mr = arg;

	/* published by stored() on the directory's writer thread */
	kvp_prefix_put(mr->prefix, chunk, payload, len);
}

/* The directory's writer stored (or failed to store) a computed chunk:
 * publish it, off the prefill's thread and, when the run holds the
 * writer, behind the first token.  The copy into the publish queue and
 * its first touches (some 25 ms an 8 MiB chunk here) were on A's
 * prefill. */
static void stored(void *arg, const struct kvp_rec_key *k, const void *payload,
		   size_t len)
{
	struct kvp_model_remote *mr = arg;
	int err = kvp_remote_publish(mr->r, k, sizeof(*k), payload, len);

	pthread_mutex_lock(&mr->lock);
	if (err)
		mr->st.publish_skipped++;
	else
		mr->st.chunks_published++;
	pthread_mutex_unlock(&mr->lock);
}

void kvp_model_remote_stats(struct kvp_model_remote *mr,
			    struct kvp_model_remote_stats *ms,
			    struct kvp_remote_stats *rs)
{
	pthread_mutex_lock(&mr->lock);
	if (ms)
		*ms = mr->st;
	pthread_mutex_unlock(&mr->lock);
	if (rs)
		kvp_remote_stats_read(mr->r, rs);
}

const char *kvp_model_remote_url(const struct kvp_model_remote *mr)
{
	return mr->shown_url;
}

struct kvp_remote *kvp_model_remote_tier(struct kvp_model_remote *mr)
{
	return mr->r;
}
