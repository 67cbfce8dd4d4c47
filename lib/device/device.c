/*
 * device.c - open a device by name (device.h).
 *
 * "cuda" is found at run time: dlopen of libkvpager-cuda.so, which links
 * the CUDA runtime; so a kvpager built without nvcc, or run where there is
 * no libcudart, no driver or no GPU, fails here with a message naming
 * what is missing, and nothing else in kvpager ever loads CUDA.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/device/device_i.h"

#define CUDA_LIB "libkvpager-cuda.so"

struct kvp_device {
	const struct kvp_dev_ops *ops; /* its operations */
	void *h;		       /* ops' handle */
	void *dl;		       /* libkvpager-cuda.so, or NULL */
};

const char *kvp_device_cuda_lib_name(void)
{
	return CUDA_LIB;
}

/* dlopen path; *tried set when a file is there (its failure then says
 * why, and the search stops). */
static void *try_path(const char *path, bool *tried, char *err, size_t len)
{
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!dl && access(path, F_OK) == 0) {
		*tried = true;
		snprintf(err, len, "%s", dlerror());
	}
	return dl;
}

/* dlopen the CUDA library: $KVP_CUDA_LIB, next to the program, the
 * loader's path.  The last dlerror() in err. */
static void *cuda_dlopen(char *err, size_t len)
{
	static const char *const rel[] = { "/../lib/", "/" };
	const char *env = getenv("KVP_CUDA_LIB");
	char exe[PATH_MAX], path[PATH_MAX + 32], *slash;
	bool tried = false;
	ssize_t n;
	void *dl;
	size_t i;

	if (env && *env) {
		dl = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!dl)
			snprintf(err, len, "%s", dlerror());
		return dl;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
	if (slash) {
		*slash = 0;
		for (i = 0; i < 2; i++) {
			snprintf(path, sizeof(path), "%s%s%s", exe, rel[i],
				 CUDA_LIB);
			dl = try_path(path, &tried, err, len);
			if (dl || tried)
				return dl;
		}
	}
	dl = dlopen(CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		snprintf(err, len, "%s", dlerror());
	return dl;
}

static int open_cuda(struct kvp_device *d, char *msg, size_t len)
{
	char err[512] = "";
	kvp_dev_ops_fn fn;

	d->dl = cuda_dlopen(err, sizeof(err));
	if (!d->dl) {
		if (strstr(err, "libcudart"))
			snprintf(msg, len,
				 "--device cuda: no CUDA runtime (libcudart): "
				 "%s; install the CUDA toolkit's runtime or "
				 "set LD_LIBRARY_PATH to its lib64",
				 err);
		else
			snprintf(msg, len,
				 "--device cuda: cannot load %s (%s): this "
				 "kvpager was built without nvcc, or the "
				 "library is not installed; rebuild with "
				 "nvcc on PATH or set KVP_CUDA_LIB",
				 CUDA_LIB, err);
		return -ENODEV;
	}
	*(void **)&fn = dlsym(d->dl, KVP_CUDA_OPS_SYMBOL);
	if (!fn) {
		snprintf(msg, len, "--device cuda: %s lacks %s: rebuild it",
			 CUDA_LIB, KVP_CUDA_OPS_SYMBOL);
		return -ENODEV;
	}
	d->ops = fn();
	return d->ops->open(&d->h, msg, len);
}

int kvp_device_open(const char *name, struct kvp_device **out, char *msg,
		    size_t len)
{
	struct kvp_device *d;
	int err;

	if (!name)
		name = "cuda";
	if (strcmp(name, "cuda") && strcmp(name, "emu")) {
		/* "cpu" is a valid --device, but not a device to open */
		snprintf(msg, len, "unknown device '%s' (cpu, cuda, emu)", name);
		return -EINVAL;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		snprintf(msg, len, "out of memory");
		return -ENOMEM;
	}
	if (!strcmp(name, "emu")) {
		d->ops = &kvp_dev_emu_ops;
		err = d->ops->open(&d->h, msg, len);
	} else {
		err = open_cuda(d, msg, len);
	}
	if (err) {
		if (d->dl)
			dlclose(d->dl);
		free(d);
		return err;
	}
	*out = d;
	return 0;
}

void kvp_device_close(struct kvp_device *d)
{
	if (!d)
		return;
	d->ops->close(d->h);
	if (d->dl)
		dlclose(d->dl);
	free(d);
}

const char *kvp_device_kind(const struct kvp_device *d)
{
	return d->ops->name;
}

void kvp_device_describe(struct kvp_device *d, char *buf, size_t len)
{
	d->ops->describe(d->h, buf, len);
}

void kvp_device_emu_order(struct kvp_device *d, enum kvp_emu_order o)
{
	if (d->ops == &kvp_dev_emu_ops)
		kvp_dev_emu_set_order(d->h, o);
}

const struct kvp_dev_ops *kvp_device_ops(const struct kvp_device *d)
{
	return d->ops;
}

void *kvp_device_handle(const struct kvp_device *d)
{
	return d->h;
}
