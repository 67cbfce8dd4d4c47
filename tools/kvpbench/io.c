/*
 * io.c - the scenarios stream and random, and the modes raw and mmap.
 *
 * raw:  io_uring O_DIRECT reads into reused buffers (one set per thread,
 *       THP-backed and pre-touched), the file registered as a fixed file,
 *       at the job's depth: the limit of the disk.  A job that writes
 *       (touch's sequential rw lines) writes each block back as read, a write linked
 *       to its read: the least any tier must move to keep the writes.
 * mmap: the kernel's mmap of the same file, cold (fadvise DONTNEED before),
 *       touched one word per 4 KiB page; for stream the pages more than a
 *       budget behind the scan are dropped (MADV_DONTNEED and fadvise), so
 *       that it runs with the same memory as the pager.
 *
 * Every mode consumes what it reads with kvpb_consume(): one word per page
 * summed and checked, two more words per block compared exactly.
 */
#include "tools/kvpbench/kvpbench.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kmod-helpers/mem.h"
#include "kmod-helpers/uring.h"

/* ---- raw: io_uring O_DIRECT ------------------------------------------- */

static void *raw_worker(void *arg)
{
	struct kvpb_worker *w = arg;
	const struct kvpb_job *j = w->j;
	const struct kvpb_file *f = &w->c->file;
	unsigned depth = j->depth, inflight = 0, nfree = depth, i;
	bool wb = j->writes; /* each slot: a read, then its write linked */
	uint64_t next = 0, done = 0, bufs = (uint64_t)depth * j->block;
	uint64_t *slot_off = calloc(depth, sizeof(*slot_off));
	unsigned *free_slots = calloc(depth, sizeof(*free_slots));
	struct io_uring ring;
	bool ring_ok = false, fixed = false;
	void *buf = NULL;
	int fd = f->dfd, err;

	w->what = "allocation";
	err = -ENOMEM;
	if (!slot_off || !free_slots)
		goto ready;
	for (i = 0; i < depth; i++)
		free_slots[i] = depth - 1 - i;
	err = kvp_mem_reserve(bufs, KVP_HUGE_SIZE, true, &buf);
	if (err)
		goto ready;
	err = kvp_mem_populate(buf, bufs);
	if (err)
		goto ready;
	w->what = "io_uring set-up";
	err = kvp_uring_init(&ring, wb ? 2 * depth : depth,
			     KVP_URING_SINGLE_ISSUER);
	if (err)
		goto ready;
	ring_ok = true;
	if (!io_uring_register_files(&ring, &fd, 1)) {
		fixed = true;
		fd = 0;
	}
ready:
	pthread_barrier_wait(w->start);
	if (err)
		goto out;
	w->what = "read";
	while (done < j->reads) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0, s;

		while (inflight < depth && next < j->reads) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			uint8_t *at;

			if (!sqe)
				break;
			s = free_slots[--nfree];
			slot_off[s] = kvpb_job_off(j, w->t, next);
			at = (uint8_t *)buf + (uint64_t)s * j->block;
			io_uring_prep_read(sqe, fd, at, j->block, slot_off[s]);
			if (fixed)
				sqe->flags |= IOSQE_FIXED_FILE;
			io_uring_sqe_set_data64(sqe, (uint64_t)s << 1);
			if (wb) {
				/* The ring has two entries a slot. */
				sqe->flags |= IOSQE_IO_LINK;
				sqe = io_uring_get_sqe(&ring);
				io_uring_prep_write(sqe, fd, at, j->block,
						    slot_off[s]);
				if (fixed)
					sqe->flags |= IOSQE_FIXED_FILE;
				io_uring_sqe_set_data64(sqe,
							(uint64_t)s << 1 | 1);
			}
			inflight++;
			next++;
		}
		err = io_uring_submit_and_wait(&ring, 1);
		if (err < 0)
			goto out;
		err = 0;
		io_uring_for_each_cqe(&ring, head, cqe)
		{
			uint64_t tag = io_uring_cqe_get_data64(cqe);
			bool is_write = tag & 1;

			s = (unsigned)(tag >> 1);
			seen++;
			/* A short read cancels its write (-ECANCELED): the
			 * read's error is the one kept. */
			if (cqe->res != (int)j->block && !err)
				err = cqe->res < 0 ? cqe->res : -EIO;
			if (!err && !is_write) {
				kvpb_worker_at(w, slot_off[s]);
				w->bad += kvpb_consume(
				    (uint8_t *)buf + (uint64_t)s * j->block,
				    slot_off[s], j->block);
				kvpb_worker_done(w, j->block);
			}
			if (wb && !is_write)
				continue; /* the slot is free at its write */
			free_slots[nfree++] = s;
			inflight--;
			done++;
		}
		io_uring_cq_advance(&ring, seen);
		if (err)
			goto out;
	}
out:
	if (ring_ok) {
		/* Wait for what is still in flight before the buffers go. */
		while (inflight) {
			struct io_uring_cqe *cqe;
			uint64_t tag;

			if (io_uring_wait_cqe(&ring, &cqe))
				break;
			tag = io_uring_cqe_get_data64(cqe);
			io_uring_cqe_seen(&ring, cqe);
			if (!wb || (tag & 1))
				inflight--;
		}
		kvp_uring_exit(&ring);
	}
	if (buf)
		kvp_mem_release(buf, bufs);
	free(slot_off);
	free(free_slots);
	w->err = err;
	return NULL;
}

int kvpb_raw_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		 struct kvpb_result *r)
{
	kvpb_drop_cache(&c->file);
	return kvpb_run_threads(c, j, raw_worker, NULL, NULL, r);
}

/* ---- mmap: the kernel's page cache ------------------------------------ */

/* Drop [from, to) of the mapping and its page cache (behind the scan). */
static void mmap_drop(struct kvpb_worker *w, uint64_t from, uint64_t to)
{
	const struct kvpb_job *j = w->j;

	madvise(w->base + from, to - from, MADV_DONTNEED);
	posix_fadvise(w->c->file.fd, (off_t)(j->off + from), (off_t)(to - from),
		      POSIX_FADV_DONTNEED);
}

static void *mmap_worker(void *arg)
{
	struct kvpb_worker *w = arg;
	const struct kvpb_job *j = w->j;
	uint64_t budget = w->c->opts.budget, dropped = 0, i, pos;
	/* Drop in steps of at least 8 MiB: a syscall pair per small block
	 * would charge the kernel's mmap with our bookkeeping. */
	uint64_t step = j->block > (8u << 20) ? j->block : (8u << 20);
	bool sequential = !j->order;

	pthread_barrier_wait(w->start);
	for (i = 0; i < j->reads; i++) {
		uint64_t off = kvpb_job_off(j, w->t, i);

		kvpb_worker_at(w, off);
		w->bad += kvpb_consume(w->base + (off - j->off), off, j->block);
		kvpb_worker_done(w, j->block);
		pos = (i + 1) * j->block;
		if (sequential && pos > budget &&
		    pos - budget - dropped >= step) {
			mmap_drop(w, dropped, pos - budget);
			dropped = pos - budget;
		}
	}
	return NULL;
}

int kvpb_mmap_run(struct kvpb_ctx *c, const struct kvpb_job *j,
		  struct kvpb_result *r)
{
	void *base;
	int err;

	kvpb_drop_cache(&c->file);
	base = mmap(NULL, j->len, PROT_READ, MAP_SHARED, c->file.fd,
		    (off_t)j->off);
	if (base == MAP_FAILED) {
		err = -errno;
		fprintf(stderr, "kvpbench: cannot mmap %s: %s\n", c->file.path,
			strerror(-err));
		return err;
	}
	err = kvpb_run_threads(c, j, mmap_worker, base, NULL, r);
	munmap(base, j->len);
	kvpb_drop_cache(&c->file);
	return err;
}

/* ---- scenarios -------------------------------------------------------- */

static const char *human(uint64_t b, char *buf, size_t len)
{
	if (b >= (1ull << 30) && !(b % (1ull << 30)))
		snprintf(buf, len, "%llu GiB", (unsigned long long)(b >> 30));
	else if (b >= (1ull << 20) && !(b % (1ull << 20)))
		snprintf(buf, len, "%llu MiB", (unsigned long long)(b >> 20));
	else
		snprintf(buf, len, "%llu KiB", (unsigned long long)(b >> 10));
	return buf;
}

/*
 * Run every mode asked for on job @j, --repeat times, interleaved (raw,
 * mmap, move, copy, raw, ...) so that a slow spell of the machine hits all
 * modes alike, and keep each mode's median run, with the spread.
 */
static void run_modes(struct kvpb_ctx *c, const struct kvpb_job *j)
{
	static const struct {
		unsigned bit;
		const char *name;
		unsigned install; /* enum kvp_install_mode */
	} modes[] = {
		{ KVPB_RAW, "raw", 0 },
		{ KVPB_MMAP, "mmap", 0 },
		{ KVPB_KVP_MOVE, "kvpager-move", 1 },
		{ KVPB_KVP_COPY, "kvpager-copy", 2 },
	};
	enum { NMODES = sizeof(modes) / sizeof(modes[0]) };
	static struct kvpb_result runs[NMODES][KVPB_MAX_REPEAT];
	static bool said_not_built;
	unsigned nruns[NMODES] = { 0 }, repeat = c->opts.repeat, m, k;
	bool failed[NMODES] = { false };
	char b1[32], b2[32];

	for (k = 0; k < repeat; k++) {
		for (m = 0; m < NMODES; m++) {
			struct kvpb_result *r = &runs[m][k];
			int64_t disk0, disk1;
			int err;

			if (!(c->opts.modes & modes[m].bit) || failed[m])
				continue;
			if (modes[m].install && !kvpb_pager_run) {
				if (!said_not_built)
					fprintf(stderr,
						"kvpbench: kvpager modes not "
						"built (no pager_modes.c)\n");
				said_not_built = true;
				continue;
			}
			kvpb_result_init(r, j, modes[m].name);
			kvpb_progress(c,
				      "%s %s: %s in %s blocks, %u thread%s, "
				      "depth %u (run %u/%u)",
				      j->scenario, modes[m].name,
				      human(j->reads * j->block * j->threads,
					    b1, sizeof(b1)),
				      human(j->block, b2, sizeof(b2)),
				      j->threads, j->threads > 1 ? "s" : "",
				      j->depth, k + 1, repeat);
			disk0 = kvpb_disk_read_bytes(&c->file);
			if (modes[m].bit == KVPB_RAW)
				err = kvpb_raw_run(c, j, r);
			else if (modes[m].bit == KVPB_MMAP)
				err = kvpb_mmap_run(c, j, r);
			else
				err = kvpb_pager_run(c, j, modes[m].install, r);
			disk1 = kvpb_disk_read_bytes(&c->file);
			if (disk0 >= 0 && disk1 >= disk0)
				r->disk_bytes = disk1 - disk0;
			if (err) {
				/* No figure for a mode that did not finish. */
				failed[m] = true;
				c->failures++;
				continue;
			}
			if (r->bad) {
				fprintf(stderr,
					"kvpbench: %s %s: %llu pattern "
					"mismatches: the data read is wrong\n",
					j->scenario, modes[m].name,
					(unsigned long long)r->bad);
				failed[m] = true;
				c->failures++;
			}
			nruns[m]++;
		}
	}
	for (m = 0; m < NMODES; m++) {
		struct kvpb_result *r;

		if (failed[m] && !nruns[m])
			continue;
		if (!nruns[m])
			continue;
		qsort(runs[m], nruns[m], sizeof(runs[m][0]), kvpb_cmp_gbps);
		r = kvpb_result_new(c, j, modes[m].name);
		if (!r)
			return;
		*r = runs[m][nruns[m] / 2];
		r->runs = nruns[m];
		r->gb_per_s_min = runs[m][0].gb_per_s;
		r->gb_per_s_max = runs[m][nruns[m] - 1].gb_per_s;
		for (k = 0; k < nruns[m]; k++)
			if (runs[m][k].bad && !r->bad)
				r->bad = runs[m][k].bad;
	}
}

int kvpb_stream(struct kvpb_ctx *c)
{
	const struct kvpb_opts *o = &c->opts;
	uint64_t len = 4 * o->budget;
	struct kvpb_job j;

	if (len > c->file.size)
		len = c->file.size;
	len -= len % o->block; /* at least one: main's sizes_check */
	j = (struct kvpb_job){
		.scenario = "stream",
		.off = 0,
		.len = len,
		.block = o->block,
		.threads = 1,
		.depth = o->depth,
		.reads = len / o->block,
		.order = NULL,
		.group = c->next_group++,
	};
	run_modes(c, &j);
	return 0;
}

/* xorshift64*: a fixed sequence, so every mode reads the same blocks. */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

int kvpb_random(struct kvpb_ctx *c)
{
	const struct kvpb_opts *o = &c->opts;
	uint64_t nblocks = c->file.size / o->rblock, reads, i, seed = 42;
	unsigned maxt = 1, k, save, first, nbusy = 0;
	int busy = -1;
	uint32_t *order;
	struct kvpb_job j;

	if (!nblocks || nblocks > UINT32_MAX) {
		fprintf(stderr,
			"kvpbench: random: %llu blocks of %llu bytes "
			"in the file; need 1 .. 2^32\n",
			(unsigned long long)nblocks,
			(unsigned long long)o->rblock);
		return -EINVAL;
	}
	for (k = 0; k < o->nthreads; k++)
		if (o->threads[k] > maxt)
			maxt = o->threads[k];
	if (maxt < 4 && o->ref_depth)
		maxt = 4; /* the reference line reads what 4 threads read */
	/*
	 * Each block is read at most once over all threads (a permutation),
	 * so no mode gets hits from memory: every read reaches the disk
	 * (main's sizes_check made the file large enough).
	 */
	reads = o->reads ? o->reads : nblocks / maxt;
	order = malloc(nblocks * sizeof(*order));
	if (!order)
		return -ENOMEM;
	for (i = 0; i < nblocks; i++)
		order[i] = (uint32_t)i;
	for (i = nblocks - 1; i > 0; i--) {
		uint64_t x = rnd(&seed) % (i + 1);
		uint32_t t = order[i];

		order[i] = order[x];
		order[x] = t;
	}

	j = (struct kvpb_job){
		.scenario = "random",
		.off = 0,
		.len = nblocks * o->rblock,
		.block = o->rblock,
		.order = order,
	};
	first = c->nresults;
	if (o->busy) {
		busy = kvpb_busy_start(&nbusy);
		if (busy < 0) {
			fprintf(stderr,
				"kvpbench: --busy: cannot start the competing "
				"process: %s\n",
				strerror(errno));
			free(order);
			return -errno;
		}
		kvpb_progress(c, "random: %u busy threads compete for the CPUs",
			      nbusy);
	}
	/* The anchor: one thread at depth 32 reads what maxt threads read. */
	if (o->ref_depth && (o->modes & KVPB_RAW)) {
		struct kvpb_job ref = j;
		unsigned before = c->nresults;

		ref.threads = 1;
		ref.depth = o->ref_depth;
		ref.reads = reads * maxt;
		ref.group = c->next_group++;
		save = c->opts.modes;
		c->opts.modes = KVPB_RAW;
		run_modes(c, &ref);
		c->opts.modes = save;
		if (c->nresults > before)
			c->results[before].reference = true;
	}
	for (k = 0; k < o->nthreads; k++) {
		j.threads = o->threads[k];
		j.depth = 1; /* each thread waits for its read */
		j.reads = reads;
		j.group = c->next_group++;
		run_modes(c, &j);
	}
	kvpb_busy_stop(busy);
	for (k = first; k < c->nresults; k++)
		c->results[k].busy_threads = busy > 0 ? nbusy : 0;
	free(order);
	return 0;
}
