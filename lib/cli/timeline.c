/*
 * timeline.c - a decode's per-step figures and their chart (timeline.h).
 */
#include "lib/cli/timeline.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cli/plot.h"

int kvp_timeline_init(struct kvp_timeline *t, uint32_t cap)
{
	memset(t, 0, sizeof(*t));
	if (cap < 2 || cap % 2)
		return -EINVAL;
	t->pt = calloc(cap, sizeof(*t->pt));
	if (!t->pt)
		return -ENOMEM;
	t->cap = cap;
	t->per = 1;
	return 0;
}

void kvp_timeline_free(struct kvp_timeline *t)
{
	free(t->pt);
	memset(t, 0, sizeof(*t));
}

static void point_add(struct kvp_timeline_point *a,
		      const struct kvp_timeline_point *b)
{
	a->steps += b->steps;
	a->t_step_s += b->t_step_s;
	a->t_compute_s += b->t_compute_s;
	a->t_load_s += b->t_load_s;
	a->demand_faults += b->demand_faults;
}

void kvp_timeline_add(struct kvp_timeline *t,
		      const struct kvp_timeline_step *s)
{
	struct kvp_timeline_point *p = &t->pt[t->n];
	uint32_t i;

	if (!p->steps)
		p->first = t->steps;
	point_add(p, &(struct kvp_timeline_point){
			 .steps = 1,
			 .t_step_s = s->t_step_s,
			 .t_compute_s = s->t_compute_s,
			 .t_load_s = s->t_load_s,
			 .demand_faults = s->demand_faults });
	t->steps++;
	if (p->steps < t->per || ++t->n < t->cap)
		return;
	/* full: pairs of neighbours become one point of twice the steps */
	for (i = 0; i < t->cap / 2; i++) {
		t->pt[i] = t->pt[2 * i];
		point_add(&t->pt[i], &t->pt[2 * i + 1]);
	}
	memset(&t->pt[t->cap / 2], 0, t->cap / 2 * sizeof(*t->pt));
	t->n = t->cap / 2;
	t->per *= 2;
}

/* A round top for an axis that holds @v (never 0: gnuplot refuses an
 * empty range, and says so). */
static double axis_top(double v)
{
	return v > 0 ? v * 1.15 : 1;
}

int kvp_timeline_plot(const struct kvp_timeline *t, const char *file,
		      const char *title, uint64_t warmup, const char *prog)
{
	uint32_t i, n = t->n + (t->pt && t->pt[t->n].steps ? 1 : 0);
	double top = 0, ftop = 0;
	const char *ln;
	struct kvp_plot p;
	FILE *f;
	int err;

	if (!n) {
		fprintf(stderr, "%s: --plot %s: no decode step to draw\n", prog,
			file);
		return -ENODATA;
	}
	err = kvp_plot_begin(&p, file, title);
	if (err) {
		fprintf(stderr, "%s: --plot %s: out of memory\n", prog, file);
		return err;
	}
	f = p.f;
	/* $t: step (a point's middle), T_step, T_compute, T_load,
	 * max(T_compute, T_load) in ms, demand faults per step, width */
	fputs("$t << EOD\n", f);
	for (i = 0; i < n; i++) {
		const struct kvp_timeline_point *q = &t->pt[i];
		double k = 1e3 / (double)q->steps;
		double mx = q->t_compute_s > q->t_load_s ? q->t_compute_s
							 : q->t_load_s;
		double fl = (double)q->demand_faults / (double)q->steps;

		fprintf(f, "%.1f %.4f %.4f %.4f %.4f %.3f %" PRIu64 "\n",
			(double)q->first + (double)(q->steps - 1) / 2,
			q->t_step_s * k, q->t_compute_s * k, q->t_load_s * k,
			mx * k, fl, q->steps);
		if (q->t_step_s * k > top)
			top = q->t_step_s * k;
		if (mx * k > top)
			top = mx * k;
		if (fl > ftop)
			ftop = fl;
	}
	fputs("EOD\n", f);
	if (t->per > 1)
		fprintf(f,
			"set xlabel 'decode step (a point: the mean of %" PRIu64
			" steps)'\n",
			t->per);
	else
		fputs("set xlabel 'decode step'\n", f);
	fprintf(f,
		"set ylabel 'ms per step'\nset y2label 'demand faults per "
		"step'\nset ytics nomirror\nset y2tics\n"
		"set yrange [0:%.4f]\nset y2range [0:%.4f]\n"
		"set xrange [-0.5:%.1f]\n",
		axis_top(top), axis_top(ftop), (double)t->steps - 0.5);
	if (warmup > t->steps)
		warmup = t->steps;
	if (warmup) {
		fprintf(f,
			"set object 1 rect from -0.5, graph 0 to %.1f, graph 1 "
			"behind fc rgb '#eeeeee' fs solid 1.0 noborder\n"
			"set label 1 'warm-up (shaded)' at graph 0.01, "
			"graph 0.96 left\n",
			(double)warmup - 0.5);
	}
	/* a short run's steps as dots too: a line needs two of them */
	ln = n <= 64 ? "linespoints pt 7 ps 0.5" : "lines";
	fprintf(f,
		"plot $t using 1:6:($7 * 0.6) axes x1y2 with boxes fs solid 0.3 "
		"noborder lc rgb '#d62728' title 'demand faults (right axis)', "
		"$t using 1:3 with %s lw 2 lc rgb '#1f77b4' title 'T_compute', "
		"$t using 1:4 with %s lw 2 lc rgb '#ff7f0e' title 'T_load', "
		"$t using 1:5 with lines lw 2 dt 2 lc rgb '#555555' "
		"title 'max(T_compute, T_load)', "
		"$t using 1:2 with %s lw 3 lc rgb 'black' title 'T_step'\n",
		ln, ln, ln);
	return kvp_plot_end(&p, prog);
}
