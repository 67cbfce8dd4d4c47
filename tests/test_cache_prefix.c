/* test_cache_prefix.c - a prompt's chunks in a cache directory: chained
 * keys, the writer thread, read-ahead, misses. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/cache/prefix.h"
#include "tests/helpers/helpers.h"

#define C   16u   /* tokens per chunk */
#define LEN 3000u /* payload bytes per chunk */

static char dir[] = "/tmp/kvp-prefix-XXXXXX";
static struct kvp_cache *cache;

static void setup(void)
{
	strcpy(dir, "/tmp/kvp-prefix-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &cache, NULL, 0, NULL, 0),
			 0);
}

static void teardown(void)
{
	kvp_cache_close(cache);
	kvp_test_rm_tree(dir);
}

static struct kvp_prefix *prefix_of(const char *salt)
{
	struct kvp_prefix_opts o = { .cache = cache };
	struct kvp_prefix *p = NULL;

	kvp_rec_hash("model", 5, o.ctx.model);
	if (salt)
		kvp_rec_hash(salt, strlen(salt), o.ctx.salt);
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	return p;
}

/* Chunk i's payload for prompt seed s. */
static void fill(unsigned char *b, uint32_t i, uint32_t s)
{
	kvp_test_fill(b, LEN & ~7u, 100 * s + i, 0);
}

static void prompt(uint32_t *t, uint32_t n, uint32_t s)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = i * 31 + s;
}

/* Chunks 0 .. n-1 of seed s read back through p, each equal to what was
 * put. */
static void expect_chunks(struct kvp_prefix *p, uint32_t n, uint32_t s)
{
	unsigned char want[LEN], got[LEN];

	for (uint32_t i = 0; i < n; i++) {
		fill(want, i, s);
		ck_assert_int_eq(kvp_prefix_get(p, i, got, LEN), 0);
		ck_assert_mem_eq(got, want, LEN);
	}
}

START_TEST(store_then_read_ahead)
{
	struct kvp_prefix *p = prefix_of(NULL);
	struct kvp_prefix_stats st;
	unsigned char want[LEN], got[LEN];
	uint32_t t[10 * C + 5], i;

	prompt(t, 10 * C + 5, 1);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 10 * C + 5, C), 0);
	for (i = 0; i < 10; i++) {
		fill(want, i, 1);
		kvp_prefix_put(p, i, want, LEN);
	}
	kvp_prefix_put(p, 10, want, LEN); /* past the prompt's chunks */
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.queued, 11);
	ck_assert_uint_eq(st.stored, 10);
	ck_assert_uint_eq(st.failed, 1);
	/* a new prefix reads them back in order, read ahead */
	kvp_prefix_destroy(p);
	p = prefix_of(NULL);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 10 * C + 5, C), 0);
	expect_chunks(p, 10, 1);
	ck_assert_int_eq(kvp_prefix_get(p, 10, got, LEN), -ENOENT);
	/* another length: a miss, nothing served */
	ck_assert_int_eq(kvp_prefix_get(p, 3, got, LEN - 1), -EMSGSIZE);
	/* a prompt that differs in chunk 4: chunks 0-3 hit, 4 on miss */
	t[4 * C + 2]++;
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 10 * C + 5, C), 0);
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(kvp_prefix_get(p, i, got, LEN), 0);
	for (i = 4; i < 10; i++)
		ck_assert_int_eq(kvp_prefix_get(p, i, got, LEN), -ENOENT);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.hit_chunks, 14);
	kvp_prefix_destroy(p);
}
END_TEST

/* Reopen the directory as the cache of cipher key byte v (0: plain). */
static void reopen(uint8_t v)
{
	struct kvp_rec_cipher ci;
	struct kvp_cache_opts o = { .cipher = v ? &ci : NULL };

	memset(ci.key, v, sizeof(ci.key));
	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
}

/* Two cipher keys and none share a directory: each names its chunks
 * apart, so none is dropped as another's, none counts another's as
 * stored already, and none writes over another's. */
/* Store (or read) prompt s's first n chunks through p. */
static void run_prompt(struct kvp_prefix *p, uint32_t n, uint32_t s,
		       bool put)
{
	unsigned char b[LEN];
	uint32_t t[8 * C + 1];

	prompt(t, n * C + 1, s);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, n * C + 1, C), 0);
	if (!put) {
		expect_chunks(p, n, s);
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		fill(b, i, s);
		kvp_prefix_put(p, i, b, LEN);
	}
	kvp_prefix_drain(p);
}

/* Prompt s's chunks that hit, from the first on. */
static uint32_t hits(struct kvp_prefix *p, uint32_t n, uint32_t s)
{
	unsigned char b[LEN];
	uint32_t t[8 * C + 1], i;

	prompt(t, n * C + 1, s);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, n * C + 1, C), 0);
	for (i = 0; i < n && !kvp_prefix_get(p, i, b, LEN); i++)
		;
	return i;
}

/* Eviction takes a prompt's last chunks first: a chunk is found only
 * through every chunk before it, so a prompt whose first chunk went
 * would keep the rest as dead weight, and one whose last went still
 * serves the others; after a restart too. */
START_TEST(evicts_last_chunks_first)
{
	struct kvp_cache_opts o = { .capacity_bytes = 6 * 4096 };
	struct kvp_prefix *p;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	run_prompt(p, 4, 1, true);  /* A */
	run_prompt(p, 4, 1, false); /* A again: its 4 chunks hit */
	run_prompt(p, 4, 2, true);  /* B: two of A's go */
	ck_assert_uint_eq(hits(p, 4, 1), 2); /* A's first two stay */
	ck_assert_uint_eq(hits(p, 4, 2), 4);
	kvp_prefix_destroy(p);
	/* the order survives a restart: one fewer block takes the last
	 * chunk of A, the prompt used least recently */
	kvp_cache_close(cache);
	o.capacity_bytes = 5 * 4096;
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	ck_assert_uint_eq(hits(p, 4, 2), 4);
	ck_assert_uint_eq(hits(p, 4, 1), 1);
	kvp_prefix_destroy(p);
}
END_TEST

/* A prompt longer than a full cache keeps its first chunks: a later
 * chunk, older than every block there, is the one evicted, at once and
 * never written, not the chunk before it (which would leave the cache's
 * prefix ending one chunk earlier for each chunk past it). */
START_TEST(past_a_full_cache_keeps_the_first)
{
	struct kvp_cache_opts o = { .capacity_bytes = 3 * 4096 };
	struct kvp_cache_stats cs;
	struct kvp_prefix *p;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	run_prompt(p, 6, 1, true);
	ck_assert_uint_eq(hits(p, 6, 1), 3);
	kvp_cache_stats(cache, &cs);
	ck_assert_uint_eq(cs.puts, 3);
	ck_assert_uint_eq(cs.evictions, 3);
	ck_assert_uint_eq(cs.blocks, 3);
	kvp_prefix_destroy(p);
}
END_TEST

/* The order survives a restart from the files' times alone: a prompt's
 * chunks stored apart in time (each later one newer by the clock) still
 * reopen with the first its newest, so the last goes first. */
START_TEST(order_read_back_at_open)
{
	struct kvp_cache_opts o = { .capacity_bytes = 3 * 4096 };
	unsigned char b[LEN];
	uint32_t t[4 * C + 1];
	struct kvp_prefix *p = prefix_of(NULL);

	prompt(t, 4 * C + 1, 1);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	for (uint32_t i = 0; i < 4; i++) {
		fill(b, i, 1);
		kvp_prefix_put(p, i, b, LEN);
		kvp_prefix_drain(p);
		usleep(20000); /* apart by more than a coarse clock's tick */
	}
	kvp_prefix_destroy(p);
	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	ck_assert_uint_eq(hits(p, 4, 1), 3); /* the last chunk went */
	kvp_prefix_destroy(p);
}
END_TEST

/* A prompt's chunks that the writer stores after the next prompt began
 * (held back behind its first token, or still queued) keep their own
 * prompt's order: older than the next prompt's, its first chunk its
 * newest.  B's puts then take A's last chunks, not B's own. */
START_TEST(late_stores_keep_their_order)
{
	struct kvp_cache_opts o = { .capacity_bytes = 6 * 4096 };
	unsigned char b[LEN];
	uint32_t t[4 * C + 1];
	struct kvp_prefix *p;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	prompt(t, 4 * C + 1, 1); /* A: computed, its stores held back */
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	kvp_prefix_hold(p);
	for (uint32_t i = 0; i < 4; i++) {
		fill(b, i, 1);
		kvp_prefix_put(p, i, b, LEN);
	}
	prompt(t, 4 * C + 1, 2); /* B begins before A's are stored */
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	kvp_prefix_drain(p); /* A's four stored now */
	for (uint32_t i = 0; i < 4; i++) {
		fill(b, i, 2);
		kvp_prefix_put(p, i, b, LEN);
	}
	kvp_prefix_drain(p); /* B's four: two of A's go, its last two */
	ck_assert_uint_eq(hits(p, 4, 2), 4);
	ck_assert_uint_eq(hits(p, 4, 1), 2);
	kvp_prefix_destroy(p);
}
END_TEST

/* The cache's file operations, a block's open made slow on demand: the
 * read-ahead's gets then run on while the caller goes on. */
static volatile int slow_open_ms;

static int so_open(void *arg, int dirfd, const char *name, int flags,
		   mode_t mode)
{
	int fd;

	if (slow_open_ms && strstr(name, ".kvb") && !(flags & O_CREAT))
		usleep((useconds_t)slow_open_ms * 1000);
	fd = openat(dirfd, name, flags | O_CLOEXEC, mode);
	return fd < 0 ? -errno : fd;
}

static ssize_t so_pwrite(void *arg, int fd, const void *buf, size_t len,
			 off_t off)
{
	ssize_t n = pwrite(fd, buf, len, off);

	return n < 0 ? -errno : n;
}

/* A block's fsync held on demand: the writer waits inside it, the
 * cache's lock held (as across any store's syncs), until the test lets
 * it go, or for FSYNC_HOLD_S at most: a call that waits for the writer
 * then fails its test instead of hanging it. */
#define FSYNC_HOLD_S 20
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static bool fsync_held;	   /* the next fsync waits */
static bool fsync_waiting; /* the writer waits in one now */
static bool fsync_expired; /* one was let go by FSYNC_HOLD_S */

/* Wait under hold_lock, FSYNC_HOLD_S at most, for *@flag to be @value:
 * whether it came to be. */
static bool hold_wait(const bool *flag, bool value)
{
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += FSYNC_HOLD_S;
	while (*flag != value && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&hold_cond, &hold_lock, &until);
	return *flag == value;
}

static int so_fsync(void *arg, int fd)
{
	pthread_mutex_lock(&hold_lock);
	if (fsync_held) {
		fsync_waiting = true;
		pthread_cond_broadcast(&hold_cond);
		fsync_expired = !hold_wait(&fsync_held, false);
		fsync_held = fsync_waiting = false;
	}
	pthread_mutex_unlock(&hold_lock);
	return fsync(fd) ? -errno : 0;
}

/* Whether the writer still waits in the fsync held: false once the
 * hold expired. */
static bool writer_in_fsync(void)
{
	bool in;

	pthread_mutex_lock(&hold_lock);
	in = fsync_waiting;
	pthread_mutex_unlock(&hold_lock);
	return in;
}

static int so_close(void *arg, int fd)
{
	return close(fd) ? -errno : 0;
}

static int so_rename(void *arg, int dirfd, const char *from, const char *to)
{
	return renameat(dirfd, from, dirfd, to) ? -errno : 0;
}

static int so_unlink(void *arg, int dirfd, const char *name)
{
	return unlinkat(dirfd, name, 0) ? -errno : 0;
}

static const struct kvp_cache_io_ops slow_open_io = {
	.open = so_open,
	.pwrite = so_pwrite,
	.fsync = so_fsync,
	.close = so_close,
	.rename = so_rename,
	.unlink = so_unlink,
};

/* Chunk i's recency: its file's modification time, in ns. */
static uint64_t chunk_use(struct kvp_prefix *p, uint32_t i)
{
	struct kvp_rec_key k;
	struct stat sb;
	char path[256], hex[65];

	ck_assert_int_eq(kvp_prefix_key(p, i, &k), 0);
	kvp_rec_key_hex(&k, hex);
	snprintf(path, sizeof(path), "%s/%s.kvb", dir, hex);
	ck_assert_int_eq(stat(path, &sb), 0);
	return (uint64_t)sb.st_mtim.tv_sec * 1000000000ull +
	       (uint64_t)sb.st_mtim.tv_nsec;
}

/* A chunk put again by the next prompt while the last one's copy was
 * still queued (a turn of a chat: the prompt goes on from the last one)
 * is used by the next prompt: it takes that prompt's place in recency,
 * not the older one's of the copy stored first. */
START_TEST(put_present_is_a_use)
{
	struct kvp_cache_opts o = { .capacity_bytes = 6 * 4096 };
	unsigned char b[LEN];
	uint32_t t[6 * C + 1];
	struct kvp_prefix *p;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	prompt(t, 6 * C + 1, 1); /* A: the first 4 chunks of B */
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	kvp_prefix_hold(p);
	for (uint32_t i = 0; i < 4; i++) {
		fill(b, i, 1);
		kvp_prefix_put(p, i, b, LEN);
	}
	/* B misses (A's still queued), computes and puts all six */
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 6 * C + 1, C), 0);
	for (uint32_t i = 0; i < 6; i++) {
		fill(b, i, 1);
		kvp_prefix_put(p, i, b, LEN);
	}
	kvp_prefix_drain(p);
	run_prompt(p, 2, 3, true); /* C: two of B's go, its last two */
	ck_assert_uint_eq(hits(p, 6, 1), 4);
	kvp_prefix_destroy(p);
}
END_TEST

/* Chunks read ahead of a prompt that are still being read when the next
 * prompt is set are the old prompt's uses: older than its chunk 0 (which
 * the caller got first), not the newest of the next prompt's lookup. */
START_TEST(read_ahead_stays_in_its_lookup)
{
	struct kvp_cache_opts o = { .io = &slow_open_io };
	unsigned char b[LEN];
	uint32_t t[6 * C + 1], u[6 * C + 1];
	struct kvp_prefix *p;
	uint64_t first;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	prompt(t, 6 * C + 1, 1);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 6 * C + 1, C), 0);
	for (uint32_t i = 0; i < 6; i++) {
		fill(b, i, 1);
		kvp_prefix_put(p, i, b, LEN);
	}
	kvp_prefix_drain(p);
	/* A again: chunk 0 got, then the next prompt while 1.. are read */
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 6 * C + 1, C), 0);
	slow_open_ms = 100;
	ck_assert_int_eq(kvp_prefix_get(p, 0, b, LEN), 0);
	first = chunk_use(p, 0);
	prompt(u, 6 * C + 1, 2);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, u, 6 * C + 1, C), 0);
	slow_open_ms = 0;
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 6 * C + 1, C), 0);
	for (uint32_t i = 1; i < 5; i++)
		ck_assert_msg(chunk_use(p, i) < first,
			      "chunk %u read ahead of prompt A is newer than "
			      "its chunk 0: %llu > %llu",
			      i, (unsigned long long)chunk_use(p, i),
			      (unsigned long long)first);
	kvp_prefix_destroy(p);
}
END_TEST

/* A put queues its chunk and returns: taking the chunk's recency when it
 * is queued must not wait for the store the writer is making (the
 * cache's lock is held across a put's writes and syncs), nor must the
 * next prompt's lookup.  Both run while the writer is held in chunk 0's
 * fsync, and must return with it still there. */
START_TEST(put_does_not_wait_for_the_disk)
{
	struct kvp_cache_opts o = { .io = &slow_open_io };
	unsigned char b[LEN];
	uint32_t t[4 * C + 1];
	struct kvp_prefix *p;
	bool reached;

	kvp_cache_close(cache);
	ck_assert_int_eq(kvp_cache_open(dir, &o, &cache, NULL, 0, NULL, 0), 0);
	p = prefix_of(NULL);
	prompt(t, 4 * C + 1, 1);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	pthread_mutex_lock(&hold_lock);
	fsync_held = true;
	pthread_mutex_unlock(&hold_lock);
	fill(b, 0, 1);
	kvp_prefix_put(p, 0, b, LEN);
	pthread_mutex_lock(&hold_lock);
	reached = hold_wait(&fsync_waiting, true);
	pthread_mutex_unlock(&hold_lock);
	ck_assert_msg(reached, "the writer never reached its fsync");
	fill(b, 1, 1);
	kvp_prefix_put(p, 1, b, LEN);
	ck_assert_msg(writer_in_fsync(),
		      "a put waited for the writer's store: it returned only "
		      "once the held fsync expired after %d s",
		      FSYNC_HOLD_S);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	ck_assert_msg(writer_in_fsync(),
		      "set_prompt waited for the writer's store: it returned "
		      "only once the held fsync expired after %d s",
		      FSYNC_HOLD_S);
	pthread_mutex_lock(&hold_lock);
	fsync_held = false;
	pthread_cond_broadcast(&hold_cond);
	pthread_mutex_unlock(&hold_lock);
	kvp_prefix_drain(p);
	ck_assert(!fsync_expired);
	ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 4 * C + 1, C), 0);
	expect_chunks(p, 2, 1);
	kvp_prefix_destroy(p);
}
END_TEST

START_TEST(cipher_keys_share_a_directory)
{
	static const uint8_t keys[] = { 0x41, 0x42, 0 };
	unsigned char want[LEN], got[LEN];
	struct kvp_cache_stats cs;
	struct kvp_prefix *p;
	uint32_t t[3 * C + 1], i, k;

	prompt(t, 3 * C + 1, 1);
	for (k = 0; k < 3; k++) {
		reopen(keys[k]);
		p = prefix_of(NULL);
		ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 3 * C + 1, C), 0);
		ck_assert_int_eq(kvp_prefix_get(p, 0, got, LEN), -ENOENT);
		for (i = 0; i < 3; i++) {
			fill(want, i, k + 1);
			kvp_prefix_put(p, i, want, LEN);
		}
		kvp_prefix_destroy(p);
		kvp_cache_stats(cache, &cs);
		ck_assert_uint_eq(cs.dropped_unauth, 0);
		ck_assert_uint_eq(cs.puts_present, 0);
		ck_assert_uint_eq(cs.puts, 3);
	}
	for (k = 0; k < 3; k++) {
		reopen(keys[k]);
		p = prefix_of(NULL);
		ck_assert_int_eq(kvp_prefix_set_prompt(p, t, 3 * C + 1, C), 0);
		expect_chunks(p, 3, k + 1);
		kvp_prefix_destroy(p);
		kvp_cache_stats(cache, &cs);
		ck_assert_uint_eq(cs.blocks, 9);
		ck_assert_uint_eq(cs.dropped_unauth, 0);
	}
}
END_TEST

START_TEST(salts_part)
{
	struct kvp_prefix *a = prefix_of("tenant-a"), *b = prefix_of("tenant-b");
	unsigned char buf[LEN];
	uint32_t t[2 * C];

	prompt(t, 2 * C, 2);
	kvp_prefix_set_prompt(a, t, 2 * C, C);
	kvp_prefix_set_prompt(b, t, 2 * C, C);
	fill(buf, 0, 2);
	kvp_prefix_put(a, 0, buf, LEN);
	kvp_prefix_drain(a);
	ck_assert_int_eq(kvp_prefix_get(b, 0, buf, LEN), -ENOENT);
	ck_assert_int_eq(kvp_prefix_get(a, 0, buf, LEN), 0);
	kvp_prefix_destroy(a);
	kvp_prefix_destroy(b);
}
END_TEST

START_TEST(skips_and_rereads)
{
	struct kvp_prefix *p = prefix_of(NULL);
	unsigned char want[LEN], got[LEN];
	uint32_t t[12 * C + 1], i;

	prompt(t, 12 * C + 1, 3);
	kvp_prefix_set_prompt(p, t, 12 * C + 1, C);
	for (i = 0; i < 12; i++) {
		fill(want, i, 3);
		kvp_prefix_put(p, i, want, LEN);
	}
	kvp_prefix_drain(p);
	kvp_prefix_set_prompt(p, t, 12 * C + 1, C);
	/* out of order: a skip, a step back, the same twice */
	for (i = 0; i < 12; i += 3) {
		fill(want, i, 3);
		ck_assert_int_eq(kvp_prefix_get(p, i, got, LEN), 0);
		ck_assert_mem_eq(got, want, LEN);
	}
	fill(want, 1, 3);
	ck_assert_int_eq(kvp_prefix_get(p, 1, got, LEN), 0);
	ck_assert_mem_eq(got, want, LEN);
	ck_assert_int_eq(kvp_prefix_get(p, 1, got, LEN), 0);
	ck_assert_mem_eq(got, want, LEN);
	kvp_prefix_destroy(p);
}
END_TEST

#define TRY_CHUNKS 64

/*
 * try_put never waits: with a queue of one chunk, puts made faster than
 * the writer stores (and syncs) them are refused, -EAGAIN, neither queued
 * nor counted; the others are stored, and read back right.
 */
START_TEST(try_put_skips_when_full)
{
	struct kvp_prefix_opts o = { .cache = cache, .queue_bytes = LEN };
	struct kvp_prefix *p = NULL;
	struct kvp_prefix_stats st;
	unsigned char want[LEN], got[LEN];
	uint32_t t[TRY_CHUNKS * C + 1], i, queued = 0;
	bool in[TRY_CHUNKS];

	kvp_rec_hash("model", 5, o.ctx.model);
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	prompt(t, TRY_CHUNKS * C + 1, 4);
	kvp_prefix_set_prompt(p, t, TRY_CHUNKS * C + 1, C);
	for (i = 0; i < TRY_CHUNKS; i++) {
		int rc;

		fill(want, i, 4);
		rc = kvp_prefix_try_put(p, i, want, LEN);
		ck_assert_msg(rc == 0 || rc == -EAGAIN, "try_put: %d", rc);
		in[i] = rc == 0;
		queued += in[i];
	}
	/* no such chunk (or a full queue) */
	ck_assert_int_ne(kvp_prefix_try_put(p, TRY_CHUNKS + 5, want, 1), 0);
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	/* one fsync'd store a chunk against a copy of 3000 bytes */
	ck_assert_uint_lt(queued, TRY_CHUNKS);
	ck_assert_uint_ge(queued, 1);
	ck_assert_uint_eq(st.stored, queued);
	ck_assert_uint_eq(st.queue_waits, 0);
	kvp_prefix_set_prompt(p, t, TRY_CHUNKS * C + 1, C);
	for (i = 0; i < TRY_CHUNKS; i++) {
		fill(want, i, 4);
		ck_assert_int_eq(kvp_prefix_get(p, i, got, LEN),
				 in[i] ? 0 : -ENOENT);
		if (in[i])
			ck_assert_mem_eq(got, want, LEN);
	}
	kvp_prefix_destroy(p);
}
END_TEST

/*
 * Write behind: while held, nothing is stored (the queue is below its
 * high water mark); after the release every chunk is, and so are chunks
 * put after the release (a run's, offered at its first token), all
 * counted in behind, and read back right.  A hold with a queue of 4 chunks still takes 20
 * puts (the writer stores for room: bounded memory, no deadlock).
 */
START_TEST(hold_then_release)
{
	struct kvp_prefix_opts o = { .cache = cache, .queue_bytes = 64 * LEN };
	struct kvp_prefix *p = NULL;
	struct kvp_prefix_stats st;
	unsigned char want[LEN];
	uint32_t t[20 * C + 1], i;
	struct kvp_rec_key k;

	kvp_rec_hash("model", 5, o.ctx.model);
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	prompt(t, 20 * C + 1, 5);
	kvp_prefix_set_prompt(p, t, 20 * C + 1, C);
	kvp_prefix_hold(p);
	for (i = 0; i < 18; i++) {
		fill(want, i, 5);
		kvp_prefix_put(p, i, want, LEN);
	}
	/* give a writer that would store every chance to (not a bound) */
	usleep(100 * 1000);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 0);
	for (i = 0; i < 18; i++) {
		ck_assert_int_eq(kvp_prefix_key(p, i, &k), 0);
		ck_assert(!kvp_cache_contains(cache, &k));
	}
	kvp_prefix_release(p);
	for (; i < 20; i++) {
		fill(want, i, 5);
		kvp_prefix_put(p, i, want, LEN);
	}
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 20);
	ck_assert_uint_eq(st.behind, 20);
	expect_chunks(p, 20, 5);
	kvp_prefix_destroy(p);

	/* a small queue: held puts past it make the writer store */
	o.queue_bytes = 4 * LEN;
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	prompt(t, 20 * C + 1, 6);
	kvp_prefix_set_prompt(p, t, 20 * C + 1, C);
	kvp_prefix_hold(p);
	for (i = 0; i < 20; i++) {
		fill(want, i, 6);
		kvp_prefix_put(p, i, want, LEN);
	}
	kvp_prefix_stats(p, &st);
	ck_assert_uint_ge(st.stored + st.failed, 16);
	ck_assert_uint_gt(st.queue_waits, 0);
	/* destroy stores what is still held */
	kvp_prefix_destroy(p);
	p = prefix_of(NULL);
	kvp_prefix_set_prompt(p, t, 20 * C + 1, C);
	expect_chunks(p, 20, 6);
	kvp_prefix_destroy(p);
}
END_TEST

/* A memfd holding chunk i's record (sealed under key k), or -1. */
static int record_fd(const struct kvp_rec_key *k, const void *payload,
		     size_t len)
{
	size_t rl = kvp_rec_size(len);
	void *rec = malloc(rl);
	int fd = memfd_create("test-rec", MFD_CLOEXEC);

	ck_assert_ptr_nonnull(rec);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(kvp_rec_seal(k, payload, len, NULL, rec), 0);
	ck_assert_int_eq(write(fd, rec, rl), (ssize_t)rl);
	free(rec);
	return fd;
}

/*
 * put_fd stores a record as it is, from the caller's descriptor (closed
 * by the caller at once: the writer has its own); a record of another
 * key or length is refused by the cache, counted failed, not stored.
 */
START_TEST(put_fd_stores_the_record)
{
	struct kvp_prefix *p = prefix_of(NULL);
	struct kvp_prefix_stats st;
	unsigned char want[LEN], got[LEN];
	uint32_t t[4 * C + 1];
	struct kvp_rec_key k0, k1;
	int fd;

	prompt(t, 4 * C + 1, 7);
	kvp_prefix_set_prompt(p, t, 4 * C + 1, C);
	kvp_prefix_key(p, 0, &k0);
	kvp_prefix_key(p, 1, &k1);
	kvp_prefix_hold(p);
	fill(want, 0, 7);
	fd = record_fd(&k0, want, LEN);
	ck_assert_int_eq(kvp_prefix_put_fd(p, 0, fd, LEN), 0);
	close(fd);
	/* chunk 1 given chunk 0's record: refused */
	fd = record_fd(&k0, want, LEN);
	ck_assert_int_eq(kvp_prefix_put_fd(p, 1, fd, LEN), 0);
	close(fd);
	/* chunk 2 given a shorter record than said */
	fd = record_fd(&k1, want, LEN - 8);
	ck_assert_int_eq(kvp_prefix_put_fd(p, 2, fd, LEN), 0);
	close(fd);
	ck_assert_int_eq(kvp_prefix_put_fd(p, 9, 0, LEN), -ENOENT);
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 1);
	ck_assert_uint_eq(st.failed, 3);
	ck_assert_uint_eq(st.behind, 1); /* failed stores are not behind */
	ck_assert_int_eq(kvp_prefix_get(p, 0, got, LEN), 0);
	ck_assert_mem_eq(got, want, LEN);
	ck_assert(!kvp_cache_contains(cache, &k1));
	kvp_prefix_destroy(p);
}
END_TEST

/* Poll stats until pred holds (true) or about 20 s pass (false): a
 * bound for a broken writer, not a duration asserted. */
static bool wait_stats(struct kvp_prefix *p, struct kvp_prefix_stats *st,
		       bool (*pred)(const struct kvp_prefix_stats *, uint64_t),
		       uint64_t arg)
{
	for (int i = 0; i < 2000; i++) {
		kvp_prefix_stats(p, st);
		if (pred(st, arg))
			return true;
		usleep(10 * 1000);
	}
	return false;
}

static bool stored_at_least(const struct kvp_prefix_stats *st, uint64_t n)
{
	return st->stored >= n;
}

/*
 * A new hold holds only its own chunks: those queued under an earlier
 * hold, released, are stored while the new one lasts (a second request
 * sharing the first's prefix finds them), counted behind.
 */
START_TEST(new_hold_stores_earlier_chunks)
{
	struct kvp_prefix_opts o = { .cache = cache, .queue_bytes = 64 * LEN };
	struct kvp_prefix *p = NULL;
	struct kvp_prefix_stats st;
	unsigned char want[LEN];
	uint32_t t[8 * C + 1], i;

	kvp_rec_hash("model", 5, o.ctx.model);
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	prompt(t, 8 * C + 1, 11);
	kvp_prefix_set_prompt(p, t, 8 * C + 1, C);
	kvp_prefix_hold(p);
	for (i = 0; i < 8; i++) {
		fill(want, i, 11);
		kvp_prefix_put(p, i, want, LEN);
	}
	kvp_prefix_release(p);
	/* the next request holds at once, before the writer is done */
	kvp_prefix_hold(p);
	prompt(t, 8 * C + 1, 12);
	kvp_prefix_set_prompt(p, t, 8 * C + 1, C);
	fill(want, 0, 12);
	kvp_prefix_put(p, 0, want, LEN);
	ck_assert_msg(wait_stats(p, &st, stored_at_least, 8),
		      "the first request's chunks wait for the second's hold: "
		      "%llu of 8 stored",
		      (unsigned long long)st.stored);
	ck_assert_uint_eq(st.behind, 8);
	ck_assert_uint_eq(st.stored, 8); /* the new hold's own chunk waits */
	kvp_prefix_release(p);
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 9);
	ck_assert_uint_eq(st.behind, 9);
	kvp_prefix_destroy(p);
}
END_TEST

/*
 * The queue counts the memory its buffers take: a payload just over a
 * huge page (2 MiB) takes two, 4 MiB, so two of them pass a held queue's
 * high water mark of 9 MiB (three quarters: 6.75) and the writer stores;
 * counted by their lengths (4 MiB and some) they would stay held.
 */
START_TEST(queue_counts_huge_pages)
{
	struct kvp_prefix_opts o = { .cache = cache,
				     .queue_bytes = 9u << 20 };
	size_t len = (2u << 20) + 4096;
	unsigned char *big = malloc(len);
	struct kvp_prefix *p = NULL;
	struct kvp_prefix_stats st;
	uint32_t t[2 * C + 1];

	ck_assert_ptr_nonnull(big);
	memset(big, 7, len);
	kvp_rec_hash("model", 5, o.ctx.model);
	ck_assert_int_eq(kvp_prefix_create(&o, &p), 0);
	prompt(t, 2 * C + 1, 13);
	kvp_prefix_set_prompt(p, t, 2 * C + 1, C);
	kvp_prefix_hold(p);
	kvp_prefix_put(p, 0, big, len);
	kvp_prefix_put(p, 1, big, len);
	ck_assert_msg(wait_stats(p, &st, stored_at_least, 1),
		      "held past its high water mark, nothing stored");
	kvp_prefix_release(p);
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 2);
	kvp_prefix_destroy(p);
	free(big);
}
END_TEST

/*
 * put_fd jobs hold a descriptor each: with RLIMIT_NOFILE at 64 a held
 * writer stores them past 16 (a quarter), and put_fd waits past 32, so
 * 48 of them never hold more than 32 descriptors, and all are stored.
 */
START_TEST(put_fd_descriptors_bounded)
{
	struct rlimit rl, low;
	struct kvp_prefix *p;
	struct kvp_prefix_stats st;
	unsigned char want[LEN];
	uint32_t t[48 * C + 1], i;
	struct kvp_rec_key k;
	int fd;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	low = rl;
	low.rlim_cur = 64;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	p = prefix_of(NULL);
	prompt(t, 48 * C + 1, 13);
	kvp_prefix_set_prompt(p, t, 48 * C + 1, C);
	kvp_prefix_hold(p);
	for (i = 0; i < 48; i++) {
		kvp_prefix_key(p, i, &k);
		fill(want, i, 13);
		fd = record_fd(&k, want, LEN);
		ck_assert_int_eq(kvp_prefix_put_fd(p, i, fd, LEN), 0);
		close(fd);
	}
	ck_assert_msg(wait_stats(p, &st, stored_at_least, 48 - 16),
		      "held put_fd jobs keep their descriptors: %llu stored",
		      (unsigned long long)st.stored);
	kvp_prefix_release(p);
	kvp_prefix_drain(p);
	kvp_prefix_stats(p, &st);
	ck_assert_uint_eq(st.stored, 48);
	ck_assert_uint_eq(st.failed, 0);
	expect_chunks(p, 48, 13);
	kvp_prefix_destroy(p);
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
}
END_TEST

struct seen {
	pthread_t putter;
	unsigned calls, on_putter, wrong;
	uint32_t seed;
	struct kvp_prefix *p;
};

static void on_stored(void *arg, const struct kvp_rec_key *k,
		      const void *payload, size_t len)
{
	struct seen *sn = arg;
	unsigned char want[LEN];
	struct kvp_rec_key ki;
	uint32_t i;

	sn->calls++;
	sn->on_putter += pthread_equal(pthread_self(), sn->putter) != 0;
	for (i = 0; !kvp_prefix_key(sn->p, i, &ki); i++)
		if (!memcmp(&ki, k, sizeof(ki)))
			break;
	fill(want, i, sn->seed);
	sn->wrong += len != LEN || memcmp(payload, want, LEN) != 0;
}

/*
 * The stored hook (a lower tier's publish): called on the writer thread
 * for each chunk put, after the release when held, with the chunk's
 * payload; never for put_local; not after it is removed.
 */
START_TEST(stored_hook_behind_the_release)
{
	struct kvp_prefix *p = prefix_of(NULL);
	struct seen sn = { .putter = pthread_self(), .seed = 8, .p = p };
	unsigned char want[LEN];
	uint32_t t[6 * C + 1], i;

	prompt(t, 6 * C + 1, 8);
	kvp_prefix_set_prompt(p, t, 6 * C + 1, C);
	kvp_prefix_on_stored(p, on_stored, &sn);
	kvp_prefix_hold(p);
	for (i = 0; i < 4; i++) {
		fill(want, i, 8);
		kvp_prefix_put(p, i, want, LEN);
	}
	fill(want, 4, 8);
	ck_assert_int_eq(kvp_prefix_put_local(p, 4, want, LEN), 0);
	/* past the prompt's 6 chunks: failed, and says so (a caller that
	 * took it for queued skipped storing it otherwise) */
	ck_assert_int_eq(kvp_prefix_put_local(p, 6, want, LEN), -ENOENT);
	/* the queue's 256 MiB as it counts buffers: a small one takes
	 * whole pages (4 KiB for LEN), 3 MiB takes 4 */
	ck_assert_uint_eq(kvp_prefix_queue_fits(p, LEN),
			  KVP_PREFIX_QUEUE_BYTES / 4096);
	ck_assert_uint_eq(kvp_prefix_queue_fits(p, 3u << 20), 64);
	ck_assert_uint_eq(kvp_prefix_queue_fits(p, 512u << 20), 1);
	usleep(100 * 1000); /* a writer that would call it early can */
	ck_assert_uint_eq(sn.calls, 0);
	kvp_prefix_release(p);
	kvp_prefix_drain(p);
	ck_assert_uint_eq(sn.calls, 4);
	ck_assert_uint_eq(sn.on_putter, 0);
	ck_assert_uint_eq(sn.wrong, 0);
	kvp_prefix_on_stored(p, NULL, NULL);
	fill(want, 5, 8);
	kvp_prefix_put(p, 5, want, LEN);
	kvp_prefix_drain(p);
	ck_assert_uint_eq(sn.calls, 4);
	kvp_prefix_destroy(p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache_prefix");
	TCase *tc = kvp_test_tcase(s, "prefix", 120);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, store_then_read_ahead);
	tcase_add_test(tc, evicts_last_chunks_first);
	tcase_add_test(tc, past_a_full_cache_keeps_the_first);
	tcase_add_test(tc, order_read_back_at_open);
	tcase_add_test(tc, late_stores_keep_their_order);
	tcase_add_test(tc, put_present_is_a_use);
	tcase_add_test(tc, read_ahead_stays_in_its_lookup);
	tcase_add_test(tc, put_does_not_wait_for_the_disk);
	tcase_add_test(tc, salts_part);
	tcase_add_test(tc, cipher_keys_share_a_directory);
	tcase_add_test(tc, skips_and_rereads);
	tcase_add_test(tc, try_put_skips_when_full);
	tcase_add_test(tc, hold_then_release);
	tcase_add_test(tc, put_fd_stores_the_record);
	tcase_add_test(tc, stored_hook_behind_the_release);
	tcase_add_test(tc, new_hold_stores_earlier_chunks);
	tcase_add_test(tc, queue_counts_huge_pages);
	tcase_add_test(tc, put_fd_descriptors_bounded);
	return kvp_test_run(s);
}
