/* url.c - the remote tier's URL: parse, redact. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/remote/remote.h"
#include "lib/tunables/tunables.h" /* kvp_parse_bytes, kvp_seterr */

#define DEFAULT_TIMEOUT_MS 1000
#define DEFAULT_QUEUE 256
#define DEFAULT_QUEUE_BYTES (256ull << 20)

/* -EINVAL with the message in (err, errlen). */
#define bad(err, errlen, ...) (kvp_seterr(err, errlen, __VA_ARGS__), -EINVAL)

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Percent-decode [@s, @s + @n) into @out (@len bytes); false if it does
 * not fit, has a bad escape or decodes to a NUL. */
static bool decode(const char *s, size_t n, char *out, size_t len)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		int c = (unsigned char)s[i];

		if (c == '%') {
			int h, l;

			if (i + 2 >= n)
				return false;
			h = hexval(s[i + 1]);
			l = hexval(s[i + 2]);
			if (h < 0 || l < 0 || (h == 0 && l == 0))
				return false;
			c = h << 4 | l;
			i += 2;
		}
		if (o + 1 >= len)
			return false;
		out[o++] = (char)c;
	}
	out[o] = '\0';
	return true;
}

/* A decimal in [@lo, @hi] from [@s, @s + @n); false if not. */
static bool number(const char *s, size_t n, long lo, long hi, long *v)
{
	char buf[24], *end;

	if (n == 0 || n >= sizeof(buf) || s[0] < '0' || s[0] > '9')
		return false;
	memcpy(buf, s, n);
	buf[n] = '\0';
	errno = 0;
	*v = strtol(buf, &end, 10);
	return !errno && *end == '\0' && *v >= lo && *v <= hi;
}

static int parse_host(struct kvp_remote_url *u, const char *s, size_t n,
		      char *err, size_t errlen)
{
	const char *colon = NULL, *host = s;
	size_t hlen;
	long port = 6379;
	int i = u->nseeds;

	if (i == KVP_REMOTE_MAX_SEEDS)
		return bad(err, errlen, "more than %d hosts in the url",
			   KVP_REMOTE_MAX_SEEDS);
	if (n && s[0] == '[') { /* [ipv6]:port */
		const char *close = memchr(s, ']', n);

		if (!close)
			return bad(err, errlen, "unclosed '[' in the url's host");
		host = s + 1;
		hlen = (size_t)(close - host);
		if (close + 1 < s + n) {
			if (close[1] != ':')
				return bad(err, errlen,
					   "expected ':' after ']' in the url");
			colon = close + 1;
		}
	} else {
		colon = memchr(s, ':', n);
		hlen = colon ? (size_t)(colon - s) : n;
	}
	if (hlen == 0)
		return bad(err, errlen, "the url names no host");
	if (hlen >= sizeof(u->host[0]))
		return bad(err, errlen, "the url's host is too long");
	if (memchr(host, ':', hlen) && s[0] != '[')
		return bad(err, errlen, "bad host in the url");
	if (colon && !number(colon + 1, (size_t)(s + n - colon - 1), 1, 65535,
			     &port))
		return bad(err, errlen,
			   "bad port in the url (want 1..65535)");
	memcpy(u->host[i], host, hlen);
	u->host[i][hlen] = '\0';
	u->port[i] = (int)port;
	u->nseeds++;
	return 0;
}

static int parse_opt(struct kvp_remote_url *u, const char *s, size_t n,
		     char *err, size_t errlen)
{
	const char *eq = memchr(s, '=', n);
	size_t klen, vlen;
	const char *v;
	long x;

	if (!eq)
		return bad(err, errlen, "url option '%.*s' has no '='",
			   (int)(n > 40 ? 40 : n), s);
	klen = (size_t)(eq - s);
	v = eq + 1;
	vlen = n - klen - 1;
#define IS(name) (klen == strlen(name) && !memcmp(s, name, klen))
	if (IS("timeout_ms") || IS("connect_timeout_ms")) {
		if (!number(v, vlen, 1, 600000, &x))
			return bad(err, errlen,
				   "url option %.*s: want 1..600000 ms",
				   (int)klen, s);
		if (IS("timeout_ms"))
			u->timeout_ms = (unsigned)x;
		else
			u->connect_timeout_ms = (unsigned)x;
	} else if (IS("queue")) {
		if (!number(v, vlen, 1, 1 << 20, &x))
			return bad(err, errlen,
				   "url option queue: want 1..1048576 entries");
		u->queue = (unsigned)x;
	} else if (IS("queue_bytes")) {
		char num[32];
		uint64_t b;

		if (vlen >= sizeof(num))
			return bad(err, errlen, "url option queue_bytes: too long");
		memcpy(num, v, vlen);
		num[vlen] = '\0';
		if (kvp_parse_bytes(num, &b) || b < (1u << 20))
			return bad(err, errlen,
				   "url option queue_bytes: want a size of "
				   "at least 1M (e.g. 512M)");
		u->queue_bytes = b;
	} else if (IS("password_file")) {
		if (!decode(v, vlen, u->password_file,
			    sizeof(u->password_file)) ||
		    u->password_file[0] != '/')
			return bad(err, errlen,
				   "url option password_file: want an "
				   "absolute path");
	} else {
		return bad(err, errlen,
			   "unknown url option '%.*s' (timeout_ms, "
			   "connect_timeout_ms, password_file, queue, "
			   "queue_bytes)",
			   (int)(klen > 40 ? 40 : klen), s);
	}
#undef IS
	return 0;
}

/* Whether [@s...) (the URL past its authority) holds an '@' outside the
 * value of a password_file option. */
static bool late_at(const char *s)
{
	const char *opts = strchr(s, '?'), *q;

	for (q = strchr(s, '@'); q; q = strchr(q + 1, '@')) {
		const char *seg = q;

		if (!opts || q < opts)
			return true; /* in the host or the /db */
		while (seg > opts + 1 && seg[-1] != '&')
			seg--;
		if (strncmp(seg, "password_file=", 14) || q < seg + 14)
			return true;
	}
	return false;
}

int kvp_remote_url_parse(struct kvp_remote_url *u, const char *text,
			 char *err, size_t errlen)
{
	const char *p, *auth_end, *at, *hosts, *end;
	int rc;

	memset(u, 0, sizeof(*u));
	u->timeout_ms = DEFAULT_TIMEOUT_MS;
	u->connect_timeout_ms = DEFAULT_TIMEOUT_MS;
	u->queue = DEFAULT_QUEUE;
	u->queue_bytes = DEFAULT_QUEUE_BYTES;
	if (!text)
		return bad(err, errlen, "no url");
	if (!strncmp(text, "redis://", 8)) {
		p = text + 8;
	} else if (!strncmp(text, "redis+cluster://", 16)) {
		p = text + 16;
		u->cluster = true;
	} else if (!strncmp(text, "rediss://", 9)) {
		return bad(err, errlen,
			   "rediss:// (TLS) is not supported: Debian's "
			   "hiredis has no TLS; use a TLS tunnel to a local "
			   "port and redis://127.0.0.1:PORT");
	} else {
		return bad(err, errlen,
			   "the url must start with redis:// or "
			   "redis+cluster://");
	}
	auth_end = p + strcspn(p, "/?");
	/* userinfo: up to the last '@' of the authority */
	at = NULL;
	for (const char *q = p; q < auth_end; q++)
		if (*q == '@')
			at = q;
	/* An '@' past a '/' or '?' that is not in a password_file's value
	 * (the only option whose value may hold one): a password that holds
	 * a '/' or '?', which would be parsed as a host, a /db or options
	 * and echoed in their errors ("redis://se?cret=1@h" would name an
	 * option "cret"). */
	if (auth_end[0] && late_at(auth_end))
		return bad(err, errlen,
			   "the url's user or password holds a '/' or "
			   "'?': write them %%2F and %%3F (and '@' "
			   "%%40, ':' %%3A); the url is not shown, for "
			   "its password");
	hosts = p;
	if (at) {
		const char *colon = memchr(p, ':', (size_t)(at - p));
		size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);

		if (!decode(p, ulen, u->user, sizeof(u->user)))
			return bad(err, errlen,
				   "bad user name in the url (too long or a "
				   "bad %%XX)");
		if (colon && !decode(colon + 1, (size_t)(at - colon - 1),
				     u->password, sizeof(u->password)))
			return bad(err, errlen,
				   "bad password in the url (too long or a "
				   "bad %%XX)");
		if (!colon) { /* redis://pass@host: the password alone */
			memcpy(u->password, u->user, sizeof(u->user));
			u->user[0] = '\0';
		}
		hosts = at + 1;
	}
	while (hosts <= auth_end) {
		const char *comma = memchr(hosts, ',', (size_t)(auth_end - hosts));
		const char *stop = comma ? comma : auth_end;

		rc = parse_host(u, hosts, (size_t)(stop - hosts), err, errlen);
		if (rc)
			return rc;
		if (!comma)
			break;
		hosts = comma + 1;
	}
	if (u->nseeds > 1 && !u->cluster)
		return bad(err, errlen,
			   "several hosts need redis+cluster://");
	p = auth_end;
	if (*p == '/') {
		long db;

		p++;
		end = p + strcspn(p, "?");
		if (end > p) {
			if (u->cluster)
				return bad(err, errlen,
					   "a cluster has no /db (only db 0)");
			if (!number(p, (size_t)(end - p), 0, 9999, &db))
				return bad(err, errlen,
					   "bad /db in the url (a number)");
			u->db = (int)db;
		}
		p = end;
	}
	if (*p == '?') {
		p++;
		while (*p) {
			size_t n = strcspn(p, "&");

			rc = parse_opt(u, p, n, err, errlen);
			if (rc)
				return rc;
			p += n;
			if (*p == '&')
				p++;
		}
	}
	/* "user:@host": the password is in password_file */
	if (at && !u->password[0] && !u->password_file[0])
		return bad(err, errlen,
			   "empty password in the url (give it, or "
			   "password_file=PATH)");
	return 0;
}

char *kvp_remote_url_redact(const char *text, char *buf, size_t len)
{
	const char *p = strstr(text ? text : "", "://");
	const char *auth_end, *at = NULL, *colon;

	if (!len)
		return buf;
	if (!p) {
		snprintf(buf, len, "%s", text ? text : "");
		return buf;
	}
	p += 3;
	auth_end = p + strcspn(p, "/?");
	for (const char *q = p; q < auth_end; q++)
		if (*q == '@')
			at = q;
	if (!at) {
		snprintf(buf, len, "%s", text);
		return buf;
	}
	colon = memchr(p, ':', (size_t)(at - p));
	if (colon) /* user:PASS@ -> user:***@ */
		snprintf(buf, len, "%.*s***%s", (int)(colon + 1 - text), text,
			 at);
	else /* PASS@ -> ***@ */
		snprintf(buf, len, "%.*s***%s", (int)(p - text), text, at);
	return buf;
}
