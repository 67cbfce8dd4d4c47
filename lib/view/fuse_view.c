/*
 * fuse_view.c - the debug view's transport: libfuse3's high-level API
 * serving the tree of view_tree.c, one thread.
 *
 * The thread runs its own loop over the session's /dev/fuse descriptor and
 * an eventfd (fuse_session_receive_buf + fuse_session_process_buf), so that
 * unmounting is "signal the eventfd, join, unmount": it never waits for a
 * request that may not come.
 *
 * Every open takes a snapshot of the file (kvp_view_read) and reads serve
 * from it.  Writes go to kvp_view_write.
 *
 * Locks: snap_lock guards the list of open files; the tree has its own.
 * Neither is held across a call into libfuse.
 */
#define FUSE_USE_VERSION 31

#include "lib/view/fuse_view.h"
#include "kmod-helpers/fdset.h"
#include "lib/view/paths.h"
#include "lib/tunables/tunables.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct kvp_fuse_view {
	struct kvp_view *tree;	   /* what is served */
	struct fuse *fuse;	   /* the libfuse handle */
	pthread_t thread;	   /* serves the mount */
	int stopfd;		   /* eventfd: the thread stops when set */
	char path[PATH_MAX];	   /* absolute mount point */
	pthread_mutex_t snap_lock; /* guards snaps */
	struct snap *snaps;	   /* files open now */
};

/* What an open file reads, fixed at open.  Linked into the view's list
 * so that unmounting frees those whose release never came (the kernel
 * sends RELEASE asynchronously after close). */
struct snap {
	struct snap *prev, *next; /* in kvp_fuse_view.snaps, under snap_lock */
	char *buf;		  /* the content at open; NULL if write-only */
	size_t len;		  /* of buf */
	bool written;		  /* took its one write (see op_write) */
};

static struct kvp_fuse_view *view(void)
{
	return fuse_get_context()->private_data;
}

/* ---- FUSE operations ---- */

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->direct_io = 1;
	cfg->kernel_cache = 0;
	cfg->auto_cache = 0;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->use_ino = 0;
	return fuse_get_context()->private_data;
}

static int op_getattr(const char *path, struct stat *st,
		      struct fuse_file_info *fi)
{
	struct kvp_view_attr a;
	int r = kvp_view_stat(view()->tree, path, &a);

	if (r)
		return r;
	memset(st, 0, sizeof(*st));
	st->st_mode = (a.dir ? S_IFDIR : S_IFREG) | a.mode;
	st->st_nlink = a.dir ? 2 : 1;
	st->st_uid = getuid();
	st->st_gid = getgid();
	/* Like sysfs: a nominal size; reads are direct and go to EOF. */
	st->st_size = a.size ? (off_t)a.size : (a.dir ? 0 : 4096);
	st->st_blksize = 4096;
	clock_gettime(CLOCK_REALTIME, &st->st_mtim);
	st->st_atim = st->st_ctim = st->st_mtim;
	return 0;
}

struct fill_ctx {
	void *buf;		/* libfuse's */
	fuse_fill_dir_t filler; /* libfuse's */
};

/* Positions: 0 ".", 1 "..", 2 + k the tree's name k. */
static int fill_cb(void *arg, const char *name, uint64_t pos)
{
	struct fill_ctx *c = arg;

	return c->filler(c->buf, name, NULL, (off_t)(pos + 2), 0);
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t filler,
		      off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	struct fill_ctx c = { buf, filler };
	struct kvp_view_attr a;
	int r = kvp_view_stat(view()->tree, path, &a);

	if (r)
		return r;
	if (!a.dir)
		return -ENOTDIR;
	if (off < 1 && filler(buf, ".", NULL, 1, 0))
		return 0;
	if (off < 2 && filler(buf, "..", NULL, 2, 0))
		return 0;
	return kvp_view_list(view()->tree, path,
			     off > 2 ? (uint64_t)off - 2 : 0, fill_cb, &c);
}

static int op_open(const char *path, struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	int acc = fi->flags & O_ACCMODE;
	struct kvp_view_attr a;
	struct snap *s;
	int r = kvp_view_stat(v->tree, path, &a);

	if (r)
		return r;
	if (a.dir)
		return -EISDIR;
	if ((acc != O_RDONLY && !(a.mode & 0200)) ||
	    (acc != O_WRONLY && !(a.mode & 0400)))
		return -EACCES;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	if (acc != O_WRONLY) {
		r = kvp_view_read(v->tree, path, &s->buf, &s->len);
		if (r) {
			free(s);
			return r;
		}
	}
	pthread_mutex_lock(&v->snap_lock);
	s->next = v->snaps;
	if (s->next)
		s->next->prev = s;
	v->snaps = s;
	pthread_mutex_unlock(&v->snap_lock);
	fi->fh = (uint64_t)(uintptr_t)s;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	return 0;
}

static int op_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;

	if (off < 0)
		return -EINVAL;
	if (!s->buf || (size_t)off >= s->len)
		return 0;
	if (size > s->len - (size_t)off)
		size = s->len - (size_t)off;
	memcpy(buf, s->buf + off, size);
	return (int)size;
}

/*
 * One write per open, at offset 0, holding the whole value (or all the
 * lines of apply): a value split over two writes, or written after a
 * first one, would otherwise be applied piecemeal ("1" then "6" for
 * "16").  A later write on the same open file, or one at an offset, is
 * refused with EINVAL and changes nothing.
 */
static int op_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;
	char why[160];
	int r;

	if (s->written)
		return kvp_view_refuse(v->tree,
				       "a second write to one open file: "
				       "write the whole value in one write, "
				       "then close and open again");
	s->written = true;
	if (off != 0) {
		snprintf(why, sizeof(why),
			 "a write at offset %lld: write the whole value in "
			 "one write from the start (not >>)",
			 (long long)off);
		return kvp_view_refuse(v->tree, why);
	}
	r = kvp_view_write(v->tree, path, buf, size);
	return r ? r : (int)size;
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	struct kvp_view_attr a;
	int r = kvp_view_stat(view()->tree, path, &a);

	if (r)
		return r;
	if (a.dir)
		return -EISDIR;
	/* O_TRUNC of a value file: nothing to cut, the write says it all */
	return a.mode & 0200 ? 0 : -EACCES;
}

static void snap_free(struct snap *s)
{
	free(s->buf);
	free(s);
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
	struct kvp_fuse_view *v = view();
	struct snap *s = (struct snap *)(uintptr_t)fi->fh;

	if (!s)
		return 0;
	pthread_mutex_lock(&v->snap_lock);
	if (s->prev)
		s->prev->next = s->next;
	else
		v->snaps = s->next;
	if (s->next)
		s->next->prev = s->prev;
	pthread_mutex_unlock(&v->snap_lock);
	snap_free(s);
	return 0;
}

static int op_flush(const char *path, struct fuse_file_info *fi)
{
	return 0;
}

static int op_no_create(const char *path, mode_t mode,
			struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_no_path(const char *path, mode_t mode)
{
	return -EACCES;
}

static int op_no_unlink(const char *path)
{
	return -EACCES;
}

static int op_no_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_no_chown(const char *path, uid_t uid, gid_t gid,
		       struct fuse_file_info *fi)
{
	return -EACCES;
}

static int op_utimens(const char *path, const struct timespec tv[2],
		      struct fuse_file_info *fi)
{
	return 0; /* touch(1) of a tunable: harmless */
}

static const struct fuse_operations view_ops = {
	.init = op_init,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.truncate = op_truncate,
	.release = op_release,
	.flush = op_flush,
	.create = op_no_create,
	.mkdir = op_no_path,
	.unlink = op_no_unlink,
	.rmdir = op_no_unlink,
	.chmod = op_no_chmod,
	.chown = op_no_chown,
	.utimens = op_utimens,
};

/* ---- the thread ---- */

static void *loop_main(void *arg)
{
	struct kvp_fuse_view *v = arg;
	struct fuse_session *se = fuse_get_session(v->fuse);
	struct fuse_buf buf;
	struct pollfd pfd[2];
	bool stopping = false;
	int r;

	memset(&buf, 0, sizeof(buf));
	pfd[0].fd = fuse_session_fd(se);
	pfd[0].events = POLLIN;
	pfd[1].fd = v->stopfd;
	pfd[1].events = POLLIN;
	for (;;) {
		/* Stopping: serve what the kernel queued already (a close
		 * sends its RELEASE after close(2) returns, and an unmount
		 * would drop it with the handle it frees), then go. */
		int n = poll(pfd, stopping ? 1 : 2, stopping ? 0 : -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (stopping && n == 0)
			break;
		if (!stopping && pfd[1].revents) {
			stopping = true;
			continue;
		}
		if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL))
			break; /* unmounted from outside */
		if (!(pfd[0].revents & POLLIN))
			continue;
		r = fuse_session_receive_buf(se, &buf);
		if (r == -EINTR || r == -EAGAIN)
			continue;
		if (r <= 0)
			break;
		fuse_session_process_buf(se, &buf);
	}
	free(buf.mem);
	return NULL;
}

/* ---- mounting ---- */

int kvp_fuse_available(char *why, size_t len)
{
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	int e;

	if (fd >= 0) {
		close(fd);
		return 0;
	}
	e = errno;
	if (why && len)
		snprintf(why, len,
			 "/dev/fuse cannot be opened (%s): load the fuse "
			 "module (modprobe fuse) or give the container the "
			 "device",
			 strerror(e));
	return -e;
}

static int run_fusermount(const char *path)
{
	char *const argv[] = { "fusermount3", "-u", "-z", (char *)path, NULL };
	posix_spawn_file_actions_t fa;
	int status, r;
	pid_t pid;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	r = posix_spawnp(&pid, "fusermount3", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r)
		return -r;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

int kvp_fuse_view_cleanup_stale(const char *path)
{
	struct stat st;
	int r;

	if (!path || !*path)
		return -EINVAL;
	/* lstat: a symlink is never followed to someone else's mount */
	if (lstat(path, &st) == 0 || errno != ENOTCONN)
		return 0;
	r = run_fusermount(path);
	if (r && umount2(path, MNT_DETACH))
		return r == -ENOENT ? -errno : r;
	if (lstat(path, &st) && errno == ENOTCONN)
		return -EBUSY;
	return 1;
}

static bool is_mountpoint(const char *path)
{
	char parent[PATH_MAX + 4];
	struct stat a, b;

	snprintf(parent, sizeof(parent), "%s/..", path);
	if (stat(path, &a) || stat(parent, &b))
		return false;
	return a.st_dev != b.st_dev || a.st_ino == b.st_ino;
}

/*
 * The mount point, checked (kvp_dir_open_owned) and its absolute path in
 * @path: the folder the descriptor holds, or -EAGAIN if the path was
 * changed under the check.  The mount then goes by that path: libfuse
 * (and fusermount3) take a path, and nobody but the user can swap the
 * folder in a parent of theirs or in a sticky one such as /tmp.
 */
static int check_mountpoint(const char *mountpoint, char *path, char *err,
			    size_t errlen)
{
	struct stat a, b;
	int fd, r = 0;

	fd = kvp_dir_open_owned(mountpoint, KVP_DIR_CREATE, err, errlen);
	if (fd < 0)
		return fd;
	if (!realpath(mountpoint, path)) {
		r = -errno;
		kvp_seterr(err, errlen, "cannot resolve %s: %s", mountpoint,
			   strerror(-r));
	} else if (fstat(fd, &a) || lstat(path, &b) || a.st_dev != b.st_dev ||
		   a.st_ino != b.st_ino) {
		r = -EAGAIN;
		kvp_seterr(err, errlen,
			   "%s changed while it was checked: try again",
			   mountpoint);
	} else if (is_mountpoint(path)) {
		r = -EBUSY;
		kvp_seterr(
		    err, errlen,
		    "a file system is mounted at %s already (another view? "
		    "kvpctl lists them)",
		    path);
	}
	close(fd);
	return r;
}

int kvp_fuse_view_mount(struct kvp_pager *p,
			const struct kvp_fuse_view_opts *opts,
			struct kvp_fuse_view **out, char *err, size_t errlen)
{
	char optstr[128];
	char *argv[] = { "kvpager", "-o", optstr, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	struct kvp_fuse_view *v;
	sigset_t all, old;
	int r;

	*out = NULL;
	if (!p || !opts || !opts->mountpoint || !opts->mountpoint[0]) {
		kvp_seterr(err, errlen, "no mount point given");
		return -EINVAL;
	}
	r = kvp_fuse_available(err, errlen);
	if (r)
		return r == -ENOENT ? -ENODEV : r;
	r = kvp_fuse_view_cleanup_stale(opts->mountpoint);
	if (r < 0) {
		kvp_seterr(
		    err, errlen,
		    "a dead view is mounted at %s and cannot be removed: run "
		    "fusermount3 -u -z %s",
		    opts->mountpoint, opts->mountpoint);
		return r;
	}
	v = calloc(1, sizeof(*v));
	if (!v) {
		kvp_seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	v->stopfd = -1;
	r = check_mountpoint(opts->mountpoint, v->path, err, errlen);
	if (r)
		goto err_free;
	pthread_mutex_init(&v->snap_lock, NULL);
	r = kvp_view_create(p, opts->kv, opts->kv_apply, opts->kv_arg,
			    &v->tree);
	if (r) {
		kvp_seterr(err, errlen, "out of memory");
		goto err_lock;
	}
	v->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	/* the engine's: see kmod-helpers/fdset.h */
	v->stopfd = kvp_fd_own(v->stopfd < 0 ? -errno : v->stopfd);
	if (v->stopfd < 0) {
		r = v->stopfd;
		kvp_seterr(err, errlen, "cannot make an eventfd: %s",
			   strerror(-r));
		goto err_tree;
	}
	snprintf(optstr, sizeof(optstr), "fsname=kvpager,subtype=kvpager%s",
		 opts->allow_other ? ",allow_other" : "");
	v->fuse = fuse_new(&args, &view_ops, sizeof(view_ops), v);
	fuse_opt_free_args(&args);
	if (!v->fuse) {
		r = -EINVAL;
		kvp_seterr(err, errlen, "libfuse refused the options '%s'",
			   optstr);
		goto err_fd;
	}
	if (fuse_mount(v->fuse, v->path)) {
		r = -EIO;
		kvp_seterr(err, errlen,
			   "mounting at %s failed (libfuse printed why above)",
			   v->path);
		goto err_fuse;
	}
	/* /dev/fuse's descriptor too: closed by a program's close-all, its
	 * number would be the program's next file's, read as requests */
	r = kvp_fd_note(fuse_session_fd(fuse_get_session(v->fuse)));
	if (r) {
		kvp_seterr(err, errlen, "out of memory");
		goto err_unmount;
	}
	/* The thread takes no signal: they are the program's business. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&v->thread, NULL, loop_main, v);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		kvp_seterr(err, errlen, "cannot start the view's thread: %s",
			   strerror(-r));
		goto err_unmount;
	}
	*out = v;
	return 0;

err_unmount:
	kvp_fd_disown(fuse_session_fd(fuse_get_session(v->fuse)));
	fuse_unmount(v->fuse);
err_fuse:
	fuse_destroy(v->fuse);
err_fd:
	kvp_fd_close(v->stopfd);
err_tree:
	kvp_view_destroy(v->tree);
err_lock:
	pthread_mutex_destroy(&v->snap_lock);
err_free:
	free(v);
	return r;
}

void kvp_fuse_view_unmount(struct kvp_fuse_view *v)
{
	uint64_t one = 1;

	if (!v)
		return;
	if (write(v->stopfd, &one, sizeof(one)) != sizeof(one))
		abort(); /* an eventfd write of 1 cannot fail */
	pthread_join(v->thread, NULL);
	/* libfuse closes it: forgotten first (kmod-helpers/fdset.h) */
	kvp_fd_disown(fuse_session_fd(fuse_get_session(v->fuse)));
	fuse_unmount(v->fuse);
	fuse_destroy(v->fuse);
	kvp_fd_close(v->stopfd);
	while (v->snaps) {
		struct snap *s = v->snaps;

		v->snaps = s->next;
		snap_free(s);
	}
	kvp_view_destroy(v->tree);
	pthread_mutex_destroy(&v->snap_lock);
	free(v);
}

const char *kvp_fuse_view_path(const struct kvp_fuse_view *v)
{
	return v->path;
}

struct kvp_view *kvp_fuse_view_tree(struct kvp_fuse_view *v)
{
	return v->tree;
}
