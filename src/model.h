/* model.h: a GLM-5 (glm_moe_dsa) checkpoint, read and validated.
 *
 * model_load reads a Hugging Face folder: config.json (every field the
 * forward pass uses, with the reference's defaults where a field is absent),
 * hf_quant_config.json or config.json's quantization_config, and the
 * safetensors files (safetensors.h).  It then binds every tensor the config
 * requires to a typed view (model_weight, model_vec), checking dtype and
 * shape, and refuses a checkpoint with a missing or an unexpected tensor
 * (the MTP layer stored as layer num_hidden_layers is skipped).  Weights stay
 * in the read-only mappings: nothing is copied or converted here, so loading
 * costs header parsing only.  The tensor format is decided per tensor by its
 * dtype: BF16/F32 = plain; U8 with a weight_scale sibling = NVFP4.
 * Prefix: model_.
 */
#ifndef MOEJIT_MODEL_H
#define MOEJIT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "json.h"
#include "safetensors.h"
#include "util.h"

#define MODEL_MAX_EOS 16

typedef struct model_config {
  int64_t vocab_size, hidden_size, intermediate_size, moe_intermediate_size;
  int64_t num_hidden_layers, num_attention_heads, num_key_value_heads;
  int64_t q_lora_rank, kv_lora_rank;
  int64_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim, qk_head_dim;
  int64_t index_n_heads, index_head_dim, index_topk;
  int64_t n_routed_experts, num_experts_per_tok, n_shared_experts, n_group, topk_group;
  int64_t first_k_dense_replace, moe_layer_freq, max_position_embeddings;
  int64_t pad_token_id; /* -1 when null */
  int64_t eos_token_id[MODEL_MAX_EOS];
  int n_eos;
  double rms_norm_eps, routed_scaling_factor;
  bool norm_topk_prob, tie_word_embeddings;
  /* RoPE: rope_parameters (or the legacy top-level rope_theta/rope_scaling). */
  double rope_theta;
  char rope_type[32]; /* "default", "yarn", ... */
  double rope_factor, rope_mscale_all_dim;
  bool rope_interleave, indexer_rope_interleave; /* read; the reference ignores them */
  /* Per layer: 1 = MoE ("sparse"), 0 = dense; 1 = the layer runs its own
   * indexer ("full"), 0 = it reuses the previous full layer's top-k. */
  uint8_t *layer_sparse;
  uint8_t *layer_indexer_full;
  /* Quantisation as declared (the tensors decide; this is for reporting and
   * a cross-check). */
  const char *quant_source; /* "hf_quant_config.json", "config.json" or NULL */
  const char *quant_algo;   /* "NVFP4" or NULL */
  int64_t quant_group_size;
  const char **quant_exclude;
  int n_quant_exclude;
} model_config;

/* The MoE fields of config.json that the layer needs. */
typedef struct model_moe_cfg {
  int hidden;       /* hidden_size */
  int inter;        /* moe_intermediate_size */
  int n_experts;    /* n_routed_experts */
  int topk;         /* num_experts_per_tok */
  int n_group, topk_group;
  bool norm_topk_prob;
  float scaling;    /* routed_scaling_factor */
  /* Expert parallelism (shard.h): this rank holds and runs routed experts
   * e_first .. e_first + e_count - 1 only; e_count 0: all of them. */
  int e_first, e_count;
} model_moe_cfg;

/* The routed experts a rank holds (all without expert parallelism). */
static inline int model_moe_local(const model_moe_cfg *c) { return c->e_count > 0 ? c->e_count : c->n_experts; }

/* One NVFP4 linear as the checkpoint stores it: W [n, k] with codes [n, k/2]
 * (even column in the low nibble), e4m3 scales [n, k/16] and the global
 * scale s2; W[r][c] = e2m1(code) * e4m3(scale[r][c/16]) * s2. */
typedef struct model_nvfp4 {
  const uint8_t *w;
  const uint8_t *s;
  float s2;
  int n, k;
} model_nvfp4;

/* The MoE layer's fields of a config, and of GLM-5's own (model_config_glm5). */
model_moe_cfg model_moe_of(const model_config *c);
model_moe_cfg model_moe_glm5(void);

/* RoPE inverse frequencies inv[i] = 1 / theta^(2i/dim), i < dim/2, rounded
 * as the reference's float32 computation rounds them (the CPU reference and
 * the GPU engine both use these). */
void model_rope_inv_freq(double theta, int64_t dim, float *inv);

/* Parse config.json text (name is used in messages).  Arrays are allocated
 * in a.  Impossible or unsupported values are an MJ_EINPUT naming name and
 * the field. */
int model_config_parse(mj_arena *a, const char *text, size_t len, const char *name,
                       model_config *c, mj_err *err);
/* GLM-5's own config (glm5.md: every field at the parser's default, which
 * is GLM-5's value) with `layers` layers, the first `dense` of them dense;
 * arrays in a.  The one place GLM-5's widths are written down is the
 * parser's table of defaults, so this is the config.json
 * {"model_type": "glm_moe_dsa", "num_hidden_layers": L,
 * "first_k_dense_replace": D} read back. */
void model_config_glm5(model_config *c, int64_t layers, int64_t dense, mj_arena *a);
/* Parse hf_quant_config.json into c (quant_*). */
int model_quant_parse(mj_arena *a, const char *text, size_t len, const char *name,
                      model_config *c, mj_err *err);
/* Does a module name match one of the exclude globs ('*' crosses dots)? */
bool model_glob_match(const char *pattern, const char *s);
bool model_quant_excluded(const model_config *c, const char *module);
/* The DSA indexer's key cache in bf16 (true) or f32 (false, the default):
 * MOEJIT_INDEXER_KEYS=bf16|f32, read once a process, so both backends,
 * warmup, the benches and the tests agree.  A bf16 key is the f32 key
 * (after k_norm and RoPE) rounded to nearest even, and the scores are
 * still computed in f32: what transformers' indexer does with the model in
 * bf16, whose cache holds keys in the model's dtype (in fp32 it holds f32
 * keys).  Half the bytes the selection streams (docs/decode.md).  Any
 * other value is ignored with a warning. */
bool model_ikey_bf16(void);

typedef enum { MODEL_W_BF16, MODEL_W_F32, MODEL_W_NVFP4 } model_wfmt;

/* A linear layer's weight [rows = out][cols = in]. */
typedef struct model_weight {
  const char *name; /* tensor name of the weight */
  model_wfmt fmt;
  int64_t rows, cols;
  const void *w;          /* bf16/f32 [rows][cols], or NVFP4 codes [rows][cols/2] */
  const uint8_t *scale;   /* NVFP4: e4m3 [rows][cols/16] */
  float scale2;           /* NVFP4: weight_scale_2 */
  float input_scale;      /* NVFP4: input_scale (0 when absent; weight-only use ignores it) */
} model_weight;

/* A vector (norm weight, bias, router correction bias): bf16 or f32. */
typedef struct model_vec {
  const char *name;
  const void *p;
  bool f32;
  int64_t n;
} model_vec;

typedef struct model_mlp {
  model_weight gate, up, down;
} model_mlp;

typedef struct model_layer {
  model_vec input_norm, post_norm;
  model_weight q_a, q_b, kv_a, kv_b, o;
  model_vec q_a_norm, kv_a_norm;
  bool has_indexer;
  model_weight idx_wq_b, idx_wk, idx_wproj;
  model_vec idx_k_norm_w, idx_k_norm_b;
  bool sparse;
  model_mlp dense;     /* !sparse */
  model_weight router; /* sparse: mlp.gate.weight [E][hidden] */
  model_vec router_bias;
  model_mlp *experts;  /* sparse: n_routed_experts */
  model_mlp shared;    /* sparse and n_shared_experts > 0 */
} model_layer;

typedef struct model {
  char *dir;
  model_config cfg;
  mj_arena arena;
  st_set st;
  model_weight embed, lm_head;
  model_vec norm;
  model_layer *layers;
  /* Accounting for `moejit info` and load benchmarks. */
  uint64_t bytes_total, bytes_bf16, bytes_f32, bytes_nvfp4, bytes_skipped;
  size_t n_tensors, n_nvfp4_linears, n_plain_linears, n_skipped;
  double load_ms;
} model;

/* Load and validate dir.  On failure *out is NULL and err holds one line. */
int model_load(const char *dir, model **out, mj_err *err);
void model_free(model *m);

/* Dequantise row r of a weight into out[cols] (float32).  For NVFP4 each
 * value is e2m1(code) * e4m3(scale) * weight_scale_2, multiplied in that
 * order in float32, as the reference dequantisation does. */
void model_weight_row(const model_weight *w, int64_t r, float *out);
/* v[i] as float32. */
float model_vec_at(const model_vec *v, int64_t i);

const char *model_wfmt_name(model_wfmt f);

#endif
