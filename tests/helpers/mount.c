/* mount.c - scratch ramfs and tmpfs mounts and scratch directories for
 * the suites that need one. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/helpers.h"

bool kvp_test_mount(char *dir, size_t len, const char *parent, const char *tag,
		    const char *type, const char *opts)
{
	snprintf(dir, len, "%s/%s", parent, tag);
	if (mkdir(dir, 0700))
		goto fail;
	if (mount("none", dir, type, 0, opts)) {
		int err = errno;

		rmdir(dir);
		errno = err;
		goto fail;
	}
	return true;
fail:
	fprintf(stderr,
		"note: cannot mount %s at %s (%s): its tests do nothing\n",
		type, dir, strerror(errno));
	*dir = 0;
	return false;
}

void kvp_test_unmount(char *dir)
{
	if (!*dir)
		return;
	umount2(dir, MNT_DETACH);
	rmdir(dir);
	*dir = 0;
}

static int rm_one(const char *p, const struct stat *sb, int flag,
		  struct FTW *f)
{
	return remove(p);
}

void kvp_test_rm_tree(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
