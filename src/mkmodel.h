/* mkmodel.h: writing synthetic GLM-5 checkpoints (see mkmodel.c).
 *
 * A spec holds the widths of a glm_moe_dsa model and the generator's
 * options; mkmodel_preset fills one for "tiny", "small" or "glm5", and
 * mkmodel_write writes the Hugging Face folder.  Tests call these directly;
 * `moejit mkmodel` is the command-line face.  Prefix: mkmodel_.
 */
#ifndef MOEJIT_MKMODEL_H
#define MOEJIT_MKMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "util.h"

typedef struct mkmodel_spec {
  int64_t vocab, hidden, inter, moe_inter, layers, dense_layers;
  int64_t heads, q_lora, kv_lora, nope, rope, v;
  int64_t idx_heads, idx_dim, idx_topk;
  int64_t experts, per_tok, shared, n_group, topk_group, max_pos;
  double theta, eps, rsf;
  const char *indexer_types; /* one 'F'/'S' per layer, or NULL (all full) */
  bool nvfp4;                /* routed experts in NVFP4 */
  uint64_t seed;
  int64_t shard_size; /* 0: one file */
  int64_t merges;     /* BPE merges in tokenizer.json (at most) */
  int64_t threads;    /* generator threads (values do not depend on it) */
  const char *config_text; /* written as config.json verbatim (mkmodel_spec_from_config), or NULL */
} mkmodel_spec;

/* Fill s from a preset name; -1 if unknown. */
int mkmodel_preset(const char *name, mkmodel_spec *s);
/* Fill s from a parsed config.json (the widths, layer kinds, RoPE theta,
 * eps and scaling factor; generator options as a preset leaves them), for
 * weights to any configuration, e.g. one that transformers wrote.  Refuses
 * (MJ_EUSAGE, naming the field) what the generator cannot write: a dense
 * layer after a sparse one, tied embeddings. */
int mkmodel_spec_from_config(const model_config *c, mj_arena *a, mkmodel_spec *s, mj_err *err);
/* Write the folder.  An existing model there is replaced only with force.
 * *bytes (if non-NULL) receives the safetensors bytes written. */
int mkmodel_write(const mkmodel_spec *s, const char *dir, bool force, uint64_t *bytes, mj_err *err);
/* First id of the 36 special tokens for a vocabulary size: GLM-5's 154820
 * when the vocabulary reaches that far, else the last 36 ids. */
int64_t mkmodel_special_base(int64_t vocab);

#endif
