/*
 * fuse_view.h - the debug view of a live pager (view_tree.h) served by
 * FUSE: mounted at a path, one ASCII value per file, served by a thread
 * of the process that owns the pager.
 *
 * A file's content is a snapshot taken when it is opened; files are opened
 * direct_io, so that each open shows the present.  Opening a 0444 file for
 * writing fails with EACCES (also for root); a refused write fails with
 * EINVAL and last_error says why.  Only the mounting user can enter the
 * view unless allow_other is asked for.
 *
 * Stale mounts: a view whose process died leaves a mount point on which
 * stat(2) fails with ENOTCONN.  kvp_fuse_view_mount removes such a mount
 * at its own path before mounting (fusermount3 -u -z, or umount2 with
 * MNT_DETACH), and kvp_fuse_view_cleanup_stale does it for any path.
 *
 * The KV layer registers with the tree: kvp_view_set_kv and
 * kvp_view_set_seqs on kvp_fuse_view_tree(v).
 *
 * Conventions: 0 or -errno; a view's calls are thread-safe.
 */
#ifndef KVP_FUSE_VIEW_H
#define KVP_FUSE_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_tunables.h"
#include "lib/view/view_tree.h"
#include "pager/pager.h"

struct kvp_fuse_view;

struct kvp_fuse_view_opts {
	const char *mountpoint;		/* a folder of the user's, not a
					   symlink; made (0700) if missing
					   in a parent of the user's */
	bool allow_other;		/* mount with allow_other (needs
				   user_allow_other in /etc/fuse.conf
				   unless root); default false */
	const struct kvp_kv_config *kv; /* KV tunables shown; NULL: defaults */
	kvp_kv_apply_fn kv_apply;	/* NULL: KV tunables are read-only */
	void *kv_arg;			/* kv_apply's */
};

/*
 * kvp_fuse_view_mount - mount the view of @p and start its thread.
 *
 * Cleans a stale mount at the path first (never following a symlink).
 * The mount point is opened and checked as lib/view/paths.h says: a
 * folder owned by this uid, not a symlink, created 0700 only when its
 * parent is this uid's; parents are never created.  A live mount there
 * fails with -EBUSY.  Returns 0 and *out, or -errno with what failed and
 * the remedy in @err (if not NULL): -EINVAL (no mount point), -ENODEV
 * (/dev/fuse missing), -EBUSY, -ENOENT, -ELOOP, -ENOTDIR, -EPERM (see
 * kvp_dir_open_owned), -EIO (the mount failed); nothing is left mounted
 * on failure.  @p must outlive the view.
 */
int kvp_fuse_view_mount(struct kvp_pager *p,
			const struct kvp_fuse_view_opts *opts,
			struct kvp_fuse_view **out, char *err, size_t errlen);

/*
 * kvp_fuse_view_unmount - stop the thread and unmount (lazily: a process
 * still holding a file of the view gets ENOTCONN afterwards).  The mount
 * point directory stays.  Safe with NULL.
 */
void kvp_fuse_view_unmount(struct kvp_fuse_view *v);

/* The absolute path the view is mounted at. */
const char *kvp_fuse_view_path(const struct kvp_fuse_view *v);

/* The tree the view serves: for registering the KV layer
 * (kvp_view_set_kv, kvp_view_set_seqs) and for other transports.  It
 * lives as long as the view. */
struct kvp_view *kvp_fuse_view_tree(struct kvp_fuse_view *v);

/*
 * kvp_fuse_view_cleanup_stale - if @path is a dead FUSE mount (stat gives
 * ENOTCONN), unmount it lazily.  Returns 1 if one was removed, 0 if there
 * was nothing to do, or -errno (the unmount failed: run
 * `fusermount3 -u -z PATH` as the user who mounted it).
 */
int kvp_fuse_view_cleanup_stale(const char *path);

/* kvp_fuse_available - 0 if /dev/fuse can be opened, else -errno, with a
 * reason (and remedy) in @why. */
int kvp_fuse_available(char *why, size_t len);

#endif /* KVP_FUSE_VIEW_H */
