/*
 * helpers.h - what the Check suites share: the runner, skips, one clock,
 * aligned buffers, a data pattern, resident pages and scratch mounts.
 *
 * Every tests/test_X.c binary links every tests/helpers/ file (the Makefile's
 * TEST_HELPER_SRCS).  Helpers that check their own work do so with
 * ck_assert, so they belong inside a test (Check forks one per test);
 * those that may run in main() before the suite say so.
 */
#ifndef KVP_TEST_HELPERS_H
#define KVP_TEST_HELPERS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the runner (run.c) ---- */

/*
 * kvp_test_run - run every case of @s (CK_NORMAL: a line per failure) and
 * free it.  Returns the binary's exit status: 0 when all passed, else 1.
 */
int kvp_test_run(Suite *s);

/* A test case @name with a @timeout_s per test, added to @s. */
TCase *kvp_test_tcase(Suite *s, const char *name, int timeout_s);

/*
 * kvp_test_skip - print "skipped: <why>" as the last line (run-tests.sh
 * shows it) and return 77, the exit status of a skip: `return
 * kvp_test_skip("...")` from main().
 */
int kvp_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * kvp_test_missing_uring - NULL when this process can set up an io_uring,
 * else why not (with the remedy), for kvp_test_skip.  For main().
 */
const char *kvp_test_missing_uring(void);

/* ---- threads (threads.c) ---- */

/* The nice value of this process's thread named @name, waiting up to 10 s
 * for one to show; INT_MIN if none does.  The pager names its threads
 * once their priority is set. */
int kvp_test_thread_nice(const char *name);

/* The nice value a thread of this process gets @levels above the
 * process's where it may lower one (root, CAP_SYS_NICE), else the
 * process's own: what service_priority = @levels gives. */
int kvp_test_boosted_nice(int levels);

/* This process's threads, now (/proc/self/status). */
int kvp_test_thread_count(void);

/* ---- the clock (clock.c) ---- */

/* CLOCK_MONOTONIC in nanoseconds: the one clock of the tests.  Tests time
 * nothing they assert on but lower bounds (an injected delay was waited). */
uint64_t kvp_test_now_ns(void);

/* ---- memory (mem.c) ---- */

/* @len bytes aligned to 4 KiB (O_DIRECT, page installs); free() them. */
void *kvp_test_xalloc(size_t len);

/* Pages of [@addr, @addr + @len) resident in this process, by mincore(2). */
size_t kvp_test_resident_pages(void *addr, size_t len);
/* Is [@a, @a + 2 MiB) one huge page (pagemap)?  -1: frame numbers hidden. */
int kvp_test_one_huge_page(const void *a);

static inline bool kvp_test_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

/*
 * kvp_test_mlock, kvp_test_munlock - mlock(2) and munlock(2) by their
 * system calls: AddressSanitizer makes the libc calls do nothing, which
 * would leave a test of locked pages testing nothing under it.
 */
int kvp_test_mlock(const void *addr, size_t len);
int kvp_test_munlock(const void *addr, size_t len);

/* ---- the data pattern (pattern.c) ---- */

/*
 * The pattern of @seed: the 8-byte word at byte offset @off (a multiple of
 * 8) holds kvp_test_pattern(@seed, @off), a hash of both, so that a word
 * read from the wrong place, block or seed differs.
 */
uint64_t kvp_test_pattern(uint64_t seed, uint64_t off);

/* Fill @buf (@len a multiple of 8) with the pattern of bytes from @off. */
void kvp_test_fill(void *buf, size_t len, uint64_t seed, uint64_t off);

/*
 * kvp_test_check - offset in @buf of the first word off the pattern of the
 * bytes from @off, or -1 when all match.  Reads each word once, volatile,
 * so that it may run over memory whose faults another thread serves.
 */
int64_t kvp_test_check(const void *buf, size_t len, uint64_t seed,
		       uint64_t off);

/* True when the @len bytes at @buf (a multiple of 8) are all zero. */
bool kvp_test_is_zero(const void *buf, size_t len);

/* ---- scratch mounts (mount.c) ---- */

/*
 * kvp_test_mount - mount a fresh @type filesystem ("ramfs", "tmpfs") with
 * @opts at @parent/@tag, made for it; its path goes to @dir (@len bytes).
 * Returns true; false when it cannot (not root, no such filesystem), with
 * a note on stderr and @dir "".  For main() as well as tests.
 */
bool kvp_test_mount(char *dir, size_t len, const char *parent, const char *tag,
		    const char *type, const char *opts);

/* Unmount (lazily) and remove @dir from kvp_test_mount; "" does nothing. */
void kvp_test_unmount(char *dir);

/* Remove @path and all below it (rm -rf, never following a link);
 * quietly does what it can. */
void kvp_test_rm_tree(const char *path);

#endif /* KVP_TEST_HELPERS_H */
