/*
 * preload_i.h - internals of the LD_PRELOAD shim (libkvpager-preload.so).
 *
 * The shim interposes the allocation and mapping calls of an unmodified
 * program and backs the large ones with pager regions.  Its parts:
 *
 *   real.c   the real functions (dlsym(RTLD_NEXT)) and the bootstrap arena
 *            that serves dlsym's own allocations while they are resolved
 *   env.c    the environment: sizes, switches and the engine's tunables
 *   table.c  the table of served allocations (address -> region)
 *   serve.c  the one pager per process, making and dropping regions, the
 *            fallback warning, fork and exit handling
 *   hooks.c  the interposed symbols themselves
 *
 * Nothing here is exported: every symbol is hidden, so that neither the
 * program nor the libraries below can bind to it.
 */
#ifndef KVP_PRELOAD_I_H
#define KVP_PRELOAD_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pager/pager.h"

#define KVP_HIDDEN __attribute__((visibility("hidden")))

/*
 * The in-hook guard.  Non-zero while the shim's own code runs on this thread
 * (so that the engine's allocations made on the program's behalf go to the
 * real allocator) and, permanently, on every thread the engine starts (see
 * the pthread_create hook): the pager's threads are never served.
 * initial-exec TLS: reading it never calls __tls_get_addr, which may
 * allocate.
 */
extern __thread int kvp_preload_in_hook
    __attribute__((tls_model("initial-exec"))) KVP_HIDDEN;

/* ---- real.c ---- */

struct kvp_real {
	void *(*malloc)(size_t);
	void (*free)(void *);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
	size_t (*malloc_usable_size)(void *);
	void *(*mmap)(void *, size_t, int, int, int, off_t);
	void *(*mmap64)(void *, size_t, int, int, int, off_t);
	int (*munmap)(void *, size_t);
	void *(*mremap)(void *, size_t, size_t, int, ...);
	int (*madvise)(void *, size_t, int);
	int (*pthread_create)(pthread_t *, const pthread_attr_t *,
			      void *(*)(void *), void *);
	int (*close)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
};

extern struct kvp_real kvp_real KVP_HIDDEN;

/*
 * kvp_preload_resolve - fill kvp_real once (thread-safe).  Returns false
 * while this very thread is inside the resolution (dlsym allocating): the
 * caller then serves the call from the bootstrap arena.
 */
bool kvp_preload_resolve(void) KVP_HIDDEN;

/* Bootstrap arena: 16-byte aligned, never freed, about 256 KiB in all. */
void *kvp_arena_alloc(size_t n, size_t align) KVP_HIDDEN;
bool kvp_arena_owns(const void *p) KVP_HIDDEN;
size_t kvp_arena_size(const void *p) KVP_HIDDEN;

/* Raw-syscall fallbacks used before (or without) the real functions. */
void *kvp_sys_mmap(void *addr, size_t len, int prot, int flags, int fd,
		   off_t off) KVP_HIDDEN;
int kvp_sys_munmap(void *addr, size_t len) KVP_HIDDEN;
int kvp_sys_madvise(void *addr, size_t len, int advice) KVP_HIDDEN;

/* ---- env.c ---- */

struct kvp_preload_env {
	bool loaded;	      /* the constructor has read the environment */
	uint64_t min_bytes;   /* KVP_PRELOAD_MIN_BYTES: smallest served */
	uint64_t block_bytes; /* KVP_PRELOAD_BLOCK_BYTES: region block size */
	bool strict;	      /* KVP_PRELOAD_STRICT: abort, don't fall back */
	bool stats;	      /* KVP_PRELOAD_STATS: statistics at exit */
	const char *backing_dir; /* KVP_BACKING_DIR, NULL: $TMPDIR or /tmp */
	const char *fuse_mount;	 /* KVP_FUSE_MOUNT, NULL: no FUSE view */
	struct kvp_config cfg;	 /* defaults overridden by KVP_<TUNABLE> */
};

extern struct kvp_preload_env kvp_env KVP_HIDDEN;

/*
 * kvp_preload_env_load - read the environment into kvp_env (once).  A value
 * that does not parse, or is out of its range, keeps its default with a
 * warning (under KVP_PRELOAD_STRICT=1 the process aborts instead).
 */
void kvp_preload_env_load(void) KVP_HIDDEN;

/* A line "kvpager-preload: <message>" on stderr, written with write(2). */
void kvp_preload_say(const char *fmt, ...)
    __attribute__((format(printf, 1, 2))) KVP_HIDDEN;

/*
 * kvp_preload_keeps_fd - whether a program's close (or dup2 over) of @fd
 * must be refused: @fd is the engine's (kmod-helpers/fdset.h) and this
 * process, not a forked child, runs the engine.
 */
bool kvp_preload_keeps_fd(int fd) KVP_HIDDEN;
/* The lowest such descriptor from @from up, or -1 when there is none. */
int kvp_preload_next_kept_fd(unsigned from) KVP_HIDDEN;

/* ---- table.c ---- */

#define KVP_PRELOAD_MAX_RECS   1024 /* served allocations alive at once */
#define KVP_PRELOAD_MAX_PIECES 8    /* mapped pieces of one (partial munmap) */

enum kvp_rec_kind { KVP_REC_MALLOC, KVP_REC_MMAP };

struct kvp_piece {
	uintptr_t lo, hi; /* [lo, hi) still mapped */
};

/* One served allocation. */
struct kvp_rec {
	bool used;		   /* slot in use */
	bool orphan;		   /* inherited by a forked child: not mapped */
	enum kvp_rec_kind kind;	   /* malloc family or mmap */
	uintptr_t start;	   /* the region's address */
	size_t len;		   /* the region's size (block multiple) */
	size_t asked;		   /* bytes the program asked for */
	struct kvp_region *region; /* NULL once orphaned */
	struct kvp_store *store;   /* its temp file, owned */
	unsigned npieces;	   /* KVP_REC_MMAP: mapped pieces */
	struct kvp_piece pieces[KVP_PRELOAD_MAX_PIECES];
};

/* A quick test without a lock: false means @p is surely not served. */
bool kvp_table_maybe(const void *p) KVP_HIDDEN;
/* Insert a copy of @r; -ENOSPC when the table is full. */
int kvp_table_insert(const struct kvp_rec *r) KVP_HIDDEN;
/* Copy the record starting exactly at @p into *out; true if found. */
bool kvp_table_find(const void *p, struct kvp_rec *out) KVP_HIDDEN;
/* Remove the record of @kind (-1: any) starting at @p into *out; true if
 * found. */
bool kvp_table_take(const void *p, int kind, struct kvp_rec *out) KVP_HIDDEN;
/* Copy the record whose region contains @p into *out; true if found. */
bool kvp_table_find_containing(const void *p, struct kvp_rec *out) KVP_HIDDEN;
/* Overwrite the record starting at r->start; false if it is gone. */
bool kvp_table_update(const struct kvp_rec *r) KVP_HIDDEN;
/*
 * Records overlapping [lo, hi), copied into @out (up to @max); returns how
 * many overlap.
 */
unsigned kvp_table_overlapping(uintptr_t lo, uintptr_t hi, struct kvp_rec *out,
			       unsigned max) KVP_HIDDEN;
/* Fork support: lock the table, unlock it, and orphan every record. */
void kvp_table_lock(void) KVP_HIDDEN;
void kvp_table_unlock(void) KVP_HIDDEN;
void kvp_table_orphan_all(void) KVP_HIDDEN;
/* How many allocations are served now. */
unsigned kvp_table_count(void) KVP_HIDDEN;

/* ---- serve.c ---- */

/*
 * kvp_preload_serve - back @n bytes (@align <= block_bytes) with a new
 * region; returns its address, or NULL when the allocation is not served
 * (too small, the shim is off in this process, or serving failed: then the
 * one warning is printed, or the process aborts under KVP_PRELOAD_STRICT).
 * The caller then uses the real allocator.  Call with the guard clear.
 */
void *kvp_preload_serve(size_t n, size_t align,
			enum kvp_rec_kind kind) KVP_HIDDEN;

/* Whether an allocation of @n bytes is large enough to try serving. */
bool kvp_preload_wants(size_t n) KVP_HIDDEN;

/*
 * kvp_preload_drop - release a record already taken out of the table:
 * discard its blocks (nothing is written back), destroy the region and its
 * store.  An orphan (forked child) is only forgotten.
 */
void kvp_preload_drop(struct kvp_rec *r) KVP_HIDDEN;

/* Discard whole blocks of @r inside [lo, hi): later reads give zeros. */
void kvp_preload_discard(const struct kvp_rec *r, uintptr_t lo,
			 uintptr_t hi) KVP_HIDDEN;

#endif /* KVP_PRELOAD_I_H */
