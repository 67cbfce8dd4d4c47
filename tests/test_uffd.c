/*
 * test_uffd.c - kmod-helpers/uffd.c on a real userfaultfd.
 *
 * Each test gets its own descriptor from a checked fixture (a registration
 * and its handler thread do not survive fork, and Check forks per test).  A
 * handler thread serves the faults of one registered range the way a test
 * asks (COPY, ZEROPAGE, MOVE, CONTINUE, POISON, ...) and records what it
 * saw; tests assert on that record after stopping the thread.  Tests that
 * need a feature the kernel lacks say so and return.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "kmod-helpers/uffd.h"
#include "tests/helpers/helpers.h"

#define PG   KVP_PAGE_SIZE
#define HUGE KVP_HUGE_SIZE

/* What the fixture's handshake asks for; never WP_ASYNC (no WP messages). */
#define WANTED                                                                 \
	(UFFD_FEATURE_MOVE | UFFD_FEATURE_POISON |                             \
	 UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID |             \
	 UFFD_FEATURE_MINOR_SHMEM)

static struct kvp_uffd uf;
static uint64_t supported;

static void uffd_setup(void)
{
	ck_assert_int_eq(kvp_uffd_supported(&supported, NULL), 0);
	ck_assert_int_eq(kvp_uffd_open(&uf, 0), 0);
	ck_assert_int_eq(kvp_uffd_api(&uf, WANTED, 0), 0);
}

static void uffd_teardown(void)
{
	kvp_uffd_close(&uf);
}

static bool have(uint64_t feature, const char *test)
{
	if (uf.features & feature)
		return true;
	printf("%s: skipped: this kernel lacks UFFD_FEATURE_%s\n", test,
	       kvp_uffd_feature_name(feature));
	return false;
}

/* kB of AnonHugePages in the VMA that holds @addr (smaps), or -1. */
static long anon_huge_kb(void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[256];
	bool in = false;
	long kb = -1;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
			continue;
		}
		if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

/* ---- the handler thread ---- */

enum serve {
	SERVE_COPY,	     /* UFFDIO_COPY of the pattern */
	SERVE_COPY_WP,	     /* the same, write-protected */
	SERVE_COPY_DONTWAKE, /* COPY with DONTWAKE; the test wakes */
	SERVE_ZERO,	     /* UFFDIO_ZEROPAGE */
	SERVE_MOVE,	     /* UFFDIO_MOVE from h->src */
	SERVE_CONTINUE,	     /* UFFDIO_CONTINUE (minor faults) */
	SERVE_POISON, /* UFFDIO_POISON: the faulting access gets SIGBUS */
};

#define MAX_EVENTS 32

struct handler {
	struct kvp_uffd *u;
	enum serve serve;
	char *base; /* the registered range */
	size_t len;
	char *src; /* SERVE_MOVE: page i of the range comes from src + i*PG */
	pthread_t thread;
	int stop_fd;
	atomic_int missing;  /* missing (and minor) faults seen */
	atomic_int wp;	     /* write-protect faults seen */
	atomic_int errors;   /* resolve calls that failed unexpectedly */
	atomic_int first_rc; /* the first such failure */
	int nevents;	     /* non-fault messages, read after stop */
	struct uffd_msg events[MAX_EVENTS];
	uint32_t last_ptid;  /* THREAD_ID of the last fault */
	uint64_t last_flags; /* flags of the last fault */
};

static void note_error(struct handler *h, int rc)
{
	int zero = 0;

	atomic_compare_exchange_strong(&h->first_rc, &zero, rc);
	atomic_fetch_add(&h->errors, 1);
}

static void serve_fault(struct handler *h, const struct uffd_msg *m)
{
	uintptr_t addr = m->arg.pagefault.address & ~(uintptr_t)(PG - 1);
	size_t idx = (addr - (uintptr_t)h->base) / PG;
	uint64_t flags = m->arg.pagefault.flags;
	char page[PG] __attribute__((aligned(64)));
	size_t done = 0;
	int rc;

	h->last_ptid = m->arg.pagefault.feat.ptid;
	h->last_flags = flags;
	if (flags & UFFD_PAGEFAULT_FLAG_WP) {
		atomic_fetch_add(&h->wp, 1);
		/* Clearing write protection wakes the writer. */
		rc =
		    kvp_uffd_writeprotect(h->u, (void *)addr, PG, false, false);
		if (rc)
			note_error(h, rc);
		return;
	}
	atomic_fetch_add(&h->missing, 1);
	switch (h->serve) {
	case SERVE_COPY:
	case SERVE_COPY_WP:
	case SERVE_COPY_DONTWAKE:
		kvp_test_fill(page, PG, idx, 0);
		rc = kvp_uffd_copy(h->u, (void *)addr, page, PG,
				   h->serve == SERVE_COPY_WP,
				   h->serve == SERVE_COPY_DONTWAKE, &done);
		break;
	case SERVE_ZERO:
		rc = kvp_uffd_zeropage(h->u, (void *)addr, PG, false, &done);
		break;
	case SERVE_MOVE:
		rc = kvp_uffd_move(h->u, (void *)addr, h->src + idx * PG, PG, 0,
				   &done);
		break;
	case SERVE_CONTINUE:
		rc = kvp_uffd_continue(h->u, (void *)addr, PG, false, false,
				       &done);
		break;
	case SERVE_POISON:
		rc = kvp_uffd_poison(h->u, (void *)addr, PG, false, &done);
		break;
	default:
		rc = -EINVAL;
	}
	/* EEXIST: a concurrent fault on the same page was served first. */
	if (rc == -EEXIST) {
		rc = kvp_uffd_wake(h->u, (void *)addr, PG);
		done = PG;
	}
	if (rc || done != PG)
		note_error(h, rc ? rc : -EIO);
}

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct pollfd pfd[2] = {
		{ .fd = h->u->fd, .events = POLLIN },
		{ .fd = h->stop_fd, .events = POLLIN },
	};

	for (;;) {
		struct uffd_msg msgs[8];
		size_t n;
		int rc;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			note_error(h, -errno);
			break;
		}
		if (pfd[0].revents & POLLIN) {
			rc = kvp_uffd_read(h->u, msgs, 8, &n);
			if (rc == -EAGAIN)
				continue;
			if (rc) {
				note_error(h, rc);
				break;
			}
			for (size_t i = 0; i < n; i++) {
				if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
					serve_fault(h, &msgs[i]);
				else if (h->nevents < MAX_EVENTS)
					h->events[h->nevents++] = msgs[i];
			}
			continue;
		}
		if (pfd[1].revents & POLLIN)
			break;
		if (pfd[0].revents & (POLLERR | POLLHUP))
			break;
	}
	return NULL;
}

static void handler_start_src(struct handler *h, struct kvp_uffd *u,
			      enum serve serve, void *base, size_t len,
			      void *src)
{
	memset(h, 0, sizeof(*h));
	h->u = u;
	h->src = src;
	h->serve = serve;
	h->base = base;
	h->len = len;
	h->stop_fd = eventfd(0, EFD_CLOEXEC);
	ck_assert_int_ge(h->stop_fd, 0);
	ck_assert_int_eq(pthread_create(&h->thread, NULL, handler_main, h), 0);
}

static void handler_start(struct handler *h, struct kvp_uffd *u,
			  enum serve serve, void *base, size_t len)
{
	handler_start_src(h, u, serve, base, len, NULL);
}

static void handler_stop(struct handler *h)
{
	uint64_t one = 1;

	ck_assert_int_eq(write(h->stop_fd, &one, sizeof(one)), sizeof(one));
	ck_assert_int_eq(pthread_join(h->thread, NULL), 0);
	close(h->stop_fd);
	ck_assert_msg(atomic_load(&h->errors) == 0,
		      "handler: %d resolve calls failed, first %d (%s)",
		      atomic_load(&h->errors), atomic_load(&h->first_rc),
		      strerror(-atomic_load(&h->first_rc)));
}

/* A fresh registered range of @npages pages (aligned to @align). */
static char *registered(struct kvp_uffd *u, size_t len, size_t align,
			uint64_t mode)
{
	void *p;

	ck_assert_int_eq(kvp_mem_reserve(len, align, align >= HUGE, &p), 0);
	ck_assert_int_eq(kvp_uffd_register(u, p, len, mode, NULL), 0);
	return p;
}

/* ---- the handshake ---- */

START_TEST(test_supported)
{
	uint64_t features = 0, ioctls = 0;

	ck_assert_int_eq(kvp_uffd_supported(&features, &ioctls), 0);
	/* Every kernel this project runs on has these (4.11+). */
	ck_assert(features & UFFD_FEATURE_EVENT_REMOVE);
	ck_assert(features & UFFD_FEATURE_EVENT_UNMAP);
	ck_assert(ioctls & (1ULL << _UFFDIO_API));
	ck_assert(ioctls & (1ULL << _UFFDIO_REGISTER));
	ck_assert_int_eq(kvp_uffd_supported(NULL, NULL), 0);
}
END_TEST

START_TEST(test_open_full)
{
	struct kvp_uffd u;
	int fl;

	ck_assert_int_eq(kvp_uffd_open(&u, KVP_UFFD_REQUIRE_FULL), 0);
	ck_assert_int_ge(u.fd, 0);
	ck_assert_int_eq(u.mode, KVP_UFFD_FULL);
	ck_assert_ptr_nonnull(u.source);
	fl = fcntl(u.fd, F_GETFL);
	ck_assert(fl & O_NONBLOCK);
	ck_assert(fcntl(u.fd, F_GETFD) & FD_CLOEXEC);
	kvp_uffd_close(&u);
	ck_assert_int_eq(u.fd, -1);
	kvp_uffd_close(&u); /* safe twice */
}
END_TEST

START_TEST(test_open_via)
{
	struct kvp_uffd u;

	ck_assert_int_eq(kvp_uffd_open_via(&u, KVP_UFFD_VIA_SYSCALL), 0);
	ck_assert_int_eq(u.mode, KVP_UFFD_FULL);
	kvp_uffd_close(&u);
	ck_assert_int_eq(kvp_uffd_open_via(&u, KVP_UFFD_VIA_SYSCALL_USER), 0);
	ck_assert_int_eq(u.mode, KVP_UFFD_USER_ONLY);
	kvp_uffd_close(&u);
	if (access("/dev/userfaultfd", F_OK) == 0) {
		ck_assert_int_eq(kvp_uffd_open_via(&u, KVP_UFFD_VIA_DEVICE), 0);
		ck_assert_int_eq(u.mode, KVP_UFFD_FULL);
		ck_assert_str_eq(u.source, "/dev/userfaultfd");
		ck_assert_int_eq(kvp_uffd_api(&u, 0, 0), 0);
		kvp_uffd_close(&u);
	}
	ck_assert_int_eq(kvp_uffd_open_via(&u, 99), -EINVAL);
	ck_assert_int_eq(u.fd, -1);
}
END_TEST

START_TEST(test_api_grants)
{
	struct kvp_uffd u;
	const uint64_t want =
	    UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_THREAD_ID;

	ck_assert_int_eq(kvp_uffd_open(&u, 0), 0);
	ck_assert_int_eq(kvp_uffd_api(&u, want, UFFD_FEATURE_EVENT_REMOVE), 0);
	/* Granted is what was asked, not all the kernel offers. */
	ck_assert_uint_eq(u.features, want & supported);
	ck_assert(u.ioctls & (1ULL << _UFFDIO_REGISTER));
	ck_assert(u.ioctls & (1ULL << _UFFDIO_UNREGISTER));
	/* One handshake per descriptor. */
	ck_assert_int_eq(kvp_uffd_api(&u, want, 0), -EINVAL);
	kvp_uffd_close(&u);

	/* The fixture's descriptor got every wanted bit the kernel has. */
	ck_assert_uint_eq(uf.features, WANTED & supported);
}
END_TEST

START_TEST(test_api_required_missing)
{
	struct kvp_uffd u;
	const uint64_t madeup = 1ULL << 62; /* no kernel has this feature */

	ck_assert(!(supported & madeup));
	ck_assert_int_eq(kvp_uffd_open(&u, 0), 0);
	ck_assert_int_eq(kvp_uffd_api(&u, UFFD_FEATURE_EVENT_REMOVE, madeup),
			 -EOPNOTSUPP);
	ck_assert_uint_eq(u.features, 0);
	/* A made-up wanted bit is simply not granted. */
	ck_assert_int_eq(
	    kvp_uffd_api(&u, madeup | UFFD_FEATURE_EVENT_REMOVE, 0), 0);
	ck_assert_uint_eq(u.features, UFFD_FEATURE_EVENT_REMOVE);
	kvp_uffd_close(&u);
}
END_TEST

START_TEST(test_feature_names)
{
	ck_assert_str_eq(kvp_uffd_feature_name(UFFD_FEATURE_MOVE), "MOVE");
	ck_assert_str_eq(kvp_uffd_feature_name(UFFD_FEATURE_POISON), "POISON");
	ck_assert_str_eq(kvp_uffd_feature_name(UFFD_FEATURE_WP_ASYNC),
			 "WP_ASYNC");
	ck_assert_str_eq(kvp_uffd_feature_name(UFFD_FEATURE_MINOR_SHMEM),
			 "MINOR_SHMEM");
	ck_assert_ptr_null(kvp_uffd_feature_name(1ULL << 62));
	ck_assert_ptr_null(kvp_uffd_feature_name(0));
}
END_TEST

START_TEST(test_register_ioctls)
{
	uint64_t ioctls = 0;
	void *p;

	ck_assert_int_eq(kvp_mem_reserve(16 * PG, PG, false, &p), 0);
	ck_assert_int_eq(kvp_uffd_register(&uf, p, 16 * PG,
					   UFFDIO_REGISTER_MODE_MISSING,
					   &ioctls),
			 0);
	ck_assert(ioctls & (1ULL << _UFFDIO_COPY));
	ck_assert(ioctls & (1ULL << _UFFDIO_ZEROPAGE));
	ck_assert(ioctls & (1ULL << _UFFDIO_WAKE));
	if (uf.features & UFFD_FEATURE_MOVE)
		ck_assert(ioctls & (1ULL << _UFFDIO_MOVE));
	if (uf.features & UFFD_FEATURE_POISON)
		ck_assert(ioctls & (1ULL << _UFFDIO_POISON));
	ck_assert_int_eq(kvp_uffd_unregister(&uf, p, 16 * PG), 0);
	/* Misaligned ranges are refused. */
	ck_assert_int_eq(kvp_uffd_register(&uf, (char *)p + 1, PG,
					   UFFDIO_REGISTER_MODE_MISSING, NULL),
			 -EINVAL);
	ck_assert_int_eq(kvp_uffd_register(&uf, p, PG + 1,
					   UFFDIO_REGISTER_MODE_MISSING, NULL),
			 -EINVAL);
	/* MINOR is for shmem and hugetlbfs, not private anonymous memory. */
	ck_assert_int_eq(
	    kvp_uffd_register(&uf, p, PG, UFFDIO_REGISTER_MODE_MINOR, NULL),
	    -EINVAL);
	kvp_mem_release(p, 16 * PG);
}
END_TEST

START_TEST(test_read_empty)
{
	struct uffd_msg m[4];
	size_t n = 99;

	ck_assert_int_eq(kvp_uffd_read(&uf, m, 4, &n), -EAGAIN);
	ck_assert_uint_eq(n, 0);
}
END_TEST

/* ---- the resolving ioctls, served by the handler ---- */

START_TEST(test_copy)
{
	const size_t npages = 16;
	struct handler h;
	char *p =
	    registered(&uf, npages * PG, PG, UFFDIO_REGISTER_MODE_MISSING);

	handler_start(&h, &uf, SERVE_COPY, p, npages * PG);
	/* Touch every other page, reading. */
	for (size_t i = 0; i < npages; i += 2)
		ck_assert_msg(kvp_test_check(p + i * PG, PG, i, 0) < 0,
			      "page %zu", i);
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), npages / 2);
	ck_assert_int_eq(atomic_load(&h.wp), 0);
	ck_assert_uint_eq(kvp_test_resident_pages(p, npages * PG), npages / 2);
	if (uf.features & UFFD_FEATURE_THREAD_ID)
		ck_assert_uint_eq(h.last_ptid, (uint32_t)syscall(SYS_gettid));
	ck_assert(!(h.last_flags & UFFD_PAGEFAULT_FLAG_WRITE));
	kvp_mem_release(p, npages * PG);
}
END_TEST

START_TEST(test_copy_write_fault)
{
	struct handler h;
	char *p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);

	handler_start(&h, &uf, SERVE_COPY, p, 4 * PG);
	/* A write fault is served as well; the write lands on the copy. */
	p[PG + 8] = 0x5a;
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 1);
	ck_assert(h.last_flags & UFFD_PAGEFAULT_FLAG_WRITE);
	ck_assert_int_eq(p[PG + 8], 0x5a);
	ck_assert_uint_eq(*(uint64_t *)(p + PG), kvp_test_pattern(1, 0));
	kvp_mem_release(p, 4 * PG);
}
END_TEST

START_TEST(test_copy_wp)
{
	struct handler h;
	char *p;

	if (!have(UFFD_FEATURE_PAGEFAULT_FLAG_WP, "copy_wp"))
		return;
	p = registered(&uf, 4 * PG, PG,
		       UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
	handler_start(&h, &uf, SERVE_COPY_WP, p, 4 * PG);
	/* read: missing fault, WP copy */
	ck_assert(kvp_test_check(p + 2 * PG, PG, 2, 0) < 0);
	ck_assert_int_eq(atomic_load(&h.wp), 0);
	p[2 * PG] = 7; /* write: a WP fault, cleared by the handler */
	ck_assert_int_eq(atomic_load(&h.wp), 1);
	p[2 * PG + 1] = 8; /* no longer protected */
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 1);
	ck_assert_int_eq(atomic_load(&h.wp), 1);
	ck_assert(h.last_flags & UFFD_PAGEFAULT_FLAG_WP);
	ck_assert_int_eq(p[2 * PG], 7);
	ck_assert_int_eq(p[2 * PG + 1], 8);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

START_TEST(test_zeropage)
{
	struct handler h;
	char *p = registered(&uf, 8 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	size_t done = 1;

	handler_start(&h, &uf, SERVE_ZERO, p, 8 * PG);
	for (size_t i = 0; i < 4; i++)
		ck_assert(kvp_test_is_zero(p + i * PG, PG));
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 4);
	/* Directly, on pages nobody touched: no fault, zeros. */
	ck_assert_int_eq(
	    kvp_uffd_zeropage(&uf, p + 4 * PG, 4 * PG, true, &done), 0);
	ck_assert_uint_eq(done, 4 * PG);
	ck_assert(kvp_test_is_zero(p + 7 * PG, PG));
	kvp_mem_release(p, 8 * PG);
}
END_TEST

START_TEST(test_move_4k)
{
	const size_t npages = 8;
	struct handler h;
	char *p, *src;

	if (!have(UFFD_FEATURE_MOVE, "move_4k"))
		return;
	p = registered(&uf, npages * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	/* The source: any private anonymous range, not registered. */
	ck_assert_int_eq(kvp_mem_reserve(npages * PG, PG, false, (void **)&src),
			 0);
	for (size_t i = 0; i < npages; i++)
		kvp_test_fill(src + i * PG, PG, i, 0);
	handler_start_src(&h, &uf, SERVE_MOVE, p, npages * PG, src);
	for (size_t i = 0; i < npages; i++)
		ck_assert_msg(kvp_test_check(p + i * PG, PG, i, 0) < 0,
			      "page %zu", i);
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), npages);
	/* The source became a hole: nothing resident, reads zeros. */
	ck_assert_uint_eq(kvp_test_resident_pages(src, npages * PG), 0);
	ck_assert(kvp_test_is_zero(src + 3 * PG, PG));
	kvp_mem_release(src, npages * PG);
	kvp_mem_release(p, npages * PG);
}
END_TEST

START_TEST(test_move_2m)
{
	struct handler h;
	char *p, *src;
	size_t done = 0;
	long src_huge;

	if (!have(UFFD_FEATURE_MOVE, "move_2m"))
		return;
	p = registered(&uf, HUGE, HUGE, UFFDIO_REGISTER_MODE_MISSING);
	ck_assert_uint_eq((uintptr_t)p % HUGE, 0);
	ck_assert_int_eq(kvp_mem_reserve(HUGE, HUGE, true, (void **)&src), 0);
	ck_assert_uint_eq((uintptr_t)src % HUGE, 0);
	for (size_t i = 0; i < HUGE / PG; i++)
		kvp_test_fill(src + i * PG, PG, i, 0);
	src_huge = anon_huge_kb(src);

	/* Moved without a fault (the prefetch path): no fault follows. */
	handler_start(&h, &uf, SERVE_COPY, p, HUGE);
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, HUGE, 0, &done), 0);
	ck_assert_uint_eq(done, HUGE);
	for (size_t i = 0; i < HUGE / PG; i++)
		ck_assert_msg(kvp_test_check(p + i * PG, PG, i, 0) < 0,
			      "page %zu", i);
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 0);
	ck_assert_uint_eq(kvp_test_resident_pages(src, HUGE), 0);
	ck_assert(kvp_test_is_zero(src + 100 * PG, PG));
	/* A THP source moves as one PMD: the destination is huge too. */
	if (src_huge == 2048)
		ck_assert_int_eq(anon_huge_kb(p), 2048);
	else
		printf("move_2m: the source was not a THP (%ld kB huge)\n",
		       src_huge);
	kvp_mem_release(src, HUGE);
	kvp_mem_release(p, HUGE);
}
END_TEST

START_TEST(test_move_holes)
{
	char *p, *src;
	size_t done = 99;

	if (!have(UFFD_FEATURE_MOVE, "move_holes"))
		return;
	p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	ck_assert_int_eq(kvp_mem_reserve(4 * PG, PG, false, (void **)&src), 0);
	/* A hole in the source is refused unless ALLOW_SRC_HOLES. */
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, PG, 0, &done), -ENOENT);
	ck_assert_uint_eq(done, 0);
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, PG,
				       UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &done),
			 0);
	ck_assert_uint_eq(done, PG);
	/* A destination already present is -EEXIST. */
	kvp_test_fill(src + PG, PG, 1, 0);
	ck_assert_int_eq(kvp_uffd_zeropage(&uf, p + PG, PG, false, NULL), 0);
	ck_assert_int_eq(kvp_uffd_move(&uf, p + PG, src + PG, PG, 0, &done),
			 -EEXIST);
	ck_assert_uint_eq(done, 0);
	ck_assert(kvp_test_check(src + PG, PG, 1, 0) <
		  0); /* the source stays */
	/* The destination must be registered with this descriptor. */
	ck_assert_int_lt(
	    kvp_uffd_move(&uf, src + 2 * PG, src + PG, PG, 0, &done), 0);
	kvp_mem_release(src, 4 * PG);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

/*
 * After a move that the kernel did not count (6.18 fails with EEXIST after
 * moving pages), the page tables show the pages at dst and holes at src:
 * kvp_uffd_move counts that run as done, so that the caller goes on past
 * it instead of taking its own pages for a failure.
 */
START_TEST(test_move_counts_pages_already_moved)
{
	char *p, *src;
	size_t done = 99;

	if (!have(UFFD_FEATURE_MOVE, "move_counts_pages_already_moved"))
		return;
	p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	ck_assert_int_eq(kvp_mem_reserve(4 * PG, PG, false, (void **)&src), 0);
	/* Pages 0 and 1 "moved already": at dst, holes at src. */
	for (size_t i = 0; i < 4; i++)
		kvp_test_fill(src + i * PG, PG, i, 0);
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, 2 * PG, 0, &done), 0);
	ck_assert_uint_eq(done, 2 * PG);
	/* The kernel says EEXIST at page 0; two pages are done, the rest is
	 * for another call. */
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, 4 * PG, 0, &done),
			 -EAGAIN);
	ck_assert_uint_eq(done, 2 * PG);
	ck_assert_int_eq(kvp_uffd_move(&uf, p + done, src + done, 2 * PG, 0,
				       &done),
			 0);
	ck_assert_uint_eq(done, 2 * PG);
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(kvp_test_check(p + i * PG, PG, i, 0) < 0,
			      "page %zu", i);
	/* All of it there already: done, not an error. */
	ck_assert_int_eq(kvp_uffd_move(&uf, p, src, 4 * PG, 0, &done), 0);
	ck_assert_uint_eq(done, 4 * PG);
	/* A real EEXIST (the source still holds its page) stays one. */
	kvp_test_fill(src + PG, PG, 7, 0);
	ck_assert_int_eq(kvp_uffd_move(&uf, p + PG, src + PG, PG, 0, &done),
			 -EEXIST);
	ck_assert_uint_eq(done, 0);
	ck_assert(kvp_test_check(src + PG, PG, 7, 0) < 0);
	ck_assert(kvp_test_check(p + PG, PG, 1, 0) < 0);
	kvp_mem_release(src, 4 * PG);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

/*
 * Linux 6.18's batched UFFDIO_MOVE keeps a transient EAGAIN and retries the
 * same address; with ALLOW_SRC_HOLES, a retry on a page dropped meanwhile
 * "moves" the hole and retries again, for ever, in the kernel.
 * kvp_uffd_move never passes the mode to the kernel.  Here moves race a
 * thread that drops source pages, for up to 4 s: every call returns, and
 * each page that arrived holds the bytes written to it.  (With the mode passed
 * on, such a loop hung within 2,000 to 72,000 moves on that kernel.)
 */
#define RACE_PAGES 16
static atomic_bool race_stop;

static void *drop_src_pages(void *arg)
{
	char *src = arg;
	unsigned seed = 1;

	while (!atomic_load(&race_stop)) {
		(void)madvise(src + (rand_r(&seed) % RACE_PAGES) * PG, PG,
			      MADV_DONTNEED);
		if (rand_r(&seed) % 4 == 0)
			sched_yield();
	}
	return NULL;
}

START_TEST(test_move_holes_race)
{
	const size_t len = RACE_PAGES * PG;
	unsigned char in[RACE_PAGES];
	struct timespec t0, t;
	long moves, arrived = 0;
	pthread_t th;
	char *p, *src;

	if (!have(UFFD_FEATURE_MOVE, "move_holes_race"))
		return;
	p = registered(&uf, len, PG, UFFDIO_REGISTER_MODE_MISSING);
	ck_assert_int_eq(kvp_mem_reserve(len, PG, false, (void **)&src), 0);
	atomic_store(&race_stop, false);
	ck_assert_int_eq(pthread_create(&th, NULL, drop_src_pages, src), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (moves = 0; moves < 100000; moves++) {
		int c = (int)(moves % 251) + 1, err;
		size_t done = 0;

		memset(src, c, len);
		do { /* on past a partial move, as the callers go */
			size_t d = 0;

			err = kvp_uffd_move(&uf, p + done, src + done,
					    len - done,
					    UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
					    &d);
			done += d;
		} while (err == -EAGAIN && done < len);
		ck_assert_msg(err == 0 && done == len, "move %ld: %s, %zu done",
			      moves, strerror(-err), done);
		/* What is counted done has left the source (the dropper only
		 * makes holes). */
		ck_assert_int_eq(mincore(src, len, in), 0);
		for (size_t i = 0; i < RACE_PAGES; i++)
			ck_assert_msg(!(in[i] & 1),
				      "move %ld: source page %zu still there",
				      moves, i);
		ck_assert_int_eq(mincore(p, len, in), 0);
		for (size_t i = 0; i < RACE_PAGES; i++)
			if (in[i] & 1) {
				/* (A drop during the memset leaves zeros
				 * before the bytes written after it.) */
				ck_assert_msg(p[i * PG + PG - 1] == (char)c &&
						  (!p[i * PG] ||
						   p[i * PG] == (char)c),
					      "move %ld, page %zu", moves, i);
				arrived++;
			}
		ck_assert_int_eq(madvise(p, len, MADV_DONTNEED), 0);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec >= 4)
			break;
	}
	atomic_store(&race_stop, true);
	pthread_join(th, NULL);
	ck_assert_int_gt(arrived, 0);
	printf("move_holes_race: %ld moves, %ld pages arrived\n", moves,
	       arrived);
	kvp_mem_release(src, len);
	kvp_mem_release(p, len);
}
END_TEST

START_TEST(test_writeprotect)
{
	struct handler h;
	char *p;

	if (!have(UFFD_FEATURE_PAGEFAULT_FLAG_WP, "writeprotect"))
		return;
	p = registered(&uf, 4 * PG, PG,
		       UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP);
	handler_start(&h, &uf, SERVE_COPY, p, 4 * PG);
	for (size_t i = 0; i < 4; i++)
		p[i * PG] = 1; /* resident, writable */
	ck_assert_int_eq(atomic_load(&h.missing), 4);
	ck_assert_int_eq(kvp_uffd_writeprotect(&uf, p, 4 * PG, true, false), 0);
	ck_assert_int_eq(p[PG], 1); /* reads are not faults */
	ck_assert_int_eq(atomic_load(&h.wp), 0);
	p[PG] = 2; /* a WP fault message; the handler clears that page */
	ck_assert_int_eq(atomic_load(&h.wp), 1);
	p[PG + 1] = 3;
	ck_assert_int_eq(atomic_load(&h.wp), 1);
	/* Clearing the rest by hand: writes then take no fault. */
	ck_assert_int_eq(kvp_uffd_writeprotect(&uf, p, 4 * PG, false, false),
			 0);
	p[3 * PG] = 4;
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.wp), 1);
	ck_assert(h.last_flags & UFFD_PAGEFAULT_FLAG_WP);
	ck_assert(h.last_flags & UFFD_PAGEFAULT_FLAG_WRITE);
	ck_assert_int_eq(p[PG], 2);
	ck_assert_int_eq(p[3 * PG], 4);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

START_TEST(test_continue)
{
	const size_t len = 8 * PG;
	struct handler h;
	char *mirror, *p;
	size_t done;
	int fd;

	if (!have(UFFD_FEATURE_MINOR_SHMEM, "continue"))
		return;
	ck_assert_int_eq(kvp_mem_memfd("kvp-test-minor", len, &fd), 0);
	mirror = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(mirror != MAP_FAILED && p != MAP_FAILED);
	/* The page cache is filled through the unregistered mirror. */
	for (size_t i = 0; i < 8; i++)
		kvp_test_fill(mirror + i * PG, PG, i, 0);
	ck_assert_int_eq(
	    kvp_uffd_register(&uf, p, len, UFFDIO_REGISTER_MODE_MINOR, NULL),
	    0);
	handler_start(&h, &uf, SERVE_CONTINUE, p, len);
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(kvp_test_check(p + i * PG, PG, i, 0) < 0,
			      "page %zu", i);
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 4);
	ck_assert(h.last_flags & UFFD_PAGEFAULT_FLAG_MINOR);
	/* Directly: map the rest, then a present page is -EEXIST. */
	ck_assert_int_eq(
	    kvp_uffd_continue(&uf, p + 4 * PG, 4 * PG, false, false, &done), 0);
	ck_assert_uint_eq(done, 4 * PG);
	ck_assert(kvp_test_check(p + 7 * PG, PG, 7, 0) < 0);
	ck_assert_int_eq(kvp_uffd_continue(&uf, p, PG, false, false, &done),
			 -EEXIST);
	munmap(p, len);
	munmap(mirror, len);
	close(fd);
}
END_TEST

static sigjmp_buf bus_jmp;
static volatile sig_atomic_t bus_seen;

static void on_sigbus(int sig)
{
	bus_seen++;
	siglongjmp(bus_jmp, 1);
}

/* Read one byte at @addr; true if the read raised SIGBUS. */
static bool read_sigbus(volatile char *addr)
{
	struct sigaction sa = { .sa_handler = on_sigbus }, old;
	volatile bool got = false;

	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGBUS, &sa, &old), 0);
	if (sigsetjmp(bus_jmp, 1) == 0)
		(void)*addr;
	else
		got = true;
	sigaction(SIGBUS, &old, NULL);
	return got;
}

START_TEST(test_poison)
{
	struct handler h;
	char *p;
	size_t done = 0;

	if (!have(UFFD_FEATURE_POISON, "poison"))
		return;
	p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	/* Directly: the page is poisoned before anyone touches it. */
	ck_assert_int_eq(kvp_uffd_poison(&uf, p, PG, false, &done), 0);
	ck_assert_uint_eq(done, PG);
	handler_start(&h, &uf, SERVE_COPY, p, 4 * PG);
	ck_assert(read_sigbus(p + 10));
	ck_assert(read_sigbus(p)); /* every access, not only the first */
	ck_assert_int_eq(atomic_load(&h.missing), 0);
	handler_stop(&h);

	/* Poisoned by the handler while the faulting thread waits. */
	handler_start(&h, &uf, SERVE_POISON, p, 4 * PG);
	ck_assert(read_sigbus(p + 2 * PG));
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 1);

	/* The other pages are unaffected, and a present page is -EEXIST. */
	ck_assert_int_eq(kvp_uffd_zeropage(&uf, p + PG, PG, false, NULL), 0);
	ck_assert(kvp_test_is_zero(p + PG, PG));
	ck_assert_int_eq(kvp_uffd_poison(&uf, p + PG, PG, false, &done),
			 -EEXIST);
	ck_assert_int_eq(bus_seen, 3);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

static void *touch_main(void *arg)
{
	return (void *)(uintptr_t) * (volatile uint64_t *)arg;
}

START_TEST(test_wake)
{
	struct handler h;
	pthread_t t;
	void *ret;
	char *p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	struct uffd_msg m;
	size_t n;

	/*
	 * With DONTWAKE the page is installed but the faulting thread keeps
	 * sleeping until UFFDIO_WAKE (without the wake this test hangs and
	 * its timeout fails it).  No handler thread: the test reads the
	 * message itself.
	 */
	ck_assert_int_eq(pthread_create(&t, NULL, touch_main, p + PG), 0);
	for (;;) {
		struct pollfd pfd = { .fd = uf.fd, .events = POLLIN };

		ck_assert_int_eq(poll(&pfd, 1, -1), 1);
		if (kvp_uffd_read(&uf, &m, 1, &n) == 0)
			break;
	}
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(m.event, UFFD_EVENT_PAGEFAULT);
	ck_assert_uint_eq(m.arg.pagefault.address & ~(PG - 1),
			  (uintptr_t)(p + PG));
	handler_start(&h, &uf, SERVE_COPY, p, 4 * PG); /* for other faults */
	{
		char page[PG];

		kvp_test_fill(page, PG, 1, 0);
		ck_assert_int_eq(
		    kvp_uffd_copy(&uf, p + PG, page, PG, false, true, NULL), 0);
	}
	ck_assert_int_eq(kvp_uffd_wake(&uf, p + PG, PG), 0);
	ck_assert_int_eq(pthread_join(t, &ret), 0);
	ck_assert_uint_eq((uintptr_t)ret, (uintptr_t)kvp_test_pattern(1, 0));
	handler_stop(&h);
	/* The waiter was woken by the wake, not by a second fault. */
	ck_assert_int_eq(atomic_load(&h.missing), 0);
	kvp_mem_release(p, 4 * PG);
}
END_TEST

/* ---- error conventions ---- */

START_TEST(test_eexist)
{
	char page[PG];
	char *p = registered(&uf, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	size_t done = 99;

	kvp_test_fill(page, PG, 0, 0);
	ck_assert_int_eq(kvp_uffd_copy(&uf, p, page, PG, false, false, &done),
			 0);
	ck_assert_uint_eq(done, PG);
	/* Copy onto a present page: already resolved, nothing done. */
	kvp_test_fill(page, PG, 9, 0);
	ck_assert_int_eq(kvp_uffd_copy(&uf, p, page, PG, false, false, &done),
			 -EEXIST);
	ck_assert_uint_eq(done, 0);
	ck_assert(kvp_test_check(p, PG, 0, 0) < 0); /* not overwritten */
	ck_assert_int_eq(kvp_uffd_zeropage(&uf, p, PG, false, &done), -EEXIST);
	/*
	 * A range whose later page is present: the kernel resolves the
	 * pages before it and reports -EAGAIN with the partial count.
	 */
	ck_assert_int_eq(kvp_uffd_zeropage(&uf, p + 2 * PG, PG, false, NULL),
			 0);
	{
		static char two[2 * PG];

		kvp_test_fill(two, PG, 1, 0);
		ck_assert_int_eq(kvp_uffd_copy(&uf, p + PG, two, 2 * PG, false,
					       false, &done),
				 -EAGAIN);
		ck_assert_uint_eq(done, PG);
		ck_assert(kvp_test_check(p + PG, PG, 1, 0) < 0);
	}
	kvp_mem_release(p, 4 * PG);
}
END_TEST

START_TEST(test_unregistered)
{
	char page[PG];
	void *p, *q;
	size_t done = 99;

	kvp_test_fill(page, PG, 0, 0);
	ck_assert_int_eq(kvp_mem_reserve(4 * PG, PG, false, &p), 0);
	/* Mapped but not registered: the mapping is not ours. */
	ck_assert_int_eq(kvp_uffd_copy(&uf, p, page, PG, false, false, &done),
			 -ENOENT);
	ck_assert_uint_eq(done, 0);
	ck_assert_int_eq(kvp_uffd_zeropage(&uf, p, PG, false, NULL), -ENOENT);
	/* Not mapped at all: the mapping went away. */
	q = (char *)p + 2 * PG;
	kvp_mem_release(q, 2 * PG);
	ck_assert_int_eq(kvp_uffd_copy(&uf, q, page, PG, false, false, NULL),
			 -ENOENT);
	/* Malformed ranges are -EINVAL. */
	ck_assert_int_eq(
	    kvp_uffd_copy(&uf, (char *)p + 1, page, PG, false, false, NULL),
	    -EINVAL);
	ck_assert_int_eq(kvp_uffd_copy(&uf, p, page, 0, false, false, NULL),
			 -EINVAL);
	ck_assert_int_eq(kvp_uffd_wake(&uf, p, 3), -EINVAL);
	ck_assert_int_eq(kvp_uffd_unregister(&uf, (char *)p + 1, PG), -EINVAL);
	kvp_mem_release(p, 2 * PG);
}
END_TEST

/*
 * The process that owns the registered mm exits: the resolving calls then
 * fail with -ESRCH.  The child registers and passes its descriptor back
 * over a socket.
 */
static int recv_fd(int sock)
{
	char cbuf[CMSG_SPACE(sizeof(int))], b;
	struct iovec iov = { .iov_base = &b, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	int fd;

	if (recvmsg(sock, &mh, 0) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&mh);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(c), sizeof(fd));
	return fd;
}

static void send_fd(int sock, int fd, uintptr_t addr)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 }, b = 1;
	struct iovec iov = { .iov_base = &b, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(fd));
	if (sendmsg(sock, &mh, 0) != 1 ||
	    write(sock, &addr, sizeof(addr)) != sizeof(addr))
		_exit(2);
}

START_TEST(test_esrch)
{
	struct kvp_uffd u = { .fd = -1 };
	char page[PG];
	uintptr_t addr;
	int sv[2], status;
	pid_t pid;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_uffd c;
		void *p;

		if (kvp_uffd_open(&c, 0) || kvp_uffd_api(&c, 0, 0) ||
		    kvp_mem_reserve(PG, PG, false, &p) ||
		    kvp_uffd_register(&c, p, PG, UFFDIO_REGISTER_MODE_MISSING,
				      NULL))
			_exit(1);
		send_fd(sv[1], c.fd, (uintptr_t)p);
		_exit(0);
	}
	u.fd = recv_fd(sv[0]);
	ck_assert_int_ge(u.fd, 0);
	ck_assert_int_eq(read(sv[0], &addr, sizeof(addr)), sizeof(addr));
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	kvp_test_fill(page, PG, 0, 0);
	ck_assert_int_eq(
	    kvp_uffd_copy(&u, (void *)addr, page, PG, false, false, NULL),
	    -ESRCH);
	ck_assert_int_eq(kvp_uffd_zeropage(&u, (void *)addr, PG, false, NULL),
			 -ESRCH);
	kvp_uffd_close(&u);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* ---- non-cooperative events ---- */

START_TEST(test_events_remove_unmap)
{
	const uint64_t ev =
	    UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP;
	struct kvp_uffd u;
	struct handler h;
	char *p;
	int removes = 0, unmaps = 0;

	ck_assert_int_eq(kvp_uffd_open(&u, 0), 0);
	ck_assert_int_eq(kvp_uffd_api(&u, ev, ev), 0);
	p = registered(&u, 8 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	/* madvise and munmap wait until a reader took the message. */
	handler_start(&h, &u, SERVE_COPY, p, 8 * PG);
	for (size_t i = 0; i < 8; i++)
		ck_assert(kvp_test_check(p + i * PG, PG, i, 0) < 0);
	ck_assert_int_eq(kvp_mem_advise(p + 2 * PG, 2 * PG, MADV_DONTNEED), 0);
	/* Removed pages fault again and are served again. */
	ck_assert(kvp_test_check(p + 2 * PG, PG, 2, 0) < 0);
	ck_assert_int_eq(kvp_mem_release(p + 6 * PG, 2 * PG), 0);
	handler_stop(&h);
	ck_assert_int_eq(atomic_load(&h.missing), 9);
	for (int i = 0; i < h.nevents; i++) {
		const struct uffd_msg *m = &h.events[i];

		if (m->event == UFFD_EVENT_REMOVE) {
			removes++;
			ck_assert_uint_eq(m->arg.remove.start,
					  (uintptr_t)(p + 2 * PG));
			ck_assert_uint_eq(m->arg.remove.end,
					  (uintptr_t)(p + 4 * PG));
		} else if (m->event == UFFD_EVENT_UNMAP) {
			unmaps++;
			ck_assert_uint_eq(m->arg.remove.start,
					  (uintptr_t)(p + 6 * PG));
			ck_assert_uint_eq(m->arg.remove.end,
					  (uintptr_t)(p + 8 * PG));
		}
	}
	ck_assert_int_eq(removes, 1);
	ck_assert_int_eq(unmaps, 1);
	/* Close first: an unmap with nobody reading would wait. */
	kvp_uffd_close(&u);
	kvp_mem_release(p, 6 * PG);
}
END_TEST

/* ---- user-mode-only descriptors ---- */

/*
 * read(2) from a pipe into a non-resident registered page: a full-mode
 * descriptor serves the kernel's fault; a user-mode-only one does not see
 * it, and read(2) fails with EFAULT.  Returns read's result or -errno.
 */
static long pipe_read_into(struct kvp_uffd *u, int *faults, char *fill)
{
	struct handler h;
	char data[PG];
	char *p;
	int pfd[2];
	long r;

	ck_assert_int_eq(kvp_uffd_api(u, 0, 0), 0);
	p = registered(u, 4 * PG, PG, UFFDIO_REGISTER_MODE_MISSING);
	handler_start(&h, u, SERVE_COPY, p, 4 * PG);
	/* A user-space touch is served in both modes. */
	ck_assert(kvp_test_check(p, PG, 0, 0) < 0);
	ck_assert_int_eq(pipe(pfd), 0);
	memset(data, 'k', sizeof(data));
	ck_assert_int_eq(write(pfd[1], data, sizeof(data)), sizeof(data));
	r = read(pfd[0], p + PG, PG);
	if (r < 0)
		r = -errno;
	*fill = p[PG + 100]; /* a user touch after it, served either way */
	handler_stop(&h);
	*faults = atomic_load(&h.missing);
	close(pfd[0]);
	close(pfd[1]);
	kvp_mem_release(p, 4 * PG);
	return r;
}

START_TEST(test_user_mode_only_efault)
{
	struct kvp_uffd full, user;
	long fd;
	int faults;
	char c;

	ck_assert_int_eq(kvp_uffd_open(&full, KVP_UFFD_REQUIRE_FULL), 0);
	ck_assert_int_eq(pipe_read_into(&full, &faults, &c), PG);
	ck_assert_int_eq(faults, 2);
	ck_assert_int_eq(c, 'k');
	kvp_uffd_close(&full);

	/* The user-mode-only syscall, by hand, then through the helper. */
	fd = syscall(__NR_userfaultfd,
		     O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	ck_assert_int_ge(fd, 0);
	user = (struct kvp_uffd){ .fd = (int)fd, .mode = KVP_UFFD_USER_ONLY };
	ck_assert_int_eq(pipe_read_into(&user, &faults, &c), -EFAULT);
	ck_assert_int_eq(faults, 2); /* page 0, then the touch of page 1 */
	/* Byte 100 of page 1's pattern: byte 4 of word 12. */
	ck_assert_int_eq(c, (char)(kvp_test_pattern(1, 96) >> 32));
	kvp_uffd_close(&user);

	ck_assert_int_eq(kvp_uffd_open_via(&user, KVP_UFFD_VIA_SYSCALL_USER),
			 0);
	ck_assert_int_eq(pipe_read_into(&user, &faults, &c), -EFAULT);
	kvp_uffd_close(&user);
}
END_TEST

/*
 * kvp_uffd_open falls back to user-mode-only when full mode is refused:
 * an unprivileged user (nobody) with vm.unprivileged_userfaultfd=0 and a
 * root-only /dev/userfaultfd.  Needs root to become nobody.
 */
START_TEST(test_open_fallback_user_only)
{
	int status, knob = -1;
	pid_t pid;
	FILE *f;

	f = fopen("/proc/sys/vm/unprivileged_userfaultfd", "re");
	if (f) {
		if (fscanf(f, "%d", &knob) != 1)
			knob = -1;
		fclose(f);
	}
	if (geteuid() != 0 || knob != 0) {
		printf("open_fallback_user_only: skipped: needs root and "
		       "vm.unprivileged_userfaultfd=0\n");
		return;
	}
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct kvp_uffd u;
		int rc;

		if (setgid(65534) || setuid(65534))
			_exit(10);
		rc = kvp_uffd_open(&u, KVP_UFFD_REQUIRE_FULL);
		if (rc != -EPERM)
			_exit(11);
		if (u.fd != -1)
			_exit(12);
		if (kvp_uffd_open(&u, 0))
			_exit(13);
		if (u.mode != KVP_UFFD_USER_ONLY)
			_exit(access("/dev/userfaultfd", R_OK | W_OK) ? 14 : 0);
		if (kvp_uffd_api(&u, UFFD_FEATURE_EVENT_REMOVE, 0))
			_exit(15);
		/* Handshake and features work the same in this mode. */
		if (kvp_uffd_supported(NULL, NULL))
			_exit(16);
		kvp_uffd_close(&u);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "child as nobody: status %d", status);
}
END_TEST

static Suite *uffd_suite(void)
{
	Suite *s = suite_create("uffd");
	TCase *tc = kvp_test_tcase(s, "handshake", 20);

	tcase_add_checked_fixture(tc, uffd_setup, uffd_teardown);
	tcase_add_test(tc, test_supported);
	tcase_add_test(tc, test_open_full);
	tcase_add_test(tc, test_open_via);
	tcase_add_test(tc, test_api_grants);
	tcase_add_test(tc, test_api_required_missing);
	tcase_add_test(tc, test_feature_names);
	tcase_add_test(tc, test_register_ioctls);
	tcase_add_test(tc, test_read_empty);
	tcase_add_test(tc, test_open_fallback_user_only);

	tc = kvp_test_tcase(s, "resolve", 30);
	tcase_add_checked_fixture(tc, uffd_setup, uffd_teardown);
	tcase_add_test(tc, test_copy);
	tcase_add_test(tc, test_copy_write_fault);
	tcase_add_test(tc, test_copy_wp);
	tcase_add_test(tc, test_zeropage);
	tcase_add_test(tc, test_move_4k);
	tcase_add_test(tc, test_move_2m);
	tcase_add_test(tc, test_move_holes);
	tcase_add_test(tc, test_move_counts_pages_already_moved);
	tcase_add_test(tc, test_move_holes_race);
	tcase_add_test(tc, test_writeprotect);
	tcase_add_test(tc, test_continue);
	tcase_add_test(tc, test_poison);
	tcase_add_test(tc, test_wake);

	tc = kvp_test_tcase(s, "errors", 20);
	tcase_add_checked_fixture(tc, uffd_setup, uffd_teardown);
	tcase_add_test(tc, test_eexist);
	tcase_add_test(tc, test_unregistered);
	tcase_add_test(tc, test_esrch);
	tcase_add_test(tc, test_events_remove_unmap);
	tcase_add_test(tc, test_user_mode_only_efault);
	return s;
}

int main(void)
{
	struct kvp_uffd u;
	int err;

	err = kvp_uffd_open(&u, KVP_UFFD_REQUIRE_FULL);
	if (err)
		return kvp_test_skip("no full-mode userfaultfd here (%s): run "
				     "as root or with CAP_SYS_PTRACE",
				     strerror(-err));
	kvp_uffd_close(&u);
	return kvp_test_run(uffd_suite());
}
