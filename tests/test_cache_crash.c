/* test_cache_crash.c - the prefix cache directory survives kill -9 at any
 * point and the loss of every write that was not synced.
 *
 * kill9: a child writes blocks until SIGKILL at a random moment (opening
 *   and scanning, writing, syncing, renaming); each round the parent
 *   reopens the directory and checks every block the child reported
 *   committed, and that no block reads back wrong.  KILL_ROUNDS kills.
 * power_loss: a store that forgets (tests' io ops) cuts the power at a
 *   random file operation: the operation and all after it fail, file data
 *   not fsynced is truncated and scribbled on, renames not made durable by
 *   a directory fsync are undone, and unsynced unlinks of tmp files come
 *   back as garbage.  LOSS_ROUNDS cuts.
 * kill_write_behind: a child queues a prompt's chunks with its writer
 *   held (a run's prefill), releases it (the first token) and is killed
 *   at a random moment of the write behind; the parent reopens the
 *   directory and reads every chunk: each one the child saw stored is
 *   found, none reads back wrong.  BEHIND_ROUNDS kills.
 * All print their counts (kills or cuts, blocks verified, wrong 0).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/cache/cache_dir.h"
#include "lib/cache/prefix.h"
#include "tests/helpers/helpers.h"

#define KILL_ROUNDS 100
#define LOSS_ROUNDS 300
#define PER_ROUND   1000u /* block numbers of round r: r * PER_ROUND + i */

static char root[200] = "/var/tmp/kvp-test-crash-XXXXXX";
static char dir[300];

static void key_n(struct kvp_rec_key *k, uint32_t n)
{
	struct kvp_rec_keyctx ctx;

	memset(&ctx, 0, sizeof(ctx));
	kvp_rec_block_key(&ctx, NULL, &n, 1, k);
}

/* Block n's size: 1 to 40000 bytes, so that records span 1 to 10 pages. */
static size_t len_n(uint32_t n)
{
	return 1 + (size_t)(n * 2654435761u % 40000u);
}

static void *payload_n(uint32_t n)
{
	size_t len = len_n(n);
	void *p = malloc(len + 8);

	kvp_test_fill(p, (len + 7) & ~(size_t)7, 77 + n, 0);
	return p;
}

/*
 * Block n as the cache has it: 1 read back right, 0 absent, -1 dropped
 * at the get (torn: allowed only for a block never committed), and 2
 * WRONG (served with other bytes: never allowed).
 */
static int check_n(struct kvp_cache *c, uint32_t n, void *buf)
{
	struct kvp_rec_key k;
	uint64_t len;
	void *want;
	int err, res;

	key_n(&k, n);
	err = kvp_cache_get(c, &k, buf, 40000, &len);
	if (err == -ENOENT)
		return 0;
	if (err == -EBADMSG)
		return -1;
	ck_assert_msg(!err, "get %u: %s", n, strerror(-err));
	want = payload_n(n);
	res = len == len_n(n) && !memcmp(buf, want, len) ? 1 : 2;
	free(want);
	return res;
}

static struct kvp_cache *open_or_fail(const struct kvp_cache_opts *o)
{
	struct kvp_cache *c = NULL;
	char err[300];
	int e = kvp_cache_open(dir, o, &c, err, sizeof(err), NULL, 0);

	ck_assert_msg(!e, "open: %s", err);
	return c;
}

/* ---- kill -9 ------------------------------------------------------------ */

/* The child: open, then put blocks of round r, telling fd each number as
 * soon as its put returned 0 (committed). */
static void writer(int r, int fd)
{
	struct kvp_cache *c;
	uint32_t i;

	if (kvp_cache_open(dir, NULL, &c, NULL, 0, NULL, 0))
		_exit(3);
	for (i = 0; i < PER_ROUND; i++) {
		uint32_t n = (uint32_t)r * PER_ROUND + i;
		struct kvp_rec_key k;
		void *p = payload_n(n);

		key_n(&k, n);
		if (kvp_cache_put(c, &k, p, len_n(n)))
			_exit(4);
		free(p);
		if (write(fd, &n, sizeof(n)) != sizeof(n))
			_exit(5);
	}
	_exit(0);
}

START_TEST(kill9)
{
	uint8_t *committed = calloc(KILL_ROUNDS * PER_ROUND, 1);
	uint32_t tried_max[KILL_ROUNDS] = { 0 };
	void *buf = malloc(40000);
	uint64_t verified = 0, wrong = 0, lost = 0, torn = 0;
	unsigned seed = 12345;
	int r;

	snprintf(dir, sizeof(dir), "%s/kill", root);
	for (r = 0; r < KILL_ROUNDS; r++) {
		struct kvp_cache_opts o = { .verify_at_open = r % 10 == 9 };
		struct kvp_cache *c;
		int p[2], status;
		uint32_t n, i, r2;
		pid_t pid;
		struct timespec d = { 0, 0 };

		ck_assert_int_eq(pipe(p), 0);
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (!pid) {
			close(p[0]);
			writer(r, p[1]);
		}
		close(p[1]);
		/* odd rounds: once the first put committed, so that a
		 * slow start (a loaded machine, a sanitizer) does not make
		 * every kill land in the open */
		if (r % 2 && read(p[0], &n, sizeof(n)) == sizeof(n)) {
			committed[n] = 1;
			tried_max[r] = n % PER_ROUND + 1;
		}
		/* 0 to 30 ms: in the open, the scan or a put's middle */
		d.tv_nsec = (long)(rand_r(&seed) % 30000) * 1000;
		nanosleep(&d, NULL);
		kill(pid, SIGKILL);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert_msg(WIFSIGNALED(status) || WEXITSTATUS(status) == 0,
			      "writer failed: status %d", status);
		while (read(p[0], &n, sizeof(n)) == sizeof(n)) {
			committed[n] = 1;
			tried_max[r] = n % PER_ROUND + 1;
		}
		close(p[0]);
		/* the one after the last reported may be committed too */
		if (tried_max[r] < PER_ROUND)
			tried_max[r]++;
		c = open_or_fail(&o);
		for (r2 = 0; r2 <= (uint32_t)r; r2++) {
			/* every round's committed blocks, this round's all */
			if (r2 != (uint32_t)r && r % 10 != 9)
				continue;
			for (i = 0; i < tried_max[r2]; i++) {
				uint32_t m = r2 * PER_ROUND + i;
				int res = check_n(c, m, buf);

				if (res == 2)
					wrong++;
				else if (res == 1)
					verified++;
				else if (committed[m])
					lost++;
				else if (res < 0)
					torn++;
			}
		}
		kvp_cache_close(c);
		ck_assert_msg(!wrong && !lost,
			      "round %d: %llu wrong, %llu committed lost", r,
			      (unsigned long long)wrong,
			      (unsigned long long)lost);
	}
	/* at the end, every block committed in any round, once */
	{
		struct kvp_cache_opts o = { .verify_at_open = true };
		struct kvp_cache *c = open_or_fail(&o);
		uint64_t ncommitted = 0, found = 0;
		uint32_t m;

		for (m = 0; m < KILL_ROUNDS * PER_ROUND; m++) {
			if (!committed[m])
				continue;
			ncommitted++;
			if (check_n(c, m, buf) == 1)
				found++;
		}
		kvp_cache_close(c);
		ck_assert_uint_eq(found, ncommitted);
		printf("kill9: %d kills; %llu blocks committed, all %llu "
		       "found and verified at the end; %llu checks in the "
		       "rounds, %llu committed lost, %llu wrong, %llu torn "
		       "dropped at get\n",
		       KILL_ROUNDS, (unsigned long long)ncommitted,
		       (unsigned long long)found,
		       (unsigned long long)verified, (unsigned long long)lost,
		       (unsigned long long)wrong, (unsigned long long)torn);
	}
	free(committed);
	free(buf);
}
END_TEST

/* ---- the store that forgets --------------------------------------------- */

struct ffile {
	char name[128];
	bool dirty; /* written since its last fsync */
};

struct forget {
	int ops, cut_at; /* the operation at which the power goes */
	bool cut;
	int dirfd;
	char fdname[64][128];		/* fd -> file name */
	struct ffile files[64];		/* files created or written */
	int nfiles;
	struct { char from[128], to[128]; } ren[64]; /* not yet durable */
	int nren;
	char unl[64][128]; /* tmp unlinks not yet durable */
	int nunl;
	unsigned seed;
};

static struct ffile *ffind(struct forget *f, const char *name)
{
	for (int i = 0; i < f->nfiles; i++)
		if (!strcmp(f->files[i].name, name))
			return &f->files[i];
	return NULL;
}

/* True when the power is (now) gone: the operation must not happen. */
static bool down(struct forget *f)
{
	if (++f->ops >= f->cut_at)
		f->cut = true;
	return f->cut;
}

static int f_open(void *arg, int dirfd, const char *name, int flags,
		  mode_t mode)
{
	struct forget *f = arg;
	int fd;

	if (down(f))
		return -EIO;
	f->dirfd = dirfd;
	fd = openat(dirfd, name, flags | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	ck_assert_int_lt(fd, 64);
	snprintf(f->fdname[fd], 128, "%s", name);
	if ((flags & O_CREAT) && !ffind(f, name)) {
		ck_assert_int_lt(f->nfiles, 64);
		snprintf(f->files[f->nfiles++].name, 128, "%s", name);
	}
	return fd;
}

static ssize_t f_pwrite(void *arg, int fd, const void *buf, size_t len,
			off_t off)
{
	struct forget *f = arg;
	struct ffile *ff;
	ssize_t n;

	if (down(f))
		return -EIO;
	/* a short write now and then: the cache must carry on */
	if (len > 4096 && rand_r(&f->seed) % 4 == 0)
		len = 4096;
	n = pwrite(fd, buf, len, off);
	ff = ffind(f, f->fdname[fd]);
	if (ff)
		ff->dirty = true;
	return n < 0 ? -errno : n;
}

static int f_fsync(void *arg, int fd)
{
	struct forget *f = arg;
	struct ffile *ff;

	if (down(f))
		return -EIO;
	if (fd == f->dirfd) {
		f->nren = 0; /* names durable */
		f->nunl = 0;
		return 0;
	}
	ff = ffind(f, f->fdname[fd]);
	if (ff)
		ff->dirty = false;
	return 0;
}

static int f_close(void *arg, int fd)
{
	return close(fd) ? -errno : 0; /* a close writes nothing */
}

static int f_rename(void *arg, int dirfd, const char *from, const char *to)
{
	struct forget *f = arg;
	struct ffile *ff;

	if (down(f))
		return -EIO;
	if (renameat(dirfd, from, dirfd, to))
		return -errno;
	ck_assert_int_lt(f->nren, 64);
	snprintf(f->ren[f->nren].from, 128, "%s", from);
	snprintf(f->ren[f->nren].to, 128, "%s", to);
	f->nren++;
	ff = ffind(f, from);
	if (ff)
		snprintf(ff->name, 128, "%s", to);
	return 0;
}

static int f_unlink(void *arg, int dirfd, const char *name)
{
	struct forget *f = arg;

	if (down(f))
		return -EIO;
	if (unlinkat(dirfd, name, 0))
		return -errno;
	if (!strncmp(name, "tmp.", 4) && f->nunl < 64)
		snprintf(f->unl[f->nunl++], 128, "%s", name);
	return 0;
}

static const struct kvp_cache_io_ops forget_io = {
	.open = f_open,
	.pwrite = f_pwrite,
	.fsync = f_fsync,
	.close = f_close,
	.rename = f_rename,
	.unlink = f_unlink,
};

/* The power is gone: the disk keeps only what was synced. */
static void power_loss(struct forget *f)
{
	int i, dfd = open(dir, O_RDONLY | O_DIRECTORY);

	ck_assert_int_ge(dfd, 0);
	for (i = 0; i < f->nfiles; i++) {
		struct ffile *ff = &f->files[i];
		struct stat sb;
		int fd;

		if (!ff->dirty)
			continue;
		fd = openat(dfd, ff->name, O_RDWR);
		if (fd < 0)
			continue; /* unlinked since */
		if (!fstat(fd, &sb) && sb.st_size) {
			off_t keep = rand_r(&f->seed) % sb.st_size;
			char junk[512];

			memset(junk, rand_r(&f->seed) & 0xff, sizeof(junk));
			if (rand_r(&f->seed) % 2)
				ck_assert_int_eq(ftruncate(fd, keep), 0);
			else
				ck_assert_int_ge(pwrite(fd, junk,
							sizeof(junk), keep),
						 0);
		}
		close(fd);
	}
	for (i = f->nren - 1; i >= 0; i--)
		renameat(dfd, f->ren[i].to, dfd, f->ren[i].from);
	for (i = 0; i < f->nunl; i++) {
		int fd = openat(dfd, f->unl[i], O_WRONLY | O_CREAT, 0600);

		if (fd >= 0) {
			ck_assert_int_eq(write(fd, "KVPCBLK\n", 8), 8);
			close(fd);
		}
	}
	close(dfd);
}

START_TEST(power_loss_rounds)
{
	void *buf = malloc(40000);
	uint64_t verified = 0, wrong = 0, lost = 0, cuts = 0, ops_max = 0;
	int r;

	for (r = 0; r < LOSS_ROUNDS; r++) {
		struct forget *f = calloc(1, sizeof(*f));
		struct kvp_cache_opts o = { .io = &forget_io, .io_arg = f };
		struct kvp_cache *c;
		uint8_t committed[24] = { 0 };
		uint32_t i;

		snprintf(dir, sizeof(dir), "%s/loss%d", root, r);
		f->seed = (unsigned)r * 7919u + 1;
		f->dirfd = -1;
		/* every operation of ~24 puts (about 6 each) is a cut point,
		 * the scan's of the round before too */
		f->cut_at = 1 + r % 150;
		if (r >= 150) {
			/* a second life: reopen a cut directory, cut again */
			snprintf(dir, sizeof(dir), "%s/loss%d", root, r - 150);
			f->cut_at = 1 + rand_r(&f->seed) % 150;
		}
		mkdir(root, 0700);
		c = open_or_fail(&o);
		for (i = 0; i < 24; i++) {
			uint32_t n = (uint32_t)(r % 150) * 100 + i +
				     (r >= 150 ? 50 : 0);
			struct kvp_rec_key k;
			void *p = payload_n(n);

			key_n(&k, n);
			if (!kvp_cache_put(c, &k, p, len_n(n)))
				committed[i] = 1;
			free(p);
		}
		kvp_cache_close(c);
		if (f->cut)
			cuts++;
		if (!f->cut && (uint64_t)f->ops > ops_max)
			ops_max = (uint64_t)f->ops;
		power_loss(f);
		free(f);
		/* the next boot */
		{
			struct kvp_cache_opts v = { .verify_at_open = true };

			c = open_or_fail(&v);
		}
		for (i = 0; i < 24; i++) {
			uint32_t n = (uint32_t)(r % 150) * 100 + i +
				     (r >= 150 ? 50 : 0);
			int res = check_n(c, n, buf);

			if (res == 2)
				wrong++;
			else if (res == 1)
				verified++;
			else if (committed[i])
				lost++;
		}
		if (r >= 150) /* the first life's blocks are still right */
			for (i = 0; i < 24; i++)
				if (check_n(c, (uint32_t)(r - 150) * 100 + i,
					    buf) == 2)
					wrong++;
		kvp_cache_close(c);
		ck_assert_msg(!wrong && !lost,
			      "round %d (cut at op %d): %llu wrong, %llu "
			      "committed lost",
			      r, 1 + r % 150, (unsigned long long)wrong,
			      (unsigned long long)lost);
	}
	printf("power_loss: %d rounds, %llu cut mid-way (cut points 1..150; "
	       "a round not cut made %llu operations), %llu blocks verified, %llu committed lost, %llu "
	       "wrong\n",
	       LOSS_ROUNDS, (unsigned long long)cuts,
	       (unsigned long long)ops_max, (unsigned long long)verified,
	       (unsigned long long)lost, (unsigned long long)wrong);
	free(buf);
}
END_TEST

/* ---- kill -9 during a write behind ------------------------------------- */

#define BEHIND_ROUNDS 20
#define BEHIND_CHUNKS 80u /* chunks of one round's prompt */
#define BEHIND_C      4u  /* tokens per chunk */

/* Round r's prompt: BEHIND_CHUNKS full chunks and one token more. */
static void behind_prompt(uint32_t r, uint32_t *t)
{
	for (uint32_t i = 0; i <= BEHIND_CHUNKS * BEHIND_C; i++)
		t[i] = r * 100003u + i;
}

static struct kvp_prefix *behind_prefix(struct kvp_cache *c, uint32_t r,
					uint32_t *t)
{
	struct kvp_prefix_opts o = { .cache = c, .queue_bytes = 64u << 20 };
	struct kvp_prefix *p = NULL;

	behind_prompt(r, t);
	if (kvp_prefix_create(&o, &p) ||
	    kvp_prefix_set_prompt(p, t, BEHIND_CHUNKS * BEHIND_C + 1,
				  BEHIND_C)) {
		kvp_prefix_destroy(p);
		return NULL;
	}
	return p;
}

/* The child: queue every chunk held, release, then tell fd how many are
 * stored (in order: the first n are committed) until all are. */
static void behind_writer(uint32_t r, int fd)
{
	uint32_t t[BEHIND_CHUNKS * BEHIND_C + 1], i, told = 0;
	struct kvp_prefix_stats st;
	struct kvp_cache *c;
	struct kvp_prefix *p;

	if (kvp_cache_open(dir, NULL, &c, NULL, 0, NULL, 0))
		_exit(3);
	p = behind_prefix(c, r, t);
	if (!p)
		_exit(4);
	kvp_prefix_hold(p);
	for (i = 0; i < BEHIND_CHUNKS; i++) {
		void *pl = payload_n(r * PER_ROUND + i);

		kvp_prefix_put(p, i, pl, len_n(r * PER_ROUND + i));
		free(pl);
	}
	kvp_prefix_release(p);
	if (write(fd, &told, sizeof(told)) != sizeof(told)) /* released */
		_exit(5);
	do {
		struct timespec d = { 0, 200 * 1000 };

		kvp_prefix_stats(p, &st);
		if (st.failed)
			_exit(6);
		if (st.stored != told) {
			told = (uint32_t)st.stored;
			if (write(fd, &told, sizeof(told)) != sizeof(told))
				_exit(5);
		}
		nanosleep(&d, NULL);
	} while (st.stored < BEHIND_CHUNKS);
	_exit(0);
}

START_TEST(kill_write_behind)
{
	void *buf = malloc(40000);
	uint64_t verified = 0, wrong = 0, lost = 0, midway = 0;
	unsigned seed = 777;
	uint32_t r;

	snprintf(dir, sizeof(dir), "%s/behind", root);
	for (r = 0; r < BEHIND_ROUNDS; r++) {
		uint32_t t[BEHIND_CHUNKS * BEHIND_C + 1], n, stored = 0, i;
		struct kvp_cache_opts o = { .verify_at_open = r % 2 };
		struct timespec d = { 0, 0 };
		struct kvp_prefix *p;
		struct kvp_cache *c;
		int pp[2], status;
		bool released;
		pid_t pid;

		ck_assert_int_eq(pipe(pp), 0);
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (!pid) {
			close(pp[0]);
			behind_writer(r, pp[1]);
		}
		close(pp[1]);
		/* once released: the kill lands in the write behind */
		released = read(pp[0], &n, sizeof(n)) == sizeof(n);
		d.tv_nsec = (long)(rand_r(&seed) % 20000) * 1000;
		nanosleep(&d, NULL);
		kill(pid, SIGKILL);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert_msg(WIFSIGNALED(status) || WEXITSTATUS(status) == 0,
			      "writer failed: status %d", status);
		while (read(pp[0], &n, sizeof(n)) == sizeof(n))
			stored = n;
		close(pp[0]);
		ck_assert_msg(released, "round %u: the child never released",
			      r);
		midway += stored < BEHIND_CHUNKS;
		c = open_or_fail(&o);
		p = behind_prefix(c, r, t);
		ck_assert_ptr_nonnull(p);
		for (i = 0; i < BEHIND_CHUNKS; i++) {
			uint32_t m = r * PER_ROUND + i;
			size_t len = len_n(m);
			int err = kvp_prefix_get(p, i, buf, len);

			if (!err) {
				void *want = payload_n(m);

				if (memcmp(buf, want, len))
					wrong++;
				else
					verified++;
				free(want);
			} else if (i < stored) {
				lost++;
			}
		}
		kvp_prefix_destroy(p);
		kvp_cache_close(c);
		ck_assert_msg(!wrong && !lost,
			      "round %u: %llu wrong, %llu stored lost", r,
			      (unsigned long long)wrong,
			      (unsigned long long)lost);
	}
	printf("kill_write_behind: %d kills after the release (%llu before "
	       "the write behind was done), %llu chunks verified, %llu "
	       "stored lost, %llu wrong\n",
	       BEHIND_ROUNDS, (unsigned long long)midway,
	       (unsigned long long)verified, (unsigned long long)lost,
	       (unsigned long long)wrong);
	/* what this test is for: kills in the middle of a write behind (a
	 * round's 80 stores take two fsyncs each, far more than the 0-20
	 * ms a kill waits; at least one of 20, so that a loaded machine
	 * cannot fail it) */
	ck_assert_msg(midway >= 1,
		      "no kill of %d landed before the write behind was done",
		      BEHIND_ROUNDS);
	free(buf);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache_crash");
	TCase *tc = kvp_test_tcase(s, "crash", 600);
	int failed;

	if (!mkdtemp(root))
		return kvp_test_skip("cannot make a directory in /var/tmp: %s",
				     strerror(errno));
	tcase_add_test(tc, kill9);
	tcase_add_test(tc, power_loss_rounds);
	tcase_add_test(tc, kill_write_behind);
	failed = kvp_test_run(s);
	kvp_test_rm_tree(root);
	return failed;
}
