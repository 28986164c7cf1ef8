/* cache.h: the on-disk cubin cache, shared by the DSL path and the NVRTC path.
 *
 * A compiled kernel is stored as one file per entry under fan-out folders,
 * <dir>/v1/ab/cdef... (the XXH3-128 of the entry's key text, in hex).  An
 * entry holds a header (magic, format version, sizes, the kernel's metadata),
 * the full key text, the producer versions, the kernel name, the cubin and
 * an XXH3-128 checksum of everything before it.  Entries are written to a
 * unique temporary file in the target folder, fsync'd and renamed into place,
 * so a reader sees either no entry or a whole one.  Every fault on read
 * (missing, short, bad checksum, other key text, other format version,
 * garbage) is a miss: the caller compiles again and the store overwrites the
 * entry.  Never a crash, never a wrong binary (the key text is compared, not
 * only its hash).
 *
 * The cache has four modes (MOEJIT_CACHE): on, off, ro (use, never store)
 * and assert-warm (a miss is an MJ_ECACHE error, to prove a cache warmed
 * ahead of time).  A folder that cannot be created or written costs one
 * warning and turns into an in-memory cache for the process.  The size is
 * capped (MOEJIT_CACHE_MAX) with least-recently-used eviction: a hit
 * refreshes the entry's mtime.  Counters are kept per process and merged
 * into <dir>/stats under flock, so `moejit cache stats` shows them across
 * runs.  docs/cache.md is the user's description.  Prefix: cache_.
 */
#ifndef MOEJIT_CACHE_H
#define MOEJIT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* Bump when the entry layout or the key text changes meaning: entries of
 * other versions live in other folders (v1/, v2/) and are never read. */
#define CACHE_FORMAT_VERSION 1

#define CACHE_DEFAULT_MAX (2ull << 30) /* 2 GiB */

#define CACHE_MODES(X)                                                        \
  X(CACHE_ON, "on") X(CACHE_OFF, "off") X(CACHE_RO, "ro")                     \
  X(CACHE_ASSERT_WARM, "assert-warm")

typedef enum {
#define X(m, s) m,
  CACHE_MODES(X)
#undef X
} cache_mode;

/* Environment variables that change generated code.  Each one's value (or
 * its absence) is part of every key.  The JIT front door honours them:
 * MOEJIT_DSL_OPT overrides the DSL optimisation level, MOEJIT_NVRTC_FLAGS
 * appends options to every NVRTC compile. */
#define CACHE_CODEGEN_ENV(X) X(MOEJIT_DSL_OPT) X(MOEJIT_NVRTC_FLAGS)

/* Counters: X(name, description).  Times are in microseconds. */
#define CACHE_STATS(X)                                                        \
  X(mem_hits, "memory hits")                                                  \
  X(disk_hits, "disk hits")                                                   \
  X(misses, "misses")                                                         \
  X(compiles, "compiles")                                                     \
  X(compile_us, "compile time (us)")                                          \
  X(loads, "module loads")                                                    \
  X(load_us, "load time (us)")                                                \
  X(stores, "stores")                                                         \
  X(corrupt, "corrupt entries")                                               \
  X(evictions, "evictions")                                                   \
  X(failures, "failures")

typedef enum {
#define X(name, desc) CACHE_STAT_##name,
  CACHE_STATS(X)
#undef X
  CACHE_NSTATS
} cache_stat;

typedef struct cache_stats {
  uint64_t v[CACHE_NSTATS];
} cache_stats;

const char *cache_stat_name(cache_stat s);
const char *cache_stat_desc(cache_stat s);

/* ---- configuration --------------------------------------------------------- */
typedef struct cache_producer {
  const char *moejit, *build_id, *llvm, *nvrtc, *nvjitlink;
} cache_producer;

typedef struct cache_config {
  const char *dir;    /* the cache folder; NULL = from the environment */
  cache_mode mode;
  uint64_t max_bytes; /* size cap */
  const cache_producer *producer; /* who makes the entries stored (written into each); NULL: "unknown producer" */
} cache_config;

/* Fill cfg from MOEJIT_CACHE_DIR (else $XDG_CACHE_HOME/moejit, else
 * ~/.cache/moejit), MOEJIT_CACHE and MOEJIT_CACHE_MAX.  A bad value is an
 * MJ_EINPUT naming the variable.  cfg->dir points into static storage. */
int cache_config_from_env(cache_config *cfg, mj_err *err);
/* "on" | "off" | "ro" | "assert-warm" */
int cache_parse_mode(const char *s, cache_mode *out);
const char *cache_mode_name(cache_mode m);
/* "2147483648", "512K", "512M", "2G", "1T" (binary units; "MiB", "GB" and
 * lower case accepted).  0 on success. */
int cache_parse_size(const char *s, uint64_t *out);

/* ---- keys ---------------------------------------------------------------------
 * A key is canonical text, one "field=value" line each, starting with the
 * format version and the producer versions; the caller adds the target, the
 * PTX ISA, every compile option and a hash of the fully specialised kernel;
 * cache_key_end adds each CACHE_CODEGEN_ENV variable and hashes the text.
 * Values are escaped (\n, \\) so one line is one field. */
/* (The front door's is kc_producer, src/kc.h: the cache knows no compiler.) */

typedef struct cache_key {
  mj_buf text;
  mj_hash hash;
  char hex[33];
} cache_key;

/* p: the producer, whose versions open the key. */
void cache_key_begin(cache_key *k, const cache_producer *p);
void cache_key_add(cache_key *k, const char *field, const char *value);
void cache_key_addf(cache_key *k, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* field=<XXH3-128 hex of data> */
void cache_key_add_hash(cache_key *k, const char *field, const void *data, size_t n);
void cache_key_end(cache_key *k);
void cache_key_free(cache_key *k);

/* ---- entries --------------------------------------------------------------------- */
typedef struct cache_meta {
  char kernel_name[256]; /* the entry point's (lowered) name */
  char ptx_version[12];  /* ".version" of the PTX, "" if unknown */
  int max_threads, min_blocks; /* launch bounds; 0 = none stated */
  int regs, shared_bytes, stack_bytes, spill_stores, spill_loads;
} cache_meta;

/* A loaded entry: cubin points into mem (malloc'd), freed by
 * cache_blob_free. */
typedef struct cache_blob {
  void *mem;
  const void *cubin;
  size_t cubin_size;
  cache_meta meta;
} cache_blob;
void cache_blob_free(cache_blob *b);

/* Decode the bytes of one entry file: 0 when they are a sound entry of this
 * format version (meta filled; key and cubin point into data), else
 * MJ_ECACHE with the reason.  Every entry the cache reads goes through it;
 * it is public so the fuzzer (tests/fuzz/fuzz_cache_entry.c) reaches it
 * without files. */
int cache_entry_decode(const void *data, size_t n, cache_meta *meta, const char **key,
                       size_t *key_len, const void **cubin, size_t *cubin_size, mj_err *err);

typedef struct cache cache;

/* Open the cache described by cfg (NULL: from the environment).  Never
 * fails for an unusable folder (that is a warning and an in-memory cache);
 * fails only for a bad configuration value. */
int cache_open(const cache_config *cfg, cache **out, mj_err *err);
/* Flush the counters and free.  NULL is fine. */
void cache_close(cache *c);

cache_mode cache_get_mode(const cache *c);
/* The folder entries are read from, or NULL (off, or not even readable). */
const char *cache_dir(const cache *c);
/* True while new entries still go to disk. */
bool cache_writable(const cache *c);
uint64_t cache_max_bytes(const cache *c);

/* Look the key up.  *hit says whether out holds the entry.  Returns 0, or
 * MJ_ECACHE on a miss in assert-warm mode (err names the key). */
int cache_load(cache *c, const cache_key *k, cache_blob *out, bool *hit, mj_err *err);
/* Store an entry (off, ro, assert-warm: nothing).  A write failure is not an
 * error for the caller: it warns once, counts a failure and keeps later
 * entries in memory. */
void cache_store(cache *c, const cache_key *k, const void *cubin, size_t n,
                 const cache_meta *meta);

/* Add to a counter (the JIT front door counts memory hits, compiles, loads
 * and failures here, so one set of counters covers both layers). */
void cache_count(cache *c, cache_stat s, uint64_t n);
/* This process's counters since open (or the last flush: see below). */
void cache_stats_local(const cache *c, cache_stats *out);
/* Merge this process's counters into <dir>/stats (under flock) and reset
 * them.  Done by cache_store and cache_close; call it at a quiet moment to
 * make counts visible sooner. */
void cache_flush_stats(cache *c);

/* ---- maintenance (the `moejit cache` command, tests) ------------------------------ */
/* The file of key hex under dir (for tests and tools). */
char *cache_entry_path(const char *dir, const char *hex);

typedef struct cache_item {
  char path[4096];
  uint64_t size;
  int64_t mtime_ns;
  bool current; /* an entry of this format version (else: a stale one) */
} cache_item;

/* Every entry under dir (all format versions; temporary files skipped).
 * Returns the count (malloc'd array in *items) or -1 with err. */
int cache_scan(const char *dir, cache_item **items, mj_err *err);
/* Check one entry file: 0 when sound (meta and key text filled if asked),
 * MJ_ECACHE with the reason in err otherwise. */
int cache_verify_file(const char *path, cache_meta *meta, char **key_text, mj_err *err);
/* Remove least-recently-used entries (and leftover temporary files older
 * than an hour) until the total is at most max_bytes.  Takes the cache
 * lock.  Counts what it removed. */
int cache_prune(const char *dir, uint64_t max_bytes, uint64_t *removed,
                uint64_t *freed, mj_err *err);
/* Remove every entry and temporary file (keeps the counters). */
int cache_clear(const char *dir, uint64_t *removed, mj_err *err);
/* The counters persisted in <dir>/stats (zero when none). */
int cache_stats_read(const char *dir, cache_stats *out, mj_err *err);

/* ---- tuning records (cache/tune.c) --------------------------------------------------
 * The winner of a tuning run for one kernel family and shape on one GPU
 * (`moejit warmup --tune`, src/tune.h): a small text file
 * <dir>/tune/<32 hex>, the hex being XXH3-128 of the record's slot (GPU
 * name, target, family, shape), so each GPU model and shape has one place.
 * The record repeats its slot and adds the driver version and the hash of
 * the kernel's source it was timed with; a reader holds all of them to what
 * it wants, so a record of another GPU, driver or template is found and
 * refused with its reason, never used.  Lines are "field=value"; the last is
 * check=<XXH3-128 of every byte before it>, so a torn or edited file is
 * refused too.  Stored atomically (temporary file, rename), like entries. */
#define CACHE_TUNE_VERSION 1

typedef struct cache_tune {
  char gpu[256];         /* "NVIDIA H200" */
  char arch[16];         /* "sm_90a" */
  char driver[16];       /* "13.0" */
  char family[32];       /* the kernel table's row: "moe_expert" */
  char shape[160];       /* the family's words: "gate_up hidden=6144 inter=2048 experts=256 topk=8 bucket=8" */
  char source_hash[33];  /* XXH3-128 hex of the template it was timed with */
  char choice[64];       /* the winner, in the family's words ("16:256:8:0:0:0:4") */
  char builtin[64];      /* the built-in plan's choice */
  double us, builtin_us; /* their times */
  int64_t date;          /* when (Unix seconds) */
} cache_tune;

/* The record's file for t's slot (gpu, arch, family, shape); malloc'd. */
char *cache_tune_path(const char *dir, const cache_tune *t);
/* The record's text (with its check line) into b. */
void cache_tune_format(const cache_tune *t, mj_buf *b);
/* Read a record's text: 0, or MJ_ECACHE with what is wrong ("line 3: no
 * field name", "checksum mismatch", "missing field driver"). */
int cache_tune_parse(const char *text, size_t n, cache_tune *out, mj_err *err);
/* Store t in its slot (replacing what was there); MJ_EIO naming the file. */
int cache_tune_store(const char *dir, const cache_tune *t, mj_err *err);
/* The record for want's slot, held to want's driver and source hash too:
 * 0 with *found (and *out filled) or not, MJ_ECACHE when one is there but
 * cannot be used; err then says why in words a warning can carry ("corrupt
 * (checksum mismatch)", "tuned on NVIDIA H100, not NVIDIA H200", "tuned
 * with driver 12.8, not 13.0", "tuned with another moe_expert.k"). */
int cache_tune_find(const char *dir, const cache_tune *want, cache_tune *out, bool *found, mj_err *err);
/* Every record file under dir: records that read (in *out, malloc'd) and
 * the count, or -1 with err.  Bad files (unreadable, torn, checksum, a
 * missing or unknown field, or a record whose slot is another file's) are
 * counted in *bad and, when why is given, named in it a line each:
 * "PATH: reason\n". */
int cache_tune_scan(const char *dir, cache_tune **out, int *bad, mj_buf *why, mj_err *err);
/* Remove every tuning record (the cubins stay). */
int cache_tune_clear(const char *dir, uint64_t *removed, mj_err *err);

#endif
