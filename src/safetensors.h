/* safetensors.h: memory-mapped, validated reading of safetensors files.
 *
 * A checkpoint is one `model.safetensors` or several shards listed by
 * `model.safetensors.index.json`.  Each file is mapped read-only and its JSON
 * header parsed once; the tensors' bytes are never touched here, so opening a
 * multi-gigabyte model costs a header parse plus an mmap (the page cache does
 * the rest on first use).  Everything that can be checked without reading the
 * data is checked before a tensor is handed out: the header length lies
 * inside the file, the header is well-formed JSON of the documented shape,
 * every dtype is known, every shape non-negative, every data_offsets range
 * inside the data section, its length equal to numel * element size, and no
 * two tensors overlap.  A violation is one line naming the file (and the
 * tensor).  Prefix: st_.
 */
#ifndef MOEJIT_SAFETENSORS_H
#define MOEJIT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* X(name as written in headers, element size in bytes) */
#define ST_DTYPES(X)                                                          \
  X(BOOL, 1) X(U8, 1) X(I8, 1) X(F8_E4M3, 1) X(F8_E5M2, 1) X(I16, 2)          \
  X(U16, 2) X(F16, 2) X(BF16, 2) X(I32, 4) X(U32, 4) X(F32, 4) X(I64, 8)     \
  X(U64, 8) X(F64, 8)

typedef enum {
#define X(name, size) ST_##name,
  ST_DTYPES(X)
#undef X
  ST_NDTYPES
} st_dtype;

const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

#define ST_MAX_DIMS 8

typedef struct st_tensor {
  const char *name;
  st_dtype dtype;
  int ndim; /* 0 for a scalar */
  int64_t shape[ST_MAX_DIMS];
  int64_t numel;
  uint64_t offset, nbytes; /* within the file's data section */
  const void *data;        /* into the mapping; aligned as the file is */
  int file;                /* index into st_set.files */
} st_tensor;

typedef struct st_file {
  char *path; /* as opened (folder/name) */
  int fd;
  void *map;
  size_t size;       /* whole file */
  size_t data_start; /* 8 + header length */
  size_t header_len;
} st_file;

typedef struct st_set {
  mj_arena arena; /* names, paths, the tensor array */
  st_file *files;
  int nfiles;
  st_tensor *tensors;
  size_t ntensors;
  uint32_t *table; /* open addressing: tensor index + 1, 0 = empty */
  size_t table_size;
  uint64_t total_bytes; /* sum of tensor nbytes */
  bool sharded;
} st_set;

/* Open path: a folder (model.safetensors.index.json if present, else
 * model.safetensors) or a single .safetensors file.  On failure s is left
 * closed and err names the file. */
int st_open(st_set *s, const char *path, mj_err *err);
/* Open one file into s (s zero-initialised first by st_open). */
void st_close(st_set *s);

const st_tensor *st_find(const st_set *s, const char *name);
size_t st_index(const st_set *s, const st_tensor *t);
/* Path of the file that holds t (for messages). */
const char *st_path(const st_set *s, const st_tensor *t);
/* The mapped file that holds addr, for a SIGBUS handler: tensors stay in
 * their mappings, so a file truncated by another process after it was
 * validated makes the next touch of a page past its new end raise SIGBUS.
 * Returns the path (NULL when addr is in no open mapping) and sets
 * *truncated when the file is now shorter than addr's offset (otherwise the
 * fault was an I/O error).  Async-signal-safe: it reads a fixed table of
 * the open mappings and calls fstat.  The library installs no handler; the
 * CLI does (src/main.c: on_sigbus). */
const char *st_fault_file(const void *addr, bool *truncated);

/* "[6144, 2048]" into buf. */
const char *st_shape_str(const st_tensor *t, char *buf, size_t n);

#endif
