/* cpu_forward.c: the GLM-5 forward pass on the CPU (cpu_forward.h).
 *
 * The structure follows transformers' GlmMoeDsaForCausalLM (5.17) step by
 * step; where the reference's choice is not obvious, the comment says what
 * it does.  Shapes are [token][feature] row-major float32 throughout; a
 * forward call allocates its activations (the sizes depend on n) and frees
 * them at the end, while the caches live in the cpu_model.
 *
 * DSA: for each query, the layer's indexer scores every visible cached key;
 * when more than index_topk keys are visible only the index_topk best may be
 * attended to, equal scores decided as transformers' torch.topk decides them
 * (ref_topk_torch: ties are common, a key whose every head is negative
 * scores exactly 0).  "shared" layers reuse the previous layer's selection.  A
 * query's selection is a byte mask over the cache, kept across layers of one
 * call so shared layers can read it.
 */
#include "cpu_forward.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "ref_model.h"
#include "shard.h"

/* One rank's slices of one layer (cpu_params.tp/ep). */
typedef struct rank_layer {
  model_weight q_b, kv_b, o; /* its heads' rows of q_b and kv_b, o's columns that read them */
  model_mlp dense;           /* its intermediate rows (dense layers) */
  model_mlp *experts;        /* [n_routed_experts]: its slice of the experts it owns (others unused) */
  model_mlp shared;
} rank_layer;

typedef struct layer_cache {
  float *latent; /* [max_ctx][kv_lora_rank], after kv_a_layernorm */
  float *krope;  /* [max_ctx][qk_rope_head_dim], rotated */
  float *ikey;   /* [max_ctx][index_head_dim], after k_norm and RoPE; NULL on shared layers */
} layer_cache;

struct cpu_model {
  const model *m;
  cpu_params p;
  int64_t len;
  layer_cache *lc;
  float *inv_freq; /* [qk_rope_head_dim / 2] */
  float *dump;
  uint8_t *sel_dump;   /* [layer][token][max_ctx]: DSA masks of the layers with their own indexer */
  int64_t *route_dump; /* [layer][token][topk]: the experts chosen */
  int dump_max;        /* tokens the dumps hold */
  float *choice_dump;  /* [layer][token][experts]: router choice values */
  float *score_dump;   /* [layer][token][max_ctx]: indexer scores */
  int score_max;       /* tokens those hold */
  const int32_t *force_sel, *force_ids; /* cpu_model_force_choices, for the next call */
  int force_max;
  int world;            /* ranks computed (1: the unsplit model) */
  shard_plan *plan;     /* [world] */
  rank_layer **rl;      /* [world][layers] */
  mj_arena shards;      /* the column slices (copies) */
};

static float *xalloc_f(size_t n) {
  return mj_xmalloc((n ? n : 1) * sizeof(float));
}

int cpu_model_create(const model *m, const cpu_params *p, cpu_model **out, mj_err *err) {
  const model_config *c = &m->cfg;
  *out = NULL;
  if (strcmp(c->rope_type, "default") != 0)
    return mj_fail(err, MJ_EINPUT, "%s/config.json: rope_type \"%s\" is not supported by the CPU reference yet (only \"default\")",
                   m->dir, c->rope_type);
  cpu_model *s = mj_xcalloc(1, sizeof *s);
  s->m = m;
  s->p = *p;
  if (s->p.max_ctx <= 0) s->p.max_ctx = 4096;
  if (s->p.max_ctx > c->max_position_embeddings) s->p.max_ctx = c->max_position_embeddings;
  int64_t T = s->p.max_ctx;
  s->lc = mj_xcalloc((size_t)c->num_hidden_layers, sizeof *s->lc);
  for (int64_t L = 0; L < c->num_hidden_layers; L++) {
    s->lc[L].latent = xalloc_f((size_t)(T * c->kv_lora_rank));
    s->lc[L].krope = xalloc_f((size_t)(T * c->qk_rope_head_dim));
    if (m->layers[L].has_indexer) s->lc[L].ikey = xalloc_f((size_t)(T * c->index_head_dim));
  }
  s->inv_freq = xalloc_f((size_t)c->qk_rope_head_dim / 2);
  model_rope_inv_freq(c->rope_theta, c->qk_rope_head_dim, s->inv_freq);
  int tp = p->tp > 1 ? p->tp : 1, ep = p->ep > 1 ? p->ep : 1;
  s->world = tp > ep ? tp : ep;
  if (s->world > 1) {
    mj_arena_init(&s->shards, 1 << 20);
    s->plan = mj_xcalloc((size_t)s->world, sizeof *s->plan);
    s->rl = mj_xcalloc((size_t)s->world, sizeof *s->rl);
    for (int r = 0; r < s->world; r++) {
      int rc = shard_plan_make(c, r, tp, ep, &s->plan[r], err);
      if (rc) {
        cpu_model_destroy(s);
        return rc;
      }
      const shard_plan *pl = &s->plan[r];
      s->rl[r] = mj_xcalloc((size_t)c->num_hidden_layers, sizeof **s->rl);
      for (int64_t L = 0; L < c->num_hidden_layers; L++) {
        const model_layer *ly = &m->layers[L];
        rank_layer *k = &s->rl[r][L];
        shard_weight_rows(&ly->q_b, pl->q_b_rows, &k->q_b);
        shard_weight_rows(&ly->kv_b, pl->kv_b_rows, &k->kv_b);
        shard_weight_cols(&ly->o, pl->o_cols, &s->shards, &k->o);
        if (!ly->sparse) {
          shard_mlp(&ly->dense, pl->dense_inter, &s->shards, &k->dense);
          continue;
        }
        k->experts = mj_xcalloc((size_t)c->n_routed_experts, sizeof *k->experts);
        for (int64_t e = pl->experts.begin; e < pl->experts.end; e++) k->experts[e] = ly->experts[e]; /* whole */
        if (c->n_shared_experts > 0) shard_mlp(&ly->shared, pl->shared_inter, &s->shards, &k->shared);
      }
    }
  }
  *out = s;
  return 0;
}

void cpu_model_destroy(cpu_model *s) {
  if (!s) return;
  for (int64_t L = 0; L < s->m->cfg.num_hidden_layers; L++) {
    free(s->lc[L].latent);
    free(s->lc[L].krope);
    free(s->lc[L].ikey);
  }
  free(s->lc);
  free(s->inv_freq);
  for (int r = 0; s->rl && r < s->world; r++) {
    for (int64_t L = 0; s->rl[r] && L < s->m->cfg.num_hidden_layers; L++) free(s->rl[r][L].experts);
    free(s->rl[r]);
  }
  free(s->rl), free(s->plan);
  if (s->world > 1) mj_arena_free(&s->shards);
  free(s);
}

int64_t cpu_model_len(const cpu_model *s) { return s->len; }
void cpu_model_set_dump(cpu_model *s, float *dump) { s->dump = dump; }
void cpu_model_set_choice_dump(cpu_model *s, uint8_t *sel, int64_t *ids, int max_tokens) {
  s->sel_dump = sel, s->route_dump = ids, s->dump_max = max_tokens;
}
void cpu_model_set_score_dump(cpu_model *s, float *choice, float *score, int max_tokens) {
  s->choice_dump = choice, s->score_dump = score, s->score_max = max_tokens;
}
void cpu_model_force_choices(cpu_model *s, const int32_t *sel, const int32_t *ids, int max_tokens) {
  s->force_sel = sel, s->force_ids = ids, s->force_max = max_tokens;
}

/* ---- the DSA indexer ---------------------------------------------------------------- */
/* Fill sel[i][0..T) for the n queries: 1 where query i may attend. */
static void indexer(cpu_model *s, int64_t L, const model_layer *ly, layer_cache *lc, const float *xn,
                    const float *qr, int64_t n, int64_t pos, uint8_t *sel, int64_t T) {
  const model_config *c = &s->m->cfg;
  int64_t nh = c->index_n_heads, hd = c->index_head_dim, dr = c->qk_rope_head_dim;
  int th = s->p.threads;
  float *q = xalloc_f((size_t)(n * nh * hd)), *k = xalloc_f((size_t)(n * hd)), *w = xalloc_f((size_t)(n * nh));
  ref_matmul(&ly->idx_wq_b, qr, n, q, th); /* from q_resid, the normalised q latent */
  ref_matmul(&ly->idx_wk, xn, n, k, th);   /* from the layer's normalised input */
  ref_matmul(&ly->idx_wproj, xn, n, w, th);
  for (int64_t i = 0; i < n; i++) {
    /* Rope part FIRST in the indexer ([rope | rest]), unlike attention. */
    for (int64_t h = 0; h < nh; h++) ref_rope_interleaved(q + (i * nh + h) * hd, dr, pos + i, s->inv_freq);
    float *ki = lc->ikey + (pos + i) * hd;
    ref_layernorm(k + i * hd, &ly->idx_k_norm_w, &ly->idx_k_norm_b, 1e-6, hd, ki);
    ref_rope_interleaved(ki, dr, pos + i, s->inv_freq);
    if (model_ikey_bf16()) /* the key a bf16 cache holds (MOEJIT_INDEXER_KEYS) */
      for (int64_t e = 0; e < hd; e++) ki[e] = dt_bf16_to_f32(dt_f32_to_bf16(ki[e]));
  }
  float wscale = 1.0f / sqrtf((float)nh), sscale = 1.0f / sqrtf((float)hd);
  float *score = xalloc_f((size_t)T);
  int64_t *top = mj_xmalloc((size_t)c->index_topk * sizeof *top);
  for (int64_t i = 0; i < n; i++) {
    int64_t p = pos + i, vis = p + 1;
    uint8_t *si = sel + i * T;
    memset(si, 0, (size_t)T);
    if (vis <= c->index_topk) {
      /* top-k of fewer keys than k: every visible key is chosen (the
       * causal mask still hides the later ones). */
      memset(si, 1, (size_t)vis);
      continue;
    }
    for (int64_t j = 0; j < vis; j++) {
      float acc = 0;
      for (int64_t h = 0; h < nh; h++) {
        float d = 0;
        const float *qh = q + (i * nh + h) * hd, *kj = lc->ikey + j * hd;
        for (int64_t e = 0; e < hd; e++) d += qh[e] * kj[e];
        d *= sscale;
        if (d > 0) acc += (w[i * nh + h] * wscale) * d; /* ReLU per head, then the head weight */
      }
      score[j] = acc;
    }
    /* The reference takes torch.topk over the whole row of this call's T
     * keys, the causally masked ones holding score + finfo(float32).min,
     * which rounds to -FLT_MAX; the row's length and those entries steer
     * which of several equal scores win (ref_topk.c), so they are kept. */
    if (s->score_dump && i < s->score_max)
      memcpy(s->score_dump + (L * s->score_max + i) * s->p.max_ctx, score, (size_t)vis * sizeof *score);
    for (int64_t j = vis; j < T; j++) score[j] = -FLT_MAX;
    ref_topk_torch(score, T, c->index_topk, top);
    for (int64_t t = 0; t < c->index_topk; t++) si[top[t]] = 1;
  }
  for (int64_t t = 0; s->sel_dump && t < n && t < s->dump_max; t++) /* our own choice, then a forced one */
    memcpy(s->sel_dump + (L * s->dump_max + t) * s->p.max_ctx, sel + t * T, (size_t)T);
  for (int64_t i = 0; s->force_sel && i < n && i < s->force_max; i++) {
    int64_t vis = pos + i + 1;
    if (vis <= c->index_topk) continue;
    const int32_t *f = s->force_sel + (L * s->force_max + i) * c->index_topk;
    memset(sel + i * T, 0, (size_t)T);
    for (int64_t t = 0; t < c->index_topk; t++)
      if (f[t] >= 0 && f[t] < vis) sel[i * T + f[t]] = 1;
  }
  free(q), free(k), free(w), free(score), free(top);
}

/* ---- MLA attention ---------------------------------------------------------------------- */
/* The attention of nh heads whose q_b rows, kv_b rows and o columns are
 * given (all heads, or one rank's), from the normalised q latent qa and the
 * layer's cache; out [n][hidden] is o's (partial) output. */
static void attend_heads(cpu_model *s, int64_t L, const model_weight *q_b, const model_weight *kv_b,
                         const model_weight *ow, int64_t nh, const float *qa, int64_t n, int64_t pos,
                         const uint8_t *sel, float *out) {
  const model_config *c = &s->m->cfg;
  layer_cache *lc = &s->lc[L];
  int64_t dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
  int64_t r = c->kv_lora_rank, dq = dn + dr, T = pos + n;
  int th = s->p.threads;
  float *q = xalloc_f((size_t)(n * nh * dq));
  ref_matmul(q_b, qa, n, q, th);
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < nh; h++) ref_rope_interleaved(q + (i * nh + h) * dq + dn, dr, pos + i, s->inv_freq);
  float scale = 1.0f / sqrtf((float)dq);
  float *o = xalloc_f((size_t)(n * nh * dv)), *p = xalloc_f((size_t)T);
  int64_t kvw = nh * (dn + dv);
  if (!s->p.absorbed) {
    /* Expanded: k_nope and v of every cached token through kv_b_proj. */
    float *kv = xalloc_f((size_t)(T * kvw));
    ref_matmul(kv_b, lc->latent, T, kv, th);
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + (i * nh + h) * dq, *kh = kv + h * (dn + dv);
        ref_attend(qh, kh, dn, kvw, qh + dn, lc->krope, dr, dr, sel + i * T, pos + i + 1, scale, kh + dn, dv, kvw, p,
                   o + (i * nh + h) * dv);
      }
    free(kv);
  } else {
    /* Absorbed: q_lat = W_uk^T q_nope per head, scores against the cached
     * latents, the output latent expanded by W_uv afterwards. */
    float *wkb = xalloc_f((size_t)(kvw * r)), *ql = xalloc_f((size_t)r), *ol = xalloc_f((size_t)r);
    for (int64_t row = 0; row < kvw; row++) model_weight_row(kv_b, row, wkb + row * r);
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < nh; h++) {
        const float *qh = q + (i * nh + h) * dq;
        memset(ql, 0, (size_t)r * sizeof *ql);
        for (int64_t e = 0; e < dn; e++) {
          const float *wr = wkb + (h * (dn + dv) + e) * r;
          for (int64_t a = 0; a < r; a++) ql[a] += qh[e] * wr[a];
        }
        ref_attend(ql, lc->latent, r, r, qh + dn, lc->krope, dr, dr, sel + i * T, pos + i + 1, scale, lc->latent, r, r,
                   p, ol);
        float *oh = o + (i * nh + h) * dv;
        for (int64_t e = 0; e < dv; e++) {
          const float *wr = wkb + (h * (dn + dv) + dn + e) * r;
          float d = 0;
          for (int64_t a = 0; a < r; a++) d += wr[a] * ol[a];
          oh[e] = d;
        }
      }
    free(wkb), free(ql), free(ol);
  }
  ref_matmul(ow, o, n, out, th);
  free(q), free(o), free(p);
}

/* out[t] += part[t] for n rows of the hidden width: a rank's partial result
 * into the sum (the all-reduce, in rank order). */
static void add_rows(float *out, const float *part, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] += part[i];
}

static void attention(cpu_model *s, int64_t L, const float *xn, int64_t n, int64_t pos, uint8_t *sel,
                      float *out) {
  const model_config *c = &s->m->cfg;
  const model_layer *ly = &s->m->layers[L];
  layer_cache *lc = &s->lc[L];
  int64_t nh = c->num_attention_heads, dr = c->qk_rope_head_dim, H = c->hidden_size;
  int64_t r = c->kv_lora_rank, qr = c->q_lora_rank, T = pos + n;
  int th = s->p.threads;

  /* q_resid = q_a_layernorm(q_a_proj(x)); the latent norms use the RMSNorm
   * class default eps 1e-6, not rms_norm_eps.  (Whole on every rank.) */
  float *qa = xalloc_f((size_t)(n * qr));
  ref_matmul(&ly->q_a, xn, n, qa, th);
  for (int64_t i = 0; i < n; i++) ref_rmsnorm(qa + i * qr, &ly->q_a_norm, 1e-6, qr, qa + i * qr);
  float *ckv = xalloc_f((size_t)(n * (r + dr)));
  ref_matmul(&ly->kv_a, xn, n, ckv, th);
  for (int64_t i = 0; i < n; i++) {
    ref_rmsnorm(ckv + i * (r + dr), &ly->kv_a_norm, 1e-6, r, lc->latent + (pos + i) * r);
    float *kr = lc->krope + (pos + i) * dr;
    memcpy(kr, ckv + i * (r + dr) + r, (size_t)dr * sizeof *kr);
    ref_rope_interleaved(kr, dr, pos + i, s->inv_freq);
  }
  if (ly->has_indexer) indexer(s, L, ly, lc, xn, qa, n, pos, sel, T);
  if (s->world == 1 || !s->plan[0].attn_reduce) {
    attend_heads(s, L, &ly->q_b, &ly->kv_b, &ly->o, nh, qa, n, pos, sel, out);
  } else { /* each rank its heads; their o_proj partials summed */
    float *part = xalloc_f((size_t)(n * H));
    memset(out, 0, (size_t)(n * H) * sizeof *out);
    for (int k = 0; k < s->world; k++) {
      const rank_layer *rl = &s->rl[k][L];
      int64_t hk = s->plan[k].heads.end - s->plan[k].heads.begin;
      attend_heads(s, L, &rl->q_b, &rl->kv_b, &rl->o, hk, qa, n, pos, sel, part);
      add_rows(out, part, n * H);
    }
    free(part);
  }
  free(qa), free(ckv);
}

/* ---- MoE ---------------------------------------------------------------------------------- */
/* out = the routed experts e0..e1 (mlps[e]) on the tokens that chose them,
 * weighted, plus the shared expert (may be NULL).  Experts in ascending
 * order, each on its tokens (the reference's loop order, so the sums add
 * up in the same order). */
static void moe_experts(cpu_model *s, const model_mlp *mlps, int64_t e0, int64_t e1, const model_mlp *shared,
                        const float *xn, int64_t n, const int64_t *idx, const float *w, float *out) {
  const model_config *c = &s->m->cfg;
  int64_t H = c->hidden_size, K = c->num_experts_per_tok;
  int th = s->p.threads;
  memset(out, 0, (size_t)(n * H) * sizeof *out);
  float *xe = xalloc_f((size_t)(n * H)), *ye = xalloc_f((size_t)(n * H)), *we = xalloc_f((size_t)n);
  int64_t *te = mj_xmalloc((size_t)n * sizeof *te);
  for (int64_t e = e0; e < e1; e++) {
    int64_t m = 0;
    for (int64_t t = 0; t < n; t++)
      for (int64_t k = 0; k < K; k++)
        if (idx[t * K + k] == e) {
          te[m] = t, we[m] = w[t * K + k];
          memcpy(xe + m * H, xn + t * H, (size_t)H * sizeof *xe);
          m++;
        }
    if (!m) continue;
    ref_swiglu(&mlps[e], xe, m, ye, th);
    for (int64_t i = 0; i < m; i++)
      for (int64_t d = 0; d < H; d++) out[te[i] * H + d] += ye[i * H + d] * we[i];
  }
  if (shared) {
    ref_swiglu(shared, xn, n, ye, th);
    for (int64_t i = 0; i < n * H; i++) out[i] += ye[i];
  }
  free(xe), free(ye), free(we), free(te);
}

static void moe(cpu_model *s, int64_t L, const model_layer *ly, const float *xn, int64_t n, float *out) {
  const model_config *c = &s->m->cfg;
  int64_t H = c->hidden_size, E = c->n_routed_experts, K = c->num_experts_per_tok;
  int th = s->p.threads;
  float *logits = xalloc_f((size_t)(n * E)), *w = xalloc_f((size_t)(n * K));
  int64_t *idx = mj_xmalloc((size_t)(n * K) * sizeof *idx);
  ref_matmul(&ly->router, xn, n, logits, th); /* fp32 router logits */
  for (int64_t t = 0; t < n; t++) ref_route(logits + t * E, &ly->router_bias, c, idx + t * K, w + t * K);
  for (int64_t t = 0; s->choice_dump && t < n && t < s->score_max; t++)
    for (int64_t e = 0; e < E; e++)
      s->choice_dump[(L * s->score_max + t) * E + e] = ref_sigmoid(logits[t * E + e]) + model_vec_at(&ly->router_bias, e);
  for (int64_t t = 0; s->route_dump && t < n && t < s->dump_max; t++)
    memcpy(s->route_dump + (L * s->dump_max + t) * K, idx + t * K, (size_t)K * sizeof *idx);
  for (int64_t t = 0; s->force_ids && t < n && t < s->force_max; t++) {
    for (int64_t k = 0; k < K; k++) idx[t * K + k] = s->force_ids[(L * s->force_max + t) * K + k];
    ref_route_weights(logits + t * E, c, idx + t * K, w + t * K);
  }
  if (s->world == 1) {
    moe_experts(s, ly->experts, 0, E, c->n_shared_experts > 0 ? &ly->shared : NULL, xn, n, idx, w, out);
  } else { /* each rank its experts (or their slices) and its slice of the shared one, summed */
    float *part = xalloc_f((size_t)(n * H));
    memset(out, 0, (size_t)(n * H) * sizeof *out);
    for (int k = 0; k < s->world; k++) {
      const rank_layer *rl = &s->rl[k][L];
      moe_experts(s, rl->experts, s->plan[k].experts.begin, s->plan[k].experts.end,
                  c->n_shared_experts > 0 ? &rl->shared : NULL, xn, n, idx, w, part);
      add_rows(out, part, n * H);
    }
    free(part);
  }
  free(logits), free(w), free(idx);
}

/* ---- the whole pass ------------------------------------------------------------------------- */
int cpu_forward(cpu_model *s, const int32_t *tokens, int64_t n, int64_t pos, float *logits, bool all_logits,
                mj_err *err) {
  const model *m = s->m;
  const model_config *c = &m->cfg;
  int64_t H = c->hidden_size, V = c->vocab_size;
  if (n <= 0) return mj_fail(err, MJ_EINPUT, "cpu_forward: no tokens to run");
  if (pos < 0 || pos > s->len)
    return mj_fail(err, MJ_EINPUT, "cpu_forward: position %lld is past the %lld cached tokens", (long long)pos,
                   (long long)s->len);
  if (pos + n > s->p.max_ctx)
    return mj_fail(err, MJ_EINPUT, "cpu_forward: %lld tokens exceed the context of %lld", (long long)(pos + n),
                   (long long)s->p.max_ctx);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] < 0 || tokens[i] >= V)
      return mj_fail(err, MJ_EINPUT, "cpu_forward: token id %d is outside the vocabulary (0..%lld)", tokens[i],
                     (long long)V - 1);
  int64_t T = pos + n;
  float *x = xalloc_f((size_t)(n * H)), *xn = xalloc_f((size_t)(n * H)), *y = xalloc_f((size_t)(n * H));
  uint8_t *sel = mj_xcalloc((size_t)(n * T), 1);
  for (int64_t i = 0; i < n; i++) model_weight_row(&m->embed, tokens[i], x + i * H);
  for (int64_t L = 0; L < c->num_hidden_layers; L++) {
    const model_layer *ly = &m->layers[L];
    for (int64_t i = 0; i < n; i++) ref_rmsnorm(x + i * H, &ly->input_norm, c->rms_norm_eps, H, xn + i * H);
    attention(s, L, xn, n, pos, sel, y);
    for (int64_t i = 0; i < n * H; i++) x[i] += y[i];
    for (int64_t i = 0; i < n; i++) ref_rmsnorm(x + i * H, &ly->post_norm, c->rms_norm_eps, H, xn + i * H);
    if (ly->sparse) {
      moe(s, L, ly, xn, n, y);
    } else if (s->world == 1 || !s->plan[0].dense_reduce) {
      ref_swiglu(&ly->dense, xn, n, y, s->p.threads);
    } else { /* each rank its intermediate rows, summed */
      float *part = xalloc_f((size_t)(n * H));
      memset(y, 0, (size_t)(n * H) * sizeof *y);
      for (int k = 0; k < s->world; k++) {
        ref_swiglu(&s->rl[k][L].dense, xn, n, part, s->p.threads);
        add_rows(y, part, n * H);
      }
      free(part);
    }
    for (int64_t i = 0; i < n * H; i++) x[i] += y[i];
    if (s->dump) memcpy(s->dump + L * n * H, x, (size_t)(n * H) * sizeof *x);
  }
  s->len = T;
  if (logits) {
    int64_t first = all_logits ? 0 : n - 1;
    for (int64_t i = first; i < n; i++) ref_rmsnorm(x + i * H, &m->norm, c->rms_norm_eps, H, xn + (i - first) * H);
    ref_matmul(&m->lm_head, xn, n - first, logits, s->p.threads);
  }
  free(x), free(xn), free(y), free(sel);
  s->dump = NULL;
  s->force_sel = s->force_ids = NULL; /* one call only */
  return 0;
}
