/* mkmodel.c: `moejit mkmodel`, synthetic GLM-5 checkpoints in the exact
 * Hugging Face / NVIDIA ModelOpt layout.
 *
 * Tests, benchmarks and the fidelity fixtures need GLM-5 checkpoints of any
 * width without downloading one.  This writes config.json, safetensors (one
 * file, or shards plus model.safetensors.index.json), hf_quant_config.json
 * for --nvfp4, and a small byte-level BPE tokenizer.json.
 *
 * Determinism: every tensor draws from its own generator, seeded by the
 * --seed and the tensor's name, so values do not depend on sharding or order,
 * and the NVFP4 model of a seed quantises exactly the bf16 weights of the
 * same seed.  Normal deviates are an Irwin-Hall sum of four 16-bit uniforms:
 * integer arithmetic and one exact scaling, no libm, so the GPU host (another
 * C library) writes the same bytes as this machine.
 *
 * Streaming: the header of each file is planned first (sizes follow from the
 * config), then tensors are generated and written in chunks, so a full-width
 * model of several GB never sits in memory; only one NVFP4 weight (one
 * expert projection) is held at a time, since its global scale needs the
 * amax of the whole tensor.
 *
 * Layout: safetensors forbids holes between tensors, so 8-byte aligned
 * offsets are obtained by ordering: in each file, the tensors whose size is a
 * multiple of 8 come first, the rest (the 4-byte NVFP4 scalars) last.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "json.h"
#include "mkmodel.h"
#include "model.h"

/* ---- random numbers ------------------------------------------------------------ */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t name_seed(uint64_t seed, const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  uint64_t s = seed ^ h;
  splitmix64(&s);
  return s;
}

/* Approximately N(0, 1): (sum of four uniform 16-bit integers - mean) / sd,
 * exact in double; the result is rounded once to float. */
static float normal01(uint64_t *s) {
  uint64_t r = splitmix64(s);
  int64_t sum = (int64_t)(r & 0xFFFF) + (int64_t)((r >> 16) & 0xFFFF) + (int64_t)((r >> 32) & 0xFFFF) +
                (int64_t)(r >> 48);
  /* mean 2 * 65535, variance 4 * (65536^2 - 1) / 12 */
  static const double inv_sd = 1.0 / 37837.2262;
  return (float)((double)(sum - 131070) * inv_sd);
}

/* Values i0..i0+n of a tensor's stream: splitmix64's state after i steps is
 * seed + i * gamma, so any stretch can be generated on its own (by several
 * threads) and still equal the sequential stream. */
static void fill(uint64_t seed, uint64_t i0, size_t n, float mean, float sd, bool round_bf16, float *out) {
  uint64_t st = seed + i0 * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; i++) {
    float v = mean + sd * normal01(&st);
    out[i] = round_bf16 ? dt_bf16_to_f32(dt_f32_to_bf16(v)) : v;
  }
}

/* Run fn(ctx, lo, hi) over [0, n) split into nthreads parts (pthreads). */
static void par_for(int nthreads, int64_t n, void (*fn)(void *, int64_t, int64_t), void *ctx);

typedef struct {
  void (*fn)(void *, int64_t, int64_t);
  void *ctx;
  int64_t lo, hi;
} par_job;

static void *par_run(void *arg) {
  par_job *j = arg;
  j->fn(j->ctx, j->lo, j->hi);
  return NULL;
}

static void par_for(int nthreads, int64_t n, void (*fn)(void *, int64_t, int64_t), void *ctx) {
  enum { MAXT = 16 };
  if (nthreads < 1) nthreads = 1;
  if (nthreads > MAXT) nthreads = MAXT;
  if (nthreads > n) nthreads = n > 0 ? (int)n : 1;
  par_job job[MAXT];
  pthread_t th[MAXT];
  bool started[MAXT] = {0};
  for (int i = 0; i < nthreads; i++) job[i] = (par_job){fn, ctx, n * i / nthreads, n * (i + 1) / nthreads};
  for (int i = 1; i < nthreads; i++) started[i] = pthread_create(&th[i], NULL, par_run, &job[i]) == 0;
  par_run(&job[0]);
  for (int i = 1; i < nthreads; i++) {
    if (started[i]) pthread_join(th[i], NULL);
    else par_run(&job[i]);
  }
}

/* e2m1 code of x, round to nearest, ties to the even code: the same map as
 * dt_f32_to_e2m1 for finite x, written as a sum of comparisons (no
 * branches), because it runs once per weight of a full-width model.  At a
 * midpoint '>' keeps the lower (even) code and '>=' takes the upper. */
static inline uint8_t e2m1_code(float x) {
  float a = fabsf(x);
  uint8_t c = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                        (a > 5.0f));
  return (uint8_t)(signbit(x) ? c | 8 : c);
}

/* ---- the plan ------------------------------------------------------------------- */
typedef enum { G_BF16, G_F32, G_Q_CODES, G_Q_SCALE, G_Q_S2, G_Q_INPUT } gen_kind;

typedef struct entry {
  char *name;
  char *base;   /* the float weight the values come from ("P.weight") */
  gen_kind kind;
  st_dtype dtype;
  int ndim;
  int64_t shape[2];
  uint64_t nbytes;
  float mean, sd;
  int64_t rows, cols; /* NVFP4: the float weight's shape */
  int group;          /* tensors of one module share a shard */
  int shard;
  uint64_t offset;
} entry;

typedef struct plan {
  mkmodel_spec sp;
  mj_arena a;
  entry *e;
  int n, cap;
  int ngroups;
  int nshards;
} plan;

static entry *add(plan *p, const char *name, gen_kind k, st_dtype dt, int ndim, int64_t d0, int64_t d1,
                  float mean, float sd) {
  if (p->n == p->cap) {
    p->cap = p->cap ? 2 * p->cap : 256;
    p->e = mj_xrealloc(p->e, (size_t)p->cap * sizeof *p->e);
  }
  entry *e = &p->e[p->n++];
  memset(e, 0, sizeof *e);
  e->name = mj_arena_strdup(&p->a, name);
  e->base = e->name;
  e->kind = k;
  e->dtype = dt;
  e->ndim = ndim;
  e->shape[0] = d0;
  e->shape[1] = d1;
  uint64_t numel = ndim == 0 ? 1 : ndim == 1 ? (uint64_t)d0 : (uint64_t)d0 * (uint64_t)d1;
  e->nbytes = numel * st_dtype_size(dt);
  e->mean = mean;
  e->sd = sd;
  e->group = p->ngroups;
  return e;
}

/* A linear layer [rows][cols] with prefix P: bf16, or the four NVFP4 tensors. */
static void add_linear(plan *p, const char *prefix, int64_t rows, int64_t cols, bool nvfp4) {
  char name[512], base[512];
  snprintf(base, sizeof base, "%s.weight", prefix);
  /* 1/sqrt(fan_in) keeps every projection's output near unit scale, so the
   * forward pass neither vanishes nor explodes over layers. */
  float sd = (float)(1.0 / sqrt((double)cols));
  if (!nvfp4) {
    add(p, base, G_BF16, ST_BF16, 2, rows, cols, 0, sd);
  } else {
    entry *e = add(p, base, G_Q_CODES, ST_U8, 2, rows, cols / 2, 0, sd);
    e->rows = rows, e->cols = cols;
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    e = add(p, name, G_Q_SCALE, ST_F8_E4M3, 2, rows, cols / 16, 0, sd);
    e->base = mj_arena_strdup(&p->a, base), e->rows = rows, e->cols = cols;
    snprintf(name, sizeof name, "%s.weight_scale_2", prefix);
    e = add(p, name, G_Q_S2, ST_F32, 0, 0, 0, 0, sd);
    e->base = mj_arena_strdup(&p->a, base), e->rows = rows, e->cols = cols;
    snprintf(name, sizeof name, "%s.input_scale", prefix);
    e = add(p, name, G_Q_INPUT, ST_F32, 0, 0, 0, 0, sd);
  }
  p->ngroups++;
}

static void add_vec(plan *p, const char *name, int64_t n, float mean, float sd, bool f32) {
  add(p, name, f32 ? G_F32 : G_BF16, f32 ? ST_F32 : ST_BF16, 1, n, 0, mean, sd);
  p->ngroups++;
}

static void add_mlp(plan *p, const char *prefix, int64_t hidden, int64_t inter, bool nvfp4) {
  char q[512];
  snprintf(q, sizeof q, "%s.gate_proj", prefix);
  add_linear(p, q, inter, hidden, nvfp4);
  snprintf(q, sizeof q, "%s.up_proj", prefix);
  add_linear(p, q, inter, hidden, nvfp4);
  snprintf(q, sizeof q, "%s.down_proj", prefix);
  add_linear(p, q, hidden, inter, nvfp4);
}

static bool layer_full(const mkmodel_spec *s, int64_t L) {
  return !s->indexer_types || s->indexer_types[L] == 'F';
}

static void build_plan(plan *p) {
  const mkmodel_spec *s = &p->sp;
  char q[512];
  int64_t H = s->hidden, nh = s->heads;
  /* Embedding rows of unit scale: the first RMSNorm sees O(1) inputs. */
  add(p, "model.embed_tokens.weight", G_BF16, ST_BF16, 2, s->vocab, H, 0, 1.0f);
  p->ngroups++;
  for (int64_t L = 0; L < s->layers; L++) {
#define P(fmt) (snprintf(q, sizeof q, "model.layers.%lld." fmt, (long long)L), q)
    add_vec(p, P("input_layernorm.weight"), H, 1, 0.1f, false);
    add_vec(p, P("post_attention_layernorm.weight"), H, 1, 0.1f, false);
    add_linear(p, P("self_attn.q_a_proj"), s->q_lora, H, false);
    add_vec(p, P("self_attn.q_a_layernorm.weight"), s->q_lora, 1, 0.1f, false);
    add_linear(p, P("self_attn.q_b_proj"), nh * (s->nope + s->rope), s->q_lora, false);
    add_linear(p, P("self_attn.kv_a_proj_with_mqa"), s->kv_lora + s->rope, H, false);
    add_vec(p, P("self_attn.kv_a_layernorm.weight"), s->kv_lora, 1, 0.1f, false);
    add_linear(p, P("self_attn.kv_b_proj"), nh * (s->nope + s->v), s->kv_lora, false);
    add_linear(p, P("self_attn.o_proj"), H, nh * s->v, false);
    if (layer_full(s, L)) {
      add_linear(p, P("self_attn.indexer.wq_b"), s->idx_heads * s->idx_dim, s->q_lora, false);
      add_linear(p, P("self_attn.indexer.wk"), s->idx_dim, H, false);
      add_vec(p, P("self_attn.indexer.k_norm.weight"), s->idx_dim, 1, 0.1f, false);
      add_vec(p, P("self_attn.indexer.k_norm.bias"), s->idx_dim, 0, 0.1f, false);
      add_linear(p, P("self_attn.indexer.weights_proj"), s->idx_heads, H, false);
    }
    if (L < s->dense_layers) {
      add_mlp(p, P("mlp"), H, s->inter, false);
    } else {
      add_linear(p, P("mlp.gate"), s->experts, H, false);
      /* The correction bias is F32 in real checkpoints; 0.1 moves choices
       * without swamping the sigmoid scores. */
      add_vec(p, P("mlp.gate.e_score_correction_bias"), s->experts, 0, 0.1f, true);
      for (int64_t e = 0; e < s->experts; e++) {
        snprintf(q, sizeof q, "model.layers.%lld.mlp.experts.%lld", (long long)L, (long long)e);
        add_mlp(p, q, H, s->moe_inter, s->nvfp4);
      }
      if (s->shared > 0) add_mlp(p, P("mlp.shared_experts"), H, s->moe_inter * s->shared, false);
    }
#undef P
  }
  add_vec(p, "model.norm.weight", H, 1, 0.1f, false);
  add_linear(p, "lm_head", s->vocab, H, false);

  /* Shards: whole modules, in order, each shard up to shard_size bytes. */
  uint64_t cur = 0;
  int shard = 0, last_group = -1;
  for (int i = 0; i < p->n; i++) {
    entry *e = &p->e[i];
    if (e->group != last_group && s->shard_size > 0) {
      uint64_t gsize = 0;
      for (int j = i; j < p->n && p->e[j].group == e->group; j++) gsize += p->e[j].nbytes;
      if (cur > 0 && cur + gsize > (uint64_t)s->shard_size) shard++, cur = 0;
    }
    last_group = e->group;
    e->shard = shard;
    cur += e->nbytes;
  }
  p->nshards = shard + 1;
}

/* ---- NVFP4 quantisation (ModelOpt's formulas) ------------------------------------ */
typedef struct qcache {
  char *base;
  uint8_t *codes, *scales;
  float s2;
} qcache;

typedef struct {
  uint64_t seed;
  int64_t K;
  float sd, s2;
  float *w;
  uint8_t *codes, *scales;
} qjob;

/* Rows lo..hi of the float weight, bf16-rounded as the bf16 model of the
 * same seed stores them. */
static void q_gen(void *ctx, int64_t lo, int64_t hi) {
  qjob *q = ctx;
  fill(q->seed, (uint64_t)(lo * q->K), (size_t)((hi - lo) * q->K), 0, q->sd, true, q->w + lo * q->K);
}

static void q_rows(void *ctx, int64_t lo, int64_t hi) {
  qjob *q = ctx;
  int64_t K = q->K;
  for (int64_t r = lo; r < hi; r++)
    for (int64_t b = 0; b < K / 16; b++) {
      const float *x = q->w + r * K + b * 16;
      float bmax = 0;
      for (int j = 0; j < 16; j++) bmax = fmaxf(bmax, fabsf(x[j]));
      uint8_t sc = dt_f32_to_e4m3(bmax / (6.0f * q->s2));
      q->scales[r * (K / 16) + b] = sc;
      float scale = dt_e4m3_to_f32(sc) * q->s2;
      uint8_t *out = q->codes + r * (K / 2) + b * 8;
      for (int j = 0; j < 8; j++) {
        uint8_t lo4 = scale > 0 ? e2m1_code(x[2 * j] / scale) : 0;
        uint8_t hi4 = scale > 0 ? e2m1_code(x[2 * j + 1] / scale) : 0;
        out[j] = (uint8_t)(lo4 | hi4 << 4); /* even column in the low nibble */
      }
    }
}

static void quantize(const mkmodel_spec *s, const entry *e, qcache *qc) {
  if (qc->base && strcmp(qc->base, e->base) == 0) return;
  free(qc->base), free(qc->codes), free(qc->scales);
  int64_t R = e->rows, K = e->cols;
  int nt = (int)s->threads;
  qjob q = {name_seed(s->seed, e->base), K, e->sd, 0, mj_xmalloc((size_t)(R * K) * sizeof(float)), NULL, NULL};
  par_for(nt, R, q_gen, &q);
  float amax = 0;
  for (int64_t i = 0; i < R * K; i++) amax = fmaxf(amax, fabsf(q.w[i]));
  /* weight_scale_2 = amax / (6 * 448): the largest block scale then lands on
   * e4m3's maximum. */
  q.s2 = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
  q.codes = mj_xmalloc((size_t)(R * K / 2));
  q.scales = mj_xmalloc((size_t)(R * K / 16));
  par_for(nt, R, q_rows, &q);
  qc->base = mj_xstrdup(e->base);
  qc->s2 = q.s2;
  qc->codes = q.codes;
  qc->scales = q.scales;
  free(q.w);
}

/* ---- writing -------------------------------------------------------------------------- */
typedef struct s2map {
  char **base;
  float *s2;
  int n, cap;
} s2map;

static int write_all(FILE *f, const void *p, size_t n, const char *path, mj_err *err) {
  if (n && fwrite(p, 1, n, f) != n)
    return mj_fail(err, MJ_EIO, "%s: write failed: %s", path, strerror(errno));
  return 0;
}

typedef struct {
  uint64_t seed, i0;
  float mean, sd;
  float *f;
  uint16_t *h; /* bf16 output, or NULL for f32 */
} fill_job;

static void fill_part(void *ctx, int64_t lo, int64_t hi) {
  fill_job *j = ctx;
  fill(j->seed, j->i0 + (uint64_t)lo, (size_t)(hi - lo), j->mean, j->sd, false, j->f + lo);
  if (j->h)
    for (int64_t i = lo; i < hi; i++) j->h[i] = dt_f32_to_bf16(j->f[i]);
}

static int write_entry(plan *p, const entry *e, FILE *f, const char *path, qcache *qc, s2map *sm,
                       mj_err *err) {
  const mkmodel_spec *s = &p->sp;
  switch (e->kind) {
  case G_BF16:
  case G_F32: {
    uint64_t numel = e->nbytes / st_dtype_size(e->dtype);
    enum { CH = 1 << 22 };
    float *fb = mj_xmalloc(CH * sizeof *fb);
    uint16_t *hb = e->kind == G_BF16 ? mj_xmalloc(CH * 2) : NULL;
    fill_job fj = {name_seed(s->seed, e->name), 0, e->mean, e->sd, fb, hb};
    int r = 0;
    for (uint64_t done = 0; done < numel && !r;) {
      size_t n = numel - done < CH ? (size_t)(numel - done) : CH;
      fj.i0 = done;
      par_for((int)s->threads, (int64_t)n, fill_part, &fj);
      r = write_all(f, hb ? (void *)hb : (void *)fb, n * (hb ? 2 : 4), path, err);
      done += n;
    }
    free(hb), free(fb);
    return r;
  }
  case G_Q_CODES:
  case G_Q_SCALE: {
    quantize(s, e, qc);
    int found = 0;
    for (int i = 0; i < sm->n; i++) found |= strcmp(sm->base[i], e->base) == 0;
    if (!found) {
      if (sm->n == sm->cap) {
        sm->cap = sm->cap ? 2 * sm->cap : 64;
        sm->base = mj_xrealloc(sm->base, (size_t)sm->cap * sizeof *sm->base);
        sm->s2 = mj_xrealloc(sm->s2, (size_t)sm->cap * sizeof *sm->s2);
      }
      sm->base[sm->n] = mj_xstrdup(e->base);
      sm->s2[sm->n++] = qc->s2;
    }
    return write_all(f, e->kind == G_Q_CODES ? qc->codes : qc->scales, e->nbytes, path, err);
  }
  case G_Q_S2: {
    float s2 = 0;
    int i = sm->n;
    while (i-- > 0 && strcmp(sm->base[i], e->base) != 0) {}
    if (i >= 0) {
      s2 = sm->s2[i];
    } else {
      quantize(s, e, qc);
      s2 = qc->s2;
    }
    return write_all(f, &s2, 4, path, err);
  }
  case G_Q_INPUT: {
    /* Activation scale for FP4 activations (amax / (6 * 448)); weight-only
     * decoding ignores it, so a fixed plausible value is written. */
    float v = 1.0f / 448.0f;
    return write_all(f, &v, 4, path, err);
  }
  }
  return 0;
}

static char *shard_name(const plan *p, int k, mj_arena *a) {
  if (p->nshards == 1) return mj_arena_strdup(a, "model.safetensors");
  return mj_arena_printf(a, "model-%05d-of-%05d.safetensors", k + 1, p->nshards);
}

static int write_shard(plan *p, int k, const char *dir, qcache *qc, s2map *sm, uint64_t *written, mj_err *err) {
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  /* Order: 8-byte multiples first, so every offset before the tail stays
   * aligned; safetensors allows no holes. */
  int *order = mj_xmalloc((size_t)p->n * sizeof *order), no = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < p->n; i++)
      if (p->e[i].shard == k && ((p->e[i].nbytes % 8 == 0) == (pass == 0))) order[no++] = i;
  mj_buf h = {0};
  mj_buf_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
  uint64_t off = 0;
  for (int j = 0; j < no; j++) {
    entry *e = &p->e[order[j]];
    e->offset = off;
    mj_buf_putc(&h, ',');
    json_write_str(&h, e->name, strlen(e->name));
    mj_buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(e->dtype));
    for (int d = 0; d < e->ndim; d++) mj_buf_printf(&h, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    mj_buf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + e->nbytes));
    off += e->nbytes;
  }
  mj_buf_putc(&h, '}');
  while ((8 + h.len) % 8) mj_buf_putc(&h, ' '); /* data starts 8-aligned */
  char *path = mj_arena_printf(&a, "%s/%s", dir, shard_name(p, k, &a));
  char *tmp = mj_arena_printf(&a, "%s.tmp", path);
  int r = 0;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    r = mj_fail(err, MJ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    goto out;
  }
  setvbuf(f, NULL, _IOFBF, 1 << 23);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
  r = write_all(f, len8, 8, tmp, err);
  if (!r) r = write_all(f, h.data, h.len, tmp, err);
  for (int j = 0; j < no && !r; j++) r = write_entry(p, &p->e[order[j]], f, tmp, qc, sm, err);
  if (fclose(f) != 0 && !r) r = mj_fail(err, MJ_EIO, "%s: write failed: %s", tmp, strerror(errno));
  if (!r && rename(tmp, path) != 0) r = mj_fail(err, MJ_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
  if (r) unlink(tmp);
  *written += 8 + h.len + off;
out:
  mj_buf_free(&h);
  free(order);
  mj_arena_free(&a);
  return r;
}

/* ---- config.json and friends -------------------------------------------------------------- */
/* GLM-5's added tokens in id order from 154820 (glm5.md names the ones the
 * engine relies on; the rest follow the GLM-4.5 tokenizer's order). */
static const char *const glm_specials[] = {
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
    "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
    "<|end_of_transcription|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
    "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
    "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
    "<|image|>", "<|video|>"};
enum { N_SPECIALS = MJ_ARRAY_LEN(glm_specials), GLM_SPECIAL_BASE = 154820 };

int64_t mkmodel_special_base(int64_t vocab) {
  return vocab >= GLM_SPECIAL_BASE + N_SPECIALS ? GLM_SPECIAL_BASE : vocab - N_SPECIALS;
}

static void write_config(const plan *p, mj_buf *b) {
  const mkmodel_spec *s = &p->sp;
  int64_t sb = mkmodel_special_base(s->vocab);
  mj_buf_printf(b,
                "{\n  \"architectures\": [\"GlmMoeDsaForCausalLM\"],\n  \"model_type\": \"glm_moe_dsa\",\n"
                "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"dtype\": \"bfloat16\",\n"
                "  \"eos_token_id\": [%lld, %lld, %lld],\n  \"pad_token_id\": %lld,\n",
                (long long)sb, (long long)(sb + 7), (long long)(sb + 9), (long long)sb);
  mj_buf_printf(b,
                "  \"first_k_dense_replace\": %lld,\n  \"moe_layer_freq\": 1,\n  \"hidden_act\": \"silu\",\n"
                "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n  \"moe_intermediate_size\": %lld,\n"
                "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": %lld,\n"
                "  \"q_lora_rank\": %lld,\n  \"kv_lora_rank\": %lld,\n  \"qk_nope_head_dim\": %lld,\n"
                "  \"qk_rope_head_dim\": %lld,\n  \"qk_head_dim\": %lld,\n  \"head_dim\": %lld,\n  \"v_head_dim\": %lld,\n",
                (long long)s->dense_layers, (long long)s->hidden, (long long)s->inter, (long long)s->moe_inter,
                (long long)s->layers, (long long)s->heads, (long long)s->heads, (long long)s->q_lora,
                (long long)s->kv_lora, (long long)s->nope, (long long)s->rope, (long long)(s->nope + s->rope),
                (long long)s->rope, (long long)s->v);
  mj_buf_printf(b,
                "  \"index_n_heads\": %lld,\n  \"index_head_dim\": %lld,\n  \"index_topk\": %lld,\n"
                "  \"n_routed_experts\": %lld,\n  \"num_experts_per_tok\": %lld,\n  \"n_shared_experts\": %lld,\n"
                "  \"n_group\": %lld,\n  \"topk_group\": %lld,\n  \"topk_method\": \"noaux_tc\",\n"
                "  \"scoring_func\": \"sigmoid\",\n  \"norm_topk_prob\": true,\n  \"routed_scaling_factor\": %.17g,\n",
                (long long)s->idx_heads, (long long)s->idx_dim, (long long)s->idx_topk, (long long)s->experts,
                (long long)s->per_tok, (long long)s->shared, (long long)s->n_group, (long long)s->topk_group,
                s->rsf);
  mj_buf_puts(b, "  \"mlp_layer_types\": [");
  for (int64_t L = 0; L < s->layers; L++)
    mj_buf_printf(b, "%s\"%s\"", L ? ", " : "", L < s->dense_layers ? "dense" : "sparse");
  mj_buf_puts(b, "],\n");
  if (s->indexer_types) {
    mj_buf_puts(b, "  \"indexer_types\": [");
    for (int64_t L = 0; L < s->layers; L++)
      mj_buf_printf(b, "%s\"%s\"", L ? ", " : "", s->indexer_types[L] == 'F' ? "full" : "shared");
    mj_buf_puts(b, "],\n");
  }
  mj_buf_printf(b,
                "  \"rms_norm_eps\": %.17g,\n  \"rope_parameters\": {\"rope_theta\": %.17g, \"rope_type\": \"default\"},\n"
                "  \"rope_interleave\": true,\n  \"indexer_rope_interleave\": true,\n"
                "  \"max_position_embeddings\": %lld,\n  \"initializer_range\": 0.02,\n"
                "  \"num_nextn_predict_layers\": 0,\n  \"tie_word_embeddings\": false,\n  \"use_cache\": true,\n"
                "  \"vocab_size\": %lld",
                s->eps, s->theta, (long long)s->max_pos, (long long)s->vocab);
  if (s->nvfp4) mj_buf_puts(b, ",\n  \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", \"group_size\": 16, \"ignore\": ");
}

/* Modules kept in bf16, as ModelOpt lists them ('*' crosses dots). */
static void write_exclude(const plan *p, mj_buf *b) {
  const mkmodel_spec *s = &p->sp;
  mj_buf_puts(b, "[\"lm_head\", \"model.embed_tokens\", \"*self_attn*\", \"*mlp.gate\", \"*mlp.shared_experts*\"");
  for (int64_t L = 0; L < s->dense_layers && L < s->layers; L++)
    mj_buf_printf(b, ", \"model.layers.%lld.mlp*\"", (long long)L);
  mj_buf_puts(b, "]");
}

/* ---- tokenizer.json: a tiny byte-level BPE -------------------------------------------------- */
static const char corpus[] =
    "The model reads the weights of every layer and the router chooses the experts for each token. "
    "A mixture of experts sends each token to a few experts, and the shared expert sees every token. "
    "The cache keeps the latent of the attention for each position, and the indexer picks the tokens "
    "that the attention may see. In the beginning there was the word, and the word was with the model. "
    "Then the engine compiles the kernels for the shapes it observes, and stores them in the cache on disk. "
    "These are the tests that check the engine against the reference: they compare the logits at every "
    "position, then they compare the tokens of the greedy decode. There is one more thing to say: "
    "the quick brown fox jumps over the lazy dog, and the dog thinks that the fox is in the wrong place. "
    "Hello, world! This is a small text, written to train a small tokenizer, so that the tests have "
    "something to read. 0123456789 100 200 300 2026 12 34 56 78 90.\n";

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
 * others move to U+0100 and up, in byte order. */
static void byte_unicode(int byte, char out[4]) {
  int cp;
  if ((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF)) {
    cp = byte;
  } else {
    int n = 0;
    for (int b = 0; b < byte; b++)
      if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) n++;
    cp = 256 + n;
  }
  if (cp < 0x80) {
    out[0] = (char)cp, out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
  }
}

typedef struct {
  int *ids;
  int n, count;
} word;

static void write_tokenizer(const plan *p, mj_buf *b) {
  const mkmodel_spec *s = &p->sp;
  int64_t sb = mkmodel_special_base(s->vocab);
  int64_t max_merges = sb - 256 < s->merges ? sb - 256 : s->merges;
  if (max_merges < 0) max_merges = 0;
  /* Vocabulary strings; ids 0-255 are the bytes. */
  int cap = 256 + (int)max_merges;
  char **tok = mj_xcalloc((size_t)cap, sizeof *tok);
  int ntok = 256;
  for (int i = 0; i < 256; i++) {
    char u[4];
    byte_unicode(i, u);
    tok[i] = mj_xstrdup(u);
  }
  /* Words: split before each space, as the ByteLevel pre-tokenizer does. */
  word *w = NULL;
  int nw = 0;
  const char *c = corpus;
  while (*c) {
    const char *e = c + 1;
    while (*e && *e != ' ') e++;
    int len = (int)(e - c), k;
    for (k = 0; k < nw; k++) {
      if (w[k].n != len) continue;
      int same = 1;
      for (int j = 0; j < len && same; j++) same = w[k].ids[j] == (unsigned char)c[j];
      if (same) break;
    }
    if (k < nw) {
      w[k].count++;
    } else {
      w = mj_xrealloc(w, (size_t)(nw + 1) * sizeof *w);
      w[nw].ids = mj_xmalloc((size_t)len * sizeof(int));
      for (int j = 0; j < len; j++) w[nw].ids[j] = (unsigned char)c[j];
      w[nw].n = len;
      w[nw].count = 1;
      nw++;
    }
    c = e;
  }
  int (*merges)[2] = mj_xmalloc((size_t)(max_merges ? max_merges : 1) * sizeof *merges);
  int nmerges = 0;
  while (nmerges < max_merges) {
    /* The most frequent adjacent pair; ties go to the smaller ids. */
    int best_a = -1, best_b = -1, best_n = 1;
    for (int k = 0; k < nw; k++)
      for (int j = 0; j + 1 < w[k].n; j++) {
        int a = w[k].ids[j], bb = w[k].ids[j + 1], n = 0;
        if (a == best_a && bb == best_b) continue;
        for (int k2 = 0; k2 < nw; k2++)
          for (int j2 = 0; j2 + 1 < w[k2].n; j2++)
            if (w[k2].ids[j2] == a && w[k2].ids[j2 + 1] == bb) n += w[k2].count;
        if (n > best_n || (n == best_n && best_a >= 0 && (a < best_a || (a == best_a && bb < best_b))))
          best_a = a, best_b = bb, best_n = n;
      }
    if (best_a < 0) break;
    size_t la = strlen(tok[best_a]), lb = strlen(tok[best_b]);
    char *m = mj_xmalloc(la + lb + 1);
    memcpy(m, tok[best_a], la);
    memcpy(m + la, tok[best_b], lb + 1);
    int id = -1;
    for (int i = 0; i < ntok; i++)
      if (strcmp(tok[i], m) == 0) id = i;
    if (id < 0) {
      if (ntok >= cap) { free(m); break; }
      id = ntok;
      tok[ntok++] = m;
    } else {
      free(m);
    }
    merges[nmerges][0] = best_a, merges[nmerges][1] = best_b;
    nmerges++;
    for (int k = 0; k < nw; k++) {
      int o = 0;
      for (int j = 0; j < w[k].n; j++) {
        if (j + 1 < w[k].n && w[k].ids[j] == best_a && w[k].ids[j + 1] == best_b) {
          w[k].ids[o++] = id;
          j++;
        } else {
          w[k].ids[o++] = w[k].ids[j];
        }
      }
      w[k].n = o;
    }
  }
  mj_buf_puts(b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
  for (int i = 0; i < N_SPECIALS; i++) {
    mj_buf_printf(b, "%s\n    {\"id\": %lld, \"content\": ", i ? "," : "", (long long)(sb + i));
    json_write_str(b, glm_specials[i], strlen(glm_specials[i]));
    mj_buf_puts(b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}");
  }
  mj_buf_puts(b,
              "\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
              "    {\"type\": \"Split\", \"pattern\": {\"Regex\": ");
  static const char regex[] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  json_write_str(b, regex, strlen(regex));
  mj_buf_puts(b,
              "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
              "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": false}]},\n"
              "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true},\n"
              "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n"
              "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null,\n"
              "    \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
              "    \"vocab\": {");
  for (int i = 0; i < ntok; i++) {
    mj_buf_puts(b, i ? ", " : "");
    json_write_str(b, tok[i], strlen(tok[i]));
    mj_buf_printf(b, ": %d", i);
  }
  mj_buf_puts(b, "},\n    \"merges\": [");
  for (int i = 0; i < nmerges; i++) {
    mj_buf_puts(b, i ? ", [" : "[");
    json_write_str(b, tok[merges[i][0]], strlen(tok[merges[i][0]]));
    mj_buf_puts(b, ", ");
    json_write_str(b, tok[merges[i][1]], strlen(tok[merges[i][1]]));
    mj_buf_puts(b, "]");
  }
  mj_buf_puts(b, "]\n  }\n}\n");
  for (int i = 0; i < ntok; i++) free(tok[i]);
  for (int k = 0; k < nw; k++) free(w[k].ids);
  free(tok), free(w), free(merges);
}

/* ---- presets and the command ------------------------------------------------------------------ */
int mkmodel_preset(const char *name, mkmodel_spec *s) {
  memset(s, 0, sizeof *s);
  s->theta = 10000;
  s->eps = 1e-5;
  s->rsf = 2.5;
  s->merges = 64;
  s->n_group = 1;
  s->topk_group = 1;
  s->shared = 1;
  s->threads = 1;
  if (strcmp(name, "tiny") == 0) {
    /* Small enough that a whole fixture model is ~1 MB and a forward pass
     * takes milliseconds; widths are multiples of 16 so NVFP4 applies. */
    s->vocab = 384, s->hidden = 64, s->inter = 128, s->moe_inter = 32, s->layers = 2, s->dense_layers = 1;
    s->heads = 4, s->q_lora = 32, s->kv_lora = 32, s->nope = 16, s->rope = 16, s->v = 16;
    s->idx_heads = 16, s->idx_dim = 32, s->idx_topk = 64, s->experts = 8, s->per_tok = 2;
    s->max_pos = 4096;
  } else if (strcmp(name, "small") == 0) {
    s->vocab = 512, s->hidden = 256, s->inter = 512, s->moe_inter = 128, s->layers = 3, s->dense_layers = 1;
    s->heads = 8, s->q_lora = 128, s->kv_lora = 64, s->nope = 32, s->rope = 16, s->v = 32;
    s->idx_heads = 16, s->idx_dim = 32, s->idx_topk = 128, s->experts = 32, s->per_tok = 4;
    s->n_group = 4, s->topk_group = 2, s->max_pos = 8192;
  } else if (strcmp(name, "medium") == 0) {
    /* The smallest widths the GPU kernels take (hidden and expert widths
     * multiples of 1024, experts a multiple of 32): the GPU decode tests'
     * model, still a few seconds' work for the CPU reference. */
    s->vocab = 1024, s->hidden = 1024, s->inter = 2048, s->moe_inter = 1024, s->layers = 3, s->dense_layers = 1;
    s->heads = 8, s->q_lora = 256, s->kv_lora = 128, s->nope = 32, s->rope = 16, s->v = 32;
    s->idx_heads = 4, s->idx_dim = 32, s->idx_topk = 40, s->experts = 32, s->per_tok = 4;
    s->max_pos = 4096;
  } else if (strcmp(name, "glm5") == 0) {
    /* The real GLM-5 widths (model_config_glm5); layers default to 4 so a
     * checkpoint fits one disk, 3 of them dense as in GLM-5. */
    mj_arena a;
    mj_arena_init(&a, 1024);
    model_config c;
    model_config_glm5(&c, 4, 3, &a);
    int r = mkmodel_spec_from_config(&c, &a, s, NULL);
    MJ_ASSERT(r == 0);
    s->indexer_types = NULL; /* all full (the arena's copy goes below) */
    s->merges = 256;
    mj_arena_free(&a);
  } else {
    return -1;
  }
  return 0;
}

int mkmodel_spec_from_config(const model_config *c, mj_arena *a, mkmodel_spec *s, mj_err *err) {
  mkmodel_preset("tiny", s);
  int64_t L = c->num_hidden_layers, dense = 0;
  while (dense < L && !c->layer_sparse[dense]) dense++;
  for (int64_t i = dense; i < L; i++)
    if (!c->layer_sparse[i])
      return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: mlp_layer_types: layer %lld is dense after a sparse layer; "
                     "the generator writes the dense layers first", (long long)i);
  if (c->tie_word_embeddings)
    return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: tie_word_embeddings true is not supported (lm_head is written)");
  if (c->num_key_value_heads != c->num_attention_heads)
    return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: num_key_value_heads %lld differs from num_attention_heads %lld",
                   (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
  s->vocab = c->vocab_size, s->hidden = c->hidden_size, s->inter = c->intermediate_size;
  s->moe_inter = c->moe_intermediate_size, s->layers = L, s->dense_layers = dense;
  s->heads = c->num_attention_heads, s->q_lora = c->q_lora_rank, s->kv_lora = c->kv_lora_rank;
  s->nope = c->qk_nope_head_dim, s->rope = c->qk_rope_head_dim, s->v = c->v_head_dim;
  s->idx_heads = c->index_n_heads, s->idx_dim = c->index_head_dim, s->idx_topk = c->index_topk;
  s->experts = c->n_routed_experts, s->per_tok = c->num_experts_per_tok, s->shared = c->n_shared_experts;
  s->n_group = c->n_group, s->topk_group = c->topk_group, s->max_pos = c->max_position_embeddings;
  s->theta = c->rope_theta, s->eps = c->rms_norm_eps, s->rsf = c->routed_scaling_factor;
  char *types = mj_arena_alloc(a, (size_t)L + 1);
  for (int64_t i = 0; i < L; i++) types[i] = c->layer_indexer_full[i] ? 'F' : 'S';
  s->indexer_types = types;
  return 0;
}

static int spec_check(const mkmodel_spec *s, mj_err *err) {
#define NEED(cond, ...) \
  if (!(cond)) return mj_fail(err, MJ_EUSAGE, "moejit mkmodel: " __VA_ARGS__)
  NEED(s->layers >= 1 && s->layers <= 1000, "--layers must be 1..1000, not %lld", (long long)s->layers);
  NEED(s->dense_layers >= 0 && s->dense_layers <= s->layers, "--dense-layers must be 0..%lld, not %lld",
       (long long)s->layers, (long long)s->dense_layers);
  /* Upper bounds keep a typo from writing terabytes: GLM-5 itself has 256
   * experts, 1 shared expert and a vocabulary of 154880. */
  NEED(s->experts >= 2 && s->experts <= 4096, "--experts must be 2..4096, not %lld", (long long)s->experts);
  NEED(s->per_tok >= 1 && s->per_tok <= s->experts, "--experts-per-tok must be 1..%lld, not %lld",
       (long long)s->experts, (long long)s->per_tok);
  NEED(s->n_group >= 1 && s->experts % s->n_group == 0 && s->experts / s->n_group >= 2,
       "--n-group %lld must divide --experts %lld into groups of at least 2", (long long)s->n_group,
       (long long)s->experts);
  NEED(s->topk_group >= 1 && s->topk_group <= s->n_group, "--topk-group must be 1..%lld", (long long)s->n_group);
  NEED(s->per_tok <= s->topk_group * (s->experts / s->n_group),
       "--experts-per-tok %lld exceeds the experts of --topk-group groups", (long long)s->per_tok);
  NEED(s->idx_topk >= 1, "--index-topk must be positive, not %lld", (long long)s->idx_topk);
  NEED(s->shared >= 0 && s->shared <= 64, "--shared-experts must be 0..64, not %lld", (long long)s->shared);
  NEED(s->vocab >= 256 + N_SPECIALS && s->vocab <= (1 << 21), "--vocab must be %d..%d (256 bytes + %d special tokens at least)",
       256 + N_SPECIALS, 1 << 21, (int)N_SPECIALS);
  NEED(s->shard_size >= 0, "--shard-size must not be negative");
  NEED(s->merges >= 0, "--merges must not be negative");
  if (s->indexer_types) {
    NEED((int64_t)strlen(s->indexer_types) == s->layers, "--indexer-types needs one letter per layer (%lld), F or S",
         (long long)s->layers);
    NEED(s->indexer_types[0] == 'F', "--indexer-types: layer 0 must be F (full)");
    for (const char *c = s->indexer_types; *c; c++) NEED(*c == 'F' || *c == 'S', "--indexer-types holds only F and S");
  }
  if (s->nvfp4)
    NEED(s->hidden % 16 == 0 && s->moe_inter % 16 == 0, "--nvfp4 needs hidden and moe intermediate widths divisible by 16");
  return 0;
#undef NEED
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

int mkmodel_write(const mkmodel_spec *spec, const char *dir, bool force, uint64_t *bytes, mj_err *err) {
  int r = spec_check(spec, err);
  if (r) return r;
  plan p = {0};
  p.sp = *spec;
  mj_arena_init(&p.a, 1 << 16);
  build_plan(&p);
  mj_buf cfg = {0}, tk = {0}, hq = {0};
  if (spec->config_text) mj_buf_puts(&cfg, spec->config_text);
  else write_config(&p, &cfg);
  if (spec->nvfp4) {
    if (!spec->config_text) write_exclude(&p, &cfg), mj_buf_puts(&cfg, "}");
    mj_buf_puts(&hq, "{\n  \"producer\": {\"name\": \"modelopt\", \"version\": \"0.37.0\"},\n"
                     "  \"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null, \"group_size\": 16,\n"
                     "    \"exclude_modules\": ");
    write_exclude(&p, &hq);
    mj_buf_puts(&hq, "}\n}\n");
  }
  if (!spec->config_text) mj_buf_puts(&cfg, "\n}\n");
  /* The written config must read back as the same model: a self-check of
   * this writer against the reader. */
  {
    mj_arena a;
    mj_arena_init(&a, 1 << 14);
    model_config c;
    mj_err e2 = {0};
    if (model_config_parse(&a, cfg.data, cfg.len, "config.json (generated)", &c, &e2))
      r = mj_fail(err, MJ_EUSAGE, "moejit mkmodel: these options give an invalid model: %s", e2.msg);
    mj_err_clear(&e2);
    mj_arena_free(&a);
    if (r) goto out;
  }
  if ((r = mj_mkdirs(dir, err))) goto out;
  {
    char path[4096];
    const char *stale[] = {"model.safetensors", "model.safetensors.index.json", "hf_quant_config.json"};
    for (size_t i = 0; i < MJ_ARRAY_LEN(stale); i++) {
      snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
      if (!file_exists(path)) continue;
      if (!force) {
        r = mj_fail(err, MJ_EUSAGE, "moejit mkmodel: %s already holds a model (%s): use --force to replace it", dir,
                    stale[i]);
        goto out;
      }
      unlink(path);
    }
  }
  {
    tk.len = 0;
    write_tokenizer(&p, &tk);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((r = mj_write_file_atomic(path, cfg.data, cfg.len, err))) goto out;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((r = mj_write_file_atomic(path, tk.data, tk.len, err))) goto out;
    if (spec->nvfp4) {
      snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
      if ((r = mj_write_file_atomic(path, hq.data, hq.len, err))) goto out;
    }
  }
  {
    qcache qc = {0};
    s2map sm = {0};
    uint64_t written = 0;
    for (int k = 0; k < p.nshards && !r; k++) r = write_shard(&p, k, dir, &qc, &sm, &written, err);
    free(qc.base), free(qc.codes), free(qc.scales);
    for (int i = 0; i < sm.n; i++) free(sm.base[i]);
    free(sm.base), free(sm.s2);
    if (r) goto out;
    if (p.nshards > 1) {
      mj_buf ix = {0};
      uint64_t total = 0;
      for (int i = 0; i < p.n; i++) total += p.e[i].nbytes;
      mj_buf_printf(&ix, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)total);
      mj_arena a;
      mj_arena_init(&a, 1 << 12);
      for (int i = 0; i < p.n; i++) {
        mj_buf_puts(&ix, i ? ",\n    " : "\n    ");
        json_write_str(&ix, p.e[i].name, strlen(p.e[i].name));
        mj_buf_puts(&ix, ": ");
        const char *sn = shard_name(&p, p.e[i].shard, &a);
        json_write_str(&ix, sn, strlen(sn));
      }
      mj_buf_puts(&ix, "\n  }\n}\n");
      char path[4096];
      snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
      r = mj_write_file_atomic(path, ix.data, ix.len, err);
      mj_buf_free(&ix);
      mj_arena_free(&a);
    }
    if (bytes) *bytes = written;
  }
out:
  mj_buf_free(&cfg), mj_buf_free(&tk), mj_buf_free(&hq);
  free(p.e);
  mj_arena_free(&p.a);
  return r;
}
