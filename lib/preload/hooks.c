/*
 * hooks.c - the interposed symbols of libkvpager-preload.so.
 *
 * Each hook forwards to the real function unless the call is the program's
 * (the in-hook guard is clear) and large enough (KVP_PRELOAD_MIN_BYTES):
 *
 *   malloc calloc realloc reallocarray posix_memalign aligned_alloc memalign
 *   valloc pvalloc   a served allocation is one pager region
 *   free             of a served pointer: its blocks are discarded, its
 *                    region destroyed (nothing is written back)
 *   malloc_usable_size  the region's size (a block multiple)
 *   mmap mmap64      anonymous, private, PROT_READ|PROT_WRITE, no address
 *                    hint and no MAP_FIXED/HUGETLB/GROWSDOWN/STACK/LOCKED
 *                    mappings are served (MAP_POPULATE is ignored)
 *   munmap           a partial unmap of a region unmaps the whole blocks in
 *                    the range (the engine forgets them on UFFD_EVENT_UNMAP)
 *                    and drops the pages of blocks it covers only partly
 *                    (MADV_DONTNEED; they stay mapped, reading zeros, until
 *                    the rest of their block goes: a region is served in
 *                    whole blocks); the region goes with its last page
 *   madvise          MADV_DONTNEED is passed to the kernel (the engine turns
 *                    UFFD_EVENT_REMOVE into zeros); MADV_FREE on a region
 *                    becomes MADV_DONTNEED; MADV_DOFORK on one is ignored
 *   mremap           shrinking in place unmaps the tail; a move copies the
 *                    contents into a new mapping (a new region when large
 *                    enough, plain memory for MREMAP_FIXED) and unmaps the
 *                    old one, because the kernel moving registered memory
 *                    would drop it from the userfaultfd and lose the blocks
 *                    not resident; growing without MREMAP_MAYMOVE fails
 *                    with ENOMEM as the kernel may
 *   pthread_create   a thread started by the engine (guard set) keeps the
 *                    guard for its whole life: it is never served
 *   close close_range closefrom dup2 dup3
 *                    the engine's own descriptors (its userfaultfd, the
 *                    stores' files, rings, eventfds) are kept: close says
 *                    EBADF, as for a descriptor not open; close_range and
 *                    closefrom close the others (closefrom by
 *                    /proc/self/fd where close_range is refused, as
 *                    glibc's); dup2 and dup3 over one
 *                    fail with EBUSY.  A program closing every descriptor
 *                    (a daemon) would otherwise unregister the regions,
 *                    which then read as zeros
 *
 * Not caught: glibc's internal reallocs of a buffer the program handed it
 * (getline(3), open_memstream(3)), which must stay below the threshold.
 */
/* Define mmap and mmap64 both: without this, <sys/mman.h> renames mmap. */
#undef _FILE_OFFSET_BITS

#include "lib/preload/preload_i.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"

#define EXPORT __attribute__((visibility("default")))

__thread int kvp_preload_in_hook;

#define PAGE_ROUND(n) (((n) + 4095) & ~(size_t)4095)

static void need(const void *fn, const char *name)
{
	if (fn)
		return;
	kvp_preload_say("cannot find the real %s (dlsym RTLD_NEXT); aborting",
			name);
	abort();
}

/* ---- the malloc family ---- */

EXPORT void *malloc(size_t n)
{
	void *p;

	if (!kvp_preload_resolve())
		return kvp_arena_alloc(n, 16);
	if (!kvp_preload_in_hook && kvp_preload_wants(n)) {
		p = kvp_preload_serve(n, 0, KVP_REC_MALLOC);
		if (p)
			return p;
	}
	need(kvp_real.malloc, "malloc");
	return kvp_real.malloc(n);
}

EXPORT void *calloc(size_t n, size_t m)
{
	size_t t;
	void *p;

	if (__builtin_mul_overflow(n, m, &t)) {
		errno = ENOMEM;
		return NULL;
	}
	if (!kvp_preload_resolve())
		return kvp_arena_alloc(t, 16); /* static storage: zeros */
	if (!kvp_preload_in_hook && kvp_preload_wants(t)) {
		p = kvp_preload_serve(t, 0, KVP_REC_MALLOC); /* zero-filled */
		if (p)
			return p;
	}
	need(kvp_real.calloc, "calloc");
	return kvp_real.calloc(n, m);
}

EXPORT void free(void *p)
{
	struct kvp_rec rec;

	if (!p || kvp_arena_owns(p))
		return;
	if (kvp_table_take(p, KVP_REC_MALLOC, &rec)) {
		kvp_preload_drop(&rec);
		return;
	}
	if (!kvp_preload_resolve())
		return; /* only the arena exists yet */
	need(kvp_real.free, "free");
	kvp_real.free(p);
}

/* realloc of a served pointer. */
static void *realloc_served(struct kvp_rec *rec, size_t n)
{
	struct kvp_rec gone;
	void *p = (void *)rec->start, *q;

	if (!n) { /* glibc's realloc(p, 0): free p, return NULL */
		if (kvp_table_take(p, KVP_REC_MALLOC, &gone))
			kvp_preload_drop(&gone);
		return NULL;
	}
	if (n <= rec->len && kvp_preload_wants(n)) {
		/* Fits: keep the region; blocks wholly past the new end are
		 * discarded, so they are never written back. */
		if (n < rec->asked)
			kvp_preload_discard(rec, rec->start + n,
					    rec->start + rec->len);
		rec->asked = n;
		kvp_table_update(rec);
		return p;
	}
	q = NULL;
	if (n > rec->len)
		q = kvp_preload_serve(n, 0, KVP_REC_MALLOC);
	if (!q)
		q = kvp_real.malloc(n);
	if (!q)
		return NULL; /* errno is ENOMEM; p is untouched */
	memcpy(q, p, n < rec->len ? n : rec->len);
	if (kvp_table_take(p, KVP_REC_MALLOC, &gone))
		kvp_preload_drop(&gone);
	return q;
}

EXPORT void *realloc(void *p, size_t n)
{
	struct kvp_rec rec;
	size_t old;
	void *q;

	if (!kvp_preload_resolve()) {
		q = kvp_arena_alloc(n, 16);
		if (q && p)
			memcpy(q, p,
			       kvp_arena_size(p) < n ? kvp_arena_size(p) : n);
		return q;
	}
	if (!p)
		return malloc(n);
	if (kvp_arena_owns(p)) {
		old = kvp_arena_size(p);
		q = malloc(n);
		if (q)
			memcpy(q, p, old < n ? old : n);
		return q;
	}
	need(kvp_real.realloc, "realloc");
	if (kvp_preload_in_hook)
		return kvp_real.realloc(p, n);
	if (kvp_table_find(p, &rec) && rec.kind == KVP_REC_MALLOC)
		return realloc_served(&rec, n);
	if (kvp_preload_wants(n)) {
		/* An ordinary block growing past the threshold moves into a
		 * region. */
		old = kvp_real.malloc_usable_size(p);
		if (n > old) {
			q = kvp_preload_serve(n, 0, KVP_REC_MALLOC);
			if (q) {
				memcpy(q, p, old);
				kvp_real.free(p);
				return q;
			}
		}
	}
	return kvp_real.realloc(p, n);
}

EXPORT void *reallocarray(void *p, size_t n, size_t m)
{
	size_t t;

	if (__builtin_mul_overflow(n, m, &t)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, t);
}

static bool align_ok(size_t align)
{
	return align && !(align & (align - 1));
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;

	if (!align_ok(align) || align % sizeof(void *))
		return EINVAL;
	if (!kvp_preload_resolve()) {
		p = kvp_arena_alloc(n, align);
		if (!p)
			return ENOMEM;
		*out = p;
		return 0;
	}
	if (!kvp_preload_in_hook && kvp_preload_wants(n)) {
		p = kvp_preload_serve(n, align, KVP_REC_MALLOC);
		if (p) {
			*out = p;
			return 0;
		}
	}
	need(kvp_real.posix_memalign, "posix_memalign");
	return kvp_real.posix_memalign(out, align, n);
}

/* The aligned forms other than posix_memalign. */
static void *aligned(size_t align, size_t n, void *(*real)(size_t, size_t),
		     const char *name)
{
	void *p;

	if (!kvp_preload_resolve())
		return kvp_arena_alloc(n, align);
	if (!kvp_preload_in_hook && align_ok(align) && kvp_preload_wants(n)) {
		p = kvp_preload_serve(n, align, KVP_REC_MALLOC);
		if (p)
			return p;
	}
	need(real, name);
	return real(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	return aligned(align, n, kvp_real.aligned_alloc, "aligned_alloc");
}

EXPORT void *memalign(size_t align, size_t n)
{
	return aligned(align, n, kvp_real.memalign, "memalign");
}

static void *real_valloc(size_t align, size_t n)
{
	return kvp_real.valloc(n);
}

static void *real_pvalloc(size_t align, size_t n)
{
	return kvp_real.pvalloc(n);
}

EXPORT void *valloc(size_t n)
{
	return aligned(4096, n, kvp_real.valloc ? real_valloc : NULL, "valloc");
}

EXPORT void *pvalloc(size_t n)
{
	return aligned(4096, PAGE_ROUND(n),
		       kvp_real.pvalloc ? real_pvalloc : NULL, "pvalloc");
}

EXPORT size_t malloc_usable_size(void *p)
{
	struct kvp_rec rec;

	if (!p)
		return 0;
	if (kvp_arena_owns(p))
		return kvp_arena_size(p);
	if (kvp_table_find(p, &rec) && rec.kind == KVP_REC_MALLOC)
		return rec.len;
	if (!kvp_preload_resolve())
		return 0;
	need(kvp_real.malloc_usable_size, "malloc_usable_size");
	return kvp_real.malloc_usable_size(p);
}

/* ---- mappings ---- */

static bool mmap_servable(void *addr, int prot, int flags, int fd)
{
	const int refuse = MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_HUGETLB |
			   MAP_GROWSDOWN | MAP_STACK | MAP_LOCKED;

	return !addr && (flags & MAP_ANONYMOUS) &&
	       (flags & MAP_TYPE) == MAP_PRIVATE && !(flags & refuse) &&
	       prot == (PROT_READ | PROT_WRITE);
}

static void *do_mmap(void *(*real)(void *, size_t, int, int, int, off_t),
		     void *addr, size_t len, int prot, int flags, int fd,
		     off_t off)
{
	void *p;

	if (!kvp_preload_resolve() || !real)
		return kvp_sys_mmap(addr, len, prot, flags, fd, off);
	if (!kvp_preload_in_hook && mmap_servable(addr, prot, flags, fd) &&
	    kvp_preload_wants(len)) {
		p = kvp_preload_serve(len, 0, KVP_REC_MMAP);
		if (p)
			return p;
	}
	return real(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd,
		  off_t off)
{
	return do_mmap(kvp_real.mmap, addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd,
		    off_t off)
{
	return do_mmap(kvp_real.mmap64, addr, len, prot, flags, fd, off);
}

static int real_munmap(void *addr, size_t len)
{
	if (kvp_real.munmap)
		return kvp_real.munmap(addr, len);
	return kvp_sys_munmap(addr, len);
}

/*
 * Subtract [a, b) from @r's mapped pieces.  Returns false when the pieces
 * would not fit the record (a hole punched into a piece past
 * KVP_PRELOAD_MAX_PIECES): the hole is then not tracked, and the region
 * stays until the process ends.
 */
static bool cut_pieces(struct kvp_rec *r, uintptr_t a, uintptr_t b)
{
	struct kvp_piece out[KVP_PRELOAD_MAX_PIECES];
	unsigned n = 0;

	for (unsigned i = 0; i < r->npieces; i++) {
		struct kvp_piece p = r->pieces[i];

		if (b <= p.lo || a >= p.hi) {
			if (n == KVP_PRELOAD_MAX_PIECES)
				return false;
			out[n++] = p;
			continue;
		}
		if (p.lo < a) {
			if (n == KVP_PRELOAD_MAX_PIECES)
				return false;
			out[n++] = (struct kvp_piece){ p.lo, a };
		}
		if (b < p.hi) {
			if (n == KVP_PRELOAD_MAX_PIECES)
				return false;
			out[n++] = (struct kvp_piece){ b, p.hi };
		}
	}
	memcpy(r->pieces, out, n * sizeof(out[0]));
	r->npieces = n;
	return true;
}

static int real_madvise(void *addr, size_t len, int advice)
{
	if (kvp_real.madvise)
		return kvp_real.madvise(addr, len, advice);
	return kvp_sys_madvise(addr, len, advice);
}

static bool piece_overlaps(const struct kvp_rec *r, uintptr_t lo, uintptr_t hi)
{
	for (unsigned i = 0; i < r->npieces; i++)
		if (r->pieces[i].lo < hi && lo < r->pieces[i].hi)
			return true;
	return false;
}

/*
 * Unmap [x, y), inside the live region @r whose pieces were already cut.
 * The engine serves whole blocks, and a block with a hole cannot be
 * installed, so only blocks with no mapped piece left are unmapped; in a
 * block the range covers only partly, the range is dropped with
 * MADV_DONTNEED (the engine forgets those pages; they read as zeros if
 * touched again) and stays mapped until the rest of its block goes.
 */
static void unmap_in_region(const struct kvp_rec *r, uintptr_t x, uintptr_t y,
			    bool tracked)
{
	size_t bs = kvp_env.block_bytes;
	uintptr_t blk = r->start + ((x - r->start) & ~(uintptr_t)(bs - 1));
	uintptr_t un_lo = 0, un_hi = 0; /* coalesced whole blocks to unmap */

	for (; blk < y; blk += bs) {
		uintptr_t lo = x > blk ? x : blk;
		uintptr_t hi = y < blk + bs ? y : blk + bs;

		if (tracked && !piece_overlaps(r, blk, blk + bs)) {
			if (un_hi != blk) {
				if (un_hi > un_lo)
					real_munmap((void *)un_lo,
						    un_hi - un_lo);
				un_lo = blk;
			}
			un_hi = blk + bs;
			continue;
		}
		real_madvise((void *)lo, hi - lo, MADV_DONTNEED);
	}
	if (un_hi > un_lo)
		real_munmap((void *)un_lo, un_hi - un_lo);
}

/* munmap(2) semantics over served and ordinary memory alike. */
static int unmap_range(uintptr_t a, uintptr_t b)
{
	struct kvp_rec recs[16], gone;
	uintptr_t done_lo[16], done_hi[16];
	unsigned n, ndone = 0;
	uintptr_t at;
	int rc = 0;

	n = kvp_table_overlapping(a, b, recs, 16);
	if (n > 16)
		n = 16; /* the rest are plainly unmapped and stay recorded */
	for (unsigned i = 0; i < n; i++) {
		struct kvp_rec *r = &recs[i];
		uintptr_t x = a > r->start ? a : r->start;
		uintptr_t y = b < r->start + r->len ? b : r->start + r->len;
		bool tracked = cut_pieces(r, a, b);

		if (r->orphan) {
			/* A forked child's record of its parent's region: the
			 * range is not the region's here, unmap it plainly. */
			if (tracked && !r->npieces)
				kvp_table_take((void *)r->start, -1, &gone);
			else if (tracked)
				kvp_table_update(r);
			continue;
		}
		done_lo[ndone] = r->start;
		done_hi[ndone++] = r->start + r->len;
		if (!tracked || r->npieces) {
			if (tracked)
				kvp_table_update(r);
			unmap_in_region(r, x, y, tracked);
			continue;
		}
		/* Its last mapped page goes: the region goes, whole (the
		 * engine unmaps it, slack past the program's end included). */
		if (kvp_table_take((void *)r->start, -1, &gone))
			kvp_preload_drop(&gone);
	}
	/* Unmap [a, b) less the regions handled above (a dropped region's
	 * addresses may already be reused by another thread).  At most 16
	 * intervals: quadratic is fine. */
	at = a;
	while (at < b) {
		uintptr_t next = b;
		bool skip = false;

		for (unsigned i = 0; i < ndone; i++) {
			if (at >= done_lo[i] && at < done_hi[i]) {
				at = done_hi[i];
				skip = true;
				break;
			}
			if (done_lo[i] > at && done_lo[i] < next)
				next = done_lo[i];
		}
		if (skip)
			continue;
		if (real_munmap((void *)at, next - at))
			rc = -1;
		at = next;
	}
	return rc;
}

EXPORT int munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;

	kvp_preload_resolve();
	if (kvp_preload_in_hook || (a & 4095) || !len ||
	    !kvp_table_overlapping(a, a + PAGE_ROUND(len), NULL, 0))
		return real_munmap(addr, len);
	return unmap_range(a, a + PAGE_ROUND(len));
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	uintptr_t a = (uintptr_t)addr;

	kvp_preload_resolve();
	if (kvp_preload_in_hook || !len ||
	    !kvp_table_overlapping(a, a + PAGE_ROUND(len), NULL, 0))
		return real_madvise(addr, len, advice);
	switch (advice) {
	case MADV_FREE:
		/* Lazy freeing is invisible to userfaultfd; dropping now is
		 * one of the outcomes MADV_FREE allows. */
		return real_madvise(addr, len, MADV_DONTNEED);
	case MADV_DOFORK:
		/* A child must not inherit a region without its pager. */
		return 0;
	default:
		return real_madvise(addr, len, advice);
	}
}

static void *real_mremap(void *old, size_t oldlen, size_t newlen, int flags,
			 void *new_addr)
{
	return kvp_real.mremap(old, oldlen, newlen, flags, new_addr);
}

/* Whether [a, b) lies inside one mapped piece of @r. */
static bool mapped_in(const struct kvp_rec *r, uintptr_t a, uintptr_t b)
{
	for (unsigned i = 0; i < r->npieces; i++)
		if (a >= r->pieces[i].lo && b <= r->pieces[i].hi)
			return true;
	return false;
}

EXPORT void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...)
{
	uintptr_t a = (uintptr_t)old;
	void *new_addr = NULL, *q;
	struct kvp_rec rec;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	kvp_preload_resolve();
	need(kvp_real.mremap, "mremap");
	if (kvp_preload_in_hook || !kvp_table_find_containing(old, &rec))
		return real_mremap(old, oldlen, newlen, flags, new_addr);
	oldlen = PAGE_ROUND(oldlen);
	if ((a & 4095) || !oldlen || !newlen ||
	    !mapped_in(&rec, a, a + oldlen)) {
		errno = oldlen && newlen && !(a & 4095) ? EFAULT : EINVAL;
		return MAP_FAILED;
	}
	if (!(flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) &&
	    PAGE_ROUND(newlen) <= oldlen) {
		if (PAGE_ROUND(newlen) < oldlen)
			unmap_range(a + PAGE_ROUND(newlen), a + oldlen);
		return old;
	}
	if (!(flags & MREMAP_MAYMOVE)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	if (flags & MREMAP_FIXED) {
		uintptr_t n = (uintptr_t)new_addr;

		if ((n & 4095) || (n < a + oldlen && a < n + newlen)) {
			errno = EINVAL;
			return MAP_FAILED;
		}
		unmap_range(n, n + PAGE_ROUND(newlen));
		q = kvp_real.mmap(new_addr, newlen, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
				  0);
	} else {
		q = kvp_preload_serve(newlen, 0, KVP_REC_MMAP);
		if (!q)
			q = kvp_real.mmap(NULL, newlen, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (q == MAP_FAILED || !q)
		return MAP_FAILED;
	memcpy(q, old, oldlen < newlen ? oldlen : newlen);
	if (flags & MREMAP_DONTUNMAP)
		real_madvise(old, oldlen, MADV_DONTNEED);
	else
		unmap_range(a, a + oldlen);
	return q;
}

/* ---- threads ---- */

struct tramp {
	void *(*fn)(void *);
	void *arg;
};

static void *tramp_start(void *p)
{
	struct tramp t = *(struct tramp *)p;

	kvp_real.free(p);
	kvp_preload_in_hook = 1; /* for the thread's whole life */
	return t.fn(t.arg);
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg)
{
	struct tramp *t;
	int rc;

	kvp_preload_resolve();
	need(kvp_real.pthread_create, "pthread_create");
	if (!kvp_preload_in_hook)
		return kvp_real.pthread_create(th, attr, fn, arg);
	t = kvp_real.malloc(sizeof(*t));
	if (!t)
		return EAGAIN;
	t->fn = fn;
	t->arg = arg;
	rc = kvp_real.pthread_create(th, attr, tramp_start, t);
	if (rc)
		kvp_real.free(t);
	return rc;
}

/* ---- descriptors ---- */

static int real_close(int fd)
{
	if (kvp_preload_resolve() && kvp_real.close)
		return kvp_real.close(fd);
	return (int)syscall(SYS_close, fd);
}

EXPORT int close(int fd)
{
	if (kvp_preload_keeps_fd(fd)) {
		errno = EBADF;
		return -1;
	}
	/* The engine's own close (guard set) forgets the number first: the
	 * program's next file may get it. */
	if (kvp_preload_in_hook)
		kvp_fd_disown(fd);
	return real_close(fd);
}

static int sys_close_range(unsigned lo, unsigned hi, int flags)
{
	return (int)syscall(SYS_close_range, lo, hi, flags);
}

/* close_range(2) around the engine's descriptors in [lo, hi]. */
static int close_range_around(unsigned lo, unsigned hi, int flags)
{
	unsigned from = lo;
	int kept, rc = 0;

	while ((kept = kvp_preload_next_kept_fd(from)) >= 0 &&
	       (unsigned)kept <= hi) {
		if ((unsigned)kept > from &&
		    sys_close_range(from, (unsigned)kept - 1, flags))
			rc = -1;
		from = (unsigned)kept + 1; /* a descriptor is below INT_MAX */
	}
	if (from <= hi && sys_close_range(from, hi, flags))
		rc = -1;
	return rc;
}

EXPORT int close_range(unsigned lo, unsigned hi, int flags)
{
	if (kvp_preload_in_hook || lo > hi || (flags & CLOSE_RANGE_CLOEXEC))
		return sys_close_range(lo, hi, flags);
	return close_range_around(lo, hi, flags);
}

/* /proc/self/fd's numbers from @lo up, closed but the engine's; false when
 * it cannot be read.  Read again from the start after closing (its
 * offsets move), as glibc's closefrom does. */
static bool close_listed_from(unsigned lo)
{
	alignas(struct dirent64) char buf[1024];
	struct rlimit nofile;
	bool ok = false;
	int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	/* Every number taken: one of those asked for makes room for it. */
	if (dir < 0 && errno == EMFILE && !getrlimit(RLIMIT_NOFILE, &nofile)) {
		for (rlim_t fd = lo; fd < nofile.rlim_cur; fd++)
			if (!kvp_preload_keeps_fd((int)fd) && !real_close((int)fd))
				break;
		dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	if (dir < 0)
		return false;
	for (;;) {
		ssize_t n = getdents64(dir, buf, sizeof(buf));
		bool closed = false;

		if (n <= 0) {
			ok = n == 0;
			break;
		}
		for (ssize_t off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(buf + off);
			long fd = strtol(d->d_name, NULL, 10);

			off += d->d_reclen;
			if (d->d_name[0] == '.' || fd == dir || fd < lo ||
			    kvp_preload_keeps_fd((int)fd))
				continue;
			real_close((int)fd);
			closed = true;
		}
		if (closed && lseek(dir, 0, SEEK_SET) < 0)
			break;
	}
	real_close(dir);
	return ok;
}

/* As glibc's: close_range, or where it is refused (before Linux 5.9, a
 * seccomp filter) the numbers listed in /proc/self/fd; a closefrom that
 * cannot close them aborts, never returning with them open. */
EXPORT void closefrom(int lowfd)
{
	unsigned lo = lowfd < 0 ? 0 : (unsigned)lowfd;
	int err;

	if (!close_range_around(lo, ~0u, 0))
		return;
	err = errno;
	if (close_listed_from(lo))
		return;
	kvp_preload_say("closefrom(%d): close_range failed (%s) and "
			"/proc/self/fd cannot be read (%s): the descriptors "
			"are left open; aborting, as glibc does (mount /proc, "
			"or let close_range through the seccomp filter)",
			lowfd, strerror(err), strerror(errno));
	abort();
}

EXPORT int dup2(int old, int new)
{
	if (old != new && kvp_preload_keeps_fd(new)) {
		errno = EBUSY;
		return -1;
	}
	if (kvp_preload_resolve() && kvp_real.dup2)
		return kvp_real.dup2(old, new);
	if (old == new) /* dup3 refuses what dup2 allows */
		return syscall(SYS_fcntl, old, F_GETFD) < 0 ? -1 : new;
	return (int)syscall(SYS_dup3, old, new, 0);
}

EXPORT int dup3(int old, int new, int flags)
{
	if (old != new && kvp_preload_keeps_fd(new)) {
		errno = EBUSY;
		return -1;
	}
	if (kvp_preload_resolve() && kvp_real.dup3)
		return kvp_real.dup3(old, new, flags);
	return (int)syscall(SYS_dup3, old, new, flags);
}
