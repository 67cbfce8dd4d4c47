/*
 * paths.c - folders opened without following a symlink, checked to be
 * the user's (paths.h).
 */
#include "lib/view/paths.h"
#include "lib/tunables/tunables.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* @path split at its last '/' into @parent and @name, trailing slashes
 * dropped. */
static int split(const char *path, char *parent, char *name)
{
	size_t n = strlen(path);
	const char *slash;

	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n == 0 || n >= PATH_MAX)
		return n ? -ENAMETOOLONG : -EINVAL;
	slash = memrchr(path, '/', n);
	if (!slash) {
		strcpy(parent, ".");
		memcpy(name, path, n);
		name[n] = '\0';
	} else {
		size_t pl = (size_t)(slash - path);

		if (pl == 0)
			strcpy(parent, "/");
		else {
			memcpy(parent, path, pl);
			parent[pl] = '\0';
		}
		memcpy(name, slash + 1, n - pl - 1);
		name[n - pl - 1] = '\0';
	}
	if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	return 0;
}

int kvp_dir_open_owned(const char *path, unsigned flags, char *why, size_t len)
{
	char parent[PATH_MAX], name[PATH_MAX];
	uid_t me = geteuid();
	bool made = false;
	struct stat st;
	int pfd, fd, r;

	r = split(path, parent, name);
	if (r) {
		kvp_seterr(why, len,
			   "'%s' does not name a folder: give its path", path);
		return r;
	}
	pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0) {
		r = -errno;
		kvp_seterr(why, len,
			   "cannot open %s, the parent of %s (%s): create "
			   "it first, this does not make parents",
			   parent, path, strerror(-r));
		return r;
	}
	fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && (flags & KVP_DIR_CREATE)) {
		if (fstat(pfd, &st)) {
			r = -errno;
			goto out_parent;
		}
		if (st.st_uid != me) {
			r = -EPERM;
			kvp_seterr(
			    why, len,
			    "will not create %s: its parent %s belongs to uid "
			    "%u, not to you (uid %u); create it yourself "
			    "(mkdir -m 700 %s) or choose a folder under one "
			    "of yours",
			    path, parent, (unsigned)st.st_uid, (unsigned)me,
			    path);
			goto out_parent;
		}
		if (mkdirat(pfd, name, 0700) && errno != EEXIST) {
			r = -errno;
			kvp_seterr(why, len, "cannot create %s: %s", path,
				   strerror(-r));
			goto out_parent;
		}
		made = true;
		fd = openat(pfd, name,
			    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0) {
		r = -errno;
		/* with O_DIRECTORY a symlink reads ENOTDIR: say which */
		if (r == -ENOTDIR &&
		    !fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISLNK(st.st_mode))
			r = -ELOOP;
		if (r == -ELOOP)
			kvp_seterr(
			    why, len,
			    "%s is a symbolic link: refusing to follow it "
			    "(give the folder it points to, if it is yours)",
			    path);
		else if (r == -ENOTDIR)
			kvp_seterr(why, len, "%s is not a folder", path);
		else
			kvp_seterr(why, len, "cannot open %s: %s", path,
				   strerror(-r));
		goto out_parent;
	}
	if (fstat(fd, &st)) {
		r = -errno;
		kvp_seterr(why, len, "cannot stat %s: %s", path, strerror(-r));
		goto out_fd;
	}
	if (st.st_uid != me) {
		r = -EPERM;
		kvp_seterr(
		    why, len,
		    "%s belongs to uid %u, not to you (uid %u): refusing to "
		    "use it; choose a folder of yours",
		    path, (unsigned)st.st_uid, (unsigned)me);
		goto out_fd;
	}
	if ((flags & KVP_DIR_PRIVATE) && (st.st_mode & 077)) {
		r = -EPERM;
		kvp_seterr(why, len,
			   "%s is open to others (mode %04o): chmod 700 %s",
			   path, (unsigned)(st.st_mode & 07777), path);
		goto out_fd;
	}
	close(pfd);
	return fd;

out_fd:
	close(fd);
	/* what this call made, it takes back */
	if (made)
		unlinkat(pfd, name, AT_REMOVEDIR);
out_parent:
	close(pfd);
	return r;
}
