/*
 * tokenizer.c - token ids to text with a llama2.c tokenizer.bin (see
 * model.h).  Decoding only: prompts are given as token ids.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/model/model.h"

struct kvp_tokenizer {
	uint32_t vocab;	  /* tokens */
	char **piece;	  /* vocab NUL-terminated strings */
	char bytes[256][2]; /* "<0xHH>" pieces: the byte itself */
};

void kvp_tokenizer_free(struct kvp_tokenizer *t)
{
	uint32_t i;

	if (!t)
		return;
	for (i = 0; t->piece && i < t->vocab; i++)
		free(t->piece[i]);
	free(t->piece);
	free(t);
}

int kvp_tokenizer_load(const char *path, uint32_t vocab,
		       struct kvp_tokenizer **out, char *err, size_t errlen)
{
	struct kvp_tokenizer *t;
	int32_t maxlen, len;
	float score;
	uint32_t i;
	FILE *f;
	int rc;

	f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "cannot open tokenizer '%s': %s", path,
			 strerror(errno));
		return rc;
	}
	rc = -ENOMEM;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->piece = calloc(vocab, sizeof(char *))))
		goto fail;
	t->vocab = vocab;
	for (i = 0; i < 256; i++)
		t->bytes[i][0] = (char)i;
	rc = -EINVAL;
	if (fread(&maxlen, sizeof(maxlen), 1, f) != 1 || maxlen < 1 ||
	    maxlen > 65536) {
		snprintf(err, errlen,
			 "tokenizer '%s': bad or missing max_token_length "
			 "(not a llama2.c tokenizer.bin)",
			 path);
		goto fail;
	}
	for (i = 0; i < vocab; i++) {
		if (fread(&score, sizeof(score), 1, f) != 1 ||
		    fread(&len, sizeof(len), 1, f) != 1 || len < 0 ||
		    len > maxlen) {
			snprintf(err, errlen,
				 "tokenizer '%s': token %u has a bad length or "
				 "the file ends (the model has %u tokens)",
				 path, i, vocab);
			goto fail;
		}
		rc = -ENOMEM;
		t->piece[i] = calloc(1, (size_t)len + 1);
		if (!t->piece[i])
			goto fail;
		rc = -EINVAL;
		if (fread(t->piece[i], 1, (size_t)len, f) != (size_t)len) {
			snprintf(err, errlen,
				 "tokenizer '%s' ends inside token %u", path,
				 i);
			goto fail;
		}
	}
	fclose(f);
	*out = t;
	return 0;
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory reading tokenizer '%s'",
			 path);
	kvp_tokenizer_free(t);
	fclose(f);
	return rc;
}

const char *kvp_tokenizer_piece(const struct kvp_tokenizer *t, uint32_t prev,
				uint32_t token)
{
	const char *p;
	unsigned byte;

	if (token >= t->vocab)
		return "";
	p = t->piece[token];
	if (prev == 1 && p[0] == ' ')
		p++;
	if (sscanf(p, "<0x%02X>", &byte) == 1 && strlen(p) == 6)
		return t->bytes[byte];
	return p;
}
