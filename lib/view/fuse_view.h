/*
 * fuse_view.h - a sysfs-like debug view of a live pager, served by FUSE.
 *
 * The view is a file tree, one ASCII value per file, mounted at a path and
 * served by a thread of the process that owns the pager:
 *
 *   pid, uffd_mode                     0444  the process, the uffd mode
 *   last_error                         0444  why the last write failed
 *   apply                              0200  `name = value` lines, applied
 *                                            all or nothing (kvpctl load)
 *   metrics                            0444  everything, Prometheus text
 *   tunables/<name>                    0644  runtime tunables; 0444 others
 *   stats/<name>                       0444  kvp_pager_stats (KVP_STATS)
 *   regions/<name>/size_bytes, block_size_bytes, store, resident_bytes,
 *                  install_mode, nr_blocks, blocks   0444
 *   regions/<name>/stats/<name>        0444  kvp_region_stats
 *   regions/<name>/data/<block>        0444  the block's bytes
 *   seqs/<id>/block_table              0444  once the KV layer registers
 *
 * A file's content is a snapshot taken when it is opened; files are opened
 * direct_io, so that each open shows the present.  Reading never faults a
 * block in nor changes its state (kvp_region_block_info, kvp_region_peek).
 * A write to a tunable applies at once (kvp_pager_reconfigure for engine
 * tunables, the KV callback for KV tunables) or fails with EINVAL and the
 * old value stays; opening a 0444 file for writing fails with EACCES (also
 * for root).  Only the mounting user can enter the view unless allow_other
 * is asked for.
 *
 * Stale mounts: a view whose process died leaves a mount point on which
 * stat(2) fails with ENOTCONN.  kvp_fuse_view_mount removes such a mount
 * at its own path before mounting (fusermount3 -u -z, or umount2 with
 * MNT_DETACH), and kvp_fuse_view_cleanup_stale does it for any path.
 *
 * Conventions: 0 or -errno; a view's calls are thread-safe.  No callback
 * given to the view may touch the view's own files (the thread that would
 * serve them is the one calling).
 */
#ifndef KVP_FUSE_VIEW_H
#define KVP_FUSE_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/kv/kv_tunables.h"
#include "pager/pager.h"

struct kvp_fuse_view;

/*
 * Applies a new KV config to the KV layer: returns 0, or -EINVAL and sets
 * *bad to the offending tunable's name (the view then keeps the old
 * config).  Called from the view's thread with the view's config lock held.
 */
typedef int (*kvp_kv_apply_fn)(void *arg, const struct kvp_kv_config *cfg,
			       const char **bad);

struct kvp_fuse_view_opts {
	const char *mountpoint;		/* made (0700) if missing */
	bool allow_other;		/* mount with allow_other (needs
				   user_allow_other in /etc/fuse.conf
				   unless root); default false */
	const struct kvp_kv_config *kv; /* KV tunables shown; NULL: defaults */
	kvp_kv_apply_fn kv_apply;	/* NULL: KV tunables are read-only */
	void *kv_arg;
};

/*
 * kvp_fuse_view_mount - mount the view of @p and start its thread.
 *
 * Cleans a stale mount at the path first; a live mount there fails with
 * -EBUSY.  Returns 0 and *out, or -EINVAL (no mount point), -ENODEV
 * (/dev/fuse missing), -EBUSY, -errno of mkdir/mount; nothing is left
 * mounted on failure.  @p must outlive the view.
 */
int kvp_fuse_view_mount(struct kvp_pager *p,
			const struct kvp_fuse_view_opts *opts,
			struct kvp_fuse_view **out);

/*
 * kvp_fuse_view_unmount - stop the thread and unmount (lazily: a process
 * still holding a file of the view gets ENOTCONN afterwards).  The mount
 * point directory stays.  Safe with NULL.
 */
void kvp_fuse_view_unmount(struct kvp_fuse_view *v);

/* The absolute path the view is mounted at. */
const char *kvp_fuse_view_path(const struct kvp_fuse_view *v);

/*
 * kvp_fuse_view_set_kv - (re)register the KV layer: @cur is its config now
 * (NULL: keep the one shown), @apply (NULL: KV tunables read-only) and @arg.
 * Takes the view's config lock: returns once no earlier callback runs.
 */
void kvp_fuse_view_set_kv(struct kvp_fuse_view *v,
			  const struct kvp_kv_config *cur,
			  kvp_kv_apply_fn apply, void *arg);

/* The KV config the view holds now (changed by writes to tunables/). */
void kvp_fuse_view_kv_config(struct kvp_fuse_view *v,
			     struct kvp_kv_config *out);

/*
 * The KV layer's sequences, for seqs/<id>/block_table.  Both callbacks are
 * called from the view's thread under the view's sequence lock, and must
 * be safe to call concurrently with the KV layer's own work (the
 * registrant synchronises).
 *   list: the live ids into ids[0..max); returns how many are live (may
 *         exceed max: the view asks again with more room).
 *   format_block_table: the text of seq @id's block table, one line per
 *         logical block, into buf (NUL-terminated, at most len bytes);
 *         returns the length the whole text needs (as snprintf), or
 *         -errno (-EINVAL or -ENOENT: no such sequence).
 * These match kvp_kvcache_seq_list and kvp_kvcache_format_block_table.
 */
struct kvp_fuse_seq_ops {
	uint32_t (*list)(void *arg, uint32_t *ids, uint32_t max);
	int (*format_block_table)(void *arg, uint32_t id, char *buf,
				  size_t len);
};

/*
 * kvp_fuse_view_set_seqs - register @ops (copied) and @arg, or unregister
 * with NULL.  Returns once no callback of the previous registration runs,
 * so the KV layer may be destroyed after unregistering.
 */
void kvp_fuse_view_set_seqs(struct kvp_fuse_view *v,
			    const struct kvp_fuse_seq_ops *ops, void *arg);

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
