/* replay.h: replaying a shape trace (trace.h) on the MoE kernels.
 *
 * `moejit replay FILE.jsonl` answers two questions about real traffic:
 * which kernels would it need, and are they compiled yet (--dry-run, no
 * GPU needed), and how fast does each capacity bucket run on the routing
 * the trace recorded (the default, on a GPU).  The pieces that need no GPU
 * are here so the unit tests reach them: grouping a trace's MoE records by
 * bucket, and building on the host the routing tables moe_route.k would
 * have written for a recorded set of per-expert row counts.  The command
 * itself (cmd_replay) is in replay_cmd.c with the GPU part.  Prefix: replay_.
 */
#ifndef MOEJIT_REPLAY_H
#define MOEJIT_REPLAY_H

#include "moe.h"
#include "trace.h"

/* ---- buckets ------------------------------------------------------------------------ */
typedef struct replay_bucket {
  int bucket;          /* capacity bucket (moe_plan_default's bcap) */
  int64_t records;     /* MoE layer records in this bucket */
  int64_t steps;       /* steps with at least one such record */
  int64_t eager;       /* records of steps that ran eagerly (captured == 0) */
  double experts_sum;  /* distinct routed experts summed over the records */
  int max_rows;        /* the most rows (tokens) of a step in this bucket */
} replay_bucket;

/* The distinct buckets of t, ascending, with their counts.  Returns how
 * many (*out malloc'd; 0 and NULL for a trace without MoE records). */
int replay_buckets(const trace_file *t, replay_bucket **out);

/* ---- routing tables on the host ----------------------------------------------------- */
/* The tables moe_route.k writes (docs/moe.md), for plan p, made from one
 * trace record: every recorded expert with its row count, rows given to
 * tokens so that each token has distinct experts (when no expert has more
 * rows than there are tokens) and at most topk of them, expert slots in id
 * order after the shared one, each slot's rows in token order, pairs
 * numbered slot by slot.  Routing weights are random and sum to
 * cfg.scaling per token.  A token with fewer than topk routed pairs points
 * its spare tok_pair entries at zero_pair, a pair no slot writes, whose y
 * row the caller must zero. */
typedef struct replay_tables {
  int B;          /* tokens */
  int R;          /* routed pairs */
  int nexp;       /* active routed experts (slots 1..nexp) */
  int zero_pair;  /* -1: every token has topk pairs */
  bool clamped;   /* the record had more rows than the bucket holds; some were dropped */
  int32_t *slot_expert, *slot_count, *slot_off; /* [moe_slots(p)] */
  int32_t *pair_token;                          /* [moe_pairs(p)] */
  float *pair_weight;                           /* [moe_pairs(p)] */
  int32_t *tok_pair;                            /* [bcap][topk + 1] */
  int32_t *tok_n;                               /* [bcap]: routed pairs of each token */
  int32_t *tok_expert;                          /* [bcap][topk], rank order; -1 past tok_n */
  float *tok_weight;                            /* [bcap][topk] */
} replay_tables;

/* Fill t (allocated here; replay_tables_free) from record m of a step of
 * `rows` tokens.  rng is a 64-bit LCG state, advanced.  MJ_EINPUT when the
 * record does not fit the plan (an expert id out of range). */
int replay_tables_build(const moe_plan *p, const trace_moe *m, int rows, uint64_t *rng, replay_tables *t,
                        mj_err *err);
void replay_tables_free(replay_tables *t);

/* The 64-bit LCG the replay draws its random numbers from (advances *s). */
uint32_t replay_rnd(uint64_t *s);


#endif
