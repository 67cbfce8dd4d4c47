/* mount.c - scratch ramfs and tmpfs mounts for the suites that need one. */
#include <errno.h>
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
