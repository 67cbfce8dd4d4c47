/* test_cache_store.c - the prefix cache's store (cache_store.h): bound
 * ranges read from block files, verified on their first read or ahead of
 * it by the verifier thread, a corrupt one refused and dropped; writes
 * and discards unbind; the queue path serves both kinds; bind's bad
 * inputs change nothing. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lib/cache/cache_store.h"
#include "tests/helpers/helpers.h"

#define GRAN  4096u
#define NGRAN 16u /* the inner store: 16 granules */

static char root[200] = "/var/tmp/kvp-test-cstore-XXXXXX";
static char dir[300];
static struct kvp_cache *cache;
static struct kvp_store *st; /* the cache store */
static struct kvp_store *inner;

/* A disk that fails reads: pread(2) of the file whose inode is fail_ino
 * fails with EIO while fail_reads > 0 (this program's pread stands in
 * front of libc's, for the library linked into it too). */
static volatile ino_t fail_ino;
static volatile int fail_reads;

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	struct stat sb;

	if (fail_reads > 0 && !fstat(fd, &sb) && sb.st_ino == fail_ino) {
		fail_reads--;
		errno = EIO;
		return -1;
	}
	return syscall(SYS_pread64, fd, buf, n, off);
}

static void key_n(struct kvp_rec_key *k, uint32_t n)
{
	struct kvp_rec_keyctx ctx;

	memset(&ctx, 0, sizeof(ctx));
	ck_assert_int_eq(kvp_rec_block_key(&ctx, NULL, &n, 1, k), 0);
}

/* Store block n: ngran granules of the pattern of seed 100 + n. */
static void put_n(uint32_t n, uint32_t ngran)
{
	struct kvp_rec_key k;
	void *p = malloc((size_t)ngran * GRAN);

	kvp_test_fill(p, (size_t)ngran * GRAN, 100 + n, 0);
	key_n(&k, n);
	ck_assert_int_eq(kvp_cache_put(cache, &k, p, (size_t)ngran * GRAN), 0);
	free(p);
}

/* Overwrite 4 bytes of block n's file at byte at; its path into path. */
static void damage_n(uint32_t n, off_t at, char path[512])
{
	struct kvp_rec_key k;
	char hex[65];
	int fd;

	key_n(&k, n);
	kvp_rec_key_hex(&k, hex);
	snprintf(path, 512, "%s/%s.kvb", dir, hex);
	fd = open(path, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "XXXX", 4, at), 4);
	close(fd);
}

static int bind_n(uint32_t n, const uint64_t *offs, size_t cnt)
{
	struct kvp_rec_key k;

	key_n(&k, n);
	return kvp_cache_store_bind(st, &k, offs, cnt);
}

/* Granule g of the store is granule unit of block n (n < 0: inner's). */
static void check_granule(const char *buf, uint32_t g, int n, uint32_t unit)
{
	int64_t bad;

	if (n < 0)
		bad = kvp_test_check(buf + (size_t)g * GRAN, GRAN, 7,
				     (uint64_t)g * GRAN);
	else
		bad = kvp_test_check(buf + (size_t)g * GRAN, GRAN,
				     100 + (uint64_t)n, (uint64_t)unit * GRAN);
	ck_assert_msg(bad < 0, "granule %u: wrong at byte %lld", g,
		      (long long)bad);
}

static void setup(void)
{
	static int seq;
	char err[300];
	void *fill = malloc(NGRAN * GRAN);

	snprintf(dir, sizeof(dir), "%s/c%d.%d", root, (int)getpid(), seq++);
	ck_assert_msg(kvp_cache_open(dir, NULL, &cache, err, sizeof(err), NULL,
				     0) == 0,
		      "open: %s", err);
	ck_assert_int_eq(kvp_store_memory_create(NGRAN * GRAN, &inner), 0);
	kvp_test_fill(fill, NGRAN * GRAN, 7, 0);
	ck_assert_int_eq(kvp_store_pwrite(inner, fill, NGRAN * GRAN, 0), 0);
	free(fill);
	ck_assert_int_eq(kvp_cache_store_create(inner, cache, GRAN, &st), 0);
	ck_assert(kvp_cache_store_is(st));
	ck_assert(!kvp_cache_store_is(inner));
}

static void teardown(void)
{
	kvp_store_destroy(st); /* and inner */
	kvp_cache_close(cache);
	kvp_test_rm_tree(dir);
}

START_TEST(bound_reads)
{
	const uint64_t offs[3] = { 2 * GRAN, 0, 5 * GRAN };
	struct kvp_cache_store_stats ss;
	char *buf = malloc(NGRAN * GRAN);

	put_n(1, 3);
	ck_assert_int_eq(bind_n(1, offs, 3), 0);
	ck_assert_int_eq(kvp_store_pread(st, buf, NGRAN * GRAN, 0), 0);
	check_granule(buf, 0, 1, 1);
	check_granule(buf, 1, -1, 0);
	check_granule(buf, 2, 1, 0);
	check_granule(buf, 3, -1, 0);
	check_granule(buf, 4, -1, 0);
	check_granule(buf, 5, 1, 2);
	check_granule(buf, 6, -1, 0);
	/* a read inside one granule, after verification: just its bytes */
	ck_assert_int_eq(kvp_store_pread(st, buf, 512, 5 * GRAN + 1024), 0);
	ck_assert_int_lt(kvp_test_check(buf, 512, 101, 2 * GRAN + 1024), 0);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.records, 1);
	ck_assert_uint_eq(ss.bound_granules, 3);
	ck_assert_uint_eq(ss.verified, 1);
	ck_assert_uint_eq(ss.rejected, 0);
	ck_assert_uint_eq(ss.bound_bytes, 3 * GRAN + 512);
	ck_assert_uint_eq(ss.bound_reads, 2);
	free(buf);
}
END_TEST

/* Descriptors this process has open. */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

START_TEST(writes_unbind)
{
	const uint64_t offs[2] = { 0, GRAN };
	struct kvp_cache_store_stats ss;
	char *buf = malloc(2 * GRAN), x[96];
	int fds;

	put_n(2, 2);
	fds = open_fds();
	ck_assert_int_eq(bind_n(2, offs, 2), 0);
	ck_assert_int_eq(open_fds(), fds + 1); /* the record's */
	ck_assert_int_eq(kvp_store_pread(st, buf, 2 * GRAN, 0), 0);
	/* a whole granule written: the inner store's from then on */
	memset(buf, 'w', GRAN);
	ck_assert_int_eq(kvp_store_pwrite(st, buf, GRAN, 0), 0);
	/* part of one: the rest is kept, copied from the record */
	memset(x, 'x', sizeof(x));
	ck_assert_int_eq(kvp_store_pwrite(st, x, sizeof(x), GRAN + 16), 0);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.bound_granules, 0);
	ck_assert_uint_eq(ss.unbound, 2);
	ck_assert_int_eq(open_fds(), fds); /* unbound whole: closed */
	/* what the inner store holds now is what the store reads */
	ck_assert_int_eq(kvp_store_pread(inner, buf, 2 * GRAN, 0), 0);
	for (size_t i = 0; i < GRAN; i++)
		ck_assert_int_eq(buf[i], 'w');
	ck_assert_mem_eq(buf + GRAN + 16, x, sizeof(x));
	ck_assert_int_lt(kvp_test_check(buf + GRAN, 16, 102, GRAN), 0);
	ck_assert_int_lt(kvp_test_check(buf + GRAN + 112, GRAN - 112, 102,
					GRAN + 112),
			 0);
	/* a discard unbinds too */
	ck_assert_int_eq(bind_n(2, offs, 2), 0);
	ck_assert_int_eq(st->ops->discard(st, 0, 2 * GRAN), 0);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.bound_granules, 0);
	free(buf);
}
END_TEST

struct reader {
	bool stop;	 /* atomic */
	int err;	 /* atomic: the first failed read's */
	uint64_t reads;
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	char *buf = malloc(2 * GRAN);

	while (!__atomic_load_n(&rd->stop, __ATOMIC_RELAXED)) {
		int err = kvp_store_pread(st, buf, 2 * GRAN, 0);

		rd->reads++;
		if (err) {
			__atomic_store_n(&rd->err, err, __ATOMIC_RELAXED);
			break;
		}
	}
	free(buf);
	return NULL;
}

/* A record's descriptor stays open while a read uses it, though a
 * discard unbinds the record meanwhile: reads never fail (a descriptor
 * closed under a read fails it with EBADF), and none is left open. */
START_TEST(unbind_while_reading)
{
	const uint64_t offs[2] = { 0, GRAN };
	struct reader rd = { 0 };
	pthread_t t;
	int fds, i;

	put_n(5, 2);
	fds = open_fds();
	ck_assert_int_eq(pthread_create(&t, NULL, reader_main, &rd), 0);
	for (i = 0; i < 3000 && !__atomic_load_n(&rd.err, __ATOMIC_RELAXED);
	     i++) {
		ck_assert_int_eq(bind_n(5, offs, 2), 0);
		ck_assert_int_eq(st->ops->discard(st, 0, 2 * GRAN), 0);
	}
	__atomic_store_n(&rd.stop, true, __ATOMIC_RELAXED);
	pthread_join(t, NULL);
	ck_assert_msg(!rd.err, "a read failed (%d) after %llu", rd.err,
		      (unsigned long long)rd.reads);
	ck_assert_int_eq(open_fds(), fds);
}
END_TEST

/* Submit ios[0..n) on a queue of st and reap them all (bounded wait). */
static void queue_run(struct kvp_io **ios, unsigned n)
{
	struct kvp_store_queue *q;
	struct kvp_io *done[8];
	unsigned got = 0, sub = 0;
	uint64_t t0 = kvp_test_now_ns();

	ck_assert_int_eq(st->ops->queue_create(st, 4, &q), 0);
	while (got < n) {
		struct pollfd p = { .fd = st->ops->queue_fd(q),
				    .events = POLLIN };
		int k;

		if (sub < n) {
			k = st->ops->submit(q, ios + sub, n - sub);
			ck_assert_int_ge(k, 0);
			sub += (unsigned)k;
		}
		poll(&p, 1, 100);
		k = st->ops->reap(q, done, 8, false);
		ck_assert_int_ge(k, 0);
		got += (unsigned)k;
		ck_assert_msg(kvp_test_now_ns() - t0 < 60000000000ull,
			      "completions missing after 60 s");
	}
	st->ops->queue_destroy(q);
}

START_TEST(queue_path)
{
	const uint64_t offs[1] = { 3 * GRAN };
	char *a = aligned_alloc(4096, GRAN), *b = aligned_alloc(4096, GRAN);
	char *w = aligned_alloc(4096, GRAN);
	struct kvp_io ia = { .op = KVP_IO_READ, .buf = a, .len = GRAN,
			     .off = 3 * GRAN };
	struct kvp_io ib = { .op = KVP_IO_READ, .buf = b, .len = GRAN,
			     .off = 4 * GRAN };
	struct kvp_io iw = { .op = KVP_IO_WRITE, .buf = w, .len = GRAN,
			     .off = 3 * GRAN };
	struct kvp_io *ios[2] = { &ia, &ib };
	struct kvp_cache_store_stats ss;

	put_n(3, 1);
	ck_assert_int_eq(bind_n(3, offs, 1), 0);
	queue_run(ios, 2);
	ck_assert_int_eq(ia.result, GRAN);
	ck_assert_int_eq(ib.result, GRAN);
	ck_assert_int_lt(kvp_test_check(a, GRAN, 103, 0), 0);
	ck_assert_int_lt(kvp_test_check(b, GRAN, 7, 4 * GRAN), 0);
	/* a write through the queue unbinds before it lands */
	memset(w, 'q', GRAN);
	ios[0] = &iw;
	queue_run(ios, 1);
	ck_assert_int_eq(iw.result, GRAN);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.bound_granules, 0);
	ck_assert_int_eq(kvp_store_pread(st, a, GRAN, 3 * GRAN), 0);
	ck_assert_mem_eq(a, w, GRAN);
	free(a);
	free(b);
	free(w);
}
END_TEST

/* Reads of 256 KiB and more of bound ranges go to the reader threads:
 * a queue's waiting reap returns them (with the inner queue's, which
 * stays in order), a failed record's fail, and queue_destroy waits for
 * those still with the readers. */
START_TEST(queue_async)
{
	enum { BG = 64u << 10, BN = 32, RD = 512u << 10, NIO = 24 };
	struct kvp_store *big_inner, *big;
	struct kvp_store_queue *q;
	struct kvp_rec_key k, kbad;
	struct kvp_io io[NIO], *ios[NIO], *done[NIO];
	struct kvp_cache_store_stats ss;
	uint64_t offs[BN], t0 = kvp_test_now_ns();
	char path[512], *buf = aligned_alloc(4096, (size_t)NIO * RD);
	void *p = malloc((size_t)BN * BG);
	unsigned got = 0, i;

	/* a store of 4 MiB: the first 2 MiB bound to one record, the next
	 * 1 MiB to a corrupt one, the last 1 MiB the inner store's */
	ck_assert_int_eq(kvp_store_memory_create(4u << 20, &big_inner), 0);
	kvp_test_fill(p, 1u << 20, 7, 0);
	ck_assert_int_eq(kvp_store_pwrite(big_inner, p, 1u << 20, 3u << 20),
			 0);
	ck_assert_int_eq(kvp_cache_store_create(big_inner, cache, BG, &big),
			 0);
	kvp_test_fill(p, (size_t)BN * BG, 200, 0);
	key_n(&k, 20);
	ck_assert_int_eq(kvp_cache_put(cache, &k, p, (size_t)BN * BG), 0);
	key_n(&kbad, 21);
	ck_assert_int_eq(kvp_cache_put(cache, &kbad, p, (size_t)BN / 2 * BG),
			 0);
	damage_n(21, KVP_REC_HEADER_BYTES + 5, path);
	for (i = 0; i < BN; i++)
		offs[i] = (uint64_t)i * BG;
	ck_assert_int_eq(kvp_cache_store_bind(big, &k, offs, BN), 0);
	for (i = 0; i < BN / 2; i++)
		offs[i] = (2u << 20) + (uint64_t)i * BG;
	ck_assert_int_eq(kvp_cache_store_bind(big, &kbad, offs, BN / 2), 0);
	for (i = 0; i < NIO; i++) {
		io[i] = (struct kvp_io){ .op = KVP_IO_READ,
					 .buf = buf + (size_t)i * RD,
					 .len = RD,
					 .off = (uint64_t)(i % 8) * RD };
		ios[i] = &io[i];
	}
	ck_assert_int_eq(big->ops->queue_create(big, 4, &q), 0);
	for (i = 0; got < NIO;) {
		int n;

		if (i < NIO) {
			n = big->ops->submit(q, ios + i, NIO - i);
			ck_assert_int_ge(n, 0);
			i += (unsigned)n;
		}
		/* waiting for all that are out returns one at least */
		n = big->ops->reap(q, done, NIO, i - got);
		ck_assert_int_gt(n, 0);
		got += (unsigned)n;
		ck_assert_msg(kvp_test_now_ns() - t0 < 60000000000ull,
			      "completions missing after 60 s");
	}
	for (i = 0; i < NIO; i++) {
		uint64_t off = io[i].off;

		if (off < (2u << 20)) {
			ck_assert_int_eq(io[i].result, RD);
			ck_assert_int_lt(kvp_test_check(io[i].buf, RD, 200, off),
					 0);
		} else if (off < (3u << 20)) {
			ck_assert_int_eq(io[i].result, -EBADMSG);
		} else {
			ck_assert_int_eq(io[i].result, RD);
			ck_assert_int_lt(kvp_test_check(io[i].buf, RD, 7,
							off - (3u << 20)),
					 0);
		}
	}
	kvp_cache_store_stats(big, &ss);
	ck_assert_uint_eq(ss.reads_handed, NIO / 8 * 6); /* the bound ones */
	/* destroyed with reads still with the readers: it waits for them */
	for (i = 0; i < 4; i++)
		io[i].result = 0;
	ck_assert_int_eq(big->ops->submit(q, ios, 4), 4);
	big->ops->queue_destroy(q);
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(io[i].result, RD);
	kvp_store_destroy(big);
	free(p);
	free(buf);
}
END_TEST

START_TEST(corrupt_refused)
{
	const uint64_t offs[2] = { 0, GRAN };
	struct kvp_cache_store_stats ss;
	struct kvp_cache_stats cst;
	char path[512], *buf = malloc(2 * GRAN);

	put_n(4, 2);
	/* the payload's last granule, where no header check sees it */
	damage_n(4, KVP_REC_HEADER_BYTES + GRAN + 9, path);
	ck_assert_int_eq(bind_n(4, offs, 2), 0); /* its header is whole */
	/* the granule that is intact fails too: the record is one */
	ck_assert_int_eq(kvp_store_pread(st, buf, GRAN, 0), -EBADMSG);
	ck_assert_int_eq(kvp_store_pread(st, buf, 2 * GRAN, 0), -EBADMSG);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.rejected, 1);
	ck_assert_uint_eq(ss.verified, 0);
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.dropped_torn, 1);
	ck_assert_uint_eq(cst.blocks, 0);
	ck_assert_int_eq(access(path, F_OK), -1); /* removed, as a get would */
	/* a write makes the range the inner store's again */
	memset(buf, 'z', 2 * GRAN);
	ck_assert_int_eq(kvp_store_pwrite(st, buf, 2 * GRAN, 0), 0);
	ck_assert_int_eq(kvp_store_pread(st, buf, 2 * GRAN, 0), 0);
	ck_assert_int_eq(buf[GRAN + 9], 'z');
	free(buf);
}
END_TEST

/* A read error is no proof of a torn record: the read fails, but the
 * committed block stays, file and entry, and reads once the disk does. */
START_TEST(read_error_kept)
{
	const uint64_t offs[2] = { 0, GRAN };
	struct kvp_cache_store_stats ss;
	struct kvp_cache_stats cst;
	struct kvp_rec_key k;
	struct stat sb;
	char path[512], hex[65], *buf = malloc(2 * GRAN);
	int rc;

	put_n(5, 2);
	key_n(&k, 5);
	kvp_rec_key_hex(&k, hex);
	snprintf(path, sizeof(path), "%s/%s.kvb", dir, hex);
	ck_assert_int_eq(bind_n(5, offs, 2), 0);
	ck_assert_int_eq(stat(path, &sb), 0);
	fail_ino = sb.st_ino;
	fail_reads = 1;
	rc = kvp_store_pread(st, buf, 2 * GRAN, 0);
	ck_assert_int_eq(fail_reads, 0);
	ck_assert_msg(access(path, F_OK) == 0,
		      "a read error removed the committed block's file");
	ck_assert_int_eq(rc, -EIO);
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.blocks, 1);
	ck_assert_uint_eq(cst.dropped_torn, 0);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.rejected, 0);
	/* the disk reads again: so does the block */
	ck_assert_int_eq(kvp_store_pread(st, buf, 2 * GRAN, 0), 0);
	check_granule(buf, 0, 5, 0);
	check_granule(buf, 1, 5, 1);
	free(buf);
}
END_TEST

/* A bound record that fails after its block was evicted and stored again
 * under the same name: the failure is the old file's, and the new block,
 * committed and whole, stays. */
START_TEST(stale_reject_kept)
{
	const uint64_t offs[2] = { 0, GRAN };
	struct kvp_cache_stats cst;
	struct kvp_rec_key k;
	char path[512], *buf = malloc(2 * GRAN);
	uint64_t len;

	put_n(6, 2);
	damage_n(6, KVP_REC_HEADER_BYTES + GRAN + 9, path);
	ck_assert_int_eq(bind_n(6, offs, 2), 0); /* the damaged file */
	key_n(&k, 6);
	ck_assert_int_eq(kvp_cache_remove(cache, &k), 0); /* evicted ... */
	put_n(6, 2);					  /* ... stored again */
	ck_assert_int_eq(kvp_store_pread(st, buf, GRAN, 0), -EBADMSG);
	ck_assert_msg(access(path, F_OK) == 0,
		      "the old file's failure removed the new block's file");
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.blocks, 1);
	ck_assert_uint_eq(cst.dropped_torn, 1); /* the old one, counted */
	ck_assert_int_eq(kvp_cache_get(cache, &k, buf, 2 * GRAN, &len), 0);
	ck_assert_uint_eq(len, 2 * GRAN);
	check_granule(buf, 0, 6, 0);
	check_granule(buf, 1, 6, 1);
	free(buf);
}
END_TEST

START_TEST(bind_errors)
{
	uint64_t offs[3] = { 0, GRAN, 2 * GRAN };
	struct kvp_cache_store_stats ss;
	struct kvp_cache_stats cst;

	put_n(5, 3);
	ck_assert_int_eq(bind_n(5, offs, 2), -EMSGSIZE); /* 3 granules */
	ck_assert_int_eq(bind_n(6, offs, 3), -ENOENT);	 /* absent */
	offs[1] = GRAN + 512;
	ck_assert_int_eq(bind_n(5, offs, 3), -EINVAL); /* not a granule */
	offs[1] = NGRAN * GRAN;
	ck_assert_int_eq(bind_n(5, offs, 3), -EINVAL); /* past the end */
	ck_assert_int_eq(kvp_cache_store_bind(inner, NULL, offs, 3), -EINVAL);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.bound_granules, 0);
	ck_assert_uint_eq(ss.records, 0);
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.blocks, 1);
}
END_TEST

/* A memfd holding the record of block n (ngran granules); byte @flip of
 * it flipped when not negative. */
static int memfd_n(uint32_t n, uint32_t ngran, long flip)
{
	size_t len = (size_t)ngran * GRAN;
	void *p = malloc(len), *rec = malloc(kvp_rec_size(len));
	struct kvp_rec_key k;
	int fd = memfd_create("test-record", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	kvp_test_fill(p, len, 100 + n, 0);
	key_n(&k, n);
	ck_assert_int_eq(kvp_rec_seal(&k, p, len, NULL, rec), 0);
	if (flip >= 0)
		((char *)rec)[flip] ^= 1;
	ck_assert_int_eq(write(fd, rec, kvp_rec_size(len)),
			 (ssize_t)kvp_rec_size(len));
	free(p);
	free(rec);
	return fd;
}

/* A record that is in no block file (the remote tier's, in a memfd):
 * served as a file's; verified when first read unless the caller says
 * it did; a bad one fails its reads but is not the directory's to drop. */
START_TEST(bound_from_fd)
{
	const uint64_t offs[2] = { 3 * GRAN, GRAN };
	struct kvp_cache_store_stats ss;
	struct kvp_cache_stats cst;
	struct kvp_rec_key k;
	char *buf = malloc(NGRAN * GRAN);

	key_n(&k, 11);
	ck_assert_int_eq(kvp_cache_store_bind_fd(st, &k, memfd_n(11, 2, -1),
						 2 * GRAN, false, offs, 2),
			 0);
	ck_assert_int_eq(kvp_store_pread(st, buf, NGRAN * GRAN, 0), 0);
	check_granule(buf, 0, -1, 0);
	check_granule(buf, 1, 11, 1);
	check_granule(buf, 3, 11, 0);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.verified, 1);
	/* taken as verified: not read whole again */
	key_n(&k, 12);
	ck_assert_int_eq(kvp_cache_store_bind_fd(st, &k, memfd_n(12, 1, -1),
						 GRAN, true, offs, 1),
			 0);
	ck_assert_int_eq(kvp_store_pread(st, buf, GRAN, 3 * GRAN), 0);
	check_granule(buf, 0, 12, 0);
	/* a bad one: its reads fail; the directory counts nothing */
	key_n(&k, 13);
	ck_assert_int_eq(kvp_cache_store_bind_fd(st, &k,
						 memfd_n(13, 1, KVP_REC_HEADER_BYTES + 9),
						 GRAN, false, offs + 1, 1),
			 0);
	ck_assert_int_eq(kvp_store_pread(st, buf, GRAN, GRAN), -EBADMSG);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.records, 3);
	ck_assert_uint_eq(ss.verified, 2);
	ck_assert_uint_eq(ss.rejected, 1);
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.dropped_torn, 0);
	/* bad input: the descriptor is closed, nothing bound */
	ck_assert_int_eq(kvp_cache_store_bind_fd(st, &k, memfd_n(13, 1, -1),
						 2 * GRAN, true, offs, 1),
			 -EMSGSIZE);
	ck_assert_int_eq(kvp_cache_store_bind_fd(inner, &k, memfd_n(13, 1, -1),
						 GRAN, true, offs, 1),
			 -EINVAL);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.records, 3);
	free(buf);
}
END_TEST

/* Wait (up to 120 s: the verifier runs at nice 19 on a busy machine)
 * until the store has verified and rejected at least so many records. */
static void wait_verified(uint64_t verified, uint64_t rejected,
			  struct kvp_cache_store_stats *ss)
{
	uint64_t end = kvp_test_now_ns() + 120000000000ull;

	for (;;) {
		kvp_cache_store_stats(st, ss);
		if (ss->verified >= verified && ss->rejected >= rejected)
			return;
		ck_assert_msg(kvp_test_now_ns() < end,
			      "verifier: %llu verified, %llu rejected after "
			      "120 s",
			      (unsigned long long)ss->verified,
			      (unsigned long long)ss->rejected);
		usleep(2000);
	}
}

/* The verifier checks bound records before any read (those bound before
 * it started and after); a read then takes just its bytes; a corrupt
 * record is refused and dropped by it as by a read, and its reads fail. */
START_TEST(verify_ahead)
{
	const uint64_t offs[5] = { 0, GRAN, 2 * GRAN, 3 * GRAN, 4 * GRAN };
	struct kvp_cache_store_stats ss;
	struct kvp_cache_stats cst;
	char path[512], *buf = malloc(NGRAN * GRAN);

	put_n(1, 2);
	put_n(2, 2);
	put_n(3, 1);
	damage_n(3, KVP_REC_HEADER_BYTES + 99, path);
	ck_assert_int_eq(bind_n(1, offs, 2), 0);
	ck_assert_int_eq(kvp_cache_store_verify_ahead(inner), -EINVAL);
	ck_assert_int_eq(kvp_cache_store_verify_ahead(st), 0);
	ck_assert_int_eq(kvp_cache_store_verify_ahead(st), 0); /* again */
	wait_verified(1, 0, &ss);
	ck_assert_int_eq(bind_n(2, offs + 2, 2), 0); /* after it started */
	ck_assert_int_eq(bind_n(3, offs + 4, 1), 0);
	wait_verified(2, 1, &ss);
	ck_assert_uint_eq(ss.verified, 2);
	ck_assert_uint_eq(ss.verified_ahead, 2);
	ck_assert_uint_eq(ss.rejected, 1);
	ck_assert_uint_eq(ss.bound_reads, 0); /* no read asked for them */
	kvp_cache_stats(cache, &cst);
	ck_assert_uint_eq(cst.dropped_torn, 1);
	ck_assert_int_eq(access(path, F_OK), -1);
	/* reads: the verified ones' bytes, the corrupt one refused */
	ck_assert_int_eq(kvp_store_pread(st, buf, 4 * GRAN, 0), 0);
	check_granule(buf, 0, 1, 0);
	check_granule(buf, 1, 1, 1);
	check_granule(buf, 2, 2, 0);
	check_granule(buf, 3, 2, 1);
	ck_assert_int_eq(kvp_store_pread(st, buf, GRAN, 4 * GRAN), -EBADMSG);
	kvp_cache_store_stats(st, &ss);
	ck_assert_uint_eq(ss.verified, 2);
	ck_assert_uint_eq(ss.rejected, 1);
	ck_assert_uint_eq(ss.bound_bytes, 4 * GRAN);
	free(buf);
}
END_TEST

/* A cache that encrypts at rest does not map: its reader copies. */
START_TEST(sealed_not_mapped)
{
	struct kvp_rec_cipher ci;
	struct kvp_cache_opts o = { .cipher = &ci };
	struct kvp_cache *c2;
	struct kvp_rec_key k;
	char d2[320], err[300];
	uint64_t len;
	int fd;

	memset(ci.key, 3, sizeof(ci.key));
	snprintf(d2, sizeof(d2), "%s.sealed", dir);
	ck_assert_msg(kvp_cache_open(d2, &o, &c2, err, sizeof(err), NULL, 0) ==
			      0,
		      "open: %s", err);
	key_n(&k, 9);
	ck_assert_int_eq(kvp_cache_put(c2, &k, "abc", 3), 0);
	ck_assert_int_eq(kvp_cache_open_block(c2, &k, &fd, &len), -EOPNOTSUPP);
	kvp_cache_close(c2);
	kvp_test_rm_tree(d2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache_store");
	TCase *tc = kvp_test_tcase(s, "store", 120);
	int failed;

	if (!mkdtemp(root))
		return kvp_test_skip("cannot make a directory in /var/tmp: %s",
				     strerror(errno));
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, bound_reads);
	tcase_add_test(tc, writes_unbind);
	tcase_add_test(tc, unbind_while_reading);
	tcase_add_test(tc, queue_path);
	tcase_add_test(tc, queue_async);
	tcase_add_test(tc, corrupt_refused);
	tcase_add_test(tc, read_error_kept);
	tcase_add_test(tc, stale_reject_kept);
	tcase_add_test(tc, bind_errors);
	tcase_add_test(tc, sealed_not_mapped);
	tcase_add_test(tc, bound_from_fd);
	tcase_add_test(tc, verify_ahead);
	failed = kvp_test_run(s);
	kvp_test_rm_tree(root);
	return failed;
}
