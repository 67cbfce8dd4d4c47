/*
 * failfs - a FUSE filesystem whose writes fail while a control file exists.
 *
 *   failfs BACKDIR MOUNTPOINT CTLFILE [ERRNO]
 *
 * Mirrors the regular files of BACKDIR (one flat directory) at MOUNTPOINT
 * and runs in the foreground until unmounted (fusermount3 -u).  While
 * CTLFILE exists, every write(2) to a file of the mount fails with ERRNO
 * (EIO by default; "ENOSPC" for a full disk) and nothing is written; reads,
 * creation, fallocate and unlink always work, as on a disk whose writes
 * fail.  Used by tests/t_preload_eio.sh to give the preload shim a backing
 * directory that fails and recovers; the control file lives outside the
 * mount so that the test can flip it without going through FUSE.
 */
#define FUSE_USE_VERSION 35
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *back_dir;
static const char *ctl_file;
static int fail_errno = EIO;

/* The backing path of a mount path "/name" (flat: no subdirectories). */
static int back_path(const char *path, char *out)
{
	if (strchr(path + 1, '/'))
		return -ENOENT;
	if (snprintf(out, PATH_MAX, "%s%s", back_dir, path) >= PATH_MAX)
		return -ENAMETOOLONG;
	return 0;
}

static int ff_getattr(const char *path, struct stat *st,
		      struct fuse_file_info *fi)
{
	char bp[PATH_MAX];
	int err;

	if (fi)
		return fstat((int)fi->fh, st) ? -errno : 0;
	err = back_path(path, bp);
	if (err)
		return err;
	return lstat(bp, st) ? -errno : 0;
}

static int ff_readdir(const char *path, void *buf, fuse_fill_dir_t fill,
		      off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	(void)off, (void)fi, (void)flags;
	if (strcmp(path, "/"))
		return -ENOTDIR;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	return 0; /* names are not needed: the shim's files are unlinked */
}

/* Opens without O_DIRECT: the kernel has already split the I/O for us. */
static int ff_open_flags(const char *path, int flags, mode_t mode,
			 struct fuse_file_info *fi)
{
	char bp[PATH_MAX];
	int fd, err;

	err = back_path(path, bp);
	if (err)
		return err;
	fd = open(bp, flags & ~O_DIRECT, mode);
	if (fd < 0)
		return -errno;
	fi->fh = (uint64_t)fd;
	return 0;
}

static int ff_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return ff_open_flags(path, fi->flags | O_CREAT, mode, fi);
}

static int ff_open(const char *path, struct fuse_file_info *fi)
{
	return ff_open_flags(path, fi->flags, 0, fi);
}

static int ff_read(const char *path, char *buf, size_t len, off_t off,
		   struct fuse_file_info *fi)
{
	ssize_t n = pread((int)fi->fh, buf, len, off);

	(void)path;
	return n < 0 ? -errno : (int)n;
}

static int ff_write(const char *path, const char *buf, size_t len, off_t off,
		    struct fuse_file_info *fi)
{
	ssize_t n;

	(void)path;
	if (!access(ctl_file, F_OK))
		return -fail_errno;
	n = pwrite((int)fi->fh, buf, len, off);
	return n < 0 ? -errno : (int)n;
}

static int ff_fallocate(const char *path, int mode, off_t off, off_t len,
			struct fuse_file_info *fi)
{
	(void)path;
	return fallocate((int)fi->fh, mode, off, len) ? -errno : 0;
}

static int ff_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	char bp[PATH_MAX];
	int err;

	if (fi)
		return ftruncate((int)fi->fh, size) ? -errno : 0;
	err = back_path(path, bp);
	if (err)
		return err;
	return truncate(bp, size) ? -errno : 0;
}

static int ff_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	return (datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh)) ? -errno
									: 0;
}

static int ff_unlink(const char *path)
{
	char bp[PATH_MAX];
	int err = back_path(path, bp);

	if (err)
		return err;
	return unlink(bp) ? -errno : 0;
}

static int ff_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	close((int)fi->fh);
	return 0;
}

static const struct fuse_operations ff_ops = {
	.getattr = ff_getattr,
	.readdir = ff_readdir,
	.create = ff_create,
	.open = ff_open,
	.read = ff_read,
	.write = ff_write,
	.fallocate = ff_fallocate,
	.truncate = ff_truncate,
	.fsync = ff_fsync,
	.unlink = ff_unlink,
	.release = ff_release,
};

int main(int argc, char **argv)
{
	char *fargv[] = { argv[0], "-f", "-o", "default_permissions", NULL,
			  NULL };

	if (argc < 4 || argc > 5) {
		fprintf(stderr,
			"usage: %s BACKDIR MOUNTPOINT CTLFILE [EIO|ENOSPC]\n",
			argv[0]);
		return 2;
	}
	back_dir = argv[1];
	ctl_file = argv[3];
	if (argc == 5 && !strcmp(argv[4], "ENOSPC"))
		fail_errno = ENOSPC;
	else if (argc == 5 && strcmp(argv[4], "EIO")) {
		fprintf(stderr, "failfs: unknown errno name %s (EIO or ENOSPC)\n",
			argv[4]);
		return 2;
	}
	fargv[4] = argv[2];
	return fuse_main(5, fargv, &ff_ops, NULL);
}
