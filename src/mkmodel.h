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
} mkmodel_spec;

/* Fill s from a preset name; -1 if unknown. */
int mkmodel_preset(const char *name, mkmodel_spec *s);
/* Write the folder.  An existing model there is replaced only with force.
 * *bytes (if non-NULL) receives the safetensors bytes written. */
int mkmodel_write(const mkmodel_spec *s, const char *dir, bool force, uint64_t *bytes, mj_err *err);
/* First id of the 36 special tokens for a vocabulary size: GLM-5's 154820
 * when the vocabulary reaches that far, else the last 36 ids. */
int64_t mkmodel_special_base(int64_t vocab);

#endif
