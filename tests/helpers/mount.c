/* mount.c - scratch ramfs and tmpfs mounts and scratch directories for
 * the suites that need one. */
#include <errno.h>
#include <ftw.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/helpers.h"

/*
 * Mounts go into a mount namespace of this process's own where it can
 * have one (root, not yet threaded: a Check case's forked child): a case
 * that fails or is killed before its unmount then leaves no mount on the
 * machine, as it did (seven tmpfs left under /var/tmp after a day of
 * failing and killed runs).  Private all the way down, so that nothing
 * mounted here propagates back to the machine's namespace.
 */
static void own_mount_namespace(void)
{
	static bool done;

	if (done)
		return;
	done = true;
	if (unshare(CLONE_NEWNS) == 0)
		(void)mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

bool kvp_test_mount(char *dir, size_t len, const char *parent, const char *tag,
		    const char *type, const char *opts)
{
	own_mount_namespace();
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
