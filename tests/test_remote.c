/*
 * test_remote.c - lib/remote against a real redis-server (one per test, on
 * a free loopback port): fetch and publish, verification, two tenants,
 * AUTH, and the faults: a server absent at start, killed mid-run and
 * restarted, hung past the timeout, full; a full publish queue; a DNS
 * server that does not answer (getaddrinfo interposed, below).  Every
 * value that comes back is checked against what was published: 0 wrong.
 *
 * The values are the tests' own records (the cache brings the real ones):
 * magic, the tenant, the key, a payload from tests/helpers' pattern and
 * an FNV-1a of all before it, checked by the verify hook.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/remote/remote.h"
#include "tests/helpers/helpers.h"
#include "tests/helpers/redis_fx.h"

#define MAGIC 0x315453454b50564bull /* "KVPTEST1" */

struct tenant {
	uint64_t id; /* in every record of this tenant */
};

static uint64_t fnv(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* Record of (@t, key @k, payload @n bytes) into @buf; its length. */
static size_t record(void *buf, uint64_t t, uint64_t k, size_t n)
{
	uint64_t *w = buf;

	w[0] = MAGIC;
	w[1] = t;
	w[2] = k;
	kvp_test_fill(w + 3, n, t * 1000003 + k, 0);
	w[3 + n / 8] = fnv(buf, 24 + n);
	return 24 + n + 8;
}

static int verify(void *arg, const void *key, size_t keylen, void *val,
		  size_t len)
{
	const struct tenant *t = arg;
	const uint64_t *w = val;
	uint64_t k;

	if (keylen != 8 || len < 32 || len % 8)
		return -1;
	memcpy(&k, key, 8);
	if (w[0] != MAGIC || w[1] != t->id || w[2] != k)
		return -1;
	return w[len / 8 - 1] == fnv(val, len - 8) ? 0 : -1;
}

/* The record was the one of (@t, @k, @n): not a wrong block. */
static void check_value(const struct kvp_remote_get *g, uint64_t t,
			uint64_t k, size_t n)
{
	const uint64_t *w = g->buf;

	ck_assert_uint_eq(g->len, 24 + n + 8);
	ck_assert(w[1] == t && w[2] == k);
	ck_assert_int_eq(kvp_test_check(w + 3, n, t * 1000003 + k, 0), -1);
}

static struct kvp_test_redis srv;
static struct tenant tenant_a = { 0xa }, tenant_b = { 0xb };
static const char ns_a[] = "model-x/tenant-a", ns_b[] = "model-x/tenant-b";

static struct kvp_remote *open_tier(const char *url, const char *ns,
				    struct tenant *t)
{
	struct kvp_remote_config cfg = { .url = url, .ns = ns,
					 .ns_len = strlen(ns),
					 .verify = verify, .verify_arg = t };
	struct kvp_remote *r;
	char err[256] = "";
	int rc = kvp_remote_open(&cfg, &r, err, sizeof(err));

	ck_assert_msg(rc == 0, "kvp_remote_open(%s): %s", url, err);
	return r;
}

static struct kvp_remote *open_srv(const char *opts, const char *ns,
				   struct tenant *t)
{
	char url[256];

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s", srv.port,
		 opts ? opts : "");
	return open_tier(url, ns, t);
}

static void publish(struct kvp_remote *r, uint64_t t, uint64_t k0,
		    uint64_t n, size_t payload)
{
	void *buf = malloc(payload + 32);

	for (uint64_t k = k0; k < k0 + n; k++) {
		size_t len = record(buf, t, k, payload);

		/* retried when full: these tests want every one queued */
		while (kvp_remote_publish(r, &k, 8, buf, len) == -EAGAIN)
			kvp_remote_flush(r, 1000);
	}
	free(buf);
	ck_assert_int_eq(kvp_remote_flush(r, 30000), 0);
}

/*
 * Fetch keys [@k0, @k0 + @n); every hit checked for being (@t, k).
 * Counts of hits, misses (-ENOENT) and other statuses into @res[3].
 */
static void fetch(struct kvp_remote *r, uint64_t t, uint64_t k0, uint64_t n,
		  size_t payload, unsigned res[3])
{
	struct kvp_remote_get *g = calloc(n, sizeof(*g));
	uint64_t *keys = calloc(n, 8);
	char *bufs = malloc(n * (payload + 32));
	int hits;

	res[0] = res[1] = res[2] = 0;
	for (uint64_t i = 0; i < n; i++) {
		keys[i] = k0 + i;
		g[i].key = &keys[i];
		g[i].key_len = 8;
		g[i].buf = bufs + i * (payload + 32);
		g[i].buf_len = payload + 32;
		g[i].status = 12345;
	}
	hits = kvp_remote_get_many(r, g, n);
	ck_assert_int_ge(hits, 0);
	for (uint64_t i = 0; i < n; i++) {
		ck_assert_int_ne(g[i].status, 12345);
		if (g[i].status == 0) {
			check_value(&g[i], t, k0 + i, payload);
			res[0]++;
		} else if (g[i].status == -ENOENT) {
			res[1]++;
		} else {
			res[2]++;
		}
	}
	ck_assert_uint_eq(res[0], (unsigned)hits);
	free(g);
	free(keys);
	free(bufs);
}

static void setup(void)
{
	kvp_test_redis_start(&srv, NULL);
}

static void teardown(void)
{
	kvp_test_redis_stop(&srv);
}

START_TEST(publish_then_fetch)
{
	struct kvp_remote *r = open_srv(NULL, ns_a, &tenant_a);
	struct kvp_remote_stats st;
	unsigned res[3];

	publish(r, tenant_a.id, 0, 300, 4096);
	fetch(r, tenant_a.id, 0, 400, 4096, res);
	ck_assert_uint_eq(res[0], 300);
	ck_assert_uint_eq(res[1], 100);
	ck_assert_uint_eq(res[2], 0);
	st = kvp_test_remote_stats(r);
	ck_assert_uint_eq(st.hits_total, 300);
	ck_assert_uint_eq(st.misses_total, 100);
	ck_assert_uint_eq(st.publishes_total, 300);
	ck_assert_uint_eq(st.bytes_read_total, 300 * (4096 + 32));
	ck_assert_uint_eq(st.bytes_written_total, 300 * (4096 + 32));
	ck_assert_uint_eq(st.errors_total, 0);
	uint64_t batches = 0;

	for (int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		batches += st.fetch_latency_us[i];
	ck_assert_uint_ge(batches, 4); /* 400 keys, 128 a round trip */
	kvp_remote_close(r);
}
END_TEST

/* Store @val (@len bytes) under (@ns, key @k) in the tier's format, as
 * another writer would: every part, with its header. */
static void set_value(const char *ns, uint64_t k, const void *val, size_t len)
{
	size_t cap = KVP_REMOTE_PART_HEADER + KVP_REMOTE_PART_BYTES;
	char rkey[256], *part = malloc(cap);
	uint32_t i = 0;
	int n;

	ck_assert_ptr_nonnull(part);
	while ((n = kvp_remote_part_value(ns, strlen(ns), &k, 8, val, len, 1,
					  i, part, cap)) > 0) {
		redisReply *rep;

		kvp_remote_redis_key(ns, strlen(ns), &k, 8, i++, rkey,
				     sizeof(rkey));
		rep = kvp_test_redis_cmd(&srv, "SET %s %b", rkey, part,
					 (size_t)n);
		freeReplyObject(rep);
	}
	ck_assert_int_eq(n, -EINVAL); /* past the last part */
	free(part);
}

START_TEST(bad_values_are_misses)
{
	struct kvp_remote *r = open_srv(NULL, ns_a, &tenant_a);
	char rkey[256], buf[4096 + 32];
	struct kvp_remote_get g = { .buf = buf, .buf_len = 100 };
	uint64_t k = 7;
	redisReply *rep;
	size_t len;

	publish(r, tenant_a.id, 7, 1, 4096);
	/* too large for the caller's buffer */
	g.key = &k;
	g.key_len = 8;
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_int_eq(g.status, -EMSGSIZE);
	/* one flipped byte, as another writer or a bad disk would leave */
	len = record(buf, tenant_a.id, 7, 4096);
	buf[100] ^= 1;
	set_value(ns_a, k, buf, len);
	g.buf_len = sizeof(buf);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_int_eq(g.status, -EBADMSG);
	/* truncated */
	set_value(ns_a, k, buf, 40);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_int_eq(g.status, -EBADMSG);
	/* no part header: the record alone, as kvp:1 stored it */
	buf[100] ^= 1;
	kvp_remote_redis_key(ns_a, strlen(ns_a), &k, 8, 0, rkey, sizeof(rkey));
	rep = kvp_test_redis_cmd(&srv, "SET %s %b", rkey, buf, len);
	freeReplyObject(rep);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_int_eq(g.status, -EBADMSG);
	ck_assert_uint_eq(kvp_test_remote_stats(r).parts_bad_total, 1);
	/* not a string at all (another client's list): as foreign as the
	 * values above, not a failure of the server */
	rep = kvp_test_redis_cmd(&srv, "DEL %s", rkey);
	freeReplyObject(rep);
	rep = kvp_test_redis_cmd(&srv, "LPUSH %s x", rkey);
	freeReplyObject(rep);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_int_eq(g.status, -EBADMSG);
	ck_assert_uint_eq(kvp_test_remote_stats(r).verify_failed_total, 4);
	ck_assert_uint_eq(kvp_test_remote_stats(r).parts_bad_total, 2);
	ck_assert_uint_eq(kvp_test_remote_stats(r).oversize_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).errors_total, 0);
	/* and a publish puts a value there again */
	publish(r, tenant_a.id, 7, 1, 4096);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), 1);
	check_value(&g, tenant_a.id, 7, 4096);
	ck_assert_uint_eq(kvp_test_remote_stats(r).hits_total, 1);
	kvp_remote_close(r);
}
END_TEST

/* The heap in use now (glibc's count; 0 where a sanitizer's allocator
 * keeps its own, which leaves the check below nothing to compare). */
static uint64_t heap_in_use(void)
{
	struct mallinfo2 mi = mallinfo2();

	return mi.uordblks + mi.hblkhd;
}

struct heap_watch {
	struct tenant *t;
	uint64_t base, peak; /* heap in use before the fetch, at most in it */
};

static int verify_watching(void *arg, const void *key, size_t keylen,
			   void *val, size_t len)
{
	struct heap_watch *w = arg;
	uint64_t now = heap_in_use();

	if (now > w->peak)
		w->peak = now;
	return verify(w->t, key, keylen, val, len);
}

#define BIG_VALUES 32
#define BIG_PAYLOAD (1u << 20)

/*
 * Large values go straight to the caller's buffers: a batch of 32 values
 * of 1 MiB holds about one value beyond them while it is fetched, never
 * the batch twice (which cost a page fault per 4 KiB of it, and made the
 * tier half as fast as redis-benchmark at 1 MiB).  Values that do not fit
 * their buffer, and small ones after large ones on the same connection,
 * in the same pipeline, come back as before.
 */
START_TEST(large_values_not_held)
{
	struct heap_watch w = { &tenant_a, 0, 0 };
	struct kvp_remote_config cfg = { .ns = ns_a, .ns_len = strlen(ns_a),
					 .verify = verify_watching,
					 .verify_arg = &w };
	size_t rec = BIG_PAYLOAD + 32;
	struct kvp_remote_get g[BIG_VALUES + 2];
	uint64_t keys[BIG_VALUES + 2];
	char *bufs = malloc((BIG_VALUES + 2) * rec), url[256], err[256];
	struct kvp_remote *r;
	unsigned res[3];
	int i;

	ck_assert_ptr_nonnull(bufs);
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=30000",
		 srv.port);
	cfg.url = url;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), 0);
	publish(r, tenant_a.id, 0, BIG_VALUES + 1, BIG_PAYLOAD);
	publish(r, tenant_a.id, 100, 1, 512);
	for (i = 0; i < BIG_VALUES + 2; i++) {
		keys[i] = i == BIG_VALUES + 1 ? 100 : (uint64_t)i;
		g[i] = (struct kvp_remote_get){ .key = &keys[i], .key_len = 8,
						.buf = bufs + i * rec,
						.buf_len = rec };
	}
	g[BIG_VALUES].buf_len = rec - 8; /* one word short: not served */
	memset(bufs, 0, (BIG_VALUES + 2) * rec); /* its pages touched */
	w.base = w.peak = heap_in_use();
	ck_assert_int_eq(kvp_remote_get_many(r, g, BIG_VALUES + 2),
			 BIG_VALUES + 1);
	for (i = 0; i < BIG_VALUES; i++)
		check_value(&g[i], tenant_a.id, (uint64_t)i, BIG_PAYLOAD);
	ck_assert_int_eq(g[BIG_VALUES].status, -EMSGSIZE);
	check_value(&g[BIG_VALUES + 1], tenant_a.id, 100, 512);
	ck_assert_msg(w.peak - w.base < 16u << 20,
		      "a fetch of %d values of 1 MiB held %llu MiB of heap",
		      BIG_VALUES, (unsigned long long)((w.peak - w.base) >> 20));
	/* small ones after, on the connection that read the large ones */
	fetch(r, tenant_a.id, 100, 1, 512, res);
	ck_assert_uint_eq(res[0], 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).oversize_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).hits_total,
			  BIG_VALUES + 2);
	kvp_remote_close(r);
	free(bufs);
}
END_TEST

/* Payloads whose records are 3 MiB and a little (4 parts), 2 MiB (2
 * parts, the last full) and 1 MiB (1 part). */
static const size_t part_payloads[] = { (3u << 20) + 8, (2u << 20) - 32,
					(1u << 20) - 32 };
#define NPARTED 3

/* @r's counter @name (a field of struct kvp_remote_stats). */
#define STAT(r, name) (kvp_test_remote_stats(r).name)

/* Fetch key @k of @payload with a buffer of @room bytes (at least the
 * record's); its status, the value checked when it is a hit. */
static int fetch_one(struct kvp_remote *r, uint64_t t, uint64_t k,
		     size_t payload, size_t room)
{
	struct kvp_remote_get g = { .key = &k, .key_len = 8,
				    .buf = malloc(room), .buf_len = room };

	ck_assert_ptr_nonnull(g.buf);
	ck_assert_int_ge(kvp_remote_get_many(r, &g, 1), 0);
	if (!g.status)
		check_value(&g, t, k, payload);
	free(g.buf);
	return g.status;
}

static void part_key(const char *ns, uint64_t k, uint32_t part, char *buf)
{
	kvp_remote_redis_key(ns, strlen(ns), &k, 8, part, buf, 256);
}

/* The most memory this process has held (its peak RSS), bytes. */
static uint64_t peak_rss(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss << 10;
}

/*
 * A foreign value far larger than a part under a part's key (another
 * client's, or a writer's bug) is read no further than the part's room:
 * a miss counted as a failed verification, never 200 MiB in this
 * process.  GET read all of it into hiredis' buffer and a reply of its
 * own.
 */
START_TEST(huge_value_not_read)
{
	struct kvp_remote *r = open_srv("?timeout_ms=30000", ns_a, &tenant_a);
	char rkey[256];
	uint64_t before;
	redisReply *rep;

	publish(r, tenant_a.id, 5, 1, 4096);
	part_key(ns_a, 5, 0, rkey);
	rep = kvp_test_redis_cmd(&srv, "SETRANGE %s %d x", rkey,
				 (200 << 20) - 1);
	ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
	freeReplyObject(rep);
	before = peak_rss();
	ck_assert_int_eq(fetch_one(r, tenant_a.id, 5, 4096, 4096 + 32),
			 -EBADMSG);
	ck_assert_msg(peak_rss() - before < (32u << 20),
		      "a fetch of a 4 KiB value under which the server had "
		      "200 MiB grew the process by %llu MiB",
		      (unsigned long long)((peak_rss() - before) >> 20));
	ck_assert_uint_eq(STAT(r, verify_failed_total), 1);
	ck_assert_uint_eq(STAT(r, hits_total), 0);
	kvp_remote_close(r);
}
END_TEST

/*
 * Values larger than a part: stored as parts, fetched whole (into a buffer
 * of their size or larger), a round trip holding about 8 MiB of them; a
 * part missing is a counted miss, a part damaged, moved or from another
 * tenant a counted failure, never a wrong value.
 */
START_TEST(parts_round_trip)
{
	struct kvp_remote *a = open_srv("?timeout_ms=30000", ns_a, &tenant_a);
	struct kvp_remote *b = open_srv("?timeout_ms=30000", ns_b, &tenant_b);
	char key[256], key2[256];
	redisReply *rep;
	uint64_t trips;
	int i;

	for (i = 0; i < NPARTED; i++)
		publish(a, tenant_a.id, (uint64_t)i, 1, part_payloads[i]);
	publish(a, tenant_a.id, 3, 1, part_payloads[0]);
	publish(b, tenant_b.id, 0, 1, part_payloads[0]);
	rep = kvp_test_redis_cmd(&srv, "DBSIZE");
	ck_assert_int_eq(rep->integer, 4 + 2 + 1 + 4 + 4);
	freeReplyObject(rep);
	ck_assert_uint_eq(STAT(a, bytes_written_total),
			  2 * (part_payloads[0] + 32) + part_payloads[1] + 32 +
				  part_payloads[2] + 32);
	/* whole, in buffers of their size and larger */
	for (i = 0; i < NPARTED; i++) {
		ck_assert_int_eq(fetch_one(a, tenant_a.id, (uint64_t)i,
					   part_payloads[i],
					   part_payloads[i] + 32), 0);
		ck_assert_int_eq(fetch_one(a, tenant_a.id, (uint64_t)i,
					   part_payloads[i], 5u << 20), 0);
	}
	/* one fetch of 4 values of 3 MiB: more than one round trip */
	{
		struct kvp_remote_get g[4];
		uint64_t keys[4] = { 0, 3, 0, 3 };
		size_t room = part_payloads[0] + 32;
		char *bufs = malloc(4 * room);

		for (i = 0; i < 4; i++)
			g[i] = (struct kvp_remote_get){ .key = &keys[i],
							.key_len = 8,
							.buf = bufs + i * room,
							.buf_len = room };
		trips = STAT(a, fetch_round_trips_total);
		ck_assert_int_eq(kvp_remote_get_many(a, g, 4), 4);
		for (i = 0; i < 4; i++)
			check_value(&g[i], tenant_a.id, keys[i],
				    part_payloads[0]);
		ck_assert_uint_ge(STAT(a, fetch_round_trips_total) - trips, 2);
		free(bufs);
	}
	ck_assert_uint_eq(STAT(a, hits_total), 2 * NPARTED + 4);

	/* a part gone (evicted, or not written yet): a miss, counted */
	part_key(ns_a, 0, 2, key);
	freeReplyObject(kvp_test_redis_cmd(&srv, "DEL %s", key));
	ck_assert_int_eq(fetch_one(a, tenant_a.id, 0, part_payloads[0],
				   part_payloads[0] + 32), -ENOENT);
	ck_assert_uint_eq(STAT(a, parts_missing_total), 1);
	ck_assert_uint_eq(STAT(a, misses_total), 1);
	/* a byte of a part's payload: the whole fails the hook */
	part_key(ns_a, 1, 1, key);
	freeReplyObject(kvp_test_redis_cmd(&srv, "SETRANGE %s 1000 X", key));
	ck_assert_int_eq(fetch_one(a, tenant_a.id, 1, part_payloads[1],
				   part_payloads[1] + 32), -EBADMSG);
	ck_assert_uint_eq(STAT(a, verify_failed_total), 1);
	ck_assert_uint_eq(STAT(a, parts_bad_total), 0);
	/* a part's header (its index): refused as a part */
	part_key(ns_a, 2, 0, key);
	freeReplyObject(kvp_test_redis_cmd(&srv, "SETRANGE %s 8 %b", key,
					   "\x01", (size_t)1));
	ck_assert_int_eq(fetch_one(a, tenant_a.id, 2, part_payloads[2],
				   part_payloads[2] + 32), -EBADMSG);
	ck_assert_uint_eq(STAT(a, parts_bad_total), 1);
	/* parts 0 and 1 of key 3 swapped */
	part_key(ns_a, 3, 0, key);
	part_key(ns_a, 3, 1, key2);
	freeReplyObject(kvp_test_redis_cmd(&srv, "RENAME %s tmp", key));
	freeReplyObject(kvp_test_redis_cmd(&srv, "RENAME %s %s", key2, key));
	freeReplyObject(kvp_test_redis_cmd(&srv, "RENAME tmp %s", key2));
	ck_assert_int_eq(fetch_one(a, tenant_a.id, 3, part_payloads[0],
				   part_payloads[0] + 32), -EBADMSG);
	ck_assert_uint_eq(STAT(a, parts_bad_total), 3);
	/* b's part 1 of its key 0 under a's key 0 (part 2 put back): another
	 * tenant's part, refused */
	part_key(ns_b, 0, 1, key);
	part_key(ns_a, 0, 1, key2);
	freeReplyObject(kvp_test_redis_cmd(&srv, "COPY %s %s REPLACE", key,
					   key2));
	{
		char *rec = malloc(part_payloads[0] + 32);
		size_t len = record(rec, tenant_a.id, 0, part_payloads[0]);
		char *part = malloc(KVP_REMOTE_PART_HEADER +
				    KVP_REMOTE_PART_BYTES);
		uint64_t k0 = 0, publish;
		redisReply *rep0;
		int n;

		/* of the publish that stored its parts 0 and 3 */
		part_key(ns_a, 0, 0, key);
		rep0 = kvp_test_redis_cmd(&srv, "GETRANGE %s 32 39", key);
		ck_assert_uint_eq(rep0->len, 8);
		memcpy(&publish, rep0->str, 8);
		freeReplyObject(rep0);
		n = kvp_remote_part_value(ns_a, strlen(ns_a), &k0, 8, rec, len,
					  publish, 2, part,
					  KVP_REMOTE_PART_HEADER +
						  KVP_REMOTE_PART_BYTES);
		part_key(ns_a, 0, 2, key);
		freeReplyObject(kvp_test_redis_cmd(&srv, "SET %s %b", key,
						   part, (size_t)n));
		free(part);
		free(rec);
	}
	ck_assert_int_eq(fetch_one(a, tenant_a.id, 0, part_payloads[0],
				   part_payloads[0] + 32), -EBADMSG);
	ck_assert_uint_eq(STAT(a, parts_bad_total), 4);
	/* b still reads its own, whole */
	ck_assert_int_eq(fetch_one(b, tenant_b.id, 0, part_payloads[0],
				   part_payloads[0] + 32), 0);
	ck_assert_uint_eq(STAT(a, hits_total), 2 * NPARTED + 4);
	kvp_remote_close(a);
	kvp_remote_close(b);
}
END_TEST

/* A hook that takes every value: a library caller whose check is weak,
 * or whose format has none.  The tier alone must keep a value whole. */
static int verify_any(void *arg, const void *key, size_t keylen, void *val,
		      size_t len)
{
	(void)arg;
	(void)key;
	(void)keylen;
	(void)val;
	(void)len;
	return 0;
}

/*
 * Two publishes of one key race (two processes, or a block evicted and
 * made again with other bytes): part 0 of the second beside part 1 of
 * the first is no value, even to a hook that takes anything: a counted
 * miss, never served.
 */
START_TEST(parts_of_two_publishes)
{
	size_t payload = part_payloads[0], room = payload + 32;
	char url[64], key[256];
	struct kvp_remote_config cfg = { .url = url, .ns = ns_a,
					 .ns_len = strlen(ns_a),
					 .verify = verify_any };
	uint64_t k = 0;
	struct kvp_remote_get g = { .key = &k, .key_len = 8,
				    .buf = malloc(room), .buf_len = room };
	struct kvp_remote *r;
	redisReply *first;

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=30000",
		 srv.port);
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, NULL, 0), 0);
	publish(r, tenant_a.id, k, 1, payload);
	part_key(ns_a, k, 1, key);
	first = kvp_test_redis_cmd(&srv, "GET %s", key);
	ck_assert_int_eq(first->type, REDIS_REPLY_STRING);
	publish(r, tenant_b.id, k, 1, payload); /* other bytes */
	freeReplyObject(kvp_test_redis_cmd(&srv, "SET %s %b", key, first->str,
					   first->len));
	freeReplyObject(first);
	ck_assert_int_ge(kvp_remote_get_many(r, &g, 1), 0);
	ck_assert_msg(g.status == -ENOENT,
		      "a value of two publishes' parts: status %d, not a miss",
		      g.status);
	ck_assert_uint_eq(STAT(r, values_mixed_total), 1);
	ck_assert_uint_eq(STAT(r, misses_total), 1);
	ck_assert_uint_eq(STAT(r, parts_bad_total), 0);
	/* the next publish makes it whole again */
	publish(r, tenant_b.id, k, 1, payload);
	ck_assert_int_eq(fetch_one(r, tenant_b.id, k, payload, room), 0);
	free(g.buf);
	kvp_remote_close(r);
}
END_TEST

/*
 * A value of the layout before publish ids (kvp:2: keys, headers of
 * version 1, 32 bytes) is never taken for one of ours: under its own key
 * a plain miss, moved under ours a failed verification.
 */
START_TEST(old_layout_not_read)
{
	struct kvp_remote *r = open_srv(NULL, ns_a, &tenant_a);
	char rec[4096 + 32], val[32 + sizeof(rec)], key[256];
	size_t len = record(rec, tenant_a.id, 4, 4096);
	uint64_t len64 = len, tag;

	part_key(ns_a, 4, 0, key);
	key[4] = '2'; /* kvp:2:<ns>:<key>:0 */
	tag = fnv(key, strlen(key) - 2);
	memcpy(val, "KVPp\1\0\x20\0\0\0\0\0\1\0\0\0", 16);
	memcpy(val + 16, &len64, 8);
	memcpy(val + 24, &tag, 8);
	memcpy(val + 32, rec, len);
	freeReplyObject(kvp_test_redis_cmd(&srv, "SET %s %b", key, val,
					   32 + len));
	ck_assert_int_eq(fetch_one(r, tenant_a.id, 4, 4096, sizeof(rec)),
			 -ENOENT);
	ck_assert_uint_eq(STAT(r, misses_total), 1);
	key[4] = '3';
	freeReplyObject(kvp_test_redis_cmd(&srv, "SET %s %b", key, val,
					   32 + len));
	ck_assert_int_eq(fetch_one(r, tenant_a.id, 4, 4096, sizeof(rec)),
			 -EBADMSG);
	ck_assert_uint_eq(STAT(r, parts_bad_total), 1);
	ck_assert_uint_eq(STAT(r, hits_total), 0);
	kvp_remote_close(r);
}
END_TEST

START_TEST(two_tenants)
{
	struct kvp_remote *a = open_srv(NULL, ns_a, &tenant_a);
	struct kvp_remote *b = open_srv(NULL, ns_b, &tenant_b);
	char rkey[256], bkey[256], buf[1024 + 32];
	unsigned res[3];
	uint64_t k = 3;
	redisReply *rep;
	size_t len;

	publish(a, tenant_a.id, 0, 50, 1024);
	/* b asks for the same keys: its namespace has none of them */
	fetch(b, tenant_b.id, 0, 50, 1024, res);
	ck_assert_uint_eq(res[0], 0);
	ck_assert_uint_eq(res[1], 50);
	/* a poisons b's key 3 with a's record: b's hook refuses it */
	len = record(buf, tenant_a.id, 3, 1024);
	set_value(ns_b, k, buf, len);
	fetch(b, tenant_b.id, 0, 50, 1024, res);
	ck_assert_uint_eq(res[0], 0);
	ck_assert_uint_eq(res[2], 1);
	ck_assert_uint_eq(kvp_test_remote_stats(b).verify_failed_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(b).parts_bad_total, 0);
	/* ... and with a's stored part itself, copied under b's key: its
	 * header names a's key, so it is refused before the hook sees it */
	kvp_remote_redis_key(ns_a, strlen(ns_a), &k, 8, 0, rkey, sizeof(rkey));
	kvp_remote_redis_key(ns_b, strlen(ns_b), &k, 8, 0, bkey, sizeof(bkey));
	rep = kvp_test_redis_cmd(&srv, "COPY %s %s REPLACE", rkey, bkey);
	ck_assert_int_eq(rep->integer, 1);
	freeReplyObject(rep);
	fetch(b, tenant_b.id, 0, 50, 1024, res);
	ck_assert_uint_eq(res[2], 1);
	ck_assert_uint_eq(kvp_test_remote_stats(b).verify_failed_total, 2);
	ck_assert_uint_eq(kvp_test_remote_stats(b).parts_bad_total, 1);
	/* a still reads its own */
	fetch(a, tenant_a.id, 0, 50, 1024, res);
	ck_assert_uint_eq(res[0], 50);
	kvp_remote_close(a);
	kvp_remote_close(b);
}
END_TEST

START_TEST(absent_at_start)
{
	struct kvp_remote *r;
	unsigned res[3];
	char url[128];
	int port = srv.port;

	kvp_test_redis_kill(&srv);
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
	r = open_tier(url, ns_a, &tenant_a);
	ck_assert_uint_ge(kvp_test_remote_stats(r).connect_errors_total, 1);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[2], 20);
	ck_assert_uint_eq(kvp_test_remote_stats(r).errors_total, 20);
	/* publishing goes nowhere, counted, and never blocks */
	publish(r, tenant_a.id, 0, 10, 512);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publish_errors_total, 10);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publishes_total, 0);
	kvp_remote_close(r);
}
END_TEST

/* Fetch until a call is served (no errors), at most @secs seconds. */
static void until_served(struct kvp_remote *r, uint64_t t, unsigned secs,
			 unsigned res[3])
{
	uint64_t until = kvp_test_now_ns() + secs * 1000000000ull;

	do {
		usleep(50000);
		fetch(r, t, 0, 20, 512, res);
	} while (res[2] && kvp_test_now_ns() < until);
	ck_assert_msg(res[2] == 0, "still not served after %u s", secs);
}

/*
 * The resolver, interposed: SLOW_HOST's lookups wait until the test
 * releases them (then answer 127.0.0.1), NO_HOST's fail as an unknown
 * name does, DOWN_HOST's as with no DNS server reachable; TWO_HOST has
 * 127.0.0.2 (where no server listens) and then 127.0.0.1; every other
 * name goes to libc's.  DNS_GUARD_S: a lookup
 * never released answers "try again" by then, so that a tier that waits
 * for it fails its test rather than hanging it.
 */
#define SLOW_HOST "kvp-slow-dns.test"
#define NO_HOST "kvp-no-such-host.test"
#define DOWN_HOST "kvp-dns-down.test"
#define TWO_HOST "kvp-two-addrs.test"
#define DNS_GUARD_S 20

static pthread_mutex_t dns_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dns_cond = PTHREAD_COND_INITIALIZER;
static bool dns_released;
static unsigned dns_answered; /* SLOW_HOST lookups that returned */

int getaddrinfo(const char *node, const char *service,
		const struct addrinfo *hints, struct addrinfo **res)
{
	int (*real)(const char *, const char *, const struct addrinfo *,
		    struct addrinfo **) =
		(int (*)(const char *, const char *, const struct addrinfo *,
			 struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
	struct timespec until;
	bool released;

	if (node && !strcmp(node, NO_HOST))
		return EAI_NONAME;
	if (node && !strcmp(node, DOWN_HOST))
		return EAI_AGAIN;
	if (node && !strcmp(node, TWO_HOST)) {
		int rv = real("127.0.0.2", service, hints, res);

		/* glibc frees an answer's entries one by one: two chain */
		if (!rv && (rv = real("127.0.0.1", service, hints,
				      &(*res)->ai_next)))
			freeaddrinfo(*res);
		return rv;
	}
	/* a number wanted, or another name: libc's answer, at once */
	if (!node || strcmp(node, SLOW_HOST) ||
	    (hints && hints->ai_flags & AI_NUMERICHOST))
		return real(node, service, hints, res);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += DNS_GUARD_S;
	pthread_mutex_lock(&dns_lock);
	while (!dns_released &&
	       !pthread_cond_timedwait(&dns_cond, &dns_lock, &until))
		;
	released = dns_released;
	dns_answered++;
	pthread_mutex_unlock(&dns_lock);
	return released ? real("127.0.0.1", service, hints, res) : EAI_AGAIN;
}

/* While set, pthread_create fails as at the process's thread limit. */
static bool threads_refused;

int pthread_create(pthread_t *t, const pthread_attr_t *attr,
		   void *(*fn)(void *), void *arg)
{
	int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
		    void *) =
		(int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
			 void *))dlsym(RTLD_NEXT, "pthread_create");

	if (__atomic_load_n(&threads_refused, __ATOMIC_RELAXED))
		return EAGAIN;
	return real(t, attr, fn, arg);
}

/* SLOW_HOST's lookups, waiting and to come, answered from now on. */
static void dns_release(void)
{
	pthread_mutex_lock(&dns_lock);
	dns_released = true;
	pthread_cond_broadcast(&dns_cond);
	pthread_mutex_unlock(&dns_lock);
}

/* SLOW_HOST's lookups that returned so far. */
static unsigned dns_answers(void)
{
	unsigned n;

	pthread_mutex_lock(&dns_lock);
	n = dns_answered;
	pthread_mutex_unlock(&dns_lock);
	return n;
}

/*
 * A host name whose DNS server does not answer costs no more than the
 * URL's connect_timeout_ms: open and a fetch return while the lookup
 * still waits (getaddrinfo has no timeout of its own: some 10 s and
 * more), the cause said; once the resolver answers, the node's next
 * connection takes its answer.
 */
START_TEST(dead_dns_within_connect_timeout)
{
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256], said[4096];
	unsigned res[3], answered;

	snprintf(url, sizeof(url),
		 "redis://" SLOW_HOST ":%d?connect_timeout_ms=200", srv.port);
	kvp_test_stderr_start(&cap);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	answered = dns_answers();
	ck_assert_msg(answered == 0,
		      "the tier waited for the resolver's answer (%u given, "
		      "after up to %d s) past connect_timeout_ms",
		      answered, DNS_GUARD_S);
	ck_assert_uint_eq(res[2], 5);
	ck_assert_uint_ge(STAT(r, connect_errors_total), 1);
	ck_assert_msg(strstr(said,
			     "cannot resolve " SLOW_HOST " within 200 ms"),
		      "stderr said: %s", said);
	dns_release();
	until_served(r, tenant_a.id, 20, res);
	kvp_remote_close(r);
}
END_TEST

/*
 * Closing the tier while its lookup still waits on the resolver waits
 * for no answer, and leaves the lookup no memory the tier freed: the
 * lookup ends on its own once answered (a write into a freed node is
 * ASan's to catch, before this case's process exits).
 */
START_TEST(close_while_lookup_waits)
{
	int threads = kvp_test_thread_count();
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256], said[4096];
	uint64_t until;

	snprintf(url, sizeof(url),
		 "redis://" SLOW_HOST ":%d?connect_timeout_ms=50", srv.port);
	kvp_test_stderr_start(&cap);
	r = open_tier(url, ns_a, &tenant_a);
	kvp_remote_close(r);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_msg(dns_answers() == 0,
		      "close waited for the resolver's answer");
	ck_assert_int_gt(kvp_test_thread_count(), threads); /* the lookup */
	dns_release();
	until = kvp_test_now_ns() + DNS_GUARD_S * 1000000000ull;
	while (kvp_test_thread_count() > threads && kvp_test_now_ns() < until)
		usleep(10000);
	ck_assert_int_eq(kvp_test_thread_count(), threads);
}
END_TEST

/*
 * A numeric address asks no resolver, so it takes no lookup thread: a
 * process at its thread limit (or a cluster's nodes, all numeric, each
 * connection made anew) still connects.  Here the connection dies while
 * idle and is made again with no thread to be had.
 */
START_TEST(numeric_host_needs_no_thread)
{
	struct kvp_remote *r = open_srv(NULL, ns_a, &tenant_a);
	struct kvp_test_stderr cap;
	char said[4096];
	unsigned res[3];
	uint64_t connects;

	publish(r, tenant_a.id, 0, 20, 512);
	connects = STAT(r, connects_total);
	freeReplyObject(kvp_test_redis_cmd(&srv,
					   "CLIENT KILL TYPE normal SKIPME yes"));
	kvp_test_stderr_start(&cap);
	__atomic_store_n(&threads_refused, true, __ATOMIC_RELAXED);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	__atomic_store_n(&threads_refused, false, __ATOMIC_RELAXED);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_msg(res[0] == 20, "%u of 20 served; stderr said: %s",
		      res[0], said);
	ck_assert_uint_eq(STAT(r, connects_total), connects + 1);
	kvp_remote_close(r);
}
END_TEST

/* A name's first address refuses: the next is tried, in the same
 * connect_timeout_ms, and the tier is served as if named by it. */
START_TEST(first_address_dead)
{
	struct kvp_remote *r;
	char url[256];
	unsigned res[3];

	snprintf(url, sizeof(url), "redis://" TWO_HOST ":%d", srv.port);
	r = open_tier(url, ns_a, &tenant_a);
	publish(r, tenant_a.id, 0, 20, 512);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[0], 20);
	ck_assert_uint_eq(STAT(r, connect_errors_total), 0);
	kvp_remote_close(r);
}
END_TEST

/* What opening a tier on @host's port 6379 and fetching from it say on
 * stderr, into @said (@len bytes): each fetch an error, not a hang. */
static void lookup_failure_said(const char *host, char *said, size_t len)
{
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256];
	unsigned res[3];

	snprintf(url, sizeof(url), "redis://%s:6379", host);
	kvp_test_stderr_start(&cap);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	kvp_test_stderr_end(&cap, said, len);
	ck_assert_uint_eq(res[2], 5);
	kvp_remote_close(r);
}

/* A name the resolver does not know: said as such, not as a server
 * that refuses, and the tier goes on without it. */
START_TEST(unknown_host_said_so)
{
	char said[4096];

	lookup_failure_said(NO_HOST, said, sizeof(said));
	ck_assert_msg(strstr(said, "cannot resolve " NO_HOST ": ") &&
			      strstr(said, "(check the URL's host)"),
		      "stderr said: %s", said);
}
END_TEST

/* No DNS server to ask: the resolver is what to look at, not the URL,
 * whose host may well be right. */
START_TEST(dns_down_said_so)
{
	char said[4096];

	lookup_failure_said(DOWN_HOST, said, sizeof(said));
	ck_assert_msg(strstr(said, "cannot resolve " DOWN_HOST ": ") &&
			      strstr(said, "(is the DNS server answering?)") &&
			      !strstr(said, "check the URL's host"),
		      "stderr said: %s", said);
}
END_TEST

START_TEST(killed_and_restarted)
{
	struct kvp_remote *r = open_srv(NULL, ns_a, &tenant_a);
	unsigned res[3];
	uint64_t connects;

	publish(r, tenant_a.id, 0, 20, 512);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[0], 20);
	kvp_test_redis_kill(&srv);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[2], 20);
	/* backing off: the next call fails at once, counted again */
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[2], 20);
	ck_assert_uint_eq(kvp_test_remote_stats(r).errors_total, 40);
	connects = kvp_test_remote_stats(r).connects_total;
	kvp_test_redis_restart(&srv); /* empty: it saved nothing */
	until_served(r, tenant_a.id, 20, res);
	ck_assert_uint_eq(res[1], 20);
	ck_assert_uint_gt(kvp_test_remote_stats(r).connects_total, connects);
	/* and publishing works again */
	publish(r, tenant_a.id, 0, 20, 512);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[0], 20);
	kvp_remote_close(r);
}
END_TEST

START_TEST(hung_server_times_out)
{
	struct kvp_remote *r = open_srv("?timeout_ms=100", ns_a, &tenant_a);
	unsigned res[3];
	uint64_t t0;

	publish(r, tenant_a.id, 0, 20, 512);
	kvp_test_redis_pause(&srv, true);
	t0 = kvp_test_now_ns();
	fetch(r, tenant_a.id, 0, 20, 512, res);
	/* a lower bound only: the timeout was waited, not skipped */
	ck_assert_uint_ge(kvp_test_now_ns() - t0, 90000000u);
	ck_assert_uint_eq(res[2], 20);
	ck_assert_uint_ge(kvp_test_remote_stats(r).timeouts_total, 1);
	kvp_test_redis_pause(&srv, false);
	until_served(r, tenant_a.id, 20, res);
	ck_assert_uint_eq(res[0], 20);
	kvp_remote_close(r);
}
END_TEST

/*
 * A server that hangs while a connection is made (stopped, or busy past
 * the timeout) is said to be one, counted as a timeout: not a server that
 * refused the password, which sent the user to check a right one.
 */
START_TEST(hung_at_auth_said_so)
{
	static const char *const pw[] = { "--requirepass", "s3cret", NULL };
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256], said[4096];
	unsigned res[3];

	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, pw);
	kvp_test_redis_pause(&srv, true);
	snprintf(url, sizeof(url),
		 "redis://s3cret@127.0.0.1:%d/2?timeout_ms=200", srv.port);
	kvp_test_stderr_start(&cap);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_uint_eq(res[2], 5);
	ck_assert_msg(strstr(said, "did not answer AUTH within 200 ms") &&
			      !strstr(said, "refused"),
		      "stderr said: %s", said);
	ck_assert_uint_ge(STAT(r, timeouts_total), 1);
	kvp_test_redis_pause(&srv, false);
	/* and once it answers, the password is taken */
	until_served(r, tenant_a.id, 20, res);
	kvp_remote_close(r);
}
END_TEST

/*
 * An ACL user allowed GET and SET but not GETRANGE (what a fetch sends)
 * fails its reads, and stderr says which commands the user needs.
 */
START_TEST(acl_user_needs_getrange)
{
	static const char *const pw[] = { "--requirepass", "s3cret", NULL };
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256], said[4096];
	redisContext *c;
	redisReply *rep;
	unsigned res[3];

	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, pw);
	c = kvp_test_redis_connect(&srv);
	freeReplyObject(redisCommand(c, "AUTH s3cret"));
	rep = redisCommand(c, "ACL SETUSER bob on >pw ~kvp:* +get +set");
	ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
	freeReplyObject(rep);
	redisFree(c);
	snprintf(url, sizeof(url), "redis://bob:pw@127.0.0.1:%d", srv.port);
	r = open_tier(url, ns_a, &tenant_a);
	kvp_test_stderr_start(&cap);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_uint_eq(res[2], 5);
	ck_assert_msg(strstr(said, "NOPERM") && strstr(said, "+getrange"),
		      "stderr said: %s", said);
	kvp_remote_close(r);
}
END_TEST

/*
 * The same user, allowed GETRANGE and SET, at a /db: SELECT is refused
 * NOPERM, and stderr names the permission, not the number of databases.
 */
START_TEST(acl_user_needs_select)
{
	static const char *const pw[] = { "--requirepass", "s3cret", NULL };
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[256], said[4096];
	redisContext *c;
	redisReply *rep;
	unsigned res[3];

	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, pw);
	c = kvp_test_redis_connect(&srv);
	freeReplyObject(redisCommand(c, "AUTH s3cret"));
	rep = redisCommand(c, "ACL SETUSER bob on >pw ~kvp:* +getrange +set");
	ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
	freeReplyObject(rep);
	redisFree(c);
	snprintf(url, sizeof(url), "redis://bob:pw@127.0.0.1:%d/1", srv.port);
	kvp_test_stderr_start(&cap);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_uint_eq(res[2], 5);
	ck_assert_msg(strstr(said, "NOPERM") && strstr(said, "+select") &&
			      !strstr(said, "'databases'"),
		      "stderr said: %s", said);
	kvp_remote_close(r);
}
END_TEST

/*
 * A value larger than the URL's queue_bytes can never be queued: refused
 * as such and said once, not dropped as if the queue were full, which the
 * report then called "skipped (queue full)" for every chunk.
 */
START_TEST(value_past_queue_bytes)
{
	struct kvp_remote *r = open_srv("?queue_bytes=1M", ns_a, &tenant_a);
	size_t payload = 1u << 20;
	char *buf = malloc(payload + 64), said[4096];
	struct kvp_test_stderr cap;
	size_t len = record(buf, tenant_a.id, 1, payload);
	uint64_t k = 1;

	kvp_test_stderr_start(&cap);
	ck_assert_int_eq(kvp_remote_publish(r, &k, 8, buf, len), -EMSGSIZE);
	ck_assert_int_eq(kvp_remote_publish(r, &k, 8, buf, len), -EMSGSIZE);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_msg(strstr(said, "queue_bytes") && !strstr(said, "server") &&
			      strchr(said, '\n') == strrchr(said, '\n'),
		      "stderr said: %s", said);
	ck_assert_uint_eq(STAT(r, publishes_skipped_total), 2);
	/* values of other sizes past it: the same cause, said no more
	 * (each size once filled the WARN_MAX causes said, and a server's
	 * failure after them went unsaid) */
	kvp_test_stderr_start(&cap);
	for (size_t i = 1; i <= 9; i++)
		ck_assert_int_eq(kvp_remote_publish(r, &k, 8, buf, len + i),
				 -EMSGSIZE);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_msg(!said[0], "stderr said: %s", said);
	/* one that fits goes */
	publish(r, tenant_a.id, 2, 1, 4096);
	ck_assert_uint_eq(STAT(r, publishes_total), 1);
	kvp_remote_close(r);
	free(buf);
}
END_TEST

START_TEST(full_queue_skips)
{
	struct kvp_remote *r = open_srv("?timeout_ms=2000&queue=4", ns_a,
					&tenant_a);
	char buf[512 + 32];
	size_t len = record(buf, tenant_a.id, 0, 512);
	unsigned queued = 0, skipped = 0;

	/* The publisher hangs on a stopped server: the queue fills. */
	kvp_test_redis_pause(&srv, true);
	for (uint64_t k = 0; k < 100; k++) {
		int rc = kvp_remote_publish(r, &k, 8, buf, len);

		ck_assert(rc == 0 || rc == -EAGAIN);
		rc ? skipped++ : queued++;
	}
	ck_assert_uint_le(queued, 4 + 128); /* the queue and one batch */
	ck_assert_uint_ge(skipped, 100 - 4 - 128 > 0 ? 100 - 4 - 128 : 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publishes_skipped_total, skipped);
	kvp_test_redis_pause(&srv, false);
	kvp_remote_close(r);
}
END_TEST

START_TEST(full_server)
{
	static const char *const noevict[] = { "--maxmemory", "2mb",
		"--maxmemory-policy", "noeviction", NULL };
	static const char *const lru[] = { "--maxmemory", "2mb",
		"--maxmemory-policy", "allkeys-lru", NULL };
	struct kvp_remote *r;
	struct kvp_remote_stats st;
	unsigned res[3];

	/* noeviction: SETs answer OOM, counted as publish errors */
	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, noevict);
	r = open_srv(NULL, ns_a, &tenant_a);
	publish(r, tenant_a.id, 0, 200, 32768);
	st = kvp_test_remote_stats(r);
	ck_assert_uint_gt(st.publish_errors_total, 0);
	ck_assert_uint_eq(st.publishes_total + st.publish_errors_total, 200);
	fetch(r, tenant_a.id, 0, 200, 32768, res);
	ck_assert_uint_eq(res[0], st.publishes_total);
	ck_assert_uint_eq(res[2], 0);
	kvp_remote_close(r);

	/* allkeys-lru: every SET takes, older blocks go: misses, 0 wrong */
	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, lru);
	r = open_srv(NULL, ns_a, &tenant_a);
	publish(r, tenant_a.id, 0, 200, 32768);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publishes_total, 200);
	fetch(r, tenant_a.id, 0, 200, 32768, res);
	ck_assert_uint_gt(res[0], 0);
	ck_assert_uint_gt(res[1], 0);
	ck_assert_uint_eq(res[2], 0);
	kvp_remote_close(r);
}
END_TEST

/* Asynchronous fetches: what their completions saw. */
struct done_log {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int calls;	 /* completions so far */
	int hits;	 /* summed */
	int cancelled;	 /* entries completed with -ECANCELED */
	int bad;	 /* hits whose value was not the block's */
};

static void on_done(void *arg, struct kvp_remote_get *gets, size_t n,
		    int hits)
{
	struct done_log *d = arg;

	pthread_mutex_lock(&d->lock);
	d->calls++;
	d->hits += hits;
	for (size_t i = 0; i < n; i++) {
		uint64_t k;

		memcpy(&k, gets[i].key, 8);
		d->cancelled += gets[i].status == -ECANCELED;
		if (!gets[i].status) {
			const uint64_t *w = gets[i].buf;

			d->bad += w[2] != k ||
				  kvp_test_check(w + 3, 512,
						 tenant_a.id * 1000003 + k,
						 0) != -1;
		}
	}
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

#define JOBS 4
#define PER_JOB 16

START_TEST(async_fetch)
{
	struct kvp_remote *r = open_srv("?timeout_ms=500", ns_a, &tenant_a);
	static struct kvp_remote_get g[JOBS][PER_JOB];
	static uint64_t keys[JOBS][PER_JOB];
	static char bufs[JOBS][PER_JOB][512 + 32];
	struct done_log d = { PTHREAD_MUTEX_INITIALIZER,
			      PTHREAD_COND_INITIALIZER, 0, 0, 0, 0 };

	publish(r, tenant_a.id, 0, JOBS * PER_JOB, 512);
	for (int j = 0; j < JOBS; j++) {
		for (int i = 0; i < PER_JOB; i++) {
			keys[j][i] = (uint64_t)(j * PER_JOB + i);
			g[j][i] = (struct kvp_remote_get){
				.key = &keys[j][i], .key_len = 8,
				.buf = bufs[j][i], .buf_len = 512 + 32 };
		}
		ck_assert_int_eq(kvp_remote_fetch_submit(r, g[j], PER_JOB,
							 on_done, &d), 0);
	}
	pthread_mutex_lock(&d.lock);
	while (d.calls < JOBS)
		pthread_cond_wait(&d.cond, &d.lock);
	pthread_mutex_unlock(&d.lock);
	ck_assert_int_eq(d.hits, JOBS * PER_JOB);
	ck_assert_int_eq(d.bad, 0);
	ck_assert_int_eq(kvp_remote_fetch_submit(r, g[0], PER_JOB, NULL, &d),
			 -EINVAL);

	/* a hung server: the running fetch times out, the waiting ones
	 * are cancelled by close, each completed once */
	d.calls = d.hits = 0;
	kvp_test_redis_pause(&srv, true);
	for (int j = 0; j < JOBS; j++)
		ck_assert_int_eq(kvp_remote_fetch_submit(r, g[j], PER_JOB,
							 on_done, &d), 0);
	kvp_remote_close(r);
	ck_assert_int_eq(d.calls, JOBS);
	ck_assert_int_eq(d.hits, 0);
	ck_assert_int_ge(d.cancelled, PER_JOB);
	kvp_test_redis_pause(&srv, false);
}
END_TEST

START_TEST(async_fetch_bounded)
{
	struct kvp_remote *r = open_srv("?timeout_ms=2000", ns_a, &tenant_a);
	static struct kvp_remote_get g[1];
	struct done_log d = { PTHREAD_MUTEX_INITIALIZER,
			      PTHREAD_COND_INITIALIZER, 0, 0, 0, 0 };
	uint64_t k = 1;
	char buf[64];
	int queued = 0, refused = 0;

	g[0] = (struct kvp_remote_get){ .key = &k, .key_len = 8, .buf = buf,
					.buf_len = sizeof(buf) };
	kvp_test_redis_pause(&srv, true);
	for (int i = 0; i < KVP_REMOTE_MAX_FETCHES + 10; i++) {
		int rc = kvp_remote_fetch_submit(r, g, 1, on_done, &d);

		ck_assert(rc == 0 || rc == -EAGAIN);
		rc ? refused++ : queued++;
	}
	/* the queue, plus the one the thread may have taken */
	ck_assert_int_le(queued, KVP_REMOTE_MAX_FETCHES + 1);
	ck_assert_int_ge(refused, 9);
	ck_assert_uint_eq(kvp_test_remote_stats(r).fetches_skipped_total,
			  (unsigned)refused);
	kvp_test_redis_pause(&srv, false);
	kvp_remote_close(r);
	ck_assert_int_eq(d.calls, queued);
}
END_TEST

/* Encode: the published payload (the pattern of the key, 512 bytes)
 * made into the tests' record on the publisher thread; key 13 fails. */
static int encode(void *arg, const void *key, size_t keylen, const void *val,
		  size_t len, void **out, size_t *outlen)
{
	const struct tenant *t = arg;
	uint64_t k;

	memcpy(&k, key, 8);
	if (k == 13 || len != 512)
		return -1;
	*out = malloc(len + 32);
	*outlen = record(*out, t->id, k, len);
	/* the record's payload is the one published */
	return memcmp((char *)*out + 24, val, len) ? -1 : 0;
}

START_TEST(encode_on_publisher)
{
	struct kvp_remote_config cfg = { .ns = ns_a, .ns_len = strlen(ns_a),
					 .verify = verify,
					 .verify_arg = &tenant_a,
					 .encode = encode,
					 .encode_arg = &tenant_a };
	char url[128], payload[512];
	struct kvp_remote *r;
	unsigned res[3];

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", srv.port);
	cfg.url = url;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, NULL, 0), 0);
	for (uint64_t k = 0; k < 20; k++) {
		kvp_test_fill(payload, sizeof(payload),
			      tenant_a.id * 1000003 + k, 0);
		ck_assert_int_eq(kvp_remote_publish(r, &k, 8, payload,
						    sizeof(payload)), 0);
	}
	ck_assert_int_eq(kvp_remote_flush(r, 30000), 0);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publish_errors_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).publishes_total, 19);
	fetch(r, tenant_a.id, 0, 20, 512, res);
	ck_assert_uint_eq(res[0], 19);
	ck_assert_uint_eq(res[1], 1);
	kvp_remote_close(r);
}
END_TEST

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	fchmod(fd, mode);
	close(fd);
}

START_TEST(auth_and_db)
{
	static const char *const pw[] = { "--requirepass", "s3cret", NULL };
	struct kvp_remote_config cfg = { .ns = ns_a, .ns_len = strlen(ns_a),
					 .verify = verify,
					 .verify_arg = &tenant_a };
	struct kvp_remote *r;
	char url[512], path[128], err[256];
	unsigned res[3];
	redisReply *rep;

	kvp_test_redis_stop(&srv);
	kvp_test_redis_start(&srv, pw);
	rep = kvp_test_redis_cmd(&srv, "AUTH s3cret");
	freeReplyObject(rep);
	/* no password: every fetch fails, counted */
	r = open_srv(NULL, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	ck_assert_uint_eq(res[2], 5);
	/* NOAUTH replies */
	ck_assert_uint_eq(kvp_test_remote_stats(r).errors_total, 5);
	kvp_remote_close(r);
	/* in the URL, database 2 */
	snprintf(url, sizeof(url), "redis://s3cret@127.0.0.1:%d/2", srv.port);
	r = open_tier(url, ns_a, &tenant_a);
	publish(r, tenant_a.id, 0, 5, 64);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	ck_assert_uint_eq(res[0], 5);
	kvp_remote_close(r);
	{
		redisContext *c = kvp_test_redis_connect(&srv);

		rep = redisCommand(c, "AUTH s3cret");
		freeReplyObject(rep);
		rep = redisCommand(c, "SELECT 2");
		freeReplyObject(rep);
		rep = redisCommand(c, "DBSIZE");
		ck_assert_int_eq(rep->integer, 5);
		freeReplyObject(rep);
		/* an ACL user, for the file below */
		rep = redisCommand(c, "ACL SETUSER alice on >pa55 ~kvp:* +@all");
		ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
		freeReplyObject(rep);
		redisFree(c);
	}
	/* from a file, with the ACL user; a file others may read is refused */
	snprintf(path, sizeof(path), "%s/pw", srv.dir);
	write_file(path, "pa55\n", 0644);
	snprintf(url, sizeof(url),
		 "redis://127.0.0.1:%d?password_file=%s", srv.port, path);
	cfg.url = url;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "chmod 600"));
	ck_assert_ptr_null(r);
	/* a password longer than the tier takes: refused, not cut */
	{
		char longpw[300];

		memset(longpw, 'p', sizeof(longpw) - 1);
		longpw[sizeof(longpw) - 1] = '\0';
		write_file(path, longpw, 0600);
		ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)),
				 -EINVAL);
		ck_assert_msg(strstr(err, "longer than 255 bytes"), "%s", err);
		ck_assert_ptr_null(r);
	}
	write_file(path, "s3cret\n", 0600);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	ck_assert_uint_eq(res[1], 5); /* db 0: misses, not errors */
	kvp_remote_close(r);
	/* the ACL user, its password from the file */
	write_file(path, "pa55\n", 0600);
	snprintf(url, sizeof(url),
		 "redis://alice:@127.0.0.1:%d/2?password_file=%s", srv.port,
		 path);
	r = open_tier(url, ns_a, &tenant_a);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	ck_assert_uint_eq(res[0], 5);
	kvp_remote_close(r);
	/* the ACL user, database 2, from KVP_REMOTE_URL */
	snprintf(url, sizeof(url),
		 "redis://alice:pa55@127.0.0.1:%d/2", srv.port);
	setenv("KVP_REMOTE_URL", url, 1);
	cfg.url = NULL;
	ck_assert_int_eq(kvp_remote_open_env(&cfg, &r, err, sizeof(err)), 0);
	fetch(r, tenant_a.id, 0, 5, 64, res);
	ck_assert_uint_eq(res[0], 5);
	kvp_remote_close(r);
	unsetenv("KVP_REMOTE_URL");
	ck_assert_int_eq(kvp_remote_open_env(&cfg, &r, err, sizeof(err)),
			 -ENOENT);
}
END_TEST

START_TEST(bad_config)
{
	struct kvp_remote_config cfg = { .url = "redis://127.0.0.1:1",
					 .ns = ns_a, .ns_len = strlen(ns_a),
					 .verify = verify };
	struct kvp_remote *r = (void *)1;
	struct kvp_remote_get g = { 0 };
	char err[256];

	cfg.verify = NULL;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(r);
	cfg.verify = verify;
	cfg.ns_len = 0;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), -EINVAL);
	cfg.ns_len = KVP_REMOTE_MAX_NS + 1;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), -EINVAL);
	cfg.ns_len = 3;
	cfg.url = "redis://127.0.0.1:1?password_file=/nonexistent/pw";
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), -ENOENT);
	cfg.url = "redis://127.0.0.1:1";
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), 0);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 1), -EINVAL);
	ck_assert_int_eq(kvp_remote_publish(r, "k", 0, "v", 1), -EINVAL);
	ck_assert_int_eq(kvp_remote_get_many(r, &g, 0), 0);
	kvp_remote_close(r);
	kvp_remote_close(NULL);
}
END_TEST

int main(void)
{
	TCase *tc;
	Suite *s = kvp_test_redis_suite("remote", "server", 120, setup,
					teardown, &tc);

	if (!s)
		return 77; /* no redis-server: said why */
	tcase_add_test(tc, publish_then_fetch);
	tcase_add_test(tc, large_values_not_held);
	tcase_add_test(tc, parts_round_trip);
	tcase_add_test(tc, parts_of_two_publishes);
	tcase_add_test(tc, old_layout_not_read);
	tcase_add_test(tc, huge_value_not_read);
	tcase_add_test(tc, bad_values_are_misses);
	tcase_add_test(tc, two_tenants);
	tcase_add_test(tc, absent_at_start);
	tcase_add_test(tc, killed_and_restarted);
	tcase_add_test(tc, dead_dns_within_connect_timeout);
	tcase_add_test(tc, close_while_lookup_waits);
	tcase_add_test(tc, numeric_host_needs_no_thread);
	tcase_add_test(tc, unknown_host_said_so);
	tcase_add_test(tc, dns_down_said_so);
	tcase_add_test(tc, first_address_dead);
	tcase_add_test(tc, hung_server_times_out);
	tcase_add_test(tc, hung_at_auth_said_so);
	tcase_add_test(tc, acl_user_needs_getrange);
	tcase_add_test(tc, acl_user_needs_select);
	tcase_add_test(tc, full_queue_skips);
	tcase_add_test(tc, value_past_queue_bytes);
	tcase_add_test(tc, full_server);
	tcase_add_test(tc, auth_and_db);
	tcase_add_test(tc, async_fetch);
	tcase_add_test(tc, encode_on_publisher);
	tcase_add_test(tc, async_fetch_bounded);
	tc = kvp_test_tcase(s, "config", 30);
	tcase_add_test(tc, bad_config);
	return kvp_test_run(s);
}
