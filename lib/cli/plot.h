/*
 * plot.h - the tools' charts (`--plot FILE`): a gnuplot script written in
 * memory and run by gnuplot (Debian's gnuplot-nox, not linked: run),
 * into FILE, an SVG when it ends in .svg, a PNG when in .png.
 *
 *   if (plot && kvp_plot_check("kvpbench", plot))   // at start
 *           return 2;
 *   ... the runs ...
 *   kvp_plot_begin(&p, plot, title);
 *   fprintf(p.f, "$d << EOD\n...EOD\nplot $d ...\n");
 *   err = kvp_plot_end(&p, "kvpbench");
 *
 * The figures go to gnuplot's standard input in datablocks, so that no
 * file but FILE is written; gnuplot writes FILE.tmp, renamed to FILE once
 * it succeeded, so that a failed plot leaves an older FILE as it was.
 * The calls say what failed on stderr, naming @prog, with the remedy.
 */
#ifndef KVP_PLOT_H
#define KVP_PLOT_H

#include <stddef.h>
#include <stdio.h>

/*
 * kvp_plot_check - at start, before any run: whether @file's name ends in
 * .svg or .png, gnuplot is on PATH and @file's folder is writable.  0, or
 * -EINVAL (the name), -ENOENT (no gnuplot: the remedy is said) or the
 * folder's -errno.  Nothing is created.
 */
int kvp_plot_check(const char *prog, const char *file);

/* A gnuplot script being written: begin sets the terminal, the output
 * (FILE.tmp) and @title; the caller writes its datablocks and plot
 * command to ->f; end runs gnuplot on it and renames FILE.tmp to FILE
 * (0), or removes FILE.tmp and says why (-errno).  End frees the script
 * whatever happens.  Begin returns 0 or -ENOMEM (nothing to end). */
struct kvp_plot {
	const char *file; /* FILE */
	FILE *f;	  /* the script (a memstream) */
	char *buf;	  /* its text */
	size_t len;
};
int kvp_plot_begin(struct kvp_plot *p, const char *file, const char *title);
int kvp_plot_end(struct kvp_plot *p, const char *prog);

/* @s as a quoted gnuplot string (a label, a title) on @f. */
void kvp_plot_str(FILE *f, const char *s);

#endif /* KVP_PLOT_H */
