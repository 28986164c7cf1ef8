/* embed.c: lookup over the generated table of embedded templates. */
#include "embed.h"

#include <string.h>

#include "templates.inc"

const embed_file *embed_all(size_t *n) {
  *n = sizeof embed_files / sizeof embed_files[0];
  return embed_files;
}

const embed_file *embed_find(const char *name) {
  size_t n;
  const embed_file *f = embed_all(&n);
  for (size_t i = 0; i < n; i++) {
    const char *base = strrchr(f[i].path, '/');
    base = base ? base + 1 : f[i].path;
    if (strcmp(f[i].path, name) == 0 || strcmp(base, name) == 0) return &f[i];
  }
  return NULL;
}
