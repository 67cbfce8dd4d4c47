/*
 * cache_dir.h - a prefix cache directory: block records (block_record.h)
 * on a local disk, found again at open, crash safe, within a capacity.
 *
 * THE DIRECTORY (0700; files 0600), locked (flock) by the one process
 * that has it open:
 *
 *   kvpcache.lock       locked by a writer before the manifest is read or
 *                       made; never renamed nor removed, and opened for
 *                       writing (NFS takes an exclusive lock only so);
 *                       a cache made before it, on a full disk, goes on
 *                       without (only a creator needs it)
 *   kvpcache            "kvpager-cache 1\n": the format version; locked
 *                       too (what an older kvpager and a reader lock)
 *   <64 hex>.kvb        one block: its record (block_record.h), padded
 *                       with zeros to 4 KiB, written with O_DIRECT where
 *                       the filesystem takes it
 *   tmp.<...>           a block being written (removed at open: a crash's)
 *
 * THE INDEX IS THE DIRECTORY.  Open scans it (a readdir and one header
 * read per block) instead of keeping a journal: a block file is written
 * under a temporary name, made durable, then renamed to its key's name,
 * so a name exists only for a whole, synced record, and there is no
 * second structure that a crash could leave out of step with the data.
 * The cost is the scan at open (about 4 KiB read per block).
 *
 * THE ORDER OF A PUT (what makes it crash safe; SQLite's rule, data before
 * the entry that names it):
 *
 *   1. write the record to tmp.<key>.<pid> (O_CREAT | O_EXCL, 0600)
 *   2. fsync the file             the data is on the disk
 *   3. rename it to <key>.kvb     the entry that names it
 *   4. fsync the directory        the name is on the disk: COMMITTED
 *
 * A crash before 4 leaves at most a tmp file (removed at open) or a name
 * whose data is whole (2 came first).  If the disk lost writes anyway (a
 * device that lies about flushes), the record's checksum catches it: a
 * torn or partial block fails kvp_rec_open and is dropped, counted, and
 * never served.  Every get verifies the whole record; open verifies
 * headers (and whole records with opts.verify_at_open).
 *
 * STATES OF A BLOCK (in the index of an open cache):
 *
 *   absent --put [kvp_cache_put: steps 1-4]--> committed
 *   committed --get verifies [kvp_cache_get]--> committed (used)
 *   committed --get fails to verify [kvp_cache_get]--> dropped (torn:
 *             file removed; unauthenticated or other key: left, unindexed)
 *   committed --capacity, least recently used [evict_lru]--> absent
 *   committed --disk full, least recently used [make_room]--> absent
 *   committed --get finds its file gone (removed by hand)--> absent
 *
 * CAPACITY AND EVICTION: the files' bytes stay within capacity_bytes; a
 * put that would pass it first removes the least recently used blocks.
 * Within a lookup (kvp_cache_new_lookup: a prompt's) the blocks used
 * first count as the newest, so a prefix's last blocks go before its
 * first: a block is found only through every block before it, and a
 * first block evicted would leave its children dead weight.  Recency
 * survives a restart: every put and hit sets its file's modification
 * time to its recency (wall-clock nanoseconds; a metadata write, the
 * data is never written again), and open starts from those times (to
 * the filesystem's timestamp granularity).  A full disk (ENOSPC, or the
 * quota) is a capacity reached: the put's write is tried again after
 * the least recently used blocks make room, a few times (FULL_TRIES),
 * counted (disk_full) and said once on stderr.
 *
 * Locking: one mutex per cache; every call may come from any thread.
 */
#ifndef KVP_CACHE_DIR_H
#define KVP_CACHE_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/cache/block_record.h"
#include "pager/stats.h"

#define KVP_CACHE_FORMAT 1u

/*
 * The file operations of a cache, so that a test can stand between the
 * cache and the disk (a store that forgets what was not synced).  Each
 * returns as its system call does, but -errno instead of -1 and errno.
 * NULL in the options: the system's.
 */
struct kvp_cache_io_ops {
	/* openat(dirfd, name, flags | O_DIRECT where accepted, mode) */
	int (*open)(void *arg, int dirfd, const char *name, int flags,
		    mode_t mode);
	ssize_t (*pwrite)(void *arg, int fd, const void *buf, size_t len,
			  off_t off);
	int (*fsync)(void *arg, int fd); /* a file or the directory */
	int (*close)(void *arg, int fd);
	int (*rename)(void *arg, int dirfd, const char *from, const char *to);
	int (*unlink)(void *arg, int dirfd, const char *name);
};

struct kvp_cache_opts {
	uint64_t capacity_bytes;	     /* 0: no limit */
	const struct kvp_rec_cipher *cipher; /* NULL: plain records */
	bool read_only;			     /* never write (a put: -EROFS) */
	bool verify_at_open;		     /* read and verify every block */
	const struct kvp_cache_io_ops *io;   /* NULL: the system's */
	void *io_arg;
};

/*
 * KVP_CACHE_STATS - every figure of a cache, declared once: struct
 * kvp_cache_stats, the view's cache/ files, the Prometheus series and
 * kvpctl come from it.  X(field, kind, doc); a counter (only grows, since
 * open) is shown as <field>_total, a gauge as <field>.
 */
#define KVP_CACHE_STATS(X)                                                     \
	X(blocks, KVP_GAUGE, "blocks in the cache now")                        \
	X(bytes, KVP_GAUGE, "their files' bytes")                              \
	X(capacity_bytes, KVP_GAUGE, "the size limit (0: none)")               \
	X(read_only, KVP_GAUGE, "1: puts are refused (a read-only directory)") \
	X(hits, KVP_COUNTER, "gets served")                                    \
	X(misses, KVP_COUNTER, "gets not served (absent or dropped)")          \
	X(bytes_read, KVP_COUNTER, "file bytes read by gets and scans")        \
	X(bytes_written, KVP_COUNTER, "file bytes written (padding too)")      \
	X(payload_written, KVP_COUNTER, "payload (KV) bytes of those writes")  \
	X(puts, KVP_COUNTER, "blocks written and committed")                   \
	X(puts_present, KVP_COUNTER,                                           \
	  "puts of a block already stored: not written again")                 \
	X(put_errors, KVP_COUNTER,                                             \
	  "puts that failed (full disk, EIO, read only): nothing committed")   \
	X(disk_full, KVP_COUNTER,                                              \
	  "puts that found the disk full: blocks evicted to make room")       \
	X(dropped_torn, KVP_COUNTER, "torn, partial or corrupt records")       \
	X(dropped_unauth, KVP_COUNTER,                                         \
	  "records failing authentication, sealed without a key, or plain "    \
	  "where sealed ones are expected")                                    \
	X(dropped_foreign, KVP_COUNTER,                                        \
	  "records of another format version or key")                         \
	X(tmp_removed, KVP_COUNTER, "unfinished writes removed at open")       \
	X(evictions, KVP_COUNTER,                                              \
	  "blocks removed for capacity, or not stored as the least recent")   \
	X(evicted_bytes, KVP_COUNTER, "their files' bytes")

#define KVP_CACHE_STATS_FIELD(name, kind, doc) uint64_t name;
struct kvp_cache_stats {
	KVP_CACHE_STATS(KVP_CACHE_STATS_FIELD)
};
#undef KVP_CACHE_STATS_FIELD

/* Every figure of KVP_CACHE_STATS: its file name (with _total for a
 * counter), kind, doc and offset in struct kvp_cache_stats. */
extern const struct kvp_stat_desc kvp_cache_stat_descs[];
extern const size_t kvp_cache_stat_count;

static inline uint64_t kvp_cache_stat_value(const struct kvp_cache_stats *s,
					    size_t i)
{
	return *(const uint64_t *)((const char *)s +
				   kvp_cache_stat_descs[i].offset);
}

struct kvp_cache;

/*
 * kvp_cache_open - open (creating it if absent, or empty) the cache
 * directory path, lock it, remove unfinished writes, and index its blocks.
 * A directory that is not writable (a read-only mount) is opened read
 * only with a warning in warn.  Returns 0 and *out, or:
 *   -EPROTONOSUPPORT  the directory has another format version
 *   -ENOTEMPTY        a directory with files but no kvpcache file: not a
 *                     cache (nothing in it is touched)
 *   -EBUSY            another process has it open (err names it)
 *   -EPERM            another user's directory (root's is fine), or one
 *                     that group or others may write: a block planted
 *                     there would be served as this user's (nothing in
 *                     it is touched; a symlink's target is checked)
 *   -ENOTDIR, -EACCES, -EROFS (a new cache on a read-only mount),
 *   -ENOMEM, or another open/read error.
 * err (may be NULL) gets a one-line message with the remedy on failure;
 * warn (may be NULL) a one-line warning on success, or "".  Nothing is
 * left behind on failure but a directory it created and, where the cache
 * could not be created in it (a full disk), kvpcache.lock: never removed,
 * and an empty directory still to the next open.  A directory refused
 * for its kvpcache (not a manifest, another format version) gets none.
 */
int kvp_cache_open(const char *path, const struct kvp_cache_opts *opts,
		   struct kvp_cache **out, char *err, size_t errlen,
		   char *warn, size_t warnlen);

/*
 * kvp_cache_keyctx - the key context of this cache's blocks from ctx:
 * with a cipher key, bound to it (kvp_rec_keyctx_cipher), so that no
 * other key's blocks nor plain ones share a name with them; plain, ctx
 * as it is.  0 or -ENOSYS.
 */
int kvp_cache_keyctx(struct kvp_cache *c, struct kvp_rec_keyctx *ctx);

/* Unlock and free.  Committed blocks stay.  NULL is a no-op. */
void kvp_cache_close(struct kvp_cache *c);

/* True when key is in the index (no I/O: a get may still fail). */
bool kvp_cache_contains(struct kvp_cache *c, const struct kvp_rec_key *key);

/*
 * kvp_cache_put - store payload (len bytes) under key, in the order above;
 * on 0 the block is committed (survives a crash), or, older than every
 * block of a full cache (or disk), evicted at once (evictions).  A key
 * already present is not written again (puts_present), but used: its
 * recency is the put's where that is newer; a file of key's name that the
 * index lacks (a record dropped and kept) is replaced, so where caches
 * of other cipher keys share the directory, keys must bind this one's
 * (kvp_cache_keyctx: the prefix does).  Returns 0, or with nothing
 * committed and the index unchanged (but for blocks evicted to make
 * room): -EROFS (read only), -EFBIG (a record larger than the capacity),
 * -ENOSPC or -EDQUOT (the disk full still after room was made, or no
 * block to evict), -EIO, -ENOMEM, -EINVAL (len over the limit).
 */
int kvp_cache_put(struct kvp_cache *c, const struct kvp_rec_key *key,
		  const void *payload, uint64_t len);

/*
 * kvp_cache_put_fd - kvp_cache_put of a record already made and verified
 * by the caller (a value of the remote tier, opened by kvp_rec_open
 * against key): fd holds it at offset 0, kvp_rec_size(len) bytes.  It is
 * stored as it is, neither sealed nor checksummed again; its header must
 * name key and len, sealed exactly when this cache seals (else -EINVAL,
 * nothing written).  Otherwise as kvp_cache_put, with pread's errors.
 */
int kvp_cache_put_fd(struct kvp_cache *c, const struct kvp_rec_key *key,
		     int fd, uint64_t len);

/*
 * kvp_cache_use_now - the recency of a use now, as a get, open_block or
 * put would take it (in a lookup, the next in its order), for a put made
 * later with it: kvp_cache_put_at and kvp_cache_put_fd_at are
 * kvp_cache_put and kvp_cache_put_fd with that recency (0: a use now,
 * as theirs).  A writer thread that stores a prompt's blocks behind it
 * (prefix.h), after the next prompt's lookup began, so keeps them in
 * their own prompt's order, older than the next prompt's blocks; stored
 * with a recency of their own store, they would be newer than their own
 * prompt's first blocks and outlive them, dead weight.  It never waits
 * for the cache's I/O (a put's syncs, a get's reads), nor does
 * kvp_cache_new_lookup: the recency has a lock of its own.
 */
uint64_t kvp_cache_use_now(struct kvp_cache *c);
int kvp_cache_put_at(struct kvp_cache *c, const struct kvp_rec_key *key,
		     const void *payload, uint64_t len, uint64_t use);
int kvp_cache_put_fd_at(struct kvp_cache *c, const struct kvp_rec_key *key,
			int fd, uint64_t len, uint64_t use);

/*
 * kvp_cache_get - read and verify the block of key into buf (cap bytes),
 * its length in *len.  Returns 0; -ENOENT (a miss; an indexed block
 * whose file is gone, removed by hand, is forgotten); -EMSGSIZE (cap too
 * small: *len says how much is needed; no miss counted); -EBADMSG (the
 * record failed verification: it is dropped as its state says, counted,
 * and a miss); a read error (a miss).  buf is unspecified after a failure.
 */
int kvp_cache_get(struct kvp_cache *c, const struct kvp_rec_key *key,
		  void *buf, size_t cap, uint64_t *len);

/*
 * kvp_cache_open_block - a descriptor of key's block file, for a reader
 * that reads its payload in place (cache_store.h) instead of copying it
 * out: the header is read and checked (kvp_rec_peek, the key, a file as
 * long as its header says) but not the payload, which the reader must
 * verify with kvp_rec_open before it uses any of it, and report with
 * kvp_cache_reject when it fails.  Counted as a hit (a use, for
 * recency).  Returns 0, *fd (O_RDONLY, buffered; the caller closes it;
 * the payload starts at byte KVP_REC_HEADER_BYTES) and *len (the
 * payload's bytes); or -ENOENT (a miss), -EOPNOTSUPP (the cache
 * encrypts: a sealed payload is decrypted whole, so read it with
 * kvp_cache_get; not a miss), -EBADMSG (the header failed: dropped as a
 * get drops it, a miss), or open's error (a miss).
 */
int kvp_cache_open_block(struct kvp_cache *c, const struct kvp_rec_key *key,
			 int *fd, uint64_t *len);

/*
 * kvp_cache_reject - a reader found key's record failing kvp_rec_open
 * with err (kvp_cache_open_block's reader, fd the descriptor it read):
 * count it and drop it as a get that failed would (dropped_torn ...; a
 * torn file removed).  Only counted when key is no longer indexed, or
 * its name is another file's now than fd's (the block was evicted while
 * read, and stored again: the new one is whole).  fd -1: the indexed
 * file is the one that failed.
 */
void kvp_cache_reject(struct kvp_cache *c, const struct kvp_rec_key *key,
		      int fd, int err);

/*
 * kvp_cache_new_lookup - a prompt's lookup begins (kvp_prefix_set_prompt
 * calls it): the blocks used from now until the next call, by get,
 * open_block or put (or kvp_cache_use_now, for a put made later), are
 * newer in recency than every block used before,
 * and each older than those used earlier in the lookup.  A prompt uses
 * its blocks from the first on, so its first block is its newest, and
 * eviction takes its last blocks first: a block is found only through
 * every block before it, and a prompt whose first block went would keep
 * the rest as dead weight.  Without a call, each use is the newest.
 */
void kvp_cache_new_lookup(struct kvp_cache *c);

/* Remove the block of key (its file and entry).  0 or -ENOENT, -EROFS. */
int kvp_cache_remove(struct kvp_cache *c, const struct kvp_rec_key *key);

void kvp_cache_stats(struct kvp_cache *c, struct kvp_cache_stats *out);

/*
 * kvp_cache_cipher_parse - a cipher key from text: 64 hex digits, or from
 * 32 raw bytes (a key file), with trailing white space ignored.  Returns
 * 0 or -EINVAL (err says what was wrong, never the key).
 */
int kvp_cache_cipher_parse(const void *text, size_t len,
			   struct kvp_rec_cipher *out, char *err,
			   size_t errlen);

/*
 * kvp_cache_cipher_load - the key from file path (kvp_cache_cipher_parse
 * of its bytes).  A key file that its group or others may read is
 * refused (-EACCES: chmod 600 it), as ssh refuses such keys.  Returns 0,
 * -errno (open, read), -EACCES, -EINVAL.
 */
int kvp_cache_cipher_load(const char *path, struct kvp_rec_cipher *out,
			  char *err, size_t errlen);

#endif /* KVP_CACHE_DIR_H */
