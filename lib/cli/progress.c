/*
 * progress.c - progress on stderr (progress.h).
 */
#include "lib/cli/progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 30

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvp_progress_start(struct kvp_progress *p, const char *prog,
			const char *what, bool quiet)
{
	p->prog = prog;
	p->what = what;
	p->on = !quiet;
	p->tty = isatty(STDERR_FILENO);
	p->drawn = false;
	p->t0 = now_s();
	/* a line only after the first interval; a bar at once */
	p->last = p->tty ? 0 : p->t0;
}

static void draw(struct kvp_progress *p, uint64_t done, uint64_t total,
		 const char *unit, double t, bool end)
{
	double frac = total ? (double)done / (double)total : 1;
	char bar[BAR_WIDTH + 1];
	int n, i;

	if (frac > 1)
		frac = 1;
	n = (int)(frac * BAR_WIDTH);
	for (i = 0; i < BAR_WIDTH; i++)
		bar[i] = i < n ? '#' : '.';
	bar[BAR_WIDTH] = 0;
	fprintf(stderr,
		"\r%-8s [%s] %3.0f%% %" PRIu64 "/%" PRIu64 " %s %.1fs ",
		p->what, bar, frac * 100, done, total, unit, t - p->t0);
	p->drawn = !end;
	if (end)
		fputc('\n', stderr);
}

void kvp_progress_update(struct kvp_progress *p, uint64_t done, uint64_t total,
			 const char *unit)
{
	double t;

	if (!p->on)
		return;
	t = now_s();
	if (!p->tty) {
		if (t - p->last < KVP_PROGRESS_LINE_S)
			return;
		p->last = t;
		fprintf(stderr,
			"%s: %s %" PRIu64 "/%" PRIu64 " %s (%.0f%%), %.0f s\n",
			p->prog, p->what, done, total, unit,
			total ? 100.0 * (double)done / (double)total : 100.0,
			t - p->t0);
		return;
	}
	if (t - p->last < 0.1 && done < total)
		return;
	p->last = t;
	draw(p, done, total, unit, t, done >= total);
}

void kvp_progress_done(struct kvp_progress *p, uint64_t done, uint64_t total,
		       const char *unit)
{
	if (!p->on || !p->tty || !p->drawn)
		return;
	draw(p, done, total, unit, now_s(), true);
}
