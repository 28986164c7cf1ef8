/* test_model.c: self-checks of loading, mkmodel and the CPU forward pass
 * that need no reference framework.
 *
 * The fidelity fixtures (test_fidelity.c) compare against transformers; these
 * tests check what can be known here: the CPU forward agrees with itself in
 * every way it can be computed (decode with the cache equals one prefill,
 * absorbed MLA equals expanded MLA), NVFP4 weights decode as the dt_
 * conversions say, routing and top-k pick what a hand computation picks, the
 * DSA selection changes results exactly where the context exceeds
 * index_topk, and mkmodel is deterministic.
 */
#define _XOPEN_SOURCE 700
#include <float.h>
#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_forward.h"
#include "dtype.h"
#include "json.h"
#include "mkmodel.h"
#include "model.h"
#include "ref_model.h"
#include "t.h"

static char tmpdir[256];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p);
}

static const char *mk(const char *name, mkmodel_spec *s) {
  static char path[8][512];
  static int k;
  char *p = path[k++ % 8];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  mj_err err = {0};
  if (mkmodel_write(s, p, true, NULL, &err)) {
    fprintf(stderr, "mkmodel %s: %s\n", name, err.msg);
    exit(1);
  }
  return p;
}

static model *load(const char *dir) {
  mj_err err = {0};
  model *m;
  if (model_load(dir, &m, &err)) {
    fprintf(stderr, "load %s: %s\n", dir, err.msg);
    exit(1);
  }
  return m;
}

/* Logits of tokens[0..n) run as one prefill (all positions). */
static float *prefill(model *m, const int32_t *tok, int64_t n, bool absorbed) {
  cpu_params p = {.max_ctx = 256, .absorbed = absorbed};
  cpu_model *s;
  mj_err err = {0};
  T_CHECK(cpu_model_create(m, &p, &s, &err) == 0);
  float *lg = malloc((size_t)(n * m->cfg.vocab_size) * sizeof *lg);
  T_CHECK(cpu_forward(s, tok, n, 0, lg, true, &err) == 0);
  cpu_model_destroy(s);
  return lg;
}

static double rel_err(const float *a, const float *b, int64_t n) {
  double md = 0, mb = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    md = fmax(md, fabs((double)a[i] - b[i]));
    mb = fmax(mb, fabs((double)b[i]));
  }
  return md / (mb > 0 ? mb : 1);
}

static void prompt(int32_t *tok, int64_t n, int64_t vocab) {
  uint64_t s = 12345;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tok[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
  }
}

static void test_glob(void) {
  T_CHECK(model_glob_match("*self_attn*", "model.layers.3.self_attn.q_a_proj"));
  T_CHECK(model_glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate"));
  T_CHECK(!model_glob_match("model.layers.*.mlp.gate", "model.layers.12.mlp.gate_proj"));
  T_CHECK(model_glob_match("lm_head", "lm_head"));
  T_CHECK(!model_glob_match("lm_head", "lm_head2"));
  T_CHECK(model_glob_match("model.layers.1.mlp*", "model.layers.1.mlp.down_proj"));
  T_CHECK(!model_glob_match("model.layers.1.mlp*", "model.layers.11.mlp.down_proj"));
}

static void test_topk(void) {
  float v[] = {1, 5, 3, 5, -2, 3};
  int64_t idx[4];
  ref_topk(v, 6, 4, idx);
  /* Equal values go to the lower index first. */
  T_EQ_INT(idx[0], 1);
  T_EQ_INT(idx[1], 3);
  T_EQ_INT(idx[2], 2);
  T_EQ_INT(idx[3], 5);
}

/* ref_topk_torch against what torch.topk picked on the CPU (torch 2.11,
 * tests/data/topk-torch.json, written by tests/fidelity/topk_vectors.py on
 * the GPU host): rows of a few levels, so ties straddle the boundary, some
 * ending in causally masked entries (finfo(float32).min), on both sides of
 * torch's switch to partial sort at k * 64 <= n.  The same sets, every
 * case; and the rule "equal values by index" (ref_topk) must disagree with
 * torch on some, or the data would not test the tie rule at all. */
static void test_topk_torch(void) {
  const char *srcdir = getenv("srcdir") ? getenv("srcdir") : ".";
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/data/topk-torch.json", srcdir);
  char *text;
  size_t len;
  mj_err err = {0};
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  json *root;
  T_CHECK(mj_read_file(path, &text, &len, &err) == 0);
  T_CHECK(json_parse(&a, text, len, path, &root, &err) == 0);
  const json *cases = json_get(root, "cases");
  T_CHECK(cases && cases->len >= 100);
  int differ = 0, by_index_differs = 0, partial = 0;
  for (size_t c = 0; cases && c < cases->len; c++) {
    const json *v = json_get(cases->items[c], "v"), *want = json_get(cases->items[c], "idx");
    int64_t m = json_get(cases->items[c], "masked")->i, k = json_get(cases->items[c], "k")->i;
    int64_t n = (int64_t)v->len + m;
    float *row = malloc((size_t)n * sizeof *row);
    for (size_t i = 0; i < v->len; i++) row[i] = (float)v->items[i]->num;
    for (int64_t i = (int64_t)v->len; i < n; i++) row[i] = -FLT_MAX;
    int64_t *got = malloc((size_t)k * sizeof *got), *byidx = malloc((size_t)k * sizeof *byidx);
    uint8_t *in = calloc((size_t)n, 1), *in2 = calloc((size_t)n, 1);
    ref_topk_torch(row, n, k, got);
    ref_topk(row, n, k, byidx);
    for (int64_t i = 0; i < k; i++) in[got[i]] = 1, in2[byidx[i]] = 1;
    bool same = (int64_t)want->len == k, same2 = true;
    for (size_t i = 0; i < want->len; i++) same &= in[want->items[i]->i] == 1, same2 &= in2[want->items[i]->i] == 1;
    partial += k * 64 <= n;
    by_index_differs += !same2;
    if (!same && differ++ < 3) fprintf(stderr, "  case %zu (n %lld, k %lld): a different set than torch's\n", c,
                                       (long long)n, (long long)k);
    free(row), free(got), free(byidx), free(in), free(in2);
  }
  printf("  %zu cases (%d on the partial-sort path): %d differ from torch; ties by index would differ in %d\n",
         cases ? cases->len : 0, partial, differ, by_index_differs);
  T_EQ_INT(differ, 0);
  T_CHECK(partial >= 5);
  T_CHECK(by_index_differs >= 10);
  free(text);
  mj_arena_free(&a);
}

/* model_config_glm5: GLM-5's widths (glm5.md) from the parser's defaults,
 * with the layer count and the dense prefix asked for. */
static void test_glm5_config(void) {
  mj_arena a;
  mj_arena_init(&a, 1024);
  model_config c;
  model_config_glm5(&c, 78, 3, &a);
  T_EQ_INT(c.hidden_size, 6144);
  T_EQ_INT(c.vocab_size, 154880);
  T_EQ_INT(c.intermediate_size, 12288);
  T_EQ_INT(c.moe_intermediate_size, 2048);
  T_EQ_INT(c.num_attention_heads, 64);
  T_EQ_INT(c.q_lora_rank, 2048);
  T_EQ_INT(c.kv_lora_rank, 512);
  T_EQ_INT(c.qk_nope_head_dim + c.qk_rope_head_dim, 256);
  T_EQ_INT(c.v_head_dim, 256);
  T_EQ_INT(c.index_n_heads, 32);
  T_EQ_INT(c.index_head_dim, 128);
  T_EQ_INT(c.index_topk, 2048);
  T_EQ_INT(c.n_routed_experts, 256);
  T_EQ_INT(c.num_experts_per_tok, 8);
  T_EQ_INT(c.n_shared_experts, 1);
  T_CHECK(c.rope_theta == 1e6 && c.routed_scaling_factor == 2.5 && c.rms_norm_eps == 1e-5 && c.norm_topk_prob);
  T_EQ_INT(c.num_hidden_layers, 78);
  int sparse = 0, full = 0;
  for (int i = 0; i < 78; i++) sparse += c.layer_sparse[i], full += c.layer_indexer_full[i];
  T_EQ_INT(sparse, 75);
  T_EQ_INT(full, 78);
  T_CHECK(!c.layer_sparse[2] && c.layer_sparse[3]);
  model_config_glm5(&c, 2, 0, &a);
  T_CHECK(c.num_hidden_layers == 2 && c.layer_sparse[0] && c.layer_sparse[1]);
  mj_arena_free(&a);
}

static void test_route(void) {
  /* 8 experts in 4 groups of 2, keep 2 groups, pick 2 experts. */
  model_config c = {0};
  c.n_routed_experts = 8, c.n_group = 4, c.topk_group = 2, c.num_experts_per_tok = 2;
  c.norm_topk_prob = true, c.routed_scaling_factor = 2.5;
  float bias[8] = {0, 0, 0.5f, 0, 0, 0, 0, 0.25f};
  model_vec bv = {"bias", bias, true, 8};
  /* logits chosen so that s = sigmoid(l) is known. */
  float l[8];
  float s[8] = {0.9f, 0.1f, 0.2f, 0.2f, 0.6f, 0.6f, 0.5f, 0.4f};
  for (int e = 0; e < 8; e++) l[e] = logf(s[e] / (1 - s[e]));
  /* choice = s + bias: {0.9, 0.1 | 0.7, 0.2 | 0.6, 0.6 | 0.5, 0.65}
   * group sums of the best two: 1.0, 0.9, 1.2, 1.15 -> groups 2 and 3 stay.
   * Expert 0 (the best single choice) is excluded with its group.  Among
   * experts 4..7 the choices are 0.6, 0.6, 0.5, 0.65: picks 7, then 4 (the
   * tie with 5 goes to the lower index). */
  int64_t idx[2];
  float w[2];
  ref_route(l, &bv, &c, idx, w);
  T_EQ_INT(idx[0], 7);
  T_EQ_INT(idx[1], 4);
  /* Weights from s, not from choice: 0.4 and 0.6, normalised, times 2.5. */
  T_NEAR(w[0], 2.5 * 0.4 / 1.0, 1e-5);
  T_NEAR(w[1], 2.5 * 0.6 / 1.0, 1e-5);
  c.norm_topk_prob = false;
  ref_route(l, &bv, &c, idx, w);
  T_NEAR(w[0], 2.5 * 0.4, 1e-5);
  /* One group: plain top-2 by choice (0.9 then 0.7/0.7: expert 2 first). */
  c.n_group = 1, c.topk_group = 1, c.norm_topk_prob = true;
  ref_route(l, &bv, &c, idx, w);
  T_EQ_INT(idx[0], 0);
  T_EQ_INT(idx[1], 2);
  T_NEAR(w[0] + w[1], 2.5, 1e-5);
}

static void test_rope(void) {
  float inv[8];
  model_rope_inv_freq(10000, 16, inv);
  T_NEAR(inv[0], 1.0, 0);
  T_NEAR(inv[1], pow(10000, -2.0 / 16), 1e-7);
  float q[16], k[16];
  for (int i = 0; i < 16; i++) q[i] = sinf((float)i + 1), k[i] = cosf(3.0f * (float)i);
  /* Pair (x0, x1) at position 0 is unchanged and lands at [0] and [8]. */
  float a[16];
  memcpy(a, q, sizeof a);
  ref_rope_interleaved(a, 16, 0, inv);
  T_NEAR(a[0], q[0], 1e-7);
  T_NEAR(a[8], q[1], 1e-7);
  T_NEAR(a[1], q[2], 1e-7);
  /* Dot products depend on the relative position only. */
  float q1[16], k1[16], q2[16], k2[16];
  memcpy(q1, q, sizeof q), memcpy(k1, k, sizeof k), memcpy(q2, q, sizeof q), memcpy(k2, k, sizeof k);
  ref_rope_interleaved(q1, 16, 7, inv), ref_rope_interleaved(k1, 16, 3, inv);
  ref_rope_interleaved(q2, 16, 27, inv), ref_rope_interleaved(k2, 16, 23, inv);
  double d1 = 0, d2 = 0;
  for (int i = 0; i < 16; i++) d1 += q1[i] * k1[i], d2 += q2[i] * k2[i];
  T_NEAR(d1, d2, 1e-4);
}

static void test_nvfp4_dequant(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.seed = 7, s.nvfp4 = true;
  const char *dq = mk("q", &s);
  s.nvfp4 = false;
  const char *db = mk("b", &s);
  model *mq = load(dq), *mb = load(db);
  const model_weight *wq = &mq->layers[1].experts[3].down, *wb = &mb->layers[1].experts[3].down;
  T_EQ_INT(wq->fmt, MODEL_W_NVFP4);
  T_EQ_INT(wb->fmt, MODEL_W_BF16);
  T_EQ_INT(mq->layers[1].q_a.fmt, MODEL_W_BF16); /* only routed experts are quantised */
  T_EQ_INT(mq->layers[1].shared.up.fmt, MODEL_W_BF16);
  int64_t K = wq->cols;
  float *rq = malloc((size_t)K * sizeof *rq), *rb = malloc((size_t)K * sizeof *rb);
  double err2 = 0, ref2 = 0;
  int exact = 1, within = 1;
  for (int64_t r = 0; r < wq->rows; r++) {
    model_weight_row(wq, r, rq);
    model_weight_row(wb, r, rb);
    const uint8_t *codes = (const uint8_t *)wq->w + r * K / 2;
    for (int64_t c = 0; c < K; c++) {
      uint8_t code = c & 1 ? codes[c / 2] >> 4 : codes[c / 2] & 15;
      float sc = dt_e4m3_to_f32(wq->scale[r * K / 16 + c / 16]);
      float want = dt_e2m1_to_f32(code) * sc * wq->scale2;
      exact &= rq[c] == want;
      /* Round to nearest: off by at most half the widest e2m1 step (1.0)
       * times the block scale, plus the scale's own rounding. */
      within &= fabsf(rq[c] - rb[c]) <= 1.0f * sc * wq->scale2 * 1.07f + 1e-9f;
      err2 += (double)(rq[c] - rb[c]) * (rq[c] - rb[c]);
      ref2 += (double)rb[c] * rb[c];
    }
  }
  T_CHECK(exact);
  T_CHECK(within);
  T_CHECK(sqrt(err2 / ref2) < 0.15); /* NVFP4 of Gaussian weights: ~8-10% */
  /* The global scale follows amax / (6 * 448). */
  float amax = 0;
  for (int64_t r = 0; r < wb->rows; r++) {
    model_weight_row(wb, r, rb);
    for (int64_t c = 0; c < K; c++) amax = fmaxf(amax, fabsf(rb[c]));
  }
  T_NEAR(wq->scale2, amax / (6.0f * 448.0f), 1e-12);
  free(rq), free(rb);
  model_free(mq), model_free(mb);
}

/* One prefill of n tokens versus a prefill of n0 and single-token decode. */
static void check_decode(model *m, int64_t n, int64_t n0, bool absorbed, double tol) {
  int64_t V = m->cfg.vocab_size;
  int32_t tok[64];
  prompt(tok, n, V);
  float *full = prefill(m, tok, n, false);
  cpu_params p = {.max_ctx = 64, .absorbed = absorbed};
  cpu_model *s;
  mj_err err = {0};
  T_CHECK(cpu_model_create(m, &p, &s, &err) == 0);
  float *lg = malloc((size_t)(n * V) * sizeof *lg);
  T_CHECK(cpu_forward(s, tok, n0, 0, lg, true, &err) == 0);
  for (int64_t i = n0; i < n; i++) T_CHECK(cpu_forward(s, tok + i, 1, i, lg + i * V, false, &err) == 0);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, rel_err(lg + i * V, full + i * V, V));
  T_CHECK(worst < tol);
  if (worst >= tol) fprintf(stderr, "  worst relative error %.3g (absorbed %d)\n", worst, absorbed);
  /* Rewinding the cache and running again gives the same logits. */
  T_CHECK(cpu_forward(s, tok + n0, n - n0, n0, lg + n0 * V, true, &err) == 0);
  T_CHECK(rel_err(lg + n0 * V, full + n0 * V, (n - n0) * V) < tol);
  cpu_model_destroy(s);
  free(full), free(lg);
}

static void test_decode_equals_prefill(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.layers = 3, s.dense_layers = 1, s.idx_topk = 8, s.indexer_types = "FSF", s.seed = 11;
  s.n_group = 4, s.topk_group = 2, s.nvfp4 = true;
  model *m = load(mk("dsa", &s));
  check_decode(m, 30, 12, false, 1e-5);
  check_decode(m, 30, 1, false, 1e-5);
  model_free(m);
}

static void test_absorbed_equals_expanded(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.layers = 2, s.idx_topk = 10, s.seed = 5;
  model *m = load(mk("abs", &s));
  int32_t tok[40];
  prompt(tok, 40, m->cfg.vocab_size);
  float *a = prefill(m, tok, 40, false), *b = prefill(m, tok, 40, true);
  /* Synthetic weights keep the logits of O(1) spread: a fidelity test on
   * near-constant logits would prove little. */
  double mean = 0, var = 0;
  int64_t nl = 40 * m->cfg.vocab_size;
  for (int64_t i = 0; i < nl; i++) mean += a[i];
  mean /= (double)nl;
  for (int64_t i = 0; i < nl; i++) var += (a[i] - mean) * (a[i] - mean);
  T_CHECK(sqrt(var / (double)nl) > 0.3 && sqrt(var / (double)nl) < 30);
  T_CHECK(rel_err(b, a, 40 * m->cfg.vocab_size) < 1e-4);
  check_decode(m, 24, 8, true, 1e-4);
  free(a), free(b);
  model_free(m);
}

/* DSA sparsity: with index_topk k, positions below k see every earlier
 * token (identical logits to a dense model); later ones differ. */
static void test_dsa_selection(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.layers = 2, s.seed = 9, s.idx_topk = 64;
  model *dense = load(mk("dense", &s));
  s.idx_topk = 6;
  model *sparse = load(mk("sparse", &s));
  int64_t V = dense->cfg.vocab_size, n = 24;
  int32_t tok[24];
  prompt(tok, n, V);
  float *a = prefill(dense, tok, n, false), *b = prefill(sparse, tok, n, false);
  for (int64_t i = 0; i < 6; i++) T_CHECK(rel_err(b + i * V, a + i * V, V) == 0);
  int differ = 0;
  for (int64_t i = 6; i < n; i++) differ += rel_err(b + i * V, a + i * V, V) > 1e-3;
  T_CHECK(differ >= (n - 6) / 2);
  free(a), free(b);
  model_free(dense), model_free(sparse);
}

/* cpu_model_force_choices (for comparing engines whose near-tie choices
 * differ): forcing the model's own routing changes nothing; a changed
 * expert set or DSA selection changes exactly the rows it is given to and
 * what they feed; the forcing lasts one call, while the dump still shows
 * the model's own choices. */
static void test_forced_choices(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.layers = 3, s.dense_layers = 1, s.idx_topk = 8, s.indexer_types = "FSF", s.seed = 17, s.nvfp4 = true;
  model *m = load(mk("force", &s));
  enum { N = 20, D = 32 };
  int64_t V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers, K = m->cfg.num_experts_per_tok;
  int64_t E = m->cfg.n_routed_experts, KS = m->cfg.index_topk;
  int32_t tok[N + 1];
  prompt(tok, N + 1, V);
  cpu_params p = {.max_ctx = 64};
  cpu_model *a, *b;
  mj_err err = {0};
  T_CHECK(cpu_model_create(m, &p, &a, &err) == 0 && cpu_model_create(m, &p, &b, &err) == 0);
  float *la = malloc((size_t)(N * V) * 4), *lb = malloc((size_t)(N * V) * 4);
  int64_t *own = calloc((size_t)(L * D * K), sizeof *own), *own2 = calloc((size_t)(L * D * K), sizeof *own2);
  int32_t *ids = calloc((size_t)(L * N * K), 4), *sel = calloc((size_t)(L * N * KS), 4);
  cpu_model_set_choice_dump(a, NULL, own, D);
  T_CHECK(cpu_forward(a, tok, N, 0, la, true, &err) == 0);
  /* 1. The model's own routing, forced: the same logits, bit for bit. */
  for (int64_t l = 0; l < L; l++)
    for (int64_t t = 0; t < N; t++)
      for (int64_t k = 0; k < K; k++) ids[(l * N + t) * K + k] = (int32_t)own[(l * D + t) * K + k];
  cpu_model_force_choices(b, NULL, ids, N);
  T_CHECK(cpu_forward(b, tok, N, 0, lb, true, &err) == 0);
  T_CHECK(memcmp(la, lb, (size_t)(N * V) * 4) == 0);
  /* 2. Token 5 of the last layer takes one other expert: rows 0-4 keep
   * their logits, row 5 moves, and the dump still holds the own choice. */
  int64_t last = L - 1, *r5 = own + (last * D + 5) * K;
  int32_t other = 0;
  for (bool used = true; used; other++) {
    used = false;
    for (int64_t k = 0; k < K; k++) used |= r5[k] == other;
    if (!used) break;
  }
  T_CHECK(other < E);
  ids[(last * N + 5) * K + K - 1] = other;
  cpu_model_set_choice_dump(b, NULL, own2, D);
  cpu_model_force_choices(b, NULL, ids, N);
  T_CHECK(cpu_forward(b, tok, N, 0, lb, true, &err) == 0);
  T_CHECK(memcmp(la, lb, (size_t)(5 * V) * 4) == 0);
  T_CHECK(rel_err(lb + 5 * V, la + 5 * V, V) > 1e-4);
  T_CHECK(memcmp(own, own2, (size_t)(L * D * K) * sizeof *own) == 0);
  /* 3. The forcing lasts one call: the next step of b equals a's. */
  float *na = malloc((size_t)V * 4), *nb = malloc((size_t)V * 4);
  T_CHECK(cpu_forward(b, tok, N, 0, lb, true, &err) == 0); /* rewind b to a's history */
  T_CHECK(cpu_forward(a, tok + N, 1, N, na, false, &err) == 0);
  T_CHECK(cpu_forward(b, tok + N, 1, N, nb, false, &err) == 0);
  T_CHECK(memcmp(na, nb, (size_t)V * 4) == 0);
  /* 4. A DSA selection of the first index_topk positions on every indexer
   * layer: rows that see at most index_topk keys keep their logits, the
   * later ones move; out-of-range entries are ignored. */
  for (int64_t i = 0; i < L * N * KS; i++) sel[i] = (int32_t)(i % KS);
  sel[(0 * N + N - 1) * KS] = -1, sel[(0 * N + N - 1) * KS + 1] = 1000; /* ignored */
  cpu_model_force_choices(b, sel, NULL, N);
  T_CHECK(cpu_forward(b, tok, N, 0, lb, true, &err) == 0);
  T_CHECK(memcmp(la, lb, (size_t)(KS * V) * 4) == 0);
  int moved = 0;
  for (int64_t i = KS; i < N; i++) moved += rel_err(lb + i * V, la + i * V, V) > 1e-4;
  T_CHECK(moved >= (N - KS) / 2);
  T_CHECK(isfinite(lb[(N - 1) * V]));
  cpu_model_destroy(a), cpu_model_destroy(b);
  free(la), free(lb), free(na), free(nb), free(own), free(own2), free(ids), free(sel);
  model_free(m);
}

static void test_mkmodel_deterministic(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.nvfp4 = true, s.seed = 21;
  model *a = load(mk("d1", &s));
  s.shard_size = 100000;
  model *b = load(mk("d2", &s));
  T_CHECK(b->st.nfiles > 1);
  T_EQ_INT(a->st.ntensors, b->st.ntensors);
  int same = 1;
  for (size_t i = 0; i < a->st.ntensors; i++) {
    const st_tensor *x = &a->st.tensors[i], *y = st_find(&b->st, x->name);
    same &= y && y->nbytes == x->nbytes && memcmp(x->data, y->data, x->nbytes) == 0;
    /* Every offset before the 4-byte scalars is 8-byte aligned. */
    if (x->nbytes % 8 == 0) same &= (((const uint8_t *)x->data - (const uint8_t *)a->st.files[0].map) % 8) == 0;
  }
  T_CHECK(same);
  model_free(a), model_free(b);
  /* The GLM-5 special tokens: at their real ids when the vocabulary reaches
   * them, else the last 36 ids. */
  T_EQ_INT(mkmodel_special_base(154880), 154820);
  T_EQ_INT(mkmodel_special_base(384), 348);
}

static void test_tokenizer_json(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/d1/tokenizer.json", tmpdir);
  char *text;
  size_t len;
  mj_err err = {0};
  T_CHECK(mj_read_file(path, &text, &len, &err) == 0);
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  json *j;
  T_CHECK(json_parse(&a, text, len, "tokenizer.json", &j, &err) == 0);
  json *added = json_get(j, "added_tokens"), *model = json_get(j, "model");
  json *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
  T_EQ_INT(added->len, 36);
  T_EQ_INT(json_get(json_at(added, 0), "id")->i, 348);
  T_EQ_STR(json_get(json_at(added, 0), "content")->str, "<|endoftext|>");
  T_EQ_STR(json_get(json_at(added, 2), "content")->str, "[gMASK]");
  T_EQ_INT(json_get(json_at(added, 21), "id")->i, 348 + 21);
  T_EQ_STR(json_get(json_at(added, 21), "content")->str, "<think>");
  T_CHECK(vocab->len > 256 && vocab->len <= 348);
  T_CHECK(merges->len > 0);
  /* Each merge joins two vocabulary entries into another one. */
  int ok = 1;
  for (size_t i = 0; i < merges->len; i++) {
    json *m = merges->items[i];
    const char *x = m->items[0]->str, *y = m->items[1]->str;
    char both[256];
    snprintf(both, sizeof both, "%s%s", x, y);
    ok &= json_get(vocab, x) && json_get(vocab, y) && json_get(vocab, both);
  }
  T_CHECK(ok);
  T_EQ_INT(json_get(vocab, "\xc4\xa0")->i, 32); /* the space byte is U+0120 */
  mj_arena_free(&a);
  free(text);
}

static void test_forward_errors(void) {
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  model *m = load(mk("err", &s));
  cpu_params p = {.max_ctx = 16};
  cpu_model *cm;
  mj_err err = {0};
  T_CHECK(cpu_model_create(m, &p, &cm, &err) == 0);
  int32_t tok[20] = {1, 2, 400};
  T_CHECK(cpu_forward(cm, tok, 3, 0, NULL, false, &err) == MJ_EINPUT);
  T_CHECK(strstr(err.msg, "token id 400") != NULL);
  mj_err_clear(&err);
  tok[2] = 3;
  T_CHECK(cpu_forward(cm, tok, 3, 1, NULL, false, &err) == MJ_EINPUT);
  mj_err_clear(&err);
  T_CHECK(cpu_forward(cm, tok, 17, 0, NULL, false, &err) == MJ_EINPUT);
  mj_err_clear(&err);
  T_CHECK(cpu_forward(cm, tok, 3, 0, NULL, false, &err) == 0);
  T_EQ_INT(cpu_model_len(cm), 3);
  cpu_model_destroy(cm);
  model_free(m);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/moejit-model.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmpdir)) return 1;
  T_RUN(test_glob);
  T_RUN(test_topk);
  T_RUN(test_topk_torch);
  T_RUN(test_route);
  T_RUN(test_glm5_config);
  T_RUN(test_rope);
  T_RUN(test_nvfp4_dequant);
  T_RUN(test_decode_equals_prefill);
  T_RUN(test_absorbed_equals_expanded);
  T_RUN(test_dsa_selection);
  T_RUN(test_forced_choices);
  T_RUN(test_mkmodel_deterministic);
  T_RUN(test_tokenizer_json);
  T_RUN(test_forward_errors);
  nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return t_status();
}
