/*
 * paths.h - folders another user cannot slip a link or a folder of
 * theirs into: the view's mount point and the registry of running pagers.
 *
 * A path such as /tmp/kvp is named by the user but lies where others can
 * write: a symlink planted there would make a mount hide the link's
 * target, and a folder planted there would hold files another user
 * controls.  So the last component is opened without following a symlink
 * (O_NOFOLLOW | O_DIRECTORY) and checked with fstat: a directory, owned by
 * this process's effective uid.  Parents are never created; the last
 * component is created (mkdir 0700, which never follows a symlink) only
 * when its parent is a directory owned by this uid.
 */
#ifndef KVP_PATHS_H
#define KVP_PATHS_H

#include <stddef.h>

/* Flags of kvp_dir_open_owned. */
#define KVP_DIR_CREATE (1u << 0) /* mkdir 0700 if missing (see above) */
#define KVP_DIR_PRIVATE                                                        \
	(1u << 1) /* refuse one others may enter (mode
				     & 077) */

/*
 * kvp_dir_open_owned - open folder @path as above.  Returns a descriptor
 * (O_RDONLY | O_DIRECTORY | O_CLOEXEC) of it, or -errno with what failed
 * and the remedy in @why (if not NULL): -ENOENT (it or its parent is
 * missing), -ELOOP (a symlink), -ENOTDIR, -EPERM (another owner, or open
 * to others with KVP_DIR_PRIVATE), -ENAMETOOLONG, -EINVAL (empty, "." or
 * ".." as the last component), or the errno of mkdir or open.  Nothing is
 * created on failure.
 */
int kvp_dir_open_owned(const char *path, unsigned flags, char *why, size_t len);

#endif /* KVP_PATHS_H */
