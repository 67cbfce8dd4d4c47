/*
 * tier.c - `kvpbench tier`: what fetching one KV block costs from each
 * tier, side by side in one run, for several block sizes: RAM (a copy),
 * the local cache directory (lib/cache: 256 blocks put, then read and
 * verified, in --dir), Redis through lib/remote (one server, and a
 * 3-master cluster), and
 * redis-benchmark's own GET at the same value size on the same server
 * (the network's and the server's limit on this machine); against them,
 * recomputing the KV: --model's prefill of --recompute-tokens tokens into
 * a KV cache in RAM, as GB/s of KV made, and where each tier's fetch
 * stops paying against it.
 *
 * The servers are started here (Debian's redis-server on free loopback
 * ports, in a folder of $TMPDIR or /tmp, killed at exit and with this
 * process),
 * unless --redis / --cluster name running ones.  Each Redis figure is the
 * median of --repeat fetches of every block, in batches of --batch keys
 * (one kvp_remote_get_many each, pipelined in round trips of about
 * KVP_REMOTE_FLIGHT_BYTES); every value fetched is verified (its
 * key and last word: the transport, not a checksum, is measured) and a
 * wrong one fails the run.  Nothing is asserted on speed.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lib/cache/cache_dir.h"
#include "lib/cli/cli.h"
#include "lib/cli/progress.h"
#include "lib/kv/kvcache.h"
#include "lib/model/model.h"
#include "lib/remote/remote.h"
#include "tools/kvpbench/kvpbench.h"

#define MAX_SIZES 8
#define CLUSTER_NODES 3
#define SET_BYTES (64ull << 20) /* the blocks of one size: 64 MiB */
#define DIR_BLOCKS 256		/* blocks of the local cache's figure */
#define TIER_FIGURES 6		/* figures per size: a row's columns */
/* Our own servers' command timeout: a loaded machine stalls them. */
#define OWN_OPTS "?timeout_ms=10000"

/* ---- servers of our own ----------------------------------------------- */

struct srv {
	pid_t pid;
	int port;
	char dir[256]; /* $TMPDIR/kvpbench-redis-XXXXXX */
};

static struct srv servers[1 + CLUSTER_NODES];
static int nservers;

static void servers_stop(void)
{
	for (int i = 0; i < nservers; i++) {
		char cmd[300];

		if (servers[i].pid > 0) {
			kill(servers[i].pid, SIGKILL);
			waitpid(servers[i].pid, NULL, 0);
		}
		servers[i].pid = 0;
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", servers[i].dir);
		if (servers[i].dir[0] && system(cmd))
			fprintf(stderr, "kvpbench: cannot remove %s\n",
				servers[i].dir);
		servers[i].dir[0] = '\0';
	}
	nservers = 0;
}

static bool port_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a));

	if (fd >= 0)
		close(fd);
	return ok;
}

static redisReply *cmd(int port, const char *fmt, ...)
{
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *rep = NULL;
	va_list ap;

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		va_start(ap, fmt);
		rep = redisvCommand(c, fmt, ap);
		va_end(ap);
	}
	if (c)
		redisFree(c);
	return rep;
}

/* CPU seconds the server on @port has used (INFO cpu: user + sys), or
 * -1 when it does not say. */
static double srv_cpu(int port)
{
	redisReply *rep = port ? cmd(port, "INFO cpu") : NULL;
	const char *u, *y;
	double res = -1;

	if (rep && rep->type == REDIS_REPLY_STRING &&
	    (u = strstr(rep->str, "used_cpu_user:")) &&
	    (y = strstr(rep->str, "used_cpu_sys:")))
		res = strtod(u + 14, NULL) + strtod(y + 13, NULL);
	if (rep)
		freeReplyObject(rep);
	return res;
}

/* CPU seconds of this thread, or of the children waited for. */
static double thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double children_cpu(void)
{
	struct rusage ru;

	getrusage(RUSAGE_CHILDREN, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds per GB of values moved: the client's and the server's. */
struct cpu_cost {
	double client, server; /* < 0: not measured */
};

/* Start a server (cluster mode if @cluster) on a free port below the
 * ephemeral range whose +10000 (cluster bus) is free too. */
static int srv_start(struct srv *s, bool cluster)
{
	unsigned seed = (unsigned)getpid() ^ (unsigned)(kvpb_now() * 1e6);
	const char *tmp = getenv("TMPDIR");
	char port[16], log[300];

	snprintf(s->dir, sizeof(s->dir), "%s/kvpbench-redis-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(s->dir))
		return -errno;
	snprintf(log, sizeof(log), "%s/log", s->dir);
	for (int tries = 0; tries < 100; tries++) {
		const char *argv[] = { "redis-server", "--port", port,
			"--bind", "127.0.0.1", "--dir", s->dir, "--save", "",
			"--appendonly", "no", "--logfile", log,
			"--cluster-enabled", cluster ? "yes" : "no",
			"--cluster-config-file", "nodes.conf", NULL };
		pid_t parent = getpid();

		s->port = 20000 + (int)(rand_r(&seed) % 10000);
		if (!port_free(s->port) || !port_free(s->port + 10000))
			continue;
		snprintf(port, sizeof(port), "%d", s->port);
		s->pid = fork();
		if (s->pid < 0)
			return -errno;
		if (s->pid == 0) {
			int null = open("/dev/null", O_RDWR);

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(1);
			dup2(null, 1);
			dup2(null, 2);
			execvp("redis-server", (char **)argv);
			_exit(127);
		}
		for (int i = 0; i < 500; i++) { /* 10 s */
			redisReply *rep;

			if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
				break;
			rep = cmd(s->port, "PING");
			if (rep) {
				freeReplyObject(rep);
				return 0;
			}
			usleep(20000);
		}
		if (s->pid > 0) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, NULL, 0);
		}
		s->pid = 0;
	}
	fprintf(stderr, "kvpbench: redis-server did not start (is it "
			"installed? apt-get install redis-server)\n");
	return -ENOENT;
}

/* A cluster of @n masters: slots split evenly, joined by MEET; waits for
 * cluster_state:ok on each (30 s). */
static int cluster_form(struct srv *s, int n)
{
	for (int i = 0; i < n; i++) {
		redisReply *rep = cmd(s[i].port, "CLUSTER ADDSLOTSRANGE %d %d",
				      16384 * i / n, 16384 * (i + 1) / n - 1);
		bool ok = rep && rep->type == REDIS_REPLY_STATUS;

		if (rep)
			freeReplyObject(rep);
		if (!ok)
			return -EIO;
		if (i) {
			rep = cmd(s[0].port, "CLUSTER MEET 127.0.0.1 %d",
				  s[i].port);
			if (rep)
				freeReplyObject(rep);
		}
	}
	for (int i = 0, waited = 0; i < n; waited++) {
		redisReply *rep = cmd(s[i].port, "CLUSTER INFO");
		char want[40];
		bool ok;

		snprintf(want, sizeof(want), "cluster_known_nodes:%d", n);
		ok = rep && rep->type == REDIS_REPLY_STRING &&
		     strstr(rep->str, "cluster_state:ok") &&
		     strstr(rep->str, want);
		if (rep)
			freeReplyObject(rep);
		if (ok) {
			i++;
			continue;
		}
		if (waited > 600)
			return -ETIMEDOUT;
		usleep(50000);
	}
	return 0;
}

/* ---- measuring -------------------------------------------------------- */

struct trow {
	uint64_t size;	     /* block bytes */
	uint64_t blocks;     /* blocks fetched per run */
	double ram;	     /* GB/s */
	double dir;	     /* local cache directory, GB/s; < 0 failed */
	double redis;	     /* GB/s; < 0 not measured */
	double cluster;
	double bench_p;	     /* redis-benchmark -c 1 -P batch, GB/s */
	double bench_c;	     /* redis-benchmark -c 50, GB/s */
	struct cpu_cost cpu_redis;   /* CPU s/GB of our fetches */
	struct cpu_cost cpu_bench_p; /* ... of redis-benchmark -P's GETs */
	double redis_us;     /* mean microseconds per batch (redis) */
	double recompute;    /* GB/s of KV the model's prefill makes */
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The value of block @k of @size: the pattern at k * size, k in word 0. */
static void value(uint64_t k, uint64_t size, void *buf)
{
	kvpb_fill(buf, k * size, size);
	memcpy(buf, &k, 8);
}

static int verify(void *arg, const void *key, size_t keylen, void *val,
		  size_t len)
{
	uint64_t size = *(const uint64_t *)arg, k, last;

	if (keylen != 8 || len != size)
		return -1;
	memcpy(&k, key, 8);
	memcpy(&last, (char *)val + len - 8, 8);
	return memcmp(val, &k, 8) || last != kvpb_pattern(k * size + len - 8)
		       ? -1
		       : 0;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static double ram_rate(uint64_t size, uint64_t blocks, unsigned repeat)
{
	char *src = malloc(size * blocks), *dst = malloc(size);
	double rate[KVPB_MAX_REPEAT];

	if (!src || !dst) {
		free(src);
		free(dst);
		return -1;
	}
	for (uint64_t k = 0; k < blocks; k++)
		value(k, size, src + k * size);
	for (unsigned r = 0; r < repeat; r++) {
		double t0 = kvpb_now();

		for (uint64_t k = 0; k < blocks; k++) {
			memcpy(dst, src + k * size, size);
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		rate[r] = (double)(size * blocks) / (kvpb_now() - t0) / 1e9;
	}
	free(src);
	free(dst);
	return median(rate, repeat);
}

/* The local cache directory (lib/cache) in @parent: DIR_BLOCKS blocks
 * put (synced), then got (read and verified) @repeat times: GB/s, or -1
 * (said on stderr). */
static double dir_rate(const char *parent, uint64_t size, unsigned repeat)
{
	struct kvp_cache_opts co = { 0 };
	struct kvp_cache *c = NULL;
	char path[300], cmdline[320], err[256], warn[256];
	double rate[KVPB_MAX_REPEAT], res = -1;
	char *val = malloc(size), *buf = malloc(size);
	uint64_t len;

	snprintf(path, sizeof(path), "%s/kvpbench-cache-XXXXXX", parent);
	if (!val || !buf || !mkdtemp(path)) {
		fprintf(stderr, "kvpbench tier: cannot make a folder in %s\n",
			parent);
		free(val);
		free(buf);
		return -1;
	}
	if (kvp_cache_open(path, &co, &c, err, sizeof(err), warn,
			   sizeof(warn))) {
		fprintf(stderr, "kvpbench tier: %s\n", err);
		goto out;
	}
	for (uint64_t k = 0; k < DIR_BLOCKS; k++) {
		struct kvp_rec_key key = { { 0 } };

		memcpy(key.b, &k, 8);
		value(k, size, val);
		if (kvp_cache_put(c, &key, val, size)) {
			fprintf(stderr, "kvpbench tier: cannot put a block "
					"into %s\n", path);
			goto out;
		}
	}
	for (unsigned r = 0; r < repeat; r++) {
		double t0 = kvpb_now();

		for (uint64_t k = 0; k < DIR_BLOCKS; k++) {
			struct kvp_rec_key key = { { 0 } };

			memcpy(key.b, &k, 8);
			if (kvp_cache_get(c, &key, buf, size, &len) ||
			    len != size || verify(&size, &k, 8, buf, size)) {
				fprintf(stderr, "kvpbench tier: a block of "
						"the cache was not read right\n");
				goto out;
			}
		}
		rate[r] = (double)(size * DIR_BLOCKS) / (kvpb_now() - t0) / 1e9;
	}
	res = median(rate, repeat);
out:
	kvp_cache_close(c);
	snprintf(cmdline, sizeof(cmdline), "rm -rf '%s'", path);
	if (system(cmdline))
		fprintf(stderr, "kvpbench tier: cannot remove %s\n", path);
	free(val);
	free(buf);
	return res;
}

/* Publish the blocks, then fetch them all @repeat times: GB/s, or -1
 * (said on stderr) when a block was missing or wrong. */
static double redis_rate(const char *url, uint64_t size, uint64_t blocks,
			 unsigned batch, unsigned repeat, double *us_batch,
			 int port, struct cpu_cost *cpu)
{
	double c0, s0;
	uint64_t sz = size;
	struct kvp_remote_config cfg = { .url = url, .ns = "kvpbench",
					 .ns_len = 8, .verify = verify,
					 .verify_arg = &sz };
	struct kvp_remote_get *g = calloc(batch, sizeof(*g));
	uint64_t *keys = calloc(batch, 8);
	char *bufs = malloc(size * batch), *val = malloc(size);
	double rate[KVPB_MAX_REPEAT], res = -1;
	struct kvp_remote *r = NULL;
	char err[256];

	if (!g || !keys || !bufs || !val)
		goto out;
	if (kvp_remote_open(&cfg, &r, err, sizeof(err))) {
		fprintf(stderr, "kvpbench tier: %s\n", err);
		goto out;
	}
	for (uint64_t k = 0; k < blocks; k++) {
		value(k, size, val);
		while (kvp_remote_publish(r, &k, 8, val, size) == -EAGAIN)
			kvp_remote_flush(r, 1000);
	}
	if (kvp_remote_flush(r, 120000)) {
		fprintf(stderr, "kvpbench tier: publishing to %s timed out\n",
			url);
		goto out;
	}
	memset(bufs, 0, size * batch); /* first touches: not the fetch's */
	c0 = thread_cpu();
	s0 = srv_cpu(port);
	for (unsigned rep = 0; rep < repeat; rep++) {
		double t0 = kvpb_now();

		for (uint64_t k0 = 0; k0 < blocks; k0 += batch) {
			unsigned n = blocks - k0 < batch ? (unsigned)(blocks - k0)
							 : batch;

			for (unsigned i = 0; i < n; i++) {
				keys[i] = k0 + i;
				g[i] = (struct kvp_remote_get){
					.key = &keys[i], .key_len = 8,
					.buf = bufs + i * size, .buf_len = size };
			}
			if (kvp_remote_get_many(r, g, n) != (int)n) {
				struct kvp_remote_stats st;

				kvp_remote_stats_read(r, &st);
				fprintf(stderr,
					"kvpbench tier: %s: a block of %llu "
					"bytes was not fetched whole and "
					"right (%llu misses, %llu bad, %llu "
					"errors, %llu timeouts)\n", url,
					(unsigned long long)size,
					(unsigned long long)st.misses_total,
					(unsigned long long)st.verify_failed_total,
					(unsigned long long)st.errors_total,
					(unsigned long long)st.timeouts_total);
				goto out;
			}
		}
		rate[rep] = (double)(size * blocks) / (kvpb_now() - t0) / 1e9;
	}
	res = median(rate, repeat);
	*us_batch = (double)batch * (double)size / (res * 1e9) * 1e6;
	{
		double gb = (double)(size * blocks * repeat) / 1e9;
		double s1 = srv_cpu(port);

		cpu->client = (thread_cpu() - c0) / gb;
		cpu->server = s0 >= 0 && s1 >= 0 ? (s1 - s0) / gb : -1;
	}
out:
	kvp_remote_close(r);
	free(g);
	free(keys);
	free(bufs);
	free(val);
	return res;
}

/*
 * Recomputing: model @m prefills @tokens random tokens into a KV cache in
 * RAM (its K and V in the dtype kvpager run gives it), once untimed (the
 * cache's memory is touched), then @repeat times timed: the median as GB/s
 * of KV made, or -1 (said on stderr).  @kv_token gets the KV bytes of a
 * token.
 */
static double recompute_rate(struct kvp_model *m, const char *spec,
			     uint32_t tokens, unsigned repeat,
			     double *kv_token)
{
	const struct kvp_model_config *mc = kvp_model_config(m);
	struct kvp_kv_geometry g, pg;
	struct kvp_kvcache_opts co;
	struct kvp_kvcache *c = NULL;
	double rate[KVPB_MAX_REPEAT], res = -1;
	uint32_t *prompt = malloc(sizeof(*prompt) * tokens), id;
	uint64_t x = 7;
	int err = -ENOMEM;

	if (!prompt)
		goto out;
	prompt[0] = 1;
	for (uint32_t i = 1; i < tokens; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		prompt[i] = (uint32_t)(x % mc->vocab);
	}
	/* a checkpoint's KV is fp32, a random model's its preset's */
	err = kvp_model_geometry(m,
				 strncmp(spec, "random:", 7) ||
					 kvp_kv_geometry_preset(spec + 7, &pg)
				     ? KVP_KV_FP32
				     : pg.dtype,
				 4, &g);
	if (err)
		goto out;
	*kv_token = (double)kvp_kv_token_bytes(&g);
	kvp_kvcache_opts_default(&co, &g);
	co.backend = KVP_KVCACHE_RAM;
	co.prefetch = false; /* all resident; and a 2-layer model has no depth 2 */
	co.capacity_tokens = tokens + 8;
	err = kvp_kvcache_create(&co, &c);
	for (unsigned r = 0; !err && r <= repeat; r++) {
		struct kvp_model_seq *ms = NULL;
		double t0;

		err = kvp_kvcache_seq_create(c, &id);
		if (err)
			break;
		err = kvp_model_seq_create(m, c, id, 0, &ms);
		t0 = kvpb_now();
		if (!err)
			err = kvp_model_prefill(ms, prompt, tokens);
		if (!err && r)
			rate[r - 1] = (double)tokens * *kv_token /
				      (kvpb_now() - t0) / 1e9;
		kvp_model_seq_destroy(ms);
		kvp_kvcache_seq_free(c, id);
	}
	if (!err)
		res = median(rate, repeat);
out:
	if (err)
		fprintf(stderr, "kvpbench tier: recomputing %u tokens of %s "
				"failed: %s\n", tokens, spec, strerror(-err));
	kvp_kvcache_destroy(c);
	free(prompt);
	return res;
}

/*
 * redis-benchmark's SETs of @keys keys of @size bytes on @port, drawn at
 * random (-r) 8 times as often as there are keys: about keys * e^-8 of
 * them stay unset, so that its GETs read as many distinct values as our
 * fetches do (without -r it sets and gets one key, whose value stays in
 * the server's CPU cache).  0, or -1 if it failed.
 */
static int bench_fill(int port, uint64_t size, uint64_t keys)
{
	char cmdline[256];

	snprintf(cmdline, sizeof(cmdline),
		 "redis-benchmark -h 127.0.0.1 -p %d -t set -d %llu -r %llu "
		 "-n %llu -P 16 -q >/dev/null 2>&1",
		 port, (unsigned long long)size, (unsigned long long)keys,
		 (unsigned long long)(8 * keys));
	return system(cmdline) ? -1 : 0;
}

/* redis-benchmark's pipeline for values of @size bytes: as many as our
 * fetch has in flight (KVP_REMOTE_FLIGHT_BYTES of them, remote.h), at
 * most @batch. */
static uint64_t bench_depth(uint64_t size, uint64_t batch)
{
	uint64_t d = KVP_REMOTE_FLIGHT_BYTES / size;

	return d < 1 ? 1 : d > batch ? batch : d;
}

/* redis-benchmark's GET of @n values of @size bytes on @port, drawn from
 * the @keys keys bench_fill set: GB/s, or -1. */
static double bench_rate(int port, uint64_t size, uint64_t keys, uint64_t n,
			 const char *shape, struct cpu_cost *cpu)
{
	char line[512], cmdline[256];
	double rps = -1, c0 = children_cpu(), s0 = srv_cpu(port), s1;
	FILE *p;

	snprintf(cmdline, sizeof(cmdline),
		 "redis-benchmark -h 127.0.0.1 -p %d -t get -d %llu -r %llu "
		 "-n %llu %s --csv 2>/dev/null",
		 port, (unsigned long long)size, (unsigned long long)keys,
		 (unsigned long long)n, shape);
	p = popen(cmdline, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof(line), p))
		if (!strncmp(line, "\"GET\",\"", 7))
			rps = strtod(line + 7, NULL);
	pclose(p);
	s1 = srv_cpu(port);
	if (cpu) {
		double gb = (double)(size * n) / 1e9;

		cpu->client = (children_cpu() - c0) / gb;
		cpu->server = s0 >= 0 && s1 >= 0 ? (s1 - s0) / gb : -1;
	}
	return rps > 0 ? rps * (double)size / 1e9 : -1;
}

static const struct kvp_cli_opt topts_table[] = {
	{ "sizes", 's', 0, "LIST",
	  "block sizes, comma-separated (16K,64K,256K,1M)" },
	{ "batch", 'b', 0, "N",
	  "keys per fetch call, pipelined (1..1024; 64)" },
	{ "repeat", 'k', 0, "N",
	  "fetches of every block per figure, the median shown (3)" },
	{ "redis", 'r', 0, "URL", "a running server instead of our own" },
	{ "cluster", 'c', 0, "URL",
	  "a running cluster (redis+cluster://...) instead of our own" },
	{ "no-cluster", 'n', 0, NULL, "no cluster figures" },
	{ "dir", 'd', 0, "DIR",
	  "where the local cache directory's figure puts its blocks "
	  "($TMPDIR, /tmp)" },
	{ "model", 'm', 0, "MODEL",
	  "whose prefill the recompute column times (random:llama3-8b)" },
	{ "recompute-tokens", 't', 0, "N",
	  "tokens that prefill recomputes (16..65536; 256)" },
	{ "json", 'j', 0, NULL, "one JSON object per line" },
	{ "short", 'S', 0, NULL, "one size (64K), repeat 1" },
	{ "quiet", 'q', 0, NULL, "no progress on stderr" },
	{ "help", 'h', 0, NULL, "this text" },
	{ 0 },
};
#define NTOPTS (sizeof(topts_table) / sizeof(topts_table[0]))

static void tusage(FILE *f)
{
	fprintf(f, "usage: kvpbench tier [options]\n");
	kvp_cli_usage(f, topts_table);
	fprintf(f,
		"--repeat takes 1 to %u.  Fetching a KV block from RAM, the "
		"local cache\ndirectory, Redis (one server, a 3-master "
		"cluster) and redis-benchmark's GET at\nthe same size, "
		"%llu MiB of blocks per size, against recomputing the KV\n"
		"(the model's prefill into RAM).\n",
		KVPB_MAX_REPEAT, (unsigned long long)(SET_BYTES >> 20));
}

static int parse_sizes(const char *text, uint64_t *sizes, unsigned *n)
{
	char buf[256], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", text);
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t;
	     t = strtok_r(NULL, ",", &save)) {
		if (*n == MAX_SIZES ||
		    kvpb_parse_opt("sizes", t, true, 64, 64ull << 20,
				   &sizes[*n]))
			return -EINVAL;
		if (sizes[*n] % 8) {
			fprintf(stderr,
				"kvpbench: --sizes: %s is not a multiple of 8\n",
				t);
			return -EINVAL;
		}
		(*n)++;
	}
	return *n ? 0 : -EINVAL;
}

/* @a over @b, -1 when either was not measured. */
static double ratio(double a, double b)
{
	return a > 0 && b > 0 ? a / b : -1;
}

static void print_row(const struct trow *t, bool json)
{
	double best = t->bench_p > t->bench_c ? t->bench_p : t->bench_c;

	if (json) {
		printf("{\"scenario\":\"tier\",\"block_bytes\":%llu,"
		       "\"blocks\":%llu,\"ram_gb_per_s\":%.3f,"
		       "\"cache_dir_gb_per_s\":%.3f,"
		       "\"redis_gb_per_s\":%.3f,\"redis_cluster_gb_per_s\":"
		       "%.3f,\"redis_benchmark_get_p_gb_per_s\":%.3f,"
		       "\"redis_benchmark_get_c50_gb_per_s\":%.3f,"
		       "\"redis_vs_benchmark\":%.3f,"
		       "\"recompute_gb_per_s\":%.6g,"
		       "\"redis_vs_recompute\":%.3f,"
		       "\"redis_cpu_client_s_per_gb\":%.3f,"
		       "\"redis_cpu_server_s_per_gb\":%.3f,"
		       "\"redis_benchmark_p_cpu_client_s_per_gb\":%.3f,"
		       "\"redis_benchmark_p_cpu_server_s_per_gb\":%.3f}\n",
		       (unsigned long long)t->size,
		       (unsigned long long)t->blocks, t->ram, t->dir, t->redis,
		       t->cluster, t->bench_p, t->bench_c,
		       ratio(t->redis, best), t->recompute,
		       ratio(t->redis, t->recompute), t->cpu_redis.client,
		       t->cpu_redis.server, t->cpu_bench_p.client,
		       t->cpu_bench_p.server);
		return;
	}
	printf("%7lluK %10.2f %10.3f %10.3f %10.3f %10.3g %10.3f %10.3f "
	       "%10.2fx %9.0f\n",
	       (unsigned long long)(t->size >> 10), t->ram, t->dir, t->redis,
	       t->cluster, t->recompute, t->bench_p, t->bench_c,
	       ratio(t->redis, best), t->redis_us);
}

/* The CPU each GB of values cost, ours against redis-benchmark -P's: a
 * figure that a busy machine's other work changes far less than a rate
 * (time waiting for a CPU is not counted). */
static void print_cpu(const struct trow *rows, unsigned n)
{
	printf("cpu: CPU seconds per GB fetched, client + server (Redis' "
	       "INFO cpu), ours against bench-P's:\n");
	for (unsigned i = 0; i < n; i++) {
		const struct cpu_cost *a = &rows[i].cpu_redis;
		const struct cpu_cost *b = &rows[i].cpu_bench_p;

		printf("  %7lluK ours %.3f + %.3f, bench-P %.3f + %.3f "
		       "(ours/bench %.2fx)\n",
		       (unsigned long long)(rows[i].size >> 10), a->client,
		       a->server, b->client, b->server,
		       ratio(a->client + a->server, b->client + b->server));
	}
}

/* The rate of tier @col of row @t (the order of the summary's names). */
static double tier_col(const struct trow *t, int col)
{
	const double v[] = { t->ram, t->dir, t->redis, t->cluster };

	return v[col];
}

/* Where fetching from each tier stops paying against recomputing: the
 * sizes at which it is slower than the model's prefill. */
static void print_pays(const struct trow *rows, unsigned n)
{
	static const char *const names[] = { "ram", "cache-dir", "redis",
					     "cluster" };

	for (int col = 0; col < 4; col++) {
		char pays[160] = "", not[160] = "";
		size_t lp = 0, ln = 0;
		unsigned long long kib;
		double lo = -1;

		for (unsigned i = 0; i < n; i++) {
			double r = ratio(tier_col(&rows[i], col),
					 rows[i].recompute);

			if (r < 0)
				continue;
			if (lo < 0 || r < lo)
				lo = r;
			kib = (unsigned long long)(rows[i].size >> 10);
			if (r > 1)
				lp += (size_t)snprintf(pays + lp,
						       sizeof(pays) - lp,
						       " %lluK", kib);
			else
				ln += (size_t)snprintf(not + ln,
						       sizeof(not) - ln,
						       " %lluK", kib);
			if (lp >= sizeof(pays) || ln >= sizeof(not))
				break;
		}
		if (lo < 0)
			printf("  %-9s not measured\n", names[col]);
		else if (!ln)
			printf("  %-9s pays at every size (at least %.1fx "
			       "recomputing)\n", names[col], lo);
		else if (!lp)
			printf("  %-9s never pays (at most %.2fx recomputing: "
			       "recompute instead)\n", names[col], lo);
		else
			printf("  %-9s pays at%s; stops paying at%s\n",
			       names[col], pays, not);
	}
}

int kvpbench_tier(int argc, char **argv)
{
	struct option lo[NTOPTS];
	char shorts[3 * NTOPTS + 1];
	uint64_t sizes[MAX_SIZES] = { 16 << 10, 64 << 10, 256 << 10, 1 << 20 };
	uint64_t batch = 64, repeat = 3;
	unsigned nsizes = 4;
	char url[256] = "", curl[512] = "";
	bool json = false, no_cluster = false, quiet = false;
	const char *dir = getenv("TMPDIR"), *model = "random:llama3-8b";
	uint64_t rtokens = 256;
	struct trow rows[MAX_SIZES];
	struct kvp_model *m = NULL;
	double rec, kv_token = 0;
	char why[256];
	int c, bench_port = 0, rc = 0;

	if (kvp_cli_table_asked(argc, argv)) {
		kvp_cli_table_print(stdout, "tier", topts_table);
		return 0;
	}
	kvp_cli_getopt(topts_table, "", lo, shorts);
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		switch (c) {
		case 's':
			if (parse_sizes(optarg, sizes, &nsizes))
				return 2;
			break;
		case 'b':
			if (kvpb_parse_opt("batch", optarg, false, 1, 1024,
					   &batch))
				return 2;
			break;
		case 'k':
			if (kvpb_parse_opt("repeat", optarg, false, 1,
					   KVPB_MAX_REPEAT, &repeat))
				return 2;
			break;
		case 'r':
			snprintf(url, sizeof(url), "%s", optarg);
			break;
		case 'c':
			snprintf(curl, sizeof(curl), "%s", optarg);
			break;
		case 'n':
			no_cluster = true;
			break;
		case 'd':
			dir = optarg;
			break;
		case 'm':
			model = optarg;
			break;
		case 't':
			if (kvpb_parse_opt("recompute-tokens", optarg, false,
					   16, 65536, &rtokens))
				return 2;
			break;
		case 'j':
			json = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'S':
			sizes[0] = 64 << 10;
			nsizes = 1;
			repeat = 1;
			break;
		case 'h':
			tusage(stdout);
			return 0;
		default:
			tusage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvpbench tier: unexpected '%s'\n",
			argv[optind]);
		tusage(stderr);
		return 2;
	}
	atexit(servers_stop);
	if (!url[0]) {
		if (srv_start(&servers[nservers], false))
			return 1;
		bench_port = servers[nservers].port;
		snprintf(url, sizeof(url), "redis://127.0.0.1:%d" OWN_OPTS,
			 servers[nservers++].port);
	} else {
		struct kvp_remote_url u;
		char err[256];

		if (kvp_remote_url_parse(&u, url, err, sizeof(err))) {
			fprintf(stderr, "kvpbench tier: --redis: %s\n", err);
			return 2;
		}
		bench_port = u.port[0]; /* redis-benchmark: loopback only */
	}
	if (!no_cluster && !curl[0]) {
		size_t off = (size_t)snprintf(curl, sizeof(curl),
					      "redis+cluster://");

		for (int i = 0; i < CLUSTER_NODES; i++) {
			if (srv_start(&servers[nservers], true))
				return 1;
			off += (size_t)snprintf(curl + off, sizeof(curl) - off,
						"%s127.0.0.1:%d", i ? "," : "",
						servers[nservers++].port);
		}
		snprintf(curl + off, sizeof(curl) - off, OWN_OPTS);
		if (cluster_form(&servers[nservers - CLUSTER_NODES],
				 CLUSTER_NODES)) {
			fprintf(stderr, "kvpbench tier: the cluster did not "
					"form\n");
			return 1;
		}
	}
	if (kvp_model_open(model, NULL, &m, why, sizeof(why))) {
		fprintf(stderr, "kvpbench tier: %s\n", why);
		return 2; /* a bad --model; the servers stop at exit */
	}
	if (kvp_model_config(m)->seq_len &&
	    rtokens > kvp_model_config(m)->seq_len)
		rtokens = kvp_model_config(m)->seq_len;
	if (!quiet)
		fprintf(stderr, "kvpbench: tier: recomputing %llu tokens of "
				"%s\n", (unsigned long long)rtokens, model);
	rec = recompute_rate(m, model, (uint32_t)rtokens, (unsigned)repeat,
			     &kv_token);
	kvp_model_close(m);
	if (rec < 0)
		return 1;
	if (!json)
		printf("tier: fetching one KV block, GB/s (1e9 B/s), median of "
		       "%llu; batches of %llu keys\n"
		       "%8s %10s %10s %10s %10s %10s %10s %10s %11s %9s\n",
		       (unsigned long long)repeat, (unsigned long long)batch,
		       "block", "ram", "cache-dir", "redis", "cluster",
		       "recompute", "bench-P", "bench-c50",
		       "redis/bench", "us/batch");
	for (unsigned i = 0; i < nsizes; i++) {
		uint64_t blocks = SET_BYTES / sizes[i];
		struct trow t = { .size = sizes[i], .redis = -1, .cluster = -1,
				  .recompute = rec,
				  .cpu_redis = { -1, -1 },
				  .cpu_bench_p = { -1, -1 } };
		struct kvp_progress pg;
		char shape[64], what[48];

		if (blocks > 4096)
			blocks = 4096;
		t.blocks = blocks;
		/* a phase per size, its figures the steps: the bar ends
		 * before the size's row is printed */
		snprintf(what, sizeof(what), "tier %llu-byte blocks",
			 (unsigned long long)sizes[i]);
		if (!quiet)
			fprintf(stderr, "kvpbench: %s\n", what);
		kvp_progress_start(&pg, "kvpbench", what, quiet);
		kvp_progress_update(&pg, 0, TIER_FIGURES, "figures");
		t.ram = ram_rate(sizes[i], blocks, (unsigned)repeat);
		kvp_progress_update(&pg, 1, TIER_FIGURES, "figures");
		t.dir = dir_rate(dir && *dir ? dir : "/tmp", sizes[i],
				 (unsigned)repeat);
		kvp_progress_update(&pg, 2, TIER_FIGURES, "figures");
		t.redis = redis_rate(url, sizes[i], blocks, (unsigned)batch,
				     (unsigned)repeat, &t.redis_us, bench_port,
				     &t.cpu_redis);
		kvp_progress_update(&pg, 3, TIER_FIGURES, "figures");
		if (curl[0]) {
			struct cpu_cost cc;
			double us;

			t.cluster = redis_rate(curl, sizes[i], blocks,
					       (unsigned)batch,
					       (unsigned)repeat, &us, 0, &cc);
		}
		kvp_progress_update(&pg, 4, TIER_FIGURES, "figures");
		snprintf(shape, sizeof(shape), "-c 1 -P %llu",
			 (unsigned long long)bench_depth(sizes[i], batch));
		if (bench_fill(bench_port, sizes[i], blocks))
			fprintf(stderr, "kvpbench tier: redis-benchmark's "
					"SETs failed (is redis-tools "
					"installed?)\n");
		t.bench_p = bench_rate(bench_port, sizes[i], blocks,
				       blocks * repeat, shape, &t.cpu_bench_p);
		kvp_progress_update(&pg, 5, TIER_FIGURES, "figures");
		t.bench_c = bench_rate(bench_port, sizes[i], blocks,
				       blocks * repeat, "-c 50", NULL);
		kvp_progress_update(&pg, TIER_FIGURES, TIER_FIGURES, "figures");
		kvp_progress_done(&pg, TIER_FIGURES, TIER_FIGURES, "figures");
		if (t.redis < 0 || t.dir < 0 || (curl[0] && t.cluster < 0))
			rc = 1;
		print_row(&t, json);
		fflush(stdout);
		rows[i] = t;
	}
	if (json)
		return rc;
	printf("bench-P: redis-benchmark -t get -c 1 -P N (one "
	       "connection, pipelined like our fetch: N = %u MiB of "
	       "values / the block, 1 to %llu); bench-c50: its "
	       "default 50 clients; both GET as many bytes as our fetch, "
	       "drawn at random (-r) from as many keys as it has blocks; "
	       "redis/bench: ours over the better of the two\n"
	       "recompute: %s prefilling %llu tokens into RAM, GB/s of KV "
	       "made (%.0f bytes of KV a token: %.3f ms a token); fetching "
	       "from a tier pays where it is faster:\n",
	       KVP_REMOTE_FLIGHT_BYTES >> 20, (unsigned long long)batch,
	       model, (unsigned long long)rtokens,
	       kv_token, kv_token / (rec * 1e9) * 1e3);
	print_pays(rows, nsizes);
	print_cpu(rows, nsizes);
	return rc;
}
