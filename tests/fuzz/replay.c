/*
 * replay.c - main() of a harness built without libFuzzer (make check).
 *
 * test_fuzz_<name> feeds every file of tests/fuzz/<name>/ (relative to the
 * current directory, the repository root under tests/run-tests.sh), or of
 * the files and folders given as arguments, to LLVMFuzzerTestOneInput.  A
 * broken invariant aborts (FUZZ_CHECK); a folder that is missing or empty
 * is an error, so that a renamed corpus cannot pass silently.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

/* The whole of @path, fed to the harness.  0, or -errno. */
static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t cap = 0, n = 0;
	int err = 0;

	if (!f)
		return -errno;
	for (;;) {
		if (n == cap) {
			uint8_t *b = realloc(buf, cap = cap ? cap * 2 : 4096);

			if (!b) {
				err = -ENOMEM;
				goto out;
			}
			buf = b;
		}
		size_t got = fread(buf + n, 1, cap - n, f);

		n += got;
		if (got == 0) {
			if (ferror(f))
				err = -EIO;
			break;
		}
	}
	LLVMFuzzerTestOneInput(buf, n);
out:
	free(buf);
	fclose(f);
	return err;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

/* Every file of @dir (not recursive), in name order.  Count, or -errno. */
static int replay_dir(const char *dir)
{
	struct dirent **names;
	int i, n, count = 0, err = 0;

	n = scandir(dir, &names, NULL, by_name);
	if (n < 0)
		return -errno;
	for (i = 0; i < n; i++) {
		char path[4096];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		if (!err && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			err = replay_file(path);
			if (err)
				fprintf(stderr, "replay: cannot read '%s': %s\n",
					path, strerror(-err));
			count++;
		}
		free(names[i]);
	}
	free(names);
	return err ? err : count;
}

static int replay_path(const char *path)
{
	struct stat st;
	int r;

	if (stat(path, &st)) {
		fprintf(stderr, "replay: cannot open '%s': %s\n", path,
			strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		r = replay_file(path);
		if (r)
			fprintf(stderr, "replay: cannot read '%s': %s\n", path,
				strerror(-r));
		return r ? -1 : 1;
	}
	r = replay_dir(path);
	if (r == 0)
		fprintf(stderr, "replay: '%s' holds no inputs\n", path);
	else if (r < 0)
		fprintf(stderr, "replay: cannot read '%s': %s\n", path,
			strerror(-r));
	return r > 0 ? r : -1;
}

int main(int argc, char **argv)
{
	const char *base = strrchr(argv[0], '/');
	char corpus[4096];
	int i, r, total = 0;

	base = base ? base + 1 : argv[0];
	if (!strncmp(base, "test_fuzz_", 10))
		base += 10;
	snprintf(corpus, sizeof(corpus), "tests/fuzz/%s", base);
	if (argc < 2) {
		r = replay_path(corpus);
		if (r < 0) {
			fprintf(stderr, "replay: run from the repository root "
					"or name the inputs\n");
			return 1;
		}
		total = r;
	}
	for (i = 1; i < argc; i++) {
		r = replay_path(argv[i]);
		if (r < 0)
			return 1;
		total += r;
	}
	printf("%s: %d inputs replayed, every invariant held\n", base, total);
	return 0;
}
