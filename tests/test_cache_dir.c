/* test_cache_dir.c - the prefix cache directory: put, get, reopen,
 * eviction, encryption at rest, namespaces, and the bad inputs (another
 * format version or model, a corrupt block, a read-only directory, a full
 * disk, a directory that is not a cache). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/cache/cache_dir.h"
#include "tests/helpers/helpers.h"

static char root[200] = "/var/tmp/kvp-test-cache-XXXXXX";
static char base[256]; /* this test's; dir may lie inside a mount in it */
static char dir[300];

/* A fresh directory path (not made) per test. */
static void setup(void)
{
	static int n;

	snprintf(base, sizeof(base), "%s/c%d.%d", root, (int)getpid(), n++);
	snprintf(dir, sizeof(dir), "%s", base);
}

static void teardown(void)
{
	char m[300];

	/* a failed mount test leaves its mount: lazily gone */
	snprintf(m, sizeof(m), "%s/ro", base);
	umount2(m, MNT_DETACH);
	snprintf(m, sizeof(m), "%s/full", base);
	umount2(m, MNT_DETACH);
	kvp_test_rm_tree(base);
}

static void key_n(struct kvp_rec_key *k, uint32_t n)
{
	struct kvp_rec_keyctx ctx;

	memset(&ctx, 0, sizeof(ctx));
	ck_assert_int_eq(kvp_rec_block_key(&ctx, NULL, &n, 1, k), 0);
}

/* The payload of block n: len bytes of the pattern of seed n. */
static void *payload_n(uint32_t n, size_t len)
{
	void *p = malloc(len + 8);

	kvp_test_fill(p, (len + 7) & ~(size_t)7, 1000 + n, 0);
	return p;
}

static struct kvp_cache *open_ok(const struct kvp_cache_opts *o)
{
	struct kvp_cache *c = NULL;
	char err[300];

	ck_assert_msg(kvp_cache_open(dir, o, &c, err, sizeof(err), NULL, 0) ==
			      0,
		      "open: %s", err);
	return c;
}

static void put_n(struct kvp_cache *c, uint32_t n, size_t len, int want)
{
	struct kvp_rec_key k;
	void *p = payload_n(n, len);

	key_n(&k, n);
	ck_assert_int_eq(kvp_cache_put(c, &k, p, len), want);
	free(p);
}

/* Block n reads back whole (want 0), or get returns want. */
static void get_n(struct kvp_cache *c, uint32_t n, size_t len, int want)
{
	struct kvp_rec_key k;
	void *p = payload_n(n, len), *buf = malloc(len + 1);
	uint64_t got = 0;

	key_n(&k, n);
	ck_assert_int_eq(kvp_cache_get(c, &k, buf, len + 1, &got), want);
	if (!want) {
		ck_assert_uint_eq(got, len);
		ck_assert_mem_eq(buf, p, len);
	}
	free(p);
	free(buf);
}

static void block_path(uint32_t n, char *out, size_t len)
{
	struct kvp_rec_key k;
	char hex[65];

	key_n(&k, n);
	kvp_rec_key_hex(&k, hex);
	snprintf(out, len, "%s/%s.kvb", dir, hex);
}

START_TEST(put_get_reopen)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	struct stat sb;
	char path[512];
	uint32_t i;

	for (i = 0; i < 5; i++)
		put_n(c, i, 10000 + i, 0);
	for (i = 0; i < 5; i++)
		get_n(c, i, 10000 + i, 0);
	get_n(c, 9, 100, -ENOENT);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 5);
	ck_assert_uint_eq(st.puts, 5);
	ck_assert_uint_eq(st.hits, 5);
	ck_assert_uint_eq(st.misses, 1);
	ck_assert_uint_eq(st.bytes, 5 * 12288);
	ck_assert_uint_eq(st.bytes_written, 5 * 12288);
	ck_assert_uint_eq(st.payload_written, 5 * 10000 + 10);
	/* a block stored once: not written again */
	put_n(c, 2, 10002, 0);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.puts_present, 1);
	ck_assert_uint_eq(st.bytes_written, 5 * 12288);
	/* 0700 and 0600 */
	ck_assert_int_eq(stat(dir, &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 0777, 0700);
	block_path(3, path, sizeof(path));
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 0777, 0600);
	/* one process at a time */
	{
		struct kvp_cache *c2 = NULL;
		char err[300];

		ck_assert_int_eq(kvp_cache_open(dir, NULL, &c2, err,
						sizeof(err), NULL, 0),
				 -EBUSY);
		ck_assert_ptr_nonnull(strstr(err, "in use by another"));
	}
	kvp_cache_close(c);
	/* found again at open */
	c = open_ok(NULL);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 5);
	for (i = 0; i < 5; i++) {
		struct kvp_rec_key k;

		key_n(&k, i);
		ck_assert(kvp_cache_contains(c, &k));
		get_n(c, i, 10000 + i, 0);
	}
	/* a buffer too small: the size needed, no miss */
	{
		struct kvp_rec_key k;
		char small[16];
		uint64_t len;

		key_n(&k, 1);
		ck_assert_int_eq(kvp_cache_get(c, &k, small, 16, &len),
				 -EMSGSIZE);
		ck_assert_uint_eq(len, 10001);
	}
	ck_assert_int_eq(kvp_cache_remove(c, &(struct kvp_rec_key){ 0 }),
			 -ENOENT);
	kvp_cache_close(c);
}
END_TEST

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	close(fd);
}

/* The names in directory path, but "." and "..". */
static int entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	closedir(d);
	return n;
}

START_TEST(not_a_cache)
{
	struct kvp_cache *c = NULL;
	char err[300], path[512];
	struct stat sb;

	/* a directory with someone's files: refused, untouched */
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	snprintf(path, sizeof(path), "%s/tmp.notes", dir);
	write_file(path, "mine", 4);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -ENOTEMPTY);
	ck_assert_ptr_nonnull(strstr(err, "not a kvpager cache"));
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_int_eq(entries(dir), 1); /* no lock file made there */
	/* a missing parent, a symlink to nothing: what to do is said */
	snprintf(path, sizeof(path), "%s/no/parent", dir);
	ck_assert_int_eq(kvp_cache_open(path, NULL, &c, err, sizeof(err),
					NULL, 0),
			 -ENOENT);
	ck_assert_msg(strstr(err, "mkdir -p its parent"), "%s", err);
	snprintf(path, sizeof(path), "%s/link", dir);
	ck_assert_int_eq(symlink("/nonexistent/kvp", path), 0);
	ck_assert_int_eq(kvp_cache_open(path, NULL, &c, err, sizeof(err),
					NULL, 0),
			 -ENOENT);
	ck_assert_msg(strstr(err, "symlink to a missing directory"), "%s",
		      err);
	/* a file where the directory should be */
	kvp_test_rm_tree(dir);
	write_file(dir, "x", 1);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -ENOTDIR);
}
END_TEST

/* The lock is the lock file's, never renamed: a manifest renamed into
 * place while a process holds the cache (what racing creators did before
 * they were locked) lets no second opener in; the refusal names the
 * holder. */
START_TEST(one_holder)
{
	struct kvp_cache *c = open_ok(NULL), *c2 = NULL;
	char err[300], path[512], tmp[512], pid[32];

	snprintf(tmp, sizeof(tmp), "%s/tmp.kvpcache", dir);
	write_file(tmp, "kvpager-cache 1\n", 16);
	snprintf(path, sizeof(path), "%s/kvpcache", dir);
	ck_assert_int_eq(rename(tmp, path), 0);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c2, err, sizeof(err), NULL,
					0),
			 -EBUSY);
	ck_assert_ptr_nonnull(strstr(err, "in use by another"));
	snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
	ck_assert_msg(strstr(err, pid), "holder not named: %s", err);
	kvp_cache_close(c);
}
END_TEST

/*
 * Each exclusive lock of an open cache is held through a descriptor
 * opened for writing: NFS emulates flock with byte-range locks, and an
 * exclusive one on a descriptor opened read only fails there (EBADF).
 * No NFS here: the descriptors' modes are what is checked.
 */
START_TEST(locks_writable)
{
	struct kvp_cache *c = open_ok(NULL);
	char path[300], line[256];
	struct dirent *de;
	int locks = 0;
	DIR *d = opendir("/proc/self/fdinfo");

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		unsigned flags = 0;
		bool exclusive = false;
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%s",
			 de->d_name);
		f = fopen(path, "re");
		if (!f)
			continue; /* the DIR's own descriptor, closed */
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "flags: %o", &flags);
			if (!strncmp(line, "lock:", 5) &&
			    strstr(line, "FLOCK") && strstr(line, "WRITE"))
				exclusive = true;
		}
		fclose(f);
		if (!exclusive)
			continue;
		locks++;
		ck_assert_msg((flags & O_ACCMODE) != O_RDONLY,
			      "fd %s: an exclusive lock on a descriptor "
			      "opened read only (flags %o)",
			      de->d_name, flags);
	}
	closedir(d);
	ck_assert_int_eq(locks, 2); /* the lock file and the manifest */
	kvp_cache_close(c);
}
END_TEST

/* Processes that open one new directory at once: exactly one has it, and
 * every other is told it is in use (never "not a cache", never a broken
 * manifest, never two holders). */
START_TEST(racing_creators)
{
	enum { KIDS = 6, ROUNDS = 40 };
	int r, k;

	ck_assert_int_eq(mkdir(base, 0700), 0);
	for (r = 0; r < ROUNDS; r++) {
		int go[2], res[2], rel[2], ok = 0, busy = 0, rc;
		char b;

		snprintf(dir, sizeof(dir), "%s/r%d", base, r);
		ck_assert_int_eq(pipe(go), 0);
		ck_assert_int_eq(pipe(res), 0);
		ck_assert_int_eq(pipe(rel), 0);
		for (k = 0; k < KIDS; k++) {
			pid_t pid = fork();

			ck_assert_int_ge(pid, 0);
			if (pid == 0) {
				struct kvp_cache *c = NULL;

				close(go[1]);
				close(rel[1]);
				(void)!read(go[0], &b, 1); /* EOF: go */
				rc = kvp_cache_open(dir, NULL, &c, NULL, 0,
						    NULL, 0);
				(void)!write(res[1], &rc, sizeof(rc));
				(void)!read(rel[0], &b, 1); /* EOF: done */
				kvp_cache_close(c);
				_exit(0);
			}
		}
		close(go[0]);
		close(go[1]);
		close(rel[0]);
		for (k = 0; k < KIDS; k++) {
			ck_assert_int_eq(read(res[0], &rc, sizeof(rc)),
					 sizeof(rc));
			ok += rc == 0;
			busy += rc == -EBUSY;
			ck_assert_msg(rc == 0 || rc == -EBUSY,
				      "round %d: open gave %d (%s)", r, rc,
				      strerror(-rc));
		}
		close(rel[1]);
		close(res[0]);
		close(res[1]);
		while (wait(NULL) > 0)
			;
		ck_assert_msg(ok == 1, "round %d: %d holders", r, ok);
		ck_assert_int_eq(busy, KIDS - 1);
	}
}
END_TEST

/* A directory another user could write to (their blocks would be served
 * as this user's: a plain record's checksum is no signature) is refused,
 * nothing made in it; a symlink to a directory of one's own is fine. */
START_TEST(others_dir)
{
	struct kvp_cache *c = NULL;
	char err[300], real[264], path[512];
	struct stat sb;
	static const mode_t bad[] = { 0777, 0770, 0702, 01777 };
	size_t i;

	ck_assert_int_eq(mkdir(base, 0700), 0);
	snprintf(real, sizeof(real), "%s/real", base);
	ck_assert_int_eq(mkdir(real, 0700), 0);
	snprintf(dir, sizeof(dir), "%s/link", base);
	ck_assert_int_eq(symlink(real, dir), 0);
	c = open_ok(NULL);
	put_n(c, 1, 3000, 0);
	kvp_cache_close(c);
	snprintf(path, sizeof(path), "%s/kvpcache", real);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(chmod(real, bad[i]), 0);
		ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err,
						sizeof(err), NULL, 0),
				 -EPERM);
		ck_assert_msg(strstr(err, "others may write") &&
				      strstr(err, "chmod 700"),
			      "%o: %s", bad[i], err);
	}
	/* others may list it (mode 0755): the files are 0600 */
	ck_assert_int_eq(chmod(real, 0755), 0);
	c = open_ok(NULL);
	get_n(c, 1, 3000, 0);
	kvp_cache_close(c);
	ck_assert_int_eq(chmod(real, 0700), 0);
	if (geteuid() == 0) { /* another user's: only root can make one */
		ck_assert_int_eq(chown(real, 65534, 65534), 0);
		ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err,
						sizeof(err), NULL, 0),
				 -EPERM);
		ck_assert_msg(strstr(err, "belongs to uid 65534"), "%s", err);
		ck_assert_int_eq(chown(real, 0, 0), 0);
	}
	/* a new directory inside one that others may write is still made
	 * 0700, whatever the umask */
	ck_assert_int_eq(chmod(real, 0777), 0);
	snprintf(dir, sizeof(dir), "%s/new", real);
	{
		mode_t old = umask(0);

		c = open_ok(NULL);
		umask(old);
	}
	kvp_cache_close(c);
	ck_assert_int_eq(stat(dir, &sb), 0);
	ck_assert_uint_eq(sb.st_mode & 07777, 0700);
}
END_TEST

/* A manifest or a block file that is a FIFO (or a symlink to one):
 * refused or a miss, never an open that waits forever for a writer. */
START_TEST(fifo_no_hang)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	char err[300], path[512], fifo[512];

	put_n(c, 1, 3000, 0);
	put_n(c, 2, 3000, 0);
	alarm(20); /* a hang fails the test */
	/* block 1's file becomes a FIFO after the scan indexed it */
	block_path(1, path, sizeof(path));
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	get_n(c, 1, 3000, -ESPIPE);
	/* block 2's a symlink to a FIFO */
	snprintf(fifo, sizeof(fifo), "%s/tmp.fifo", base);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	block_path(2, path, sizeof(path));
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(symlink(fifo, path), 0);
	{
		struct kvp_rec_key k;
		uint64_t len;
		int fd = -1;

		key_n(&k, 2);
		ck_assert_int_eq(kvp_cache_open_block(c, &k, &fd, &len),
				 -ELOOP);
	}
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.misses, 2);
	kvp_cache_close(c);
	snprintf(path, sizeof(path), "%s/kvpcache", dir);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -EINVAL);
	ck_assert_msg(strstr(err, "not a kvpager cache manifest"), "%s", err);
	alarm(0);
}
END_TEST

/* A block file removed by hand (or by a cleaner of old files) while the
 * cache is open: its get is a miss that forgets the entry, so the block
 * is stored again and its bytes no longer count. */
START_TEST(file_gone_forgotten)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	char path[512];

	put_n(c, 1, 5000, 0);
	put_n(c, 2, 5000, 0);
	block_path(1, path, sizeof(path));
	ck_assert_int_eq(unlink(path), 0);
	get_n(c, 1, 5000, -ENOENT);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 1);
	ck_assert_uint_eq(st.bytes, 8192);
	put_n(c, 1, 5000, 0);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.puts, 3); /* written again, not "present" */
	ck_assert_uint_eq(st.puts_present, 0);
	get_n(c, 1, 5000, 0);
	/* and through open_block */
	block_path(2, path, sizeof(path));
	ck_assert_int_eq(unlink(path), 0);
	{
		struct kvp_rec_key k;
		uint64_t len;
		int fd = -1;

		key_n(&k, 2);
		ck_assert_int_eq(kvp_cache_open_block(c, &k, &fd, &len),
				 -ENOENT);
		ck_assert(!kvp_cache_contains(c, &k));
	}
	kvp_cache_close(c);
}
END_TEST

START_TEST(other_version)
{
	struct kvp_cache *c = open_ok(NULL);
	char err[300], path[512];

	put_n(c, 1, 5000, 0);
	kvp_cache_close(c);
	snprintf(path, sizeof(path), "%s/kvpcache", dir);
	write_file(path, "kvpager-cache 2\n", 16);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -EPROTONOSUPPORT);
	ck_assert_ptr_nonnull(strstr(err, "has format 2, this kvpager reads 1"));
	/* nothing was removed: the blocks are the other version's */
	block_path(1, path, sizeof(path));
	ck_assert_int_eq(access(path, F_OK), 0);
	snprintf(path, sizeof(path), "%s/kvpcache", dir);
	write_file(path, "garbage", 7);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -EINVAL);
	/* nor was anything made: a directory whose kvpcache is another
	 * program's, or another version's, is left as it was */
	snprintf(path, sizeof(path), "%s/kvpcache.lock", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/kvpcache", dir);
	write_file(path, "kvpager-cache 2\n", 16);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -EPROTONOSUPPORT);
	write_file(path, "garbage", 7);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -EINVAL);
	snprintf(path, sizeof(path), "%s/kvpcache.lock", dir);
	ck_assert_msg(access(path, F_OK) != 0,
		      "a refused directory was given kvpcache.lock");
}
END_TEST

/* Flip one byte at off of block n's file. */
static void flip(uint32_t n, off_t off)
{
	char path[512];
	unsigned char b;
	int fd;

	block_path(n, path, sizeof(path));
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

/* A record of a newer format version (what an older kvpager meets in a
 * directory a newer one wrote): counted foreign, a miss, its file kept. */
START_TEST(newer_record_kept)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	char path[512];
	unsigned char v = KVP_REC_VERSION + 1;
	int fd;

	put_n(c, 1, 5000, 0);
	put_n(c, 2, 5000, 0);
	kvp_cache_close(c);
	block_path(1, path, sizeof(path));
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, &v, 1, 8), 1);
	close(fd);
	c = open_ok(NULL);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 1);
	ck_assert_uint_eq(st.dropped_foreign, 1);
	ck_assert_uint_eq(st.dropped_torn, 0);
	get_n(c, 1, 5000, -ENOENT);
	get_n(c, 2, 5000, 0);
	kvp_cache_close(c);
	ck_assert_int_eq(access(path, F_OK), 0);
}
END_TEST

START_TEST(corrupt_blocks)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	char path[512], path2[512];
	uint32_t i;

	for (i = 0; i < 8; i++)
		put_n(c, i, 6000, 0);
	kvp_cache_close(c);
	flip(1, 128 + 3000); /* payload: found at get */
	block_path(2, path, sizeof(path));
	ck_assert_int_eq(truncate(path, 100), 0); /* torn: found at open */
	block_path(3, path, sizeof(path));
	write_file(path, "garbage", 7);
	/* block 5's record under block 4's name: another key */
	block_path(4, path, sizeof(path));
	block_path(5, path2, sizeof(path2));
	ck_assert_int_eq(rename(path2, path), 0);
	/* a crash's unfinished write */
	snprintf(path, sizeof(path), "%s/tmp.0123.99.1", dir);
	write_file(path, "half", 4);
	c = open_ok(NULL);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 4); /* 0 1 6 7, and none of 2 3 4 5 */
	ck_assert_uint_eq(st.dropped_torn, 2);
	ck_assert_uint_eq(st.dropped_foreign, 1);
	ck_assert_uint_eq(st.tmp_removed, 1);
	ck_assert_int_eq(access(path, F_OK), -1);
	get_n(c, 1, 6000, -EBADMSG);
	get_n(c, 1, 6000, -ENOENT);
	for (i = 2; i < 6; i++)
		get_n(c, i, 6000, -ENOENT);
	get_n(c, 0, 6000, 0);
	get_n(c, 6, 6000, 0);
	get_n(c, 7, 6000, 0);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.dropped_torn, 3);
	ck_assert_uint_eq(st.hits, 3);
	ck_assert_uint_eq(st.misses, 6);
	/* the torn block's file is gone: it can be stored again */
	put_n(c, 1, 6000, 0);
	get_n(c, 1, 6000, 0);
	kvp_cache_close(c);
	/* verify_at_open reads every record */
	flip(6, 128 + 10);
	{
		struct kvp_cache_opts o = { .verify_at_open = true };

		c = open_ok(&o);
		kvp_cache_stats(c, &st);
		ck_assert_uint_eq(st.blocks, 3);
		ck_assert_uint_eq(st.dropped_torn, 1);
		kvp_cache_close(c);
	}
}
END_TEST

START_TEST(other_model_misses)
{
	struct kvp_rec_keyctx a, b;
	struct kvp_rec_key ka, kb;
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	uint32_t tokens[16] = { 1, 2, 3 };
	char buf[64];
	uint64_t len;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	kvp_rec_hash("model-a", 7, a.model);
	kvp_rec_hash("model-b", 7, b.model);
	kvp_rec_block_key(&a, NULL, tokens, 16, &ka);
	kvp_rec_block_key(&b, NULL, tokens, 16, &kb);
	ck_assert_int_eq(kvp_cache_put(c, &ka, "model a's KV", 12), 0);
	ck_assert_int_eq(kvp_cache_get(c, &kb, buf, sizeof(buf), &len),
			 -ENOENT);
	/* and a namespace (salt) of the same model */
	kvp_rec_hash("tenant-2", 8, a.salt);
	kvp_rec_block_key(&a, NULL, tokens, 16, &kb);
	ck_assert_int_eq(kvp_cache_get(c, &kb, buf, sizeof(buf), &len),
			 -ENOENT);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.misses, 2);
	ck_assert_uint_eq(st.hits, 0);
	kvp_cache_close(c);
}
END_TEST

START_TEST(eviction)
{
	struct kvp_cache_opts o = { .capacity_bytes = 3 * 8192 };
	struct kvp_cache *c = open_ok(&o);
	struct kvp_cache_stats st;

	put_n(c, 0, 5000, 0);
	put_n(c, 1, 5000, 0);
	put_n(c, 2, 5000, 0);
	get_n(c, 0, 5000, 0); /* 0 is used: 1 is the least recent */
	put_n(c, 3, 5000, 0);
	get_n(c, 1, 5000, -ENOENT);
	get_n(c, 0, 5000, 0);
	put_n(c, 4, 5000, 0); /* 2 goes */
	get_n(c, 2, 5000, -ENOENT);
	get_n(c, 3, 5000, 0);
	get_n(c, 4, 5000, 0);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 2);
	ck_assert_uint_eq(st.evicted_bytes, 2 * 8192);
	ck_assert_uint_le(st.bytes, o.capacity_bytes);
	/* larger than the whole capacity: refused, nothing evicted */
	put_n(c, 5, 30000, -EFBIG);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 3);
	ck_assert_uint_eq(st.put_errors, 1);
	kvp_cache_close(c);
	/* a smaller capacity at open evicts down to it, oldest first */
	o.capacity_bytes = 8192;
	c = open_ok(&o);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, 1);
	kvp_cache_close(c);
}
END_TEST

/* The order of use survives a restart: a hit touches its file. */
START_TEST(recency_after_reopen)
{
	struct kvp_cache_opts o = { .capacity_bytes = 3 * 8192 };
	struct kvp_cache *c = open_ok(&o);

	/* apart by more than a coarse timestamp's tick */
	put_n(c, 0, 5000, 0);
	usleep(50000);
	put_n(c, 1, 5000, 0);
	usleep(50000);
	put_n(c, 2, 5000, 0);
	usleep(50000);
	get_n(c, 0, 5000, 0); /* 0 is used: 1 is the least recent */
	kvp_cache_close(c);
	o.capacity_bytes = 2 * 8192;
	c = open_ok(&o);
	get_n(c, 1, 5000, -ENOENT);
	get_n(c, 0, 5000, 0);
	get_n(c, 2, 5000, 0);
	kvp_cache_close(c);
}
END_TEST

/* A block file whose modification time is before 1970 (set by hand, or
 * by a tool that restored it) is an old use, the first to go, not the
 * newest for ever; and the uses after it keep their order. */
START_TEST(mtime_before_1970)
{
	struct kvp_cache_opts o = { .capacity_bytes = 3 * 8192 };
	struct kvp_cache *c = open_ok(&o);
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = -1000000000 } };
	char path[512];

	put_n(c, 0, 5000, 0);
	put_n(c, 1, 5000, 0);
	kvp_cache_close(c);
	block_path(0, path, sizeof(path));
	ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
	c = open_ok(&o);
	put_n(c, 2, 5000, 0);
	put_n(c, 3, 5000, 0); /* 0 goes, the least recent */
	get_n(c, 0, 5000, -ENOENT);
	get_n(c, 1, 5000, 0); /* 1, then 2 and 3 used */
	get_n(c, 2, 5000, 0);
	get_n(c, 3, 5000, 0);
	put_n(c, 4, 5000, 0); /* 1 goes */
	get_n(c, 1, 5000, -ENOENT);
	get_n(c, 3, 5000, 0);
	kvp_cache_close(c);
}
END_TEST

START_TEST(sealed_at_rest)
{
	struct kvp_rec_cipher k1, k2;
	struct kvp_cache_opts o = { .cipher = &k1 };
	struct kvp_cache *c;
	struct kvp_cache_stats st;
	char path[512];
	unsigned char *file, *plain;
	int fd;

	memset(k1.key, 7, 32);
	memset(k2.key, 8, 32);
	c = open_ok(&o);
	put_n(c, 1, 8000, 0);
	put_n(c, 2, 8000, 0);
	get_n(c, 1, 8000, 0);
	kvp_cache_close(c);
	/* the file does not hold the payload in the clear */
	block_path(1, path, sizeof(path));
	file = malloc(8192);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(read(fd, file, 8192), 8192);
	close(fd);
	plain = payload_n(1, 8000);
	ck_assert(memcmp(file + 128, plain, 64));
	ck_assert_ptr_null(memmem(file, 8192, plain, 16));
	free(file);
	free(plain);
	/* no key, or another key: a counted miss, the file kept */
	c = open_ok(NULL);
	get_n(c, 1, 8000, -EBADMSG);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.dropped_unauth, 1);
	kvp_cache_close(c);
	o.cipher = &k2;
	c = open_ok(&o);
	get_n(c, 1, 8000, -EBADMSG);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.dropped_unauth, 1);
	kvp_cache_close(c);
	ck_assert_int_eq(access(path, F_OK), 0);
	/* tampered: fails authentication */
	flip(2, 128 + 77);
	o.cipher = &k1;
	c = open_ok(&o);
	get_n(c, 1, 8000, 0);
	get_n(c, 2, 8000, -EBADMSG);
	/* a plain block planted where sealed ones are kept */
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.dropped_unauth, 1);
	kvp_cache_close(c);
	c = open_ok(NULL);
	put_n(c, 3, 100, 0);
	kvp_cache_close(c);
	c = open_ok(&o);
	get_n(c, 3, 100, -EBADMSG);
	kvp_cache_close(c);
}
END_TEST

START_TEST(cipher_keys)
{
	struct kvp_rec_cipher k;
	char err[200], path[512];
	unsigned char raw[32];
	const char *hex = "000102030405060708090a0b0c0d0e0f"
			  "101112131415161718191a1b1c1d1e1f\n";
	int i;

	for (i = 0; i < 32; i++)
		raw[i] = (unsigned char)i;
	ck_assert_int_eq(kvp_cache_cipher_parse(hex, strlen(hex), &k, err,
						sizeof(err)),
			 0);
	ck_assert_mem_eq(k.key, raw, 32);
	ck_assert_int_eq(kvp_cache_cipher_parse(raw, 32, &k, err, sizeof(err)),
			 0);
	ck_assert_mem_eq(k.key, raw, 32);
	ck_assert_int_eq(kvp_cache_cipher_parse("abc", 3, &k, err,
						sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "64 hex digits"));
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	snprintf(path, sizeof(path), "%s/key", dir);
	write_file(path, raw, 32);
	ck_assert_int_eq(kvp_cache_cipher_load(path, &k, err, sizeof(err)), 0);
	ck_assert_mem_eq(k.key, raw, 32);
	chmod(path, 0644);
	ck_assert_int_eq(kvp_cache_cipher_load(path, &k, err, sizeof(err)),
			 -EACCES);
	ck_assert_ptr_nonnull(strstr(err, "chmod 600"));
	ck_assert_ptr_null(strstr(err, "0001")); /* never the key */
}
END_TEST

/* ---- a read-only mount and a full disk (tmpfs; root only) ---- */

START_TEST(read_only_dir)
{
	char mnt[256], warn[300];
	struct kvp_cache *c = NULL;
	struct kvp_cache_stats st;

	ck_assert_int_eq(mkdir(dir, 0700), 0);
	if (!kvp_test_mount(mnt, sizeof(mnt), dir, "ro", "tmpfs", "size=1m"))
		return; /* said why */
	snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/ro/c");
	c = open_ok(NULL);
	put_n(c, 1, 3000, 0);
	kvp_cache_close(c);
	ck_assert_int_eq(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL),
			 0);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, NULL, 0, warn,
					sizeof(warn)),
			 0);
	ck_assert_ptr_nonnull(strstr(warn, "not writable"));
	get_n(c, 1, 3000, 0);
	put_n(c, 2, 3000, -EROFS);
	kvp_cache_stats(c, &st);
	ck_assert(st.read_only);
	ck_assert_uint_eq(st.put_errors, 1);
	ck_assert_uint_eq(st.blocks, 1);
	kvp_cache_close(c);
	/* a new cache cannot be made there */
	snprintf(dir, sizeof(dir), "%s/new", mnt);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, NULL, 0, NULL, 0),
			 -EROFS);
	kvp_test_unmount(mnt);
}
END_TEST

/* Take the free space of the filesystem of path (a file there, written
 * until the disk is full); unlink path to give it back. */
static void fill_disk(const char *path)
{
	static char page[4096];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	while (write(fd, page, sizeof(page)) > 0)
		;
	ck_assert_int_eq(errno, ENOSPC);
	close(fd);
}

/* dir: in a fresh tmpfs of 256 KiB and 64 inodes mounted at mnt, where filler names
 * a file for fill_disk.  false: no mount (said why). */
static bool small_disk(char mnt[256], char filler[300])
{
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	if (!kvp_test_mount(mnt, 256, dir, "full", "tmpfs",
			    "size=256k,nr_inodes=64"))
		return false;
	snprintf(filler, 300, "%s/filler", mnt);
	snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/full/c");
	return true;
}

static bool contains_n(struct kvp_cache *c, uint32_t n)
{
	struct kvp_rec_key k;

	key_n(&k, n);
	return kvp_cache_contains(c, &k);
}

/* A full disk is a capacity reached: the least recently used blocks go
 * to make room, and a block older than all of them is not stored. */
START_TEST(full_disk)
{
	enum { PUTS = 40, LEN = 20000 };
	char mnt[256], said[300], filler[300], text[1024];
	int fd, saved;
	ssize_t n;
	struct kvp_cache *c = NULL;
	struct kvp_cache_stats st;
	struct kvp_rec_key k;
	uint32_t i, kept;
	void *p;

	if (!small_disk(mnt, filler))
		return;
	c = open_ok(NULL);
	/* what it says on stderr: into a file */
	snprintf(said, sizeof(said), "%s/said", base);
	fd = open(said, O_RDWR | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	fflush(stderr);
	saved = dup(2);
	dup2(fd, 2);
	/* full, and nothing of the cache's to evict: the put fails */
	fill_disk(filler);
	put_n(c, 99, LEN, -ENOSPC);
	unlink(filler);
	for (i = 0; i < PUTS; i++)
		put_n(c, i, LEN, 0);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, text, sizeof(text) - 1, 0);
	text[n > 0 ? n : 0] = 0;
	close(fd);
	ck_assert_msg(strstr(text, "the disk is full (No space left on "
				   "device)") &&
			      strstr(text, "--cache-capacity"),
		      "said: '%s'", text);
	ck_assert_ptr_null(strstr(strstr(text, "is full") + 1, "is full"));
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.put_errors, 1);
	ck_assert_uint_eq(st.puts, PUTS);
	ck_assert_uint_ge(st.disk_full, 2);
	ck_assert_uint_ge(st.blocks, 5);
	ck_assert_uint_eq(st.evictions, PUTS - st.blocks);
	/* the newest kept, the oldest evicted */
	kept = (uint32_t)st.blocks;
	for (i = 0; i < PUTS; i++)
		ck_assert_msg(contains_n(c, i) == (i >= PUTS - kept),
			      "block %u of %u, %u kept", i, PUTS, kept);
	/* older than every block, on a full disk: not stored, none evicted */
	fill_disk(filler);
	key_n(&k, 100);
	p = payload_n(100, LEN);
	ck_assert_int_eq(kvp_cache_put_at(c, &k, p, LEN, 1), 0);
	free(p);
	unlink(filler);
	ck_assert(!contains_n(c, 100));
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, kept);
	ck_assert_uint_eq(st.evictions, PUTS - kept + 1);
	kvp_cache_close(c);
	/* nothing committed lost but the evicted, no half block left */
	c = open_ok(NULL);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.blocks, kept);
	ck_assert_uint_eq(st.tmp_removed, 0);
	ck_assert_uint_eq(st.dropped_torn, 0);
	for (i = PUTS - kept; i < PUTS; i++)
		get_n(c, i, LEN, 0);
	kvp_cache_close(c);
	kvp_test_unmount(mnt);
}
END_TEST

/* Blocks evicted for room that does not come back (their files held
 * open by readers): a few tries, and the cache is not emptied. */
START_TEST(full_disk_tries_bounded)
{
	enum { BLOCKS = 8, LEN = 20000 };
	char mnt[256], filler[300];
	int fds[BLOCKS];
	struct kvp_cache *c = NULL;
	struct kvp_cache_stats st;
	struct kvp_rec_key k;
	uint64_t len;
	uint32_t i;

	if (!small_disk(mnt, filler))
		return;
	c = open_ok(NULL);
	for (i = 0; i < BLOCKS; i++) {
		put_n(c, i, LEN, 0);
		key_n(&k, i);
		ck_assert_int_eq(kvp_cache_open_block(c, &k, &fds[i], &len),
				 0);
	}
	fill_disk(filler);
	put_n(c, 99, LEN, -ENOSPC);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 3); /* FULL_TRIES */
	ck_assert_uint_eq(st.blocks, BLOCKS - 3);
	ck_assert_uint_eq(st.put_errors, 1);
	ck_assert_uint_eq(st.disk_full, 1);
	for (i = 0; i < BLOCKS; i++)
		close(fds[i]);
	/* the evicted files' room is back */
	put_n(c, 99, LEN, 0);
	for (i = 3; i < BLOCKS; i++)
		get_n(c, i, LEN, 0);
	get_n(c, 99, LEN, 0);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(st.evictions, 3);
	kvp_cache_close(c);
	unlink(filler);
	kvp_test_unmount(mnt);
}
END_TEST

/* Take every inode left on the filesystem mounted at mnt. */
static void take_inodes(const char *mnt)
{
	char path[600];
	unsigned n;

	for (n = 0;; n++) {
		int fd;

		snprintf(path, sizeof(path), "%s/i%u", mnt, n);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
		if (fd < 0)
			break;
		close(fd);
	}
	ck_assert_int_eq(errno, ENOSPC);
}

/* A cache made before the lock file (an older kvpager), on a disk out of
 * inodes (or an inode quota): no lock file can be made, and the
 * manifest's lock is enough where a manifest exists (only a creator
 * needs the lock file); it opens, and its blocks read back. */
START_TEST(no_lock_file_full_disk)
{
	char mnt[256], filler[300], path[600];
	struct kvp_cache *c;

	if (!small_disk(mnt, filler))
		return;
	c = open_ok(NULL);
	put_n(c, 1, 3000, 0);
	kvp_cache_close(c);
	snprintf(path, sizeof(path), "%s/kvpcache.lock", dir);
	ck_assert_int_eq(unlink(path), 0);
	take_inodes(mnt);
	c = open_ok(NULL);
	get_n(c, 1, 3000, 0);
	kvp_cache_close(c);
	kvp_test_unmount(mnt);
}
END_TEST

/* A new cache on a disk out of inodes: no lock file, no manifest, so
 * the open fails, and says why: the disk, not a file the open looked for
 * after the lock file's open failed. */
START_TEST(no_lock_file_new_cache_said)
{
	char mnt[256], filler[300], err[600];
	struct kvp_cache *c = NULL;

	if (!small_disk(mnt, filler))
		return;
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	take_inodes(mnt);
	ck_assert_int_eq(kvp_cache_open(dir, NULL, &c, err, sizeof(err), NULL,
					0),
			 -ENOSPC);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, "cannot open kvpcache.lock: No space left "
				  "on device; free room on its disk, or give "
				  "another --cache-dir"),
		      "said: %s", err);
	kvp_test_unmount(mnt);
}
END_TEST

START_TEST(stat_table)
{
	struct kvp_cache *c = open_ok(NULL);
	struct kvp_cache_stats st;
	size_t i, hits = kvp_cache_stat_count;

	put_n(c, 1, 100, 0);
	get_n(c, 1, 100, 0);
	get_n(c, 2, 100, -ENOENT);
	kvp_cache_stats(c, &st);
	ck_assert_uint_eq(kvp_cache_stat_count, 19);
	for (i = 0; i < kvp_cache_stat_count; i++)
		if (!strcmp(kvp_cache_stat_descs[i].name, "hits_total"))
			hits = i;
	ck_assert_uint_lt(hits, kvp_cache_stat_count);
	ck_assert_int_eq(kvp_cache_stat_descs[hits].kind, KVP_COUNTER);
	ck_assert_uint_eq(kvp_cache_stat_value(&st, hits), 1);
	ck_assert_str_eq(kvp_cache_stat_descs[0].name, "blocks");
	ck_assert_uint_eq(kvp_cache_stat_value(&st, 0), 1);
	kvp_cache_close(c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cache_dir");
	TCase *tc = kvp_test_tcase(s, "dir", 120);
	int failed;

	if (!mkdtemp(root))
		return kvp_test_skip("cannot make a directory in /var/tmp: %s",
				     strerror(errno));
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, put_get_reopen);
	tcase_add_test(tc, one_holder);
	tcase_add_test(tc, locks_writable);
	tcase_add_test(tc, racing_creators);
	tcase_add_test(tc, others_dir);
	tcase_add_test(tc, fifo_no_hang);
	tcase_add_test(tc, file_gone_forgotten);
	tcase_add_test(tc, not_a_cache);
	tcase_add_test(tc, other_version);
	tcase_add_test(tc, newer_record_kept);
	tcase_add_test(tc, corrupt_blocks);
	tcase_add_test(tc, other_model_misses);
	tcase_add_test(tc, eviction);
	tcase_add_test(tc, recency_after_reopen);
	tcase_add_test(tc, mtime_before_1970);
	tcase_add_test(tc, sealed_at_rest);
	tcase_add_test(tc, cipher_keys);
	tcase_add_test(tc, read_only_dir);
	tcase_add_test(tc, full_disk);
	tcase_add_test(tc, full_disk_tries_bounded);
	tcase_add_test(tc, no_lock_file_full_disk);
	tcase_add_test(tc, no_lock_file_new_cache_said);
	tcase_add_test(tc, stat_table);
	failed = kvp_test_run(s);
	kvp_test_rm_tree(root);
	return failed;
}
