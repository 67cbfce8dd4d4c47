/* redis_fx.c - real redis-server instances for the tests (redis_fx.h). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/helpers.h"
#include "tests/helpers/redis_fx.h"

#define MAX_LIVE 32

/* Servers this process started and has not stopped: killed at exit. */
static struct kvp_test_redis *live[MAX_LIVE];
static bool atexit_set;

static int rm_one(const char *path, const struct stat *st, int flag,
		  struct FTW *ftw)
{
	remove(path);
	return 0;
}

static void rm_tree(const char *dir)
{
	if (dir[0])
		nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void reap(struct kvp_test_redis *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
	}
	s->pid = 0;
}

static void kill_all(void)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (live[i]) {
			reap(live[i]);
			rm_tree(live[i]->dir);
			live[i] = NULL;
		}
}

static void track(struct kvp_test_redis *s, bool on)
{
	if (!atexit_set) {
		atexit(kill_all);
		atexit_set = true;
	}
	for (int i = 0; i < MAX_LIVE; i++)
		if (live[i] == s)
			live[i] = NULL;
	for (int i = 0; on && i < MAX_LIVE; i++)
		if (!live[i]) {
			live[i] = s;
			return;
		}
}

const char *kvp_test_missing_redis(void)
{
	if (system("command -v redis-server >/dev/null 2>&1"))
		return "redis-server not found (make installs it: apt-get "
		       "install redis-server redis-tools)";
	return NULL;
}

Suite *kvp_test_redis_suite(const char *name, const char *tcase,
			    int timeout_s, void (*setup)(void),
			    void (*teardown)(void), TCase **tc)
{
	const char *why = kvp_test_missing_redis();
	Suite *s;

	if (why) {
		kvp_test_skip("%s", why);
		return NULL;
	}
	s = suite_create(name);
	*tc = kvp_test_tcase(s, tcase, timeout_s);
	tcase_add_checked_fixture(*tc, setup, teardown);
	return s;
}

static bool port_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0)
		return false;
	ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* A port whose cluster bus (+10000) is free too: from 20000..29999,
 * below the kernel's ephemeral range, so that no client takes it. */
static int free_port(void)
{
	static unsigned seed;

	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)kvp_test_now_ns();
	for (int tries = 0; tries < 1000; tries++) {
		int port = 20000 + (int)(rand_r(&seed) % 10000);

		if (port_free(port) && port_free(port + 10000))
			return port;
	}
	return -1;
}

static pid_t spawn(struct kvp_test_redis *s)
{
	char port[16], log[96];
	const char *argv[64] = { "redis-server", "--port", port, "--bind",
				 "127.0.0.1", "--dir", s->dir, "--save", "",
				 "--appendonly", "no", "--protected-mode",
				 "no", "--daemonize", "no", "--logfile", log };
	int argc = 17;
	pid_t parent = getpid(), pid;

	snprintf(port, sizeof(port), "%d", s->port);
	snprintf(log, sizeof(log), "%s/log", s->dir);
	for (int i = 0; s->extra[i] && argc < 62; i++)
		argv[argc++] = s->extra[i];
	argv[argc] = NULL;
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		/* Dies with the test, even one killed by its timeout. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execvp("redis-server", (char **)argv);
		_exit(127);
	}
	return pid;
}

/* Until @s answers PING (true), or has exited or 10 s passed (false). */
static bool wait_ready(struct kvp_test_redis *s)
{
	uint64_t until = kvp_test_now_ns() + 10000000000ull;
	struct timeval tv = { 1, 0 };

	while (kvp_test_now_ns() < until) {
		redisContext *c;
		redisReply *rep;
		bool ok = false;

		if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
			s->pid = 0;
			return false;
		}
		c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
		if (c && !c->err) {
			rep = redisCommand(c, "PING");
			/* NOAUTH: up, with a password (--requirepass) */
			ok = rep && (rep->type == REDIS_REPLY_STATUS ||
				     (rep->type == REDIS_REPLY_ERROR &&
				      !strncmp(rep->str, "NOAUTH", 6)));
			if (rep)
				freeReplyObject(rep);
		}
		if (c)
			redisFree(c);
		if (ok)
			return true;
		usleep(20000);
	}
	return false;
}

void kvp_test_redis_start(struct kvp_test_redis *s, const char *const *extra)
{
	int i;

	memset(s, 0, sizeof(*s));
	for (i = 0; extra && extra[i] && i < 15; i++)
		s->extra[i] = extra[i];
	snprintf(s->dir, sizeof(s->dir), "/tmp/kvp-redis-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(s->dir));
	track(s, true);
	/* Another program may take the port between the check and the
	 * server's bind: try again on another. */
	for (i = 0; i < 5; i++) {
		s->port = free_port();
		ck_assert_int_gt(s->port, 0);
		s->pid = spawn(s);
		ck_assert_int_gt(s->pid, 0);
		if (wait_ready(s))
			return;
		reap(s);
	}
	ck_abort_msg("redis-server did not start; see %s/log", s->dir);
}

void kvp_test_redis_kill(struct kvp_test_redis *s)
{
	if (s->stopped)
		kill(s->pid, SIGCONT);
	s->stopped = false;
	reap(s);
}

void kvp_test_redis_restart(struct kvp_test_redis *s)
{
	ck_assert_int_eq(s->pid, 0);
	track(s, true);
	for (int i = 0; i < 50; i++) { /* the old socket may linger a moment */
		s->pid = spawn(s);
		ck_assert_int_gt(s->pid, 0);
		if (wait_ready(s))
			return;
		reap(s);
		usleep(100000);
	}
	ck_abort_msg("redis-server did not restart on port %d", s->port);
}

void kvp_test_redis_pause(struct kvp_test_redis *s, bool stop)
{
	ck_assert_int_gt(s->pid, 0);
	ck_assert_int_eq(kill(s->pid, stop ? SIGSTOP : SIGCONT), 0);
	s->stopped = stop;
}

void kvp_test_redis_stop(struct kvp_test_redis *s)
{
	kvp_test_redis_kill(s);
	rm_tree(s->dir);
	s->dir[0] = '\0';
	track(s, false);
}

redisContext *kvp_test_redis_connect(const struct kvp_test_redis *s)
{
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);

	ck_assert_msg(c && !c->err, "cannot connect to redis on port %d",
		      s->port);
	redisSetTimeout(c, tv);
	return c;
}

redisReply *kvp_test_redis_cmd(const struct kvp_test_redis *s,
			       const char *fmt, ...)
{
	redisContext *c = kvp_test_redis_connect(s);
	redisReply *rep;
	va_list ap;

	va_start(ap, fmt);
	rep = redisvCommand(c, fmt, ap);
	va_end(ap);
	ck_assert_msg(rep != NULL, "redis command '%s' on port %d: %s", fmt,
		      s->port, c->errstr);
	redisFree(c);
	return rep;
}

static bool cluster_ok(const struct kvp_test_redis *s, int n)
{
	redisReply *rep = kvp_test_redis_cmd(s, "CLUSTER INFO");
	char want[64];
	bool ok;

	snprintf(want, sizeof(want), "cluster_known_nodes:%d", n);
	ok = rep->type == REDIS_REPLY_STRING &&
	     strstr(rep->str, "cluster_state:ok") && strstr(rep->str, want);
	freeReplyObject(rep);
	if (!ok)
		return false;
	rep = kvp_test_redis_cmd(s, "CLUSTER SLOTS");
	ok = rep->type == REDIS_REPLY_ARRAY && (int)rep->elements == n;
	freeReplyObject(rep);
	return ok;
}

void kvp_test_cluster_start(struct kvp_test_redis *nodes, int n)
{
	static const char *const cluster_args[] = {
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000",
		"--cluster-require-full-coverage", "no",
		NULL
	};
	uint64_t until;

	ck_assert(n >= 2 && n <= 8);
	for (int i = 0; i < n; i++) {
		int lo = 16384 * i / n, hi = 16384 * (i + 1) / n - 1;
		redisReply *rep;

		kvp_test_redis_start(&nodes[i], cluster_args);
		rep = kvp_test_redis_cmd(&nodes[i], "CLUSTER ADDSLOTSRANGE %d %d",
					 lo, hi);
		ck_assert_msg(rep->type == REDIS_REPLY_STATUS,
			      "CLUSTER ADDSLOTSRANGE: %s", rep->str);
		freeReplyObject(rep);
		/* an epoch each, as redis-cli --cluster create gives: left
		 * all 0, the nodes part them by gossip, bumping one at a
		 * time, and one bumped past a slot's new owner while a test
		 * migrates the slot takes it back (the owner drops the key) */
		rep = kvp_test_redis_cmd(&nodes[i],
					 "CLUSTER SET-CONFIG-EPOCH %d", i + 1);
		ck_assert_msg(rep->type == REDIS_REPLY_STATUS,
			      "CLUSTER SET-CONFIG-EPOCH: %s", rep->str);
		freeReplyObject(rep);
	}
	for (int i = 1; i < n; i++) {
		redisReply *rep = kvp_test_redis_cmd(
			&nodes[0], "CLUSTER MEET 127.0.0.1 %d", nodes[i].port);

		ck_assert_msg(rep->type == REDIS_REPLY_STATUS,
			      "CLUSTER MEET: %s", rep->str);
		freeReplyObject(rep);
	}
	until = kvp_test_now_ns() + 30000000000ull;
	for (int i = 0; i < n; i++)
		while (!cluster_ok(&nodes[i], n)) {
			ck_assert_msg(kvp_test_now_ns() < until,
				      "the cluster did not form in 30 s");
			usleep(50000);
		}
}

void kvp_test_redis_url(char *buf, size_t len, const struct kvp_test_redis *s,
			int n, bool cluster)
{
	size_t off = (size_t)snprintf(buf, len, "%s",
				      cluster ? "redis+cluster://" : "redis://");

	for (int i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s127.0.0.1:%d",
					i ? "," : "", s[i].port);
}

struct kvp_remote_stats kvp_test_remote_stats(struct kvp_remote *r)
{
	struct kvp_remote_stats st;

	kvp_remote_stats_read(r, &st);
	return st;
}

void kvp_test_stderr_start(struct kvp_test_stderr *c)
{
	snprintf(c->path, sizeof(c->path), "/tmp/kvp-stderr-XXXXXX");
	c->fd = mkstemp(c->path);
	ck_assert_int_ge(c->fd, 0);
	c->saved = dup(2);
	fflush(stderr);
	dup2(c->fd, 2);
}

void kvp_test_stderr_end(struct kvp_test_stderr *c, char *out, size_t len)
{
	ssize_t n;

	fflush(stderr);
	dup2(c->saved, 2);
	close(c->saved);
	n = pread(c->fd, out, len - 1, 0);
	out[n > 0 ? n : 0] = '\0';
	close(c->fd);
	unlink(c->path);
}
