/*
 * link.c - connections to Redis: connect with AUTH and SELECT, back off
 * after a failure, route by hash slot in a cluster (CLUSTER SLOTS, MOVED,
 * ASK) and pipeline commands node by node.
 *
 * A node's connection is in one of three states:
 *
 *   closed --node_conn--> open --node_fail--> backing off
 *   backing off --node_conn, once retry_at_ns has passed--> open | (again)
 *
 * node_fail doubles the wait (BACKOFF_FIRST_MS up to BACKOFF_MAX_MS);
 * a connection made resets it.  While a node backs off, its commands fail
 * at once with -ENOTCONN: nothing waits on a server known to be gone.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/remote/remote_i.h"

uint64_t remote_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* @fmt's message on stderr unless said already (or WARN_MAX said);
 * @tail after. */
static void warn_once(struct kvp_remote *r, const char *tail, const char *fmt,
		      va_list ap) __attribute__((format(printf, 3, 0)));
static void warn_once(struct kvp_remote *r, const char *tail, const char *fmt,
		      va_list ap)
{
	char msg[WARN_LEN];
	unsigned i;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	pthread_mutex_lock(&r->wlock);
	for (i = 0; i < r->nwarned && strcmp(r->warned[i], msg); i++)
		;
	if (i == r->nwarned && i < WARN_MAX) {
		strcpy(r->warned[r->nwarned++], msg);
		fprintf(stderr, "kvpager: warning: remote tier %s: %s%s\n",
			r->shown_url, msg, tail);
	}
	pthread_mutex_unlock(&r->wlock);
}

void remote_warn(struct kvp_remote *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	warn_once(r,
		  "; going on without it, its failures counted, the server "
		  "tried again",
		  fmt, ap);
	va_end(ap);
}

void remote_note(struct kvp_remote *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	warn_once(r, "", fmt, ap);
	va_end(ap);
}

void remote_warn_reply(struct kvp_remote *r, const char *cmd,
		       const redisReply *rep)
{
	const char *fix = "";

	if (rep->type != REDIS_REPLY_ERROR) {
		remote_warn(r, "%s got a reply of type %d", cmd, rep->type);
		return;
	}
	/* a redirection names a slot and an address: said once, not once
	 * for each (remote_warn says WARN_MAX causes at most) */
	if ((!strncmp(rep->str, "MOVED ", 6) || !strncmp(rep->str, "ASK ", 4)) &&
	    !r->url.cluster) {
		remote_warn(r,
			    "the server refused %s: it is a Redis Cluster node "
			    "that does not serve the key's slot (give "
			    "redis+cluster://host:port[,host:port...])",
			    cmd);
		return;
	}
	/* a cluster's: link_run follows all but those it has no room for */
	if (!strncmp(rep->str, "MOVED ", 6) || !strncmp(rep->str, "ASK ", 4)) {
		remote_warn(r,
			    "%s was redirected to an address the tier cannot "
			    "use (malformed, or past the %d nodes it knows)",
			    cmd, LINK_MAX_NODES);
		return;
	}
	if (!strncmp(rep->str, "NOAUTH", 6))
		fix = " (give the password: redis://[user]:password@host...)";
	else if (!strncmp(rep->str, "OOM", 3))
		fix = " (raise the server's maxmemory, or let it evict: "
		      "maxmemory-policy allkeys-lru)";
	else if (!strncmp(rep->str, "NOPERM", 6)) /* a fetch sends GETRANGE */
		fix = " (the URL's ACL user needs +getrange and +set on "
		      "~kvp:*)";
	remote_warn(r, "the server refused %s: %s%s", cmd, rep->str, fix);
}

static struct timeval ms_tv(unsigned ms)
{
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (long)(ms % 1000) * 1000 };
	return tv;
}

static int node_add(struct rlink *l, const char *host, int port)
{
	for (int i = 0; i < l->nnodes; i++)
		if (l->nodes[i].port == port && !strcmp(l->nodes[i].host, host))
			return i;
	if (l->nnodes == LINK_MAX_NODES || strlen(host) >= sizeof(l->nodes[0].host))
		return -1;
	struct rnode *n = &l->nodes[l->nnodes];

	memset(n, 0, sizeof(*n));
	strcpy(n->host, host);
	n->port = port;
	return l->nnodes++;
}

int link_init(struct rlink *l, struct kvp_remote *r, bool fetch)
{
	memset(l, 0, sizeof(*l));
	l->r = r;
	l->fetch = fetch;
	if (r->url.cluster) {
		l->slot_node = calloc(LINK_SLOTS, 1);
		if (!l->slot_node)
			return -ENOMEM;
		l->slots_stale = true;
	}
	for (int i = 0; i < r->url.nseeds; i++)
		node_add(l, r->url.host[i], r->url.port[i]);
	pthread_mutex_init(&l->lock, NULL);
	return 0;
}

void link_destroy(struct rlink *l)
{
	for (int i = 0; i < l->nnodes; i++) {
		if (l->nodes[i].ctx)
			redisFree(l->nodes[i].ctx);
		resolve_leave(&l->nodes[i].lookup);
	}
	free(l->slot_node);
	pthread_mutex_destroy(&l->lock);
}

/* Close @n's connection (if any) and start or lengthen its back-off. */
static void node_fail(struct rlink *l, struct rnode *n)
{
	if (n->ctx)
		redisFree(n->ctx);
	n->ctx = NULL;
	n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : BACKOFF_FIRST_MS;
	if (n->backoff_ms > BACKOFF_MAX_MS)
		n->backoff_ms = BACKOFF_MAX_MS;
	n->retry_at_ns = remote_now_ns() + (uint64_t)n->backoff_ms * 1000000u;
	if (l->slot_node) /* a master gone: its slots may have moved */
		l->slots_stale = true;
}

/*
 * A command past its timeout, its wait begun at @began_ns: counted, and
 * counted a wait of its own unless it began before the last wait counted
 * ran out: the two then ran out within one timeout_ms (node_prime's
 * nodes, all asked before any is waited on).  Measured from the last wait
 * counted, not the last timeout, so that waits each begun before the one
 * before ran out do not chain into one.
 */
static void timed_out(struct rlink *l, uint64_t began_ns)
{
	RSTAT_ADD(l->r, timeouts_total, 1);
	if (began_ns < l->wait_ran_out_ns)
		return;
	RSTAT_ADD(l->r, timeout_waits_total, 1);
	l->wait_ran_out_ns = remote_now_ns();
}

/* Why @c's last read or write failed: -ETIMEDOUT past the socket's
 * timeout (EAGAIN, as hiredis leaves it, counted: a wait of its own, the
 * socket's timeout begun with the read, after any wait before), else
 * -EIO. */
static int io_cause(struct rlink *l, const redisContext *c)
{
	if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		timed_out(l, remote_now_ns());
		return -ETIMEDOUT;
	}
	return -EIO;
}

/* A command whose reply must be a status (AUTH, SELECT): 0 if it was;
 * -EACCES with the server's error in @why if not; a connection that
 * timed out or failed: io_cause, and false blames no password. */
static int command_ok(struct rlink *l, redisContext *c, int argc,
		      const char **argv, const size_t *lens, char *why,
		      size_t len)
{
	redisReply *rep = redisCommandArgv(c, argc, argv, lens);
	int err = 0;

	if (!rep) {
		err = io_cause(l, c);
		snprintf(why, len, "%s", c->errstr);
		return err;
	}
	if (rep->type != REDIS_REPLY_STATUS) {
		err = -EACCES;
		snprintf(why, len, "%s",
			 rep->type == REDIS_REPLY_ERROR ? rep->str
							: "not a status reply");
	}
	freeReplyObject(rep);
	return err;
}

/* Say why @cmd, sent as @n's connection was made, got no reply. */
static void warn_unanswered(struct rlink *l, const struct rnode *n,
			    const char *cmd, int err, const char *why)
{
	if (err == -ETIMEDOUT)
		remote_warn(l->r,
			    "%s:%d did not answer %s within %u ms (a busy or "
			    "stopped server? the URL's ?timeout_ms= raises "
			    "the limit)",
			    n->host, n->port, cmd, l->r->url.timeout_ms);
	else
		remote_warn(l->r, "lost the connection to %s:%d at %s: %s",
			    n->host, n->port, cmd, why);
}

/*
 * The reader's string constructor: a GET's value goes straight from the
 * reader's buffer to the op's head and dst (its reply an empty string),
 * so that a large value is copied once, not into a reply of its own size
 * first and then again (a fresh allocation per value: at 1 MiB and up,
 * pages the kernel faults in and zeroes, a batch's worth held at once).
 * Everything else is hiredis' own reply.
 */
static void *sink_string(const redisReadTask *t, char *str, size_t len)
{
	struct rnode *n = t->privdata;
	struct rop *op = n->sink;

	if (op && t->type == REDIS_REPLY_STRING && !t->parent && op->dst &&
	    len >= op->head_len && len - op->head_len <= op->dst_cap) {
		memcpy(op->head, str, op->head_len);
		memcpy(op->dst, str + op->head_len, len - op->head_len);
		op->dst_len = len - op->head_len;
		op->sunk = true;
		len = 0;
	}
	return n->plain_string(t, str, len);
}

/* @c's reader: replies through sink_string, its buffer kept. */
static void reader_setup(struct rnode *n, redisContext *c)
{
	n->fns = *c->reader->fn;
	n->plain_string = n->fns.createString;
	n->fns.createString = sink_string;
	n->sink = NULL;
	c->reader->fn = &n->fns;
	c->reader->privdata = n;
	c->reader->maxbuf = READER_KEEP_BYTES;
}

/* The commands a connection starts with (AUTH, SELECT): how many, into
 * @h; @db is SELECT's argument's room. */
struct hello {
	const char *name[2];
	int argc[2];
	const char *argv[2][3];
	size_t lens[2][3];
	char db[16];
};

static int hello_cmds(const struct kvp_remote_url *u, struct hello *h)
{
	int k = 0;

	if (u->password[0]) {
		h->name[k] = "AUTH";
		h->argv[k][0] = "AUTH";
		h->lens[k][0] = 4;
		if (u->user[0]) {
			h->argv[k][1] = u->user;
			h->lens[k][1] = strlen(u->user);
			h->argv[k][2] = u->password;
			h->lens[k][2] = strlen(u->password);
			h->argc[k] = 3;
		} else { /* the default user: AUTH password */
			h->argv[k][1] = u->password;
			h->lens[k][1] = strlen(u->password);
			h->argc[k] = 2;
		}
		k++;
	}
	if (u->db) {
		h->name[k] = "SELECT";
		h->argv[k][0] = "SELECT";
		h->lens[k][0] = 6;
		h->argv[k][1] = h->db;
		h->lens[k][1] = (size_t)snprintf(h->db, sizeof(h->db), "%d",
						 u->db);
		h->argc[k] = 2;
		k++;
	}
	return k;
}

/* The first of them, whose reply a connection waits on first. */
static const char *hello_name(const struct rlink *l)
{
	return l->r->url.password[0] ? "AUTH" : "SELECT";
}

/* Say why @cmd (AUTH or SELECT) of @n's new connection failed: @err
 * -EACCES (refused, the server's error in @why) or as command_ok. */
static void hello_failed(struct rlink *l, const struct rnode *n,
			 const char *cmd, int err, const char *why)
{
	const struct kvp_remote_url *u = &l->r->url;

	if (err != -EACCES)
		warn_unanswered(l, n, cmd, err, why);
	else if (!strcmp(cmd, "AUTH"))
		remote_warn(l->r,
			    "%s:%d refused AUTH%s%s: %s (check the "
			    "URL's user and password, or its "
			    "password_file)",
			    n->host, n->port, u->user[0] ? " as " : "",
			    u->user, why);
	else if (!strncmp(why, "NOPERM", 6)) /* not the db: the user */
		remote_warn(l->r,
			    "%s:%d refused SELECT %d: %s (the URL's ACL "
			    "user needs +select for a /db)",
			    n->host, n->port, u->db, why);
	else
		remote_warn(l->r,
			    "%s:%d refused SELECT %d: %s (the URL's "
			    "/db must be below the server's "
			    "'databases', 16 by default)",
			    n->host, n->port, u->db, why);
}

/* The connection to the first of @addrs (in the resolver's order) that
 * takes one by @end_ns, or NULL with why not in @why.  Each by its number:
 * hiredis, given a name, would look it up again with no deadline. */
static redisContext *dial_addrs(const struct addrinfo *addrs, int port,
				uint64_t end_ns, char *why, size_t len)
{
	redisContext *c = NULL;

	snprintf(why, len, "no address");
	for (const struct addrinfo *a = addrs; a && !c; a = a->ai_next) {
		uint64_t now = remote_now_ns();
		char addr[NI_MAXHOST];
		unsigned left_ms;

		if (now >= end_ns) {
			snprintf(why, len, "%s", strerror(ETIMEDOUT));
			break;
		}
		if (getnameinfo(a->ai_addr, a->ai_addrlen, addr, sizeof(addr),
				NULL, 0, NI_NUMERICHOST))
			continue;
		/* the time left, rounded up: 0 would time out at once */
		left_ms = (unsigned)((end_ns - now + 999999) / 1000000);
		c = redisConnectWithTimeout(addr, port, ms_tv(left_ms));
		if (!c) {
			snprintf(why, len, "out of memory");
		} else if (c->err) {
			snprintf(why, len, "%s", c->errstr);
			redisFree(c);
			c = NULL;
		}
	}
	return c;
}

/* A connection to @n made (reader and timeout set), not yet AUTHed:
 * n->ctx; NULL if it failed, the back-off started.  Looking up its name
 * and connecting share the URL's connect_timeout_ms. */
static redisContext *node_dial(struct rlink *l, struct rnode *n)
{
	const struct kvp_remote_url *u = &l->r->url;
	uint64_t end_ns = remote_now_ns() +
			  (uint64_t)u->connect_timeout_ms * 1000000u;
	struct addrinfo *addrs;
	redisContext *c;
	char why[256];
	int err;

	err = resolve_host(&n->lookup, n->host, n->port, end_ns, &addrs, why,
			   sizeof(why));
	if (err == -ETIMEDOUT) {
		remote_warn(l->r,
			    "cannot resolve %s within %u ms (is the DNS "
			    "server answering? the URL's "
			    "?connect_timeout_ms= raises the limit)",
			    n->host, u->connect_timeout_ms);
		goto fail;
	}
	if (err) {
		remote_warn(l->r, "cannot resolve %s: %s", n->host, why);
		goto fail;
	}
	c = dial_addrs(addrs, n->port, end_ns, why, sizeof(why));
	freeaddrinfo(addrs);
	if (!c) {
		remote_warn(l->r,
			    "cannot connect to %s:%d: %s (is a redis-server "
			    "listening there?)",
			    n->host, n->port, why);
		goto fail;
	}
	n->ctx = c;
	reader_setup(n, c);
	if (redisSetTimeout(c, ms_tv(u->timeout_ms)) != REDIS_OK) {
		remote_warn(l->r, "cannot set the timeout of %s:%d: %s",
			    n->host, n->port, c->errstr);
		goto fail;
	}
	return c;
fail:
	RSTAT_ADD(l->r, connect_errors_total, 1);
	node_fail(l, n);
	return NULL;
}

/* @n's connection made and its AUTH and SELECT answered: counted, the
 * back-off reset. */
static void node_up(struct rlink *l, struct rnode *n)
{
	n->backoff_ms = 0;
	RSTAT_ADD(l->r, connects_total, 1);
}

/* @n's open connection, or NULL with -ENOTCONN (backing off, or the
 * connection, AUTH or SELECT failed: the back-off starts). */
static redisContext *node_conn(struct rlink *l, struct rnode *n)
{
	struct hello h;
	redisContext *c;
	char why[256];
	int k;

	if (n->ctx)
		return n->ctx;
	if (remote_now_ns() < n->retry_at_ns)
		return NULL;
	c = node_dial(l, n);
	if (!c)
		return NULL;
	k = hello_cmds(&l->r->url, &h);
	for (int i = 0; i < k; i++) {
		int err = command_ok(l, c, h.argc[i], h.argv[i], h.lens[i],
				     why, sizeof(why));

		if (err) {
			hello_failed(l, n, h.name[i], err, why);
			RSTAT_ADD(l->r, connect_errors_total, 1);
			node_fail(l, n);
			return NULL;
		}
	}
	node_up(l, n);
	return c;
}

void link_warm(struct rlink *l)
{
	pthread_mutex_lock(&l->lock);
	for (int i = 0; i < l->nnodes; i++)
		node_conn(l, &l->nodes[i]);
	pthread_mutex_unlock(&l->lock);
}

/* The "ip" of a CLUSTER SLOTS node @m's metadata (Redis 7: its 4th
 * element, name and value pairs), or @dflt if none is given. */
static const char *node_ip(const redisReply *m, const char *dflt)
{
	const redisReply *meta = m->elements > 3 ? m->element[3] : NULL;

	if (!meta || meta->type != REDIS_REPLY_ARRAY)
		return dflt;
	for (size_t i = 0; i + 1 < meta->elements; i += 2) {
		const redisReply *k = meta->element[i], *v = meta->element[i + 1];

		if (k->type == REDIS_REPLY_STRING && !strcmp(k->str, "ip") &&
		    v->type == REDIS_REPLY_STRING && v->str[0])
			return v->str;
	}
	return dflt;
}

/* Fill the slot map from the first node that answers CLUSTER SLOTS. */
static int link_refresh(struct rlink *l)
{
	uint64_t now = remote_now_ns();
	int order[LINK_MAX_NODES], nord = 0;

	if (now < l->refresh_at_ns)
		return -EAGAIN;
	/* Even a success waits a little: a storm of MOVED asks once. */
	l->refresh_at_ns = now + (uint64_t)BACKOFF_FIRST_MS * 1000000u;
	/* Nodes whose connection is open first, then the others: one made
	 * anew may be to a stopped master (its last one closed as it timed
	 * out), each such a timeout in turn before a live one is asked. */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < l->nnodes; i++)
			if ((l->nodes[i].ctx != NULL) == (pass == 0))
				order[nord++] = i;
	for (int j = 0; j < nord; j++) {
		struct rnode *n = &l->nodes[order[j]];
		redisContext *c = node_conn(l, n);
		redisReply *rep;

		if (!c)
			continue;
		rep = redisCommand(c, "CLUSTER SLOTS");
		if (!rep) {
			io_cause(l, c); /* a timeout counted */
			node_fail(l, n);
			continue;
		}
		if (rep->type != REDIS_REPLY_ARRAY) {
			freeReplyObject(rep);
			continue;
		}
		memset(l->slot_node, 0, LINK_SLOTS);
		for (size_t e = 0; e < rep->elements; e++) {
			redisReply *ent = rep->element[e], *m;
			const char *host;
			int idx;

			if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 3)
				continue;
			m = ent->element[2];
			if (ent->element[0]->type != REDIS_REPLY_INTEGER ||
			    ent->element[1]->type != REDIS_REPLY_INTEGER ||
			    m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
			    (m->element[0]->type != REDIS_REPLY_STRING &&
			     m->element[0]->type != REDIS_REPLY_NIL) ||
			    m->element[1]->type != REDIS_REPLY_INTEGER)
				continue;
			long long lo = ent->element[0]->integer;
			long long hi = ent->element[1]->integer;

			if (lo < 0 || hi >= LINK_SLOTS || lo > hi)
				continue;
			/* No address (nil: unknown-endpoint; "": a node that
			 * does not know its own; "?": a hostname wanted and
			 * none set) means "the one you asked", unless the
			 * node's ip is given beside it. */
			host = m->element[0]->type == REDIS_REPLY_STRING &&
					       m->element[0]->str[0] &&
					       strcmp(m->element[0]->str, "?")
				       ? m->element[0]->str
				       : node_ip(m, n->host);
			idx = node_add(l, host, (int)m->element[1]->integer);
			if (idx < 0)
				continue;
			memset(l->slot_node + lo, idx + 1, (size_t)(hi - lo + 1));
		}
		freeReplyObject(rep);
		l->slots_stale = false;
		RSTAT_ADD(l->r, slot_refreshes_total, 1);
		return 0;
	}
	return -ENOTCONN;
}

/* A node whose connection is open or may be tried now; -1 if none. */
static int any_node(struct rlink *l)
{
	uint64_t now = remote_now_ns();

	for (int i = 0; i < l->nnodes; i++)
		if (l->nodes[i].ctx || now >= l->nodes[i].retry_at_ns)
			return i;
	return -1;
}

static void latency(struct kvp_remote *r, uint64_t ns)
{
	uint64_t us = ns / 1000;
	int b = 0;

	while (us > 1 && b < KVP_LATENCY_BUCKETS - 1) {
		us >>= 1;
		b++;
	}
	RSTAT_ADD(r, fetch_latency_us[b], 1);
	RSTAT_ADD(r, fetch_latency_sum_ns, ns);
	RSTAT_ADD(r, fetch_round_trips_total, 1);
}

/*
 * A GET is sent as GETRANGE key 0 <its room>: at most one byte more than
 * the op has room for comes back (that byte says "larger"), so a foreign
 * value of hundreds of MiB under our key is never read whole into the
 * reader's buffer and a reply of its own.  A key absent answers "".
 */
static int append(redisContext *c, const struct rop *op)
{
	char end[24];
	const char *argv[4] = { "SET", op->rkey, op->val, end };
	size_t lens[4] = { 3, op->rkey_len, op->val_len, 0 };

	if (op->asking && redisAppendCommand(c, "ASKING") != REDIS_OK)
		return -ENOMEM;
	if (op->kind == ROP_GET) {
		argv[0] = "GETRANGE";
		lens[0] = 8;
		argv[2] = "0";
		lens[2] = 1;
		lens[3] = (size_t)snprintf(end, sizeof(end), "%zu",
					   op->head_len + op->dst_cap);
	}
	if (redisAppendCommandArgv(c, op->kind == ROP_GET ? 4 : 3, argv,
				   lens) != REDIS_OK)
		return -ENOMEM;
	return 0;
}

/* A MOVED or ASK error (a cluster's): link_run follows it. */
static bool is_redirect(const struct rlink *l, const redisReply *rep)
{
	return l->slot_node && rep->type == REDIS_REPLY_ERROR && rep->str &&
	       (!strncmp(rep->str, "MOVED ", 6) || !strncmp(rep->str, "ASK ", 4));
}

/* The bytes of values @op asks for or sends. */
static size_t op_bytes(const struct rop *op)
{
	return op->kind == ROP_GET ? op->head_len + op->dst_cap : op->val_len;
}

/* How many of the @n ops at @g go in one round trip: LINK_PIPELINE at
 * most, and LINK_FLIGHT_BYTES of values (at least one op). */
static size_t round_ops(struct rop **g, size_t n)
{
	size_t k = 0, bytes = 0;

	while (k < n && k < LINK_PIPELINE) {
		bytes += op_bytes(g[k]);
		if (k && bytes > LINK_FLIGHT_BYTES)
			break;
		k++;
	}
	return k;
}

/*
 * Send the first round of the @n ops of @g to node @ni, not waiting for
 * a reply: link_run does so on every node before it reads any, so that
 * nodes that do not answer time out together, not one after another.
 * A connection made here sends its AUTH and SELECT ahead of the ops,
 * their replies read first by node_pipeline (a server that hangs at AUTH
 * waits with the others, too).  The fetch link's only (its commands are
 * small: the writes do not wait on a stopped server).  Failures are left
 * to node_pipeline.
 */
static void node_prime(struct rlink *l, int ni, struct rop **g, size_t n)
{
	struct rnode *nd = &l->nodes[ni];
	bool reused = nd->ctx != NULL;
	redisContext *c = nd->ctx;
	size_t chunk = round_ops(g, n), i;
	struct hello h;
	int done = 0, k = 0;

	nd->primed = 0;
	nd->primed_hello = 0;
	nd->prime_failed = false;
	if (!c) {
		if (remote_now_ns() < nd->retry_at_ns)
			return; /* backing off: node_pipeline says so */
		c = node_dial(l, nd);
		if (!c) {
			nd->prime_failed = true; /* not dialled again */
			return;
		}
		k = hello_cmds(&l->r->url, &h);
	}
	for (int j = 0; j < k; j++)
		if (redisAppendCommandArgv(c, h.argc[j], h.argv[j],
					   h.lens[j]) != REDIS_OK)
			goto drop;
	for (i = 0; i < chunk; i++)
		if (append(c, g[i]))
			goto drop;
	while (!done)
		if (redisBufferWrite(c, &done) != REDIS_OK)
			goto drop;
	nd->primed = chunk;
	nd->primed_hello = k;
	nd->primed_reused = reused;
	nd->answer_by_ns = remote_now_ns() +
			   (uint64_t)l->r->url.timeout_ms * 1000000u;
	return;
drop:
	/* what was appended goes with it: node_pipeline connects anew */
	redisFree(c);
	nd->ctx = NULL;
}

/* The replies to the @k commands (hello_cmds) a connection made by
 * node_prime sent first: 0 when all are a status (the connection is up);
 * else said and counted, the connection closed (what was sent after
 * them never read: a refused SELECT ran the ops in another db). */
static int hello_replies(struct rlink *l, struct rnode *nd, int k)
{
	const struct kvp_remote_url *u = &l->r->url;
	redisContext *c = nd->ctx;
	struct hello h;
	int err = 0;

	hello_cmds(u, &h);
	nd->sink = NULL;
	for (int i = 0; i < k && !err; i++) {
		void *v = NULL;
		redisReply *rep;

		if (redisGetReply(c, &v) != REDIS_OK) {
			err = io_cause(l, c);
			hello_failed(l, nd, h.name[i], err, c->errstr);
			break;
		}
		rep = v;
		if (rep->type != REDIS_REPLY_STATUS) {
			err = -EACCES;
			hello_failed(l, nd, h.name[i], err,
				     rep->type == REDIS_REPLY_ERROR
					     ? rep->str
					     : "not a status reply");
		}
		freeReplyObject(rep);
	}
	if (err) {
		RSTAT_ADD(l->r, connect_errors_total, 1);
		node_fail(l, nd);
		return -ENOTCONN;
	}
	node_up(l, nd);
	return 0;
}

/* Wait until @c has a byte to read or @by_ns: false when it timed out,
 * counted by the deadline waited for (timed_out: a wait begun a
 * timeout_ms before it), so that no other time can hide a wait. */
static bool wait_readable(struct rlink *l, redisContext *c, uint64_t by_ns)
{
	uint64_t now = remote_now_ns();
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	int rc;

	if (c->reader->pos < c->reader->len) /* read already */
		return true;
	do {
		int ms = by_ns > now ? (int)((by_ns - now + 999999) / 1000000)
				     : 0;

		rc = poll(&p, 1, ms);
		now = remote_now_ns();
	} while (rc < 0 && errno == EINTR);
	if (rc == 0)
		timed_out(l, by_ns - (uint64_t)l->r->url.timeout_ms * 1000000u);
	return rc != 0;
}

/* Send the @n ops of @g to node @ni, a round trip at a time (round_ops);
 * each final reply to @take (if any) as it comes. */
static void node_pipeline(struct rlink *l, int ni, struct rop **g, size_t n,
			  link_take_fn take, void *arg)
{
	struct rnode *nd = &l->nodes[ni];
	size_t primed = nd->primed, done = 0, i;
	int hello = nd->primed_hello;
	bool reused = primed ? nd->primed_reused : nd->ctx != NULL;
	bool retried = false;
	redisContext *c = primed ? nd->ctx
		: nd->prime_failed ? NULL : node_conn(l, nd);
	int err = -ENOTCONN;

	nd->primed = 0;
	nd->primed_hello = 0;
	nd->prime_failed = false;
again:
	if (!c)
		goto fail_rest;
	for (; done < n; done += i) {
		/* the first round may be on its way already (node_prime):
		 * those ops, their first reply due by the time set when
		 * they went */
		size_t chunk = primed ? primed : round_ops(g + done, n - done);
		uint64_t t0 = remote_now_ns();

		i = 0;
		if (primed) {
			primed = 0;
			t0 = nd->answer_by_ns -
			     (uint64_t)l->r->url.timeout_ms * 1000000u;
			if (!wait_readable(l, c, nd->answer_by_ns)) {
				err = -ETIMEDOUT;
				if (!hello)
					goto gave_up;
				/* as node_conn's AUTH or SELECT */
				hello_failed(l, nd, hello_name(l), err, "");
				RSTAT_ADD(l->r, connect_errors_total, 1);
				err = -ENOTCONN;
				goto fail_conn;
			}
			if (hello && hello_replies(l, nd, hello)) {
				c = NULL;
				goto fail_rest;
			}
		} else {
			for (; i < chunk; i++) {
				err = append(c, g[done + i]);
				if (err)
					goto fail_conn;
			}
		}
		for (i = 0; i < chunk; i++) {
			struct rop *op = g[done + i];
			void *rep = NULL;

			if (op->asking) {
				if (redisGetReply(c, &rep) != REDIS_OK)
					goto io_error;
				freeReplyObject(rep);
			}
			op->sunk = false;
			nd->sink = op->dst ? op : NULL;
			if (redisGetReply(c, &rep) != REDIS_OK) {
				nd->sink = NULL;
				goto io_error;
			}
			nd->sink = NULL;
			op->reply = rep;
			op->status = 0;
			if (take && !is_redirect(l, rep)) {
				op->taken = true;
				take(arg, op);
			}
		}
		if (l->fetch)
			latency(l->r, remote_now_ns() - t0);
	}
	return;
io_error:
	err = io_cause(l, c); /* timed out, or the connection lost */
	done += i;
	/* A connection kept from an earlier call may have died idle (the
	 * server restarted): one new connection, at once, before giving up.
	 * GET and SET may be sent twice. */
	if (err == -EIO && reused && !retried) {
		retried = true;
		redisFree(nd->ctx);
		nd->ctx = NULL;
		c = node_conn(l, nd);
		goto again;
	}
gave_up:
	if (err == -ETIMEDOUT)
		remote_warn(l->r,
			    "%s:%d did not answer within %u ms (a busy or "
			    "stopped server? the URL's ?timeout_ms= raises "
			    "the limit)",
			    nd->host, nd->port, l->r->url.timeout_ms);
	else
		remote_warn(l->r, "lost the connection to %s:%d: %s",
			    nd->host, nd->port, c->errstr);
fail_conn:
	/* The pipeline's state is lost with the connection: drop it. */
	node_fail(l, nd);
fail_rest:
	for (; done < n; done++)
		if (g[done]->status == 1)
			g[done]->status = err;
}

/* MOVED or ASK in @rep, from node @from: the node it names (added if
 * new) into @idx. */
static bool redirect(struct rlink *l, int from, const redisReply *rep,
		     bool *ask, int *idx)
{
	const char *s = rep->str, *ep, *colon;
	char host[256];
	long port;
	char *end;

	if (!strncmp(s, "MOVED ", 6))
		*ask = false;
	else if (!strncmp(s, "ASK ", 4))
		*ask = true;
	else
		return false;
	ep = strchr(strchr(s, ' ') + 1, ' '); /* "<slot> <host:port>" */
	if (!ep)
		return false;
	ep++;
	colon = strrchr(ep, ':');
	if (!colon || (size_t)(colon - ep) >= sizeof(host))
		return false;
	port = strtol(colon + 1, &end, 10);
	if (*end || port < 1 || port > 65535)
		return false;
	memcpy(host, ep, (size_t)(colon - ep));
	host[colon - ep] = '\0';
	/* "MOVED 3999 :6381": a node that announces no address
	 * (unknown-endpoint; "?:6381" a hostname wanted and none set), on
	 * the host of the one that answered */
	if (!host[0] || !strcmp(host, "?"))
		snprintf(host, sizeof(host), "%s", l->nodes[from].host);
	*idx = node_add(l, host, (int)port);
	return *idx >= 0;
}

void link_run(struct rlink *l, struct rop *ops, size_t n, link_take_fn take,
	      void *arg)
{
	struct rop **group = malloc((n ? n : 1) * sizeof(*group));
	sigset_t pipe_set, old;
	bool pipe_pending, refreshed = false, looped = false;
	size_t i, k;
	int round;

	/* hiredis write()s: a server gone must not SIGPIPE the program. */
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	{
		sigset_t pend;

		sigpending(&pend);
		pipe_pending = sigismember(&pend, SIGPIPE);
	}
	pthread_mutex_lock(&l->lock);
	for (i = 0; i < n; i++) {
		ops[i].status = group ? 1 : -ENOMEM;
		ops[i].target = -1;
		ops[i].asking = false;
		ops[i].reply = NULL;
		ops[i].sunk = false;
		ops[i].taken = false;
		ops[i].slot = l->slot_node ? kvp_remote_key_slot(ops[i].rkey,
								 ops[i].rkey_len)
					   : 0;
	}
	if (!group)
		goto out;
	if (l->slot_node && l->slots_stale)
		refreshed = link_refresh(l) == 0;
	for (round = 0; round < LINK_MAX_ROUNDS; round++) {
		size_t first[LINK_MAX_NODES], count[LINK_MAX_NODES];
		bool pending = false;
		int busy = 0; /* nodes with ops this round */

		for (i = 0; i < n; i++) {
			struct rop *op = &ops[i];

			if (op->status != 1 || op->target >= 0)
				continue;
			if (!l->slot_node) {
				op->target = 0;
				continue;
			}
			op->target = l->slot_node[op->slot] - 1;
			if (op->target < 0 && !refreshed) {
				refreshed = link_refresh(l) == 0;
				op->target = l->slot_node[op->slot] - 1;
			}
			/* Unknown slot: any node answers with MOVED. */
			if (op->target < 0)
				op->target = any_node(l);
			if (op->target < 0)
				op->status = -ENOTCONN;
		}
		/* the ops node by node: group[first[ni], + count[ni]) */
		k = 0;
		for (int ni = 0; ni < l->nnodes; ni++) {
			first[ni] = k;
			for (i = 0; i < n; i++)
				if (ops[i].status == 1 && ops[i].target == ni)
					group[k++] = &ops[i];
			count[ni] = k - first[ni];
			busy += count[ni] > 0;
		}
		for (int ni = 0; busy > 1 && l->fetch && ni < l->nnodes; ni++)
			if (count[ni])
				node_prime(l, ni, group + first[ni], count[ni]);
		for (int ni = 0; ni < l->nnodes; ni++)
			if (count[ni])
				node_pipeline(l, ni, group + first[ni],
					      count[ni], take, arg);
		for (i = 0; i < n; i++) {
			struct rop *op = &ops[i];
			bool ask;
			int idx;

			if (op->status || op->taken ||
			    op->reply->type != REDIS_REPLY_ERROR ||
			    !l->slot_node || !redirect(l, op->target, op->reply, &ask, &idx))
				continue;
			freeReplyObject(op->reply);
			op->reply = NULL;
			op->status = 1;
			op->target = idx;
			op->asking = ask;
			if (ask) {
				RSTAT_ADD(l->r, ask_total, 1);
			} else {
				/* MOVED is for good: the map is out of date. */
				l->slot_node[op->slot] = (uint8_t)(idx + 1);
				l->slots_stale = true;
				RSTAT_ADD(l->r, moved_total, 1);
			}
			pending = true;
		}
		if (!pending)
			break;
	}
	for (i = 0; i < n; i++)
		if (ops[i].status == 1) {
			ops[i].status = -EIO; /* redirected too many times */
			looped = true;
		}
	if (looped)
		remote_warn(l->r,
			    "a key was redirected %d times with no answer: the "
			    "nodes disagree on who serves its slot (a slot "
			    "migration stopped half way? compare CLUSTER NODES "
			    "on each)",
			    LINK_MAX_ROUNDS);
out:
	pthread_mutex_unlock(&l->lock);
	if (!pipe_pending) {
		sigset_t pend;
		struct timespec zero = { 0, 0 };

		sigpending(&pend);
		if (sigismember(&pend, SIGPIPE))
			sigtimedwait(&pipe_set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	free(group);
}
