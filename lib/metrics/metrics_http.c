/*
 * metrics_http.c - /metrics over HTTP (metrics_http.h).
 *
 * The socket is made, bound and listened on here, not by the daemon, so
 * that a port in use or a bad address is an errno at start with a
 * message that says which, and the daemon only serves it.
 */
#include "lib/metrics/metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "lib/tunables/tunables.h"
#include "lib/view/prom.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct kvp_metrics_http {
	struct MHD_Daemon *d;		/* serves fd */
	int fd;				/* the listening socket */
	int epoll_fd;			/* d's, which it keeps the number of */
	kvp_metrics_render_fn render;	/* makes each scrape's text */
	void *arg;			/* render's */
	struct kvp_pager *pager;	/* start_pager: what is shown */
	struct kvp_kv_config kv;	/* start_pager: the KV tunables */
	unsigned port;			/* bound */
	char url[96];			/* http://HOST:PORT/metrics */
	atomic_uint_least64_t scrapes;	/* 200s answered */
};

static const char accepted[] =
    "accepted: PORT, HOST:PORT or [IPV6]:PORT, with HOST a numeric address "
    "or localhost, such as 127.0.0.1:9464";

int kvp_metrics_http_parse(const char *addr, void *sa, size_t *salen,
			   char *err, size_t errlen)
{
	struct sockaddr_in *in4 = sa;
	struct sockaddr_in6 *in6 = sa;
	char host[64] = "127.0.0.1", *end;
	const char *port, *colon;
	unsigned long v;

	memset(sa, 0, sizeof(struct sockaddr_storage));
	if (!addr || !*addr) {
		kvp_seterr(err, errlen, "metrics listen address: empty; %s",
			   accepted);
		return -EINVAL;
	}
	if (addr[0] == '[') {
		const char *rb = strchr(addr, ']');

		if (!rb || rb[1] != ':' ||
		    (size_t)(rb - addr - 1) >= sizeof(host))
			goto bad;
		memcpy(host, addr + 1, rb - addr - 1);
		host[rb - addr - 1] = 0;
		port = rb + 2;
	} else if ((colon = strrchr(addr, ':'))) {
		if (strchr(addr, ':') != colon ||
		    (size_t)(colon - addr) >= sizeof(host))
			goto bad; /* an IPv6 address needs its brackets */
		memcpy(host, addr, colon - addr);
		host[colon - addr] = 0;
		port = colon + 1;
	} else {
		port = addr;
	}
	if (*port < '0' || *port > '9')
		goto bad;
	errno = 0;
	v = strtoul(port, &end, 10);
	if (errno || *end || v > 65535) {
		kvp_seterr(err, errlen,
			   "metrics listen address '%s': port '%s' is not a "
			   "number from 0 to 65535 (0: any free port)",
			   addr, port);
		return -EINVAL;
	}
	if (!*host || !strcmp(host, "localhost"))
		strcpy(host, "127.0.0.1");
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)v);
		*salen = sizeof(*in4);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)v);
		*salen = sizeof(*in6);
		return 0;
	}
bad:
	memset(sa, 0, sizeof(struct sockaddr_storage));
	kvp_seterr(err, errlen, "metrics listen address '%s' is not valid; %s",
		   addr, accepted);
	return -EINVAL;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c,
			      const char *url, const char *method,
			      const char *version, const char *upload,
			      size_t *upload_len, void **con_cls)
{
	struct kvp_metrics_http *m = cls;
	struct MHD_Response *resp;
	unsigned status = MHD_HTTP_OK;
	enum MHD_Result ret;
	char *buf = NULL;
	size_t len = 0;
	static const char not_found[] = "not found: scrape /metrics\n";
	static const char bad_method[] = "only GET and HEAD\n";
	static const char failed[] = "cannot render the metrics\n";

	if (strcmp(method, MHD_HTTP_METHOD_GET) &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD)) {
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
		resp = MHD_create_response_from_buffer(
		    sizeof(bad_method) - 1, (void *)bad_method,
		    MHD_RESPMEM_PERSISTENT);
	} else if (strcmp(url, "/metrics")) {
		status = MHD_HTTP_NOT_FOUND;
		resp = MHD_create_response_from_buffer(
		    sizeof(not_found) - 1, (void *)not_found,
		    MHD_RESPMEM_PERSISTENT);
	} else if (m->render(m->arg, &buf, &len)) {
		status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		resp = MHD_create_response_from_buffer(
		    sizeof(failed) - 1, (void *)failed, MHD_RESPMEM_PERSISTENT);
	} else {
		resp = MHD_create_response_from_buffer(len, buf,
						       MHD_RESPMEM_MUST_FREE);
		if (!resp)
			free(buf);
	}
	if (!resp)
		return MHD_NO;
	if (status == MHD_HTTP_OK)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
					CONTENT_TYPE);
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
					"GET, HEAD");
	ret = MHD_queue_response(c, status, resp);
	MHD_destroy_response(resp);
	if (status == MHD_HTTP_OK)
		atomic_fetch_add(&m->scrapes, 1);
	return ret;
}

/* The bound socket of @addr into m->fd, m->port and m->url. */
static int bind_listen(struct kvp_metrics_http *m, const char *addr,
		       char *err, size_t errlen)
{
	struct sockaddr_storage ss, got;
	socklen_t gotlen = sizeof(got);
	char host[INET6_ADDRSTRLEN];
	size_t salen;
	int one = 1, r;

	r = kvp_metrics_http_parse(addr, &ss, &salen, err, errlen);
	if (r)
		return r;
	m->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	/* the engine's: a program's close-all leaves it (fdset.h) */
	m->fd = kvp_fd_own(m->fd < 0 ? -errno : m->fd);
	if (m->fd < 0) {
		r = m->fd;
		kvp_seterr(err, errlen, "metrics: cannot make a socket: %s",
			   strerror(-r));
		return r;
	}
	/* a restarted server takes its port back from TIME_WAIT */
	setsockopt(m->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(m->fd, (struct sockaddr *)&ss, (socklen_t)salen) ||
	    listen(m->fd, 16)) {
		r = -errno;
		if (r == -EADDRINUSE)
			kvp_seterr(err, errlen,
				   "metrics: cannot listen on %s: the port is "
				   "in use; pick another one, or 0 for any "
				   "free port",
				   addr);
		else if (r == -EADDRNOTAVAIL)
			kvp_seterr(err, errlen,
				   "metrics: cannot listen on %s: no interface "
				   "of this machine has that address",
				   addr);
		else if (r == -EACCES)
			kvp_seterr(err, errlen,
				   "metrics: cannot listen on %s: a port under "
				   "1024 needs privileges; take one above",
				   addr);
		else
			kvp_seterr(err, errlen,
				   "metrics: cannot listen on %s: %s", addr,
				   strerror(-r));
		kvp_fd_close(m->fd);
		m->fd = -1;
		return r;
	}
	getsockname(m->fd, (struct sockaddr *)&got, &gotlen);
	if (got.ss_family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&got;

		m->port = ntohs(a->sin6_port);
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(m->url, sizeof(m->url), "http://[%s]:%u/metrics",
			 host, m->port);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&got;

		m->port = ntohs(a->sin_port);
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(m->url, sizeof(m->url), "http://%s:%u/metrics", host,
			 m->port);
	}
	return 0;
}

/* It closes both of its descriptors: forgotten first (fdset.h). */
static void stop_daemon(struct kvp_metrics_http *m)
{
	kvp_fd_disown(m->fd);
	kvp_fd_disown(m->epoll_fd);
	MHD_stop_daemon(m->d);
}

/* Listen on @addr and serve what @m renders; @m is freed on failure. */
static int start(struct kvp_metrics_http *m, const char *addr,
		 struct kvp_metrics_http **out, char *err, size_t errlen)
{
	int r = bind_listen(m, addr, err, errlen);
	unsigned held;

	if (r)
		goto err_free;
	/*
	 * One thread of its own, a few connections, none kept idle long.  Its
	 * lasting descriptors are the socket and an epoll one, both the
	 * engine's (fdset.h); no ITC eventfd, which could not be: on Linux
	 * the socket, shut down, wakes the thread to stop.  The epoll one
	 * cannot be moved: made above 0, 1 and 2.
	 */
	held = kvp_fd_hold_std();
	m->d = MHD_start_daemon(
	    MHD_USE_EPOLL_INTERNAL_THREAD, 0, NULL, NULL, answer, m,
	    MHD_OPTION_LISTEN_SOCKET, (MHD_socket)m->fd,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
	kvp_fd_release_std(held);
	if (!m->d) {
		r = -EIO;
		kvp_seterr(err, errlen,
			   "metrics: libmicrohttpd could not start serving %s",
			   addr);
		goto err_close;
	}
	/* an epoll daemon has one */
	m->epoll_fd =
	    MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd;
	r = kvp_fd_note(m->epoll_fd);
	if (r) {
		kvp_seterr(err, errlen, "metrics: out of memory");
		stop_daemon(m);
		goto err_free;
	}
	*out = m;
	return 0;

err_close:
	kvp_fd_close(m->fd);
err_free:
	free(m);
	return r;
}

/* A server of what @render makes, not started; NULL (said in @err)
 * without memory. */
static struct kvp_metrics_http *server_new(kvp_metrics_render_fn render,
					   void *arg, char *err, size_t errlen)
{
	struct kvp_metrics_http *m = calloc(1, sizeof(*m));

	if (!m) {
		kvp_seterr(err, errlen, "metrics: out of memory");
		return NULL;
	}
	m->fd = m->epoll_fd = -1;
	m->render = render;
	m->arg = arg;
	return m;
}

int kvp_metrics_http_start(const char *addr, kvp_metrics_render_fn render,
			   void *arg, struct kvp_metrics_http **out, char *err,
			   size_t errlen)
{
	struct kvp_metrics_http *m = server_new(render, arg, err, errlen);

	*out = NULL;
	return m ? start(m, addr, out, err, errlen) : -ENOMEM;
}

static int render_pager(void *arg, char **buf, size_t *len)
{
	struct kvp_metrics_http *m = arg;

	return kvp_prom_render(m->pager, &m->kv, buf, len);
}

int kvp_metrics_http_start_pager(const char *addr, struct kvp_pager *p,
				 const struct kvp_kv_config *kv,
				 struct kvp_metrics_http **out, char *err,
				 size_t errlen)
{
	struct kvp_metrics_http *m = server_new(render_pager, NULL, err,
						errlen);

	*out = NULL;
	if (!m)
		return -ENOMEM;
	m->arg = m;
	m->pager = p;
	if (kv)
		m->kv = *kv;
	else
		kvp_kv_config_defaults(&m->kv);
	return start(m, addr, out, err, errlen);
}

unsigned kvp_metrics_http_port(const struct kvp_metrics_http *m)
{
	return m->port;
}

const char *kvp_metrics_http_url(const struct kvp_metrics_http *m)
{
	return m->url;
}

uint64_t kvp_metrics_http_scrapes(const struct kvp_metrics_http *m)
{
	return atomic_load(&m->scrapes);
}

void kvp_metrics_http_stop(struct kvp_metrics_http *m)
{
	if (!m)
		return;
	stop_daemon(m);
	free(m);
}
