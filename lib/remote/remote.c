/* remote.c - the remote tier's API: open, keys, fetch and verify, stats. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/remote/remote_i.h"

#define KEY_PREFIX "kvp:1:"
#define RKEY_MAX (sizeof(KEY_PREFIX) + 2 * KVP_REMOTE_MAX_NS + 1 + \
		  2 * KVP_REMOTE_MAX_KEY + 1)

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

static void hex(const void *buf, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	const unsigned char *p = buf;

	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * len] = '\0';
}

int kvp_remote_redis_key(const void *ns, size_t ns_len, const void *key,
			 size_t keylen, char *buf, size_t len)
{
	size_t need = strlen(KEY_PREFIX) + 2 * ns_len + 1 + 2 * keylen;

	if (need + 1 > len)
		return -ENAMETOOLONG;
	strcpy(buf, KEY_PREFIX);
	hex(ns, ns_len, buf + strlen(KEY_PREFIX));
	buf[strlen(KEY_PREFIX) + 2 * ns_len] = ':';
	hex(key, keylen, buf + strlen(KEY_PREFIX) + 2 * ns_len + 1);
	return (int)need;
}

/* The password file's first line into @u->password; it must be ours
 * alone to read, as ssh asks of its keys. */
static int read_password(struct kvp_remote_url *u, char *err, size_t errlen)
{
	struct stat st;
	ssize_t n;
	int fd, e;

	fd = open(u->password_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		e = errno;
		return fail(err, errlen, -e,
			    "cannot open the redis password file %s: %s",
			    u->password_file, strerror(e));
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (st.st_mode & 0077)) {
		close(fd);
		return fail(err, errlen, -EPERM,
			    "the redis password file %s is not a regular file "
			    "readable by its owner only (chmod 600 it)",
			    u->password_file);
	}
	n = read(fd, u->password, sizeof(u->password) - 1);
	e = errno;
	close(fd);
	if (n < 0)
		return fail(err, errlen, -e,
			    "cannot read the redis password file %s: %s",
			    u->password_file, strerror(e));
	u->password[n] = '\0';
	u->password[strcspn(u->password, "\r\n")] = '\0';
	if (!u->password[0])
		return fail(err, errlen, -EINVAL,
			    "the redis password file %s holds no password",
			    u->password_file);
	return 0;
}

int kvp_remote_open(const struct kvp_remote_config *cfg,
		    struct kvp_remote **out, char *err, size_t errlen)
{
	struct kvp_remote *r;
	int rc;

	*out = NULL;
	if (!cfg->verify)
		return fail(err, errlen, -EINVAL,
			    "the remote tier needs a verify hook");
	if (!cfg->ns || !cfg->ns_len || cfg->ns_len > KVP_REMOTE_MAX_NS)
		return fail(err, errlen, -EINVAL,
			    "the remote tier's namespace tag must be 1..%d "
			    "bytes", KVP_REMOTE_MAX_NS);
	r = calloc(1, sizeof(*r));
	if (!r)
		return fail(err, errlen, -ENOMEM, "out of memory");
	rc = kvp_remote_url_parse(&r->url, cfg->url, err, errlen);
	if (rc)
		goto out_free;
	kvp_remote_url_redact(cfg->url, r->shown_url, sizeof(r->shown_url));
	if (!r->url.password[0] && r->url.password_file[0]) {
		rc = read_password(&r->url, err, errlen);
		if (rc)
			goto out_free;
	}
	hex(cfg->ns, cfg->ns_len, r->ns_hex);
	r->verify = cfg->verify;
	r->verify_arg = cfg->verify_arg;
	rc = link_init(&r->fetch, r, true);
	if (rc)
		goto out_free;
	rc = link_init(&r->pub, r, false);
	if (rc)
		goto out_fetch;
	rc = publish_start(r);
	if (rc) {
		fail(err, errlen, rc, "cannot start the publisher thread: %s",
		     strerror(-rc));
		goto out_pub;
	}
	link_warm(&r->fetch);
	*out = r;
	return 0;
out_pub:
	pthread_cond_destroy(&r->qcond);
	pthread_mutex_destroy(&r->qlock);
	link_destroy(&r->pub);
out_fetch:
	link_destroy(&r->fetch);
out_free:
	memset(&r->url, 0, sizeof(r->url)); /* the password */
	free(r);
	return rc;
}

int kvp_remote_open_env(const struct kvp_remote_config *cfg,
			struct kvp_remote **out, char *err, size_t errlen)
{
	struct kvp_remote_config c = *cfg;
	const char *url = getenv("KVP_REMOTE_URL");

	*out = NULL;
	if (!url || !*url)
		return fail(err, errlen, -ENOENT, "KVP_REMOTE_URL is not set");
	c.url = url;
	return kvp_remote_open(&c, out, err, errlen);
}

void kvp_remote_close(struct kvp_remote *r)
{
	if (!r)
		return;
	publish_stop(r);
	link_destroy(&r->pub);
	link_destroy(&r->fetch);
	memset(&r->url, 0, sizeof(r->url));
	free(r);
}

static int make_rkey(struct kvp_remote *r, const void *key, size_t keylen,
		     char *buf)
{
	size_t nlen = strlen(r->ns_hex);
	size_t plen = strlen(KEY_PREFIX);

	if (!key || !keylen || keylen > KVP_REMOTE_MAX_KEY)
		return -EINVAL;
	memcpy(buf, KEY_PREFIX, plen);
	memcpy(buf + plen, r->ns_hex, nlen);
	buf[plen + nlen] = ':';
	hex(key, keylen, buf + plen + nlen + 1);
	return (int)(plen + nlen + 1 + 2 * keylen);
}

/* What one reply makes of @g; counts it. */
static void take_reply(struct kvp_remote *r, struct kvp_remote_get *g,
		       const struct rop *op)
{
	const redisReply *rep = op->reply;

	if (op->status) {
		g->status = op->status;
		RSTAT_ADD(r, errors_total, 1);
	} else if (rep->type == REDIS_REPLY_NIL) {
		g->status = -ENOENT;
		RSTAT_ADD(r, misses_total, 1);
	} else if (rep->type != REDIS_REPLY_STRING) {
		g->status = -EIO; /* an error reply: CLUSTERDOWN, LOADING... */
		RSTAT_ADD(r, errors_total, 1);
	} else if (rep->len > g->buf_len) {
		g->status = -EMSGSIZE;
		RSTAT_ADD(r, oversize_total, 1);
	} else {
		/* copied first: the hook may open the record in place */
		memcpy(g->buf, rep->str, rep->len);
		if (r->verify(r->verify_arg, g->key, g->key_len, g->buf,
			      rep->len)) {
			g->status = -EBADMSG;
			RSTAT_ADD(r, verify_failed_total, 1);
			return;
		}
		g->len = rep->len;
		g->status = 0;
		RSTAT_ADD(r, hits_total, 1);
		RSTAT_ADD(r, bytes_read_total, rep->len);
	}
}

int kvp_remote_get_many(struct kvp_remote *r, struct kvp_remote_get *gets,
			size_t n)
{
	struct rop *ops;
	char *rkeys;
	int hits = 0;
	size_t i;

	for (i = 0; i < n; i++)
		if (!gets[i].key || !gets[i].key_len ||
		    gets[i].key_len > KVP_REMOTE_MAX_KEY ||
		    (!gets[i].buf && gets[i].buf_len))
			return -EINVAL;
	if (!n)
		return 0;
	ops = calloc(n, sizeof(*ops));
	rkeys = malloc(n * RKEY_MAX);
	if (!ops || !rkeys) {
		free(ops);
		free(rkeys);
		for (i = 0; i < n; i++)
			gets[i].status = -ENOMEM;
		return 0;
	}
	for (i = 0; i < n; i++) {
		ops[i].kind = ROP_GET;
		ops[i].rkey = rkeys + i * RKEY_MAX;
		ops[i].rkey_len = (size_t)make_rkey(r, gets[i].key,
						    gets[i].key_len,
						    rkeys + i * RKEY_MAX);
	}
	link_run(&r->fetch, ops, n);
	for (i = 0; i < n; i++) {
		gets[i].len = 0;
		take_reply(r, &gets[i], &ops[i]);
		hits += gets[i].status == 0;
		if (ops[i].reply)
			freeReplyObject(ops[i].reply);
	}
	free(ops);
	free(rkeys);
	return hits;
}

int kvp_remote_publish(struct kvp_remote *r, const void *key, size_t keylen,
		       const void *val, size_t len)
{
	char rkey[RKEY_MAX];
	int n = make_rkey(r, key, keylen, rkey);

	if (n < 0 || (!val && len) || len > KVP_REMOTE_MAX_VALUE)
		return -EINVAL;
	return publish_push(r, rkey, (size_t)n, val, len);
}

int kvp_remote_flush(struct kvp_remote *r, unsigned timeout_ms)
{
	return publish_flush(r, timeout_ms);
}

void kvp_remote_stats_read(struct kvp_remote *r, struct kvp_remote_stats *st)
{
	const uint64_t *src = (const uint64_t *)&r->st;
	uint64_t *dst = (uint64_t *)st;

	for (size_t i = 0; i < sizeof(*st) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}
