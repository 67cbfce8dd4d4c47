/* remote.c - the remote tier's API: open, close, the calls, statistics. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/remote/remote_i.h"
#include "lib/tunables/tunables.h" /* kvp_seterr */

#define STAT_DESC(n, k, d) { #n, k, d, offsetof(struct kvp_remote_stats, n) },
const struct kvp_stat_desc kvp_remote_stat_descs[] = {
	KVP_REMOTE_STATS(STAT_DESC)
};
#undef STAT_DESC
const size_t kvp_remote_stat_count =
	sizeof(kvp_remote_stat_descs) / sizeof(kvp_remote_stat_descs[0]);

/* @code with the message in (err, errlen). */
#define fail(err, errlen, code, ...) \
	(kvp_seterr(err, errlen, __VA_ARGS__), (code))

int kvp_remote_url_password(struct kvp_remote_url *u, char *err,
			    size_t errlen)
{
	/* one byte more than fits: a first line that long is refused, not
	 * cut (the server would refuse the cut one as a wrong password) */
	char line[sizeof(u->password) + 1];
	struct stat st;
	ssize_t n;
	int fd, e;

	if (u->password[0] || !u->password_file[0])
		return 0;
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
	n = read(fd, line, sizeof(line) - 1);
	e = errno;
	close(fd);
	if (n < 0)
		return fail(err, errlen, -e,
			    "cannot read the redis password file %s: %s",
			    u->password_file, strerror(e));
	line[n] = '\0';
	line[strcspn(line, "\r\n")] = '\0';
	if (strlen(line) >= sizeof(u->password)) {
		explicit_bzero(line, sizeof(line));
		return fail(err, errlen, -EINVAL,
			    "the redis password file %s holds a password "
			    "longer than %zu bytes",
			    u->password_file, sizeof(u->password) - 1);
	}
	memcpy(u->password, line, strlen(line) + 1);
	explicit_bzero(line, sizeof(line)); /* kept, unlike a dead memset */
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
	pthread_mutex_init(&r->wlock, NULL);
	rc = kvp_remote_url_parse(&r->url, cfg->url, err, errlen);
	if (rc)
		goto out_free;
	kvp_remote_url_redact(cfg->url, r->shown_url, sizeof(r->shown_url));
	rc = kvp_remote_url_password(&r->url, err, errlen);
	if (rc)
		goto out_free;
	remote_hex(cfg->ns, cfg->ns_len, r->ns_hex);
	r->verify = cfg->verify;
	r->verify_arg = cfg->verify_arg;
	r->encode = cfg->encode;
	r->encode_arg = cfg->encode_arg;
	rc = link_init(&r->fetch, r, true);
	if (rc)
		goto out_free;
	rc = link_init(&r->pub, r, false);
	if (rc)
		goto out_fetch;
	rc = publish_start(r);
	if (rc) {
		kvp_seterr(err, errlen, "cannot start the publisher thread: %s",
			   strerror(-rc));
		goto out_pub;
	}
	rc = fetch_start(r);
	if (rc) {
		kvp_seterr(err, errlen, "cannot start the fetch thread: %s",
			   strerror(-rc));
		publish_stop(r);
		goto out_links;
	}
	link_warm(&r->fetch);
	*out = r;
	return 0;
out_pub:
	pthread_cond_destroy(&r->qcond);
	pthread_mutex_destroy(&r->qlock);
out_links:
	link_destroy(&r->pub);
out_fetch:
	link_destroy(&r->fetch);
out_free:
	memset(&r->url, 0, sizeof(r->url)); /* the password */
	pthread_mutex_destroy(&r->wlock);
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
	fetch_stop(r);
	publish_stop(r);
	link_destroy(&r->pub);
	link_destroy(&r->fetch);
	memset(&r->url, 0, sizeof(r->url));
	pthread_mutex_destroy(&r->wlock);
	free(r);
}

int kvp_remote_get_many(struct kvp_remote *r, struct kvp_remote_get *gets,
			size_t n)
{
	return fetch_many(r, gets, n);
}

int kvp_remote_fetch_submit(struct kvp_remote *r, struct kvp_remote_get *gets,
			    size_t n, kvp_remote_done_fn done, void *arg)
{
	return fetch_submit(r, gets, n, done, arg);
}

int kvp_remote_publish(struct kvp_remote *r, const void *key, size_t keylen,
		       const void *val, size_t len)
{
	char rkey[REMOTE_RKEY_MAX];
	int n = remote_rkey(r, key, keylen, rkey);

	if (n < 0 || (!val && len) || len > KVP_REMOTE_MAX_VALUE)
		return -EINVAL;
	return publish_push(r, rkey, (size_t)n, key, keylen, val, len);
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
