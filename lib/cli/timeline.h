/*
 * timeline.h - a decode's per-step figures, kept for its chart (`kvpager
 * run --plot FILE`): T_step, T_compute, T_load and demand faults of each
 * step, in memory bounded whatever the number of steps.
 *
 *   kvp_timeline_init(&t, KVP_TIMELINE_POINTS);
 *   for (each step) kvp_timeline_add(&t, &step);
 *   kvp_timeline_plot(&t, "run.svg", title, warmup, "kvpager");
 *   kvp_timeline_free(&t);
 *
 * A point holds the sums of `per` consecutive steps, per = 1 at first:
 * every step is a point of its own until the points are full; then
 * neighbours are merged in pairs and per doubles, so that a long run
 * keeps between cap / 2 and cap points, each the mean of per steps, its
 * whole length drawn at one resolution.  One thread adds to a timeline.
 */
#ifndef KVP_TIMELINE_H
#define KVP_TIMELINE_H

#include <stdint.h>

/* The points kvpager run keeps: every step of a run up to this many,
 * 48 bytes each (96 KiB). */
#define KVP_TIMELINE_POINTS 2048u

/* One step's figures (the caller's to measure). */
struct kvp_timeline_step {
	double t_step_s;	/* the step's wall time */
	double t_compute_s;	/* its compute */
	double t_load_s;	/* time with a load outstanding */
	uint64_t demand_faults; /* faults that waited for a read */
};

/* A point: the sums over steps [first, first + steps). */
struct kvp_timeline_point {
	uint64_t first;
	uint64_t steps;
	double t_step_s, t_compute_s, t_load_s;
	uint64_t demand_faults;
};

struct kvp_timeline {
	struct kvp_timeline_point *pt; /* [cap]: [0, n) full, pt[n] filling */
	uint32_t cap, n;
	uint64_t per;	/* steps a full point sums */
	uint64_t steps; /* steps added */
};

/* kvp_timeline_init - an empty timeline of at most @cap points (an even
 * number, 2 or more).  0, -EINVAL or -ENOMEM. */
int kvp_timeline_init(struct kvp_timeline *t, uint32_t cap);

/* kvp_timeline_add - the next step's figures. */
void kvp_timeline_add(struct kvp_timeline *t,
		      const struct kvp_timeline_step *s);

/* Free what init took; a zeroed or freed timeline is fine. */
void kvp_timeline_free(struct kvp_timeline *t);

/*
 * kvp_timeline_plot - the chart of @t into @file by gnuplot
 * (lib/cli/plot.h, whose kvp_plot_check the caller ran at start): per
 * step (or per point's mean), T_compute, T_load, T_step and
 * max(T_compute, T_load) in ms, demand faults on the right-hand axis,
 * steps before @warmup shaded as the warm-up.  @title heads it.  0, or
 * -ENODATA (no step) or kvp_plot_end's error, said on stderr with
 * @prog.
 */
int kvp_timeline_plot(const struct kvp_timeline *t, const char *file,
		      const char *title, uint64_t warmup, const char *prog);

#endif /* KVP_TIMELINE_H */
