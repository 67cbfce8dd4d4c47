/*
 * test_model_remote.c - a prompt's chunks through Redis on the mapped path
 * (model_remote.h's kvp_model_remote_bind), against a real redis-server:
 * instance A puts a prompt's chunks (its directory and Redis); instance B,
 * with another empty directory, binds each from Redis as its KV cache's
 * store (lib/cache/cache_store.h) and reads back A's bytes, and its
 * directory has them afterwards.  A chunk Redis lacks, one tampered with
 * and a server that hangs are misses, counted, with nothing bound, and
 * the hung one costs at most the timeout.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/cache/cache_store.h"
#include "lib/model/model_remote.h"
#include "tests/helpers/helpers.h"
#include "tests/helpers/redis_fx.h"

#define GRAN	 4096u /* a KV block's stride, here */
#define PER	 2u    /* granules a chunk */
#define C	 16u   /* tokens a chunk */
#define CHUNKS	 4u
#define NGRAN	 (CHUNKS * PER + 4) /* the KV cache's store */

static struct kvp_test_redis srv;
static char root[200];

/* One instance: a directory, its prompt, and the glue to Redis. */
struct inst {
	char dir[300];
	struct kvp_cache *cache;
	struct kvp_prefix *prefix;
	struct kvp_model_remote *mr;
	struct kvp_store *store; /* a cache store over memory */
};

static const struct kvp_rec_keyctx ctx = { .geo = { 7 } };
static uint32_t prompt[CHUNKS * C + 1];

static void inst_open(struct inst *in, const char *name, const char *opts)
{
	struct kvp_prefix_opts po = { 0 };
	struct kvp_model_remote_opts ro = { 0 };
	struct kvp_store *mem;
	char err[300], url[256];

	snprintf(in->dir, sizeof(in->dir), "%s/%s", root, name);
	ck_assert_msg(kvp_cache_open(in->dir, NULL, &in->cache, err,
				     sizeof(err), NULL, 0) == 0,
		      "open: %s", err);
	po.cache = in->cache;
	po.ctx = ctx;
	ck_assert_int_eq(kvp_prefix_create(&po, &in->prefix), 0);
	ck_assert_int_eq(kvp_prefix_set_prompt(in->prefix, prompt,
					       CHUNKS * C + 1, C),
			 0);
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s", srv.port,
		 opts ? opts : "?timeout_ms=10000");
	ro.url = url;
	ro.prefix = in->prefix;
	ro.ctx = &ctx;
	ck_assert_msg(kvp_model_remote_open(&ro, &in->mr, err, sizeof(err)) ==
			      0,
		      "remote: %s", err);
	ck_assert_int_eq(kvp_store_memory_create(NGRAN * GRAN, &mem), 0);
	ck_assert_int_eq(kvp_cache_store_create(mem, in->cache, GRAN,
						&in->store),
			 0);
}

static void inst_close(struct inst *in)
{
	kvp_store_destroy(in->store);
	kvp_model_remote_close(in->mr, 30000);
	kvp_prefix_destroy(in->prefix);
	kvp_cache_close(in->cache);
}

/* A puts every chunk: its directory and Redis (flushed at close). */
static void instance_a(void)
{
	struct inst a;
	char *p = malloc(PER * GRAN);

	inst_open(&a, "A", NULL);
	for (uint32_t i = 0; i < CHUNKS; i++) {
		kvp_test_fill(p, PER * GRAN, 50 + i, 0);
		kvp_model_remote_put(a.mr, i, p, PER * GRAN);
	}
	inst_close(&a);
	free(p);
}

/* Chunk i bound at granules 2i+1, 2i (reversed: the payload's order is
 * the offsets', whatever they are). */
static int bind_chunk(struct inst *b, uint32_t i)
{
	const uint64_t offs[PER] = { (2 * i + 1) * GRAN, 2 * i * GRAN };

	return kvp_model_remote_bind(b->mr, i, b->store, PER * GRAN, offs,
				     PER);
}

/* The Redis key of chunk i's first part (model_remote.c's namespace: a
 * hash of the key context, its first 16 bytes). */
static void redis_key(struct inst *b, uint32_t i, char *rkey, size_t len)
{
	struct kvp_rec_key k;
	uint8_t ns[32];

	ck_assert_int_eq(kvp_prefix_key(b->prefix, i, &k), 0);
	ck_assert_int_eq(kvp_rec_hash(&ctx, sizeof(ctx), ns), 0);
	ck_assert_int_gt(kvp_remote_redis_key(ns, 16, &k, sizeof(k), 0, rkey,
					      len),
			 0);
}

static void setup(void)
{
	static int seq;

	snprintf(root, sizeof(root), "/var/tmp/kvp-test-mremote-%d.%d",
		 (int)getpid(), seq++);
	ck_assert_int_eq(mkdir(root, 0700), 0);
	kvp_test_redis_start(&srv, NULL);
	for (uint32_t t = 0; t < CHUNKS * C + 1; t++)
		prompt[t] = 1 + t * 7 % 500;
}

static void teardown(void)
{
	kvp_test_redis_stop(&srv);
	kvp_test_rm_tree(root);
}

START_TEST(bound_from_redis)
{
	struct kvp_model_remote_stats ms;
	struct kvp_cache_store_stats ss;
	char *buf = malloc(NGRAN * GRAN);
	struct inst b;

	instance_a();
	inst_open(&b, "B", NULL);
	for (uint32_t i = 0; i < CHUNKS; i++)
		ck_assert_int_eq(bind_chunk(&b, i), 0);
	ck_assert_int_eq(kvp_store_pread(b.store, buf, NGRAN * GRAN, 0), 0);
	for (uint32_t i = 0; i < CHUNKS; i++) {
		/* granule 2i holds unit 1 of chunk i, 2i + 1 its unit 0 */
		ck_assert_int_lt(kvp_test_check(buf + 2 * i * GRAN, GRAN,
						50 + i, GRAN),
				 0);
		ck_assert_int_lt(kvp_test_check(buf + (2 * i + 1) * GRAN, GRAN,
						50 + i, 0),
				 0);
	}
	kvp_model_remote_stats(b.mr, &ms, NULL);
	ck_assert_uint_eq(ms.chunks_fetched, CHUNKS);
	ck_assert_uint_eq(ms.chunks_mapped, CHUNKS);
	ck_assert_uint_eq(ms.chunks_missed, 0);
	kvp_cache_store_stats(b.store, &ss);
	ck_assert_uint_eq(ss.records, CHUNKS);
	ck_assert_uint_eq(ss.rejected, 0);
	/* and B's own directory has them, for its next run */
	kvp_prefix_drain(b.prefix);
	for (uint32_t i = 0; i < CHUNKS; i++) {
		struct kvp_rec_key k;

		ck_assert_int_eq(kvp_prefix_key(b.prefix, i, &k), 0);
		ck_assert(kvp_cache_contains(b.cache, &k));
	}
	inst_close(&b);
	free(buf);
}
END_TEST

/*
 * A prompt that attends to its history reads each chunk (get), then maps
 * it (bind): each chunk from Redis is queued for B's directory once.
 */
START_TEST(got_then_bound_queued_once)
{
	struct kvp_prefix_stats ps;
	char *buf = malloc(PER * GRAN);
	struct inst b;

	instance_a();
	inst_open(&b, "B", NULL);
	for (uint32_t i = 0; i < CHUNKS; i++) {
		ck_assert_int_eq(kvp_model_remote_get(b.mr, i, buf, PER * GRAN),
				 0);
		ck_assert_int_lt(kvp_test_check(buf, PER * GRAN, 50 + i, 0), 0);
		ck_assert_int_eq(bind_chunk(&b, i), 0);
	}
	kvp_prefix_drain(b.prefix);
	kvp_prefix_stats(b.prefix, &ps);
	ck_assert_uint_eq(ps.queued, CHUNKS);
	ck_assert_uint_eq(ps.stored, CHUNKS);
	inst_close(&b);
	free(buf);
}
END_TEST

START_TEST(misses_bind_nothing)
{
	struct kvp_model_remote_stats ms;
	struct kvp_remote_stats rs;
	struct kvp_cache_store_stats ss;
	char rkey[256], *buf = malloc(PER * GRAN);
	redisReply *rep;
	struct inst b;

	instance_a();
	/* chunk 2 tampered with in Redis: one byte of its payload */
	inst_open(&b, "B", NULL);
	redis_key(&b, 2, rkey, sizeof(rkey));
	rep = kvp_test_redis_cmd(&srv, "SETRANGE %s 300 XXXX", rkey);
	freeReplyObject(rep);
	/* chunk 3 gone */
	redis_key(&b, 3, rkey, sizeof(rkey));
	rep = kvp_test_redis_cmd(&srv, "DEL %s", rkey);
	freeReplyObject(rep);
	ck_assert_int_eq(bind_chunk(&b, 2), -ENOENT);
	ck_assert_int_eq(bind_chunk(&b, 3), -ENOENT);
	/* the get that follows a failed bind counts the miss, once */
	ck_assert_int_ne(kvp_model_remote_get(b.mr, 2, buf, PER * GRAN), 0);
	kvp_model_remote_stats(b.mr, &ms, &rs);
	ck_assert_uint_eq(ms.chunks_missed, 1);
	ck_assert_uint_eq(ms.chunks_mapped, 0);
	ck_assert_uint_eq(rs.verify_failed_total, 1);
	kvp_cache_store_stats(b.store, &ss);
	ck_assert_uint_eq(ss.records, 0);
	ck_assert_uint_eq(ss.bound_granules, 0);
	inst_close(&b);

	/* a server that hangs: a miss once the command times out (a bind
	 * that waited on it for good would end at the case's timeout) */
	inst_open(&b, "B2", "?timeout_ms=300");
	kvp_test_redis_pause(&srv, true);
	ck_assert_int_eq(bind_chunk(&b, 0), -ENOENT);
	kvp_test_redis_pause(&srv, false);
	kvp_model_remote_stats(b.mr, NULL, &rs);
	ck_assert_uint_ge(rs.timeouts_total + rs.errors_total, 1);
	kvp_cache_store_stats(b.store, &ss);
	ck_assert_uint_eq(ss.bound_granules, 0);
	inst_close(&b);
	free(buf);
}
END_TEST

/*
 * A well-formed record whose payload is 8 bytes shorter than a chunk's,
 * padded to a chunk's record length with 8 other bytes: its check covers
 * only what it says it holds, so the padding was served as the chunk's
 * last 8 bytes.  It is a failed verification: nothing read or bound.
 */
START_TEST(short_record_not_served)
{
	size_t len = PER * GRAN, rec_len = kvp_rec_size(len);
	char *pay = malloc(len), *rec = malloc(rec_len);
	char *part = malloc(rec_len + KVP_REMOTE_PART_HEADER);
	struct kvp_model_remote_stats ms;
	struct kvp_remote_stats rs;
	struct kvp_rec_key k;
	char rkey[256];
	uint8_t ns[32];
	struct inst b;
	redisReply *rep;
	int n;

	instance_a();
	inst_open(&b, "B", NULL);
	ck_assert_int_eq(kvp_prefix_key(b.prefix, 1, &k), 0);
	kvp_test_fill(pay, len, 50 + 1, 0);
	ck_assert_int_eq(kvp_rec_seal(&k, pay, len - 8, NULL, rec), 0);
	memset(rec + rec_len - 8, 0x5a, 8);
	ck_assert_int_eq(kvp_rec_hash(&ctx, sizeof(ctx), ns), 0);
	n = kvp_remote_part_value(ns, 16, &k, sizeof(k), rec, rec_len, 1, 0,
				  part, rec_len + KVP_REMOTE_PART_HEADER);
	ck_assert_int_gt(n, 0);
	redis_key(&b, 1, rkey, sizeof(rkey));
	rep = kvp_test_redis_cmd(&srv, "SET %s %b", rkey, part, (size_t)n);
	freeReplyObject(rep);
	ck_assert_int_eq(bind_chunk(&b, 1), -ENOENT);
	ck_assert_int_eq(kvp_model_remote_get(b.mr, 1, pay, len), -ENOENT);
	kvp_model_remote_stats(b.mr, &ms, &rs);
	ck_assert_uint_eq(ms.chunks_fetched, 0);
	ck_assert_uint_eq(rs.verify_failed_total, 1);
	inst_close(&b);
	free(pay);
	free(rec);
	free(part);
}
END_TEST

int main(void)
{
	TCase *tc;
	Suite *s = kvp_test_redis_suite("model_remote", "mapped", 180, setup,
					teardown, &tc);

	if (!s)
		return 77; /* no redis-server: said why */
	tcase_add_test(tc, bound_from_redis);
	tcase_add_test(tc, got_then_bound_queued_once);
	tcase_add_test(tc, misses_bind_nothing);
	tcase_add_test(tc, short_record_not_served);
	return kvp_test_run(s);
}
