/* fuzz_cache_entry.c: libFuzzer target for the cubin cache's entry reader
 * (cache_entry_decode, which every entry file read goes through).
 *
 * Entries end with an XXH3-128 checksum of everything before it, so random
 * mutations would almost always stop at the checksum.  When the first byte
 * of the input is odd the target rewrites the last 16 bytes with the right
 * checksum before decoding, so the length fields, the version and the
 * kernel name are explored as if another process had written them.  A
 * decoded entry must lie inside the input: anything else is a finding.
 * Seeds: tests/fuzz/cache/ (real entries written by `moejit compile -o`). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > (1 << 20)) return 0;
  bool fix = data[0] & 1;
  size_t n = size - 1;
  unsigned char *p = malloc(n ? n : 1);
  memcpy(p, data + 1, n);
  if (fix && n >= 16) {
    mj_hash h = mj_hash128(p, n - 16);
    for (int i = 0; i < 8; i++) p[n - 16 + i] = (unsigned char)(h.lo >> (8 * i));
    for (int i = 0; i < 8; i++) p[n - 8 + i] = (unsigned char)(h.hi >> (8 * i));
  }
  cache_meta meta;
  const char *key;
  const void *cubin;
  size_t key_len, cubin_size;
  mj_err err = {0};
  if (cache_entry_decode(p, n, &meta, &key, &key_len, &cubin, &cubin_size, &err) == 0) {
    const unsigned char *k = (const unsigned char *)key, *c = cubin;
    if (k < p || k + key_len > p + n || c < p || c + cubin_size > p + n) abort();
    if (memchr(meta.kernel_name, 0, sizeof meta.kernel_name) == NULL) abort();
    if (memchr(meta.ptx_version, 0, sizeof meta.ptx_version) == NULL) abort();
  } else if (err.code != MJ_ECACHE || !err.msg[0] || strchr(err.msg, '\n')) {
    abort(); /* every refusal is a one-line MJ_ECACHE */
  }
  mj_err_clear(&err);
  free(p);
  return 0;
}
