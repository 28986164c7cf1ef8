/* shard.h: which part of every GLM-5 weight a rank owns, for tensor and
 * expert parallelism over several GPUs (docs/multigpu.md).
 *
 * A plan is pure arithmetic on the model config, the rank, --tp and --ep,
 * so it is tested on the CPU: every row, column and expert is owned exactly
 * once across the ranks whose partial results are summed, and the CPU
 * reference ops computed per rank on their slices and summed equal the
 * unsplit ops (tests/test_shard.c).  The split follows the usual
 * Megatron/DeepSeek layout, chosen so that each sharded block needs one
 * all-reduce of the hidden vector and nothing in between:
 *   - attention (tp > 1): a contiguous block of heads per rank: the rows of
 *     q_b_proj and kv_b_proj of those heads (outputs) and the columns of
 *     o_proj that read them (inputs); o_proj's partial outputs are summed by
 *     an all-reduce.  q_a, kv_a, their norms, the DSA indexer and the router
 *     are small and stay whole on every rank (so every rank picks the same
 *     tokens and experts).
 *   - dense MLP (tp > 1): a block of the intermediate width: gate and up
 *     rows, down columns; an all-reduce after down.
 *   - MoE: each rank owns a contiguous block of E/world routed experts,
 *     whole, under --tp as under --ep (the NVFP4 expert kernels stream an
 *     expert's whole rows; GLM-5's 2048-wide experts split 8 ways would be
 *     256 wide, below their 1024-multiple).  The shared expert is split
 *     like the dense MLP over all the ranks of the MoE's all-reduce (the
 *     world), so it is counted once in the sum even with --ep alone.
 *   - lm_head: the rank's block of vocabulary rows; an all-gather joins
 *     the logits (whole on every rank when the vocabulary does not divide).
 * Splits of an input width that NVFP4 weights may have are whole 16-value
 * scale blocks, so a rank's slice of an NVFP4 tensor is NVFP4 again.
 * Prefix: shard_.
 */
#ifndef MOEJIT_SHARD_H
#define MOEJIT_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "util.h"

/* [begin, end) */
typedef struct shard_range {
  int64_t begin, end;
} shard_range;

typedef struct shard_plan {
  int rank, world, tp, ep;
  /* attention: heads of num_attention_heads, and what they own */
  shard_range heads;
  shard_range q_b_rows;   /* q_b_proj output rows: heads * qk_head_dim */
  shard_range kv_b_rows;  /* kv_b_proj output rows: heads * (qk_nope_head_dim + v_head_dim) */
  shard_range o_cols;     /* o_proj input columns: heads * v_head_dim */
  bool attn_reduce;       /* all-reduce after o_proj (tp > 1); else every rank has it whole */
  /* dense MLP: of intermediate_size, gate/up rows and down columns */
  shard_range dense_inter;
  bool dense_reduce;
  /* MoE: all-reduce after the layer when world > 1 */
  shard_range experts;      /* routed experts owned, whole (split over the world) */
  shard_range shared_inter; /* of moe_intermediate_size * n_shared_experts */
  bool moe_reduce;
  /* lm_head: the rank's vocabulary rows, joined by an all-gather */
  shard_range vocab;
  bool head_gather;
} shard_plan;

/* The block of n that part k of parts owns (n % parts == 0 is checked by
 * the caller). */
shard_range shard_split(int64_t n, int parts, int k);

/* The plan of rank `rank` of max(tp, ep) ranks.  A config that cannot be
 * split so (heads, widths or experts not divisible, a slice of an NVFP4
 * width not whole scale blocks) is one MJ_EUSAGE line naming the field, its
 * value and the flag. */
int shard_plan_make(const model_config *c, int rank, int tp, int ep, shard_plan *p, mj_err *err);

/* The rank that owns routed expert e (ep > 1), else -1 (every rank). */
int shard_expert_rank(const shard_plan *p, int64_t n_experts, int64_t e);

/* A rank's slice of a weight, in the weight's own format (bf16, f32 or
 * NVFP4 with the same scale_2).  Rows: a view into the checkpoint's
 * mapping, no copy (the rows of a row-major tensor are one byte range).
 * Columns: copied into a (begin and end whole 16-column blocks for NVFP4). */
void shard_weight_rows(const model_weight *w, shard_range rows, model_weight *out);
void shard_weight_cols(const model_weight *w, shard_range cols, mj_arena *a, model_weight *out);
/* The rank's slice of an MLP: gate and up rows, down columns. */
void shard_mlp(const model_mlp *m, shard_range inter, mj_arena *a, model_mlp *out);

/* The weight bytes a rank holds under plan p: *sharded, its own slices
 * (summed over the ranks, each sharded byte once), and *whole, what every
 * rank holds in full (norms, q_a, kv_a, the indexer, the router,
 * embeddings, lm_head, and blocks the plan leaves unsplit).  NVFP4 counts
 * codes, block scales and scale_2 (input_scale is unused). */
void shard_rank_bytes(const model *m, const shard_plan *p, uint64_t *sharded, uint64_t *whole);
/* Read every byte of the checkpoint that rank p needs (its blocks of the
 * split weights, row by row where a block is columns; everything every
 * rank holds), as its upload will: the bytes read (equal to shard_rank_bytes'
 * sum); *checksum (may be NULL) a sum of them, so nothing is skipped. */
uint64_t shard_rank_read(const model *m, const shard_plan *p, uint64_t *checksum);

#endif
