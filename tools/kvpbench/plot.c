/*
 * plot.c - `--plot FILE`: the run's figures drawn by gnuplot (Debian's
 * gnuplot-nox) into FILE, SVG or PNG by its ending.
 *
 * SVG is the one to commit (text, a few tens of KiB, sharp at any size,
 * shown by any browser and by GitHub); PNG is for where SVG is not shown.
 * The script goes to gnuplot's standard input with the figures in
 * datablocks, so that no file but FILE is written; gnuplot writes
 * FILE.tmp, renamed to FILE once it succeeded, so that a failed plot
 * leaves an older FILE as it was.
 */
#include "tools/kvpbench/kvpbench.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether @name is an executable file in a folder of $PATH. */
static bool on_path(const char *name)
{
	const char *path = getenv("PATH"), *p, *end;
	char file[PATH_MAX];

	if (!path)
		path = "/usr/bin:/bin";
	for (p = path; *p; p = *end ? end + 1 : end) {
		end = strchrnul(p, ':');
		snprintf(file, sizeof(file), "%.*s/%s",
			 end > p ? (int)(end - p) : 1, end > p ? p : ".", name);
		if (!access(file, X_OK))
			return true;
	}
	return false;
}

/* "svg" or "png" by @file's ending, or NULL. */
static const char *plot_kind(const char *file)
{
	size_t n = strlen(file);

	if (n > 4 && !strcasecmp(file + n - 4, ".svg"))
		return "svg";
	if (n > 4 && !strcasecmp(file + n - 4, ".png"))
		return "png";
	return NULL;
}

int kvpb_plot_check(const char *prog, const char *file)
{
	char dir[PATH_MAX];

	if (!plot_kind(file) || strpbrk(file, "\n\r")) {
		fprintf(stderr,
			"%s: --plot %s: the file's name must end in .svg "
			"(vector, the one to commit) or .png\n",
			prog, file);
		return -EINVAL;
	}
	if (!on_path("gnuplot")) {
		fprintf(stderr,
			"%s: --plot needs gnuplot, which is not on PATH; "
			"remedy: apt-get install gnuplot-nox, or leave out "
			"--plot\n",
			prog);
		return -ENOENT;
	}
	snprintf(dir, sizeof(dir), "%s", file);
	if (access(dirname(dir), W_OK)) {
		int err = -errno;

		fprintf(stderr, "%s: --plot %s: cannot write in %s: %s\n", prog,
			file, dir, strerror(-err));
		return err;
	}
	return 0;
}

/* @s as a gnuplot string in single quotes ('' for a quote). */
void kvpb_plot_str(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s, f);
	}
	fputc('\'', f);
}

int kvpb_plot_begin(struct kvpb_plot *p, const char *file, const char *title)
{
	char tmp[PATH_MAX + 8];

	memset(p, 0, sizeof(*p));
	p->file = file;
	p->f = open_memstream(&p->buf, &p->len);
	if (!p->f)
		return -ENOMEM;
	if (!strcmp(plot_kind(file), "svg"))
		fputs("set terminal svg size 960,540 noenhanced "
		      "font 'sans,11' background rgb 'white'\n",
		      p->f);
	else
		fputs("set terminal pngcairo size 1280,720 noenhanced "
		      "font 'sans,11' background rgb 'white'\n",
		      p->f);
	snprintf(tmp, sizeof(tmp), "%s.tmp", file);
	fputs("set output ", p->f);
	kvpb_plot_str(p->f, tmp);
	fputs("\nset title ", p->f);
	kvpb_plot_str(p->f, title);
	fputs("\nset style fill solid 0.85 border -1\n"
	      "set grid ytics\nset yrange [0:*]\n"
	      "set key outside bottom center horizontal\n",
	      p->f);
	return 0;
}

/* Run gnuplot on @script (@len bytes); its messages go to our stderr. */
static int gnuplot_run(const char *script, size_t len)
{
	struct sigaction ign = { .sa_handler = SIG_IGN }, old;
	int pfd[2], status;
	size_t done = 0;
	pid_t pid;

	pid = kvpb_fork_pipe(pfd);
	if (pid < 0)
		return pid;
	if (!pid) {
		dup2(pfd[0], STDIN_FILENO);
		/* stdout is the table's: gnuplot has nothing to say there */
		dup2(STDERR_FILENO, STDOUT_FILENO);
		execlp("gnuplot", "gnuplot", (char *)NULL);
		_exit(127);
	}
	close(pfd[0]);
	/* gnuplot may die before reading it all: EPIPE, not SIGPIPE */
	sigaction(SIGPIPE, &ign, &old);
	while (done < len) {
		ssize_t n = write(pfd[1], script + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		done += (size_t)n;
	}
	close(pfd[1]);
	sigaction(SIGPIPE, &old, NULL);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return WIFEXITED(status) && WEXITSTATUS(status) == 127 ? -ENOENT
									: -EIO;
	return done == len ? 0 : -EPIPE;
}

int kvpb_plot_end(struct kvpb_plot *p, const char *prog)
{
	char tmp[PATH_MAX + 8];
	int err;

	snprintf(tmp, sizeof(tmp), "%s.tmp", p->file);
	err = fclose(p->f) ? -ENOMEM : 0;
	p->f = NULL;
	if (!err)
		err = gnuplot_run(p->buf, p->len);
	if (!err && rename(tmp, p->file))
		err = -errno;
	if (err) {
		unlink(tmp);
		fprintf(stderr,
			"%s: --plot %s: not made (gnuplot: %s)%s; the "
			"figures above stand\n",
			prog, p->file, strerror(-err),
			err == -ENOENT ? ": remedy: apt-get install gnuplot-nox"
				       : "");
	}
	free(p->buf);
	p->buf = NULL;
	return err;
}

/* ---- the GB/s chart of stream, random and install ---------------------- */

/* A mode drawn as a line across its cluster rather than a bar. */
static bool is_line(const struct kvpb_result *r)
{
	return r->reference || !strcmp(r->mode, "raw") ||
	       !strcmp(r->mode, "mmap");
}

static void cluster_label(const struct kvpb_result *r, char *buf, size_t len)
{
	uint64_t b = r->block_bytes;

	snprintf(buf, len, "%s %llu%s, %u thr", r->scenario,
		 (unsigned long long)(b >= (1u << 20) ? b >> 20 : b >> 10),
		 b >= (1u << 20) ? "M" : "K", r->threads);
}

int kvpb_plot_results(const struct kvpb_ctx *c, const char *file)
{
	/* the line modes: style and legend */
	static const struct {
		const char *mode;
		bool reference;
		const char *style, *title;
	} lines[] = {
		{ "raw", false, "lw 3 lc rgb 'black'", "raw (io_uring O_DIRECT)" },
		{ "mmap", false, "lw 3 dt 2 lc rgb '#d62728'", "mmap (cold)" },
		{ "raw", true, "lw 2 dt 3 lc rgb '#555555'", "raw, depth 32" },
	};
	static const char *const colors[] = { "#1f77b4", "#2ca02c", "#ff7f0e",
					      "#9467bd" };
	const char *bars[4];
	unsigned groups[KVPB_MAX_RESULTS], ngroups = 0, nbars = 0, i, k, g;
	unsigned rows[3] = { 0 }; /* of each line mode's datablock */
	unsigned drawn = 0;	  /* line modes in the plot command */
	char title[256], label[64];
	struct kvpb_plot p;
	double w;
	FILE *f;
	int err;

	/* clusters: the groups in the order they ran, but the depth-32
	 * line, which is drawn over the clusters of its block size */
	for (i = 0; i < c->nresults; i++) {
		const struct kvpb_result *r = &c->results[i];

		if (!r->reference) {
			for (g = 0; g < ngroups && groups[g] != r->group; g++)
				;
			if (g == ngroups)
				groups[ngroups++] = r->group;
		}
		if (is_line(r))
			continue;
		for (k = 0; k < nbars && strcmp(bars[k], r->mode); k++)
			;
		if (k == nbars && nbars < 4)
			bars[nbars++] = r->mode;
	}
	if (!ngroups) {
		fprintf(stderr, "kvpbench: --plot %s: no figures to draw\n",
			file);
		return -ENODATA;
	}
	snprintf(title, sizeof(title),
		 "kvpbench: GB/s per mode (bars), raw and mmap as lines; "
		 "budget %llu MiB, file %llu MiB%s",
		 (unsigned long long)(c->opts.budget >> 20),
		 (unsigned long long)(c->file.size >> 20),
		 c->opts.repeat > 1 ? ", medians" : "");
	err = kvpb_plot_begin(&p, file, title);
	if (err)
		return err;
	f = p.f;
	w = 0.8 / (nbars ? nbars : 1);
	fprintf(f, "set ylabel 'GB/s'\nset xrange [-0.6:%u.6]\nset xtics (",
		ngroups - 1);
	for (g = 0; g < ngroups; g++) {
		for (i = 0; c->results[i].group != groups[g]; i++)
			;
		cluster_label(&c->results[i], label, sizeof(label));
		fprintf(f, "%s", g ? ", " : "");
		kvpb_plot_str(f, label);
		fprintf(f, " %u", g);
	}
	fputs(")\n", f);
	/* $bK: x y width of bar mode K; $lK: x y dx dy of line mode K */
	for (k = 0; k < nbars; k++) {
		fprintf(f, "$b%u << EOD\n", k);
		for (i = 0; i < c->nresults; i++) {
			const struct kvpb_result *r = &c->results[i];

			if (strcmp(r->mode, bars[k]) || is_line(r))
				continue;
			for (g = 0; groups[g] != r->group; g++)
				;
			fprintf(f, "%.4f %.4f %.4f\n", g - 0.4 + w * (k + 0.5),
				r->gb_per_s, w);
		}
		fputs("EOD\n", f);
	}
	for (k = 0; k < sizeof(lines) / sizeof(lines[0]); k++) {
		fprintf(f, "$l%u << EOD\n", k);
		for (i = 0; i < c->nresults; i++) {
			const struct kvpb_result *r = &c->results[i];

			if (strcmp(r->mode, lines[k].mode) ||
			    r->reference != lines[k].reference)
				continue;
			for (g = 0; g < ngroups; g++) {
				unsigned q;

				/* its own cluster; the depth-32 line: each
				 * of its scenario and block size */
				for (q = 0; c->results[q].group != groups[g];
				     q++)
					;
				if (r->reference
					? strcmp(c->results[q].scenario,
						 r->scenario) ||
					      c->results[q].block_bytes !=
						  r->block_bytes
					: groups[g] != r->group)
					continue;
				fprintf(f, "%.2f %.4f 0.9 0\n", g - 0.45,
					r->gb_per_s);
				rows[k]++;
			}
		}
		fputs("EOD\n", f);
	}
	for (k = 0; k < nbars; k++) {
		fprintf(f,
			"%s$b%u using 1:2:3 with boxes lc rgb '%s' title ",
			k ? ", " : "plot ", k, colors[k]);
		kvpb_plot_str(f, bars[k]);
		fprintf(f,
			", $b%u using 1:2:(sprintf('%%.2f', $2)) with labels "
			"offset 0,0.6 notitle",
			k);
	}
	for (k = 0; k < sizeof(lines) / sizeof(lines[0]); k++) {
		/* an empty datablock is an error to gnuplot */
		if (!rows[k])
			continue;
		fprintf(f, "%s$l%u using 1:2:3:4 with vectors nohead %s title ",
			nbars || drawn ? ", " : "plot ", k, lines[k].style);
		kvpb_plot_str(f, lines[k].title);
		drawn++;
	}
	fputc('\n', f);
	return kvpb_plot_end(&p, "kvpbench");
}
