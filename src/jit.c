/* jit.c: the JIT front door (see jit.h): request -> memory table -> disk
 * cache -> compile (DSL or NVRTC) -> store -> load.
 *
 * The memory table is keyed by the request as given (kernel, entry, target,
 * constants in order), hashed with XXH3 and compared byte for byte, so a
 * hit builds no key text and takes no lock but the table's own.  Only a
 * memory miss builds the canonical key (cache.h), which hashes the kernel's
 * source (and, for NVRTC, every toolkit header it includes, found by
 * following #include lines; memoised per process) and sorts the constants,
 * so two requests that differ only in the order of their constants share a
 * disk entry.  Within a process a kernel source and the environment are
 * read once: editing a kernel file or MOEJIT_NVRTC_FLAGS while it runs is
 * not seen by kernels already obtained.
 *
 * Failures are of two kinds.  A request that is wrong (no such template, a
 * constant given twice, a miss in assert-warm mode) is returned as an error
 * and not remembered.  A specialisation that does not compile or load is
 * remembered in the table as failed, logged once, and answered from then on
 * with the generic variant (jit.h), LuaJIT-style: penalise, fall back, never
 * fail the program.
 */
#include "jit.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "cudrv.h"
#include "embed.h"
#include "kc.h"

typedef struct jit_entry {
  uint64_t h;
  char *mat; /* the request as bytes (see request_bytes) */
  size_t mat_len;
  jit_fn fn;
  bool ok;       /* fn usable */
  bool owns;     /* fn's module and cubin belong to this entry */
  void *mem;     /* the cubin's memory, when owned */
  mj_code code;  /* when !ok: the error to repeat */
  char *error;
} jit_entry;

static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  bool ready;
  cache *cache;
  bool have_gpu;
  char dev_arch[16];
  jit_entry **slots; /* open addressing, power-of-two capacity */
  size_t cap, n;
} J;

/* jit_set_shard: this process compiles only the misses whose key hash is
 * shard_k modulo shard_n (kept apart from J, which jit_shutdown clears). */
static int shard_k, shard_n = 1;
static uint64_t shard_skipped;
static bool compile_only;

/* In a process forked after this one had opened the driver (`moejit warmup
 * --tune -j N`: the tuning ran first), J is the parent's copy: its modules
 * are the parent's and the driver may not be called here, so the entries
 * already loaded stay as they are (never unloaded) and nothing more is
 * loaded. */
void jit_set_compile_only(bool on) {
  pthread_mutex_lock(&jit_lock);
  compile_only = on;
  if (on) J.have_gpu = false;
  pthread_mutex_unlock(&jit_lock);
}

void jit_set_shard(int k, int n) {
  shard_k = k, shard_n = n > 1 ? n : 1;
}
uint64_t jit_shard_skipped(void) { return shard_skipped; }

/* ---- the memory table --------------------------------------------------------------- */
/* The request as bytes: kernel, entry, target, then each constant's name
 * and value, each NUL-terminated (none can hold a NUL, so this is
 * unambiguous).  Written into buf when it fits, else into a malloc'd
 * buffer. */
static char *request_bytes(const char *kernel, const jit_spec *s, const char *arch,
                           char *buf, size_t cap, size_t *len) {
  const char *entry = s->entry ? s->entry : "";
  size_t lk = strlen(kernel) + 1, le = strlen(entry) + 1, la = strlen(arch) + 1;
  size_t n = lk + le + la;
  for (int i = 0; i < s->ndefs; i++)
    n += strlen(s->defs[i].name) + strlen(s->defs[i].value) + 2;
  char *p = n <= cap ? buf : mj_xmalloc(n), *q = p;
  memcpy(q, kernel, lk), q += lk;
  memcpy(q, entry, le), q += le;
  memcpy(q, arch, la), q += la;
  for (int i = 0; i < s->ndefs; i++) {
    size_t a = strlen(s->defs[i].name) + 1, b = strlen(s->defs[i].value) + 1;
    memcpy(q, s->defs[i].name, a), q += a;
    memcpy(q, s->defs[i].value, b), q += b;
  }
  *len = n;
  return p;
}

static jit_entry *table_find(uint64_t h, const char *mat, size_t n) {
  size_t mask = J.cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    jit_entry *e = J.slots[i];
    if (!e) return NULL;
    if (e->h == h && e->mat_len == n && memcmp(e->mat, mat, n) == 0) return e;
  }
}

static void table_place(jit_entry **slots, size_t cap, jit_entry *e) {
  size_t i = e->h & (cap - 1);
  while (slots[i]) i = (i + 1) & (cap - 1);
  slots[i] = e;
}

static void table_insert(jit_entry *e) {
  if ((J.n + 1) * 10 > J.cap * 7) {
    size_t cap = J.cap * 2;
    jit_entry **slots = mj_xcalloc(cap, sizeof *slots);
    for (size_t i = 0; i < J.cap; i++)
      if (J.slots[i]) table_place(slots, cap, J.slots[i]);
    free(J.slots);
    J.slots = slots;
    J.cap = cap;
  }
  table_place(J.slots, J.cap, e);
  J.n++;
}

/* ---- kernel sources ------------------------------------------------------------------ */
typedef struct source {
  const char *name; /* for messages and the key */
  const char *text; /* NUL-terminated */
  size_t len;
  char *owned;
} source;

static int find_source(const char *kernel, source *s, mj_err *err) {
  memset(s, 0, sizeof *s);
  s->name = kernel;
  if (strchr(kernel, '/')) {
    if (mj_read_file(kernel, &s->owned, &s->len, err)) return MJ_EINPUT;
    s->text = s->owned;
    return 0;
  }
  const embed_file *f = embed_find(kernel);
  if (!f) {
    size_t n;
    const embed_file *all = embed_all(&n);
    mj_buf names = {0};
    for (size_t i = 0; i < n; i++) mj_buf_printf(&names, "%s%s", i ? ", " : "", all[i].path);
    mj_fail(err, MJ_EINPUT, "kernel '%s': no such template (built in: %s)", kernel,
            names.data ? names.data : "none");
    mj_buf_free(&names);
    return MJ_EINPUT;
  }
  s->text = f->data;
  s->len = f->size;
  return 0;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* "rmsnorm.cu rmsnorm_bf16<1001, 256> -DX=1" for messages. */
static void describe(mj_buf *b, const char *kernel, const jit_spec *s) {
  mj_buf_puts(b, kernel);
  if (s->entry) mj_buf_printf(b, " %s", s->entry);
  for (int i = 0; i < s->ndefs; i++)
    mj_buf_printf(b, " %s=%s", s->defs[i].name, s->defs[i].value);
}

/* The constants sorted by name (insertion sort: there are a handful), so
 * their order does not change the key.  A name given twice is an error. */
static int sorted_defs(const jit_spec *s, const dsl_define **out, const char *kernel,
                       mj_err *err) {
  for (int i = 0; i < s->ndefs; i++) {
    const dsl_define *d = &s->defs[i];
    if (!d->name || !d->value || !d->name[0])
      return mj_fail(err, MJ_EINPUT, "kernel %s: a constant without a name or value", kernel);
    int j = i;
    while (j > 0 && strcmp(out[j - 1]->name, d->name) > 0) out[j] = out[j - 1], j--;
    if (j > 0 && strcmp(out[j - 1]->name, d->name) == 0)
      return mj_fail(err, MJ_EINPUT, "kernel %s: constant %s given twice", kernel, d->name);
    out[j] = d;
  }
  return 0;
}

/* ---- from request to entry ----------------------------------------------------------------- */
static int jit_init(mj_err *err) {
  cache_config cfg;
  if (cache_config_from_env(&cfg, err)) return MJ_EINPUT;
  cfg.producer = kc_producer();
  int r = cache_open(&cfg, &J.cache, err);
  if (r) return r;
  mj_err e = {0};
  if (!compile_only && cu_init(&e) == 0) {
    J.have_gpu = true;
    snprintf(J.dev_arch, sizeof J.dev_arch, "%s", cu_dev()->arch);
  }
  mj_err_clear(&e);
  J.cap = 256;
  J.slots = mj_xcalloc(J.cap, sizeof *J.slots);
  J.ready = true;
  return 0;
}

/* Load the cubin on the GPU when it is of the GPU's target. */
static int load_module(jit_entry *e, const char *arch, mj_err *err) {
  if (!J.have_gpu || strcmp(arch, J.dev_arch) != 0) return 0;
  uint64_t t0 = mj_now_ns();
  int r = cu_load_cubin(e->fn.cubin, e->fn.meta.kernel_name, &e->fn.module, &e->fn.fn, err);
  cache_count(J.cache, CACHE_STAT_loads, 1);
  cache_count(J.cache, CACHE_STAT_load_us, (mj_now_ns() - t0) / 1000);
  return r;
}

/* Everything a compile of (kernel, spec, arch) needs, and the canonical
 * key it is stored under: built the same way for jit_get and jit_probe, so
 * a probe can never disagree with what a compile would look up. */
typedef struct keyed {
  source src;
  mj_arena a;
  kc_job job;
  cache_key k;
} keyed;

static void keyed_free(keyed *q) {
  cache_key_free(&q->k);
  mj_arena_free(&q->a);
  free(q->src.owned);
}

/* Fill q (freed by keyed_free whatever the result). */
static int build_key(keyed *q, const char *kernel, const jit_spec *spec, const char *arch,
                     mj_err *err) {
  memset(q, 0, sizeof *q);
  mj_arena_init(&q->a, 0);
  int r = find_source(kernel, &q->src, err);
  if (r) return r;
  kc_job *j = &q->job;
  j->nvrtc = ends_with(kernel, ".cu");
  if (!j->nvrtc && !ends_with(kernel, ".k"))
    return mj_fail(err, MJ_EINPUT, "kernel %s: not a .k (DSL) or .cu (NVRTC) source", kernel);
  const dsl_define **defs = mj_arena_alloc(&q->a, (size_t)(spec->ndefs + 1) * sizeof *defs);
  if ((r = sorted_defs(spec, defs, kernel, err))) return r;
  j->name = kernel, j->text = q->src.text, j->len = q->src.len, j->entry = spec->entry;
  j->defs = defs, j->ndefs = spec->ndefs, j->arch = arch;
  if ((r = kc_prepare(j, &q->a, err))) return r;

  /* The canonical key: everything that decides the bytes of the cubin. */
  cache_key *k = &q->k;
  cache_key_begin(k, kc_producer());
  cache_key_add(k, "lang", j->nvrtc ? "nvrtc" : "dsl");
  cache_key_add(k, "target", arch);
  cache_key_add(k, "source", kernel);
  cache_key_add_hash(k, "source_hash", q->src.text, q->src.len);
  kc_key(j, k);
  cache_key_end(k);
  return 0;
}

/* Fill e for (kernel, spec, arch): from the disk cache or a compile, then
 * loaded.  Returns non-zero only for a wrong request (not remembered); a
 * compile or load failure returns 0 with e->ok false and e->error set. */
static int obtain(jit_entry *e, const char *kernel, const jit_spec *spec, const char *arch,
                  mj_err *err) {
  keyed q;
  int r = build_key(&q, kernel, spec, arch, err);
  if (r) goto out;
  cache_blob blob;
  bool hit = false;
  if ((r = cache_load(J.cache, &q.k, &blob, &hit, err))) goto out;
  kc_out o = {0};
  snprintf(e->fn.key, sizeof e->fn.key, "%s", q.k.hex);
  if (!hit && shard_n > 1 && q.k.hash.lo % (uint64_t)shard_n != (uint64_t)shard_k) {
    /* Another process of `moejit warmup -j` compiles this one. */
    shard_skipped++;
    e->ok = true;
    goto out;
  }
  if (hit) {
    o.mem = blob.mem;
    o.cubin = blob.cubin;
    o.cubin_size = blob.cubin_size;
    o.meta = blob.meta;
  } else {
    mj_err ce = {0};
    uint64_t t0 = mj_now_ns();
    int cr = kc_compile(&q.job, &o, &ce);
    cache_count(J.cache, CACHE_STAT_compiles, 1);
    cache_count(J.cache, CACHE_STAT_compile_us, (mj_now_ns() - t0) / 1000);
    if (!cr && mj_log_level() >= 2) { /* MOEJIT_LOG=2: which kernel a warm-up missed (a failure says so below) */
      mj_buf w = {0};
      describe(&w, kernel, spec);
      mj_info("jit: compiled %s for %s in %.1f ms", w.data, arch, (mj_now_ns() - t0) / 1e6);
      mj_buf_free(&w);
    }
    if (cr) {
      cache_count(J.cache, CACHE_STAT_failures, 1);
      mj_buf b = {0};
      mj_buf_puts(&b, ce.msg);
      if (ce.detail) mj_buf_printf(&b, "\n%s", ce.detail);
      /* MJ_EINPUT for an error in the kernel source (a refused
       * specialisation), MJ_ECOMPILE for a backend failure. */
      e->code = ce.code == MJ_EINPUT ? MJ_EINPUT : MJ_ECOMPILE;
      e->error = mj_buf_steal(&b);
      mj_err_clear(&ce);
      goto out;
    }
    cache_store(J.cache, &q.k, o.cubin, o.cubin_size, &o.meta);
  }
  e->owns = true;
  e->mem = o.mem;
  e->fn.cubin = o.cubin;
  e->fn.cubin_size = o.cubin_size;
  e->fn.meta = o.meta;
  mj_err le = {0};
  if (load_module(e, arch, &le)) {
    cache_count(J.cache, CACHE_STAT_failures, 1);
    e->code = le.code;
    e->error = mj_xstrdup(le.msg);
    mj_err_clear(&le);
    goto out;
  }
  e->ok = true;
out:
  keyed_free(&q);
  return r;
}

static void entry_free(jit_entry *e) {
  if (e->owns && e->fn.module && J.have_gpu) cu.cuModuleUnload(e->fn.module);
  if (e->owns) free(e->mem);
  free(e->mat);
  free(e->error);
  free(e);
}

/* The first line of a (multi-line) error, for the one-line warning. */
static int first_line(const char *s) { return (int)strcspn(s, "\n"); }

/* Fill err from a remembered failure: the first line is the message, the
 * rest (a compile log) the detail. */
static int fail_with(mj_err *err, mj_code code, const char *error) {
  int n = first_line(error);
  mj_fail(err, code, "%.*s", n, error);
  if (error[n] && err && err->code == code && !err->detail)
    mj_err_set_detail(err, error + n + 1);
  return code;
}

static int get_locked(const char *kernel, const jit_spec *spec, const jit_spec *generic,
                      const char *arch, const jit_fn **out, mj_err *err) {
  int r;
  if (!J.ready && (r = jit_init(err))) return r;
  if (!kernel || !spec) return mj_fail(err, MJ_EINPUT, "jit_get: no kernel named");
  if (!arch) {
    if (!J.have_gpu)
      return mj_fail(err, MJ_ENOGPU, "kernel %s: no GPU, and no target named (such as sm_90a)",
                     kernel);
    arch = J.dev_arch;
  }
  char buf[512];
  size_t n;
  char *mat = request_bytes(kernel, spec, arch, buf, sizeof buf, &n);
  uint64_t h = mj_hash128(mat, n).lo;
  jit_entry *e = table_find(h, mat, n);
  if (e) {
    if (mat != buf) free(mat);
    cache_count(J.cache, CACHE_STAT_mem_hits, 1);
    if (e->ok) {
      *out = &e->fn;
      return 0;
    }
    return fail_with(err, e->code, e->error);
  }
  e = mj_xcalloc(1, sizeof *e);
  e->h = h;
  e->mat_len = n;
  e->mat = mj_xmalloc(n);
  memcpy(e->mat, mat, n);
  if (mat != buf) free(mat);
  if ((r = obtain(e, kernel, spec, arch, err))) {
    entry_free(e);
    return r;
  }
  table_insert(e);
  if (e->ok) {
    *out = &e->fn;
    return 0;
  }
  /* Failed: logged here, once (the entry remembers), then the generic
   * variant answers for it for the rest of the process. */
  mj_buf what = {0};
  describe(&what, kernel, spec);
  const jit_fn *g = NULL;
  mj_err ge = {0};
  if (generic && get_locked(kernel, generic, NULL, arch, &g, &ge) == 0) {
    mj_buf gw = {0};
    describe(&gw, kernel, generic);
    mj_warn("%s: did not compile; the generic variant (%s) stands in for it: %.*s",
            what.data, gw.data, first_line(e->error), e->error);
    mj_info("%s", e->error);
    mj_buf_free(&gw);
    e->fn = *g;
    e->fn.generic = true;
    e->ok = true;
    *out = &e->fn;
    mj_buf_free(&what);
    return 0;
  }
  if (generic) {
    /* The generic variant is tested by make check; failing here means a
     * broken toolkit or install.  Keep both reasons. */
    char *both = NULL;
    mj_buf b = {0};
    mj_buf_printf(&b, "%s (and its generic variant failed: %s)", e->error, ge.msg);
    both = mj_buf_steal(&b);
    free(e->error);
    e->error = both;
    e->code = ge.code ? ge.code : MJ_ECOMPILE;
  }
  mj_err_clear(&ge);
  /* No stand-in: the caller gets the error (and prints it); a warning too
   * would say it twice. */
  mj_info("%s: did not compile: %.*s", what.data, first_line(e->error), e->error);
  mj_buf_free(&what);
  return fail_with(err, e->code, e->error);
}

int jit_get(const jit_request *req, const jit_fn **out, mj_err *err) {
  pthread_mutex_lock(&jit_lock);
  int r = get_locked(req->kernel, &req->spec, req->generic, req->arch, out, err);
  pthread_mutex_unlock(&jit_lock);
  return r;
}

/* The probe looks where obtain would, in the same order (memory table,
 * then the disk entry under the same key, its key text compared), but
 * reads the entry with cache_verify_file: no counter moves, no mtime is
 * refreshed, a bad entry is left for the next real lookup to remove. */
static int probe_locked(const jit_request *req, bool *cached, mj_err *err) {
  int r;
  *cached = false;
  if (!J.ready && (r = jit_init(err))) return r;
  if (!req->kernel) return mj_fail(err, MJ_EINPUT, "jit_probe: no kernel named");
  const char *arch = req->arch;
  if (!arch) {
    if (!J.have_gpu)
      return mj_fail(err, MJ_ENOGPU, "kernel %s: no GPU, and no target named (such as sm_90a)",
                     req->kernel);
    arch = J.dev_arch;
  }
  char buf[512];
  size_t n;
  char *mat = request_bytes(req->kernel, &req->spec, arch, buf, sizeof buf, &n);
  jit_entry *e = table_find(mj_hash128(mat, n).lo, mat, n);
  if (mat != buf) free(mat);
  /* (An entry skipped by jit_set_shard is ok but has no cubin.) */
  if (e && e->ok && !e->fn.generic && e->fn.cubin) {
    *cached = true;
    return 0;
  }
  keyed q;
  if ((r = build_key(&q, req->kernel, &req->spec, arch, err)) == 0 &&
      cache_get_mode(J.cache) != CACHE_OFF && cache_dir(J.cache)) {
    char *path = cache_entry_path(cache_dir(J.cache), q.k.hex), *text = NULL;
    if (cache_verify_file(path, NULL, &text, NULL) == 0)
      *cached = strlen(text) == q.k.text.len && memcmp(text, q.k.text.data, q.k.text.len) == 0;
    free(text);
    free(path);
  }
  keyed_free(&q);
  return r;
}

int jit_probe(const jit_request *req, bool *cached, mj_err *err) {
  pthread_mutex_lock(&jit_lock);
  int r = probe_locked(req, cached, err);
  pthread_mutex_unlock(&jit_lock);
  return r;
}

void jit_stats(cache_stats *out) {
  pthread_mutex_lock(&jit_lock);
  if (J.ready) cache_stats_local(J.cache, out);
  else memset(out, 0, sizeof *out);
  pthread_mutex_unlock(&jit_lock);
}

void jit_shutdown(void) {
  pthread_mutex_lock(&jit_lock);
  if (J.ready) {
    for (size_t i = 0; i < J.cap; i++)
      if (J.slots[i]) entry_free(J.slots[i]);
    free(J.slots);
    cache_close(J.cache);
    memset(&J, 0, sizeof J);
  }
  pthread_mutex_unlock(&jit_lock);
}
