/* warmup.c: `moejit warmup`, every kernel a deployment will need, compiled
 * into the cache before serving starts.
 *
 * The kernels of a decode step depend on the model's widths and the padded
 * batch size only, so warming is a dry run of the step (gpu_warm: every
 * launcher obtains its kernel through the front door and launches nothing)
 * for each size of the capture set (--batches) or each size a trace
 * recorded (--trace: the captured sizes, and the eager ones).  No GPU is
 * needed when the target is named (--arch sm_90a): the cubins are stored
 * for it.  With a GPU of the target the model is then uploaded and every
 * size's CUDA graph captured, which shows the cache is complete (capture
 * needs no compile) and how long start-up takes.
 *
 * -j N forks N processes that share the dry run, each compiling the misses
 * whose key hash falls to it (jit_set_shard); the disk cache is safe for
 * concurrent writers.  The parent then walks everything once more: that
 * pass must find every kernel on disk, and its counts are the summary's.
 * --tune first times the tiles of the MoE expert kernels and of the dense
 * GEMVs, and the attention's split of the context, on the GPU at hand and
 * stores the winners (tune.h), which the dry step then takes, so the
 * warm-up compiles them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api.h"
#include "cli.h"
#include "nccldrv.h"
#include "session.h"
#include "jit.h"
#include "kernels.h"
#include "trace.h"
#include "tune.h"

typedef struct wctx {
  const int *batches;
  bool tty, quiet;
} wctx;

static void progress(void *p, int i, int n) {
  wctx *w = p;
  if (w->quiet || !w->tty) return;
  cache_stats st;
  jit_stats(&st);
  int fill = n ? i * 30 / n : 30;
  fprintf(stderr, "\rwarmup [%.*s%*s] %d/%d batch sizes%s%d, %llu compiled, %llu cached   ", fill,
          "==============================", 30 - fill, "", i, n, i < n ? ", now " : "", i < n ? w->batches[i] : 0,
          (unsigned long long)st.v[CACHE_STAT_compiles], (unsigned long long)st.v[CACHE_STAT_disk_hits]);
  if (i == n) fprintf(stderr, "\r\033[K");
}

/* The padded sizes a trace ran: captured ones, and eager row counts. */
static int trace_batches(const char *path, int *out, int max, mj_err *err) {
  trace_file *t;
  int rc = trace_read(path, &t, err), n = 0;
  if (rc) return -rc;
  for (int64_t i = 0; i < t->nsteps; i++) {
    /* The size the step's kernels were specialised on: its captured size,
     * or an eager step's bucket (rows padded as gpu_padded does). */
    const trace_step *st = &t->steps[i];
    int b = st->captured > 0 ? st->captured : st->nmoe > 0 ? st->moe[0].bucket : st->rows, j = 0;
    while (j < n && out[j] != b) j++;
    if (j == n && n == max) {
      trace_free(t);
      return -mj_fail(err, MJ_EINPUT, "%s: more than %d distinct batch sizes; warm at most %d at a time", path, max, max);
    }
    if (j == n) out[n++] = b;
  }
  trace_free(t);
  if (n == 0) return -mj_fail(err, MJ_EINPUT, "%s: the trace has no steps", path);
  return n;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int cmd_warmup(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *synth = NULL, *batches_s = "1,2,4,8,16,32,64", *trace_path = NULL, *arch = NULL;
  int64_t jobs = 1, layers = 4, dense = 3, ctx = 4096, tp = 1, ep = 1;
  bool quiet = false, no_graphs = false, tune = false;
  cli_opt opts[] = {{"model", 'm', CLI_STR, &dir},     {"synthetic", 0, CLI_STR, &synth},
                    {"batches", 0, CLI_STR, &batches_s}, {"trace", 0, CLI_STR, &trace_path},
                    {"arch", 0, CLI_STR, &arch},        {"jobs", 'j', CLI_INT, &jobs},
                    {"layers", 0, CLI_INT, &layers},    {"dense", 0, CLI_INT, &dense},
                    {"ctx", 'c', CLI_INT, &ctx},        {"no-graphs", 0, CLI_FLAG, &no_graphs},
                    {"quiet", 'q', CLI_FLAG, &quiet},   {"tp", 0, CLI_INT, &tp},
                    {"ep", 0, CLI_INT, &ep},            {"tune", 0, CLI_FLAG, &tune}};
  int rc = cli_parse("warmup", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (rc) return rc < 0 ? 0 : rc;
  if (dir && synth) return mj_fail(err, MJ_EUSAGE, "moejit warmup: -m DIR or --synthetic glm5, not both");
  if (synth && strcmp(synth, "glm5") != 0)
    return mj_fail(err, MJ_EUSAGE, "moejit warmup: --synthetic knows only glm5, not '%s'", synth);
  if (jobs < 1 || jobs > 256) return mj_fail(err, MJ_EUSAGE, "moejit warmup: -j must be 1..256");
  if (arch && !dsl_target_known(arch))
    return mj_fail(err, MJ_EUSAGE, "moejit warmup: --arch %s: unknown target (use %s)", arch, dsl_target_names());
  if (layers < 1 || dense < 0 || dense > layers)
    return mj_fail(err, MJ_EUSAGE, "moejit warmup: --layers >= 1 and 0 <= --dense <= --layers");
  /* --tp/--ep: every rank's kernels (a rank's route kernel knows its
   * experts), compiled here in one process; each rank captures its own
   * graphs when it starts. */
  int world;
  if ((rc = nc_parallel_check("warmup", tp, ep, &world, err))) return rc;

  int batches[64], nb;
  if (trace_path) {
    if ((nb = trace_batches(trace_path, batches, 64, err)) < 0) return -nb;
  } else {
    int64_t v[64];
    nb = mj_parse_i64_list(batches_s, v, 64);
    if (nb <= 0)
      return mj_fail(err, MJ_EUSAGE, "moejit warmup: --batches wants at most 64 sizes like 1,2,4,8, not '%s'", batches_s);
    for (int i = 0; i < nb; i++) {
      if (v[i] < 1 || v[i] > 1024)
        return mj_fail(err, MJ_EUSAGE, "moejit warmup: --batches sizes must be 1..1024 (got %lld)", (long long)v[i]);
      batches[i] = (int)v[i];
    }
  }
  qsort(batches, (size_t)nb, sizeof *batches, cmp_int);

  model *m = NULL;
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config cfg;
  int sh = 0;
  char defdir[4096];
  if (!dir && !synth) { /* the built-in model, as generate and serve open it without -m */
    if ((rc = api_default_model(defdir, sizeof defdir, quiet, err))) goto out;
    dir = defdir;
  }
  if (dir) {
    if ((rc = model_load(dir, &m, err))) goto out;
    cfg = m->cfg;
    sh = gpu_bf16_shared_inter(m);
    if ((rc = gpu_model_supports(m, err))) goto out;
  } else {
    model_config_glm5(&cfg, (int)layers, (int)dense, &a);
  }
  /* The target: named, or the GPU's. */
  mj_err ge = {0};
  bool gpu = cu_init(&ge) == 0;
  mj_err_clear(&ge);
  if (tune && !gpu) {
    rc = mj_fail(err, MJ_ENOGPU, "moejit warmup --tune: needs a GPU");
    goto out;
  }
  if (tune && (world > 1 || (arch && strcmp(arch, cu_dev()->arch) != 0))) {
    rc = mj_fail(err, MJ_EUSAGE, "moejit warmup --tune: tunes the GPU at hand (%s), on one rank (no other --arch, --tp or --ep)",
                 cu_dev()->arch);
    goto out;
  }
  if (!arch && !gpu) {
    rc = mj_fail(err, MJ_ENOGPU, "moejit warmup: no GPU here; name the target to compile for with --arch (such as sm_90a)");
    goto out;
  }
  const char *target = arch ? arch : cu_dev()->arch;
  bool capture = gpu && !no_graphs && world == 1 && strcmp(target, cu_dev()->arch) == 0;
  gpu_opts o;
  gpu_opts_default(&o);
  o.max_ctx = ctx;
  o.quiet = quiet;
  /* Capture exactly these sizes; the largest sets the rows a step holds. */
  for (int i = 0; i < nb && i < GPU_MAX_GRAPHS; i++) o.graph_batches[i] = batches[i];
  o.n_graph_batches = nb < GPU_MAX_GRAPHS ? nb : GPU_MAX_GRAPHS;
  o.max_rows = batches[nb - 1];
  o.tp = (int)tp, o.ep = (int)ep;

  if (tune) {
    /* First the timing run, which stores the winners; then the warm-up
     * below, whose dry step takes them, compiles them. */
    tune_target tt;
    tune_target_here(NULL, &tt);
    if (!tt.on) {
      rc = mj_fail(err, MJ_EINPUT, "moejit warmup --tune: MOEJIT_CACHE=off or MOEJIT_TUNE=off: the tuning would have "
                                   "nowhere to go (or would not be read)");
      goto out;
    }
    double tt0 = mj_now_ms();
    tune_opts to = {.cfg = model_moe_of(&cfg), .buckets = batches, .nbuckets = nb, .log = quiet ? NULL : stdout};
    if ((rc = tune_moe_run(&tt, &to, err))) goto out;
    if (!quiet) printf("warmup: tuned %d buckets x 2 expert kernels on %s in %.1f s\n", nb, tt.gpu, (mj_now_ms() - tt0) / 1e3);
    /* The dense GEMVs: every shape of the step at every batch size. */
    tt0 = mj_now_ms();
    gop_gemv_shape shapes[GPU_MAX_GEMV_SHAPES];
    if ((rc = gpu_gemv_shapes(&cfg, sh, &o, shapes, &to.ngemv, err))) goto out;
    to.gemv = shapes;
    if ((rc = tune_gemv_run(&tt, &to, err))) goto out;
    if (!quiet)
      printf("warmup: tuned %d GEMV shapes at %d batch sizes on %s in %.1f s\n", to.ngemv, nb, tt.gpu,
             (mj_now_ms() - tt0) / 1e3);
    /* The attention's split of the context, at every batch size. */
    tt0 = mj_now_ms();
    gop_dims dims = gpu_dims_of(&cfg, ctx); /* the engine's context for --ctx */
    to.attn = &dims;
    if ((rc = tune_attn_run(&tt, &to, err))) goto out;
    if (!quiet && gop_attn_builtin(&dims, 1, NULL).nsplit)
      printf("warmup: tuned the attention's split at %d batch sizes, ctx %d, on %s in %.1f s\n", nb, dims.max_ctx, tt.gpu,
             (mj_now_ms() - tt0) / 1e3);
  }
  /* The tuning's candidates leave the front door (nothing holds them now):
   * the warm-up's counts are its own, and the compile processes forked
   * below start without this process's modules and driver state. */
  if (tune) jit_shutdown();
  double t0 = mj_now_ms();
  uint64_t child_compiles = 0, child_failures = 0;
  if (jobs > 1) {
    fflush(NULL);
    pid_t pids[256];
    int fds[256];
    for (int k = 0; k < jobs; k++) {
      int p[2];
      if (pipe(p) != 0) {
        rc = mj_fail(err, MJ_EIO, "moejit warmup: pipe: %s", strerror(errno));
        goto out;
      }
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        jit_set_compile_only(true); /* the parent has opened the driver where there is a GPU */
        tune_set_quiet(true);       /* the parent's pass says any warning */
        jit_set_shard(k, (int)jobs);
        mj_err ce = {0};
        int crc = 0;
        for (int r = 0; r < world && !crc; r++) o.rank = r, crc = gpu_warm(&cfg, sh, &o, target, batches, nb, NULL, NULL, &ce);
        cache_stats st; /* this child's alone: the front door is fresh here (closed after --tune) */
        jit_stats(&st);
        uint64_t r[2] = {st.v[CACHE_STAT_compiles], st.v[CACHE_STAT_failures]};
        if (write(p[1], r, sizeof r) != (ssize_t)sizeof r) crc = 1;
        if (crc && !quiet) mj_err_print(&ce, stderr);
        jit_shutdown();
        _exit(crc ? 1 : 0);
      }
      close(p[1]);
      if (pid < 0) {
        close(p[0]);
        rc = mj_fail(err, MJ_EIO, "moejit warmup: fork: %s", strerror(errno));
        jobs = k; /* reap the ones started */
        break;
      }
      pids[k] = pid, fds[k] = p[0];
    }
    int bad = 0;
    for (int k = 0; k < jobs; k++) {
      uint64_t r[2] = {0, 0};
      if (read(fds[k], r, sizeof r) == (ssize_t)sizeof r) child_compiles += r[0], child_failures += r[1];
      close(fds[k]);
      int status = 0;
      if (waitpid(pids[k], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
    }
    if (rc) goto out;
    /* A child that failed leaves its share to the parent's pass below,
     * which compiles what is missing (and fails with the reason). */
    if (bad && !quiet) mj_warn("moejit warmup: %d of %lld compile processes failed; the rest is compiled here", bad, (long long)jobs);
  }
  /* The parent's pass: with -j, every kernel should now be on disk. */
  kt_counts_reset();
  wctx w = {batches, isatty(2) != 0, quiet};
  for (int r = 0; r < world && !rc; r++) {
    o.rank = r;
    rc = gpu_warm(&cfg, sh, &o, target, batches, nb, r == world - 1 ? progress : NULL, &w, err);
  }
  cache_stats st;
  jit_stats(&st);
  double compile_s = (mj_now_ms() - t0) / 1e3;
  uint64_t compiled = st.v[CACHE_STAT_compiles] + child_compiles;
  uint64_t kernels = st.v[CACHE_STAT_disk_hits] + st.v[CACHE_STAT_compiles];
  uint64_t cached = kernels > compiled ? kernels - compiled : 0;
  uint64_t failed = st.v[CACHE_STAT_failures] + child_failures;
  if (rc) goto out;

  /* With a GPU of the target: upload and capture every size's graph. */
  double cap_ms = 0;
  int graphs = 0;
  if (capture) {
    session *S = NULL;
    sess_opts so;
    sess_opts_default(&so);
    so.backend = SESS_CUDA, so.slots = 1, so.max_ctx = ctx, so.gpu = o;
    rc = m ? sess_create(m, &so, &S, err) : sess_create_synthetic(&cfg, 1, &so, &S, err);
    if (!rc) rc = sess_capture_all(S, err);
    if (S) {
      sess_info si;
      sess_get_info(S, &si);
      cap_ms = si.counters.capture_ms, graphs = si.counters.graphs;
      sess_destroy(S);
    }
    if (rc) goto out;
  }
  if (!quiet) {
    printf("warmup: %s for %s", dir ? dir : "synthetic GLM-5", target);
    if (world > 1) printf(", %d ranks (--tp %lld --ep %lld)", world, (long long)tp, (long long)ep);
    printf(", batch sizes");
    for (int i = 0; i < nb; i++) printf("%s%d", i ? "," : " ", batches[i]);
    printf(": %llu kernels, %llu compiled, %llu already cached, %llu failed, %.1f s (-j %lld)",
           (unsigned long long)kernels, (unsigned long long)compiled, (unsigned long long)cached,
           (unsigned long long)failed, compile_s, (long long)jobs);
    if (capture) printf("; %d graphs captured in %.1f s", graphs, cap_ms / 1e3);
    else
      printf("; no graphs captured (%s)", no_graphs      ? "--no-graphs"
                                          : world > 1    ? "each rank captures its own"
                                          : gpu          ? "another target"
                                                         : "no GPU");
    printf("\n");
    /* the kernel table's families (kernels.h), as the step obtained them */
    uint64_t per[KT_N];
    kt_counts(per);
    printf("warmup: kernels by family:");
    for (int i = 0, first = 1; i < KT_N; i++)
      if (per[i]) printf("%s %s %llu", first ? "" : ",", kt_kernels[i].name, (unsigned long long)per[i]), first = 0;
    printf("\n");
  }
  /* A failed specialisation is not fatal (its generic variant stands in,
   * and jit said so); the count says it happened. */
out:
  if (m) model_free(m);
  mj_arena_free(&a);
  return rc;
}
