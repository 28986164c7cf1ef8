/* model_cmd.c: the commands of the model module, `moejit info`,
 * `moejit mkmodel` and `moejit forward`.
 *
 * They are linked into the program only (not libmoejit.a), because they use
 * the CLI's option parser (cli.c); the work itself is in model.c,
 * mkmodel.c and cpu_forward.c / gpu_model.c, where tests call it directly.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "gpu_model.h"
#include "cpu_forward.h"
#include "mkmodel.h"
#include "model.h"
#include "nccldrv.h"
#include "shard.h"

/* This process's bytes read from storage so far (/proc/self/io
 * read_bytes: page-cache hits do not count); -1 when unknown. */
static int64_t storage_read_bytes(void) {
  FILE *f = fopen("/proc/self/io", "r");
  char line[128];
  long long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "read_bytes: %lld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

/* --read: drop the checkpoint's files from the page cache, then read the
 * rank's share as its upload will, and say how much came from storage:
 * a rank must read its share of the checkpoint, not all of it. */
static void read_share(const model *m, const shard_plan *p, uint64_t share) {
  for (int i = 0; i < m->st.nfiles; i++) {
    posix_fadvise(m->st.files[i].fd, 0, 0, POSIX_FADV_DONTNEED);
    madvise(m->st.files[i].map, m->st.files[i].size, MADV_RANDOM); /* no readahead around what is read */
  }
  int64_t r0 = storage_read_bytes();
  double t0 = mj_now_ms();
  uint64_t sum = 0, n = shard_rank_read(m, p, &sum);
  double ms = mj_now_ms() - t0;
  int64_t r1 = storage_read_bytes();
  char b1[32], b2[32], b3[32];
  printf("read       rank %d of %d: %s of the checkpoint's %s (%.1f%%; its share %s) in %.1f s, ", p->rank, p->world,
         mj_fmt_bytes((double)n, b1, sizeof b1), mj_fmt_bytes((double)m->bytes_total, b2, sizeof b2),
         100.0 * (double)n / (double)m->bytes_total, mj_fmt_bytes((double)share, b3, sizeof b3), ms / 1e3);
  if (r0 >= 0 && r1 >= r0)
    printf("%s from storage (/proc/self/io; checksum %016llx)\n", mj_fmt_bytes((double)(r1 - r0), b1, sizeof b1),
           (unsigned long long)sum);
  else
    printf("storage reads unknown (no /proc/self/io)\n");
}

/* Bytes kept back on each GPU for what the engine does not allocate itself:
 * the CUDA context, loaded cubins, NCCL's buffers (an allowance, not a
 * measurement). */
#define FIT_RESERVE_GB 3.0

/* `moejit info --preset glm5 [--layers N] --tp N --ep M`: will the model
 * fit, from the config alone (no weights): the engine's own device layout
 * of a rank's share (gpu_footprint_of), the KV cache a token takes, and
 * the tokens of context the rest of the GPU holds. */
static int info_fit(const char *preset, int64_t layers, int64_t dense, int64_t tp, int64_t ep, int64_t rank,
                    double gpu_gb, mj_err *err) {
  if (strcmp(preset, "glm5") != 0)
    return mj_fail(err, MJ_EUSAGE, "moejit info: --preset knows only glm5 (give -m DIR for another model)");
  if (layers < 1 || layers > 1000 || dense < 0 || dense > layers)
    return mj_fail(err, MJ_EUSAGE, "moejit info: --layers 1..1000 and 0 <= --dense <= --layers");
  if (!(gpu_gb > 0 && gpu_gb < 1e6)) return mj_fail(err, MJ_EUSAGE, "moejit info: --gpu-mem wants GB, more than 0");
  mj_arena a;
  mj_arena_init(&a, 4096);
  model_config c;
  model_config_glm5(&c, layers, dense, &a);
  gpu_opts o;
  gpu_opts_default(&o);
  o.slots = 1, o.max_ctx = 1; /* the caches are counted per token below */
  o.tp = (int)tp, o.ep = (int)ep, o.rank = (int)rank;
  /* GLM-5-NVFP4's layout: routed experts NVFP4, the shared expert and everything else bf16 */
  int sh = (int)(c.moe_intermediate_size * c.n_shared_experts);
  gpu_footprint f;
  int r = gpu_footprint_of(&c, sh, &o, &f, err);
  if (r) {
    mj_arena_free(&a);
    return r;
  }
  int world = (int)(tp > ep ? tp : ep), nidx = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; l++) nidx += c.layer_indexer_full[l];
  double mem = gpu_gb * 1e9, left = mem - (double)f.weights - (double)f.acts - FIT_RESERVE_GB * 1e9;
  char b1[32], b2[32];
  printf("model      GLM-5 (the glm5 preset: %lld layers, %lld dense), routed experts NVFP4, the rest bf16\n",
         (long long)layers, (long long)dense);
  printf("split      --tp %lld --ep %lld: rank %lld of %d, on a GPU of %.0f GB (--gpu-mem; H200: 141)\n", (long long)tp,
         (long long)ep, (long long)rank, world, gpu_gb);
  printf("weights    %.1f GB a GPU (%s; the engine's device layout of the rank's share)\n", (double)f.weights / 1e9,
         mj_fmt_bytes((double)f.weights, b1, sizeof b1));
  printf("kv cache   %zu bytes a token a GPU: the MLA latent and rope key (%lld x bf16) in %lld layers, the indexer "
         "key (%lld x f32) in %d; whole on every rank\n",
         f.kv_per_token, (long long)(c.kv_lora_rank + c.qk_rope_head_dim), (long long)c.num_hidden_layers,
         (long long)c.index_head_dim, nidx);
  printf("other      %s of activations and scratch (%d rows a step) + %.0f GB kept back for the CUDA context, kernels "
         "and NCCL (an allowance, not measured)\n",
         mj_fmt_bytes((double)f.acts, b2, sizeof b2), f.rows, FIT_RESERVE_GB);
  if (left <= 0)
    printf("context    does not fit: the weights alone take %.1f GB of %.0f GB\n", (double)f.weights / 1e9, gpu_gb);
  else
    printf("context    %.0f tokens fit a GPU, summed over the sequences (%.1f sequences of 8k tokens, %.1f of 128k)\n",
           left / (double)f.kv_per_token, left / (double)f.kv_per_token / 8192, left / (double)f.kv_per_token / 131072);
  mj_arena_free(&a);
  return 0;
}

int cmd_info(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *preset = NULL;
  bool as_json = false;
  int64_t tp = 1, ep = 1, rank = 0, layers = -1, dense = -1; /* -1: not given */
  double gpu_gb = -1;
  bool do_read = false;
  cli_opt opts[] = {{"model", 'm', CLI_STR, &dir}, {"json", 0, CLI_FLAG, &as_json}, {"tp", 0, CLI_INT, &tp},
                    {"ep", 0, CLI_INT, &ep}, {"rank", 0, CLI_INT, &rank}, {"read", 0, CLI_FLAG, &do_read},
                    {"preset", 0, CLI_STR, &preset}, {"layers", 0, CLI_INT, &layers}, {"dense", 0, CLI_INT, &dense},
                    {"gpu-mem", 0, CLI_NUM, &gpu_gb}};
  int r = cli_parse("info", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  if (dir && preset) return mj_fail(err, MJ_EUSAGE, "moejit info: give -m DIR or --preset glm5, not both");
  if (!preset && (layers != -1 || dense != -1 || gpu_gb != -1))
    return mj_fail(err, MJ_EUSAGE, "moejit info: --layers, --dense and --gpu-mem go with --preset glm5");
  if (!dir && !preset) return mj_fail(err, MJ_EUSAGE, "moejit info: -m DIR (or --preset glm5) is required");
  int world;
  if ((r = nc_parallel_check("info", tp, ep, &world, err))) return r;
  if (preset) {
    if (as_json || do_read) return mj_fail(err, MJ_EUSAGE, "moejit info: --preset reports in text, without --json or --read");
    if (rank < 0 || rank >= world)
      return mj_fail(err, MJ_EUSAGE, "moejit info: --rank %lld is not one of the %d ranks", (long long)rank, world);
    return info_fit(preset, layers == -1 ? 78 : layers, dense == -1 ? 3 : dense, tp, ep, rank, gpu_gb == -1 ? 141 : gpu_gb,
                    err);
  }
  if (do_read && as_json) return mj_fail(err, MJ_EUSAGE, "moejit info: --read reports in text; drop --json");
  if (rank < 0 || rank >= world)
    return mj_fail(err, MJ_EUSAGE, "moejit info: --rank %lld is not one of the %d ranks of --tp %lld --ep %lld",
                   (long long)rank, world, (long long)tp, (long long)ep);
  model *m;
  if ((r = model_load(dir, &m, err))) return r;
  /* --tp/--ep: the weight bytes each rank would hold (shard.h). */
  uint64_t rank_shards = 0, rank_whole = 0;
  shard_plan read_plan;
  if (world > 1) {
    shard_plan p;
    mj_err pe = {0};
    if ((r = shard_plan_make(&m->cfg, (int)rank, (int)tp, (int)ep, &p, &pe))) {
      mj_fail(err, pe.code, "moejit info: %s: %s", dir, pe.msg);
      mj_err_clear(&pe);
      model_free(m);
      return r;
    }
    shard_rank_bytes(m, &p, &rank_shards, &rank_whole);
    read_plan = p;
  } else if (do_read && (r = shard_plan_make(&m->cfg, 0, 1, 1, &read_plan, err))) {
    model_free(m);
    return r;
  }
  const model_config *c = &m->cfg;
  int64_t nsparse = 0, nfull = 0;
  for (int64_t L = 0; L < c->num_hidden_layers; L++) nsparse += c->layer_sparse[L], nfull += c->layer_indexer_full[L];
  double gbs = (double)m->bytes_total / (m->load_ms * 1e6);
  /* Whether the GPU decode engine's kernels take this model (no GPU needed). */
  mj_err ge = {0};
  bool gpu_ok = gpu_model_supports(m, &ge) == 0;
  if (as_json) {
    printf("{\"layers\":%lld,\"dense_layers\":%lld,\"moe_layers\":%lld,\"hidden_size\":%lld,\"vocab_size\":%lld,"
           "\"heads\":%lld,\"n_routed_experts\":%lld,\"num_experts_per_tok\":%lld,\"n_shared_experts\":%lld,"
           "\"index_topk\":%lld,\"indexer_full_layers\":%lld,\"quant_algo\":%s%s%s,\"nvfp4_linears\":%zu,"
           "\"plain_linears\":%zu,\"files\":%d,\"tensors\":%zu,\"skipped_tensors\":%zu,\"bytes\":%llu,"
           "\"bytes_bf16\":%llu,\"bytes_f32\":%llu,\"bytes_nvfp4\":%llu,\"load_ms\":%.3f,\"gpu_backend\":%s}\n",
           (long long)c->num_hidden_layers, (long long)(c->num_hidden_layers - nsparse), (long long)nsparse,
           (long long)c->hidden_size, (long long)c->vocab_size, (long long)c->num_attention_heads,
           (long long)c->n_routed_experts, (long long)c->num_experts_per_tok, (long long)c->n_shared_experts,
           (long long)c->index_topk, (long long)nfull, c->quant_algo ? "\"" : "", c->quant_algo ? c->quant_algo : "null",
           c->quant_algo ? "\"" : "", m->n_nvfp4_linears, m->n_plain_linears, m->st.nfiles, m->n_tensors,
           m->n_skipped, (unsigned long long)m->bytes_total, (unsigned long long)m->bytes_bf16,
           (unsigned long long)m->bytes_f32, (unsigned long long)m->bytes_nvfp4, m->load_ms, gpu_ok ? "true" : "false");
  } else {
    char b1[32], b2[32], b3[32], b4[32];
    printf("model      %s\n", dir);
    printf("layers     %lld (%lld dense, %lld MoE), hidden %lld, vocab %lld\n", (long long)c->num_hidden_layers,
           (long long)(c->num_hidden_layers - nsparse), (long long)nsparse, (long long)c->hidden_size,
           (long long)c->vocab_size);
    printf("attention  MLA %lld heads, q_lora %lld, kv_lora %lld, qk %lld+%lld, v %lld, rope theta %g (%s)\n",
           (long long)c->num_attention_heads, (long long)c->q_lora_rank, (long long)c->kv_lora_rank,
           (long long)c->qk_nope_head_dim, (long long)c->qk_rope_head_dim, (long long)c->v_head_dim, c->rope_theta,
           c->rope_type);
    printf("indexer    %lld heads x %lld, top-k %lld, %lld full / %lld shared layers\n", (long long)c->index_n_heads,
           (long long)c->index_head_dim, (long long)c->index_topk, (long long)nfull,
           (long long)(c->num_hidden_layers - nfull));
    printf("moe        %lld routed experts, top %lld (groups %lld, keep %lld), %lld shared, intermediate %lld, "
           "dense intermediate %lld, scaling %g\n",
           (long long)c->n_routed_experts, (long long)c->num_experts_per_tok, (long long)c->n_group,
           (long long)c->topk_group, (long long)c->n_shared_experts, (long long)c->moe_intermediate_size,
           (long long)c->intermediate_size, c->routed_scaling_factor);
    printf("quant      %s%s%s%s: %zu NVFP4 linears, %zu plain\n", c->quant_algo ? c->quant_algo : "none",
           c->quant_source ? " (" : "", c->quant_source ? c->quant_source : "", c->quant_source ? ")" : "",
           m->n_nvfp4_linears, m->n_plain_linears);
    printf("files      %d safetensors file%s, %zu tensors", m->st.nfiles, m->st.nfiles == 1 ? "" : "s",
           m->n_tensors);
    if (m->n_skipped) printf(" (%zu of the MTP layer skipped)", m->n_skipped);
    printf("\nbytes      %s (bf16 %s, f32 %s, nvfp4 %s)\n", mj_fmt_bytes((double)m->bytes_total, b1, sizeof b1),
           mj_fmt_bytes((double)m->bytes_bf16, b2, sizeof b2), mj_fmt_bytes((double)m->bytes_f32, b3, sizeof b3),
           mj_fmt_bytes((double)m->bytes_nvfp4, b4, sizeof b4));
    printf("load       %.2f ms (%.1f GB/s)\n", m->load_ms, gbs);
    if (gpu_ok) printf("gpu        the GPU decode engine takes this model\n");
    else printf("gpu        the GPU decode engine does not take it: %s\n", strchr(ge.msg, ':') ? strchr(ge.msg, ':') + 2 : ge.msg);
    if (world > 1)
      printf("ranks      %d (--tp %lld --ep %lld): %s of weights a rank (%s its shards, %s on every rank)\n", world,
             (long long)tp, (long long)ep, mj_fmt_bytes((double)(rank_shards + rank_whole), b1, sizeof b1),
             mj_fmt_bytes((double)rank_shards, b2, sizeof b2), mj_fmt_bytes((double)rank_whole, b3, sizeof b3));
    if (do_read) read_share(m, &read_plan, world > 1 ? rank_shards + rank_whole : m->bytes_total);
  }
  mj_err_clear(&ge);
  model_free(m);
  return 0;
}

int cmd_mkmodel(int argc, char **argv, mj_err *err) {
  const char *preset = NULL, *out = NULL, *itypes = NULL, *cfgpath = NULL;
  /* UNSET: the option was not given (the preset's value stays); any value
   * given, negative ones included, is checked by mkmodel_write. */
  const int64_t UNSET = INT64_MIN;
  int64_t layers = UNSET, dense = UNSET, experts = UNSET, per_tok = UNSET, n_group = UNSET,
          topk_group = UNSET, shared = UNSET;
  int64_t itopk = UNSET, vocab = UNSET, seed = 1, shard = 0, merges = UNSET, threads = 0;
  bool nvfp4 = false, force = false, quiet = false;
  cli_opt opts[] = {
      {"preset", 0, CLI_STR, &preset},        {"layers", 0, CLI_INT, &layers},
      {"dense-layers", 0, CLI_INT, &dense},   {"experts", 0, CLI_INT, &experts},
      {"experts-per-tok", 0, CLI_INT, &per_tok}, {"n-group", 0, CLI_INT, &n_group},
      {"topk-group", 0, CLI_INT, &topk_group}, {"shared-experts", 0, CLI_INT, &shared},
      {"index-topk", 0, CLI_INT, &itopk},     {"indexer-types", 0, CLI_STR, &itypes},
      {"vocab", 0, CLI_INT, &vocab},          {"merges", 0, CLI_INT, &merges},
      {"seed", 0, CLI_INT, &seed},            {"nvfp4", 0, CLI_FLAG, &nvfp4},
      {"shard-size", 0, CLI_INT, &shard},     {"out", 'o', CLI_STR, &out},
      {"force", 0, CLI_FLAG, &force},         {"quiet", 'q', CLI_FLAG, &quiet},
      {"threads", 0, CLI_INT, &threads},      {"config", 0, CLI_STR, &cfgpath},
  };
  int r = cli_parse("mkmodel", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  if (!out) return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: --out DIR is required");
  mkmodel_spec s;
  mj_arena ca;
  mj_arena_init(&ca, 1 << 14);
  char *ctext = NULL;
  if (cfgpath) {
    /* Weights for a given config.json (transformers' own, say): the file
     * decides every width, so the width options and presets are refused. */
    if (preset || layers != UNSET || dense != UNSET || experts != UNSET || per_tok != UNSET || n_group != UNSET ||
        topk_group != UNSET || shared != UNSET || itopk != UNSET || vocab != UNSET || itypes) {
      mj_arena_free(&ca);
      return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: --config %s sets every width: drop --preset and the width options",
                     cfgpath);
    }
    size_t len;
    model_config c;
    if ((r = mj_read_file(cfgpath, &ctext, &len, err)) || (r = model_config_parse(&ca, ctext, len, cfgpath, &c, err)) ||
        (r = mkmodel_spec_from_config(&c, &ca, &s, err))) {
      free(ctext);
      mj_arena_free(&ca);
      return r;
    }
    s.config_text = ctext;
  } else {
    if (!preset) preset = "tiny";
    if (mkmodel_preset(preset, &s)) {
      mj_arena_free(&ca);
      return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: unknown preset '%s' (tiny, small, medium or glm5)", preset);
    }
  }
  if (threads < 0 || threads > CLI_MAX_THREADS) {
    free(ctext);
    mj_arena_free(&ca);
    return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: --threads must be 0 (all cores, up to 8) to %d", CLI_MAX_THREADS);
  }
  if (layers != UNSET) {
    s.layers = layers;
    if (dense == UNSET && s.dense_layers > layers) s.dense_layers = layers > 0 ? layers : 0;
  }
  if (dense != UNSET) s.dense_layers = dense;
  if (experts != UNSET) s.experts = experts;
  if (per_tok != UNSET) s.per_tok = per_tok;
  if (n_group != UNSET) s.n_group = n_group;
  if (topk_group != UNSET) s.topk_group = topk_group;
  if (shared != UNSET) s.shared = shared;
  if (itopk != UNSET) s.idx_topk = itopk;
  if (vocab != UNSET) s.vocab = vocab;
  if (merges != UNSET) s.merges = merges;
  if (itypes) s.indexer_types = itypes;
  s.seed = (uint64_t)seed;
  s.nvfp4 = nvfp4;
  s.shard_size = shard;
  /* Generation threads: all cores by default (up to 8); the bytes written
   * do not depend on the count. */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  s.threads = threads > 0 ? threads : ncpu > 8 ? 8 : ncpu > 0 ? ncpu : 1;
  double t0 = mj_now_ms();
  uint64_t bytes = 0;
  r = mkmodel_write(&s, out, force, &bytes, err);
  free(ctext);
  mj_arena_free(&ca);
  if (r) return r;
  if (!quiet) {
    char hb[32];
    double ms = mj_now_ms() - t0;
    printf("wrote %s: %s%s, %lld layers, %lld experts%s, %s of safetensors in %.1f s (%.2f GB/s)\n", out, cfgpath ? cfgpath : preset,
           cfgpath ? "" : " preset", (long long)s.layers, (long long)s.experts, s.nvfp4 ? " (NVFP4)" : "",
           mj_fmt_bytes((double)bytes, hb, sizeof hb), ms / 1000, (double)bytes / (ms * 1e6));
  }
  return 0;
}

/* ---- moejit forward ------------------------------------------------------------------ */
/* A fidelity tool: run ids through the CPU reference or the GPU engine,
 * greedy, and optionally keep every row's logits (the prompt's positions,
 * then each decode step) for comparison with another implementation, such
 * as transformers (tests/fidelity/sweep.py).  --feed makes the decode steps
 * take the given ids (another engine's greedy tokens) instead of their own
 * argmax, so two engines are compared on one history. */
typedef struct fwd_engine {
  cpu_model *cm;
  gpu_model *gm;
  const model_config *c;
  FILE *choices; /* --choices: the GPU's discrete choices, a JSON line per row */
  int32_t *routing, *sel; /* scratch for them */
} fwd_engine;

/* One JSON line for row `row` of the last GPU step, at position pos: the
 * experts of every MoE layer, and the DSA selection of every layer with its
 * own indexer once more than index_topk keys are visible. */
static int fwd_choices(fwd_engine *e, int row, int64_t pos, mj_err *err) {
  int L = gpu_layers(e->gm), max = gpu_max_rows(e->gm), K = (int)e->c->num_experts_per_tok;
  int KS = (int)e->c->index_topk;
  fprintf(e->choices, "{\"pos\":%lld,\"route\":[", (long long)pos);
  for (int l = 0, first = 1; l < L; l++) {
    if (!gpu_layer_sparse(e->gm, l)) continue;
    fprintf(e->choices, "%s[%d", first ? "" : ",", l), first = 0;
    for (int k = 0; k < K; k++) fprintf(e->choices, ",%d", e->routing[((size_t)l * max + row) * K + k]);
    fputc(']', e->choices);
  }
  fputs("],\"sel\":[", e->choices);
  for (int l = 0, first = 1; l < L && pos + 1 > KS; l++) {
    if (!gpu_layer_indexer(e->gm, l)) continue;
    int r = gpu_read_sel(e->gm, l, row, e->sel, err);
    if (r) return r;
    fprintf(e->choices, "%s[%d", first ? "" : ",", l), first = 0;
    for (int k = 0; k < KS; k++) fprintf(e->choices, ",%d", e->sel[k]);
    fputc(']', e->choices);
  }
  fputs("]}\n", e->choices);
  return 0;
}

/* Rows tok[0..n) at positions pos..: logits of every row into lg[n][V]. */
static int fwd_run(fwd_engine *e, const int32_t *tok, int64_t n, int64_t pos, float *lg, int64_t V, mj_err *err) {
  if (e->cm) return cpu_forward(e->cm, tok, n, pos, lg, true, err);
  enum { CHUNK = 1024 };
  int max = MJ_MIN(gpu_max_rows(e->gm), CHUNK), k;
  int32_t slot[CHUNK], p[CHUNK], out[CHUNK];
  for (int64_t i0 = 0; i0 < n; i0 += k) {
    k = (int)MJ_MIN(n - i0, (int64_t)max);
    for (int i = 0; i < k; i++) slot[i] = 0, p[i] = (int32_t)(pos + i0 + i);
    int r = gpu_step(e->gm, tok + i0, slot, p, k, out, lg + i0 * V, err);
    if (!r && e->choices) r = gpu_read_routing(e->gm, e->routing, err);
    for (int i = 0; !r && e->choices && i < k; i++) r = fwd_choices(e, i, pos + i0 + i, err);
    if (r) return r;
  }
  return 0;
}

int cmd_forward(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *toks = NULL, *feed_s = NULL, *logits_path = NULL, *backend = "cpu", *choices = NULL;
  int64_t steps = -1, threads = 2;
  bool absorbed = false;
  cli_opt opts[] = {{"model", 'm', CLI_STR, &dir},      {"tokens", 't', CLI_STR, &toks},
                    {"steps", 0, CLI_INT, &steps},       {"threads", 0, CLI_INT, &threads},
                    {"absorbed", 0, CLI_FLAG, &absorbed}, {"feed", 0, CLI_STR, &feed_s},
                    {"logits", 0, CLI_STR, &logits_path}, {"backend", 0, CLI_STR, &backend},
                    {"choices", 0, CLI_STR, &choices}};
  int r = cli_parse("forward", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  if (!dir || !toks) return mj_fail(err, MJ_EUSAGE, "moejit forward: -m DIR and --tokens ID,ID,... are required");
  if (strcmp(backend, "cpu") && strcmp(backend, "cuda"))
    return mj_fail(err, MJ_EUSAGE, "moejit forward: --backend must be cpu or cuda, not '%s'", backend);
  if (threads < 1 || threads > CLI_MAX_THREADS)
    return mj_fail(err, MJ_EUSAGE, "moejit forward: --threads must be 1..%d", CLI_MAX_THREADS);
  if (choices && strcmp(backend, "cuda"))
    return mj_fail(err, MJ_EUSAGE, "moejit forward: --choices records the GPU engine's choices: add --backend cuda");
  static int64_t ids[4096], feed[4096];
  int n = mj_parse_i64_list(toks, ids, 4096), nf = 0;
  if (n < 1) return mj_fail(err, MJ_EUSAGE, "moejit forward: --tokens must be a comma-separated list of ids");
  if (feed_s && (nf = mj_parse_i64_list(feed_s, feed, 4096)) < 1)
    return mj_fail(err, MJ_EUSAGE, "moejit forward: --feed must be a comma-separated list of ids");
  if (steps < 0) steps = nf; /* --feed alone: one step per fed id */
  if (steps > 100000) return mj_fail(err, MJ_EUSAGE, "moejit forward: --steps must be 0..100000");
  if (nf && nf < steps)
    return mj_fail(err, MJ_EUSAGE, "moejit forward: --feed has %d ids for %lld steps", nf, (long long)steps);
  model *m;
  if ((r = model_load(dir, &m, err))) return r;
  int64_t V = m->cfg.vocab_size;
  for (int i = 0; i < n + nf; i++) {
    int64_t id = i < n ? ids[i] : feed[i - n];
    if (id < 0 || id >= V) {
      r = mj_fail(err, MJ_EUSAGE, "moejit forward: --%s: id %lld is outside the vocabulary of %s (0..%lld)",
                  i < n ? "tokens" : "feed", (long long)id, dir, (long long)V - 1);
      model_free(m);
      return r;
    }
  }
  fwd_engine e = {0};
  FILE *lf = NULL;
  int32_t *tok = mj_xmalloc((size_t)(n + steps + 1) * sizeof *tok);
  float *logits = mj_xmalloc((size_t)n * V * sizeof *logits);
  for (int i = 0; i < n; i++) tok[i] = (int32_t)ids[i];
  if (strcmp(backend, "cuda") == 0) {
    gpu_opts go;
    gpu_opts_default(&go);
    go.slots = 1, go.max_ctx = n + steps + 1, go.quiet = true, go.trace = choices != NULL;
    go.sampling.temperature = 0;
    if ((r = gpu_model_supports(m, err)) || (r = gpu_model_create(m, &go, &e.gm, err))) goto out;
    if (choices) {
      e.c = &m->cfg;
      e.routing = mj_xmalloc((size_t)gpu_layers(e.gm) * gpu_max_rows(e.gm) * m->cfg.num_experts_per_tok * 4);
      e.sel = mj_xmalloc((size_t)m->cfg.index_topk * 4);
      if (!(e.choices = fopen(choices, "w"))) {
        r = mj_fail(err, MJ_EIO, "moejit forward: %s: cannot create: %s", choices, strerror(errno));
        goto out;
      }
    }
  } else {
    cpu_params p = {.max_ctx = n + steps + 1, .threads = (int)threads, .absorbed = absorbed};
    if ((r = cpu_model_create(m, &p, &e.cm, err))) goto out;
  }
  if (logits_path && !(lf = fopen(logits_path, "wb"))) {
    r = mj_fail(err, MJ_EIO, "moejit forward: %s: cannot create: %s", logits_path, strerror(errno));
    goto out;
  }
  double t0 = mj_now_ms();
  if ((r = fwd_run(&e, tok, n, 0, logits, V, err))) goto out;
  printf("prefill  %d tokens in %.1f ms (%s)\n", n, mj_now_ms() - t0, backend);
  const float *last = logits + (int64_t)(n - 1) * V;
  if (lf && fwrite(logits, sizeof *logits, (size_t)n * V, lf) != (size_t)n * V) goto write_fail;
  for (int64_t k = 0; k <= steps; k++) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
      if (last[i] > last[best]) best = i;
    tok[n + k] = (int32_t)(nf ? feed[k < nf ? k : nf - 1] : best);
    printf("token    %lld (logit %.4f)\n", (long long)best, last[best]);
    if (k == steps) break;
    double ts = mj_now_ms();
    if ((r = fwd_run(&e, tok + n + k, 1, n + k, logits, V, err))) goto out;
    last = logits;
    if (lf && fwrite(logits, sizeof *logits, (size_t)V, lf) != (size_t)V) goto write_fail;
    printf("decode   step %lld in %.1f ms\n", (long long)k + 1, mj_now_ms() - ts);
  }
  if (lf && fclose(lf) != 0) {
    lf = NULL;
    goto write_fail;
  }
  lf = NULL;
  goto out;
write_fail:
  r = mj_fail(err, MJ_EIO, "moejit forward: %s: write failed: %s", logits_path, strerror(errno));
out:
  if (lf) fclose(lf);
  if (e.choices && fclose(e.choices) != 0 && !r)
    r = mj_fail(err, MJ_EIO, "moejit forward: %s: write failed: %s", choices, strerror(errno));
  free(e.routing), free(e.sel);
  cpu_model_destroy(e.cm);
  gpu_model_destroy(e.gm);
  free(tok), free(logits);
  model_free(m);
  return r;
}
