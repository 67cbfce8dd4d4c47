/*
 * pager_fx.h - the fixture and helpers the pager suites share
 * (tests/test_pager_*.c).
 *
 * Every test opens its own pager inside the forked child Check runs it in
 * (a userfaultfd registration and its service threads do not survive
 * fork); the checked fixture resets the handles and the teardown closes
 * whatever a failed test left open.  Budgets are small (2-16 MiB) and
 * regions several times larger, so that eviction runs all the time on a
 * 2-core machine.  Data is a pattern of 64-bit words, a function of a seed
 * and the byte offset, checked word by word.
 */
#ifndef KVP_TESTS_PAGER_FX_H
#define KVP_TESTS_PAGER_FX_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "pager/pager.h"
#include "tests/helpers/helpers.h"

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define PG  (4 * KIB)

#define SEED_A 0x1111111111111111ull
#define SEED_B 0x2222222222222222ull

extern struct kvp_pager *P;
extern struct kvp_region *R;
extern struct kvp_store *S;  /* what regions use */
extern struct kvp_store *S0; /* the inner store under a faulty one */

enum store_kind { ST_MEM, ST_FILE };

struct popts {
	uint64_t budget;
	unsigned mode; /* KVP_INSTALL_* */
	uint64_t readahead;
	unsigned threads;
	bool exact_budget; /* watermarks 100/99: evict on demand only */
	bool no_prefault;  /* pool_prefault_bytes 0: every frame fresh */
	uint64_t fault_around; /* fault_around_bytes (0: whole blocks) */
};

/* The checked fixture: handles reset; whatever a test left open closed. */
void fx_setup(void);
void fx_teardown(void);

/* Write the pattern over the store range [off, off+len). */
void store_fill(struct kvp_store *s, uint64_t off, size_t len, uint64_t seed);

/* Offset of the first store word in [off, off+len) off the pattern, or -1. */
int64_t store_check(struct kvp_store *s, uint64_t off, size_t len,
		    uint64_t seed);

/* S: a memory store or a temporary file in /var/tmp. */
void make_store(enum store_kind k, uint64_t size);

/* Memory store under a faulty store: S is the faulty one, S0 the inner. */
void make_faulty_store(uint64_t size);

/* P, configured from the defaults and @o. */
void open_pager(const struct popts *o);

/* A region of P on S from offset 0. */
struct kvp_region *make_region(size_t size, size_t bs, unsigned flags);

/* The usual start: S of kind @k and @size bytes holding SEED_A's pattern, P
 * from @o, and R a region of @bs blocks over all of S (FROM_STORE).
 * Returns R's address. */
char *fx_seeded_region(enum store_kind k, size_t size, size_t bs,
		       const struct popts *o);

/* The same over a faulty store: S over S0, which holds SEED_A's pattern;
 * no fault planned yet. */
char *fx_faulty_region(size_t size, size_t bs, const struct popts *o);

/* Statistics of P, of @r. */
struct kvp_stats pstats(void);
struct kvp_stats rstats(struct kvp_region *r);

/* Wait until background eviction has settled: the region's residency and
 * eviction counts unchanged over a few samples 20 ms apart. */
void settle(struct kvp_region *r);

/*
 * A block's info once it is out of transit.  The engine wakes a faulting
 * thread before it marks the block RESIDENT (install, then the state under
 * the lock), so right after an access the block may still read LOADING
 * for a moment; no test asks about a block it expects in transit.
 */
struct kvp_block_info binfo(struct kvp_region *r, uint64_t blk);

/* Poll @r's block @blk (every 0.5 ms, 1 s at most) until it is in @state
 * (enum kvp_block_state), which a test expects in transit; fails the test
 * with @what otherwise. */
void await_state(struct kvp_region *r, uint64_t blk, int state,
		 const char *what);

/* removed_bytes_total once it reaches @want (munmap and madvise return
 * when a service thread has read the event, not handled it): up to 5 s. */
uint64_t wait_removed(struct kvp_region *r, uint64_t want);

/* Read one word per page of [off, off+len) of the region (faults it in). */
uint64_t touch_read(struct kvp_region *r, size_t off, size_t len);

/* Fail the test unless [off, off+len) of @r holds @seed's pattern. */
void check_region(struct kvp_region *r, size_t off, size_t len, uint64_t seed);

/* Evict everything that can be: COLD on all, then stream a second region
 * of the budget's size over it.  (Used where the test must see blocks go.) */
void push_out(struct kvp_region *r, uint64_t budget);

/* R: @nblocks blocks of @bs from a faulty store over memory (S0 holds the
 * pattern SEED_A, each I/O delayed @delay_us), under @budget (@exact:
 * watermarks 100/99). */
void prefetch_fixture(size_t nblocks, size_t bs, uint64_t budget,
		      uint64_t delay_us, bool exact);

/* A test case of @s with the fixture and a @timeout in seconds. */
TCase *fx_tcase(Suite *s, const char *name, int timeout);

/*
 * The main of a pager suite: skips (77) when kvp_pager_open says
 * userfaultfd is not allowed here (-EPERM) or lacks what the engine needs
 * (-EOPNOTSUPP, -ENOSYS), else runs the suite @make_suite makes
 * (kvp_test_run).
 */
/* kvp_pager_open's result for a small pager, opened and closed: 0 when this
 * process can page (userfaultfd, io_uring). */
int kvp_test_pager_err(void);
int fx_main(Suite *(*make_suite)(void));

#endif /* KVP_TESTS_PAGER_FX_H */
