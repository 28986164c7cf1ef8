/* embed.h: the template files (templates: .k and .cu) built into the binary.
 * embed_find("gemv_bf16_b.k") or embed_find("templates/gemv_bf16_b.k") returns the
 * file; the data is NUL-terminated.  Prefix: embed_. */
#ifndef MOEJIT_EMBED_H
#define MOEJIT_EMBED_H

#include <stddef.h>

typedef struct embed_file {
  const char *path; /* "templates/gemv_bf16_b.k" */
  const char *data;
  size_t size;
} embed_file;

const embed_file *embed_find(const char *name);
const embed_file *embed_all(size_t *n);

#endif
