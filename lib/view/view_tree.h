/*
 * view_tree.h - the debug view of a live pager as a tree of small files,
 * with no transport: a path to its text, a write to a tunable commit.
 *
 * The FUSE mount (fuse_view.h) serves this tree; anything else that wants
 * to show or change a pager (an HTTP endpoint, a test) calls it directly.
 *
 *   pid, uffd_mode                     0444  the process, the uffd mode
 *   last_error                         0444  why the last write failed
 *   apply                              0200  `name = value` lines, applied
 *                                            all or nothing (kvpctl load,
 *                                            kvpctl set)
 *   metrics                            0444  everything, Prometheus text
 *   tunables/<name>                    0644  runtime tunables; 0444 others
 *   stats/<name>                       0444  kvp_pager_stats (KVP_STATS)
 *   regions/<name>/size_bytes, block_size_bytes, store, resident_bytes,
 *                  install_mode, nr_blocks, blocks   0444
 *   regions/<name>/stats/<name>        0444  kvp_region_stats
 *   regions/<name>/data/<block>        0444  the block's bytes
 *   seqs/<id>/block_table              0444  once the KV layer registers
 *   cache/<name>                       0444  the prefix cache's figures
 *                                            (KVP_CACHE_STATS), once a
 *                                            cache registers
 *   remote/<name>                      0444  the remote tier's figures
 *                                            (KVP_REMOTE_STATS) and
 *                                            fetch_latency_mean_us, once
 *                                            a remote tier registers
 *
 * Paths are relative to the tree's root; a leading '/' and repeated '/'
 * are allowed, "." and ".." are names like any other (and name nothing).
 * Reading never faults a block in nor changes its state
 * (kvp_region_block_info, kvp_region_peek).  A region's name is shown
 * with '/' turned into '_'.
 *
 * The commit: a write to tunables/<name> and a write to apply go through
 * one function.  The new values are checked against the registry
 * (lib/tunables/tunables.h) and the engine config, then given to the
 * pager (kvp_pager_reconfigure) and to the KV layer (the kv_apply
 * callback); if either refuses, whatever was applied is put back, so a
 * write changes all it names or nothing.  The reason of a refusal is kept
 * in last_error until the next successful write.
 *
 * Conventions: 0 or -errno; every call is thread-safe.  No callback given
 * to the tree may call the tree (or read its files through a transport:
 * the thread that would serve them may be the one calling).
 */
#ifndef KVP_VIEW_TREE_H
#define KVP_VIEW_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lib/cache/cache_dir.h"
#include "lib/kv/kv_tunables.h"
#include "lib/remote/remote.h"
#include "pager/pager.h"

struct kvp_view;

/*
 * Applies a new KV config to the KV layer: returns 0, or -errno and sets
 * *bad to the offending tunable's name (the tree then keeps the old
 * config).  Called with the tree's config lock held, from whichever thread
 * wrote to the tree.
 */
typedef int (*kvp_kv_apply_fn)(void *arg, const struct kvp_kv_config *cfg,
			       const char **bad);

/*
 * The KV layer's sequences, for seqs/<id>/block_table.  Both callbacks are
 * called under the tree's sequence lock (held for reading: they may run
 * concurrently with each other), and must be safe to call concurrently
 * with the KV layer's own work (the registrant synchronises).
 *   list: the live ids into ids[0..max); returns how many are live (may
 *         exceed max: the tree asks again with more room).
 *   format_block_table: the text of seq @id's block table, one line per
 *         logical block, into buf (NUL-terminated, at most len bytes);
 *         returns the length the whole text needs (as snprintf), or
 *         -errno (-EINVAL or -ENOENT: no such sequence).
 * These match kvp_kvcache_seq_list and kvp_kvcache_format_block_table.
 */
struct kvp_view_seq_ops {
	uint32_t (*list)(void *arg, uint32_t *ids, uint32_t max);
	int (*format_block_table)(void *arg, uint32_t id, char *buf,
				  size_t len);
};

/*
 * kvp_view_create - the tree of @p.  @kv is the KV config shown (NULL:
 * the defaults), @kv_apply and @kv_arg the KV layer (NULL: KV tunables are
 * read-only until kvp_view_set_kv).  Returns 0 and *out, or -ENOMEM.  @p
 * must outlive the tree.
 */
int kvp_view_create(struct kvp_pager *p, const struct kvp_kv_config *kv,
		    kvp_kv_apply_fn kv_apply, void *kv_arg,
		    struct kvp_view **out);

/* kvp_view_destroy - free the tree.  No call may be running.  NULL: no-op. */
void kvp_view_destroy(struct kvp_view *v);

/*
 * Registration, for the program that owns the KV layer.
 *
 * kvp_view_set_kv - (re)register the KV layer: @cur is its config now
 * (NULL: keep the one shown), @apply (NULL: KV tunables read-only) and
 * @arg.  Returns once no earlier kv_apply call runs, so the KV layer may
 * be destroyed after kvp_view_set_kv(v, NULL, NULL, NULL).
 */
void kvp_view_set_kv(struct kvp_view *v, const struct kvp_kv_config *cur,
		     kvp_kv_apply_fn apply, void *arg);

/* kvp_view_kv_config - the KV config the tree holds now (as changed by
 * writes to tunables/ and apply). */
void kvp_view_kv_config(struct kvp_view *v, struct kvp_kv_config *out);

/*
 * kvp_view_set_seqs - register @ops (copied) and @arg, or unregister with
 * NULL.  Returns once no callback of the previous registration runs, so
 * the KV layer may be destroyed after unregistering.
 */
void kvp_view_set_seqs(struct kvp_view *v, const struct kvp_view_seq_ops *ops,
		       void *arg);

/*
 * kvp_view_set_cache - show prefix cache @c's figures in cache/ and in
 * metrics, or stop with NULL.  Returns once no earlier read of c runs, so
 * c may be closed after kvp_view_set_cache(v, NULL).
 */
void kvp_view_set_cache(struct kvp_view *v, struct kvp_cache *c);

/*
 * kvp_view_set_remote - the same for remote tier @r: remote/ and the
 * kvpager_remote_* series in metrics; @r may be closed after
 * kvp_view_set_remote(v, NULL).
 */
void kvp_view_set_remote(struct kvp_view *v, struct kvp_remote *r);

/* ---- the files, for a transport ---- */

struct kvp_view_attr {
	bool dir;      /* a folder (readable with kvp_view_list) */
	mode_t mode;   /* 0555 folders; 0444, 0644 or 0200 files */
	uint64_t size; /* a block's size for data/<block>; else 0 */
};

/* kvp_view_stat - what @path is.  0, -ENOENT, or -ENAMETOOLONG. */
int kvp_view_stat(struct kvp_view *v, const char *path,
		  struct kvp_view_attr *out);

/*
 * Called by kvp_view_list per name; @pos is the position of the name
 * after this one (what a later listing starts from).  Return nonzero to
 * stop (the buffer is full).
 */
typedef int (*kvp_view_fill_fn)(void *arg, const char *name, uint64_t pos);

/*
 * kvp_view_list - the names in folder @path, from position @from (0: the
 * first), in a stable order; "." and ".." are not among them.  0,
 * -ENOENT, -ENOTDIR.
 */
int kvp_view_list(struct kvp_view *v, const char *path, uint64_t from,
		  kvp_view_fill_fn fill, void *arg);

/*
 * kvp_view_read - the whole content of file @path now, malloc'd into *buf
 * (NUL-terminated, the NUL not counted in *len; free with free(3)).
 * Returns 0, -ENOENT, -EISDIR, -EACCES (apply: write-only), -ENOMEM or
 * -EIO (a block could not be read).  Nothing is allocated on failure.
 */
int kvp_view_read(struct kvp_view *v, const char *path, char **buf,
		  size_t *len);

/*
 * kvp_view_write - commit @len bytes of text to tunables/<name> (one
 * value) or apply (`name = value` lines), as described at the top.  The
 * bytes must be text: a NUL or another control character (but tab, CR and
 * newline) is refused.  Returns 0, or -EINVAL with the reason in
 * last_error and nothing changed, -EACCES (not a writable file now),
 * -ENOENT, -EISDIR, -ENOMEM.
 */
int kvp_view_write(struct kvp_view *v, const char *path, const char *buf,
		   size_t len);

/*
 * kvp_view_refuse - record @why in last_error, as a refused write would,
 * for a transport that refuses a write before it reaches the tree (a
 * write at an offset, say).  Always returns -EINVAL.
 */
int kvp_view_refuse(struct kvp_view *v, const char *why);

#endif /* KVP_VIEW_TREE_H */
