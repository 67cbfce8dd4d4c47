/*
 * serve.c - the process's pager and its regions; see preload_i.h.
 *
 * One pager per process, opened by the first allocation large enough to be
 * served (not at load time: a program that never makes one pays nothing).
 * Each served allocation is one region of its own, backed by an anonymous
 * temp file of its own (kvp_store_file_temp in KVP_BACKING_DIR; reused
 * after a free, see store_get), starting zero-filled: a calloc'd region
 * reads zeros without reading the store.
 *
 * Failure to serve (the pager cannot open: no userfaultfd permission; the
 * backing file cannot be made: no such directory, no disk space; too many
 * regions) prints one warning for the whole process and the allocation is
 * made by the normal allocator; a pager that failed to open is not tried
 * again.  Under KVP_PRELOAD_STRICT=1 the process aborts instead.
 *
 * With KVP_FUSE_MOUNT the pager is opened by kvp_instance_open: its debug
 * view is mounted there (regions/malloc1/, regions/mmap2/, ...) and the
 * process is registered for kvpctl; both are undone at exit.
 *
 * Fork: the engine maps regions MADV_DONTFORK and its threads and
 * userfaultfd registration stay with the parent, so a child does not
 * inherit the regions: touching one in the child is a SIGSEGV (never a
 * hang).  In the child the shim never calls the engine (its locks may have
 * been held by threads that do not exist there): freeing an inherited
 * region only forgets it, and new large allocations go to the normal
 * allocator.  A child that execs starts afresh.
 */
#include "lib/preload/preload_i.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kmod-helpers/fdset.h"
#include "lib/instance/instance.h"

enum pager_state {
	PAGER_UNTRIED, /* no large allocation yet */
	PAGER_OPEN,    /* serving */
	PAGER_FAILED,  /* the pager did not open: not served, not retried */
	PAGER_CHILD,   /* a forked child: never touch the engine */
};

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_instance *instance; /* the pager and its debug view */
static struct kvp_pager *pager;	      /* atomic once set */
static int state;		      /* enum pager_state, atomic */
static bool warned;		      /* the one fallback warning was printed */
static uint64_t seq;		      /* region names, atomic */
static uint64_t served_total, fallback_total, peak_served; /* atomic */

bool kvp_preload_wants(size_t n)
{
	if (!__atomic_load_n(&kvp_env.loaded, __ATOMIC_ACQUIRE))
		return false;
	if (n < kvp_env.min_bytes)
		return false;
	int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
	return s == PAGER_UNTRIED || s == PAGER_OPEN;
}

static void human(char *buf, size_t len, uint64_t n)
{
	static const char units[] = "BKMGTP";
	double v = (double)n;
	unsigned u = 0;

	while (v >= 1024 && u + 1 < sizeof(units) - 1)
		v /= 1024, u++;
	if (u)
		snprintf(buf, len, "%.1f %ciB", v, units[u]);
	else
		snprintf(buf, len, "%" PRIu64 " B", n);
}

/* Not served: warn once (or abort under KVP_PRELOAD_STRICT=1). */
static void serve_failed(size_t n, const char *what, int err)
{
	char size[32];

	human(size, sizeof(size), n);
	__atomic_add_fetch(&fallback_total, 1, __ATOMIC_RELAXED);
	if (kvp_env.strict) {
		kvp_preload_say("cannot back a %s allocation with the pager: "
				"%s: %s; aborting (KVP_PRELOAD_STRICT=1)",
				size, what, kvp_strerror(err));
		abort();
	}
	if (__atomic_exchange_n(&warned, true, __ATOMIC_RELAXED))
		return;
	kvp_preload_say("cannot back a %s allocation with the pager: %s: %s; "
			"using the normal allocator instead (warned once; "
			"KVP_PRELOAD_STRICT=1 makes this fatal)",
			size, what, kvp_strerror(err));
}

/*
 * Open the process's pager: kvp_instance_open with the configuration read
 * by env.c and, with KVP_FUSE_MOUNT, its debug view (regions/malloc1/, ...)
 * mounted and the process registered for kvpctl; with KVP_METRICS_LISTEN
 * /metrics served over HTTP.  A view or an address that cannot be had
 * costs those only: that is reported on its own line and the pager opens
 * without them (under KVP_PRELOAD_STRICT=1 the process aborts).
 */
static int open_instance(struct kvp_pager **out)
{
	struct kvp_instance_opts o = {
		.cfg = &kvp_env.cfg,
		.no_env = true, /* env.c has read it */
		.mountpoint = kvp_env.fuse_mount ? kvp_env.fuse_mount : "",
	};
	const char *metrics = getenv("KVP_METRICS_LISTEN");
	char err[512];
	int r;

	r = kvp_instance_open(&o, &instance, err, sizeof(err));
	if (r && (kvp_env.fuse_mount || (metrics && *metrics))) {
		if (kvp_env.strict) {
			kvp_preload_say("%s; aborting (KVP_PRELOAD_STRICT=1)",
					err);
			abort();
		}
		kvp_preload_say("%s; going on without the debug view and "
				"/metrics",
				err);
		o.mountpoint = "";
		o.metrics_listen = "";
		r = kvp_instance_open(&o, &instance, err, sizeof(err));
	}
	if (r)
		return r;
	*out = kvp_instance_pager(instance);
	return 0;
}

/* The pager, opened on first use; NULL and *err when it cannot be. */
static struct kvp_pager *get_pager(int *err)
{
	struct kvp_pager *p = __atomic_load_n(&pager, __ATOMIC_ACQUIRE);

	if (p)
		return p;
	pthread_mutex_lock(&open_lock);
	p = pager;
	if (!p && __atomic_load_n(&state, __ATOMIC_ACQUIRE) == PAGER_UNTRIED) {
		*err = open_instance(&p);
		if (*err) {
			p = NULL;
			__atomic_store_n(&state, PAGER_FAILED,
					 __ATOMIC_RELEASE);
		} else {
			__atomic_store_n(&pager, p, __ATOMIC_RELEASE);
			__atomic_store_n(&state, PAGER_OPEN, __ATOMIC_RELEASE);
		}
	} else if (!p) {
		*err = -EPERM;
	}
	pthread_mutex_unlock(&open_lock);
	return p;
}

/*
 * Backing stores are kept for reuse, never destroyed: the engine's service
 * threads keep an I/O queue per store they have used (pager/service.c,
 * queue_for) and poll it until the pager closes, so a store must outlive
 * the pager, not only its regions.  A dropped region's blocks were
 * discarded (holes punched), so a kept store holds no disk space and no
 * data; the next region that fits reuses it, starting zero-filled as any
 * region does.  Past STORE_KEEP kept stores, one is left open unreferenced.
 */
#define STORE_KEEP 64

static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvp_store *kept[STORE_KEEP];
static unsigned nkept;

/* The smallest kept store of at least @size bytes, else a new temp file. */
static int store_get(uint64_t size, struct kvp_store **out)
{
	unsigned best = STORE_KEEP;

	pthread_mutex_lock(&store_lock);
	for (unsigned i = 0; i < nkept; i++)
		if (kept[i]->size >= size &&
		    (best == STORE_KEEP || kept[i]->size < kept[best]->size))
			best = i;
	if (best != STORE_KEEP) {
		*out = kept[best];
		kept[best] = kept[--nkept];
	}
	pthread_mutex_unlock(&store_lock);
	if (best != STORE_KEEP)
		return 0;
	return kvp_store_file_temp(kvp_env.backing_dir, size, out);
}

static void store_put(struct kvp_store *st)
{
	pthread_mutex_lock(&store_lock);
	if (nkept < STORE_KEEP)
		kept[nkept++] = st;
	pthread_mutex_unlock(&store_lock);
}

void *kvp_preload_serve(size_t n, size_t align, enum kvp_rec_kind kind)
{
	struct kvp_region_opts opts = { 0 };
	struct kvp_store *st = NULL;
	struct kvp_region *r = NULL;
	struct kvp_rec rec = { 0 };
	struct kvp_pager *p;
	size_t bs = kvp_env.block_bytes;
	const char *what;
	char name[32];
	uint64_t now;
	int err = 0;

	if (!kvp_preload_wants(n) || align > bs || n > SIZE_MAX - bs)
		return NULL;
	kvp_preload_in_hook++;
	what = "cannot start the pager";
	p = get_pager(&err);
	if (!p)
		goto fail;
	opts.size = (n + bs - 1) & ~(bs - 1);
	what = "cannot create its backing file";
	err = store_get(opts.size, &st);
	if (err)
		goto fail;
	snprintf(name, sizeof(name), "%s%" PRIu64,
		 kind == KVP_REC_MMAP ? "mmap" : "malloc",
		 __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
	opts.name = name;
	opts.block_bytes = bs;
	opts.store = st;
	what = "cannot create its region";
	err = kvp_region_create(p, &opts, &r);
	if (err)
		goto fail;
	rec.kind = kind;
	rec.start = (uintptr_t)kvp_region_addr(r);
	rec.len = kvp_region_size(r);
	rec.asked = n;
	rec.region = r;
	rec.store = st;
	rec.npieces = 1;
	rec.pieces[0].lo = rec.start;
	rec.pieces[0].hi = rec.start + ((n + 4095) & ~(size_t)4095);
	what = "too many served allocations at once";
	err = kvp_table_insert(&rec);
	if (err)
		goto fail;
	__atomic_add_fetch(&served_total, 1, __ATOMIC_RELAXED);
	now = kvp_table_count();
	if (now > __atomic_load_n(&peak_served, __ATOMIC_RELAXED))
		__atomic_store_n(&peak_served, now, __ATOMIC_RELAXED);
	kvp_preload_in_hook--;
	return (void *)rec.start;
fail:
	if (r)
		kvp_region_destroy(r);
	if (st)
		store_put(st);
	serve_failed(n, what, err);
	kvp_preload_in_hook--;
	return NULL;
}

void kvp_preload_discard(const struct kvp_rec *r, uintptr_t lo, uintptr_t hi)
{
	size_t bs = kvp_env.block_bytes;
	uint64_t first, last;

	if (r->orphan || !r->region)
		return;
	if (lo < r->start)
		lo = r->start;
	if (hi > r->start + r->len)
		hi = r->start + r->len;
	if (hi <= lo)
		return;
	first = (lo - r->start + bs - 1) / bs;
	last = (hi - r->start) / bs;
	if (last <= first)
		return;
	kvp_preload_in_hook++;
	(void)kvp_region_advise(r->region, first, last - first,
				KVP_ADVICE_DISCARD);
	kvp_preload_in_hook--;
}

void kvp_preload_drop(struct kvp_rec *r)
{
	if (r->orphan || !r->region)
		return;
	kvp_preload_in_hook++;
	/* Discard first: the contents die with the allocation, so nothing
	 * is written back. */
	(void)kvp_region_advise(r->region, 0, r->len / kvp_env.block_bytes,
				KVP_ADVICE_DISCARD);
	(void)kvp_region_destroy(r->region);
	store_put(r->store);
	kvp_preload_in_hook--;
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&open_lock);
	pthread_mutex_lock(&store_lock);
	kvp_table_lock();
}

static void fork_parent(void)
{
	kvp_table_unlock();
	pthread_mutex_unlock(&store_lock);
	pthread_mutex_unlock(&open_lock);
}

static void fork_child(void)
{
	kvp_table_unlock();
	pthread_mutex_unlock(&store_lock);
	pthread_mutex_unlock(&open_lock);
	__atomic_store_n(&state, PAGER_CHILD, __ATOMIC_RELEASE);
	__atomic_store_n(&pager, NULL, __ATOMIC_RELEASE);
	kvp_table_orphan_all();
}

/* The engine's own closes (guard set) and a forked child's close them. */
static bool keeping_fds(void)
{
	return !kvp_preload_in_hook &&
	       __atomic_load_n(&state, __ATOMIC_ACQUIRE) != PAGER_CHILD;
}

bool kvp_preload_keeps_fd(int fd)
{
	return keeping_fds() && kvp_fd_owned(fd);
}

int kvp_preload_next_kept_fd(unsigned from)
{
	return keeping_fds() ? kvp_fd_next_owned(from) : -1;
}

__attribute__((constructor)) static void kvp_preload_init(void)
{
	kvp_preload_in_hook++;
	kvp_preload_resolve();
	kvp_preload_env_load();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	kvp_preload_in_hook--;
}

/*
 * At exit the debug view is unmounted and the registry entry removed (the
 * pager itself is left to the process's end: other threads may still use
 * its regions); with KVP_PRELOAD_STATS=1, one line of totals, if the
 * process made large allocations.
 */
__attribute__((destructor)) static void kvp_preload_fini(void)
{
	struct kvp_stats s = { 0 };
	struct kvp_pager *p;

	if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == PAGER_OPEN &&
	    instance && kvp_instance_view(instance)) {
		kvp_preload_in_hook++;
		kvp_fuse_view_unmount(kvp_instance_view(instance));
		(void)kvp_instance_unregister();
		kvp_preload_in_hook--;
	}
	if (!kvp_env.stats ||
	    __atomic_load_n(&state, __ATOMIC_ACQUIRE) == PAGER_CHILD ||
	    !(served_total + fallback_total))
		return; /* a process that never made a large allocation */
	kvp_preload_in_hook++;
	p = __atomic_load_n(&pager, __ATOMIC_ACQUIRE);
	if (p)
		kvp_pager_stats(p, &s);
	kvp_preload_say("pid %d: served %" PRIu64 " allocations (peak %" PRIu64
			" at once), %" PRIu64 " fell back; budget %" PRIu64
			" bytes; demand_faults %" PRIu64 " zero_fills %" PRIu64
			" bytes_read %" PRIu64 " bytes_written %" PRIu64
			" evictions %" PRIu64 " removed_bytes %" PRIu64
			" resident_bytes %" PRIu64 " write_errors %" PRIu64
			" unwritten_bytes %" PRIu64,
			(int)getpid(), served_total, peak_served,
			fallback_total, kvp_env.cfg.ram_budget_bytes,
			s.demand_faults_total, s.zero_fills_total,
			s.bytes_read_total, s.bytes_written_total,
			s.evictions_clean_total + s.evictions_dirty_total,
			s.removed_bytes_total, s.resident_bytes,
			s.write_errors_total, s.unwritten_bytes);
	kvp_preload_in_hook--;
}
