/*
 * metrics_http.h - the Prometheus text (lib/view/prom.h) served over HTTP
 * at /metrics, by libmicrohttpd, for a scraper (Prometheus, an agent,
 * curl).
 *
 * The listen address is HOST:PORT, [IPV6]:PORT, or PORT alone (then on
 * 127.0.0.1: loopback unless an address says otherwise).  HOST is a
 * numeric address, or "localhost"; PORT 0 takes a free port, which
 * kvp_metrics_http_port tells.  GET or HEAD /metrics answers the text
 * (Content-Type: text/plain; version=0.0.4); any other path 404, any
 * other method 405.  The server has one thread of its own; the text is
 * rendered anew for each request by the callback, on that thread.
 *
 * Calls return 0 or -errno; a failed start leaves nothing behind.
 */
#ifndef KVP_METRICS_HTTP_H
#define KVP_METRICS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_tunables.h"
#include "pager/pager.h"

struct kvp_metrics_http;

/*
 * The text of one scrape: a malloc'd buffer in *buf of *len bytes (the
 * server frees it), and 0; or -errno, answered as 500.
 */
typedef int (*kvp_metrics_render_fn)(void *arg, char **buf, size_t *len);

/*
 * kvp_metrics_http_parse - @addr (see above) into a socket address in
 * @sa (room: a struct sockaddr_storage) of *salen bytes.  Returns 0, or
 * -EINVAL with what is wrong and what is accepted in @err.
 */
int kvp_metrics_http_parse(const char *addr, void *sa, size_t *salen,
			   char *err, size_t errlen);

/*
 * kvp_metrics_http_start - listen on @addr now (so that a port in use
 * or an address not of this machine fails here, at start) and serve
 * what @render makes.  Returns 0 and *out, or -errno with what failed
 * and the remedy in @err: -EINVAL (a bad address), -EADDRINUSE,
 * -EADDRNOTAVAIL, -EACCES (a port under 1024), -ENOMEM, or the daemon
 * failing to start (-EIO).
 */
int kvp_metrics_http_start(const char *addr, kvp_metrics_render_fn render,
			   void *arg, struct kvp_metrics_http **out, char *err,
			   size_t errlen);

/*
 * kvp_metrics_http_start_pager - the same, serving pager @p's text with
 * the KV tunables @kv (NULL: their defaults; copied).  The pager must
 * outlive the server.
 */
int kvp_metrics_http_start_pager(const char *addr, struct kvp_pager *p,
				 const struct kvp_kv_config *kv,
				 struct kvp_metrics_http **out, char *err,
				 size_t errlen);

/* The port listened on (the one taken for PORT 0). */
unsigned kvp_metrics_http_port(const struct kvp_metrics_http *m);

/* "http://HOST:PORT/metrics", the address to scrape (static to @m). */
const char *kvp_metrics_http_url(const struct kvp_metrics_http *m);

/* Scrapes answered so far (200s). */
uint64_t kvp_metrics_http_scrapes(const struct kvp_metrics_http *m);

/*
 * kvp_metrics_http_stop - stop listening, end the server's thread once a
 * request in progress is answered, free @m.  Safe with NULL.
 */
void kvp_metrics_http_stop(struct kvp_metrics_http *m);

#endif /* KVP_METRICS_HTTP_H */
