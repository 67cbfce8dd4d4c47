/*
 * test_metrics_http.c - lib/metrics/metrics_http.c: listen addresses,
 * errors at start (a bad address, a port in use), and what a request
 * gets (the text, 404, 405), over a plain socket.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "lib/metrics/metrics_http.h"
#include "tests/helpers/helpers.h"

static char err[256];

static int parse(const char *addr, struct sockaddr_storage *ss)
{
	size_t len = 0;

	err[0] = 0;
	return kvp_metrics_http_parse(addr, ss, &len, err, sizeof(err));
}

START_TEST(parse_addresses)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *a = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;

	/* a port alone: loopback */
	ck_assert_int_eq(parse("9464", &ss), 0);
	ck_assert_int_eq(a->sin_family, AF_INET);
	ck_assert_uint_eq(ntohs(a->sin_port), 9464);
	ck_assert_uint_eq(ntohl(a->sin_addr.s_addr), INADDR_LOOPBACK);
	ck_assert_int_eq(parse(":0", &ss), 0);
	ck_assert_uint_eq(ntohl(a->sin_addr.s_addr), INADDR_LOOPBACK);
	ck_assert_int_eq(parse("localhost:80", &ss), 0);
	ck_assert_uint_eq(ntohl(a->sin_addr.s_addr), INADDR_LOOPBACK);
	/* any other address only when named */
	ck_assert_int_eq(parse("0.0.0.0:9464", &ss), 0);
	ck_assert_uint_eq(ntohl(a->sin_addr.s_addr), INADDR_ANY);
	ck_assert_int_eq(parse("[::1]:9464", &ss), 0);
	ck_assert_int_eq(a6->sin6_family, AF_INET6);
	ck_assert_uint_eq(ntohs(a6->sin6_port), 9464);
}
END_TEST

START_TEST(parse_refuses_bad_input)
{
	static const char *bad[] = { "",	    "x",	"9464x",
				     "65536",	    "-1",	"host:80",
				     "::1:80",	    "[::1]80",	"[::1:80",
				     "1.2.3.4:",    "1.2.3:80", "127.0.0.1:+8",
				     "[nothost]:80" };
	struct sockaddr_storage ss;
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(parse(bad[i], &ss) == -EINVAL, "took '%s'",
			      bad[i]);
		ck_assert_msg(strstr(err, "accepted") || strstr(err, "port"),
			      "'%s': %s", bad[i], err);
	}
}
END_TEST

static int render_hello(void *arg, char **buf, size_t *len)
{
	int *calls = arg;

	(*calls)++;
	*buf = strdup("# HELP x_total a test\n# TYPE x_total counter\n"
		      "x_total 1\n");
	*len = strlen(*buf);
	return 0;
}

/* One HTTP/1.0 request to 127.0.0.1:@port; the whole answer, malloc'd. */
static char *request(unsigned port, const char *req)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port) };
	size_t len = 0, cap = 65536;
	char *buf = calloc(1, cap);
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while ((n = read(fd, buf + len, cap - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	return buf;
}

START_TEST(serves_metrics)
{
	struct kvp_metrics_http *m;
	int calls = 0;
	char *r;

	ck_assert_int_eq(kvp_metrics_http_start("127.0.0.1:0", render_hello,
						&calls, &m, err, sizeof(err)),
			 0);
	ck_assert_uint_gt(kvp_metrics_http_port(m), 0);
	ck_assert(!strncmp(kvp_metrics_http_url(m), "http://127.0.0.1:", 17));

	r = request(kvp_metrics_http_port(m), "GET /metrics HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.0 200", 12) ||
			  !strncmp(r, "HTTP/1.1 200", 12),
		      "%s", r);
	ck_assert_ptr_nonnull(
	    strstr(r, "text/plain; version=0.0.4; charset=utf-8"));
	ck_assert_ptr_nonnull(strstr(r, "\r\n\r\n# HELP x_total a test\n"));
	free(r);
	ck_assert_int_eq(calls, 1);
	ck_assert_uint_eq(kvp_metrics_http_scrapes(m), 1);

	r = request(kvp_metrics_http_port(m), "GET /other HTTP/1.0\r\n\r\n");
	ck_assert_ptr_nonnull(strstr(r, " 404 "));
	free(r);
	r = request(kvp_metrics_http_port(m),
		    "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
	ck_assert_ptr_nonnull(strstr(r, " 405 "));
	free(r);
	ck_assert_int_eq(calls, 1);
	kvp_metrics_http_stop(m);
}
END_TEST

/* Descriptors open below 1024; *owned: how many of them the engine's. */
static int count_open(int *owned)
{
	int n = 0;

	*owned = 0;
	for (int fd = 0; fd < 1024; fd++) {
		if (fcntl(fd, F_GETFD) < 0)
			continue;
		n++;
		*owned += kvp_fd_owned(fd);
	}
	return n;
}

/* The server's lasting descriptors (the socket, libmicrohttpd's epoll one)
 * are the engine's, kept through a program's close-all; stop closes and
 * forgets them. */
START_TEST(descriptors_are_the_engines)
{
	struct kvp_metrics_http *m;
	int calls = 0, owned, before = count_open(&owned), running;
	char *r;

	ck_assert_int_eq(owned, 0);
	ck_assert_int_eq(kvp_metrics_http_start("127.0.0.1:0", render_hello,
						&calls, &m, err, sizeof(err)),
			 0);
	running = count_open(&owned);
	ck_assert_int_eq(owned, 2);
	ck_assert_int_eq(running, before + owned);
	r = request(kvp_metrics_http_port(m), "GET /metrics HTTP/1.0\r\n\r\n");
	ck_assert_msg(!strncmp(r, "HTTP/1.1 200", 12), "%s", r);
	free(r);
	kvp_metrics_http_stop(m);
	ck_assert_int_eq(count_open(&owned), before);
	ck_assert_int_eq(owned, 0);
	ck_assert_int_eq(kvp_fd_next_owned(0), -1);
}
END_TEST

START_TEST(port_in_use_fails_at_start)
{
	struct kvp_metrics_http *m, *m2 = NULL;
	char addr[32];
	int calls = 0;

	ck_assert_int_eq(kvp_metrics_http_start("0", render_hello, &calls, &m,
						err, sizeof(err)),
			 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", kvp_metrics_http_port(m));
	ck_assert_int_eq(kvp_metrics_http_start(addr, render_hello, &calls,
						&m2, err, sizeof(err)),
			 -EADDRINUSE);
	ck_assert_ptr_null(m2);
	ck_assert_msg(strstr(err, "in use"), "%s", err);
	/* stopped, the port is free again */
	kvp_metrics_http_stop(m);
	ck_assert_int_eq(kvp_metrics_http_start(addr, render_hello, &calls,
						&m2, err, sizeof(err)),
			 0);
	kvp_metrics_http_stop(m2);
	kvp_metrics_http_stop(NULL);
}
END_TEST

START_TEST(bad_address_fails_at_start)
{
	struct kvp_metrics_http *m = (void *)1;
	int calls = 0;

	ck_assert_int_eq(kvp_metrics_http_start("nohost:1", render_hello,
						&calls, &m, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_null(m);
	/* TEST-NET-1: no interface of this machine has it */
	ck_assert_int_eq(kvp_metrics_http_start("192.0.2.1:0", render_hello,
						&calls, &m, err, sizeof(err)),
			 -EADDRNOTAVAIL);
	ck_assert_msg(strstr(err, "no interface"), "%s", err);
}
END_TEST

static Suite *metrics_http_suite(void)
{
	Suite *s = suite_create("metrics_http");
	TCase *tc = kvp_test_tcase(s, "http", 60);

	tcase_add_test(tc, parse_addresses);
	tcase_add_test(tc, parse_refuses_bad_input);
	tcase_add_test(tc, serves_metrics);
	tcase_add_test(tc, descriptors_are_the_engines);
	tcase_add_test(tc, port_in_use_fails_at_start);
	tcase_add_test(tc, bad_address_fails_at_start);
	return s;
}

int main(void)
{
	return kvp_test_run(metrics_http_suite());
}
