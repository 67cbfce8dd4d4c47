/*
 * progress.h - progress of a long phase on stderr, as the tools show it:
 * a bar redrawn in place when stderr is a terminal, else one line every
 * few seconds (a log, a CI job, `2>file`), and nothing when quiet.
 *
 *   kvp_progress_start(&p, "kvpager", "prefill", quiet);
 *   for (...) kvp_progress_update(&p, done, total, "MiB");
 *   kvp_progress_done(&p, total, "MiB");
 *
 * Not thread-safe: one thread updates a struct kvp_progress.
 */
#ifndef KVP_PROGRESS_H
#define KVP_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

/* Seconds between two lines when stderr is not a terminal. */
#define KVP_PROGRESS_LINE_S 5.0

struct kvp_progress {
	const char *prog; /* "kvpbench": the lines' prefix */
	const char *what; /* the phase: "prefill", "fill" */
	bool on;	  /* false: --quiet */
	bool tty;	  /* a bar redrawn in place; else a line now and then */
	bool drawn;	  /* a bar is on the terminal's line, unfinished */
	double t0, last;  /* start, last drawn (CLOCK_MONOTONIC seconds) */
};

/* kvp_progress_start - phase @what of program @prog begins now; @quiet
 * silences it.  Whether stderr is a terminal is asked here. */
void kvp_progress_start(struct kvp_progress *p, const char *prog,
			const char *what, bool quiet);

/* kvp_progress_update - @done of @total @unit: the bar (at most 10 times
 * a second) or a line (every KVP_PROGRESS_LINE_S seconds). */
void kvp_progress_update(struct kvp_progress *p, uint64_t done, uint64_t total,
			 const char *unit);

/* kvp_progress_done - the phase ended at @done of @total: the bar is
 * finished with a newline (a terminal); nothing more otherwise. */
void kvp_progress_done(struct kvp_progress *p, uint64_t done, uint64_t total,
		       const char *unit);

#endif /* KVP_PROGRESS_H */
