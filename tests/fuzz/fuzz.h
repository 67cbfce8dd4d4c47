/*
 * fuzz.h - what every harness in tests/fuzz/ shares.
 *
 * A harness is one file, tests/fuzz/<name>.c, defining
 * LLVMFuzzerTestOneInput; its seed corpus (and every input that ever found
 * a bug) lives in tests/fuzz/<name>/.  It is built twice:
 *   make fuzz    with clang's libFuzzer, ASan and UBSan into build-fuzz/,
 *                run for FUZZ_SECONDS over a copy of the corpus;
 *   make check   with replay.c's main() as $(BUILD)/tests/test_fuzz_<name>,
 *                which feeds the committed corpus through the same checks.
 * A harness asserts invariants with FUZZ_CHECK, not just "no crash": a
 * violation prints what broke and aborts, which both builds report.
 */
#ifndef KVP_FUZZ_H
#define KVP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                  \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__,         \
				__LINE__, #cond);                              \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
			abort();                                               \
		}                                                              \
	} while (0)

/* The input, consumed from the front; past its end every read gives 0. */
struct fuzz_input {
	const uint8_t *data; /* next unread byte */
	size_t left;	     /* bytes not yet read */
};

static inline uint8_t fuzz_u8(struct fuzz_input *in)
{
	if (!in->left)
		return 0;
	in->left--;
	return *in->data++;
}

static inline uint32_t fuzz_u32(struct fuzz_input *in)
{
	uint32_t v = 0;
	int i;

	for (i = 0; i < 4; i++)
		v = v << 8 | fuzz_u8(in);
	return v;
}

/*
 * The rest of the input as a NUL-terminated string (malloc'd; the caller
 * frees it).  Input bytes of 0 end the string early, as they would for any
 * C caller of the parsers.
 */
static inline char *fuzz_rest_str(struct fuzz_input *in)
{
	char *s = malloc(in->left + 1);

	if (!s)
		abort();
	for (size_t i = 0; i < in->left; i++)
		s[i] = (char)in->data[i];
	s[in->left] = '\0';
	in->data += in->left;
	in->left = 0;
	return s;
}

#endif /* KVP_FUZZ_H */
