/* cpu_forward.h: the CPU reference forward pass of GLM-5, with a KV cache.
 *
 * A cpu_model holds the per-layer caches of one sequence: the MLA
 * compressed cache (the kv_lora_rank latent after kv_a_layernorm and the
 * rotated rope key, per token) and the DSA indexer's key cache.  cpu_forward
 * runs n tokens at positions pos..pos+n-1 through every layer (a prefill
 * when n > 1, a decode step when n == 1) and writes logits.  Attention is
 * computed from the compressed cache in either the expanded form (kv_b_proj
 * applied to every cached latent, as the reference does) or the absorbed
 * form (kv_b_proj folded into the query and output), which must agree.
 * With cpu_params.tp/ep it computes each block the way the ranks of a
 * sharded deployment do (their heads, intermediate rows and experts, from
 * shard_plan_make) and sums the partials in rank order where those ranks
 * all-reduce: the whole-model proof of the sharded arithmetic.
 * Prefix: cpu_.
 */
#ifndef MOEJIT_CPU_FORWARD_H
#define MOEJIT_CPU_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "util.h"

typedef struct cpu_params {
  int64_t max_ctx; /* cache capacity in tokens (0: 4096, capped by the config) */
  int threads;     /* matmul threads (0 or 1: none) */
  bool absorbed;   /* absorbed MLA instead of the expanded form */
  int tp, ep;      /* > 1: compute every sharded block as the ranks of --tp/--ep would (src/shard.h), each
                      on its own slices, and sum their partial results where the GPUs all-reduce */
} cpu_params;

typedef struct cpu_model cpu_model;

int cpu_model_create(const model *m, const cpu_params *p, cpu_model **out, mj_err *err);
void cpu_model_destroy(cpu_model *s);

/* Run tokens[0..n) at positions pos..pos+n-1.  pos may be at most the
 * number of tokens cached (a smaller pos rewinds the cache).  logits (may be
 * NULL) receives n * vocab_size floats when all_logits, else the last
 * token's vocab_size. */
int cpu_forward(cpu_model *s, const int32_t *tokens, int64_t n, int64_t pos, float *logits, bool all_logits,
                mj_err *err);
/* Tokens in the cache. */
int64_t cpu_model_len(const cpu_model *s);
/* For diagnosis: if set, the next cpu_forward writes each layer's output
 * (the residual stream) to dump[layer][token][hidden]. */
void cpu_model_set_dump(cpu_model *s, float *dump);
/* For diagnosis, the discrete choices of every later call, for its first
 * max_tokens tokens: sel (may be NULL) [layer][token][max_ctx] receives,
 * for each layer that runs its own indexer, each token's DSA mask (1 = may
 * attend, positions 0..pos; all of them while at most index_topk are
 * visible); ids (may be NULL)
 * [layer][token][topk] the routed experts of each MoE layer. */
void cpu_model_set_choice_dump(cpu_model *s, uint8_t *sel, int64_t *ids, int max_tokens);
/* For diagnosis, the scores behind those choices, for the first max_tokens
 * tokens of every later call: choice (may be NULL) [layer][token][experts]
 * receives each MoE layer's router choice values (sigmoid of the logits
 * plus the correction bias, before any group limit); score (may be NULL)
 * [layer][token][max_ctx] each indexer layer's scores of the visible keys,
 * for tokens that see more than index_topk keys (others are left alone).
 * A test can then tell a near tie (choices whose scores lie close to the
 * boundary) from a wrong choice. */
void cpu_model_set_score_dump(cpu_model *s, float *choice, float *score, int max_tokens);
/* For fidelity tests: the next cpu_forward takes these discrete choices
 * for its first max_tokens tokens instead of its own (which the choice dump
 * still records), so that two engines whose near-tie choices differ can be
 * compared on one history.  sel (may be NULL) [layer][max_tokens][index_topk]
 * holds the cache positions each layer that runs its own indexer attends to
 * (used when more than index_topk are visible; entries outside 0..pos are
 * ignored); ids (may be NULL) [layer][max_tokens][topk] the routed experts
 * of each MoE layer, weighted from this model's own router logits.  The
 * layouts are gpu_read_sel's and gpu_read_routing's. */
void cpu_model_force_choices(cpu_model *s, const int32_t *sel, const int32_t *ids, int max_tokens);

#endif
