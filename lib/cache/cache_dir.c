/*
 * cache_dir.c - the prefix cache directory (see cache_dir.h for the
 * files, the order of a put and the states of a block).
 *
 * Invariants, under c->lock:
 *   1. an entry of the index names a file <key>.kvb that was whole and
 *      synced when it was named (a put's steps 1-4, or found at open);
 *   2. c->bytes is the sum of the entries' file bytes, and stays within
 *      the capacity after every put;
 *   3. a tmp file exists only inside a put (or after a crash, until open).
 */
#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "lib/cache/cache_dir.h"

#define STAT_DESC(n, k, d)                                                     \
	{ k == KVP_COUNTER ? #n "_total" : #n, k, d,                           \
	  offsetof(struct kvp_cache_stats, n) },
const struct kvp_stat_desc kvp_cache_stat_descs[] = {
	KVP_CACHE_STATS(STAT_DESC)
};
#undef STAT_DESC
const size_t kvp_cache_stat_count =
	sizeof(kvp_cache_stat_descs) / sizeof(kvp_cache_stat_descs[0]);

#define MANIFEST      "kvpcache"
#define MANIFEST_TEXT "kvpager-cache 1\n"
#define MANIFEST_TMP  "tmp.kvpcache"
#define LOCK_FILE     "kvpcache.lock"
#define ALIGN	      4096u
#define SUFFIX	      ".kvb"
/* The uses one lookup orders (1 ns of recency each); later ones tie. */
#define LOOKUP_USES   (1ull << 16)

struct entry {
	struct kvp_rec_key key;
	uint64_t file_bytes; /* the record padded to ALIGN */
	uint64_t last_use;   /* recency: larger is newer (its mtime's ns) */
	bool live;	     /* false: a free slot */
};

struct kvp_cache {
	pthread_mutex_t lock;
	int dirfd;		   /* the directory, O_DIRECTORY */
	int lockfd;		   /* LOCK_FILE, flock'ed; -1: read only,
				      or none could be made (lock_dir) */
	int manifestfd;		   /* the manifest, flock'ed too */
	struct kvp_cache_opts o;   /* copy of the options */
	struct kvp_rec_cipher cipher; /* o.cipher points here */
	const struct kvp_cache_io_ops *io;
	struct entry *ents;	   /* the index: open addressing */
	size_t cap;		   /* slots, a power of two */
	size_t used;		   /* live entries */
	uint64_t bytes;		   /* their file bytes */
	pthread_mutex_t use_lock;  /* tick, look_*, in_lookup: apart from
				      lock, which is held across a put's
				      and a get's I/O (kvp_cache_use_now
				      and new_lookup never wait for it) */
	uint64_t tick;		   /* the newest recency handed out: the
				      realtime clock's ns, or above it */
	uint64_t look_next;	   /* in a lookup (kvp_cache_new_lookup):
				      the next use's recency, counting down */
	uint64_t look_floor;	   /* ... to no lower than this */
	bool in_lookup;
	uint64_t seq;		   /* tmp names of this process */
	void *putbuf;		   /* a put's record, kept for the next:
				      its pages are touched already */
	uint64_t putbuf_bytes;	   /* bytes of putbuf */
	struct kvp_cache_stats st; /* counters (blocks, bytes filled in) */
	char *path;		   /* as given, for what is said */
	bool said_full;		   /* the disk-full warning was given */
};

/* ---- the system's file operations -------------------------------------- */

static int sys_open(void *arg, int dirfd, const char *name, int flags,
		    mode_t mode)
{
	int fd = openat(dirfd, name, flags | O_DIRECT | O_CLOEXEC, mode);

	if (fd >= 0)
		return fd;
	if (errno != EINVAL)
		return -errno;
	/* ramfs and others refuse O_DIRECT: buffered, synced all the same */
	fd = openat(dirfd, name, flags | O_CLOEXEC, mode);
	if (fd < 0 && errno == EEXIST && (flags & O_CREAT))
		fd = openat(dirfd, name, (flags & ~O_EXCL) | O_CLOEXEC, mode);
	return fd < 0 ? -errno : fd;
}

static ssize_t sys_pwrite(void *arg, int fd, const void *buf, size_t len,
			  off_t off)
{
	ssize_t n = pwrite(fd, buf, len, off);

	return n < 0 ? -errno : n;
}

static int sys_fsync(void *arg, int fd)
{
	return fsync(fd) ? -errno : 0;
}

static int sys_close(void *arg, int fd)
{
	return close(fd) ? -errno : 0;
}

static int sys_rename(void *arg, int dirfd, const char *from, const char *to)
{
	return renameat(dirfd, from, dirfd, to) ? -errno : 0;
}

static int sys_unlink(void *arg, int dirfd, const char *name)
{
	return unlinkat(dirfd, name, 0) ? -errno : 0;
}

static const struct kvp_cache_io_ops sys_io = {
	.open = sys_open,
	.pwrite = sys_pwrite,
	.fsync = sys_fsync,
	.close = sys_close,
	.rename = sys_rename,
	.unlink = sys_unlink,
};

/* ---- the index ---------------------------------------------------------- */

static size_t key_hash(const struct kvp_rec_key *k)
{
	uint64_t h;

	memcpy(&h, k->b, sizeof(h)); /* a key is already a hash */
	return (size_t)h;
}

/* The slot of key, or of the first free slot where it would go. */
static struct entry *slot_of(struct entry *ents, size_t cap,
			     const struct kvp_rec_key *k)
{
	size_t i = key_hash(k) & (cap - 1);

	while (ents[i].live && memcmp(ents[i].key.b, k->b, sizeof(k->b)))
		i = (i + 1) & (cap - 1);
	return &ents[i];
}

static struct entry *find(struct kvp_cache *c, const struct kvp_rec_key *k)
{
	struct entry *e = slot_of(c->ents, c->cap, k);

	return e->live ? e : NULL;
}

static int grow(struct kvp_cache *c)
{
	size_t ncap = c->cap ? c->cap * 2 : 256, i;
	struct entry *n = calloc(ncap, sizeof(*n));

	if (!n)
		return -ENOMEM;
	for (i = 0; i < c->cap; i++)
		if (c->ents[i].live)
			*slot_of(n, ncap, &c->ents[i].key) = c->ents[i];
	free(c->ents);
	c->ents = n;
	c->cap = ncap;
	return 0;
}

static int insert(struct kvp_cache *c, const struct kvp_rec_key *k,
		  uint64_t file_bytes, uint64_t last_use)
{
	struct entry *e;
	int err;

	if ((c->used + 1) * 2 > c->cap) {
		err = grow(c);
		if (err)
			return err;
	}
	e = slot_of(c->ents, c->cap, k);
	e->key = *k;
	e->file_bytes = file_bytes;
	e->last_use = last_use;
	e->live = true;
	c->used++;
	c->bytes += file_bytes;
	return 0;
}

/* Remove e, moving the entries of its run back (no tombstones). */
static void erase(struct kvp_cache *c, struct entry *e)
{
	size_t i = (size_t)(e - c->ents), j = i, home;

	c->used--;
	c->bytes -= e->file_bytes;
	e->live = false;
	for (;;) {
		j = (j + 1) & (c->cap - 1);
		if (!c->ents[j].live)
			return;
		home = key_hash(&c->ents[j].key) & (c->cap - 1);
		/* j's entry may fill the hole at i unless its home lies
		 * cyclically in (i, j] */
		if ((j > i && (home <= i || home > j)) ||
		    (j < i && (home <= i && home > j))) {
			c->ents[i] = c->ents[j];
			c->ents[j].live = false;
			i = j;
		}
	}
}

static void file_name(const struct kvp_rec_key *k, char out[72])
{
	char hex[65];

	kvp_rec_key_hex(k, hex);
	snprintf(out, 72, "%s" SUFFIX, hex);
}

/* Drop e: from the index, and its file when remove_file. */
static void drop(struct kvp_cache *c, struct entry *e, bool remove_file)
{
	char name[72];

	if (remove_file && !c->st.read_only) {
		file_name(&e->key, name);
		c->io->unlink(c->o.io_arg, c->dirfd, name);
	}
	erase(c, e);
}

/* The least recently used block, or NULL when there is none. */
static struct entry *oldest(const struct kvp_cache *c)
{
	struct entry *old = NULL;

	for (size_t i = 0; i < c->cap; i++)
		if (c->ents[i].live &&
		    (!old || c->ents[i].last_use < old->last_use))
			old = &c->ents[i];
	return old;
}

/* Whether a block of @need bytes used at @use would need room made and is
 * older than every block there: the one evict_lru would take next. */
static bool older_than_all(const struct kvp_cache *c, uint64_t use,
			   uint64_t need)
{
	if (!c->o.capacity_bytes || !c->used ||
	    c->bytes + need <= c->o.capacity_bytes)
		return false;
	return oldest(c)->last_use > use;
}

static void evict(struct kvp_cache *c, struct entry *e)
{
	c->st.evictions++;
	c->st.evicted_bytes += e->file_bytes;
	drop(c, e, true);
}

/* Remove least recently used blocks until need more bytes fit. */
static void evict_lru(struct kvp_cache *c, uint64_t need)
{
	while (c->o.capacity_bytes && c->used &&
	       c->bytes + need > c->o.capacity_bytes)
		evict(c, oldest(c));
}

/* Writes of a put on a full disk after the first, each after room is
 * made: space freed may not come back (a block file a reader still
 * holds open), or be taken again by others; the cache is not emptied
 * for a disk that stays full. */
#define FULL_TRIES 3

static bool disk_full(int err)
{
	return err == -ENOSPC || err == -EDQUOT;
}

/*
 * The disk is full (or the quota): room for need bytes, made as a
 * capacity makes it, least recently used first, but no block newer than
 * the put's (used at use): where that is the oldest, it is the one to
 * go.  Returns the bytes freed (0: none).
 */
static uint64_t make_room(struct kvp_cache *c, uint64_t use, uint64_t need)
{
	uint64_t freed = 0;
	struct entry *old;

	while (freed < need && (old = oldest(c)) && old->last_use <= use) {
		freed += old->file_bytes;
		evict(c, old);
	}
	return freed;
}

/* Once: without it the cache only evicts (or stops storing) quietly. */
static void say_disk_full(struct kvp_cache *c, int err)
{
	if (c->said_full)
		return;
	c->said_full = true;
	fprintf(stderr,
		"kvpager: cache dir '%s': the disk is full (%s): the least "
		"recently used blocks are evicted to make room; give the "
		"cache a capacity below the free space there "
		"(--cache-capacity)\n",
		c->path, strerror(-err));
}

/* ---- reading a block file ----------------------------------------------- */

static uint64_t round_up(uint64_t n)
{
	return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* Read len bytes (a multiple of ALIGN, or the file's end) of name into an
 * aligned buffer, released with kvp_mem_io_free(*out, len); *got gets
 * what was read.  0 or -errno. */
static int read_file(struct kvp_cache *c, const char *name, uint64_t len,
		     void **out, uint64_t *got)
{
	void *buf = NULL;
	uint64_t done = 0;
	int fd, err = 0;

	/* a name that is a symlink or a FIFO now (put there since the scan)
	 * fails at once rather than waiting for a writer: a miss */
	fd = c->io->open(c->o.io_arg, c->dirfd, name,
			 O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
	if (fd < 0)
		return fd;
	/* whole pages: it holds round_up(len) */
	_Static_assert(KVP_PAGE_SIZE % ALIGN == 0, "ALIGN divides a page");
	buf = kvp_mem_io_alloc(len);
	if (!buf) {
		c->io->close(c->o.io_arg, fd);
		return -ENOMEM;
	}
	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, round_up(len) - done,
				  (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = -errno;
			break;
		}
		done += (uint64_t)n;
		if ((uint64_t)n < round_up(len) - (done - (uint64_t)n))
			break; /* the file's end (O_DIRECT: no read past it) */
	}
	c->io->close(c->o.io_arg, fd);
	if (err) {
		kvp_mem_io_free(buf, len);
		return err;
	}
	c->st.bytes_read += done;
	*out = buf;
	*got = done;
	return 0;
}

/* What a failed kvp_rec_open counts as. */
static void count_drop(struct kvp_cache *c, int err)
{
	if (err == -EKEYREJECTED || err == -EPROTONOSUPPORT)
		c->st.dropped_foreign++;
	else if (err == -ENOKEY || err == -EACCES ||
		 (err == -EBADMSG && c->o.cipher))
		c->st.dropped_unauth++;
	else
		c->st.dropped_torn++;
}

/* A torn or corrupt file is removed; a record that fails for want of the
 * right cipher key, or of another version, may be someone's: kept. */
static bool removable(const struct kvp_cache *c, int err)
{
	return err == -EINVAL || (err == -EBADMSG && !c->o.cipher);
}

/* ---- open --------------------------------------------------------------- */

static bool is_tmp(const char *name)
{
	return !strncmp(name, "tmp.", 4);
}

/* The key of a block file's name, or -EINVAL for another name. */
static int name_key(const char *name, struct kvp_rec_key *k)
{
	char hex[65];

	if (strlen(name) != 64 + strlen(SUFFIX) || strcmp(name + 64, SUFFIX))
		return -EINVAL;
	memcpy(hex, name, 64);
	hex[64] = 0;
	return kvp_rec_key_parse(hex, k);
}

/* The highest recency a file's time gives (2^62 ns: the year 2116), far
 * below where the ticks after it (kvp_cache_new_lookup's) would wrap. */
#define USE_MAX (1ull << 62)

/* A file's modification time as a recency: a time before 1970 (set by
 * hand, or restored by a tool) is the oldest, 0, not a huge unsigned
 * number that would be the newest for ever and wrap the ticks after it;
 * one past USE_MAX is USE_MAX. */
static uint64_t mtime_use(const struct stat *sb)
{
	uint64_t s;

	if (sb->st_mtim.tv_sec < 0)
		return 0;
	s = (uint64_t)sb->st_mtim.tv_sec;
	if (s >= USE_MAX / 1000000000ull)
		return USE_MAX;
	return s * 1000000000ull + (uint64_t)sb->st_mtim.tv_nsec;
}

/* Index the block file name (or remove it when it is not one). */
static int scan_one(struct kvp_cache *c, const char *name)
{
	struct kvp_rec_key k, hk;
	struct stat sb;
	uint64_t plen, got, last, want;
	void *buf = NULL;
	int err;

	if (name_key(name, &k))
		return 0; /* not ours: left alone */
	if (fstatat(c->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISREG(sb.st_mode))
		return 0;
	want = c->o.verify_at_open ? round_up((uint64_t)sb.st_size) : ALIGN;
	err = read_file(c, name, want, &buf, &got);
	if (err == -ENOMEM)
		return err;
	if (err)
		goto bad;
	err = kvp_rec_peek(buf, got, &hk, &plen, NULL);
	if (!err && memcmp(hk.b, k.b, sizeof(k.b)))
		err = -EKEYREJECTED; /* renamed by hand, or garbage */
	if (!err && kvp_rec_size(plen) > (uint64_t)sb.st_size)
		err = -EINVAL; /* shorter than its header says: torn */
	if (!err && c->o.verify_at_open) {
		const void *p;

		err = kvp_rec_open(buf, got, &k, c->o.cipher, &p, &plen);
	}
	kvp_mem_io_free(buf, want);
	buf = NULL;
	if (err)
		goto bad;
	last = mtime_use(&sb);
	return insert(c, &k, round_up((uint64_t)sb.st_size), last);
bad:
	kvp_mem_io_free(buf, want);
	count_drop(c, err);
	if (removable(c, err) && !c->st.read_only)
		c->io->unlink(c->o.io_arg, c->dirfd, name);
	return 0;
}

/* Recency ticks continue after the newest mtime found. */
static void ticks_from_scan(struct kvp_cache *c)
{
	size_t i;

	for (i = 0; i < c->cap; i++)
		if (c->ents[i].live && c->ents[i].last_use > c->tick)
			c->tick = c->ents[i].last_use;
}

/* A stream of the directory dirfd's entries (its own descriptor, so
 * that closedir leaves dirfd open).  0 or -errno. */
static int list_dir(int dirfd, DIR **out)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	*out = fdopendir(fd);
	if (!*out) {
		int err = -errno;

		close(fd);
		return err;
	}
	return 0;
}

static int scan(struct kvp_cache *c)
{
	struct dirent *de;
	DIR *d;
	int err = list_dir(c->dirfd, &d);

	if (err)
		return err;
	while (!err && (de = readdir(d))) {
		if (is_tmp(de->d_name)) {
			if (!c->st.read_only &&
			    !c->io->unlink(c->o.io_arg, c->dirfd, de->d_name))
				c->st.tmp_removed++;
			continue;
		}
		err = scan_one(c, de->d_name);
	}
	closedir(d);
	ticks_from_scan(c);
	return err;
}

static bool has_manifest(const struct kvp_cache *c)
{
	return !faccessat(c->dirfd, MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW);
}

/* 1 when the directory holds nothing but "." and ".." and what a
 * creator of a cache makes before its manifest (another's, racing this
 * open, or a crash's): the lock file, the manifest's tmp file. */
static int dir_empty(int dirfd)
{
	struct dirent *de;
	DIR *d;
	int empty = 1, err = list_dir(dirfd, &d);

	if (err)
		return err;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strcmp(de->d_name, LOCK_FILE) &&
		    strcmp(de->d_name, MANIFEST_TMP))
			empty = 0;
	closedir(d);
	return empty;
}

/* Write the manifest of a new cache, in a put's order. */
static int write_manifest(struct kvp_cache *c)
{
	static const char tmp[] = MANIFEST_TMP;
	int fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			0600);
	size_t n = strlen(MANIFEST_TEXT);
	int err = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, MANIFEST_TEXT, n) != (ssize_t)n || fsync(fd))
		err = errno ? -errno : -EIO;
	close(fd);
	if (!err && renameat(c->dirfd, tmp, c->dirfd, MANIFEST))
		err = -errno;
	if (!err && fsync(c->dirfd))
		err = -errno;
	if (err)
		unlinkat(c->dirfd, tmp, 0);
	return err;
}

/* " (pid N, COMM)": who holds a flock on fd's file, from /proc/locks
 * (the process that took it), or "" where that cannot be told. */
static void lock_holder(int fd, char *out, size_t len)
{
	char line[256], comm[64] = "", path[64];
	unsigned maj, min;
	unsigned long ino;
	struct stat sb;
	FILE *f, *cf;
	int pid;

	*out = 0;
	if (fstat(fd, &sb) || !(f = fopen("/proc/locks", "re")))
		return;
	while (fgets(line, sizeof(line), f)) {
		/* "1: FLOCK  ADVISORY  WRITE 1234 08:02:5678 0 EOF"; a
		 * waiter's line has "->" after the number */
		if (sscanf(line, "%*d: FLOCK %*s %*s %d %x:%x:%lu", &pid, &maj,
			   &min, &ino) != 4 ||
		    pid <= 0 || /* another pid namespace's */
		    ino != (unsigned long)sb.st_ino ||
		    maj != major(sb.st_dev) || min != minor(sb.st_dev))
			continue;
		snprintf(path, sizeof(path), "/proc/%d/comm", pid);
		cf = fopen(path, "re");
		if (cf) {
			if (fgets(comm, sizeof(comm), cf))
				comm[strcspn(comm, "\n")] = 0;
			fclose(cf);
		}
		snprintf(out, len, " (pid %d%s%s)", pid, *comm ? ", " : "",
			 comm);
		break;
	}
	fclose(f);
}

/* Lock fd (the lock file, or the manifest) for this process alone: 0, or
 * -EBUSY with the holder named in err. */
static int lock_one(int fd, const char *path, char *err, size_t errlen)
{
	char who[128];
	int e;

	if (!flock(fd, LOCK_EX | LOCK_NB))
		return 0;
	e = errno;
	if (e != EWOULDBLOCK) {
		snprintf(err, errlen, "cache dir '%s': cannot lock it: %s",
			 path, strerror(e));
		return -e;
	}
	lock_holder(fd, who, sizeof(who));
	snprintf(err, errlen,
		 "cache dir '%s' is in use by another process%s: give each "
		 "its own --cache-dir",
		 path, who);
	return -EBUSY;
}

/*
 * Lock the directory for this process's writes, before the manifest is
 * looked at: a creator renames a new manifest into place, so a lock on
 * the manifest alone could be on a file no longer named.  The lock is a
 * file's that is never renamed nor removed, opened for writing: NFS
 * emulates flock with byte-range locks and refuses an exclusive one on
 * a descriptor opened read only (EBADF), as a directory's always is.
 * 0 or -errno with err set.
 */
static int lock_dir(struct kvp_cache *c, const char *path, char *err,
		    size_t errlen)
{
	int e;

	c->lockfd = openat(c->dirfd, LOCK_FILE,
			   O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW |
				   O_NONBLOCK,
			   0600);
	if (c->lockfd < 0) {
		e = -errno;
		/* a cache made before the lock file, on a disk out of room or
		 * inodes: only a creator needs the lock file; the manifest's
		 * lock keeps out the others, as a read-only opener's does */
		if (disk_full(e) && has_manifest(c))
			return 0;
		/* e, not errno: has_manifest's faccessat set it (ENOENT) */
		snprintf(err, errlen, "cache dir '%s': cannot open %s: %s%s",
			 path, LOCK_FILE, strerror(-e),
			 disk_full(e) ? "; free room on its disk, or give "
					"another --cache-dir"
				      : "");
		return e;
	}
	return lock_one(c->lockfd, path, err, errlen);
}

/* Check the manifest's version; lock it.  0 or -errno with err set. */
/* Is @fd's text this kvpager's manifest?  0 or -errno with err set. */
static int manifest_check(int fd, const char *path, char *err, size_t errlen)
{
	char text[64] = "";
	unsigned ver = 0;
	ssize_t n;

	n = pread(fd, text, sizeof(text) - 1, 0);
	if (n < 0 || sscanf(text, "kvpager-cache %u", &ver) != 1) {
		snprintf(err, errlen,
			 "cache dir '%s': %s is not a kvpager cache manifest; "
			 "use another directory",
			 path, MANIFEST);
		return -EINVAL;
	}
	if (ver != KVP_CACHE_FORMAT) {
		snprintf(err, errlen,
			 "cache dir '%s' has format %u, this kvpager reads %u: "
			 "use another --cache-dir (or remove this one)",
			 path, ver, KVP_CACHE_FORMAT);
		return -EPROTONOSUPPORT;
	}
	return 0;
}

static int take_manifest(struct kvp_cache *c, const char *path, char *err,
			 size_t errlen)
{
	int e;

	/* for writing, as the lock file (NFS); read only, it cannot be, and
	 * on NFS its lock then fails: such a cache is opened on NFS only
	 * where it may be written.  A FIFO there would wait for a writer:
	 * it fails to read instead */
	c->manifestfd = openat(c->dirfd, MANIFEST,
			       (c->st.read_only ? O_RDONLY : O_RDWR) |
				       O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (c->manifestfd < 0) {
		snprintf(err, errlen, "cache dir '%s': cannot open %s: %s",
			 path, MANIFEST, strerror(errno));
		return -errno;
	}
	e = manifest_check(c->manifestfd, path, err, errlen);
	if (e)
		return e;
	/* the lock file's lock is this kvpager's; the manifest's keeps out
	 * an older one, which locks only that (or the directory), and a
	 * read-only opener, which takes no lock file */
	return lock_one(c->manifestfd, path, err, errlen);
}

/*
 * The directory must be this user's (or root's) and closed to others'
 * writes: a block planted there by another user would be served as this
 * user's KV (a plain record's checksum is no signature).  A symlink is
 * followed, and the directory it names is what is checked.
 */
static int check_owner(int dirfd, const char *path, char *err,
		       size_t errlen)
{
	uid_t me = geteuid();
	struct stat sb;

	if (fstat(dirfd, &sb)) {
		snprintf(err, errlen, "cache dir '%s': %s", path,
			 strerror(errno));
		return -errno;
	}
	if (sb.st_uid != me && sb.st_uid != 0) {
		snprintf(err, errlen,
			 "cache dir '%s' belongs to uid %u, not to you (uid "
			 "%u): refusing blocks another user could plant; use "
			 "a directory of yours",
			 path, (unsigned)sb.st_uid, (unsigned)me);
		return -EPERM;
	}
	if (sb.st_mode & 022) {
		snprintf(err, errlen,
			 "cache dir '%s': others may write in it (mode %04o) "
			 "and plant blocks there: chmod 700 %s",
			 path, (unsigned)(sb.st_mode & 07777), path);
		return -EPERM;
	}
	return 0;
}

int kvp_cache_open(const char *path, const struct kvp_cache_opts *opts,
		   struct kvp_cache **out, char *err, size_t errlen,
		   char *warn, size_t warnlen)
{
	static const struct kvp_cache_opts none;
	char dummy[8];
	struct kvp_cache *c;
	int e, empty;

	if (!err) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	*err = 0;
	if (warn && warnlen)
		*warn = 0;
	if (!opts)
		opts = &none;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->use_lock, NULL);
	c->dirfd = c->lockfd = c->manifestfd = -1;
	c->o = *opts;
	if (opts->cipher) {
		c->cipher = *opts->cipher;
		c->o.cipher = &c->cipher;
	}
	c->io = opts->io ? opts->io : &sys_io;
	c->st.read_only = opts->read_only;
	c->st.capacity_bytes = opts->capacity_bytes;
	c->path = strdup(path);
	if (!c->path) {
		e = -ENOMEM;
		goto fail;
	}
	if (mkdir(path, 0700) && errno != EEXIST) {
		e = -errno;
		snprintf(err, errlen, "cache dir '%s': cannot create it: %s%s",
			 path, strerror(errno),
			 e == -ENOENT ? " (parents are not made: mkdir -p "
					"its parent first)" :
					"");
		goto fail;
	}
	c->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->dirfd < 0) {
		e = -errno;
		/* mkdir found a name there: a symlink to nothing */
		snprintf(err, errlen, "cache dir '%s': %s%s", path,
			 strerror(errno),
			 e == -ENOENT ? " (a symlink to a missing directory: "
					"make its target, or give another)" :
					"");
		goto fail;
	}
	e = check_owner(c->dirfd, path, err, errlen);
	if (e)
		goto fail;
	if (!c->st.read_only && faccessat(c->dirfd, ".", W_OK, AT_EACCESS)) {
		c->st.read_only = true;
		if (warn)
			snprintf(warn, warnlen,
				 "cache dir '%s' is not writable (%s): read "
				 "only, nothing new is stored",
				 path, strerror(errno));
	}
	/* before the lock file is made: someone's directory stays as it is;
	 * files with a manifest made meanwhile are a racing creator's */
	if (!has_manifest(c)) {
		empty = dir_empty(c->dirfd);
		e = empty < 0 ? empty : -ENOTEMPTY;
		if (empty < 0 || (!empty && !has_manifest(c))) {
			snprintf(err, errlen,
				 "cache dir '%s' has files but no %s: not a "
				 "kvpager cache; give a new or empty directory",
				 path, MANIFEST);
			goto fail;
		}
	}
	/* a manifest there is checked before the lock file is made (and
	 * again under the lock): a directory refused for it stays as it was */
	if (has_manifest(c)) {
		int fd = openat(c->dirfd, MANIFEST,
				O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

		e = fd < 0 ? 0 : manifest_check(fd, path, err, errlen);
		if (fd >= 0)
			close(fd);
		if (e)
			goto fail;
	}
	/* read only, no manifest is made: the manifest's lock is enough */
	e = c->st.read_only ? 0 : lock_dir(c, path, err, errlen);
	if (e)
		goto fail;
	if (!has_manifest(c)) { /* again, under the lock: made by now? */
		e = c->st.read_only ? -EROFS : write_manifest(c);
		if (e) {
			snprintf(err, errlen,
				 "cache dir '%s': cannot create the cache: %s",
				 path, strerror(-e));
			goto fail;
		}
	}
	e = take_manifest(c, path, err, errlen);
	if (e)
		goto fail;
	e = grow(c);
	if (!e)
		e = scan(c);
	if (e) {
		snprintf(err, errlen, "cache dir '%s': cannot index it: %s",
			 path, strerror(-e));
		goto fail;
	}
	if (!c->st.read_only)
		evict_lru(c, 0);
	*out = c;
	return 0;
fail:
	kvp_cache_close(c);
	return e;
}

int kvp_cache_keyctx(struct kvp_cache *c, struct kvp_rec_keyctx *ctx)
{
	return c->o.cipher ? kvp_rec_keyctx_cipher(ctx, c->o.cipher) : 0;
}

void kvp_cache_close(struct kvp_cache *c)
{
	if (!c)
		return;
	if (c->manifestfd >= 0)
		close(c->manifestfd); /* drops the flock */
	if (c->lockfd >= 0)
		close(c->lockfd);
	if (c->dirfd >= 0)
		close(c->dirfd);
	free(c->ents);
	kvp_mem_io_free(c->putbuf, c->putbuf_bytes);
	free(c->path);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->use_lock);
	free(c);
}

/* ---- put, get, remove ----------------------------------------------------- */

bool kvp_cache_contains(struct kvp_cache *c, const struct kvp_rec_key *key)
{
	bool yes;

	pthread_mutex_lock(&c->lock);
	yes = find(c, key) != NULL;
	pthread_mutex_unlock(&c->lock);
	return yes;
}

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The recency of a use now: newer than every one before; in a lookup,
 * older than the lookup's earlier uses (newer than all before it). */
static uint64_t next_use(struct kvp_cache *c)
{
	uint64_t now, use;

	pthread_mutex_lock(&c->use_lock);
	if (c->in_lookup) {
		use = c->look_next > c->look_floor ? c->look_next-- :
						     c->look_floor;
	} else {
		now = wall_ns();
		c->tick = now > c->tick ? now : c->tick + 1;
		use = c->tick;
	}
	pthread_mutex_unlock(&c->use_lock);
	return use;
}

/* A recency as a file's times: the modification time, atime left. */
static void use_times(uint64_t use, struct timespec ts[2])
{
	ts[0] = (struct timespec){ .tv_nsec = UTIME_OMIT };
	ts[1] = (struct timespec){ .tv_sec = (time_t)(use / 1000000000ull),
				   .tv_nsec = (long)(use % 1000000000ull) };
}

/*
 * e was used: its recency use (used: now, next_use), here and (its file's
 * modification time, which open reads back) after a restart.  The time
 * is metadata: the block's data is never written again.  fd: the
 * file's, or -1.  A failure (a read-only directory) only loses that
 * order at the next open.
 */
static void used_at(struct kvp_cache *c, struct entry *e, int fd,
		    uint64_t use)
{
	struct timespec ts[2];
	char name[72];

	e->last_use = use;
	if (c->st.read_only)
		return;
	use_times(e->last_use, ts);
	if (fd >= 0) {
		(void)futimens(fd, ts);
		return;
	}
	file_name(&e->key, name);
	(void)utimensat(c->dirfd, name, ts, AT_SYMLINK_NOFOLLOW);
}

static void used(struct kvp_cache *c, struct entry *e, int fd)
{
	used_at(c, e, fd, next_use(c));
}

void kvp_cache_new_lookup(struct kvp_cache *c)
{
	uint64_t now = wall_ns(), top;

	pthread_mutex_lock(&c->use_lock);
	/* above every recency so far, with room below for its uses */
	top = c->tick + LOOKUP_USES;
	if (now > top)
		top = now;
	c->tick = top;
	c->look_next = top;
	c->look_floor = top - LOOKUP_USES + 1;
	c->in_lookup = true;
	pthread_mutex_unlock(&c->use_lock);
}

uint64_t kvp_cache_use_now(struct kvp_cache *c)
{
	return next_use(c); /* under use_lock alone: no wait for I/O */
}

/* Steps 1-4 of a put (cache_dir.h) for the sealed record in buf. */
static int write_block(struct kvp_cache *c, const struct kvp_rec_key *key,
		       const void *buf, uint64_t file_bytes, uint64_t use)
{
	struct timespec ts[2];
	char name[72], tmp[96], hex[65];
	uint64_t done = 0;
	int fd, err = 0;

	kvp_rec_key_hex(key, hex);
	snprintf(tmp, sizeof(tmp), "tmp.%.16s.%ld.%llu", hex, (long)getpid(),
		 (unsigned long long)++c->seq);
	file_name(key, name);
	fd = c->io->open(c->o.io_arg, c->dirfd, tmp,
			 O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return fd;
	while (!err && done < file_bytes) {
		ssize_t n = c->io->pwrite(c->o.io_arg, fd,
					  (const char *)buf + done,
					  file_bytes - done, (off_t)done);

		if (n == -EINTR)
			continue;
		if (n < 0)
			err = (int)n;
		else if (n == 0)
			err = -EIO;
		else
			done += (uint64_t)n;
	}
	if (!err) {
		/* its recency, as a hit sets it (used): synced with it */
		use_times(use, ts);
		(void)futimens(fd, ts);
		err = c->io->fsync(c->o.io_arg, fd); /* data first */
	}
	c->io->close(c->o.io_arg, fd);
	if (!err)
		err = c->io->rename(c->o.io_arg, c->dirfd, tmp, name);
	if (err) {
		c->io->unlink(c->o.io_arg, c->dirfd, tmp);
		return err;
	}
	c->st.bytes_written += done;
	/* the name: once synced, committed; if this fails the name may or
	 * may not survive a crash, and a whole record is there either way */
	err = c->io->fsync(c->o.io_arg, c->dirfd);
	if (err)
		c->io->unlink(c->o.io_arg, c->dirfd, name);
	return err;
}

/* The record of a put: sealed from a payload, or read from a descriptor
 * that holds one already verified (kvp_cache_put_fd). */
struct put_src {
	const void *payload; /* or NULL: read from fd */
	int fd;
	uint64_t use; /* its recency (kvp_cache_use_now), or 0: now */
};

/* Fill buf (file_bytes, the record's rec_bytes and zeros) from src. */
static int put_fill(struct kvp_cache *c, const struct kvp_rec_key *key,
		    const struct put_src *src, uint64_t len, void *buf,
		    uint64_t rec_bytes, uint64_t file_bytes)
{
	struct kvp_rec_key hk;
	uint64_t done = 0, hlen;
	uint32_t flags;
	int err;

	memset((char *)buf + rec_bytes, 0, file_bytes - rec_bytes);
	if (src->payload)
		return kvp_rec_seal(key, src->payload, len, c->o.cipher, buf);
	while (done < rec_bytes) {
		ssize_t n = pread(src->fd, (char *)buf + done,
				  rec_bytes - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (uint64_t)n;
	}
	/* the caller verified the payload; the header must still be this
	 * key's, of this length, sealed exactly when this cache seals */
	err = kvp_rec_peek(buf, rec_bytes, &hk, &hlen, &flags);
	if (!err && (memcmp(&hk, key, sizeof(hk)) || hlen != len ||
		     !(flags & KVP_REC_FLAG_SEALED) != !c->o.cipher))
		err = -EINVAL;
	return err;
}

static int put_common(struct kvp_cache *c, const struct kvp_rec_key *key,
		      const struct put_src *src, uint64_t len)
{
	uint64_t rec_bytes = kvp_rec_size(len), file_bytes = round_up(rec_bytes);
	struct entry *e;
	uint64_t use;
	void *buf = NULL;
	int err, tries;

	if (len > KVP_REC_MAX_PAYLOAD)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	err = 0;
	e = find(c, key);
	if (e) {
		/* a use by the putter's prompt (one that computed it while
		 * another's copy was queued): its place, where newer */
		use = src->use ? src->use : next_use(c);
		if (use > e->last_use)
			used_at(c, e, -1, use);
		c->st.puts_present++;
		goto out;
	}
	err = -EROFS;
	if (c->st.read_only)
		goto fail;
	err = -EFBIG;
	if (c->o.capacity_bytes && file_bytes > c->o.capacity_bytes)
		goto fail;
	use = src->use ? src->use : next_use(c);
	if (older_than_all(c, use, file_bytes))
		goto least_useful;
	err = -ENOMEM;
	if (c->putbuf_bytes < file_bytes) {
		kvp_mem_io_free(c->putbuf, c->putbuf_bytes);
		c->putbuf = NULL;
		c->putbuf_bytes = 0;
		c->putbuf = kvp_mem_io_alloc(file_bytes);
		if (!c->putbuf)
			goto fail;
		c->putbuf_bytes = file_bytes;
	}
	buf = c->putbuf;
	err = put_fill(c, key, src, len, buf, rec_bytes, file_bytes);
	if (err)
		goto fail;
	evict_lru(c, file_bytes);
	err = write_block(c, key, buf, file_bytes, use);
	if (disk_full(err)) {
		c->st.disk_full++;
		say_disk_full(c, err);
	}
	for (tries = 0; disk_full(err) && tries < FULL_TRIES; tries++) {
		if (!make_room(c, use, file_bytes)) {
			if (c->used)
				goto least_useful;
			break; /* nothing of the cache's to free */
		}
		err = write_block(c, key, buf, file_bytes, use);
	}
	if (err)
		goto fail;
	err = insert(c, key, file_bytes, use);
	if (err)
		goto fail; /* committed on disk; found again at the next open */
	c->st.puts++;
	c->st.payload_written += len;
	goto out;
least_useful:
	/* the least useful block of a full cache (or disk) is this one (a
	 * prompt's chunk past those kept, which a hit cannot reach without
	 * them): evicted at once, never written */
	err = 0;
	c->st.evictions++;
	c->st.evicted_bytes += file_bytes;
	goto out;
fail:
	c->st.put_errors++;
out:
	pthread_mutex_unlock(&c->lock);
	return err;
}

int kvp_cache_put(struct kvp_cache *c, const struct kvp_rec_key *key,
		  const void *payload, uint64_t len)
{
	return kvp_cache_put_at(c, key, payload, len, 0);
}

int kvp_cache_put_fd(struct kvp_cache *c, const struct kvp_rec_key *key,
		     int fd, uint64_t len)
{
	return kvp_cache_put_fd_at(c, key, fd, len, 0);
}

int kvp_cache_put_at(struct kvp_cache *c, const struct kvp_rec_key *key,
		     const void *payload, uint64_t len, uint64_t use)
{
	struct put_src src = { .payload = payload, .fd = -1, .use = use };

	return put_common(c, key, &src, len);
}

int kvp_cache_put_fd_at(struct kvp_cache *c, const struct kvp_rec_key *key,
			int fd, uint64_t len, uint64_t use)
{
	struct put_src src = { .payload = NULL, .fd = fd, .use = use };

	return put_common(c, key, &src, len);
}

int kvp_cache_get(struct kvp_cache *c, const struct kvp_rec_key *key,
		  void *buf, size_t cap, uint64_t *len)
{
	struct entry *e;
	char name[72];
	void *rec = NULL;
	const void *p;
	uint64_t got, n, rec_len = 0; /* e may go: its file_bytes */
	int err;

	pthread_mutex_lock(&c->lock);
	e = find(c, key);
	err = -ENOENT;
	if (!e)
		goto miss;
	file_name(key, name);
	rec_len = e->file_bytes;
	err = read_file(c, name, rec_len, &rec, &got);
	if (err == -ENOENT)
		erase(c, e); /* removed by hand: forgotten, stored again */
	if (err)
		goto miss;
	err = kvp_rec_open(rec, got, key, c->o.cipher, &p, &n);
	if (err) {
		count_drop(c, err);
		drop(c, e, removable(c, err));
		err = -EBADMSG;
		goto miss;
	}
	*len = n;
	err = -EMSGSIZE;
	if (n > cap)
		goto out;
	memcpy(buf, p, n);
	used(c, e, -1);
	c->st.hits++;
	err = 0;
	goto out;
miss:
	c->st.misses++;
out:
	pthread_mutex_unlock(&c->lock);
	kvp_mem_io_free(rec, rec_len);
	return err;
}

int kvp_cache_open_block(struct kvp_cache *c, const struct kvp_rec_key *key,
			 int *fd, uint64_t *len)
{
	unsigned char hdr[KVP_REC_HEADER_BYTES];
	struct kvp_rec_key hk;
	struct entry *e;
	struct stat sb;
	char name[72];
	uint64_t n;
	uint32_t flags;
	ssize_t got;
	int f = -1, err;

	if (c->o.cipher)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&c->lock);
	e = find(c, key);
	err = -ENOENT;
	if (!e)
		goto miss;
	file_name(key, name);
	/* buffered: the reader's offsets are the payload's, not aligned */
	f = openat(c->dirfd, name,
		   O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	err = -errno;
	if (f < 0 && err == -ENOENT)
		erase(c, e); /* removed by hand: forgotten, stored again */
	if (f < 0)
		goto miss;
	do
		got = pread(f, hdr, sizeof(hdr), 0);
	while (got < 0 && errno == EINTR);
	err = got < 0 ? -errno : 0;
	if (err || fstat(f, &sb)) {
		err = err ? err : -errno;
		goto miss;
	}
	c->st.bytes_read += (uint64_t)got;
	err = kvp_rec_peek(hdr, (size_t)got, &hk, &n, &flags);
	if (!err && memcmp(hk.b, key->b, sizeof(hk.b)))
		err = -EKEYREJECTED;
	if (!err && (flags & KVP_REC_FLAG_SEALED))
		err = -ENOKEY; /* sealed, and this cache has no key */
	if (!err && kvp_rec_size(n) > (uint64_t)sb.st_size)
		err = -EINVAL; /* shorter than its header says: torn */
	if (err) {
		count_drop(c, err);
		drop(c, e, removable(c, err));
		err = -EBADMSG;
		goto miss;
	}
	used(c, e, f);
	c->st.hits++;
	pthread_mutex_unlock(&c->lock);
	*fd = f;
	*len = n;
	return 0;
miss:
	c->st.misses++;
	pthread_mutex_unlock(&c->lock);
	if (f >= 0)
		close(f);
	return err;
}

/* Is fd's file the one named by key (or is there none by that name)? */
static bool names_fd(struct kvp_cache *c, const struct kvp_rec_key *key,
		     int fd)
{
	struct stat a, b;
	char name[72];

	file_name(key, name);
	if (fd < 0 || fstat(fd, &a) ||
	    fstatat(c->dirfd, name, &b, AT_SYMLINK_NOFOLLOW))
		return true;
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void kvp_cache_reject(struct kvp_cache *c, const struct kvp_rec_key *key,
		      int fd, int err)
{
	struct entry *e;

	pthread_mutex_lock(&c->lock);
	count_drop(c, err);
	e = find(c, key);
	if (e && names_fd(c, key, fd))
		drop(c, e, removable(c, err));
	pthread_mutex_unlock(&c->lock);
}

int kvp_cache_remove(struct kvp_cache *c, const struct kvp_rec_key *key)
{
	struct entry *e;
	int err = 0;

	pthread_mutex_lock(&c->lock);
	e = find(c, key);
	if (!e)
		err = -ENOENT;
	else if (c->st.read_only)
		err = -EROFS;
	else
		drop(c, e, true);
	pthread_mutex_unlock(&c->lock);
	return err;
}

void kvp_cache_stats(struct kvp_cache *c, struct kvp_cache_stats *out)
{
	pthread_mutex_lock(&c->lock);
	*out = c->st;
	out->blocks = c->used;
	out->bytes = c->bytes;
	pthread_mutex_unlock(&c->lock);
}

/* ---- cipher keys --------------------------------------------------------- */

int kvp_cache_cipher_parse(const void *text, size_t len,
			   struct kvp_rec_cipher *out, char *err,
			   size_t errlen)
{
	const unsigned char *t = text;
	char hex[65];
	struct kvp_rec_key k;

	if (len == 32) { /* raw bytes: no white space stripped */
		memcpy(out->key, t, 32);
		return 0;
	}
	while (len && (t[len - 1] == '\n' || t[len - 1] == '\r' ||
		       t[len - 1] == ' ' || t[len - 1] == '\t'))
		len--;
	if (len != 64)
		goto bad;
	memcpy(hex, t, 64);
	hex[64] = 0;
	if (kvp_rec_key_parse(hex, &k))
		goto bad;
	memcpy(out->key, k.b, 32);
	return 0;
bad:
	if (err)
		snprintf(err, errlen,
			 "cache key: expected 64 hex digits or 32 raw bytes "
			 "(make one: head -c 32 /dev/urandom >KEYFILE)");
	return -EINVAL;
}

int kvp_cache_cipher_load(const char *path, struct kvp_rec_cipher *out,
			  char *err, size_t errlen)
{
	unsigned char buf[160];
	struct stat sb;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC), e;

	if (fd < 0) {
		e = -errno;
		if (err)
			snprintf(err, errlen, "cache key file '%s': %s", path,
				 strerror(errno));
		return e;
	}
	if (fstat(fd, &sb) == 0 && (sb.st_mode & 077)) {
		close(fd);
		if (err)
			snprintf(err, errlen,
				 "cache key file '%s' may be read by others: "
				 "chmod 600 it",
				 path);
		return -EACCES;
	}
	n = read(fd, buf, sizeof(buf));
	e = errno;
	close(fd);
	if (n < 0) {
		if (err)
			snprintf(err, errlen, "cache key file '%s': %s", path,
				 strerror(e));
		return -e;
	}
	e = kvp_cache_cipher_parse(buf, (size_t)n, out, err, errlen);
	memset(buf, 0, sizeof(buf));
	return e;
}
