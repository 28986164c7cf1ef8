/* fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (st_open): the 8-byte header length, the JSON header, and the sharded
 * index with its shards.
 *
 * st_open maps files, so the input is written to files in a private temp
 * folder (under /dev/shm when it exists, to stay in memory).  An input that
 * holds no separator is one model.safetensors.  Otherwise it is split on
 * the separator "\n--moejit-shard--\n": the first part is
 * model.safetensors.index.json and part k is
 * model-0000k-of-0000N.safetensors, the names `moejit mkmodel --shard-size`
 * writes, so seeds taken from a sharded model keep their shards found.  An
 * opened set must keep every tensor inside its file's data section and
 * findable by name; a refusal must be one MJ_EINPUT or MJ_EIO line.
 * Seeds: tests/fuzz/safetensors/. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#define SEP "\n--moejit-shard--\n"
#define MAX_PARTS 9

static char dir[256];

static void cleanup(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  unlink(path);
  for (int k = 1; k < MAX_PARTS; k++)
    for (int n = 1; n < MAX_PARTS; n++) {
      snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k, n);
      unlink(path);
    }
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  snprintf(dir, sizeof dir, "%s/moejit-fuzz-st.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  if (!mkdtemp(dir)) abort();
  atexit(cleanup);
  return 0;
}

static void put(const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) abort();
}

static void check(const st_set *s) {
  for (size_t i = 0; i < s->ntensors; i++) {
    const st_tensor *t = &s->tensors[i];
    const st_file *f = &s->files[t->file];
    const uint8_t *lo = (const uint8_t *)f->map + f->data_start, *hi = (const uint8_t *)f->map + f->size;
    const uint8_t *d = t->data;
    if (d < lo || d > hi || t->nbytes > (uint64_t)(hi - d)) abort();
    if (t->nbytes != (uint64_t)t->numel * st_dtype_size(t->dtype)) abort();
    if (st_find(s, t->name) != t) abort();
    if (t->nbytes) {
      volatile uint8_t x = d[0] ^ d[t->nbytes - 1]; /* touch both ends */
      (void)x;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 20)) return 0;
  cleanup();
  if (mkdir(dir, 0700) != 0) abort();
  const uint8_t *part[MAX_PARTS];
  size_t len[MAX_PARTS];
  int n = 0;
  const uint8_t *p = data, *end = data + size;
  size_t sl = strlen(SEP);
  while (n < MAX_PARTS) {
    const uint8_t *q = memmem(p, (size_t)(end - p), SEP, sl);
    part[n] = p;
    len[n++] = q ? (size_t)(q - p) : (size_t)(end - p);
    if (!q) break;
    p = q + sl;
  }
  if (n == 1) {
    put("model.safetensors", part[0], len[0]);
  } else {
    put("model.safetensors.index.json", part[0], len[0]);
    for (int k = 1; k < n; k++) {
      char name[64];
      snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k, n - 1);
      put(name, part[k], len[k]);
    }
  }
  st_set s;
  mj_err err = {0};
  if (st_open(&s, dir, &err) == 0) {
    check(&s);
    st_close(&s);
  } else if ((err.code != MJ_EINPUT && err.code != MJ_EIO) || !err.msg[0] || strchr(err.msg, '\n')) {
    abort();
  }
  mj_err_clear(&err);
  return 0;
}
