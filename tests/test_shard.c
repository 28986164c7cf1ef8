/* test_shard.c: the tensor/expert-parallel plan (shard.h) on the CPU.
 *
 * Two kinds of check.  Partition: for GLM-5's real widths and the mkmodel
 * presets, over every valid --tp/--ep up to 8 ranks (16 for GLM-5), each
 * head, q_b/kv_b row, o_proj column, dense and shared-expert intermediate
 * index and (expert, intermediate index) pair is owned by exactly one rank
 * where the partial results are summed, and by every rank where the block
 * stays whole; a config that cannot be split is one line naming the field.
 * Arithmetic: on small synthetic models (bf16, and NVFP4 experts) the CPU
 * reference ops run per rank on that rank's slices (views of the rows,
 * copies of the columns) and summed as the all-reduce would sum them equal
 * the unsplit ops: the dense SwiGLU MLP, o_proj, and a whole MoE layer
 * (routing on every rank, each rank's routed experts plus its slice of the
 * shared expert), within 1e-5 relative.  And the bytes a rank holds
 * (shard_rank_bytes): the shards of all ranks plus what every rank holds
 * are the model's bytes, and shard_rank_read reads exactly that many.
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_forward.h"
#include "gpu_model.h"
#include "mkmodel.h"
#include "model.h"
#include "ref.h"
#include "ref_model.h"
#include "shard.h"
#include "t.h"

/* ---- configs ----------------------------------------------------------------------- */
static mj_arena arena;

/* The config a preset's checkpoint would have (the fields the plan reads). */
static model_config preset_config(const char *name) {
  mkmodel_spec s;
  MJ_ASSERT(mkmodel_preset(name, &s) == 0);
  model_config c = {0};
  c.hidden_size = s.hidden, c.intermediate_size = s.inter, c.moe_intermediate_size = s.moe_inter;
  c.num_hidden_layers = s.layers, c.num_attention_heads = s.heads, c.num_key_value_heads = s.heads;
  c.q_lora_rank = s.q_lora, c.kv_lora_rank = s.kv_lora, c.qk_nope_head_dim = s.nope, c.qk_rope_head_dim = s.rope;
  c.v_head_dim = s.v, c.qk_head_dim = s.nope + s.rope;
  c.n_routed_experts = s.experts, c.num_experts_per_tok = s.per_tok, c.n_shared_experts = s.shared;
  c.layer_sparse = mj_arena_alloc(&arena, (size_t)s.layers);
  for (int64_t l = 0; l < s.layers; l++) c.layer_sparse[l] = l >= s.dense_layers;
  return c;
}

static model_config glm5_config(void) {
  model_config c;
  model_config_glm5(&c, 78, 3, &arena);
  return c;
}

/* ---- partition ----------------------------------------------------------------------- */
/* cnt[i]++ for i in r; false if r leaves [0, n). */
static bool count(int *cnt, int64_t n, shard_range r) {
  if (r.begin < 0 || r.end > n || r.begin > r.end) return false;
  for (int64_t i = r.begin; i < r.end; i++) cnt[i]++;
  return true;
}

/* Every cnt[i] == want; the first mismatch printed. */
static bool all_equal(const int *cnt, int64_t n, int want, const char *what, const char *name, int tp, int ep) {
  for (int64_t i = 0; i < n; i++)
    if (cnt[i] != want) {
      fprintf(stderr, "  %s --tp %d --ep %d: %s index %lld owned %d times, expected %d\n", name, tp, ep, what,
              (long long)i, cnt[i], want);
      return false;
    }
  return true;
}

static void check_partition(const model_config *c, const char *name, int tp, int ep) {
  int W = tp > ep ? tp : ep;
  shard_plan p[16];
  for (int r = 0; r < W; r++) {
    mj_err err = {0};
    if (shard_plan_make(c, r, tp, ep, &p[r], &err)) {
      fprintf(stderr, "  %s --tp %d --ep %d: %s\n", name, tp, ep, err.msg);
      T_CHECK(!"the plan was refused");
      return;
    }
  }
  int64_t H = c->num_attention_heads, E = c->n_routed_experts, Im = c->moe_intermediate_size;
  struct {
    const char *what;
    int64_t n;
    size_t off; /* of the range in shard_plan */
    bool reduce;
  } parts[] = {
      {"head", H, offsetof(shard_plan, heads), p[0].attn_reduce},
      {"q_b row", H * c->qk_head_dim, offsetof(shard_plan, q_b_rows), p[0].attn_reduce},
      {"kv_b row", H * (c->qk_nope_head_dim + c->v_head_dim), offsetof(shard_plan, kv_b_rows), p[0].attn_reduce},
      {"o_proj column", H * c->v_head_dim, offsetof(shard_plan, o_cols), p[0].attn_reduce},
      {"dense intermediate", c->intermediate_size, offsetof(shard_plan, dense_inter), p[0].dense_reduce},
      {"shared intermediate", Im * c->n_shared_experts, offsetof(shard_plan, shared_inter), true},
  };
  for (size_t k = 0; k < MJ_ARRAY_LEN(parts); k++) {
    int *cnt = mj_xcalloc((size_t)parts[k].n, sizeof *cnt);
    bool in = true;
    for (int r = 0; r < W; r++) in &= count(cnt, parts[k].n, *(shard_range *)((char *)&p[r] + parts[k].off));
    T_CHECK(in);
    T_CHECK(all_equal(cnt, parts[k].n, parts[k].reduce ? 1 : W, parts[k].what, name, tp, ep));
    free(cnt);
  }
  /* routed experts: each expert whole on exactly one rank (or on the one rank) */
  int *cnt = mj_xcalloc((size_t)E, sizeof *cnt);
  bool owner_ok = true;
  for (int r = 0; r < W; r++) {
    T_CHECK(count(cnt, E, p[r].experts));
    for (int64_t e = p[r].experts.begin; e < p[r].experts.end; e++) {
      int o = shard_expert_rank(&p[r], E, e);
      owner_ok &= W > 1 ? o == r : o == -1;
    }
  }
  T_CHECK(all_equal(cnt, E, 1, "routed expert", name, tp, ep));
  T_CHECK(owner_ok);
  T_EQ_INT(p[0].moe_reduce, W > 1);
  free(cnt);
  /* lm_head rows: once over the ranks when gathered, else whole on each */
  cnt = mj_xcalloc((size_t)c->vocab_size, sizeof *cnt);
  for (int r = 0; r < W; r++) T_CHECK(count(cnt, c->vocab_size, p[r].vocab));
  T_CHECK(all_equal(cnt, c->vocab_size, p[0].head_gather ? 1 : W, "vocabulary row", name, tp, ep));
  T_EQ_INT(p[0].head_gather, W > 1 && c->vocab_size % W == 0);
  free(cnt);
}

static const int splits[][2] = {{1, 1}, {2, 1}, {4, 1}, {8, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 2}, {4, 4}, {8, 8}};

static void test_partition_glm5(void) {
  model_config c = glm5_config();
  for (size_t i = 0; i < MJ_ARRAY_LEN(splits); i++) check_partition(&c, "glm5", splits[i][0], splits[i][1]);
  check_partition(&c, "glm5", 16, 16);
  /* GLM-5 at --tp 8: 8 heads, 1536 dense and 256 shared intermediate rows per rank; --ep 8: 32 experts */
  shard_plan p;
  mj_err err = {0};
  T_EQ_INT(shard_plan_make(&c, 3, 8, 8, &p, &err), 0);
  T_EQ_INT(p.heads.begin, 24); T_EQ_INT(p.heads.end, 32);
  T_EQ_INT(p.q_b_rows.begin, 24 * 256); T_EQ_INT(p.kv_b_rows.end, 32 * 448); T_EQ_INT(p.o_cols.begin, 24 * 256);
  T_EQ_INT(p.dense_inter.begin, 3 * 1536); T_EQ_INT(p.shared_inter.end, 4 * 256);
  T_EQ_INT(p.experts.begin, 96); T_EQ_INT(p.experts.end, 128);
  T_EQ_INT(p.vocab.begin, 3 * 19360); T_EQ_INT(p.vocab.end, 4 * 19360); T_CHECK(p.head_gather);
  /* --tp 8 alone splits the routed experts whole too */
  T_EQ_INT(shard_plan_make(&c, 3, 8, 1, &p, &err), 0);
  T_EQ_INT(p.experts.begin, 96); T_EQ_INT(p.experts.end, 128);
  T_EQ_INT(shard_expert_rank(&p, 256, 255), 7);
}

static void test_partition_presets(void) {
  const char *names[] = {"medium", "small"};
  for (int k = 0; k < 2; k++) {
    model_config c = preset_config(names[k]);
    for (size_t i = 0; i < MJ_ARRAY_LEN(splits); i++) check_partition(&c, names[k], splits[i][0], splits[i][1]);
  }
  model_config t = preset_config("tiny");
  check_partition(&t, "tiny", 1, 1);
  check_partition(&t, "tiny", 2, 1);
  check_partition(&t, "tiny", 1, 2);
  check_partition(&t, "tiny", 2, 2);
}

static void test_plan_errors(void) {
  model_config g = glm5_config(), t = preset_config("tiny");
  static const struct {
    bool tiny;
    int rank, tp, ep;
    const char *want;
  } cases[] = {
      {false, 0, 3, 1, "--tp 3 does not divide num_attention_heads (64)"},
      {false, 0, 128, 1, "--tp 128 does not divide num_attention_heads (64)"},
      {false, 0, 1, 3, "--ep 3 does not divide n_routed_experts (256)"},
      {false, 0, 1, 512, "--ep 512 does not divide n_routed_experts (256)"},
      {false, 0, 2, 4, "--tp 2 --ep 4: each must be 1 or the number of ranks (the larger, 4)"},
      {false, 4, 4, 4, "rank 4 is not one of 4 ranks"},
      {true, 0, 4, 1,
       "--tp 4: each rank's share of the shared experts' width (moe_intermediate_size * n_shared_experts) "
       "(32 / 4 = 8) is not a whole number of 16-column NVFP4 scale blocks"},
      {true, 0, 1, 4,
       "--ep 4: each rank's share of the shared experts' width (moe_intermediate_size * n_shared_experts) "
       "(32 / 4 = 8) is not a whole number of 16-column NVFP4 scale blocks"},
      {true, 0, 8, 1, "--tp 8 does not divide num_attention_heads (4)"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    shard_plan p;
    mj_err err = {0};
    T_EQ_INT(shard_plan_make(cases[i].tiny ? &t : &g, cases[i].rank, cases[i].tp, cases[i].ep, &p, &err), MJ_EUSAGE);
    T_EQ_STR(err.msg, cases[i].want);
  }
}

/* ---- arithmetic: split, computed per rank, summed = unsplit ---------------------------- */
static char tmpdir[256];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(path);
}

static model *load_preset(const char *preset, bool nvfp4) {
  mkmodel_spec s;
  mkmodel_preset(preset, &s);
  s.nvfp4 = nvfp4;
  s.seed = 7;
  char dir[400];
  snprintf(dir, sizeof dir, "%s/%s%s", tmpdir, preset, nvfp4 ? "-nvfp4" : "");
  mj_err err = {0};
  model *m = NULL;
  if (mkmodel_write(&s, dir, true, NULL, &err) || model_load(dir, &m, &err)) {
    fprintf(stderr, "%s: %s\n", dir, err.msg);
    exit(1);
  }
  return m;
}

static uint64_t rng = 12345;
static float frand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* One MoE layer on n tokens: routing (whole, as every rank computes it),
 * then the routed experts p owns (all, when p is NULL) on their slice of
 * the intermediate width, plus p's slice of the shared expert. */
static void moe_layer(const model *m, const model_layer *ly, const shard_plan *p, const float *x, int64_t n,
                      float *out) {
  const model_config *c = &m->cfg;
  int64_t H = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
  float *logits = mj_xmalloc((size_t)(n * E) * sizeof *logits), *w = mj_xmalloc((size_t)(n * K) * sizeof *w);
  float *y = mj_xmalloc((size_t)(n * H) * sizeof *y);
  int64_t *idx = mj_xmalloc((size_t)(n * K) * sizeof *idx);
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  ref_matmul(&ly->router, x, n, logits, 1);
  for (int64_t t = 0; t < n; t++) ref_route(logits + t * E, &ly->router_bias, c, idx + t * K, w + t * K);
  memset(out, 0, (size_t)(n * H) * sizeof *out);
  for (int64_t t = 0; t < n; t++)
    for (int64_t k = 0; k < K; k++) {
      int64_t e = idx[t * K + k];
      if (p && (e < p->experts.begin || e >= p->experts.end)) continue;
      model_mlp mlp = ly->experts[e];
      ref_swiglu(&mlp, x + t * H, 1, y, 1);
      for (int64_t d = 0; d < H; d++) out[t * H + d] += w[t * K + k] * y[d];
    }
  model_mlp sh = ly->shared;
  if (p) shard_mlp(&ly->shared, p->shared_inter, &a, &sh);
  ref_swiglu(&sh, x, n, y, 1);
  for (int64_t i = 0; i < n * H; i++) out[i] += y[i];
  mj_arena_free(&a);
  free(logits), free(w), free(y), free(idx);
}

/* For each split: the unsplit result full[n*outw] against the ranks'
 * partials summed (blocks that are all-reduced) or each rank's whole
 * result (replicated blocks). */
static void check_sum(const char *what, const float *full, float *const *part, int W, bool reduce, size_t len,
                      int tp, int ep) {
  float *sum = mj_xcalloc(len, sizeof *sum);
  double worst = 0;
  if (reduce) {
    for (int r = 0; r < W; r++)
      for (size_t i = 0; i < len; i++) sum[i] += part[r][i];
    worst = ref_rel_err(sum, full, len);
  } else {
    for (int r = 0; r < W; r++) worst = MJ_MAX(worst, ref_rel_err(part[r], full, len));
  }
  printf("  %s --tp %d --ep %d: rel err %.2e\n", what, tp, ep, worst);
  T_CHECK(worst <= 1e-5);
  T_CHECK(worst == worst);
  free(sum);
}

static void check_model(const model *m, const char *name) {
  const model_config *c = &m->cfg;
  int64_t H = c->hidden_size, n = 3, ov = c->num_attention_heads * c->v_head_dim;
  float *x = mj_xmalloc((size_t)(n * H) * sizeof *x), *v = mj_xmalloc((size_t)(n * ov) * sizeof *v);
  for (int64_t i = 0; i < n * H; i++) x[i] = frand();
  for (int64_t i = 0; i < n * ov; i++) v[i] = frand();
  const model_layer *dl = NULL, *ml = NULL;
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    if (!m->layers[l].sparse && !dl) dl = &m->layers[l];
    if (m->layers[l].sparse && !ml) ml = &m->layers[l];
  }
  MJ_ASSERT(dl && ml);
  size_t len = (size_t)(n * H);
  float *full_mlp = mj_xmalloc(len * 4), *full_o = mj_xmalloc(len * 4), *full_moe = mj_xmalloc(len * 4);
  ref_swiglu(&dl->dense, x, n, full_mlp, 1);
  ref_matmul(&dl->o, v, n, full_o, 1);
  moe_layer(m, ml, NULL, x, n, full_moe);
  static const int sp[][2] = {{2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}, {4, 4}, {8, 8}};
  for (size_t s = 0; s < MJ_ARRAY_LEN(sp); s++) {
    int tp = sp[s][0], ep = sp[s][1], W = MJ_MAX(tp, ep);
    shard_plan p[8];
    mj_err err = {0};
    bool ok = true;
    for (int r = 0; r < W && ok; r++) ok = shard_plan_make(c, r, tp, ep, &p[r], &err) == 0;
    if (!ok) { /* tiny's widths do not split 4 ways (test_plan_errors) */
      mj_err_clear(&err);
      continue;
    }
    float *pm[8], *po[8], *pe[8];
    mj_arena a;
    mj_arena_init(&a, 1 << 16);
    for (int r = 0; r < W; r++) {
      pm[r] = mj_xmalloc(len * 4), po[r] = mj_xmalloc(len * 4), pe[r] = mj_xmalloc(len * 4);
      model_mlp mlp;
      shard_mlp(&dl->dense, p[r].dense_inter, &a, &mlp);
      ref_swiglu(&mlp, x, n, pm[r], 1);
      /* o_proj reads only this rank's heads' columns of the attention output */
      model_weight o;
      shard_weight_cols(&dl->o, p[r].o_cols, &a, &o);
      int64_t w = p[r].o_cols.end - p[r].o_cols.begin;
      float *vr = mj_xmalloc((size_t)(n * w) * sizeof *vr);
      for (int64_t t = 0; t < n; t++) memcpy(vr + t * w, v + t * ov + p[r].o_cols.begin, (size_t)w * 4);
      ref_matmul(&o, vr, n, po[r], 1);
      free(vr);
      moe_layer(m, ml, &p[r], x, n, pe[r]);
    }
    char what[64];
    snprintf(what, sizeof what, "%s dense MLP", name);
    check_sum(what, full_mlp, pm, W, p[0].dense_reduce, len, tp, ep);
    snprintf(what, sizeof what, "%s o_proj", name);
    check_sum(what, full_o, po, W, p[0].attn_reduce, len, tp, ep);
    snprintf(what, sizeof what, "%s MoE layer", name);
    check_sum(what, full_moe, pe, W, p[0].moe_reduce, len, tp, ep);
    for (int r = 0; r < W; r++) free(pm[r]), free(po[r]), free(pe[r]);
    mj_arena_free(&a);
  }
  free(x), free(v), free(full_mlp), free(full_o), free(full_moe);
}

/* Row slices are views: their outputs are the full output's rows, bit for
 * bit (the same dot products). */
static void check_rows(const model *m) {
  const model_layer *ly = &m->layers[0];
  const model_config *c = &m->cfg;
  shard_plan p;
  mj_err err = {0};
  MJ_ASSERT(shard_plan_make(c, 1, 2, 1, &p, &err) == 0);
  int64_t K = ly->q_b.cols, R = ly->q_b.rows;
  float *x = mj_xmalloc((size_t)K * 4), *full = mj_xmalloc((size_t)R * 4), *part = mj_xmalloc((size_t)R * 4);
  for (int64_t i = 0; i < K; i++) x[i] = frand();
  ref_matmul(&ly->q_b, x, 1, full, 1);
  model_weight q;
  shard_weight_rows(&ly->q_b, p.q_b_rows, &q);
  T_EQ_INT(q.rows, p.q_b_rows.end - p.q_b_rows.begin);
  ref_matmul(&q, x, 1, part, 1);
  T_CHECK(memcmp(part, full + p.q_b_rows.begin, (size_t)q.rows * 4) == 0);
  free(x), free(full), free(part);
}

/* Bytes per rank: the ranks' shards plus what every rank holds add up to
 * the model, and what every rank holds is the same on every rank. */
static void check_bytes(const model *m, const char *name) {
  shard_plan p;
  mj_err err = {0};
  uint64_t s1, w1;
  MJ_ASSERT(shard_plan_make(&m->cfg, 0, 1, 1, &p, &err) == 0);
  shard_rank_bytes(m, &p, &s1, &w1);
  T_EQ_INT(s1, 0);
  /* the loader's own count (which also counts NVFP4 input_scale scalars) */
  uint64_t counted = m->bytes_bf16 + m->bytes_f32 + m->bytes_nvfp4;
  printf("  %s: %llu bytes of weights (the loader counted %llu)\n", name, (unsigned long long)w1,
         (unsigned long long)counted);
  T_CHECK(w1 <= counted && counted - w1 <= 4 * (uint64_t)m->n_nvfp4_linears);
  static const int sp[][2] = {{2, 1}, {1, 2}, {2, 2}, {4, 4}, {8, 8}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(sp); i++) {
    int W = MJ_MAX(sp[i][0], sp[i][1]);
    uint64_t sum = 0, w0 = 0;
    bool ok = true, same = true;
    for (int r = 0; r < W && ok; r++) {
      uint64_t s, w;
      ok = shard_plan_make(&m->cfg, r, sp[i][0], sp[i][1], &p, &err) == 0;
      if (!ok) break;
      shard_rank_bytes(m, &p, &s, &w);
      /* shard_rank_read (moejit info --read) reads exactly those bytes */
      uint64_t ck = 0;
      T_EQ_INT(shard_rank_read(m, &p, &ck), s + w);
      T_CHECK(ck != 0);
      sum += s;
      if (r == 0) w0 = w;
      same &= w == w0;
    }
    if (!ok) { /* tiny does not split 4 ways */
      mj_err_clear(&err);
      continue;
    }
    printf("  %s --tp %d --ep %d: %llu bytes a rank (%llu on every rank)\n", name, sp[i][0], sp[i][1],
           (unsigned long long)(sum / W + w0), (unsigned long long)w0);
    T_EQ_INT(sum + w0, w1);
    T_CHECK(same);
  }
}

static void test_split_sums_bf16(void) {
  model *m = load_preset("tiny", false);
  check_model(m, "tiny");
  check_rows(m);
  check_bytes(m, "tiny");
  model_free(m);
}

static void test_split_sums_nvfp4(void) {
  model *m = load_preset("small", true);
  MJ_ASSERT(m->layers[m->cfg.num_hidden_layers - 1].experts[0].down.fmt == MODEL_W_NVFP4);
  check_model(m, "small (NVFP4 experts)");
  check_bytes(m, "small (NVFP4 experts)");
  model_free(m);
}

/* The whole model (issue 18): cpu_forward with cpu_params.tp/ep computes
 * every sharded block as the ranks would (their heads, rows and experts)
 * and sums their partials where they all-reduce; its logits over a prompt
 * and decode steps must equal the unsplit forward's.  Both the expanded
 * and the absorbed attention. */
static double sharded_forward_err(model *m, int tp, int ep, bool absorbed) {
  enum { PROMPT = 19, STEPS = 4 };
  int64_t V = m->cfg.vocab_size;
  cpu_params p1 = {.max_ctx = 64, .absorbed = absorbed}, pn = p1;
  pn.tp = tp, pn.ep = ep;
  cpu_model *a = NULL, *b = NULL;
  mj_err err = {0};
  if (cpu_model_create(m, &p1, &a, &err) || cpu_model_create(m, &pn, &b, &err)) {
    fprintf(stderr, "  --tp %d --ep %d: %s\n", tp, ep, err.msg);
    cpu_model_destroy(a);
    mj_err_clear(&err);
    return -1;
  }
  int32_t tok[PROMPT + STEPS];
  uint64_t r = 12345u + (uint64_t)tp * 31 + (uint64_t)ep;
  for (int i = 0; i < PROMPT + STEPS; i++) r = r * 6364136223846793005ull + 1, tok[i] = (int32_t)((r >> 33) % (uint64_t)V);
  float *la = mj_xmalloc((size_t)PROMPT * V * 4), *lb = mj_xmalloc((size_t)PROMPT * V * 4);
  double worst = 0;
  T_EQ_INT(cpu_forward(a, tok, PROMPT, 0, la, true, &err), 0);
  T_EQ_INT(cpu_forward(b, tok, PROMPT, 0, lb, true, &err), 0);
  for (int i = 0; i < PROMPT; i++) worst = fmax(worst, ref_rel_err(lb + (size_t)i * V, la + (size_t)i * V, (size_t)V));
  for (int st = 0; st < STEPS; st++) {
    T_EQ_INT(cpu_forward(a, tok + PROMPT + st, 1, PROMPT + st, la, false, &err), 0);
    T_EQ_INT(cpu_forward(b, tok + PROMPT + st, 1, PROMPT + st, lb, false, &err), 0);
    worst = fmax(worst, ref_rel_err(lb, la, (size_t)V));
  }
  free(la), free(lb);
  cpu_model_destroy(a), cpu_model_destroy(b);
  return worst;
}

static void test_sharded_forward(void) {
  static const int sp[][2] = {{2, 1}, {4, 1}, {8, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 2}, {4, 4}, {8, 8}};
  const char *kinds[2] = {"bf16", "NVFP4 experts"};
  for (int q = 0; q < 2; q++) {
    model *m = load_preset("small", q == 1);
    double worst = 0;
    int ran = 0;
    for (size_t i = 0; i < MJ_ARRAY_LEN(sp); i++)
      for (int ab = 0; ab < 2; ab++) {
        double e = sharded_forward_err(m, sp[i][0], sp[i][1], ab == 1);
        T_CHECK(e >= 0);
        if (e < 0) continue;
        ran++;
        worst = fmax(worst, e);
        if (e > 2e-6) fprintf(stderr, "  small %s --tp %d --ep %d%s: rel err %.3g\n", kinds[q], sp[i][0], sp[i][1],
                              ab ? " (absorbed)" : "", e);
        T_CHECK(e <= 2e-6);
      }
    printf("  small (%s), 3 layers: %d sharded forwards (prompt 19 + 4 decode steps, every logit), worst rel err %.3g\n",
           kinds[q], ran, worst);
    T_EQ_INT(ran, (int)MJ_ARRAY_LEN(sp) * 2);
    model_free(m);
  }
  /* The GPU tests' model (medium, NVFP4 experts: hidden 1024, 32 experts)
   * at the deployment's split and at each split alone. */
  model *m = load_preset("medium", true);
  static const int mp[][2] = {{8, 8}, {8, 1}, {1, 8}};
  double worst = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(mp); i++) {
    double e = sharded_forward_err(m, mp[i][0], mp[i][1], true);
    T_CHECK(e >= 0 && e <= 2e-6);
    worst = fmax(worst, e);
  }
  printf("  medium (NVFP4 experts): --tp 8 --ep 8, --tp 8, --ep 8 (absorbed attention): worst rel err %.3g\n", worst);
  model_free(m);
}

int main(void) {
  mj_arena_init(&arena, 1 << 12);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_shard.XXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  T_RUN(test_partition_glm5);
  T_RUN(test_partition_presets);
  T_RUN(test_plan_errors);
  T_RUN(test_split_sums_bf16);
  T_RUN(test_split_sums_nvfp4);
  T_RUN(test_sharded_forward);
  nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  mj_arena_free(&arena);
  return t_status();
}
