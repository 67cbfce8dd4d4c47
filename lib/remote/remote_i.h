/*
 * remote_i.h - inside the remote tier: links, the publish queue, the
 * handle.
 *
 * Files, bottom first, each calling only those before it: url.c (pure),
 * key.c (Redis keys, hash slots), part.c (a value's parts and their
 * headers), resolve.c (host names, within a deadline), link.c
 * (connections, back-off, cluster routing, pipelines), publish.c (the
 * queue and its thread), fetch.c (fetch and verify; asynchronous fetches
 * on a thread), remote.c (the API: open, close, statistics).
 *
 * Lock rule: a link's lock is held for a whole link_run (one caller's
 * pipelines at a time on a link); the queue lock and the fetch lock only
 * to push or pop.  The caller's verify hook runs under the fetch link's
 * lock (as each value comes, while it is in the cache): it must not call
 * the tier; no other callback runs under any of them.  The warn lock is
 * taken under any of them, to print, and nothing under it.
 * Statistics are atomic counters, taken under neither.
 */
#ifndef KVP_REMOTE_I_H
#define KVP_REMOTE_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "lib/remote/remote.h"

#define LINK_MAX_NODES 64    /* nodes a cluster link knows */
#define LINK_SLOTS 16384     /* Redis Cluster's hash slots */
#define LINK_PIPELINE 128    /* commands per round trip */
/* ... and the bytes of the values they ask for or send: a GET's reply
 * waits in the server's output buffers, and past some 16 MiB of them its
 * allocator faults every page in afresh (part.c). */
#define LINK_FLIGHT_BYTES KVP_REMOTE_FLIGHT_BYTES
#define LINK_MAX_ROUNDS 5    /* redirections followed per command */
#define BACKOFF_FIRST_MS 100 /* a failed link's first wait */
#define BACKOFF_MAX_MS 5000  /* ... doubling up to this */
#define WARN_MAX 8	     /* causes remote_warn says, at most */
#define WARN_LEN 384	     /* ... of this many bytes each */
/* A connection's reader keeps a buffer with up to this much room when it
 * runs empty (hiredis frees one past 16K): large values do not grow a
 * fresh buffer, through every doubling, at each batch. */
#define READER_KEEP_BYTES (8u << 20)

struct rop;
struct lookup;
struct addrinfo;

/* One server a link speaks to. */
struct rnode {
	char host[256];		/* as the URL or CLUSTER SLOTS names it */
	int port;		/* its port */
	redisContext *ctx;	/* NULL while not connected */
	uint64_t retry_at_ns;	/* no connection tried before this */
	struct lookup *lookup;	/* its name's, still running (resolve.c) */
	unsigned backoff_ms;	/* the next failure's wait; 0 after success */
	/* ctx's reader builds replies with fns: hiredis' own, but for a
	 * string that the op being read wants at its dst (link.c) */
	redisReplyObjectFunctions fns;
	void *(*plain_string)(const redisReadTask *t, char *str, size_t len);
	struct rop *sink;	/* the op whose reply is read now, or NULL */
	/* node_prime sent the first round of this link_run already: its
	 * ops, whether the connection was there before, and by when its
	 * first reply must begin (the others' timeouts run meanwhile) */
	size_t primed;
	bool primed_reused;
	uint64_t answer_by_ns;
	/* ... on a connection it made: the AUTH and SELECT sent ahead of
	 * the ops, their replies read first (0 to 2); or it could not
	 * connect (node_pipeline does not try again in the same round) */
	int primed_hello;
	bool prime_failed;
};

/* A connection set with its routing: the fetch link or the publish link. */
struct rlink {
	struct kvp_remote *r;	/* its tier: the URL, the statistics */
	bool fetch;		/* true: count latency (the fetch link) */
	pthread_mutex_t lock;	/* held for a whole link_run */
	int nnodes;		/* used entries of @nodes */
	struct rnode nodes[LINK_MAX_NODES]; /* seeds first, then learnt */
	uint8_t *slot_node;	/* LINK_SLOTS entries: node index + 1, 0 none */
	bool slots_stale;	/* fetch CLUSTER SLOTS before the next run */
	uint64_t refresh_at_ns; /* no refresh before this (back-off) */
	uint64_t wait_ran_out_ns; /* when the last wait counted ran out */
};

enum rop_kind { ROP_GET, ROP_SET };

/* One command of a link_run. */
struct rop {
	enum rop_kind kind;	/* GET key or SET key value */
	const char *rkey;	/* the Redis key */
	size_t rkey_len;
	const void *val;	/* SET's value */
	size_t val_len;
	unsigned slot;		/* the key's hash slot */
	int target;		/* node index for the next round, -1 by slot */
	bool asking;		/* send ASKING first (an ASK redirection) */
	int status;		/* 0 replied; -errno not; 1 still to send */
	redisReply *reply;	/* with status 0: the reply, the caller frees */
	void *head;		/* GET: a string's first head_len bytes go
				   here (a part's header), the rest ... */
	size_t head_len;
	void *dst;		/* ... here, when at most dst_cap bytes,
				   straight from the reader's buffer; NULL:
				   the string stays in the reply */
	size_t dst_cap;
	size_t dst_len;		/* with sunk: the bytes at dst */
	bool sunk;		/* the reply is an empty string, the value
				   went to dst */
	bool taken;		/* the take hook had the final reply */
};

/* A link_run's hook: called as op's final reply comes (status 0, not a
 * redirection), under the link's lock; it may free op->reply (and set it
 * NULL).  What the fetch link verifies values with, while they are hot. */
typedef void (*link_take_fn)(void *arg, struct rop *op);

struct kvp_remote {
	struct kvp_remote_url url;	/* parsed, password included */
	char shown_url[512];		/* the URL without its password */
	char ns_hex[2 * KVP_REMOTE_MAX_NS + 1]; /* the namespace tag in hex */
	kvp_remote_verify_fn verify;	/* the caller's hooks */
	void *verify_arg;
	kvp_remote_encode_fn encode;
	void *encode_arg;
	struct kvp_remote_stats st;	/* atomic counters */
	pthread_mutex_t wlock;		/* the causes below */
	char warned[WARN_MAX][WARN_LEN]; /* said on stderr already */
	unsigned nwarned;
	struct rlink fetch;		/* kvp_remote_get_many's */
	struct rlink pub;		/* the publisher thread's */

	pthread_mutex_t qlock;		/* the queue below */
	pthread_cond_t qcond;		/* signalled on push, pop and stop */
	struct pub_entry *qhead, *qtail; /* FIFO of waiting publishes */
	unsigned qlen;			/* entries in it */
	bool busy;			/* the publisher holds popped entries */
	bool stop;			/* close asked the thread to end */
	pthread_t thread;		/* the publisher */
	bool thread_started;

	pthread_mutex_t flock;		/* the fetch jobs below */
	pthread_cond_t fcond;		/* signalled on submit and stop */
	struct fetch_job *fhead, *ftail; /* FIFO of waiting fetches */
	unsigned fjobs;			/* jobs in it */
	bool fstop;			/* close asked the thread to end */
	pthread_t fthread;		/* the fetch thread */
	bool fthread_started;
};

/* An asynchronous fetch (kvp_remote_fetch_submit). */
struct fetch_job {
	struct fetch_job *next;
	struct kvp_remote_get *gets;	/* the caller's */
	size_t n;
	kvp_remote_done_fn done;
	void *arg;
};

/* A queued publish: keys and value in one allocation. */
struct pub_entry {
	struct pub_entry *next;
	size_t rkey_len, key_len, val_len;
	char *key;		/* the caller's key, after the Redis key */
	char *val;		/* after the key */
	char rkey[];		/* the Redis key */
};

#define RSTAT_ADD(r, name, n) \
	__atomic_add_fetch(&(r)->st.name, (n), __ATOMIC_RELAXED)
#define RSTAT_SUB(r, name, n) \
	__atomic_sub_fetch(&(r)->st.name, (n), __ATOMIC_RELAXED)

#define REMOTE_KEY_PREFIX "kvp:3:"
#define PART_SUFFIX_MAX 12 /* ":<part>", its NUL included */
/* Bytes of the longest Redis key, its NUL included. */
#define REMOTE_RKEY_MAX (sizeof(REMOTE_KEY_PREFIX) + 2 * KVP_REMOTE_MAX_NS + \
			 1 + 2 * KVP_REMOTE_MAX_KEY + PART_SUFFIX_MAX)
#define PART_MAGIC 0x7050564bu /* "KVPp", little-endian */
#define PART_VERSION 2

/* key.c */
void remote_hex(const void *buf, size_t len, char *out);
/* The base key "kvp:3:<ns hex>:<key hex>" into @buf (@len bytes): its
 * length, or -ENAMETOOLONG. */
int remote_base_key(const void *ns, size_t ns_len, const void *key,
		    size_t keylen, char *buf, size_t len);
/* @r's base key of @key into @buf (REMOTE_RKEY_MAX): its length, or
 * -EINVAL (no key, or longer than KVP_REMOTE_MAX_KEY). */
int remote_rkey(const struct kvp_remote *r, const void *key, size_t keylen,
		char *buf);
/* Part @part's key: ":<part>" after the base key of @base_len bytes at
 * @rkey (room for PART_SUFFIX_MAX more); its length. */
int remote_part_key(char *rkey, size_t base_len, uint32_t part);

/* part.c */
/* The tag of the value under the base key @rkey (@len bytes) that every
 * part's header carries: FNV-1a 64, which part belongs to which value (not
 * a MAC: the caller's verify hook checks the whole). */
uint64_t part_tag(const char *rkey, size_t len);
/* The parts of a value of @total bytes (1 for an empty one). */
uint32_t part_count(uint64_t total);
/* The bytes of part @i of a value of @total bytes (0 past its end). */
size_t part_len(uint64_t total, uint32_t i);
/* Part @i's header (KVP_REMOTE_PART_HEADER bytes) into @out: of a value
 * of @total bytes, tagged @tag, stored by the publish @publish. */
void part_header(void *out, uint32_t i, uint64_t total, uint64_t tag,
		 uint64_t publish);
/* 0, the value's bytes into @total and its publish into @publish, when
 * @hdr is a good header of part @i of the value tagged @tag; -EBADMSG
 * when not. */
int part_check(const void *hdr, uint32_t i, uint64_t tag, uint64_t *total,
	       uint64_t *publish);

/* resolve.c */
/*
 * resolve_host - the addresses of @host (@port) into @*addrs (freeaddrinfo
 * them), waiting until @deadline_ns (CLOCK_MONOTONIC) at most (a numeric
 * address at once, on no thread of its own).  @*pending is the node's
 * lookup left running by an earlier call, or NULL.  Returns 0;
 * -ETIMEDOUT, the lookup left running in @*pending; -EHOSTUNREACH (no
 * such name, the resolver failed) or -ENOMEM, -EAGAIN; why in @why (@len
 * bytes, with the remedy when there is a plain one) when not 0.
 */
int resolve_host(struct lookup **pending, const char *host, int port,
		 uint64_t deadline_ns, struct addrinfo **addrs, char *why,
		 size_t len);
/* Leave @*pending's lookup (if any) to end on its own; NULL it. */
void resolve_leave(struct lookup **pending);

/* link.c */
uint64_t remote_now_ns(void);
/* Why @r's keys fail, on stderr: each distinct message once (a dead
 * server fails key after key, and is tried again every few seconds), the
 * first WARN_MAX of them; the counters count every failure. */
void remote_warn(struct kvp_remote *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Likewise a cause that is not the server's (the caller's, the URL's). */
void remote_note(struct kvp_remote *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* remote_warn of a reply to @cmd that is not what it asks for (an error:
 * NOAUTH, OOM, LOADING...), with the remedy when there is a plain one. */
void remote_warn_reply(struct kvp_remote *r, const char *cmd,
		       const redisReply *rep);

int link_init(struct rlink *l, struct kvp_remote *r, bool fetch);
void link_destroy(struct rlink *l);
/* Connect the seeds now (a first try; failures only start the back-off). */
void link_warm(struct rlink *l);
/*
 * link_run - send the @n ops, pipelined by node, following MOVED and ASK
 * (a cluster), and set each op's status: 0 with its reply (a non-redirect
 * error reply included), or -ENOTCONN (link down or backing off),
 * -ETIMEDOUT, -EIO (connection lost, too many redirections).  @take (may
 * be NULL) sees each final reply as it comes, and marks the op taken.
 * Takes the link's lock.
 */
void link_run(struct rlink *l, struct rop *ops, size_t n, link_take_fn take,
	      void *arg);

/* fetch.c */
int fetch_many(struct kvp_remote *r, struct kvp_remote_get *gets, size_t n);
int fetch_submit(struct kvp_remote *r, struct kvp_remote_get *gets, size_t n,
		 kvp_remote_done_fn done, void *arg);
int fetch_start(struct kvp_remote *r);
void fetch_stop(struct kvp_remote *r);

/* publish.c */
int publish_start(struct kvp_remote *r);
void publish_stop(struct kvp_remote *r);
int publish_push(struct kvp_remote *r, const char *rkey, size_t rkey_len,
		 const void *key, size_t key_len, const void *val, size_t len);
int publish_flush(struct kvp_remote *r, unsigned timeout_ms);

#endif /* KVP_REMOTE_I_H */
