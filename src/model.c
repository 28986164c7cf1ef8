/* model.c: config.json, quantisation configs and tensor binding (model.h).
 *
 * Defaults are those of transformers' GlmMoeDsaConfig (the GLM-5 widths), so
 * a config.json that omits a field means what it means to the reference.
 * Values the reference would accept but the forward pass cannot honour
 * (attention biases, q_lora_rank null, moe_layer_freq other than 1) are
 * refused here with the field named, rather than silently computed wrong.
 * Binding walks the tensors the config requires, marks each one used, and
 * then any tensor left unmarked is an error: a checkpoint that does not
 * match its config must never load with part of it ignored.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtype.h"

/* ---- config.json ------------------------------------------------------------ */
typedef struct {
  const json *o;
  const char *name;
  mj_err *err;
} cfgp;

static int bad(cfgp *p, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(cfgp *p, const char *key, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const json *v = json_get(p->o, key);
  if (v)
    return mj_fail(p->err, MJ_EINPUT, "%s:%d:%d: \"%s\" %s", p->name, v->line, v->col, key, what);
  return mj_fail(p->err, MJ_EINPUT, "%s: \"%s\" %s", p->name, key, what);
}

static int cint(cfgp *p, const char *key, int64_t def, int64_t *out) {
  *out = def;
  int r = json_get_int(p->o, key, out, p->name, p->err);
  return r == 1 ? 0 : r;
}
static int cnum(cfgp *p, const char *key, double def, double *out) {
  *out = def;
  int r = json_get_num(p->o, key, out, p->name, p->err);
  return r == 1 ? 0 : r;
}
static int cbool(cfgp *p, const char *key, bool def, bool *out) {
  *out = def;
  int r = json_get_bool(p->o, key, out, p->name, p->err);
  return r == 1 ? 0 : r;
}
static bool is_null(const json *o, const char *key) {
  const json *v = json_get(o, key);
  return v && v->type == JSON_NULL;
}

#define POSITIVE(key, field)                                                    \
  do {                                                                          \
    if (c->field <= 0) return bad(&p, key, "is %lld: must be positive", (long long)c->field); \
  } while (0)

static int parse_rope(cfgp *p, model_config *c) {
  /* transformers 5 keeps RoPE settings in rope_parameters; older files have
   * rope_theta (and rope_scaling) at the top level. */
  double theta = 1e6;
  int r = cnum(p, "rope_theta", theta, &theta);
  if (r) return r;
  snprintf(c->rope_type, sizeof c->rope_type, "default");
  c->rope_factor = 1;
  c->rope_mscale_all_dim = 0;
  const char *keys[] = {"rope_parameters", "rope_scaling"};
  for (int k = 0; k < 2; k++) {
    const json *rp = json_get(p->o, keys[k]);
    if (!rp || rp->type == JSON_NULL) continue;
    if (rp->type != JSON_OBJ) return bad(p, keys[k], "must be an object");
    cfgp q = {rp, p->name, p->err};
    if ((r = cnum(&q, "rope_theta", theta, &theta))) return r;
    const char *type = NULL;
    r = json_get_str(rp, "rope_type", &type, p->name, p->err);
    if (r == 1) r = json_get_str(rp, "type", &type, p->name, p->err);
    if (r > 1) return r;
    if (type) snprintf(c->rope_type, sizeof c->rope_type, "%s", type);
    if ((r = cnum(&q, "factor", 1, &c->rope_factor))) return r;
    if ((r = cnum(&q, "mscale_all_dim", 0, &c->rope_mscale_all_dim))) return r;
  }
  c->rope_theta = theta;
  if (!(theta > 0)) return bad(p, "rope_theta", "is %g: must be positive", theta);
  return 0;
}

/* A per-layer list of two words (mlp_layer_types, indexer_types): out[i] =
 * 1 for yes, 0 for no.  Returns 1 when the key is absent or null. */
static int kind_list(cfgp *p, const char *key, const char *yes, const char *no, int64_t L, uint8_t *out) {
  const json *v = json_get(p->o, key);
  if (!v || v->type == JSON_NULL) return 1;
  if (v->type != JSON_ARR || (int64_t)v->len != L)
    return bad(p, key, "must be a list of %lld \"%s\"/\"%s\" (one per layer)", (long long)L, yes, no);
  for (int64_t i = 0; i < L; i++) {
    const json *x = v->items[i];
    if (x->type == JSON_STR && strcmp(x->str, yes) == 0) out[i] = 1;
    else if (x->type == JSON_STR && strcmp(x->str, no) == 0) out[i] = 0;
    else return bad(p, key, "item %lld must be \"%s\" or \"%s\"", (long long)i, yes, no);
  }
  return 0;
}

static int parse_layer_kinds(cfgp *p, mj_arena *a, model_config *c) {
  int64_t L = c->num_hidden_layers;
  c->layer_sparse = mj_arena_alloc(a, (size_t)L);
  c->layer_indexer_full = mj_arena_alloc(a, (size_t)L);
  int r = kind_list(p, "mlp_layer_types", "sparse", "dense", L, c->layer_sparse);
  if (r > 1) return r;
  if (r == 1) {
    /* The reference derives the pattern from first_k_dense_replace alone
     * and ignores moe_layer_freq; a value other than 1 would be read
     * differently by other engines, so it is refused. */
    if (c->moe_layer_freq != 1)
      return bad(p, "moe_layer_freq", "is %lld: only 1 is supported (the reference ignores it; write mlp_layer_types instead)",
                 (long long)c->moe_layer_freq);
    for (int64_t i = 0; i < L; i++) c->layer_sparse[i] = i >= c->first_k_dense_replace;
  }
  const json *pat = json_get(p->o, "index_topk_pattern");
  r = kind_list(p, "indexer_types", "full", "shared", L, c->layer_indexer_full);
  if (r > 1) return r;
  if (r == 0) {
    /* indexer_types given: it wins over the pattern and the schedule. */
  } else if (pat && pat->type == JSON_STR) {
    if ((int64_t)pat->len != L) return bad(p, "index_topk_pattern", "must have one letter (F or S) per layer");
    for (int64_t i = 0; i < L; i++) {
      if (pat->str[i] != 'F' && pat->str[i] != 'S') return bad(p, "index_topk_pattern", "must hold only F and S");
      c->layer_indexer_full[i] = pat->str[i] == 'F';
    }
  } else {
    /* GlmMoeDsaConfig: full when max(i - offset + 1, 0) % freq == 0. */
    int64_t freq, offset;
    if ((r = cint(p, "index_topk_freq", 1, &freq)) || (r = cint(p, "index_skip_topk_offset", 2, &offset))) return r;
    if (freq < 1) freq = 1;
    for (int64_t i = 0; i < L; i++) {
      int64_t k = i - offset + 1;
      c->layer_indexer_full[i] = (k > 0 ? k : 0) % freq == 0;
    }
  }
  if (L > 0 && !c->layer_indexer_full[0])
    return bad(p, "indexer_types", "layer 0 is \"shared\": the first layer must run its own indexer");
  return 0;
}

static int parse_quant_obj(cfgp *p, const json *q, mj_arena *a, model_config *c, const char *source,
                           const char *list_key) {
  const char *algo = NULL;
  int r = json_get_str(q, "quant_algo", &algo, p->name, p->err);
  if (r > 1) return r;
  if (!algo) {
    const char *method = NULL;
    r = json_get_str(q, "quant_method", &method, p->name, p->err);
    if (r > 1) return r;
    algo = method;
  }
  c->quant_source = source;
  c->quant_algo = algo ? mj_arena_strdup(a, algo) : NULL;
  c->quant_group_size = 16;
  r = json_get_int(q, "group_size", &c->quant_group_size, p->name, p->err);
  if (r > 1) return r;
  if (c->quant_algo && strcmp(c->quant_algo, "NVFP4") == 0 && c->quant_group_size != 16)
    return mj_fail(p->err, MJ_EINPUT, "%s: NVFP4 \"group_size\" is %lld: NVFP4 blocks are 16 values",
                   p->name, (long long)c->quant_group_size);
  const json *ex = json_get(q, list_key);
  if (ex && ex->type != JSON_NULL) {
    if (ex->type != JSON_ARR)
      return mj_fail(p->err, MJ_EINPUT, "%s:%d:%d: \"%s\" must be a list of module names or globs", p->name,
                     ex->line, ex->col, list_key);
    c->quant_exclude = mj_arena_alloc(a, ex->len * sizeof(char *));
    for (size_t i = 0; i < ex->len; i++) {
      if (ex->items[i]->type != JSON_STR)
        return mj_fail(p->err, MJ_EINPUT, "%s:%d:%d: \"%s\" item %zu must be a string", p->name,
                       ex->items[i]->line, ex->items[i]->col, list_key, i);
      c->quant_exclude[c->n_quant_exclude++] = mj_arena_strdup(a, ex->items[i]->str);
    }
  }
  return 0;
}

int model_config_parse(mj_arena *a, const char *text, size_t len, const char *name, model_config *c,
                       mj_err *err) {
  memset(c, 0, sizeof *c);
  json *o;
  int r = json_parse(a, text, len, name, &o, err);
  if (r) return r;
  if (o->type != JSON_OBJ) return mj_fail(err, MJ_EINPUT, "%s: must be a JSON object", name);
  cfgp p = {o, name, err};
  const char *mt = NULL;
  r = json_get_str(o, "model_type", &mt, name, err);
  if (r > 1) return r;
  if (r == 1) return mj_fail(err, MJ_EINPUT, "%s: \"model_type\" is missing (moejit reads glm_moe_dsa models)", name);
  if (strcmp(mt, "glm_moe_dsa") != 0)
    return bad(&p, "model_type", "is \"%s\": moejit reads only \"glm_moe_dsa\" (GLM-5) models", mt);

  /* Integers, with the reference's defaults. */
  struct {
    const char *key;
    int64_t def;
    int64_t *out;
  } ints[] = {
      {"vocab_size", 154880, &c->vocab_size},
      {"hidden_size", 6144, &c->hidden_size},
      {"intermediate_size", 12288, &c->intermediate_size},
      {"moe_intermediate_size", 2048, &c->moe_intermediate_size},
      {"num_hidden_layers", 78, &c->num_hidden_layers},
      {"num_attention_heads", 64, &c->num_attention_heads},
      {"num_key_value_heads", 64, &c->num_key_value_heads},
      {"kv_lora_rank", 512, &c->kv_lora_rank},
      {"qk_nope_head_dim", 192, &c->qk_nope_head_dim},
      {"qk_rope_head_dim", 64, &c->qk_rope_head_dim},
      {"v_head_dim", 256, &c->v_head_dim},
      {"index_n_heads", 32, &c->index_n_heads},
      {"index_head_dim", 128, &c->index_head_dim},
      {"index_topk", 2048, &c->index_topk},
      {"n_routed_experts", 256, &c->n_routed_experts},
      {"num_experts_per_tok", 8, &c->num_experts_per_tok},
      {"n_shared_experts", 1, &c->n_shared_experts},
      {"n_group", 1, &c->n_group},
      {"topk_group", 1, &c->topk_group},
      {"first_k_dense_replace", 3, &c->first_k_dense_replace},
      {"moe_layer_freq", 1, &c->moe_layer_freq},
      {"max_position_embeddings", 202752, &c->max_position_embeddings},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(ints); i++)
    if ((r = cint(&p, ints[i].key, ints[i].def, ints[i].out))) return r;
  /* num_experts is the reference's backward-compatible alias. */
  if (json_get(o, "num_experts") && !is_null(o, "num_experts") &&
      (r = cint(&p, "num_experts", c->n_routed_experts, &c->n_routed_experts)))
    return r;
  if (is_null(o, "q_lora_rank"))
    return bad(&p, "q_lora_rank", "is null: not supported (the DSA indexer reads the q latent)");
  if ((r = cint(&p, "q_lora_rank", 2048, &c->q_lora_rank))) return r;
  c->pad_token_id = -1;
  if (!is_null(o, "pad_token_id") && (r = cint(&p, "pad_token_id", -1, &c->pad_token_id))) return r;
  const json *eos = json_get(o, "eos_token_id");
  if (eos && eos->type == JSON_ARR) {
    if (eos->len > MODEL_MAX_EOS) return bad(&p, "eos_token_id", "lists more than %d ids", MODEL_MAX_EOS);
    for (size_t i = 0; i < eos->len; i++) {
      if (eos->items[i]->type != JSON_NUM || !eos->items[i]->is_int)
        return bad(&p, "eos_token_id", "item %zu must be an integer", i);
      c->eos_token_id[c->n_eos++] = eos->items[i]->i;
    }
  } else if (eos && eos->type != JSON_NULL) {
    if ((r = cint(&p, "eos_token_id", 1, &c->eos_token_id[0]))) return r;
    c->n_eos = 1;
  } else if (!eos) {
    c->eos_token_id[0] = 1; /* the reference's default */
    c->n_eos = 1;
  }
  if ((r = cnum(&p, "rms_norm_eps", 1e-5, &c->rms_norm_eps)) ||
      (r = cnum(&p, "routed_scaling_factor", 2.5, &c->routed_scaling_factor)) ||
      (r = cbool(&p, "norm_topk_prob", true, &c->norm_topk_prob)) ||
      (r = cbool(&p, "tie_word_embeddings", false, &c->tie_word_embeddings)) ||
      (r = cbool(&p, "rope_interleave", true, &c->rope_interleave)) ||
      (r = cbool(&p, "indexer_rope_interleave", true, &c->indexer_rope_interleave)))
    return r;
  if ((r = parse_rope(&p, c))) return r;

  /* Values the forward pass cannot honour. */
  const char *s = NULL;
  if ((r = json_get_str(o, "hidden_act", &s, name, err)) > 1) return r;
  if (s && strcmp(s, "silu") != 0) return bad(&p, "hidden_act", "is \"%s\": only \"silu\" is supported", s);
  s = NULL;
  if ((r = json_get_str(o, "scoring_func", &s, name, err)) > 1) return r;
  if (s && strcmp(s, "sigmoid") != 0) return bad(&p, "scoring_func", "is \"%s\": GLM-5 routing is \"sigmoid\"", s);
  s = NULL;
  if ((r = json_get_str(o, "topk_method", &s, name, err)) > 1) return r;
  if (s && strcmp(s, "noaux_tc") != 0) return bad(&p, "topk_method", "is \"%s\": GLM-5 routing is \"noaux_tc\"", s);
  bool abias = false;
  if ((r = cbool(&p, "attention_bias", false, &abias))) return r;
  if (abias) return bad(&p, "attention_bias", "is true: not supported (GLM-5 has no attention biases)");

  /* Sizes. */
  POSITIVE("vocab_size", vocab_size);
  POSITIVE("hidden_size", hidden_size);
  POSITIVE("intermediate_size", intermediate_size);
  POSITIVE("moe_intermediate_size", moe_intermediate_size);
  POSITIVE("num_hidden_layers", num_hidden_layers);
  POSITIVE("num_attention_heads", num_attention_heads);
  POSITIVE("num_key_value_heads", num_key_value_heads);
  POSITIVE("q_lora_rank", q_lora_rank);
  POSITIVE("kv_lora_rank", kv_lora_rank);
  POSITIVE("qk_nope_head_dim", qk_nope_head_dim);
  POSITIVE("qk_rope_head_dim", qk_rope_head_dim);
  POSITIVE("v_head_dim", v_head_dim);
  POSITIVE("index_n_heads", index_n_heads);
  POSITIVE("index_head_dim", index_head_dim);
  POSITIVE("index_topk", index_topk);
  POSITIVE("n_routed_experts", n_routed_experts);
  POSITIVE("num_experts_per_tok", num_experts_per_tok);
  POSITIVE("n_group", n_group);
  POSITIVE("topk_group", topk_group);
  POSITIVE("max_position_embeddings", max_position_embeddings);
  if (c->n_shared_experts < 0) return bad(&p, "n_shared_experts", "is %lld: must not be negative", (long long)c->n_shared_experts);
  if (c->first_k_dense_replace < 0)
    return bad(&p, "first_k_dense_replace", "is %lld: must not be negative", (long long)c->first_k_dense_replace);
  if (c->num_hidden_layers > 100000) return bad(&p, "num_hidden_layers", "is %lld: too large", (long long)c->num_hidden_layers);
  if (c->qk_rope_head_dim % 2) return bad(&p, "qk_rope_head_dim", "is %lld: must be even (RoPE rotates pairs)", (long long)c->qk_rope_head_dim);
  if (c->index_head_dim < c->qk_rope_head_dim)
    return bad(&p, "index_head_dim", "is %lld: must be at least qk_rope_head_dim (%lld), its rotated part",
               (long long)c->index_head_dim, (long long)c->qk_rope_head_dim);
  if (c->num_key_value_heads != c->num_attention_heads)
    return bad(&p, "num_key_value_heads", "is %lld: MLA needs it equal to num_attention_heads (%lld)",
               (long long)c->num_key_value_heads, (long long)c->num_attention_heads);
  if (c->num_experts_per_tok > c->n_routed_experts)
    return bad(&p, "num_experts_per_tok", "is %lld: more than n_routed_experts (%lld)",
               (long long)c->num_experts_per_tok, (long long)c->n_routed_experts);
  if (c->n_routed_experts % c->n_group)
    return bad(&p, "n_group", "is %lld: must divide n_routed_experts (%lld)", (long long)c->n_group,
               (long long)c->n_routed_experts);
  if (c->n_routed_experts / c->n_group < 2)
    return bad(&p, "n_group", "is %lld: each group needs at least 2 experts (groups are scored by their best two)",
               (long long)c->n_group);
  if (c->topk_group > c->n_group)
    return bad(&p, "topk_group", "is %lld: more than n_group (%lld)", (long long)c->topk_group, (long long)c->n_group);
  if (c->num_experts_per_tok > c->topk_group * (c->n_routed_experts / c->n_group))
    return bad(&p, "num_experts_per_tok", "is %lld: more than the experts of topk_group groups (%lld)",
               (long long)c->num_experts_per_tok, (long long)(c->topk_group * (c->n_routed_experts / c->n_group)));
  if (!(c->rms_norm_eps > 0)) return bad(&p, "rms_norm_eps", "is %g: must be positive", c->rms_norm_eps);
  if (!isfinite(c->routed_scaling_factor) || c->routed_scaling_factor <= 0)
    return bad(&p, "routed_scaling_factor", "is %g: must be positive", c->routed_scaling_factor);
  for (int i = 0; i < c->n_eos; i++)
    if (c->eos_token_id[i] < 0 || c->eos_token_id[i] >= c->vocab_size)
      return bad(&p, "eos_token_id", "holds %lld: outside the vocabulary (vocab_size %lld)",
                 (long long)c->eos_token_id[i], (long long)c->vocab_size);
  c->qk_head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
  if ((r = parse_layer_kinds(&p, a, c))) return r;

  const json *q = json_get(o, "quantization_config");
  if (q && q->type == JSON_OBJ) {
    if ((r = parse_quant_obj(&p, q, a, c, "config.json", "ignore"))) return r;
  } else if (q && q->type != JSON_NULL) {
    return bad(&p, "quantization_config", "must be an object");
  }
  return 0;
}

void model_config_glm5(model_config *c, int64_t layers, int64_t dense, mj_arena *a) {
  char text[160];
  int n = snprintf(text, sizeof text,
                   "{\"model_type\": \"glm_moe_dsa\", \"num_hidden_layers\": %lld, \"first_k_dense_replace\": %lld}",
                   (long long)layers, (long long)dense);
  mj_err err = {0};
  int r = model_config_parse(a, text, (size_t)n, "GLM-5's config", c, &err);
  if (r) fprintf(stderr, "moejit: %s\n", err.msg);
  MJ_ASSERT(r == 0); /* only impossible layer counts fail, and callers pass checked ones */
  mj_err_clear(&err);
}

int model_quant_parse(mj_arena *a, const char *text, size_t len, const char *name, model_config *c,
                      mj_err *err) {
  json *o;
  int r = json_parse(a, text, len, name, &o, err);
  if (r) return r;
  const json *q = json_get(o, "quantization");
  if (!q || q->type != JSON_OBJ)
    return mj_fail(err, MJ_EINPUT, "%s: \"quantization\" must be an object (ModelOpt hf_quant_config.json)", name);
  cfgp p = {q, name, err};
  c->quant_exclude = NULL;
  c->n_quant_exclude = 0;
  return parse_quant_obj(&p, q, a, c, "hf_quant_config.json", "exclude_modules");
}

bool model_glob_match(const char *pat, const char *s) {
  /* Iterative wildcard match with one backtrack point: '*' matches any run
   * of characters, dots included; '?' matches one character. */
  const char *star = NULL, *resume = NULL;
  while (*s) {
    if (*pat == '*') {
      star = pat++;
      resume = s;
    } else if (*pat == '?' || *pat == *s) {
      pat++, s++;
    } else if (star) {
      pat = star + 1;
      s = ++resume;
    } else {
      return false;
    }
  }
  while (*pat == '*') pat++;
  return !*pat;
}

bool model_quant_excluded(const model_config *c, const char *module) {
  for (int i = 0; i < c->n_quant_exclude; i++)
    if (model_glob_match(c->quant_exclude[i], module)) return true;
  return false;
}

/* ---- tensor binding ------------------------------------------------------------- */
typedef struct {
  model *m;
  uint8_t *used;
  const char *ckpt; /* for "missing" messages */
  mj_err *err;
} binder;

static const st_tensor *need(binder *b, const char *name) {
  const st_tensor *t = st_find(&b->m->st, name);
  if (!t) {
    mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' is missing (config.json needs it)", b->ckpt, name);
    return NULL;
  }
  b->used[st_index(&b->m->st, t)] = 1;
  return t;
}

static int check_align(binder *b, const st_tensor *t) {
  size_t es = st_dtype_size(t->dtype);
  if ((uintptr_t)t->data % es)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s': data at byte %zu is not aligned to its %zu-byte elements",
                   st_path(&b->m->st, t), t->name, (size_t)((const uint8_t *)t->data - (const uint8_t *)b->m->st.files[t->file].map), es);
  return 0;
}

static int check_shape(binder *b, const st_tensor *t, int ndim, int64_t d0, int64_t d1) {
  if (t->ndim == ndim && (ndim < 1 || t->shape[0] == d0) && (ndim < 2 || t->shape[1] == d1)) return 0;
  char got[128];
  st_shape_str(t, got, sizeof got);
  if (ndim == 2)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has shape %s; config.json needs [%lld, %lld]",
                   st_path(&b->m->st, t), t->name, got, (long long)d0, (long long)d1);
  if (ndim == 1)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has shape %s; config.json needs [%lld]",
                   st_path(&b->m->st, t), t->name, got, (long long)d0);
  return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has shape %s; needs a scalar", st_path(&b->m->st, t),
                 t->name, got);
}

static int scalar_f32(binder *b, const char *name, float *out, bool required) {
  const st_tensor *t = st_find(&b->m->st, name);
  if (!t) {
    if (!required) return 0;
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' is missing (an NVFP4 weight needs it)", b->ckpt, name);
  }
  b->used[st_index(&b->m->st, t)] = 1;
  if (t->dtype != ST_F32)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has dtype %s; expected F32", st_path(&b->m->st, t), name,
                   st_dtype_name(t->dtype));
  if (t->numel != 1 || t->ndim > 1) {
    char got[128];
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has shape %s; expected a scalar", st_path(&b->m->st, t),
                   name, st_shape_str(t, got, sizeof got));
  }
  memcpy(out, t->data, 4);
  b->m->bytes_nvfp4 += 4;
  return 0;
}

/* Bind prefix.weight as a [rows][cols] linear weight, plain or NVFP4. */
static int bind_weight(binder *b, const char *prefix, int64_t rows, int64_t cols, model_weight *w) {
  model *m = b->m;
  char name[512];
  snprintf(name, sizeof name, "%s.weight", prefix);
  const st_tensor *t = need(b, name);
  if (!t) return MJ_EINPUT;
  memset(w, 0, sizeof *w);
  w->name = t->name;
  w->rows = rows;
  w->cols = cols;
  w->w = t->data;
  char sname[512];
  snprintf(sname, sizeof sname, "%s.weight_scale", prefix);
  const st_tensor *sc = st_find(&m->st, sname);
  if (t->dtype == ST_BF16 || t->dtype == ST_F32) {
    w->fmt = t->dtype == ST_BF16 ? MODEL_W_BF16 : MODEL_W_F32;
    int r = check_shape(b, t, 2, rows, cols);
    if (!r) r = check_align(b, t);
    if (r) return r;
    if (w->fmt == MODEL_W_BF16) m->bytes_bf16 += t->nbytes;
    else m->bytes_f32 += t->nbytes;
    m->n_plain_linears++;
    return 0;
  }
  if (t->dtype != ST_U8)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has dtype %s; expected BF16 or F32 (or U8 NVFP4 codes)",
                   st_path(&m->st, t), t->name, st_dtype_name(t->dtype));
  if (!sc)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' is U8 but '%s' is missing (NVFP4 needs its block scales)",
                   st_path(&m->st, t), t->name, sname);
  if (cols % 16)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s': NVFP4 needs the input width (%lld) to be a multiple of 16",
                   st_path(&m->st, t), t->name, (long long)cols);
  int r = check_shape(b, t, 2, rows, cols / 2);
  if (r) return r;
  b->used[st_index(&m->st, sc)] = 1;
  if (sc->dtype != ST_F8_E4M3)
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has dtype %s; expected F8_E4M3", st_path(&m->st, sc), sname,
                   st_dtype_name(sc->dtype));
  if ((r = check_shape(b, sc, 2, rows, cols / 16))) return r;
  w->fmt = MODEL_W_NVFP4;
  w->scale = sc->data;
  snprintf(sname, sizeof sname, "%s.weight_scale_2", prefix);
  if ((r = scalar_f32(b, sname, &w->scale2, true))) return r;
  if (!(isfinite(w->scale2) && w->scale2 > 0))
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' is %g: must be a positive number", b->ckpt, sname, w->scale2);
  snprintf(sname, sizeof sname, "%s.input_scale", prefix);
  if ((r = scalar_f32(b, sname, &w->input_scale, false))) return r;
  m->bytes_nvfp4 += t->nbytes + sc->nbytes;
  m->n_nvfp4_linears++;
  return 0;
}

static int bind_vec(binder *b, const char *name, int64_t n, bool need_f32, model_vec *v) {
  const st_tensor *t = need(b, name);
  if (!t) return MJ_EINPUT;
  if (t->dtype != ST_F32 && (need_f32 || t->dtype != ST_BF16))
    return mj_fail(b->err, MJ_EINPUT, "%s: tensor '%s' has dtype %s; expected %s", st_path(&b->m->st, t), name,
                   st_dtype_name(t->dtype), need_f32 ? "F32" : "BF16 or F32");
  int r = check_shape(b, t, 1, n, 0);
  if (!r) r = check_align(b, t);
  if (r) return r;
  v->name = t->name;
  v->p = t->data;
  v->f32 = t->dtype == ST_F32;
  v->n = n;
  if (v->f32) b->m->bytes_f32 += t->nbytes;
  else b->m->bytes_bf16 += t->nbytes;
  return 0;
}

static int bind_mlp(binder *b, const char *prefix, int64_t hidden, int64_t inter, model_mlp *mlp) {
  char p[512];
  int r;
  snprintf(p, sizeof p, "%s.gate_proj", prefix);
  if ((r = bind_weight(b, p, inter, hidden, &mlp->gate))) return r;
  snprintf(p, sizeof p, "%s.up_proj", prefix);
  if ((r = bind_weight(b, p, inter, hidden, &mlp->up))) return r;
  snprintf(p, sizeof p, "%s.down_proj", prefix);
  return bind_weight(b, p, hidden, inter, &mlp->down);
}

static int bind_layer(binder *b, int64_t L, model_layer *ly) {
  const model_config *c = &b->m->cfg;
  int64_t H = c->hidden_size, nh = c->num_attention_heads;
  char p[512], q[512];
  int r;
#define W(suffix, rows, cols, field)                                \
  do {                                                              \
    snprintf(q, sizeof q, "model.layers.%lld.%s", (long long)L, suffix); \
    if ((r = bind_weight(b, q, rows, cols, field))) return r;       \
  } while (0)
#define V(suffix, n, f32, field)                                    \
  do {                                                              \
    snprintf(q, sizeof q, "model.layers.%lld.%s", (long long)L, suffix); \
    if ((r = bind_vec(b, q, n, f32, field))) return r;              \
  } while (0)
  V("input_layernorm.weight", H, false, &ly->input_norm);
  V("post_attention_layernorm.weight", H, false, &ly->post_norm);
  W("self_attn.q_a_proj", c->q_lora_rank, H, &ly->q_a);
  V("self_attn.q_a_layernorm.weight", c->q_lora_rank, false, &ly->q_a_norm);
  W("self_attn.q_b_proj", nh * c->qk_head_dim, c->q_lora_rank, &ly->q_b);
  W("self_attn.kv_a_proj_with_mqa", c->kv_lora_rank + c->qk_rope_head_dim, H, &ly->kv_a);
  V("self_attn.kv_a_layernorm.weight", c->kv_lora_rank, false, &ly->kv_a_norm);
  W("self_attn.kv_b_proj", nh * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, &ly->kv_b);
  W("self_attn.o_proj", H, nh * c->v_head_dim, &ly->o);
  ly->has_indexer = c->layer_indexer_full[L];
  if (ly->has_indexer) {
    W("self_attn.indexer.wq_b", c->index_n_heads * c->index_head_dim, c->q_lora_rank, &ly->idx_wq_b);
    W("self_attn.indexer.wk", c->index_head_dim, H, &ly->idx_wk);
    W("self_attn.indexer.weights_proj", c->index_n_heads, H, &ly->idx_wproj);
    V("self_attn.indexer.k_norm.weight", c->index_head_dim, false, &ly->idx_k_norm_w);
    V("self_attn.indexer.k_norm.bias", c->index_head_dim, false, &ly->idx_k_norm_b);
  }
  ly->sparse = c->layer_sparse[L];
  if (!ly->sparse) {
    snprintf(p, sizeof p, "model.layers.%lld.mlp", (long long)L);
    return bind_mlp(b, p, H, c->intermediate_size, &ly->dense);
  }
  W("mlp.gate", c->n_routed_experts, H, &ly->router);
  V("mlp.gate.e_score_correction_bias", c->n_routed_experts, false, &ly->router_bias);
  ly->experts = mj_arena_alloc(&b->m->arena, (size_t)c->n_routed_experts * sizeof *ly->experts);
  for (int64_t e = 0; e < c->n_routed_experts; e++) {
    snprintf(p, sizeof p, "model.layers.%lld.mlp.experts.%lld", (long long)L, (long long)e);
    if ((r = bind_mlp(b, p, H, c->moe_intermediate_size, &ly->experts[e]))) return r;
  }
  if (c->n_shared_experts > 0) {
    snprintf(p, sizeof p, "model.layers.%lld.mlp.shared_experts", (long long)L);
    if ((r = bind_mlp(b, p, H, c->moe_intermediate_size * c->n_shared_experts, &ly->shared))) return r;
  }
  return 0;
#undef W
#undef V
}

static int read_optional(const char *path, char **text, size_t *len, bool *found, mj_err *err) {
  struct stat st;
  *found = stat(path, &st) == 0;
  if (!*found) return 0;
  return mj_read_file(path, text, len, err);
}

int model_load(const char *dir, model **out, mj_err *err) {
  *out = NULL;
  double t0 = mj_now_ms();
  model *m = mj_xcalloc(1, sizeof *m);
  mj_arena_init(&m->arena, 1 << 16);
  m->dir = mj_xstrdup(dir);
  char path[4096];
  char *text = NULL;
  size_t len;
  bool found;
  int r;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((r = read_optional(path, &text, &len, &found, err))) goto fail;
  if (!found) {
    r = mj_fail(err, MJ_EINPUT, "%s: no config.json in this folder (not a Hugging Face model folder?)", dir);
    goto fail;
  }
  r = model_config_parse(&m->arena, text, len, path, &m->cfg, err);
  free(text);
  text = NULL;
  if (r) goto fail;
  snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
  if ((r = read_optional(path, &text, &len, &found, err))) goto fail;
  if (found) {
    r = model_quant_parse(&m->arena, text, len, path, &m->cfg, err);
    free(text);
    text = NULL;
    if (r) goto fail;
  }
  if ((r = st_open(&m->st, dir, err))) goto fail;
  m->n_tensors = m->st.ntensors;
  m->bytes_total = m->st.total_bytes;

  const model_config *c = &m->cfg;
  binder b = {m, mj_xcalloc(m->st.ntensors ? m->st.ntensors : 1, 1),
              m->st.sharded ? mj_arena_printf(&m->arena, "%s/model.safetensors.index.json", dir)
                            : mj_arena_printf(&m->arena, "%s/model.safetensors", dir),
              err};
  /* The embedding is a lookup table, bound like a weight [vocab][hidden]. */
  if ((r = bind_weight(&b, "model.embed_tokens", c->vocab_size, c->hidden_size, &m->embed))) goto fail_b;
  if (m->embed.fmt == MODEL_W_NVFP4) {
    r = mj_fail(err, MJ_EINPUT, "%s: tensor 'model.embed_tokens.weight' is NVFP4: the embedding must be BF16 or F32", b.ckpt);
    goto fail_b;
  }
  if ((r = bind_vec(&b, "model.norm.weight", c->hidden_size, false, &m->norm))) goto fail_b;
  if (c->tie_word_embeddings && !st_find(&m->st, "lm_head.weight")) {
    m->lm_head = m->embed;
  } else if ((r = bind_weight(&b, "lm_head", c->vocab_size, c->hidden_size, &m->lm_head))) {
    goto fail_b;
  }
  m->layers = mj_arena_alloc(&m->arena, (size_t)c->num_hidden_layers * sizeof *m->layers);
  for (int64_t L = 0; L < c->num_hidden_layers; L++)
    if ((r = bind_layer(&b, L, &m->layers[L]))) goto fail_b;
  /* Anything left is unexpected, except the MTP layer (index
   * num_hidden_layers), which the reference skips as well. */
  char mtp[64];
  int nm = snprintf(mtp, sizeof mtp, "model.layers.%lld.", (long long)c->num_hidden_layers);
  for (size_t i = 0; i < m->st.ntensors; i++) {
    if (b.used[i]) continue;
    const st_tensor *t = &m->st.tensors[i];
    if (strncmp(t->name, mtp, (size_t)nm) == 0) {
      m->n_skipped++;
      m->bytes_skipped += t->nbytes;
      continue;
    }
    r = mj_fail(err, MJ_EINPUT, "%s: unexpected tensor '%s' (config.json describes no such weight)",
                st_path(&m->st, t), t->name);
    goto fail_b;
  }
  free(b.used);
  m->load_ms = mj_now_ms() - t0;
  *out = m;
  return 0;
fail_b:
  free(b.used);
fail:
  free(text);
  model_free(m);
  return r;
}

void model_free(model *m) {
  if (!m) return;
  st_close(&m->st);
  mj_arena_free(&m->arena);
  free(m->dir);
  free(m);
}

const char *model_wfmt_name(model_wfmt f) {
  return f == MODEL_W_BF16 ? "bf16" : f == MODEL_W_F32 ? "f32" : "nvfp4";
}

/* ---- reading weights -------------------------------------------------------------- */
static float e2m1_lut[16], e4m3_lut[256];
static int luts_ready;

static void init_luts(void) {
  if (__atomic_load_n(&luts_ready, __ATOMIC_ACQUIRE)) return;
  for (int i = 0; i < 16; i++) e2m1_lut[i] = dt_e2m1_to_f32((uint8_t)i);
  for (int i = 0; i < 256; i++) e4m3_lut[i] = dt_e4m3_to_f32((uint8_t)i);
  __atomic_store_n(&luts_ready, 1, __ATOMIC_RELEASE);
}

void model_weight_row(const model_weight *w, int64_t r, float *out) {
  int64_t K = w->cols;
  switch (w->fmt) {
  case MODEL_W_BF16: {
    const bf16 *p = (const bf16 *)w->w + r * K;
    for (int64_t i = 0; i < K; i++) out[i] = dt_bf16_to_f32(p[i]);
    return;
  }
  case MODEL_W_F32:
    memcpy(out, (const float *)w->w + r * K, (size_t)K * sizeof(float));
    return;
  case MODEL_W_NVFP4: {
    init_luts();
    const uint8_t *codes = (const uint8_t *)w->w + r * (K / 2);
    const uint8_t *sc = w->scale + r * (K / 16);
    float s2 = w->scale2;
    for (int64_t blk = 0; blk < K / 16; blk++) {
      float s = e4m3_lut[sc[blk]];
      for (int j = 0; j < 8; j++) {
        uint8_t byte = codes[blk * 8 + j];
        /* Even column in the low nibble.  (v * s) * s2: the product order of
         * the reference dequantisation, so the float32 values agree bit for
         * bit. */
        out[blk * 16 + 2 * j] = (e2m1_lut[byte & 15] * s) * s2;
        out[blk * 16 + 2 * j + 1] = (e2m1_lut[byte >> 4] * s) * s2;
      }
    }
    return;
  }
  }
}

float model_vec_at(const model_vec *v, int64_t i) {
  return v->f32 ? ((const float *)v->p)[i] : dt_bf16_to_f32(((const bf16 *)v->p)[i]);
}

model_moe_cfg model_moe_of(const model_config *c) {
  return (model_moe_cfg){.hidden = (int)c->hidden_size, .inter = (int)c->moe_intermediate_size,
                         .n_experts = (int)c->n_routed_experts, .topk = (int)c->num_experts_per_tok,
                         .n_group = (int)c->n_group, .topk_group = (int)c->topk_group,
                         .norm_topk_prob = c->norm_topk_prob, .scaling = (float)c->routed_scaling_factor};
}

model_moe_cfg model_moe_glm5(void) {
  mj_arena a;
  mj_arena_init(&a, 1024);
  model_config mc;
  model_config_glm5(&mc, 4, 3, &a);
  model_moe_cfg c = model_moe_of(&mc);
  mj_arena_free(&a);
  return c;
}

void model_rope_inv_freq(double theta, int64_t dim, float *inv) {
  /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in
   * float32: the exponent is a float32 quotient, the power is rounded to
   * float32, then the reciprocal. */
  for (int64_t i = 0; i < dim / 2; i++) {
    float e = (float)(2 * i) / (float)dim;
    float p = (float)pow(theta, (double)e);
    inv[i] = 1.0f / p;
  }
}

static bool ikey_bf16;
static pthread_once_t ikey_once = PTHREAD_ONCE_INIT;
static void ikey_read(void) {
  const char *v = getenv("MOEJIT_INDEXER_KEYS");
  if (!v || !*v || !strcmp(v, "f32")) return;
  if (!strcmp(v, "bf16")) ikey_bf16 = true;
  else mj_warn("MOEJIT_INDEXER_KEYS=%s ignored: it takes f32 or bf16", v);
}
bool model_ikey_bf16(void) {
  pthread_once(&ikey_once, ikey_read);
  return ikey_bf16;
}
