/* pattern.c - the data pattern tests write and check. */
#include "tests/helpers/helpers.h"

/* splitmix64's finaliser over offset and seed: every word differs. */
uint64_t kvp_test_pattern(uint64_t seed, uint64_t off)
{
	uint64_t z = off + (seed + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void kvp_test_fill(void *buf, size_t len, uint64_t seed, uint64_t off)
{
	uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		w[i] = kvp_test_pattern(seed, off + i * 8);
}

int64_t kvp_test_check(const void *buf, size_t len, uint64_t seed, uint64_t off)
{
	const volatile uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i] != kvp_test_pattern(seed, off + i * 8))
			return (int64_t)(i * 8);
	return -1;
}

bool kvp_test_is_zero(const void *buf, size_t len)
{
	const volatile uint64_t *w = buf;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i])
			return false;
	return true;
}
