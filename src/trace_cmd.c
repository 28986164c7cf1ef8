/* trace_cmd.c: `moejit trace synth|check`, the command line of shape traces
 * (trace.h, docs/trace.md).
 *
 * synth writes a synthetic trace (trace_synth); check reads a trace with
 * every rule of the format and prints what it holds: steps and rows, the
 * captured sizes, the capacity buckets, how many experts saw rows and which
 * took the most.  Both refuse a bad flag with one line naming it; a bad
 * trace is the reader's one "FILE:LINE: what is wrong" line.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model.h"
#include "trace.h"

/* "zipf:S" or "uniform" -> S. */
static int parse_skew(const char *s, double *out) {
  if (strcmp(s, "uniform") == 0) return *out = 0, 0;
  if (strncmp(s, "zipf:", 5) != 0 || mj_parse_f64(s + 5, out)) return 1;
  return !(*out >= 0 && *out <= 100);
}

static int trace_cmd_synth(int argc, char **argv, mj_err *err) {
  const model_moe_cfg glm5 = model_moe_glm5(); /* the defaults: GLM-5's MoE widths */
  int64_t experts = glm5.n_experts, topk = glm5.topk, batch = 1, steps = 16, seed = 0, layers = 1,
          hidden = glm5.hidden, inter = glm5.inter;
  const char *skew = "uniform", *out = NULL;
  cli_opt opts[] = {
      {"experts", 0, CLI_INT, &experts}, {"topk", 0, CLI_INT, &topk},
      {"batch", 0, CLI_INT, &batch},     {"steps", 0, CLI_INT, &steps},
      {"skew", 0, CLI_STR, &skew},       {"seed", 0, CLI_INT, &seed},
      {"layers", 0, CLI_INT, &layers},   {"hidden", 0, CLI_INT, &hidden},
      {"inter", 0, CLI_INT, &inter},     {"output", 'o', CLI_STR, &out},
  };
  int r = cli_parse("trace synth", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  const struct { const char *flag; int64_t v, lo, hi; } f[] = {
      {"--experts", experts, 1, 65536}, {"--topk", topk, 1, experts},
      {"--batch", batch, 1, 1 << 20},   {"--steps", steps, 0, 1 << 30},
      {"--layers", layers, 1, 4093},    {"--hidden", hidden, 1, 1 << 20},
      {"--inter", inter, 1, 1 << 20},   {"--seed", seed, 0, INT64_MAX},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(f); i++)
    if (f[i].v < f[i].lo || f[i].v > f[i].hi)
      return mj_fail(err, MJ_EUSAGE, "moejit trace synth: %s must be %lld..%lld, not %lld",
                     f[i].flag, (long long)f[i].lo, (long long)f[i].hi, (long long)f[i].v);
  trace_synth_opts o = {.experts = (int)experts, .topk = (int)topk, .batch = (int)batch,
                        .steps = (int)steps, .layers = (int)layers, .seed = (uint64_t)seed,
                        .hidden = (int)hidden, .inter = (int)inter};
  if (parse_skew(skew, &o.zipf))
    return mj_fail(err, MJ_EUSAGE, "moejit trace synth: --skew expects zipf:S (S from 0 to 100) "
                                   "or uniform, not '%s'", skew);
  if (!out) return mj_fail(err, MJ_EUSAGE, "moejit trace synth: -o FILE is required");
  return trace_synth(&o, out, err);
}

/* ---- check -------------------------------------------------------------------------- */
static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static const int64_t *by_rows_base;
static int cmp_rows_desc(const void *a, const void *b) {
  int64_t x = by_rows_base[*(const int *)a], y = by_rows_base[*(const int *)b];
  if (x != y) return (x < y) - (x > y);
  return cmp_int(a, b);
}

static int cmp_key(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Distinct values of v[0..n) with their counts, as "V xN, ..." (at most 10). */
static void print_histogram(const char *label, int *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_int);
  printf("%-11s", label);
  size_t shown = 0, distinct = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && v[j] == v[i]) j++;
    if (shown++ < 10) printf("%s%d x%zu", distinct ? ", " : "", v[i], j - i);
    distinct++, i = j;
  }
  if (distinct > 10) printf(", ... (%zu distinct)", distinct);
  printf("%s\n", n ? "" : "none");
}

static int cmp_i64_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x < y) - (x > y);
}

/* How skewed routing is within a layer, averaged over the layers present:
 * the share of a layer's rows its hottest expert takes, and its top topk.
 * The entries are grouped by layer first (a counting sort), and each layer
 * touches only the experts it lists, so the cost is one pass over the
 * trace whatever the header's expert and layer counts. */
static void print_layer_skew(const trace_file *t) {
  const trace_header *h = &t->h;
  int64_t *start = mj_xcalloc((size_t)h->layers + 1, sizeof *start), n = 0;
  for (int64_t i = 0; i < t->nsteps; i++)
    for (int k = 0; k < t->steps[i].nmoe; k++) start[t->steps[i].moe[k].layer + 1]++, n++;
  for (int l = 0; l < h->layers; l++) start[l + 1] += start[l];
  const trace_moe **by_layer = mj_xmalloc((size_t)(n + 1) * sizeof *by_layer);
  int64_t *fill = mj_xmalloc((size_t)h->layers * sizeof *fill);
  memcpy(fill, start, (size_t)h->layers * sizeof *fill);
  for (int64_t i = 0; i < t->nsteps; i++)
    for (int k = 0; k < t->steps[i].nmoe; k++)
      by_layer[fill[t->steps[i].moe[k].layer]++] = &t->steps[i].moe[k];
  int64_t *acc = mj_xcalloc((size_t)h->n_experts, sizeof *acc);
  int64_t *vals = mj_xmalloc((size_t)h->n_experts * sizeof *vals);
  int32_t *touched = mj_xmalloc((size_t)h->n_experts * sizeof *touched);
  double hot = 0, top = 0;
  int nl = 0;
  for (int l = 0; l < h->layers; l++) {
    if (start[l] == start[l + 1]) continue;
    int nt = 0;
    int64_t total = 0, topk = 0;
    for (int64_t j = start[l]; j < start[l + 1]; j++)
      for (int e = 0; e < by_layer[j]->n; e++) {
        int32_t x = by_layer[j]->expert[e];
        if (!acc[x]) touched[nt++] = x;
        acc[x] += by_layer[j]->rows[e], total += by_layer[j]->rows[e];
      }
    for (int i = 0; i < nt; i++) vals[i] = acc[touched[i]], acc[touched[i]] = 0;
    qsort(vals, (size_t)nt, sizeof *vals, cmp_i64_desc);
    for (int i = 0; i < MJ_MIN(nt, h->topk); i++) topk += vals[i];
    hot += (double)vals[0] / (double)total, top += (double)topk / (double)total, nl++;
  }
  if (nl)
    printf("skew       in a layer, the hottest expert takes %.1f%% of the rows and the top %d "
           "take %.1f%% (uniform: %.1f%% and %.1f%%)\n", 100 * hot / nl, h->topk, 100 * top / nl,
           100.0 / h->n_experts, 100.0 * h->topk / h->n_experts);
  free(touched), free(vals), free(acc), free(fill), free(by_layer), free(start);
}

static void trace_summary(const char *path, const trace_file *t) {
  const trace_header *h = &t->h;
  int64_t rows = 0, layer_steps = 0, eager = 0, kernels = 0;
  int min_rows = 0, max_rows = 0;
  for (int64_t i = 0; i < t->nsteps; i++) {
    const trace_step *s = &t->steps[i];
    rows += s->rows, layer_steps += s->nmoe, eager += s->captured == 0;
    min_rows = i ? MJ_MIN(min_rows, s->rows) : s->rows;
    max_rows = i ? MJ_MAX(max_rows, s->rows) : s->rows;
    for (int k = 0; k < s->nmoe; k++) kernels += s->moe[k].nkernels;
  }
  int *buckets = mj_xmalloc((size_t)(layer_steps + 1) * sizeof *buckets);
  int *captured = mj_xmalloc((size_t)(t->nsteps + 1) * sizeof *captured);
  const char **keys = mj_xmalloc((size_t)(kernels + 1) * sizeof *keys);
  int64_t *per_expert = mj_xcalloc((size_t)h->n_experts, sizeof *per_expert), expert_rows = 0;
  size_t nb = 0, nc = 0, nk = 0;
  for (int64_t i = 0; i < t->nsteps; i++) {
    const trace_step *s = &t->steps[i];
    if (s->captured) captured[nc++] = s->captured;
    for (int k = 0; k < s->nmoe; k++) {
      const trace_moe *m = &s->moe[k];
      buckets[nb++] = m->bucket;
      for (int e = 0; e < m->n; e++) per_expert[m->expert[e]] += m->rows[e], expert_rows += m->rows[e];
      for (int j = 0; j < m->nkernels; j++) keys[nk++] = m->kernels[j];
    }
  }
  printf("%s: moejit trace version %d, written by moejit %s\n", path, h->version,
         h->moejit_version);
  printf("model      %s (%d layers; MoE hidden %d, inter %d, %d experts, top-%d, groups %d/%d)\n",
         h->model, h->layers, h->hidden, h->inter, h->n_experts, h->topk, h->n_group,
         h->topk_group);
  printf("device     %s%s%s\n", *h->device ? h->device : "none", *h->arch ? ", " : "", h->arch);
  printf("steps      %lld, %lld rows (%d..%d a step), %lld MoE layer-steps\n",
         (long long)t->nsteps, (long long)rows, min_rows, max_rows, (long long)layer_steps);
  printf("eager      %lld steps\n", (long long)eager);
  print_histogram("captured", captured, nc);
  print_histogram("buckets", buckets, nb);
  int *order = mj_xmalloc((size_t)h->n_experts * sizeof *order), used = 0;
  for (int e = 0; e < h->n_experts; e++) order[e] = e, used += per_expert[e] > 0;
  by_rows_base = per_expert;
  qsort(order, (size_t)h->n_experts, sizeof *order, cmp_rows_desc);
  printf("experts    %d of %d had rows in some layer\n", used, h->n_experts);
  print_layer_skew(t);
  printf("top        (all layers) ");
  for (int i = 0; i < MJ_MIN(used, 8); i++)
    printf("%s%d: %lld (%.1f%%)", i ? ", " : "", order[i], (long long)per_expert[order[i]],
           100.0 * (double)per_expert[order[i]] / (double)expert_rows);
  printf("%s\n", used ? "" : "none");
  qsort(keys, nk, sizeof *keys, cmp_key);
  size_t distinct = 0;
  for (size_t i = 0; i < nk; i++) distinct += i == 0 || strcmp(keys[i], keys[i - 1]) != 0;
  printf("kernels    %zu distinct (%zu uses)\n", distinct, nk);
  free(order), free(per_expert), free(keys), free(captured), free(buckets);
}

/* Expert parallelism over M ranks (docs/multigpu.md: rank r owns experts
 * r*E/M .. (r+1)*E/M - 1): in each MoE layer-step, the experts with rows
 * and the rows each rank runs.  Every layer ends in an all-reduce, so the
 * busiest rank sets the layer's time: the ratio max over mean says how
 * much slower than a perfect spread that is. */
static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void print_rank_balance(const trace_file *t, int M) {
  const trace_header *h = &t->h;
  int64_t n = 0;
  for (int64_t i = 0; i < t->nsteps; i++) n += t->steps[i].nmoe;
  if (!n) {
    printf("ranks      --ep %d: no MoE layer-steps\n", M);
    return;
  }
  double *re = mj_xmalloc((size_t)n * sizeof *re), *rr = mj_xmalloc((size_t)n * sizeof *rr);
  int64_t *ex = mj_xmalloc((size_t)M * sizeof *ex), *rw = mj_xmalloc((size_t)M * sizeof *rw), idle = 0, k = 0;
  double se = 0, sr = 0;
  for (int64_t i = 0; i < t->nsteps; i++)
    for (int j = 0; j < t->steps[i].nmoe; j++) {
      const trace_moe *m = &t->steps[i].moe[j];
      memset(ex, 0, (size_t)M * sizeof *ex), memset(rw, 0, (size_t)M * sizeof *rw);
      int64_t te = 0, tr = 0, me = 0, mr = 0;
      for (int e = 0; e < m->n; e++) {
        int r = (int)((int64_t)m->expert[e] * M / h->n_experts);
        ex[r]++, rw[r] += m->rows[e], te++, tr += m->rows[e];
      }
      for (int r = 0; r < M; r++) me = MJ_MAX(me, ex[r]), mr = MJ_MAX(mr, rw[r]), idle += ex[r] == 0;
      re[k] = te ? (double)me * M / (double)te : 1.0, rr[k] = tr ? (double)mr * M / (double)tr : 1.0;
      se += re[k], sr += rr[k], k++;
    }
  qsort(re, (size_t)n, sizeof *re, cmp_dbl), qsort(rr, (size_t)n, sizeof *rr, cmp_dbl);
  size_t p90 = (size_t)((double)(n - 1) * 0.9);
  printf("ranks      --ep %d (%d experts a rank): in a MoE layer-step the busiest rank runs %.2fx the mean of experts "
         "(median %.2fx, p90 %.2fx, worst %.2fx) and %.2fx the mean of rows (median %.2fx, p90 %.2fx, worst %.2fx); "
         "%.1f%% of rank-layer-steps have no expert\n",
         M, h->n_experts / M, se / (double)n, re[(n - 1) / 2], re[p90], re[n - 1], sr / (double)n, rr[(n - 1) / 2], rr[p90],
         rr[n - 1], 100.0 * (double)idle / ((double)n * M));
  free(re), free(rr), free(ex), free(rw);
}

static int trace_cmd_check(int argc, char **argv, mj_err *err) {
  cli_list pos = {0};
  int64_t ep = 1;
  cli_opt opts[] = {{"ep", 0, CLI_INT, &ep}};
  int r = cli_parse("trace check", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), &pos, err);
  const char *path = pos.n == 1 ? pos.v[0] : NULL;
  int npos = pos.n;
  free(pos.v);
  if (r) return r < 0 ? 0 : r;
  if (npos != 1) return mj_fail(err, MJ_EUSAGE, "moejit trace check: expected one trace file");
  if (ep < 1 || ep > 1024) return mj_fail(err, MJ_EUSAGE, "moejit trace check: --ep must be 1..1024, not %lld", (long long)ep);
  trace_file *t;
  if (trace_read(path, &t, err)) return err->code;
  if (ep > 1 && t->h.n_experts % ep) {
    r = mj_fail(err, MJ_EUSAGE, "moejit trace check: --ep %lld does not divide the trace's %d experts", (long long)ep,
                t->h.n_experts);
    trace_free(t);
    return r;
  }
  trace_summary(path, t);
  if (ep > 1) print_rank_balance(t, (int)ep);
  trace_free(t);
  return 0;
}

int cmd_trace(int argc, char **argv, mj_err *err) {
  if (argc >= 2 && strcmp(argv[1], "synth") == 0) return trace_cmd_synth(argc - 1, argv + 1, err);
  if (argc >= 2 && strcmp(argv[1], "check") == 0) return trace_cmd_check(argc - 1, argv + 1, err);
  if (argc < 2) return mj_fail(err, MJ_EUSAGE, "moejit trace: name an action: synth or check");
  if (argv[1][0] != '-')
    return mj_fail(err, MJ_EUSAGE, "moejit trace: unknown action '%s' (synth or check)", argv[1]);
  int r = cli_parse("trace", argc, argv, NULL, 0, NULL, err); /* --help, or a bad option */
  if (r) return r < 0 ? 0 : r;
  return mj_fail(err, MJ_EUSAGE, "moejit trace: name an action: synth or check");
}
