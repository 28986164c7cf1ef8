/* kc.c: the kernel compilers (kc.h): NVRTC for .cu sources and the DSL
 * compiler (codegen/) for .k sources, behind one job -> cubin + metadata
 * call, and what each puts into the cache key.
 *
 * NVRTC: the options are the key's options too; its cubin comes straight
 * from nvrtcGetCUBIN, the resources from ptxas's -v log and the launch
 * bounds and PTX ISA from the PTX NVRTC also returns.  The toolkit headers
 * a source includes are found by following #include lines and hashed into
 * the key (memoised per source name).  DSL: dsl_compile does the whole
 * pipeline and reports its resources itself.
 */
#include "kc.h"

#include <nvJitLink.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "build_id.h"
#include "config.h"

/* ---- NVRTC ------------------------------------------------------------------------------- */
/* The include folder NVRTC compiles against (the CUDA toolkit's). */
static const char *kc_cuda_include(void) {
  static char dir[512];
  if (!dir[0]) {
    /* The toolkit configure found; a GPU host with the toolkit elsewhere
     * has it at the usual place. */
    struct stat st;
    snprintf(dir, sizeof dir, "%s/include/cuda_bf16.h", MOEJIT_CUDA_DIR);
    if (stat(dir, &st) == 0) snprintf(dir, sizeof dir, "%s/include", MOEJIT_CUDA_DIR);
    else snprintf(dir, sizeof dir, "/usr/local/cuda/include");
  }
  return dir;
}

/* Hash every header reachable from text by #include lines, found in the
 * toolkit's include folder (depth-first, each once).  Conditional includes
 * are followed too: a superset only makes the key more sensitive.  Headers
 * not found there are NVRTC's built-ins, covered by its version. */
static void hash_includes(const char *text, mj_buf *acc, mj_buf *seen, int depth) {
  if (depth > 32) return;
  for (const char *p = text; (p = strstr(p, "include")); p += 7) {
    const char *h = p;
    while (h > text && (h[-1] == ' ' || h[-1] == '\t')) h--;
    if (h == text || h[-1] != '#') continue;
    const char *q = p + 7;
    while (*q == ' ' || *q == '\t') q++;
    if (*q != '<' && *q != '"') continue;
    char close = *q == '<' ? '>' : '"';
    const char *end = strchr(q + 1, close);
    const char *nl = strchr(q + 1, '\n');
    if (!end || (nl && nl < end) || end - q - 1 >= 256) continue;
    char name[260];
    snprintf(name, sizeof name, "\n%.*s\n", (int)(end - q - 1), q + 1);
    if (seen->data && strstr(seen->data, name)) continue;
    mj_buf_puts(seen, name);
    char path[1024];
    snprintf(path, sizeof path, "%s/%.*s", kc_cuda_include(), (int)(end - q - 1), q + 1);
    char *data = NULL;
    size_t n = 0;
    if (mj_read_file(path, &data, &n, NULL) != 0) {
      mj_buf_printf(acc, "%.*s absent\n", (int)(end - q - 1), q + 1);
      continue;
    }
    char hex[33];
    mj_hash_hex(mj_hash128(data, n), hex);
    mj_buf_printf(acc, "%.*s %s\n", (int)(end - q - 1), q + 1, hex);
    hash_includes(data, acc, seen, depth + 1);
    free(data);
  }
}

typedef struct header_memo {
  char *kernel;
  char hex[33];
} header_memo;
static header_memo *memo; /* for the life of the process: a handful of sources */
static int nmemo;
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *headers_hash(const char *kernel, const char *text) {
  pthread_mutex_lock(&memo_lock);
  for (int i = 0; i < nmemo; i++)
    if (strcmp(memo[i].kernel, kernel) == 0) {
      pthread_mutex_unlock(&memo_lock);
      return memo[i].hex;
    }
  mj_buf acc = {0}, seen = {0};
  mj_buf_printf(&acc, "include=%s\n", kc_cuda_include());
  hash_includes(text, &acc, &seen, 0);
  memo = mj_xrealloc(memo, (size_t)(nmemo + 1) * sizeof *memo);
  header_memo *m = &memo[nmemo++];
  m->kernel = mj_xstrdup(kernel);
  mj_hash_hex(mj_hash128(acc.data, acc.len), m->hex);
  mj_buf_free(&acc);
  mj_buf_free(&seen);
  pthread_mutex_unlock(&memo_lock);
  return m->hex;
}

/* The NVRTC options of a compile: they are the key's options too, so what
 * is compiled and what is looked up cannot drift apart.  Strings live in
 * a (caller-freed) arena. */
static int nvrtc_options(mj_arena *a, const char *arch, const dsl_define *const *defs, int ndefs,
                         const char ***out) {
  const char **o = mj_arena_alloc(a, (size_t)(ndefs + 64) * sizeof *o);
  int n = 0;
  o[n++] = mj_arena_printf(a, "--gpu-architecture=%s", arch);
  o[n++] = "-std=c++17";
  o[n++] = "--ptxas-options=-v"; /* resource usage in the log; same code */
  o[n++] = mj_arena_printf(a, "-I%s", kc_cuda_include());
  /* The prologue every templates/ kernel opens with (cudrv.h,
   * cu_launch_tpl): programmatic dependent launch from sm_90 on, nothing
   * below; the DSL's griddep_wait/griddep_launch are the same. */
  bool pdl = dsl_target_sm(arch) >= 90; /* the DSL's rule, one parse of the name */
  o[n++] = pdl ? "-DMJ_GRIDDEP_WAIT()=asm volatile(\"griddepcontrol.wait;\" ::: \"memory\")" : "-DMJ_GRIDDEP_WAIT()=";
  o[n++] = pdl ? "-DMJ_GRIDDEP_LAUNCH()=asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\")"
               : "-DMJ_GRIDDEP_LAUNCH()=";
  for (int i = 0; i < ndefs; i++)
    o[n++] = mj_arena_printf(a, "-D%s=%s", defs[i]->name, defs[i]->value);
  const char *extra = getenv("MOEJIT_NVRTC_FLAGS");
  char *copy = extra ? mj_arena_strdup(a, extra) : NULL;
  for (char *t = copy ? strtok(copy, " \t") : NULL; t && n < ndefs + 64; t = strtok(NULL, " \t"))
    o[n++] = t;
  *out = o;
  return n;
}

/* A failed NVRTC call (not a failed compile: that is reported with its
 * log by nvrtc_compile). */
static int nvrtc_fail(mj_err *err, nvrtcResult r, const char *call, const char *file, int line) {
  return mj_fail(err, MJ_ECOMPILE, "NVRTC error %s in %s at %s:%d", nvrtcGetErrorString(r), call, file, line);
}
#define NVRTC_CHECK_GOTO(err, call, label) MJ_CHECK_GOTO(nvrtcResult, NVRTC_SUCCESS, nvrtc_fail, err, call, label)

/* The resources ptxas reported for `lowered` in the -v log. */
static void log_resources(const char *log, const char *lowered, cache_meta *m) {
  char pat[300];
  snprintf(pat, sizeof pat, "entry function '%s'", lowered);
  const char *p = log ? strstr(log, pat) : NULL;
  if (!p) return;
  const char *s = strstr(p, "bytes stack frame");
  if (s) {
    while (s > p && s[-1] != '.' && s[-1] != '\n') s--;
    sscanf(s, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
           &m->stack_bytes, &m->spill_stores, &m->spill_loads);
  }
  const char *u = strstr(p, "Used ");
  if (u) sscanf(u, "Used %d registers", &m->regs);
  const char *sm = u ? strstr(u, " bytes smem") : NULL;
  const char *eol = u ? strchr(u, '\n') : NULL;
  if (sm && (!eol || sm < eol)) {
    while (sm > u && sm[-1] != ' ') sm--;
    sscanf(sm, "%d", &m->shared_bytes);
  }
}

/* The PTX version and the launch bounds (.maxntid, .minnctapersm) of the
 * entry `lowered`. */
static void ptx_meta(const char *ptx, const char *lowered, cache_meta *m) {
  const char *v = strstr(ptx, ".version ");
  if (v) sscanf(v + 9, "%11s", m->ptx_version);
  char pat[300];
  snprintf(pat, sizeof pat, ".entry %s(", lowered);
  const char *e = strstr(ptx, pat);
  const char *body = e ? strchr(e, '{') : NULL;
  if (!body) return;
  const char *t = strstr(e, ".maxntid");
  if (t && t < body) sscanf(t + 8, "%d", &m->max_threads);
  t = strstr(e, ".minnctapersm");
  if (t && t < body) sscanf(t + 13, "%d", &m->min_blocks);
}

static int nvrtc_compile(const char *name, const char *text, const char *entry,
                         const char **opts, int nopts, kc_out *o, mj_err *err) {
  nvrtcProgram prog = NULL;
  char *log = NULL, *ptx = NULL;
  size_t n = 0;
  int rc = MJ_ECOMPILE;
  NVRTC_CHECK_GOTO(err, nvrtcCreateProgram(&prog, text, name, 0, NULL, NULL), out);
  NVRTC_CHECK_GOTO(err, nvrtcAddNameExpression(prog, entry), out);
  nvrtcResult r = nvrtcCompileProgram(prog, nopts, opts);
  if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
    log = mj_xmalloc(n);
    if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = 0;
  }
  if (r != NVRTC_SUCCESS) {
    /* The message carries the log's first error line: that is what the
     * one-line warning of a failed specialisation shows. */
    const char *why = log ? strstr(log, "error") : NULL;
    while (why && why > log && why[-1] != '\n') why--;
    mj_fail(err, MJ_ECOMPILE, "%s: NVRTC could not compile %s for %s: %.*s", name, entry,
            opts[0] + strlen("--gpu-architecture="), why ? (int)strcspn(why, "\n") : 0,
            why ? why : nvrtcGetErrorString(r));
    mj_err_set_detail(err, log);
    goto out;
  }
  const char *lowered = NULL;
  NVRTC_CHECK_GOTO(err, nvrtcGetLoweredName(prog, entry, &lowered), out);
  if (strlen(lowered) >= sizeof o->meta.kernel_name) {
    mj_fail(err, MJ_ECOMPILE, "%s: kernel name %s is too long", name, lowered);
    goto out;
  }
  memset(&o->meta, 0, sizeof o->meta);
  snprintf(o->meta.kernel_name, sizeof o->meta.kernel_name, "%s", lowered);
  NVRTC_CHECK_GOTO(err, nvrtcGetCUBINSize(prog, &n), out);
  o->mem = mj_xmalloc(n ? n : 1);
  NVRTC_CHECK_GOTO(err, nvrtcGetCUBIN(prog, o->mem), out);
  o->cubin = o->mem;
  o->cubin_size = n;
  if (nvrtcGetPTXSize(prog, &n) == NVRTC_SUCCESS && n > 1) {
    ptx = mj_xmalloc(n);
    if (nvrtcGetPTX(prog, ptx) == NVRTC_SUCCESS) ptx_meta(ptx, lowered, &o->meta);
  }
  log_resources(log, lowered, &o->meta);
  rc = 0;
out:
  if (rc) {
    free(o->mem);
    o->mem = NULL;
  }
  free(ptx);
  free(log);
  if (prog) nvrtcDestroyProgram(&prog);
  return rc;
}

/* ---- the DSL compiler ------------------------------------------------------------------- */
static int dsl_opt_level(mj_err *err) {
  const char *s = getenv("MOEJIT_DSL_OPT");
  if (!s || !*s) return 3;
  if (s[1] || s[0] < '0' || s[0] > '3')
    return -mj_fail(err, MJ_EINPUT, "MOEJIT_DSL_OPT=%s: expected 0, 1, 2 or 3", s);
  return s[0] - '0';
}

static int dsl_build(const kc_job *j, kc_out *o, mj_err *err) {
  const dsl_define *const *defs = j->defs;
  int ndefs = j->ndefs;
  dsl_define *flat = mj_xcalloc((size_t)ndefs + 1, sizeof *flat);
  for (int i = 0; i < ndefs; i++) flat[i] = *defs[i];
  dsl_options opts = {.arch = j->arch, .opt_level = j->opt_level};
  dsl_result res;
  memset(&res, 0, sizeof res);
  int r = dsl_compile(j->name, j->text, j->len, flat, ndefs, &opts, &res, err);
  free(flat);
  if (r == 0 && !res.cubin)
    r = mj_fail(err, MJ_ECOMPILE, "%s: the DSL compiler returned no cubin", j->name);
  if (r == 0 && strlen(res.kernel_name) >= sizeof o->meta.kernel_name)
    r = mj_fail(err, MJ_ECOMPILE, "%s: kernel name too long", j->name);
  if (r == 0) {
    memset(&o->meta, 0, sizeof o->meta);
    snprintf(o->meta.kernel_name, sizeof o->meta.kernel_name, "%s", res.kernel_name);
    snprintf(o->meta.ptx_version, sizeof o->meta.ptx_version, "%.11s", res.ptx_version);
    o->meta.max_threads = res.max_threads;
    o->meta.min_blocks = res.min_blocks;
    o->meta.regs = res.regs;
    o->meta.shared_bytes = res.shared_bytes;
    o->meta.stack_bytes = res.stack_bytes;
    o->meta.spill_stores = res.spill_stores;
    o->meta.spill_loads = res.spill_loads;
    o->mem = mj_xmalloc(res.cubin_size ? res.cubin_size : 1);
    memcpy(o->mem, res.cubin, res.cubin_size);
    o->cubin = o->mem;
    o->cubin_size = res.cubin_size;
  }
  dsl_result_free(&res);
  return r ? MJ_ECOMPILE : 0;
}


/* ---- one interface ---------------------------------------------------------------------- */
int kc_prepare(kc_job *j, mj_arena *a, mj_err *err) {
  j->opt_level = 3;
  j->opts = NULL, j->nopts = 0;
  /* One list of targets for both compilers (codegen/target.c), so a bad
   * target is one clear error before either runs. */
  if (!dsl_target_known(j->arch))
    return mj_fail(err, MJ_EINPUT, "--arch %s: unknown target (use %s)", j->arch ? j->arch : "(none)",
                   dsl_target_names());
  if (j->nvrtc) {
    if (!j->entry || !j->entry[0])
      return mj_fail(err, MJ_EINPUT, "kernel %s: an NVRTC kernel needs its entry (name<args>)", j->name);
    j->nopts = nvrtc_options(a, j->arch, j->defs, j->ndefs, &j->opts);
    return 0;
  }
  int opt = dsl_opt_level(err);
  if (opt < 0) return -opt;
  j->opt_level = opt;
  return 0;
}

void kc_key(const kc_job *j, cache_key *k) {
  if (j->nvrtc) {
    /* NVRTC picks the PTX ISA from its version and the target, both in
     * the key. */
    cache_key_add(k, "ptx_isa", "nvrtc default for the target");
    cache_key_add(k, "headers_hash", headers_hash(j->name, j->text));
    cache_key_add(k, "entry", j->entry);
    for (int i = 0; i < j->nopts; i++) cache_key_add(k, "option", j->opts[i]);
  } else {
    /* The DSL compiler sets the PTX ISA itself (codegen/target.c, whose
     * source is in the build id), so the build id stands for it. */
    cache_key_add(k, "ptx_isa", "set by the DSL compiler of this build");
    /* Blackwell: sm_90 PTX carried forward by nvJitLink (codegen/target.c). */
    if (dsl_target_forward(j->arch)) cache_key_add(k, "ptx_forward", "sm_90");
    cache_key_addf(k, "opt_level", "%d", j->opt_level);
    for (int i = 0; i < j->ndefs; i++) cache_key_addf(k, "const", "%s=%s", j->defs[i]->name, j->defs[i]->value);
  }
}

int kc_compile(const kc_job *j, kc_out *o, mj_err *err) {
  memset(o, 0, sizeof *o);
  return j->nvrtc ? nvrtc_compile(j->name, j->text, j->entry, j->opts, j->nopts, o, err) : dsl_build(j, o, err);
}

/* ---- what a cubin was built for ---------------------------------------------------------- */
static uint64_t rd(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

int kc_cubin_arch(const void *cubin, size_t n, char *out, size_t cap, mj_err *err) {
  const unsigned char *p = cubin;
  /* ELF64, little-endian, OS ABI 0x41 (CUDA) */
  if (n < 64 || memcmp(p, "\177ELF", 4) != 0 || p[4] != 2 || p[5] != 1 || p[7] != 0x41)
    return mj_fail(err, MJ_EINPUT, "not a 64-bit little-endian CUDA ELF");
  uint32_t flags = (uint32_t)rd(p + 48, 4);
  int sm = p[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
  if (sm < 10) return mj_fail(err, MJ_EINPUT, "the ELF header names no SM (e_flags 0x%x)", flags);
  /* The tool note, found through the section headers and their names. */
  bool suffix_a = false;
  uint64_t shoff = rd(p + 0x28, 8), shentsize = rd(p + 0x3a, 2), shnum = rd(p + 0x3c, 2), shstrndx = rd(p + 0x3e, 2);
  if (shentsize >= 64 && shstrndx < shnum && shoff < n && shnum <= (n - shoff) / shentsize) {
    const unsigned char *names = p + shoff + shstrndx * shentsize;
    uint64_t noff = rd(names + 24, 8), nsize = rd(names + 32, 8);
    for (uint64_t i = 0; i < shnum && noff < n && nsize <= n - noff; i++) {
      const unsigned char *sh = p + shoff + i * shentsize;
      uint64_t name = rd(sh, 4), off = rd(sh + 24, 8), size = rd(sh + 32, 8);
      if (name >= nsize || off > n || size > n - off) continue;
      const char *nm = (const char *)p + noff + name;
      if (strnlen(nm, nsize - name) != strlen(".note.nv.tkinfo") || strcmp(nm, ".note.nv.tkinfo") != 0) continue;
      char want[24];
      int wl = snprintf(want, sizeof want, "-arch sm_%d", sm);
      for (uint64_t j = 0; j + (uint64_t)wl < size; j++)
        if (memcmp(p + off + j, want, (size_t)wl) == 0) {
          suffix_a = p[off + j + (uint64_t)wl] == 'a';
          break;
        }
    }
  }
  snprintf(out, cap, "sm_%d%s", sm, suffix_a ? "a" : "");
  return 0;
}

static cache_producer producer;
static char nvrtc_ver[16], jitlink_ver[16];
static void producer_fill(void) {
  int a = 0, b = 0;
  unsigned c = 0, d = 0;
  nvrtcVersion(&a, &b);
  nvJitLinkVersion(&c, &d);
  snprintf(nvrtc_ver, sizeof nvrtc_ver, "%d.%d", a, b);
  snprintf(jitlink_ver, sizeof jitlink_ver, "%u.%u", c, d);
  producer = (cache_producer){.moejit = PACKAGE_VERSION, .build_id = MOEJIT_BUILD_ID, .llvm = MOEJIT_LLVM_VERSION,
                              .nvrtc = nvrtc_ver, .nvjitlink = jitlink_ver};
}

const cache_producer *kc_producer(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, producer_fill);
  return &producer;
}
