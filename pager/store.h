/*
 * store.h - where a block lives when it is not resident.
 *
 * A store is a byte-addressed backing (a file on NVMe, memory, later remote
 * tiers) with synchronous pread/pwrite and an asynchronous queue interface
 * for batched I/O.  Each thread that issues asynchronous I/O owns one queue
 * (an io_uring ring for the file store); queues are not shared between
 * threads.  The caller owns a store: it must outlive every region backed by
 * it.  All calls return 0 (or a count, where said) or -errno.
 */
#ifndef KVP_STORE_H
#define KVP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_store;
struct kvp_store_queue;

enum kvp_io_op { KVP_IO_READ, KVP_IO_WRITE };

/* One asynchronous I/O.  Owned by the submitter until it is reaped. */
struct kvp_io {
	enum kvp_io_op op;  /* read or write */
	void *buf;	    /* aligned to kvp_store.mem_align */
	size_t len;	    /* a multiple of kvp_store.offset_align */
	uint64_t off;	    /* store offset, likewise aligned */
	int64_t result;	    /* on completion: bytes done, or -errno */
	uint64_t submit_ns; /* CLOCK_MONOTONIC at submit, set by the store */
	void *cookie;	    /* the submitter's */
};

struct kvp_store_ops {
	const char *kind; /* "file", "memory", "faulty", ... */
	int (*pread)(struct kvp_store *s, void *buf, size_t len, uint64_t off);
	int (*pwrite)(struct kvp_store *s, const void *buf, size_t len,
		      uint64_t off);
	int (*queue_create)(struct kvp_store *s, unsigned depth,
			    struct kvp_store_queue **q);
	void (*queue_destroy)(struct kvp_store_queue *q);
	/* Queue @n I/Os and submit them; returns how many were accepted. */
	int (*submit)(struct kvp_store_queue *q, struct kvp_io *const *ios,
		      unsigned n);
	/*
	 * Up to @max completions into @out.  @wait 0 takes what is there;
	 * n > 0 waits for at least one, and a store that can (the file
	 * store) until min(n, @max, the I/Os in flight) have completed, so
	 * that a caller who needs n of them wakes once rather than n times.
	 * true as @wait is 1: wait for one.
	 */
	int (*reap)(struct kvp_store_queue *q, struct kvp_io **out,
		    unsigned max, unsigned wait);
	/* A descriptor that polls readable when completions wait, or -1. */
	int (*queue_fd)(struct kvp_store_queue *q);
	/*
	 * Optional.  I/Os whose buffer lies wholly inside [base, base+len)
	 * may be done without pinning its pages again for each I/O (the file
	 * store registers it as io_uring fixed buffers of 1 GiB at most, the
	 * kernel's limit, whose pages stay pinned while registered; an I/O
	 * across two of them is done as a plain one; -E2BIG past 64 GiB).  One range a queue: a new call replaces
	 * it, base NULL forgets it; the memory must stay mapped until then
	 * or until queue_destroy, and no I/O may be in flight during the
	 * call.  0, or -errno (-ENOMEM over RLIMIT_MEMLOCK, ...) with no
	 * range kept, and I/O goes on as before.
	 */
	int (*queue_buffer)(struct kvp_store_queue *q, void *base,
			    size_t len);
	/* Forget [off, off+len): later reads may return zeros.  Optional. */
	int (*discard)(struct kvp_store *s, uint64_t off, uint64_t len);
	void (*destroy)(struct kvp_store *s);
};

struct kvp_store {
	const struct kvp_store_ops *ops;
	uint64_t size;	       /* bytes addressable */
	uint32_t mem_align;    /* buffer alignment I/O needs */
	uint32_t offset_align; /* offset and length alignment I/O needs */
	bool direct;	       /* I/O bypasses the page cache */
	char desc[128];	       /* "file /tmp/kvp-1234 (O_DIRECT)", ... */
	uint64_t buffered_ios; /* I/Os done buffered because the file refused
				  O_DIRECT (buffered_io_total); kept by the
				  store, read it with __atomic_load_n */
};

/* Flags of kvp_store_file_open. */
#define KVP_STORE_CREATE   (1u << 0) /* create the file if missing */
#define KVP_STORE_TRUNCATE (1u << 1) /* size it to @size, dropping data */
#define KVP_STORE_BUFFERED (1u << 2) /* do not ask for O_DIRECT (tests) */

/*
 * kvp_store_file_open - a file store on @path of @size bytes (0: the file's
 * size), read and written with io_uring and O_DIRECT.  A filesystem that
 * refuses O_DIRECT (ramfs; tmpfs before Linux 6.6) gets buffered I/O, a
 * warning on stderr and the buffered_io_total statistic.  A file shorter
 * than @size is extended with fallocate(2), so that a full disk fails here
 * with -ENOSPC rather than at a later write-back.  Alignment comes from
 * statx(STATX_DIOALIGN) (kvp_dio_alignment).  Each queue is an io_uring
 * ring of the depth asked for, with an eventfd as its queue_fd (registered
 * on the ring at the first queue_fd call: a queue nobody polls pays no
 * signal per completion); reap with @wait n waits for min(n, max, in
 * flight) completions in one io_uring_enter; queue_buffer registers a
 * fixed buffer; submit
 * returns 0 (not an error) when the queue already holds depth I/Os, and
 * queue_destroy waits for the I/Os still in flight.  Synchronous calls
 * accept any buffer address (misaligned ones go through a bounce buffer);
 * offsets and lengths must be multiples of offset_align (-EINVAL).
 * discard punches a hole (fallocate PUNCH_HOLE).  Returns 0 and *out, or
 * -errno with nothing created (a file created by this call is removed).
 */
int kvp_store_file_open(const char *path, uint64_t size, unsigned flags,
			struct kvp_store **out);

/*
 * kvp_store_file_temp - an anonymous backing file of @size bytes in @dir
 * (NULL: $TMPDIR or /tmp), mode 0600, unlinked once open (O_TMPFILE where
 * the filesystem supports it, else mkstemp(3) and unlink(2)), fallocated
 * to @size (-ENOSPC when the disk is too small).  Its blocks vanish with
 * the store.
 */
int kvp_store_file_temp(const char *dir, uint64_t size, struct kvp_store **out);

/* kvp_store_memory_create - a store in anonymous memory (tests, RAM tier). */
int kvp_store_memory_create(uint64_t size, struct kvp_store **out);

/*
 * kvp_store_faulty_create - a store that forwards to @inner and injects
 * faults as set by kvp_store_faulty_set; for tests of the error paths.
 * @inner stays owned by the caller and must outlive the faulty store.
 */
int kvp_store_faulty_create(struct kvp_store *inner, struct kvp_store **out);

struct kvp_fault_plan {
	uint64_t read_fail_off; /* reads overlapping [off, off+len) fail */
	uint64_t read_fail_len;
	int read_errno;	 /* e.g. EIO; 0: short read instead */
	int write_errno; /* writes fail with this (ENOSPC ...), 0: ok */
	uint64_t write_fail_after; /* ... once this many bytes were written */
	uint64_t delay_us;	   /* added latency per I/O */
};
int kvp_store_faulty_set(struct kvp_store *s, const struct kvp_fault_plan *p);

/* kvp_store_destroy - release the store; no region may still use it. */
void kvp_store_destroy(struct kvp_store *s);

/* Synchronous I/O of the whole range; a short transfer is -EIO. */
int kvp_store_pread(struct kvp_store *s, void *buf, size_t len, uint64_t off);
int kvp_store_pwrite(struct kvp_store *s, const void *buf, size_t len,
		     uint64_t off);

#endif /* KVP_STORE_H */
