/*
 * backend_ram.c - the KV cache all in anonymous memory (kv_backend_i.h):
 * everything resident, nothing read or written but by memcpy.  The
 * compute bound of kvpbench decode and the bit-for-bit reference of the
 * tests.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/kv/kvcache_i.h"

static int ram_open(struct kvp_kvcache *c)
{
	c->base = kvc_big_alloc(c->l.region_bytes);
	return c->base ? 0 : -ENOMEM;
}

static void ram_close(struct kvp_kvcache *c)
{
	if (c->base)
		munmap(c->base, c->l.region_bytes);
}

static int ram_write(struct kvp_kvcache *c, uint64_t off, const char *data,
		     size_t len, bool flush)
{
	memcpy(c->base + off, data, len);
	return 0;
}

static int ram_read(struct kvp_kvcache *c, uint32_t layer, const uint32_t *phys,
		    size_t n, char *dst)
{
	size_t i;

	for (i = 0; i < n; i++)
		memcpy(dst + i * c->stride,
		       c->base + kvp_kv_layout_offset(&c->l, layer, phys[i]),
		       c->stride);
	return 0;
}

/* The region is plain memory that never moves: any thread may copy. */
static int ram_read_shared(struct kvp_kvcache *c, uint32_t layer,
			   const uint32_t *phys, size_t n, char *dst,
			   char *pbbuf)
{
	(void)pbbuf;
	return ram_read(c, layer, phys, n, dst);
}

static bool ram_resident(struct kvp_kvcache *c, uint64_t pb)
{
	return true;
}

static const char *ram_where(struct kvp_kvcache *c, uint64_t pb)
{
	return "ram";
}

const struct kvc_backend_ops kvc_backend_ram = {
	.name = "ram",
	.open = ram_open,
	.close = ram_close,
	.write = ram_write,
	.read = ram_read,
	.read_shared = ram_read_shared,
	.resident = ram_resident,
	.where = ram_where,
};
