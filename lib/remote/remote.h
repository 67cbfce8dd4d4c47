/*
 * remote.h - the remote tier: KV blocks shared through Redis or Redis
 * Cluster, reached with hiredis.
 *
 * The remote tier sits below RAM and the local cache directory.  It stores
 * opaque values under keys the caller gives (a block's content key) and
 * knows nothing of their format: every value it returns has passed the
 * caller's verify hook (the cache's block-record check), and one that
 * fails is a miss, counted, never returned.
 *
 *   URL        redis://[user[:pass]@]host:port[/db][?opts]
 *              redis+cluster://[user[:pass]@]host:port[,host:port...][?opts]
 *   opts       timeout_ms=N (a command's limit, default 1000),
 *              connect_timeout_ms=N (default 1000; the host name's
 *              lookup included), password_file=PATH
 *              (the password's first line, for "user:@host" or no
 *              user at all; a password in the URL wins),
 *              queue=N (publish queue entries, default 256),
 *              queue_bytes=N (their bytes at most, default 256M), joined
 *              by &
 *   env        KVP_REMOTE_URL (used by kvp_remote_open_env)
 *
 * A value is stored as parts of at most KVP_REMOTE_PART_BYTES, part i
 * under "kvp:3:<hex ns>:<hex key>:<i>" (i in decimal): @ns is the
 * caller's namespace tag (the cache gives a hash of the model identity
 * and the tenant's salt, never the salt itself), so two tenants' keys
 * never meet.  No hash tag is used: a cluster spreads the parts over its
 * slots.  Each part is a header of KVP_REMOTE_PART_HEADER bytes, then its
 * bytes of the value (part i: bytes [i * PART_BYTES, (i + 1) * PART_BYTES)):
 *
 *   0  u32  magic 0x7050564b ("KVPp")    16  u64  the value's bytes
 *   4  u16  format version, 2            24  u64  FNV-1a 64 of the base
 *   6  u16  header bytes, 40                      key "kvp:3:<ns>:<key>"
 *   8  u32  i, the part's index          32  u64  the publish: random,
 *  12  u32  the value's parts:                    the same in its parts
 *           ceil(bytes / PART_BYTES), 1 if empty
 *
 * (little-endian).  A value comes back only whole: every part there, each
 * header right for its key, index and the value's length, all of one
 * publish, and then the whole accepted by the verify hook; a part missing
 * (evicted, not yet written) or of another publish (two publishes of the
 * key raced) makes the value a miss, a bad part a failed verification,
 * all counted (parts_missing_total, values_mixed_total, parts_bad_total).
 * Why parts: Redis serves a value of 8 MiB or more from fresh pages each
 * time (part.c).  Keys of an older layout (kvp:1:, kvp:2:) are never read.
 *
 * Fetches (kvp_remote_get_many, or kvp_remote_fetch_submit on the tier's
 * fetch thread, behind the caller) are pipelined, batch by batch, on the
 * fetch link; each value goes from the connection's buffer straight to
 * the caller's and is verified as it comes; publishes (kvp_remote_publish) go into a bounded queue that
 * a thread of the tier drains on a link of its own; a full queue skips
 * the publish and counts it, the caller never waits.  A link that fails
 * (refused, reset, past its timeout) is closed and tried again after a
 * back-off (100 ms doubling to 5 s), and until then its calls fail at
 * once with -ENOTCONN: decode never waits on a dead server.  Why keys
 * fail (refused, AUTH or SELECT refused, timeout, an error reply) is said
 * on stderr, each distinct cause once.
 *
 * TLS: Debian's hiredis has no TLS library (hiredis_ssl); the tier speaks
 * plain RESP.  Reach Redis over loopback or a trusted network, or through
 * a TLS tunnel (stunnel, ssh -L) to a local port.
 *
 * The password is never logged: errors name the URL without it
 * (kvp_remote_url_redact).  Calls return 0 or -errno unless said otherwise
 * and may be made from any thread.
 */
#ifndef KVP_REMOTE_H
#define KVP_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pager/stats.h" /* KVP_LATENCY_BUCKETS */

#define KVP_REMOTE_MAX_SEEDS 8	   /* host:port seeds of a cluster URL */
#define KVP_REMOTE_MAX_KEY 64	   /* bytes of a caller's key */
#define KVP_REMOTE_MAX_NS 32	   /* bytes of a namespace tag */
#define KVP_REMOTE_MAX_VALUE (512u << 20) /* a value's bytes at most */
#define KVP_REMOTE_PART_BYTES (1u << 20)  /* a value's bytes in one part */
#define KVP_REMOTE_PART_HEADER 40u	  /* a part's header (see above) */
/* The bytes of values a fetch asks for in one round trip, about: more
 * waiting in Redis' output buffers at once costs it page faults. */
#define KVP_REMOTE_FLIGHT_BYTES (8u << 20)

/* A parsed URL; kvp_remote_url_parse fills it.  Owns no memory. */
struct kvp_remote_url {
	bool cluster;			     /* redis+cluster:// */
	int nseeds;			     /* host:port pairs given */
	char host[KVP_REMOTE_MAX_SEEDS][256]; /* names or addresses */
	int port[KVP_REMOTE_MAX_SEEDS];	     /* 1..65535 */
	int db;				     /* SELECT n, 0..9999 (not a cluster) */
	char user[128];			     /* ACL user, "" for none */
	char password[256];		     /* "" for none; never logged */
	char password_file[4096];	     /* read at open when no password */
	unsigned timeout_ms;		     /* a command's limit */
	unsigned connect_timeout_ms;	     /* a connection's limit */
	unsigned queue;			     /* publish queue entries */
	uint64_t queue_bytes;		     /* ... and their bytes */
};

/*
 * kvp_remote_url_parse - parse @text into @u.  Returns 0, or -EINVAL with
 * what is wrong in @err (@errlen bytes, may be NULL; never the password):
 * an unknown scheme (rediss:// included: no TLS), a missing or bad host or
 * port, a bad db or one with a cluster, an unknown or bad option, an empty
 * password without password_file, a part too long, a bad %XX escape.  @u is
 * zeroed first; on failure it holds nothing useful.
 */
int kvp_remote_url_parse(struct kvp_remote_url *u, const char *text,
			 char *err, size_t errlen);

/*
 * kvp_remote_url_password - where @u names a password_file and gives no
 * password, the file's first line into @u->password (kvp_remote_open
 * does it; a caller that checks the URL before any work may too).  The
 * file must be its owner's alone to read, as ssh asks of its keys.
 * Returns 0, or the error with what is wrong in @err (never the
 * password): -errno (open, read), -EPERM (not a regular file, or others
 * may read it), -EINVAL (empty, or a line too long).
 */
int kvp_remote_url_password(struct kvp_remote_url *u, char *err,
			    size_t errlen);

/*
 * kvp_remote_url_redact - @text with the password (user:PASS@) replaced by
 * "***", into @buf; what error messages and reports show.  Returns @buf.
 */
char *kvp_remote_url_redact(const char *text, char *buf, size_t len);

/*
 * kvp_remote_key_slot - the Redis Cluster hash slot (0..16383) of @key:
 * CRC16 (XMODEM) of the key, or of the text between the first '{' and the
 * next '}' when that is not empty, modulo 16384.
 */
unsigned kvp_remote_key_slot(const void *key, size_t len);

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0), as Redis Cluster uses. */
uint16_t kvp_remote_crc16(const void *buf, size_t len);

/*
 * The tier's statistics, declared once: struct kvp_remote_stats, the
 * view's remote/ files, the kvpager_remote_* Prometheus series and
 * kvpctl's remote/ lines come from it.  X(name, kind, doc) as
 * pager/stats.h (a counter's name ends in _total).  Beside them, the
 * latency histogram counts fetch round trips (one pipelined batch each,
 * the verification of its values included) by the microseconds they
 * took: bucket i holds [2^i, 2^(i+1)), the last also everything longer;
 * fetch_latency_sum_ns sums them.
 */
#define KVP_REMOTE_STATS(X)                                                    \
	X(lookups_total, KVP_COUNTER,                                          \
	  "keys asked for: each a hit, miss, failed verification, oversize "   \
	  "or error")                                                          \
	X(hits_total, KVP_COUNTER, "keys fetched and verified")                \
	X(misses_total, KVP_COUNTER, "keys the server did not have")           \
	X(verify_failed_total, KVP_COUNTER,                                    \
	  "values that failed verification (served as misses)")               \
	X(oversize_total, KVP_COUNTER,                                         \
	  "values larger than the caller's buffer (served as misses)")         \
	X(errors_total, KVP_COUNTER,                                           \
	  "keys not fetched: link down, timeout, error reply")                 \
	X(timeouts_total, KVP_COUNTER, "commands past their timeout")          \
	X(timeout_waits_total, KVP_COUNTER,                                    \
	  "waits that ran out: one for all the servers timed out together")   \
	X(bytes_read_total, KVP_COUNTER, "bytes of verified values fetched")   \
	X(parts_missing_total, KVP_COUNTER,                                    \
	  "parts absent from values whose other parts were there (misses)")    \
	X(parts_bad_total, KVP_COUNTER,                                        \
	  "parts with a header not of their value (failed verification)")      \
	X(values_mixed_total, KVP_COUNTER,                                     \
	  "values whose parts two publishes stored (misses)")                  \
	X(publishes_total, KVP_COUNTER, "values stored by the publisher")      \
	X(publishes_skipped_total, KVP_COUNTER,                                \
	  "publishes dropped: the queue was full")                             \
	X(publish_errors_total, KVP_COUNTER,                                   \
	  "publishes that failed (link down, OOM, error reply)")               \
	X(bytes_written_total, KVP_COUNTER, "bytes of values published")      \
	X(connects_total, KVP_COUNTER, "connections made (first and again)")   \
	X(connect_errors_total, KVP_COUNTER, "connections that failed")        \
	X(moved_total, KVP_COUNTER, "MOVED redirections followed")             \
	X(ask_total, KVP_COUNTER, "ASK redirections followed")                 \
	X(slot_refreshes_total, KVP_COUNTER, "CLUSTER SLOTS maps fetched")     \
	X(fetches_skipped_total, KVP_COUNTER,                                  \
	  "asynchronous fetches refused: too many waiting")                    \
	X(fetch_round_trips_total, KVP_COUNTER,                                \
	  "fetch round trips (pipelined batches) completed")                   \
	X(queue_entries, KVP_GAUGE, "publishes waiting in the queue")        \
	X(queue_bytes, KVP_GAUGE, "bytes of the publishes waiting")

#define KVP_REMOTE_STATS_FIELD(name, kind, doc) uint64_t name;
struct kvp_remote_stats {
	KVP_REMOTE_STATS(KVP_REMOTE_STATS_FIELD)
	uint64_t fetch_latency_us[KVP_LATENCY_BUCKETS]; /* per round trip */
	uint64_t fetch_latency_sum_ns; /* the round trips' times summed */
};
#undef KVP_REMOTE_STATS_FIELD

/* Every figure of KVP_REMOTE_STATS (struct kvp_stat_desc, pager/stats.h:
 * kvp_stat_desc_value reads one), in order, and how many. */
extern const struct kvp_stat_desc kvp_remote_stat_descs[];
extern const size_t kvp_remote_stat_count;

/*
 * The verify hook: 0 when @val (@len bytes, fetched under @key) is a good
 * value for @key, else any negative number.  @val is the caller's buffer,
 * the value already copied there: the hook may change it in place (open a
 * sealed record, kvp_rec_open).  Called on the fetching thread, once per
 * value, before the value is counted a hit.
 */
typedef int (*kvp_remote_verify_fn)(void *arg, const void *key, size_t keylen,
				    void *val, size_t len);

/*
 * The encode hook (optional): the value to store for what was published
 * under @key, into @*out (malloc'd; the tier frees it), or a negative
 * number (the publish fails, counted).  Called on the publisher thread,
 * so that making the value (the cache seals its record) is behind the
 * caller too.  Without it the value is stored as published.
 */
typedef int (*kvp_remote_encode_fn)(void *arg, const void *key, size_t keylen,
				    const void *val, size_t len, void **out,
				    size_t *outlen);

struct kvp_remote_config {
	const char *url;	   /* see above; required */
	const void *ns;		   /* namespace tag, 1..KVP_REMOTE_MAX_NS bytes */
	size_t ns_len;
	kvp_remote_verify_fn verify; /* required: no unverified value passes */
	void *verify_arg;
	kvp_remote_encode_fn encode; /* NULL: store values as published */
	void *encode_arg;
};

struct kvp_remote;

/*
 * kvp_remote_open - a remote tier for @cfg into @*out.  Parses the URL,
 * reads the password file, starts the publisher thread and tries to
 * connect; a server that is absent is not an error (the tier counts it
 * and tries again later, see above).  Returns 0, or -EINVAL (bad URL,
 * namespace or no verify hook), -errno of the password file (it must not
 * be readable by others: -EPERM), -ENOMEM; the reason is in @err (may be
 * NULL).  On failure nothing is left behind.
 */
int kvp_remote_open(const struct kvp_remote_config *cfg,
		    struct kvp_remote **out, char *err, size_t errlen);

/*
 * kvp_remote_open_env - kvp_remote_open with the URL of KVP_REMOTE_URL.
 * Returns -ENOENT (and @*out NULL) when it is unset or empty.
 */
int kvp_remote_open_env(const struct kvp_remote_config *cfg,
			struct kvp_remote **out, char *err, size_t errlen);

/*
 * kvp_remote_close - stop the publisher (publishes still queued are
 * dropped, not counted as skipped) and the fetch thread (a fetch running
 * ends first, within its timeout; those still waiting complete with
 * -ECANCELED), close the links, free @r.  NULL is fine.
 */
void kvp_remote_close(struct kvp_remote *r);

/* One key of a batched fetch. */
struct kvp_remote_get {
	const void *key; /* in: the caller's key, 1..KVP_REMOTE_MAX_KEY bytes */
	size_t key_len;
	void *buf;	 /* in: where the value goes */
	size_t buf_len;	 /* in: room at @buf; it says how many parts are
			    asked for: give the value's size if known */
	size_t len;	 /* out: the value's length (hits) */
	int status;	 /* out: 0 hit; -ENOENT miss; -EBADMSG failed
			    verification; -EMSGSIZE larger than @buf_len;
			    -ENOTCONN, -ETIMEDOUT, -EIO not fetched */
};

/*
 * kvp_remote_get_many - fetch the @n keys of @gets: the parts that fit
 * their buffers, pipelined with at most 128 commands and about
 * KVP_REMOTE_FLIGHT_BYTES of values asked for a round trip (by node in a
 * cluster, following MOVED and ASK), each part straight into its place
 * at buf.  Each entry's status says what became of it; only a 0 status
 * leaves a value at its buf (a failed entry's buf may have been
 * written).  Returns the number of hits (>= 0); -EINVAL for a bad entry,
 * nothing fetched.  Waits at most about the timeout per round trip and
 * node; serialised with other fetches.
 */
int kvp_remote_get_many(struct kvp_remote *r, struct kvp_remote_get *gets,
			size_t n);

/*
 * The completion of an asynchronous fetch: @gets and @n as submitted, each
 * entry's status set as kvp_remote_get_many sets it (-ECANCELED: the tier
 * closed first), @hits the number of hits.  Called once, on the tier's
 * fetch thread (or in kvp_remote_close), with no lock of the tier held.
 */
typedef void (*kvp_remote_done_fn)(void *arg, struct kvp_remote_get *gets,
				   size_t n, int hits);

/*
 * kvp_remote_fetch_submit - kvp_remote_get_many of @gets on the tier's
 * fetch thread, behind the caller: @done(@arg, ...) is called when it is
 * over.  @gets, their keys and buffers stay the caller's and must live
 * until then.  Returns 0 (queued: @done will be called), -EINVAL (a bad
 * entry; @done is not called), -EAGAIN (KVP_REMOTE_MAX_FETCHES already
 * wait: counted in fetches_skipped_total, @done is not called).
 */
#define KVP_REMOTE_MAX_FETCHES 64
int kvp_remote_fetch_submit(struct kvp_remote *r, struct kvp_remote_get *gets,
			    size_t n, kvp_remote_done_fn done, void *arg);

/*
 * kvp_remote_publish - queue @val (@len bytes) to be stored under @key
 * (through the encode hook, if any).  Copies both; never waits on the
 * network.  Returns 0 when queued,
 * -EAGAIN when the queue is full (counted in publishes_skipped_total),
 * -EMSGSIZE when @len is more than the URL's queue_bytes, so that it is
 * never queued (counted likewise, and said once on stderr), -EINVAL for
 * a bad key or size, -ENOMEM.
 */
int kvp_remote_publish(struct kvp_remote *r, const void *key, size_t keylen,
		       const void *val, size_t len);

/*
 * kvp_remote_flush - wait until the queue is empty and the publisher idle,
 * or @timeout_ms passed.  Returns 0, or -ETIMEDOUT.  For tests and orderly
 * shutdown; decode never calls it.
 */
int kvp_remote_flush(struct kvp_remote *r, unsigned timeout_ms);

/* kvp_remote_stats_read - a snapshot of @r's statistics into @st. */
void kvp_remote_stats_read(struct kvp_remote *r, struct kvp_remote_stats *st);

/* The Redis key of part @part of (@ns, @key) into @buf; its length, or
 * -ENAMETOOLONG. */
int kvp_remote_redis_key(const void *ns, size_t ns_len, const void *key,
			 size_t keylen, uint32_t part, char *buf, size_t len);

/*
 * kvp_remote_part_value - part @part of the value @val (@len bytes) of
 * (@ns, @key) as the publish @publish stores it (header and bytes, see
 * above; give each part of one value the same @publish), into @out
 * (@outlen bytes): for tests and tools that write the tier's values
 * themselves.  Returns its length, or -EINVAL (no such part, @len past
 * KVP_REMOTE_MAX_VALUE), -ENOSPC (@outlen too small), -ENAMETOOLONG.
 */
int kvp_remote_part_value(const void *ns, size_t ns_len, const void *key,
			  size_t keylen, const void *val, size_t len,
			  uint64_t publish, uint32_t part, void *out,
			  size_t outlen);

#endif /* KVP_REMOTE_H */
