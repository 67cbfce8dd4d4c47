/*
 * plot.c - the tools' charts, drawn by gnuplot (plot.h).
 *
 * SVG is the one to commit (text, a few tens of KiB, sharp at any size,
 * shown by any browser and by GitHub); PNG is for where SVG is not shown.
 */
#include "lib/cli/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

int kvp_plot_check(const char *prog, const char *file)
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

void kvp_plot_str(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s, f);
	}
	fputc('\'', f);
}

int kvp_plot_begin(struct kvp_plot *p, const char *file, const char *title)
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
	kvp_plot_str(p->f, tmp);
	fputs("\nset title ", p->f);
	kvp_plot_str(p->f, title);
	fputs("\nset style fill solid 0.85 border -1\n"
	      "set grid ytics\nset yrange [0:*]\n"
	      "set key outside bottom center horizontal\n",
	      p->f);
	return 0;
}

/* Run gnuplot on @script (@len bytes); its messages go to our stderr.
 * Spawned, not forked: the caller may be a pager's process, threads and
 * all. */
static int gnuplot_run(const char *script, size_t len)
{
	struct sigaction ign = { .sa_handler = SIG_IGN }, old;
	char *argv[] = { "gnuplot", NULL };
	posix_spawn_file_actions_t fa;
	int pfd[2], status, err;
	size_t done = 0;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC))
		return -errno;
	err = posix_spawn_file_actions_init(&fa);
	if (err) {
		close(pfd[0]);
		close(pfd[1]);
		return -err;
	}
	err = posix_spawn_file_actions_adddup2(&fa, pfd[0], STDIN_FILENO);
	/* stdout is the table's: gnuplot has nothing to say there */
	if (!err)
		err = posix_spawn_file_actions_adddup2(&fa, STDERR_FILENO,
							STDOUT_FILENO);
	if (!err)
		err = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (err) {
		close(pfd[0]);
		close(pfd[1]);
		return -err;
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

int kvp_plot_end(struct kvp_plot *p, const char *prog)
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
