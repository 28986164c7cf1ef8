/* compile_cmd.c: `moejit compile`, the DSL compiler on the command line.
 *
 * Compiles one kernel (a .k file, or the name of a template built into the
 * binary) with its -D constants for one architecture, writes LLVM IR, PTX or
 * a cubin, and reports the time of each stage and the kernel's resources
 * (registers, shared memory, stack, spills from the ptxas report).
 * --repeat N compiles N times in this process and reports the median, the
 * number the compile-time target is about (the first run also pays LLVM's
 * one-time target initialisation).
 *
 * A cubin is obtained through the JIT front door (jit.h), like every kernel
 * moejit uses: from the cubin cache when it is there, else compiled and
 * stored, so `moejit compile -o x.cubin` also warms the cache.  -O then
 * travels as MOEJIT_DSL_OPT, the variable the cache key records.  The
 * stage times and the nvJitLink log need a compile that bypasses the
 * cache: with --repeat (which times the compiler itself) or -v the
 * compiler runs too, and the cubin written is still the front door's.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "cli.h"
#include "timing.h"
#include "dsl.h"
#include "embed.h"
#include "jit.h"

/* Read a kernel source: a file, or failing that an embedded template. */
static int load_source(const char *name, char **src, size_t *len, bool *owned, mj_err *err) {
  mj_err ferr = {0};
  if (mj_read_file(name, src, len, &ferr) == 0) {
    *owned = true;
    return 0;
  }
  const embed_file *e = embed_find(name);
  if (e) {
    *src = (char *)e->data;
    *len = e->size;
    *owned = false;
    mj_err_clear(&ferr);
    return 0;
  }
  int rc = mj_fail(err, MJ_EINPUT, "%s (and no built-in template of that name)", ferr.msg);
  mj_err_clear(&ferr);
  return rc;
}

/* The cubin through the front door, written to out; reports what the
 * cache did unless quiet. */
static int cubin_via_jit(const char *kernel, const dsl_define *dv, int ndefs, const char *arch,
                         const char *out, bool quiet, mj_err *err) {
  /* The front door reads a path when the name has a '/', else a built-in
   * template; a file in the current folder wins, as for the other outputs. */
  char path[4096];
  if (!strchr(kernel, '/') && access(kernel, R_OK) == 0) {
    snprintf(path, sizeof path, "./%s", kernel);
    kernel = path;
  }
  jit_request req = {kernel, {NULL, dv, ndefs}, NULL, arch};
  const jit_fn *f = NULL;
  cache_stats before, after;
  jit_stats(&before);
  double t0 = mj_now_ms();
  int rc = jit_get(&req, &f, err);
  double ms = mj_now_ms() - t0;
  jit_stats(&after);
  if (!rc) rc = mj_write_file_atomic(out, f->cubin, f->cubin_size, err);
  if (!rc && !quiet) {
    const cache_meta *m = &f->meta;
    printf("kernel %s for %s (PTX %s)", m->kernel_name, arch, m->ptx_version);
    if (m->max_threads)
      printf(", launch_bounds(%d%s%.0d)", m->max_threads, m->min_blocks ? ", " : "", m->min_blocks);
    bool compiled = after.v[CACHE_STAT_compiles] > before.v[CACHE_STAT_compiles];
    bool stored = after.v[CACHE_STAT_stores] > before.v[CACHE_STAT_stores];
    printf("\n  %s in %.2f ms%s\n", compiled ? "compiled" : "from the cubin cache", ms,
           compiled && stored ? " (stored in the cache)" : "");
    printf("  resources: %d registers, %d bytes shared, %d bytes stack, %d bytes spill stores, %d bytes spill loads\n",
           m->regs, m->shared_bytes, m->stack_bytes, m->spill_stores, m->spill_loads);
    printf("  wrote %s (cubin)\n", out);
  }
  jit_shutdown();
  return rc;
}

int cmd_compile(int argc, char **argv, mj_err *err) {
  const char *arch = "sm_90a", *emit = NULL, *out = NULL;
  int64_t opt_level = -1, repeat = 1; /* -1: -O not given */
  bool quiet = false, verbose = false;
  cli_list defs = {0}, pos = {0};
  cli_opt opts[] = {
      {"define", 'D', CLI_MULTI, &defs}, {"arch", 0, CLI_STR, &arch},
      {"emit", 0, CLI_STR, &emit},       {"output", 'o', CLI_STR, &out},
      {"opt", 'O', CLI_INT, &opt_level}, {"repeat", 0, CLI_INT, &repeat},
      {"quiet", 'q', CLI_FLAG, &quiet},  {"verbose", 'v', CLI_FLAG, &verbose},
  };
  dsl_define *dv = NULL;
  char *src = NULL;
  bool owned = false;
  dsl_result r = {0};
  int rc = cli_parse("compile", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), &pos, err);
  if (rc) goto done;
  if (pos.n != 1) {
    rc = mj_fail(err, MJ_EUSAGE, "moejit compile: expected one kernel file (see moejit compile --help)");
    goto done;
  }
  if (!emit) emit = out ? "cubin" : "ptx";
  if (strcmp(emit, "llvm") && strcmp(emit, "ptx") && strcmp(emit, "cubin")) {
    rc = mj_fail(err, MJ_EUSAGE, "moejit compile: --emit must be llvm, ptx or cubin, not '%s'", emit);
    goto done;
  }
  if (!strcmp(emit, "cubin") && !out) {
    rc = mj_fail(err, MJ_EUSAGE, "moejit compile: --emit cubin needs -o FILE (a cubin is binary)");
    goto done;
  }
  bool opt_given = opt_level != -1;
  if (!opt_given) opt_level = 3;
  if (opt_level < 0 || opt_level > 3 || repeat < 1 || repeat > 1000) {
    rc = mj_fail(err, MJ_EUSAGE, "moejit compile: -O takes 0..3 and --repeat 1..1000");
    goto done;
  }
  dv = mj_xcalloc((size_t)defs.n + 1, sizeof *dv);
  for (int i = 0; i < defs.n; i++) {
    char *eq = strchr(defs.v[i], '=');
    if (!eq || eq == defs.v[i] || !eq[1]) {
      rc = mj_fail(err, MJ_EUSAGE, "moejit compile: -D %s: expected NAME=VALUE", defs.v[i]);
      goto done;
    }
    *eq = 0;
    dv[i].name = defs.v[i];
    dv[i].value = eq + 1;
  }
  bool via_jit = !strcmp(emit, "cubin") && strcmp(pos.v[0], "-") != 0;
  if (via_jit && opt_given) {
    char lvl[2] = {(char)('0' + opt_level), 0};
    setenv("MOEJIT_DSL_OPT", lvl, 1);
  }
  if (via_jit && repeat == 1 && !verbose) {
    rc = cubin_via_jit(pos.v[0], dv, defs.n, arch, out, quiet, err);
    goto done;
  }
  size_t len;
  if ((rc = load_source(pos.v[0], &src, &len, &owned, err))) goto done;

  dsl_options o = {.arch = arch, .opt_level = (int)opt_level, .no_cubin = strcmp(emit, "cubin") != 0};
  double *times = mj_xcalloc((size_t)repeat, sizeof *times);
  for (int i = 0; i < repeat; i++) {
    if (i) dsl_result_free(&r);
    if ((rc = dsl_compile(pos.v[0], src, len, dv, defs.n, &o, &r, err))) {
      free(times);
      goto done;
    }
    times[i] = r.t_total;
  }
  double first = times[0];
  double median = tm_median(times, (size_t)repeat);
  free(times);

  const char *text = !strcmp(emit, "llvm") ? r.llvm_ir : !strcmp(emit, "ptx") ? r.ptx : NULL;
  if (via_jit) {
    /* The timed compiles above measured the compiler; the cubin written is
     * the front door's, as without --repeat. */
    if ((rc = cubin_via_jit(pos.v[0], dv, defs.n, arch, out, true, err))) goto done;
  } else if (out) {
    const void *data = text ? (const void *)text : r.cubin;
    size_t n = text ? strlen(text) : r.cubin_size;
    if ((rc = mj_write_file_atomic(out, data, n, err))) goto done;
  } else {
    fputs(text, stdout);
  }
  if (!quiet) {
    /* The report goes to stderr when the kernel itself went to stdout. */
    FILE *f = out ? stdout : stderr;
    fprintf(f, "kernel %s for %s (PTX %s)", r.kernel_name, arch, r.ptx_version);
    if (r.max_threads) fprintf(f, ", launch_bounds(%d%s%.0d)", r.max_threads, r.min_blocks ? ", " : "", r.min_blocks);
    fprintf(f, "\n  stages (ms):");
#define X(s) fprintf(f, " %s %.2f", #s, r.t_##s);
    DSL_STAGES(X)
#undef X
    fprintf(f, "\n  total %.2f ms", first);
    if (repeat > 1) fprintf(f, " (first), median of %lld: %.2f ms", (long long)repeat, median);
    fprintf(f, "\n");
    if (r.cubin)
      fprintf(f, "  resources: %d registers, %d bytes shared, %d bytes stack, %d bytes spill stores, %d bytes spill loads\n",
              r.regs, r.shared_bytes, r.stack_bytes, r.spill_stores, r.spill_loads);
    if (out) fprintf(f, "  wrote %s (%s)\n", out, emit);
    if (verbose && r.link_log) fprintf(f, "nvJitLink log:\n%s", r.link_log);
  }
done:
  dsl_result_free(&r);
  if (owned) free(src);
  free(dv);
  free(defs.v);
  free(pos.v);
  return rc < 0 ? 0 : rc;
}
