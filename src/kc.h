/* kc.h: the kernel compilers behind the JIT front door, side by side.
 *
 * One interface for both languages: a source, its specialisation
 * constants and a target go in, a cubin and its metadata (kernel name,
 * launch bounds, registers, shared memory, spills, PTX ISA) come out.  A
 * .k source goes to the DSL compiler (codegen/, dsl_compile), a .cu source
 * to NVRTC (the gaps that decide which language a kernel is written in are
 * docs/dsl.md's rule).  The same job also names what decides the bytes of
 * the cubin, for the cache key (kc_key), so what is compiled and what is
 * looked up cannot drift apart; and kc_producer names the compilers
 * themselves (this build, LLVM, NVRTC, nvJitLink), which the front door
 * hands to the cache.
 *
 * Called by jit.c under its lock (compiles are serialised there); nothing
 * here touches the cache or the GPU.  Prefix: kc_.
 */
#ifndef MOEJIT_KC_H
#define MOEJIT_KC_H

#include <stdbool.h>
#include <stddef.h>

#include "cache.h"
#include "dsl.h"
#include "util.h"

typedef struct kc_job {
  const char *name;                /* the source's name: messages, NVRTC's file name, the key */
  const char *text;                /* NUL-terminated */
  size_t len;
  bool nvrtc;                      /* .cu (else .k, the DSL) */
  const char *entry;               /* NVRTC: the __global__'s name expression; DSL: NULL */
  const dsl_define *const *defs;   /* sorted by name: DSL constants, NVRTC -D NAME=VALUE */
  int ndefs;
  const char *arch;                /* "sm_90a" */
  /* set by kc_prepare */
  int opt_level;                   /* DSL: MOEJIT_DSL_OPT (default 3) */
  const char **opts;               /* NVRTC: its options (in the job's arena) */
  int nopts;
} kc_job;

typedef struct kc_out {
  void *mem; /* owns the bytes cubin points into (free) */
  const void *cubin;
  size_t cubin_size;
  cache_meta meta;
} kc_out;

/* Fix the job's options from the environment (MOEJIT_DSL_OPT,
 * MOEJIT_NVRTC_FLAGS); strings live in a.  A bad value is MJ_EINPUT
 * naming the variable. */
int kc_prepare(kc_job *j, mj_arena *a, mj_err *err);
/* Add to k what decides the cubin's bytes beyond the source and target:
 * the PTX ISA rule, for NVRTC the hash of every toolkit header the source
 * includes (memoised per source name), the entry and the options, for the
 * DSL the optimisation level and the constants. */
void kc_key(const kc_job *j, cache_key *k);
/* Compile.  A source error is MJ_EINPUT (file:line:col, or NVRTC's first
 * error line; the whole log as the error's detail), a backend failure
 * MJ_ECOMPILE. */
int kc_compile(const kc_job *j, kc_out *o, mj_err *err);

/* The target a cubin was built for, read from its ELF: the SM number from
 * the header's e_flags (bits 8..15 from ELF ABI version 8, as ptxas 13
 * writes; bits 0..7 before), and the "a" of an architecture-specific
 * target from ptxas's tool note (.note.nv.tkinfo: "-arch sm_100a").  Writes
 * "sm_120" or "sm_100a" into out; MJ_EINPUT naming what is wrong when the
 * bytes are not a CUDA ELF.  `moejit cache verify` holds every entry's
 * cubin to its key's target with it. */
int kc_cubin_arch(const void *cubin, size_t n, char *out, size_t cap, mj_err *err);

/* The versions of this build and of the compilers it runs with. */
const cache_producer *kc_producer(void);

#endif
