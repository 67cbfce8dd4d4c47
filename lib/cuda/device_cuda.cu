/*
 * device_cuda.cu - the CUDA device behind dev_ops.h, exported by
 * libkvpager-cuda.so as kvp_cuda_dev_ops() (found by lib/device/device.c
 * with dlopen).  The CUDA runtime is linked statically into that library,
 * so what can be missing at run time is the driver (libcuda.so.1) or a
 * device; open says which.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "lib/cuda/attention_cuda.h"

struct cuda_dev {
	int id;
	cudaStream_t s[KVP_DEV_STREAMS];
	cudaEvent_t ev[KVP_DEV_EVENTS];
};

static int cuda_err(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	if (e == cudaErrorMemoryAllocation)
		return -ENOMEM;
	fprintf(stderr, "kvpager: cuda: %s\n", cudaGetErrorString(e));
	return -EIO;
}

static void cuda_close(void *dev)
{
	struct cuda_dev *d = (struct cuda_dev *)dev;
	int i;

	for (i = 0; i < KVP_DEV_STREAMS; i++)
		if (d->s[i])
			cudaStreamDestroy(d->s[i]);
	for (i = 0; i < KVP_DEV_EVENTS; i++)
		if (d->ev[i])
			cudaEventDestroy(d->ev[i]);
	free(d);
}

static int cuda_open(void **dev, char *msg, size_t len)
{
	struct cuda_dev *d;
	cudaError_t e;
	int n = 0, i;

	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ||
	    (e == cudaSuccess && n == 0)) {
		snprintf(msg, len,
			 "--device cuda: %s (%s); run on a machine with an "
			 "NVIDIA GPU and its driver",
			 e == cudaErrorInsufficientDriver
			     ? "no CUDA driver: libcuda.so.1 is missing or "
			       "older than the runtime"
			     : "no CUDA device",
			 cudaGetErrorString(e));
		return -ENODEV;
	}
	if (e != cudaSuccess) {
		snprintf(msg, len, "--device cuda: no usable CUDA device: %s",
			 cudaGetErrorString(e));
		return -ENODEV;
	}
	d = (struct cuda_dev *)calloc(1, sizeof(*d));
	if (!d) {
		snprintf(msg, len, "--device cuda: out of memory");
		return -ENOMEM;
	}
	e = cudaSetDevice(0);
	for (i = 0; i < KVP_DEV_STREAMS && e == cudaSuccess; i++)
		e = cudaStreamCreateWithFlags(&d->s[i], cudaStreamNonBlocking);
	for (i = 0; i < KVP_DEV_EVENTS && e == cudaSuccess; i++)
		e = cudaEventCreateWithFlags(&d->ev[i],
					     cudaEventDisableTiming);
	if (e != cudaSuccess) {
		snprintf(msg, len, "--device cuda: device 0: %s",
			 cudaGetErrorString(e));
		cuda_close(d);
		return -ENODEV;
	}
	*dev = d;
	return 0;
}

static void cuda_describe(void *dev, char *buf, size_t len)
{
	struct cudaDeviceProp p;
	int rt = 0, drv = 0;

	cudaRuntimeGetVersion(&rt);
	cudaDriverGetVersion(&drv);
	if (cudaGetDeviceProperties(&p, ((struct cuda_dev *)dev)->id) !=
	    cudaSuccess) {
		snprintf(buf, len, "cuda device (properties unavailable)");
		return;
	}
	snprintf(buf, len,
		 "%s, %.1f GiB, sm_%d%d, runtime %d.%d, driver %d.%d", p.name,
		 p.totalGlobalMem / 1073741824.0, p.major, p.minor, rt / 1000,
		 rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
}

static int cuda_mem_alloc(void *dev, size_t bytes, void **p)
{
	return cuda_err(cudaMalloc(p, bytes ? bytes : 1));
}

static void cuda_mem_free(void *dev, void *p)
{
	cudaFree(p);
}

static int cuda_host_alloc(void *dev, size_t bytes, void **p)
{
	return cuda_err(cudaHostAlloc(p, bytes ? bytes : 1,
				      cudaHostAllocDefault));
}

static void cuda_host_free(void *dev, void *p)
{
	cudaFreeHost(p);
}

static int cuda_copy(void *dev, void *dst, const void *src, size_t bytes,
		     int to_dev, int stream)
{
	struct cuda_dev *d = (struct cuda_dev *)dev;

	return cuda_err(cudaMemcpyAsync(dst, src, bytes,
					to_dev ? cudaMemcpyHostToDevice
					       : cudaMemcpyDeviceToHost,
					d->s[stream]));
}

static int cuda_scatter(void *dev, const struct kvp_dev_scatter *s,
			int stream)
{
	return kvp_cuda_scatter(s, ((struct cuda_dev *)dev)->s[stream]);
}

static int cuda_attend(void *dev, const struct kvp_dev_attn *a, int stream)
{
	return kvp_cuda_attend(a, ((struct cuda_dev *)dev)->s[stream]);
}

static int cuda_record(void *dev, int event, int stream)
{
	struct cuda_dev *d = (struct cuda_dev *)dev;

	return cuda_err(cudaEventRecord(d->ev[event], d->s[stream]));
}

static int cuda_stream_wait(void *dev, int stream, int event)
{
	struct cuda_dev *d = (struct cuda_dev *)dev;

	return cuda_err(cudaStreamWaitEvent(d->s[stream], d->ev[event], 0));
}

static int cuda_event_sync(void *dev, int event)
{
	return cuda_err(
	    cudaEventSynchronize(((struct cuda_dev *)dev)->ev[event]));
}

static const struct kvp_dev_ops cuda_ops = {
	"cuda",		 cuda_open,	 cuda_close,   cuda_describe,
	cuda_mem_alloc,	 cuda_mem_free,	 cuda_host_alloc,
	cuda_host_free,	 cuda_copy,	 cuda_scatter, cuda_attend,
	cuda_record,	 cuda_stream_wait, cuda_event_sync,
};

extern "C" __attribute__((visibility("default"))) const struct kvp_dev_ops *
kvp_cuda_dev_ops(void)
{
	return &cuda_ops;
}
