/*
 * test_remote_cluster.c - lib/remote's cluster routing against a real
 * 3-master Redis Cluster on loopback ports: the slot function against the
 * server's CLUSTER KEYSLOT, keys spread over the masters, MOVED after a
 * slot changes hands, ASK while it migrates, and a master killed mid-run
 * (its keys fail, counted; the others' are served; 0 wrong values).
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/remote/remote.h"
#include "tests/helpers/helpers.h"
#include "tests/helpers/redis_fx.h"

#define NODES 3
#define VAL 256

static struct kvp_test_redis nodes[NODES];
static const char ns[] = "model-y/tenant";

/* The value of key k: k's pattern, with k in its first word. */
static void value(uint64_t k, uint64_t *buf)
{
	kvp_test_fill(buf, VAL, k, 0);
	buf[0] = k;
}

static int verify(void *arg, const void *key, size_t keylen, void *val,
		  size_t len)
{
	uint64_t k, want[VAL / 8];

	if (keylen != 8 || len != VAL)
		return -1;
	memcpy(&k, key, 8);
	value(k, want);
	return memcmp(val, want, VAL) ? -1 : 0;
}

/* A tier on the first @seeds nodes, the URL's options @opts after them
 * ("" for none). */
static struct kvp_remote *open_cluster(int seeds, const char *opts)
{
	struct kvp_remote_config cfg = { .ns = ns, .ns_len = strlen(ns),
					 .verify = verify };
	struct kvp_remote *r;
	char url[512], err[256] = "";

	kvp_test_redis_url(url, sizeof(url), nodes, seeds, true);
	strncat(url, opts, sizeof(url) - strlen(url) - 1);
	cfg.url = url;
	ck_assert_msg(kvp_remote_open(&cfg, &r, err, sizeof(err)) == 0,
		      "%s: %s", url, err);
	return r;
}

static void publish(struct kvp_remote *r, uint64_t n)
{
	uint64_t buf[VAL / 8];

	for (uint64_t k = 0; k < n; k++) {
		value(k, buf);
		while (kvp_remote_publish(r, &k, 8, buf, VAL) == -EAGAIN)
			kvp_remote_flush(r, 1000);
	}
	ck_assert_int_eq(kvp_remote_flush(r, 30000), 0);
}

/* Fetch keys 0..n-1: hits (each checked), misses, errors into res. */
static void fetch(struct kvp_remote *r, uint64_t n, unsigned res[3])
{
	struct kvp_remote_get *g = calloc(n, sizeof(*g));
	uint64_t *keys = calloc(n, 8);
	uint64_t *bufs = malloc(n * VAL);
	int hits;

	res[0] = res[1] = res[2] = 0;
	for (uint64_t i = 0; i < n; i++) {
		keys[i] = i;
		g[i].key = &keys[i];
		g[i].key_len = 8;
		g[i].buf = bufs + i * (VAL / 8);
		g[i].buf_len = VAL;
	}
	hits = kvp_remote_get_many(r, g, n);
	for (uint64_t i = 0; i < n; i++) {
		if (g[i].status == 0) {
			uint64_t want[VAL / 8];

			value(i, want);
			ck_assert(g[i].len == VAL &&
				  !memcmp(g[i].buf, want, VAL));
			res[0]++;
		} else {
			res[g[i].status == -ENOENT ? 1 : 2]++;
		}
	}
	ck_assert_int_eq(hits, (int)res[0]);
	free(g);
	free(keys);
	free(bufs);
}

/* Keys of each node, by asking it (DBSIZE). */
static long long dbsize(int i)
{
	redisReply *rep = kvp_test_redis_cmd(&nodes[i], "DBSIZE");
	long long n = rep->integer;

	freeReplyObject(rep);
	return n;
}

/* The node (0..NODES-1) that serves @slot, by the split of the fixture. */
static int owner(unsigned slot)
{
	int i = 0;

	while (i + 1 < NODES && slot >= 16384u * (unsigned)(i + 1) / NODES)
		i++;
	return i;
}

static void setup(void)
{
	kvp_test_cluster_start(nodes, NODES);
}

static void teardown(void)
{
	for (int i = 0; i < NODES; i++)
		kvp_test_redis_stop(&nodes[i]);
}

START_TEST(slots_match_the_server)
{
	char key[64];

	for (int i = 0; i < 300; i++) {
		redisReply *rep;
		int len = snprintf(key, sizeof(key), "k%d%s", i * 7919,
				   i % 3 ? "" : "{tag}x");

		rep = kvp_test_redis_cmd(&nodes[0], "CLUSTER KEYSLOT %b", key,
					 (size_t)len);
		ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
		ck_assert_int_eq(kvp_remote_key_slot(key, (size_t)len),
				 rep->integer);
		freeReplyObject(rep);
	}
}
END_TEST

START_TEST(spread_over_masters)
{
	struct kvp_remote *r = open_cluster(1, ""); /* one seed finds the rest */
	unsigned res[3];

	publish(r, 600);
	fetch(r, 700, res);
	ck_assert_uint_eq(res[0], 600);
	ck_assert_uint_eq(res[1], 100);
	ck_assert_uint_eq(res[2], 0);
	for (int i = 0; i < NODES; i++)
		ck_assert_int_gt(dbsize(i), 100);
	ck_assert_int_eq(dbsize(0) + dbsize(1) + dbsize(2), 600);
	ck_assert_uint_ge(kvp_test_remote_stats(r).slot_refreshes_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).moved_total, 0);
	kvp_remote_close(r);
}
END_TEST

/* Key @k's Redis key (its only part's: the tests' values are small) and
 * slot. */
static unsigned rkey_of(uint64_t k, char *buf, size_t len)
{
	int n = kvp_remote_redis_key(ns, strlen(ns), &k, 8, 0, buf, len);

	return kvp_remote_key_slot(buf, (size_t)n);
}

static const char *node_id(int i)
{
	static char id[NODES][64];
	redisReply *rep = kvp_test_redis_cmd(&nodes[i], "CLUSTER MYID");

	snprintf(id[i], sizeof(id[i]), "%s", rep->str);
	freeReplyObject(rep);
	return id[i];
}

static void cmd_ok(int i, const char *fmt, const char *a, unsigned slot,
		   const char *b)
{
	redisReply *rep = kvp_test_redis_cmd(&nodes[i], fmt, slot, a, b);

	ck_assert_msg(rep->type == REDIS_REPLY_STATUS, "%s: %s", fmt,
		      rep->str ? rep->str : "?");
	freeReplyObject(rep);
}

/* Move key @k's slot from its owner to @to: MIGRATING/IMPORTING, then
 * MIGRATE of @move keys (the one key, or none), and, if @finish, SETSLOT
 * NODE on every master: the destination first, then the source, then
 * the others, Redis' order (the source never redirects to a node that
 * does not own the slot yet; it claims the slot no longer than it
 * must).  Once per cluster: the destination bumps its config epoch
 * without consensus, and a second move before that bump has spread can
 * bump another node to the same epoch; the loser of the tie gives the
 * slot back and Redis deletes the moved key (its "dirty slot"). */
static void migrate(uint64_t k, int to, bool move, bool finish)
{
	char rkey[256];
	unsigned slot = rkey_of(k, rkey, sizeof(rkey));
	int from = owner(slot), order[NODES];
	redisReply *rep;

	ck_assert_int_ne(from, to);
	cmd_ok(to, "CLUSTER SETSLOT %u IMPORTING %s", node_id(from), slot, "");
	cmd_ok(from, "CLUSTER SETSLOT %u MIGRATING %s", node_id(to), slot, "");
	if (move) {
		rep = kvp_test_redis_cmd(&nodes[from],
					 "MIGRATE 127.0.0.1 %d %s 0 5000",
					 nodes[to].port, rkey);
		/* "NOKEY": the key was not on the source, and a later
		 * count would report a lost key where none was moved */
		ck_assert_msg(rep->type == REDIS_REPLY_STATUS &&
				  !strcmp(rep->str, "OK"),
			      "MIGRATE: %s", rep->str ? rep->str : "?");
		freeReplyObject(rep);
	}
	if (!finish)
		return;
	order[0] = to;
	order[1] = from;
	for (int i = 0, j = 2; i < NODES; i++)
		if (i != from && i != to)
			order[j++] = i;
	for (int j = 0; j < NODES; j++)
		cmd_ok(order[j], "CLUSTER SETSLOT %u NODE %s", node_id(to),
		       slot, "");
}

START_TEST(moved_is_followed)
{
	struct kvp_remote *r = open_cluster(NODES, "");
	char rkey[256];
	unsigned res[3], slot;
	uint64_t k = 5;

	publish(r, 50);
	fetch(r, 50, res); /* the map is learnt */
	ck_assert_uint_eq(res[0], 50);
	slot = rkey_of(k, rkey, sizeof(rkey));
	migrate(k, (owner(slot) + 1) % NODES, true, true);
	/* the old owner answers MOVED; the new one has the value */
	fetch(r, 50, res);
	ck_assert_msg(res[0] == 50, "after MOVED: %u hits, %u misses, %u "
		      "errors (moved %" PRIu64 ", ask %" PRIu64 ")", res[0],
		      res[1], res[2], kvp_test_remote_stats(r).moved_total,
		      kvp_test_remote_stats(r).ask_total);
	ck_assert_uint_ge(kvp_test_remote_stats(r).moved_total, 1);
	kvp_remote_close(r);
}
END_TEST

START_TEST(ask_is_followed)
{
	struct kvp_remote *r = open_cluster(NODES, "");
	char rkey[256];
	unsigned res[3], slot;
	uint64_t k = 9;

	publish(r, 50);
	fetch(r, 50, res);
	ck_assert_uint_eq(res[0], 50);
	slot = rkey_of(k, rkey, sizeof(rkey));
	/* mid-migration: the key has moved, the slot not yet */
	migrate(k, (owner(slot) + 2) % NODES, true, false);
	fetch(r, 50, res);
	ck_assert_uint_eq(res[0], 50);
	ck_assert_uint_ge(kvp_test_remote_stats(r).ask_total, 1);
	ck_assert_uint_eq(kvp_test_remote_stats(r).moved_total, 0);
	kvp_remote_close(r);
}
END_TEST

/*
 * A slot left MIGRATING on its owner with no node importing it: a key the
 * owner lacks is ASKed to the other node, which answers MOVED back, and
 * so on.  After LINK_MAX_ROUNDS redirections the key is an error (never
 * a miss), and the tier says once why, where before it said nothing.
 */
START_TEST(redirect_loop_is_said)
{
	struct kvp_remote *r = open_cluster(NODES, "");
	struct kvp_test_stderr cap;
	char rkey[256], said[4096];
	unsigned res[3], slot;
	uint64_t k = 7;
	int from;
	redisReply *rep;

	publish(r, 50);
	fetch(r, 50, res);
	ck_assert_uint_eq(res[0], 50);
	slot = rkey_of(k, rkey, sizeof(rkey));
	from = owner(slot);
	cmd_ok(from, "CLUSTER SETSLOT %u MIGRATING %s",
	       node_id((from + 1) % NODES), slot, "");
	rep = kvp_test_redis_cmd(&nodes[from], "DEL %s", rkey);
	ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
	freeReplyObject(rep);
	kvp_test_stderr_start(&cap);
	fetch(r, 50, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_msg(res[0] == 49 && res[2] == 1, "%u hits, %u misses, %u "
		      "errors", res[0], res[1], res[2]);
	ck_assert_msg(strstr(said, "redirected"), "said: '%s'", said);
	kvp_remote_close(r);
}
END_TEST

START_TEST(master_killed_mid_run)
{
	struct kvp_remote *r = open_cluster(NODES, "");
	unsigned res[3], on_dead = 0;
	char rkey[256];

	publish(r, 300);
	fetch(r, 300, res);
	ck_assert_uint_eq(res[0], 300);
	for (uint64_t k = 0; k < 300; k++)
		on_dead += owner(rkey_of(k, rkey, sizeof(rkey))) == 2;
	ck_assert_uint_gt(on_dead, 0);
	kvp_test_redis_kill(&nodes[2]);
	/* twice: the second while the dead node backs off */
	for (int pass = 0; pass < 2; pass++) {
		fetch(r, 300, res);
		ck_assert_uint_eq(res[0], 300 - on_dead);
		ck_assert_uint_eq(res[2], on_dead);
	}
	ck_assert_uint_eq(kvp_test_remote_stats(r).errors_total, 2 * on_dead);
	/* publishing to the live masters goes on */
	publish(r, 300);
	ck_assert_uint_ge(kvp_test_remote_stats(r).publish_errors_total, on_dead);
	kvp_remote_close(r);
}
END_TEST

/*
 * Nodes that announce no address (cluster-preferred-endpoint-type
 * unknown-endpoint): CLUSTER SLOTS names them nil and MOVED ":PORT", both
 * meaning the host of the node that answered.  The map took no slot of a
 * nil and no MOVED without a host was followed: most keys failed, and a
 * slot moved failed its keys for good.
 */
/* Every key served, before and after a slot moves, with the nodes'
 * cluster-preferred-endpoint-type @type. */
static void served_with_endpoint(const char *type)
{
	struct kvp_remote *r;
	char rkey[256];
	unsigned res[3], slot;
	uint64_t k = 5;

	for (int i = 0; i < NODES; i++) {
		redisReply *rep = kvp_test_redis_cmd(
			&nodes[i], "CONFIG SET cluster-preferred-endpoint-type "
				   "%s", type);

		ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
		freeReplyObject(rep);
	}
	r = open_cluster(NODES, "");
	publish(r, 50);
	fetch(r, 50, res);
	ck_assert_msg(res[0] == 50, "%s: %u of 50 served", type, res[0]);
	slot = rkey_of(k, rkey, sizeof(rkey));
	migrate(k, (owner(slot) + 1) % NODES, true, true);
	fetch(r, 50, res);
	ck_assert_msg(res[0] == 50, "%s: %u of 50 served after MOVED: %u "
		      "misses, %u errors (moved %" PRIu64 ", ask %" PRIu64 ")",
		      type, res[0], res[1], res[2],
		      kvp_test_remote_stats(r).moved_total,
		      kvp_test_remote_stats(r).ask_total);
	ck_assert_uint_ge(kvp_test_remote_stats(r).moved_total, 1);
	kvp_remote_close(r);
}

START_TEST(moved_to_the_same_host)
{
	served_with_endpoint("unknown-endpoint");
}
END_TEST

/*
 * Nodes to be named by hostname that have none (cluster-preferred-
 * endpoint-type hostname, no cluster-announce-hostname): CLUSTER SLOTS
 * and MOVED name them "?", Redis' "unknown" too; CLUSTER SLOTS gives the
 * node's ip beside it.  "?" was taken for a host name: no key of such a
 * node was served.
 */
START_TEST(no_hostname_announced)
{
	served_with_endpoint("hostname");
}
END_TEST

/*
 * Fetch the 300 keys with 2 masters stopped (@why: how) into @res: their
 * commands time out together, one wait for both, not one timeout_ms
 * after the other.
 */
static void fetch_past_two_stopped(struct kvp_remote *r, unsigned res[3],
				   const char *why)
{
	struct kvp_remote_stats was = kvp_test_remote_stats(r), now;

	fetch(r, 300, res);
	now = kvp_test_remote_stats(r);
	ck_assert_msg(now.timeouts_total - was.timeouts_total == 2 &&
			      now.timeout_waits_total -
					      was.timeout_waits_total == 1,
		      "a fetch with 2 masters stopped, %s: %" PRIu64
		      " timeouts in %" PRIu64 " waits, not 2 in 1",
		      why, now.timeouts_total - was.timeouts_total,
		      now.timeout_waits_total - was.timeout_waits_total);
}

/*
 * Two of three masters stopped: a fetch asks every master before it
 * waits on any, so it ends about one timeout after it began, not one
 * timeout per stopped master; the live master's keys are served.
 */
START_TEST(stopped_masters_cost_one_timeout)
{
	struct kvp_remote *r = open_cluster(NODES, "?timeout_ms=1000");
	char rkey[256];
	unsigned res[3], on_live = 0;

	publish(r, 300);
	fetch(r, 300, res); /* the map is learnt */
	ck_assert_uint_eq(res[0], 300);
	for (uint64_t k = 0; k < 300; k++)
		on_live += owner(rkey_of(k, rkey, sizeof(rkey))) == 0;
	kvp_test_redis_pause(&nodes[1], true);
	kvp_test_redis_pause(&nodes[2], true);
	fetch_past_two_stopped(r, res, "their connections open");
	kvp_test_redis_pause(&nodes[1], false);
	kvp_test_redis_pause(&nodes[2], false);
	ck_assert_uint_eq(res[0], on_live);
	ck_assert_uint_eq(res[2], 300 - on_live);
	kvp_remote_close(r);
}
END_TEST

/*
 * The same with a password, a fetch after the stopped masters' back-off:
 * each is connected anew, and its AUTH goes unanswered.  The AUTHs wait
 * together too, not one timeout_ms after another.
 */
START_TEST(stopped_masters_with_password)
{
	struct kvp_remote_config cfg = { .ns = ns, .ns_len = strlen(ns),
					 .verify = verify };
	struct kvp_remote *r;
	char url[512], seeds[256], err[256] = "", rkey[256], said[4096];
	struct kvp_test_stderr cap;
	unsigned res[3], on_live = 0;
	uint64_t refused;

	/* node 0 alone would call the cluster down (CLUSTERDOWN) a node
	 * timeout after the others stopped: not within this test */
	for (int i = 0; i < NODES; i++) {
		redisReply *rep = kvp_test_redis_cmd(
			&nodes[i], "CONFIG SET cluster-node-timeout 60000 "
				   "requirepass s3cret");

		ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
		freeReplyObject(rep);
	}
	kvp_test_redis_url(seeds, sizeof(seeds), nodes, NODES, true);
	snprintf(url, sizeof(url), "redis+cluster://:s3cret@%s?timeout_ms=1000",
		 seeds + strlen("redis+cluster://"));
	cfg.url = url;
	ck_assert_msg(kvp_remote_open(&cfg, &r, err, sizeof(err)) == 0,
		      "%s: %s", url, err);
	publish(r, 300);
	fetch(r, 300, res);
	ck_assert_uint_eq(res[0], 300);
	for (uint64_t k = 0; k < 300; k++)
		on_live += owner(rkey_of(k, rkey, sizeof(rkey))) == 0;
	kvp_test_redis_pause(&nodes[1], true);
	kvp_test_redis_pause(&nodes[2], true);
	fetch(r, 300, res); /* their connections time out, closed */
	ck_assert_uint_eq(res[0], on_live);
	usleep(300000); /* past their back-off: connected anew */
	fetch_past_two_stopped(r, res, "connected anew with AUTH");
	kvp_test_redis_pause(&nodes[1], false);
	kvp_test_redis_pause(&nodes[2], false);
	ck_assert_uint_eq(res[0], on_live);
	ck_assert_uint_eq(res[2], 300 - on_live);
	kvp_remote_close(r);
	/* a wrong password, AUTH sent ahead of the reads: refused, said,
	 * and no reply after it taken for a value */
	snprintf(url, sizeof(url), "redis+cluster://:wrong@%s",
		 seeds + strlen("redis+cluster://"));
	cfg.url = url;
	kvp_test_stderr_start(&cap);
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), 0);
	usleep(300000); /* past the back-off of the refusals at open */
	refused = kvp_test_remote_stats(r).connect_errors_total;
	fetch(r, 300, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_uint_eq(res[2], 300);
	ck_assert_uint_eq(kvp_test_remote_stats(r).connect_errors_total,
			  refused + NODES);
	ck_assert_msg(strstr(said, "refused AUTH"), "stderr said: %s", said);
	kvp_remote_close(r);
}
END_TEST

/*
 * The first seed among the stopped masters: a fetch after their back-off
 * asks for the slot map again (their failure made it stale), and asked
 * each stopped master for it in turn, a timeout each, before the one
 * that answers.  A node whose connection is open is asked first.
 */
START_TEST(stopped_first_seed)
{
	struct kvp_remote *r;
	char rkey[256];
	unsigned res[3], on_live = 0;

	/* node 2 alone would call the cluster down a node timeout after
	 * the others stopped: not within this test */
	for (int i = 0; i < NODES; i++) {
		redisReply *rep = kvp_test_redis_cmd(
			&nodes[i], "CONFIG SET cluster-node-timeout 60000");

		ck_assert_int_eq(rep->type, REDIS_REPLY_STATUS);
		freeReplyObject(rep);
	}
	r = open_cluster(NODES, "?timeout_ms=1000");
	publish(r, 300);
	fetch(r, 300, res);
	ck_assert_uint_eq(res[0], 300);
	for (uint64_t k = 0; k < 300; k++)
		on_live += owner(rkey_of(k, rkey, sizeof(rkey))) == 2;
	kvp_test_redis_pause(&nodes[0], true);
	kvp_test_redis_pause(&nodes[1], true);
	fetch(r, 300, res); /* their connections time out, closed */
	ck_assert_uint_eq(res[0], on_live);
	usleep(300000); /* past their back-off */
	fetch_past_two_stopped(r, res, "the first 2 seeds");
	kvp_test_redis_pause(&nodes[0], false);
	kvp_test_redis_pause(&nodes[1], false);
	ck_assert_uint_eq(res[0], on_live);
	ck_assert_uint_eq(res[2], 300 - on_live);
	kvp_remote_close(r);
}
END_TEST

/*
 * The slot map asked of a stopped node: CLUSTER SLOTS past the timeout
 * is counted as any command's timeout, and a wait (it was not counted:
 * a stopped seed cost a timeout that no counter showed).
 */
START_TEST(slot_map_timeout_counted)
{
	struct kvp_remote *r;
	struct kvp_remote_stats st;
	unsigned res[3];

	kvp_test_redis_pause(&nodes[0], true);
	r = open_cluster(1, "?timeout_ms=200"); /* connects: the kernel
						   accepts for it */
	fetch(r, 50, res);
	kvp_test_redis_pause(&nodes[0], false);
	st = kvp_test_remote_stats(r);
	ck_assert_uint_eq(res[2], 50);
	ck_assert_uint_eq(st.slot_refreshes_total, 0);
	ck_assert_uint_eq(st.timeouts_total, 1);
	ck_assert_uint_eq(st.timeout_waits_total, 1);
	kvp_remote_close(r);
}
END_TEST

/* Lines of @s. */
static int lines(const char *s)
{
	int n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/*
 * redis:// (one server) at a cluster's node: the keys of other nodes'
 * slots answer MOVED, which only a cluster URL follows.  stderr says to
 * use one, once for the reads and once for the writes, not once for each
 * slot and address MOVED named.
 */
START_TEST(plain_url_at_a_cluster)
{
	struct kvp_remote_config cfg = { .ns = ns, .ns_len = strlen(ns),
					 .verify = verify };
	struct kvp_test_stderr cap;
	struct kvp_remote *r;
	char url[128], err[256] = "", said[8192];
	unsigned res[3];

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", nodes[0].port);
	cfg.url = url;
	ck_assert_int_eq(kvp_remote_open(&cfg, &r, err, sizeof(err)), 0);
	kvp_test_stderr_start(&cap);
	publish(r, 50);
	fetch(r, 50, res);
	kvp_test_stderr_end(&cap, said, sizeof(said));
	ck_assert_uint_gt(res[2], 0); /* other nodes' keys */
	ck_assert_uint_eq(res[0] + res[2], 50);
	ck_assert_msg(strstr(said, "redis+cluster://") && lines(said) == 2,
		      "stderr said: %s", said);
	kvp_remote_close(r);
}
END_TEST

int main(void)
{
	TCase *tc;
	Suite *s = kvp_test_redis_suite("remote_cluster", "cluster", 120,
					setup, teardown, &tc);

	if (!s)
		return 77; /* no redis-server: said why */
	tcase_add_test(tc, slots_match_the_server);
	tcase_add_test(tc, spread_over_masters);
	tcase_add_test(tc, moved_is_followed);
	tcase_add_test(tc, moved_to_the_same_host);
	tcase_add_test(tc, no_hostname_announced);
	tcase_add_test(tc, ask_is_followed);
	tcase_add_test(tc, redirect_loop_is_said);
	tcase_add_test(tc, master_killed_mid_run);
	tcase_add_test(tc, stopped_masters_cost_one_timeout);
	tcase_add_test(tc, stopped_masters_with_password);
	tcase_add_test(tc, stopped_first_seed);
	tcase_add_test(tc, slot_map_timeout_counted);
	tcase_add_test(tc, plain_url_at_a_cluster);
	return kvp_test_run(s);
}
