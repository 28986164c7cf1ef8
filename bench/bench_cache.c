/* bench_cache.c: what the JIT front door costs, per path: a cold compile
 * (miss, compile, store), a disk hit and a memory hit, as medians.
 *
 * Kernels: the NVRTC test kernel tests/kernels/rmsnorm.cu <6144, 256> and the DSL kernel
 * tests/kernels/gemv_bf16.k N=6144 K=2048, both for --arch (default sm_90a; loaded too
 * when the GPU is of that target, so a disk hit then includes
 * cuModuleLoadData).  Each cold compile uses a fresh cache folder; the
 * first one of the process also pays NVRTC's or LLVM's one-time start and
 * is reported apart.  A disk hit restarts the front door (jit_shutdown),
 * primes it with another specialisation of the same source (so the
 * once-per-process work, opening the cache and hashing the toolkit headers,
 * is done, as in a running engine) and times jit_get; the first disk hit of
 * a process is reported apart too.  A memory hit is timed over batches of
 * 10000 calls.  Prints a markdown table (bench/cache.sh records it).
 */
#include <stdlib.h>
#include <string.h>

#include "cudrv.h"
#include "jit.h"
#include "t_fs.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct bench_kernel {
  const char *label;
  jit_request req, other; /* other: a second specialisation, to prime */
} bench_kernel;

static int timed_get(const jit_request *r, double *ms) {
  const jit_fn *f;
  mj_err err = {0};
  double t0 = mj_now_ms();
  int rc = jit_get(r, &f, &err);
  *ms = mj_now_ms() - t0;
  if (rc) {
    mj_err_print(&err, stderr);
    mj_err_clear(&err);
  }
  return rc;
}

static int run(const bench_kernel *k, int reps) {
  double cold[64], compile_only[64], disk[64], mem[101], first_cold = 0, first_disk = 0;
  char dir[600];
  /* Cold: a fresh folder each time. */
  for (int i = 0; i <= reps; i++) {
    snprintf(dir, sizeof dir, "%s/%s-cold-%d", t_root, k->label, i);
    jit_shutdown();
    setenv("MOEJIT_CACHE_DIR", dir, 1);
    double ms;
    if (timed_get(&k->req, &ms)) return 1;
    cache_stats s;
    jit_stats(&s);
    if (i == 0) first_cold = ms;
    else cold[i - 1] = ms, compile_only[i - 1] = (double)s.v[CACHE_STAT_compile_us] / 1e3;
  }
  /* Disk hits from the last folder, which holds the entry; the other
   * specialisation is compiled there once. */
  for (int i = 0; i <= reps; i++) {
    jit_shutdown();
    double ms;
    if (i == 0) {
      if (timed_get(&k->req, &first_disk)) return 1;
      continue;
    }
    if (timed_get(&k->other, &ms) || timed_get(&k->req, &ms)) return 1;
    cache_stats s;
    jit_stats(&s);
    if (s.v[CACHE_STAT_disk_hits] < 1 || s.v[CACHE_STAT_compiles] > (i == 1)) {
      fprintf(stderr, "bench: expected a disk hit for %s\n", k->label);
      return 1;
    }
    disk[i - 1] = ms;
  }
  /* Memory hits. */
  const jit_fn *f;
  mj_err err = {0};
  for (int b = 0; b < 101; b++) {
    uint64_t t0 = mj_now_ns();
    for (int i = 0; i < 10000; i++) jit_get(&k->req, &f, &err);
    mem[b] = (double)(mj_now_ns() - t0) / 10000;
  }
  printf("| %s | %.1f | %.1f (%.1f compile) | %.2f | %.3f | %.0f |\n", k->label, first_cold,
         median(cold, reps), median(compile_only, reps), first_disk, median(disk, reps),
         median(mem, 101));
  return 0;
}

int main(int argc, char **argv) {
  const char *arch = "sm_90a";
  int reps = 11;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_cache [--arch sm_90a] [--reps N (1..63)]\n");
      return 1;
    }
  }
  if (reps < 1 || reps > 63) reps = 11;
  if (t_scratch_init("bench")) return 1;
  setenv("MOEJIT_CACHE", "on", 1);
  unsetenv("MOEJIT_NVRTC_FLAGS");
  unsetenv("MOEJIT_DSL_OPT");
  mj_err err = {0};
  bool gpu = cu_init(&err) == 0 && !strcmp(cu_dev()->arch, arch);
  static const jit_spec rms_generic = {"rmsnorm_bf16<0, 256>", NULL, 0};
  /* the test kernels live with the tests (run from the source tree, or set srcdir) */
  static char rms[1024], gemv[1024];
  const char *sd = getenv("srcdir");
  snprintf(rms, sizeof rms, "%s/tests/kernels/rmsnorm.cu", sd && *sd ? sd : ".");
  snprintf(gemv, sizeof gemv, "%s/tests/kernels/gemv_bf16.k", sd && *sd ? sd : ".");
  static const dsl_define nk[] = {{"N", "6144"}, {"K", "2048"}},
                          nk2[] = {{"N", "4096"}, {"K", "2048"}};
  bench_kernel kernels[] = {
      {"NVRTC rmsnorm.cu <6144, 256>",
       {rms, {"rmsnorm_bf16<6144, 256>", NULL, 0}, &rms_generic, arch},
       {rms, {"rmsnorm_bf16<4096, 256>", NULL, 0}, &rms_generic, arch}},
      {"DSL gemv_bf16.k N=6144 K=2048",
       {gemv, {NULL, nk, 2}, NULL, arch},
       {gemv, {NULL, nk2, 2}, NULL, arch}},
  };
  printf("target %s, %s; medians of %d runs (first run of a process apart)\n\n", arch,
         gpu ? "loaded on the GPU (disk hit includes cuModuleLoadData)"
             : "no GPU of that target: compile, store and read back only",
         reps);
  printf("| kernel | cold, first in process (ms) | cold: miss + compile + store (ms) "
         "| disk hit, first in process (ms) | disk hit (ms) | memory hit (ns) |\n"
         "|---|---|---|---|---|---|\n");
  int rc = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(kernels) && !rc; i++) rc = run(&kernels[i], reps);
  jit_shutdown();
  return t_scratch_done(rc);
}
