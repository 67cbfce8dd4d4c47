/*
 * redis_fx.h - real redis-server instances for the tests: single servers
 * and a Redis Cluster of masters, on free loopback ports, each in a
 * temporary folder of its own.
 *
 * A server is a child of the process that started it, made to die with
 * it (PR_SET_PDEATHSIG), and every server still running is killed and its
 * folder removed at exit: a test that fails, or is killed by its timeout,
 * leaves no server behind.  Use them inside a test (Check forks one
 * process per test); they report their own failures with ck_assert.
 */
#ifndef KVP_TEST_REDIS_FX_H
#define KVP_TEST_REDIS_FX_H

#include <check.h>
#include <stdbool.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "lib/remote/remote.h"

struct kvp_test_redis {
	pid_t pid;	/* the server, 0 when not running */
	int port;	/* its loopback port (cluster bus: port + 10000) */
	char dir[64];	/* its folder: log, nodes.conf */
	const char *extra[16]; /* extra arguments, NULL-terminated */
	bool stopped;	/* SIGSTOPped by kvp_test_redis_pause */
};

/* NULL when redis-server can be run, else why not (for kvp_test_skip). */
const char *kvp_test_missing_redis(void);

/*
 * kvp_test_redis_suite - for main(): suite @name with one test case
 * @tcase (@timeout_s a test; @setup and @teardown, which start and stop
 * the servers, its checked fixture) into *@tc.  NULL when redis-server
 * cannot run, the skip said (kvp_test_skip): main returns 77.
 */
Suite *kvp_test_redis_suite(const char *name, const char *tcase,
			    int timeout_s, void (*setup)(void),
			    void (*teardown)(void), TCase **tc);

/*
 * kvp_test_redis_start - start a server with @extra (NULL-terminated
 * "--name", "value" pairs, or NULL) on a free port, in a fresh folder,
 * and wait until it answers PING.  ck_asserts that it does.
 */
void kvp_test_redis_start(struct kvp_test_redis *s, const char *const *extra);

/* Kill @s (SIGKILL) and wait for it; its port and folder are kept. */
void kvp_test_redis_kill(struct kvp_test_redis *s);

/* Start @s again on its port and folder, as it was started (empty: the
 * tests' servers save nothing). */
void kvp_test_redis_restart(struct kvp_test_redis *s);

/* SIGSTOP @s (a server that hangs) or SIGCONT it. */
void kvp_test_redis_pause(struct kvp_test_redis *s, bool stop);

/* Kill @s and remove its folder. */
void kvp_test_redis_stop(struct kvp_test_redis *s);

/* A connection to @s (ck_asserted); redisFree it. */
redisContext *kvp_test_redis_connect(const struct kvp_test_redis *s);

/* Run a command (redisCommand's format) on a fresh connection to @s;
 * its reply (ck_asserted non-NULL), freeReplyObject it. */
redisReply *kvp_test_redis_cmd(const struct kvp_test_redis *s,
			       const char *fmt, ...);

/*
 * kvp_test_cluster_start - @n masters (2..8) with cluster mode on, the
 * 16384 slots split evenly in order, each master its own config epoch
 * (1..@n), joined by CLUSTER MEET; returns when
 * every node sees cluster_state:ok and all @n masters.
 * cluster-require-full-coverage is off: when a master dies, the others go
 * on serving their slots.
 */
void kvp_test_cluster_start(struct kvp_test_redis *nodes, int n);

/* @r's statistics now (kvp_remote_stats_read), as a value. */
struct kvp_remote_stats kvp_test_remote_stats(struct kvp_remote *r);

/* The URL "redis://127.0.0.1:PORT" (or redis+cluster://, all nodes). */
void kvp_test_redis_url(char *buf, size_t len, const struct kvp_test_redis *s,
			int n, bool cluster);

/* stderr into a file from kvp_test_stderr_start until _end, which puts
 * what was written into @out (@len bytes, NUL-ended): the tier's
 * warnings. */
struct kvp_test_stderr {
	int fd, saved;
	char path[32];
};
void kvp_test_stderr_start(struct kvp_test_stderr *c);
void kvp_test_stderr_end(struct kvp_test_stderr *c, char *out, size_t len);

#endif /* KVP_TEST_REDIS_FX_H */
