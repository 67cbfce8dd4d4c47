/*
 * dev_emu.c - a device emulated on the CPU (device.h, dev_ops.h).
 *
 * Each stream is a queue of operations run later, in the order
 * kvp_emu_order picks, never earlier than an event allows: an operation
 * reads its source when it runs, not when it is issued, as a GPU's would.
 * So a schedule that relies on timing (a copy into a slot a queued kernel
 * still reads; a staging buffer refilled before its copy ran) computes
 * wrong numbers here, and the tests see them.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/device/device_i.h"

enum op_kind { OP_COPY, OP_SCATTER, OP_ATTEND, OP_RECORD, OP_WAIT };

struct op {
	enum op_kind kind;
	union {
		struct {
			void *dst;
			const void *src;
			size_t bytes;
		} copy;
		struct kvp_dev_scatter scatter;
		struct kvp_dev_attn attend;
		struct {
			int event;
			uint64_t gen; /* RECORD: its generation; WAIT: awaited */
		} ev;
	} u;
};

struct stream {
	struct op *q; /* queued, q[head .. len) not run */
	size_t head, len, cap;
};

struct emu {
	struct stream s[KVP_DEV_STREAMS];
	uint64_t issued[KVP_DEV_EVENTS]; /* generation of the last record */
	uint64_t reached[KVP_DEV_EVENTS]; /* generation that has run */
	enum kvp_emu_order order;
};

static int emu_open(void **dev, char *msg, size_t len)
{
	struct emu *e = calloc(1, sizeof(*e));

	if (!e) {
		snprintf(msg, len, "emu: out of memory");
		return -ENOMEM;
	}
	*dev = e;
	return 0;
}

static void emu_close(void *dev)
{
	struct emu *e = dev;
	int i;

	for (i = 0; i < KVP_DEV_STREAMS; i++)
		free(e->s[i].q);
	free(e);
}

static void emu_describe(void *dev, char *buf, size_t len)
{
	snprintf(buf, len, "emu (CPU emulation of a device: checks, no speed)");
}

static int emu_mem_alloc(void *dev, size_t bytes, void **p)
{
	*p = malloc(bytes ? bytes : 1);
	return *p ? 0 : -ENOMEM;
}

static void emu_mem_free(void *dev, void *p)
{
	free(p);
}

static void attend_run(const struct kvp_dev_attn *a)
{
	const struct kvp_paged_shape *sh = &a->shape;
	uint32_t dim = sh->head_dim, qf = sh->q_heads * dim, i, h, sp, d;
	float scale = 1.0f / sqrtf((float)dim);
	float qs[KVP_DEV_MAX_DIM];

	for (i = 0; i < a->nseq; i++) {
		uint32_t n = a->off[i + 1] - a->off[i];
		float *scr = a->scratch + (size_t)i * sh->q_heads * a->splits *
					      kvp_paged_partial_floats(dim);

		for (h = 0; h < sh->q_heads; h++) {
			for (d = 0; d < dim; d++)
				qs[d] = a->q[(size_t)i * qf + h * dim + d] *
					scale;
			for (sp = 0; sp < a->splits; sp++) {
				uint32_t lo, hi;

				kvp_paged_split_range(n, sp, a->splits, &lo,
						      &hi);
				kvp_paged_share(
				    sh, a->pool, a->slots + a->off[i],
				    a->ntok ? a->ntok + a->off[i] : NULL, lo,
				    hi, h, qs,
				    kvp_paged_partial(scr, h, sp, a->splits,
						      dim));
			}
			kvp_paged_merge_head(scr, h, a->splits, dim,
					     a->out + (size_t)i * qf);
		}
	}
}

static int run_one(struct emu *e, int s, int depth);

/* Run stream s until event ev reaches generation gen. */
static int run_until(struct emu *e, int s, int ev, uint64_t gen, int depth)
{
	int err;

	while (e->reached[ev] < gen) {
		if (e->s[s].head == e->s[s].len)
			return -EDEADLK; /* awaited but never to be recorded */
		err = run_one(e, s, depth);
		if (err)
			return err;
	}
	return 0;
}

/* Run the first queued operation of stream s. */
static int run_one(struct emu *e, int s, int depth)
{
	struct stream *st = &e->s[s];
	struct op *o = &st->q[st->head];
	uint32_t i;
	int err;

	switch (o->kind) {
	case OP_COPY:
		memcpy(o->u.copy.dst, o->u.copy.src, o->u.copy.bytes);
		break;
	case OP_SCATTER:
		for (i = 0; i < o->u.scatter.count; i++)
			memcpy((char *)o->u.scatter.dst +
				   o->u.scatter.slots[i] * o->u.scatter.stride,
			       (const char *)o->u.scatter.src +
				   (size_t)i * o->u.scatter.bytes,
			       o->u.scatter.bytes);
		break;
	case OP_ATTEND:
		attend_run(&o->u.attend);
		break;
	case OP_RECORD:
		e->reached[o->u.ev.event] = o->u.ev.gen;
		break;
	case OP_WAIT:
		if (e->reached[o->u.ev.event] < o->u.ev.gen) {
			if (depth > 2)
				return -EDEADLK;
			err = run_until(e, 1 - s, o->u.ev.event, o->u.ev.gen,
					depth + 1);
			if (err)
				return err;
		}
		break;
	}
	st->head++;
	if (st->head == st->len)
		st->head = st->len = 0;
	return 0;
}

static int drain(struct emu *e, int s)
{
	int err;

	while (e->s[s].head < e->s[s].len) {
		err = run_one(e, s, 0);
		if (err)
			return err;
	}
	return 0;
}

static int push(struct emu *e, int s, const struct op *o)
{
	struct stream *st = &e->s[s];

	if (s < 0 || s >= KVP_DEV_STREAMS)
		return -EINVAL;
	if (st->len == st->cap) {
		size_t cap = st->cap ? 2 * st->cap : 64;
		struct op *q = realloc(st->q, cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		st->q = q;
		st->cap = cap;
	}
	st->q[st->len++] = *o;
	if (e->order == KVP_EMU_IMMEDIATE ||
	    (e->order == KVP_EMU_COPY_FIRST && s == KVP_DEV_STREAM_COPY))
		return drain(e, s);
	return 0;
}

static int emu_copy(void *dev, void *dst, const void *src, size_t bytes,
		    int to_dev, int stream)
{
	struct op o = { .kind = OP_COPY };

	o.u.copy.dst = dst;
	o.u.copy.src = src;
	o.u.copy.bytes = bytes;
	return push(dev, stream, &o);
}

static int emu_scatter(void *dev, const struct kvp_dev_scatter *s, int stream)
{
	struct op o = { .kind = OP_SCATTER };

	o.u.scatter = *s;
	return push(dev, stream, &o);
}

static int emu_attend(void *dev, const struct kvp_dev_attn *a, int stream)
{
	struct op o = { .kind = OP_ATTEND };

	if (a->shape.head_dim > KVP_DEV_MAX_DIM || !a->splits || !a->nseq)
		return -EINVAL;
	o.u.attend = *a;
	return push(dev, stream, &o);
}

static int emu_record(void *dev, int event, int stream)
{
	struct emu *e = dev;
	struct op o = { .kind = OP_RECORD };

	if (event < 0 || event >= KVP_DEV_EVENTS)
		return -EINVAL;
	o.u.ev.event = event;
	o.u.ev.gen = ++e->issued[event];
	return push(e, stream, &o);
}

static int emu_stream_wait(void *dev, int stream, int event)
{
	struct emu *e = dev;
	struct op o = { .kind = OP_WAIT };

	if (event < 0 || event >= KVP_DEV_EVENTS)
		return -EINVAL;
	o.u.ev.event = event;
	o.u.ev.gen = e->issued[event];
	return push(e, stream, &o);
}

static int emu_event_sync(void *dev, int event)
{
	struct emu *e = dev;
	uint64_t gen;
	int s, err;

	if (event < 0 || event >= KVP_DEV_EVENTS)
		return -EINVAL;
	gen = e->issued[event];
	/* the record is queued on one of the streams: run both in turn */
	while (e->reached[event] < gen) {
		bool found = false;

		for (s = 0; s < KVP_DEV_STREAMS; s++) {
			size_t i;

			for (i = e->s[s].head; i < e->s[s].len; i++)
				if (e->s[s].q[i].kind == OP_RECORD &&
				    e->s[s].q[i].u.ev.event == event &&
				    e->s[s].q[i].u.ev.gen == gen)
					break;
			if (i < e->s[s].len) {
				found = true;
				err = run_until(e, s, event, gen, 0);
				if (err)
					return err;
			}
		}
		if (!found)
			return -EDEADLK;
	}
	return 0;
}

void kvp_dev_emu_set_order(void *dev, enum kvp_emu_order o)
{
	((struct emu *)dev)->order = o;
}

const struct kvp_dev_ops kvp_dev_emu_ops = {
	.name = "emu",
	.open = emu_open,
	.close = emu_close,
	.describe = emu_describe,
	.mem_alloc = emu_mem_alloc,
	.mem_free = emu_mem_free,
	.host_alloc = emu_mem_alloc,
	.host_free = emu_mem_free,
	.copy = emu_copy,
	.scatter = emu_scatter,
	.attend = emu_attend,
	.record = emu_record,
	.stream_wait = emu_stream_wait,
	.event_sync = emu_event_sync,
};
