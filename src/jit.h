/* jit.h: the JIT front door, the one way any part of moejit obtains a kernel.
 *
 * jit_get(request) -> loaded function.  A request names a kernel source (a
 * DSL .k template or an NVRTC .cu template, built in or a file) and its
 * specialisation; jit_get looks it up in the in-memory table (keyed by the
 * request itself, so a hit costs a hash and a compare, no key text), then
 * in the disk cache (full canonical key, cache.h), then compiles (DSL
 * compiler or NVRTC, straight to a cubin for the exact target), stores the
 * entry and loads it (cuModuleLoadData + cuModuleGetFunction when a GPU of
 * that target is present; otherwise compile and store only, as `moejit
 * warmup --arch` needs).  Warm-up, replay and generation share this path
 * and one set of counters (cache.h CACHE_STATS).
 *
 * A specialisation that does not compile (or load) never fails inference:
 * it is logged once, remembered for the rest of the process (never
 * retried), and the request's generic variant is returned in its place.
 * The generic variant is the same kernel source compiled with a
 * specialisation that serves every shape the specialised one would (sizes
 * passed at run time instead of bound); it must take the same kernel
 * arguments, so the caller launches whatever comes back the same way.
 * jit_fn.generic tells that it stood in.
 *
 * Thread-safe (one lock; compiles are serialised).  Prefix: jit_.
 */
#ifndef MOEJIT_JIT_H
#define MOEJIT_JIT_H

#include <cuda.h>
#include <stdbool.h>

#include "cache.h"
#include "dsl.h"

/* A specialisation of a kernel source. */
typedef struct jit_spec {
  /* NVRTC: the __global__ function's name expression, with its template
   * arguments ("rmsnorm_bf16<6144, 256>"); DSL: NULL (a .k file has one
   * kernel). */
  const char *entry;
  /* DSL: values of specialisation constants; NVRTC: -D NAME=VALUE. */
  const dsl_define *defs;
  int ndefs;
} jit_spec;

typedef struct jit_request {
  /* A built-in template by file name ("mla.cu", "gemv_bf16_b.k"), or a
   * path (anything with a '/').  .cu goes to NVRTC, .k to the DSL
   * compiler. */
  const char *kernel;
  jit_spec spec;
  /* The generic variant, used when spec does not compile; NULL: none (then
   * a failed compile is an MJ_ECOMPILE error). */
  const jit_spec *generic;
  /* The target: NULL for the GPU's ("sm_90a" on an H200); a named target
   * compiles (and stores) without a GPU and loads only on a matching one. */
  const char *arch;
} jit_request;

typedef struct jit_fn {
  CUfunction fn;     /* NULL without a GPU of the target */
  CUmodule module;
  const void *cubin; /* the binary, kept for the life of the process */
  size_t cubin_size;
  cache_meta meta;   /* kernel name, launch bounds, registers, shared, spills */
  bool generic;      /* the generic variant, standing in for a failed spec */
  char key[33];      /* the cache key's hash (hex), as traces record it */
} jit_fn;

/* The loaded kernel for req.  *out stays valid until jit_shutdown.  Errors:
 * MJ_EINPUT (no such kernel source, a constant given twice), MJ_ENOGPU (no
 * arch and no GPU), MJ_ECACHE (a miss with MOEJIT_CACHE=assert-warm),
 * and when neither the spec nor its generic variant compiled (or loaded),
 * the spec's own error: MJ_EINPUT when the kernel source refused it (a DSL
 * static_assert, say), MJ_ECOMPILE for NVRTC or the backend, MJ_ECUDA for a
 * load.  With a generic variant that works, a failure is only a warning. */
int jit_get(const jit_request *req, const jit_fn **out, mj_err *err);

/* Split compiling between n processes (`moejit warmup -j n`): from now on
 * this process compiles (and stores) only the misses whose cache key hash
 * is k modulo n; any other miss returns at once a jit_fn with no cubin and
 * no function, counted by jit_shard_skipped.  n <= 1: compile everything. */
void jit_set_shard(int k, int n);
/* Compile and store only, never touching the GPU from now on (before or
 * after the first jit_get): for processes forked after the driver was
 * opened, where CUDA may not be used (`moejit warmup -j`, after --tune). */
void jit_set_compile_only(bool on);
uint64_t jit_shard_skipped(void);

/* Would jit_get find req without compiling?  *cached is true when the
 * memory table holds it (loaded, not a generic stand-in) or the disk cache
 * holds a sound entry under the exact key jit_get would build.  Compiles,
 * stores and loads nothing and moves no counter, so `moejit replay
 * --dry-run` can say what a run would compile, without a GPU (name the
 * arch).  Errors are those of a wrong request (as jit_get's), MJ_ENOGPU
 * without arch or GPU. */
int jit_probe(const jit_request *req, bool *cached, mj_err *err);

/* Flush the counters to the cache's stats file, unload every module and
 * forget everything (failures included); the next jit_get starts afresh,
 * reading the environment again. */
void jit_shutdown(void);

/* This process's counters since the last jit_shutdown. */
void jit_stats(cache_stats *out);

#endif
