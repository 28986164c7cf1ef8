/* kernels.h: the kernel table, one row per kernel family of the decode
 * step (issue 17).
 *
 * A row names the family's template (under templates/, built in), its
 * language (DSL or NVRTC, by docs/dsl.md's rule; the template's extension
 * must agree), the constants it is specialised on, its CPU reference
 * (ref.h) and the relative L2 error its GPU test allows against that
 * reference (0: the results must be equal, as ids and selections are).
 * Where a tolerance was set near an error achieved on the H200, the
 * comment gives that figure (bench/results/2026-12-03-batch-perf.md: the
 * GEMV at every B of 1..64 and GLM-5's shapes, the attention over every
 * shape of gputest attn, replays included); mla_attend's row is its
 * default, tensor-core kernel's, and gputest attn holds the CUDA-core
 * kernel to 2e-6 (achieved 5.3e-7).
 * The launchers take their template from here (gop_*.c, moe.c), the GPU op
 * tests their tolerance, and `moejit warmup` counts the kernels it obtained
 * per family; tests/test_gop_dense.c holds the table to the built-in
 * templates and to docs/dsl.md's table.  Prefix: kt_.
 */
#ifndef MOEJIT_KERNELS_H
#define MOEJIT_KERNELS_H

#include <stdint.h>

/* X(id, template, language, constants, CPU reference, tolerance) */
#define KT_KERNELS(X) \
  X(embed, "embed.k", "dsl", "H BLOCK", "ref_embed", 0.0) \
  X(add_rmsnorm, "add_rmsnorm.k", "dsl", "H BLOCK YMODE", "ref_add_rmsnorm", 1e-2) \
  X(silu_mul, "silu_mul.k", "dsl", "I BLOCK", "ref_silu_mul", 1e-2) \
  X(gemv, "gemv_bf16_b.k", "dsl", "N K B THREADS ROWS UNROLL", "ref_gemv_b", 1e-6) /* achieved 2.5e-7 */ \
  X(gemv_mma, "gemv_bf16_mma.k", "dsl", "N K B THREADS MT KJ KSPLIT MINB", "ref_gemv_b", 1e-5) /* 2.3e-6 */ \
  X(sample, "sample.cu", "nvrtc", "sample_rows<BLOCK>", "ref_sample", 0.0) \
  X(mla_prep, "mla.cu", "nvrtc", "mla_prep<QR, R, ROPE, IDX_DIM, KB>", "ref_mla_prep", 1e-2) \
  X(mla_q, "mla.cu", "nvrtc", "mla_q<NOPE, ROPE, V, R, TB>", "ref_mla_q", 1e-2) \
  X(mla_vout, "mla_vout.k", "dsl", "NOPE V R TB", "ref_mla_vout", 1e-2) \
  X(mla_attend, "attend.cu", "nvrtc", "mla_attend_part<KV, ROPE, HG, BLOCK>, mla_attend_part_tc<KV, ROPE, HT>, mla_attend_combine<KV, BLOCK>", "ref_mla_attend", 4e-3) /* tc 1.56e-3 */ \
  X(dsa_select, "dsa.cu", "nvrtc", "dsa_score<IDIM, IH, BLOCK, KB>, dsa_topk<BLOCK>", "ref_dsa_select", 0.0) \
  X(moe_router, "moe_router.k", "dsl", "E K TB", "ref_moe_logits", 1e-5) \
  X(moe_route, "moe_route.k", "dsl", "E TOPK BCAP NG TG NORM SCALE E0 EL", "ref_moe_route", 0.0) \
  X(moe_expert, "moe_expert.k", "dsl", "MODE K N MT ROWS THREADS CHAIN PREFETCH MINB MMA KJ", "ref_moe_experts", 1e-2) \
  X(moe_combine, "moe_combine.k", "dsl", "N TOPK PARTIAL", "ref_moe_experts", 1e-2) \
  X(fill, "fill.cu", "nvrtc", "fill_bf16, fill_f32, spin (none)", "-", 0.0)

typedef enum kt_id {
#define X(id, t, l, c, r, tol) KT_##id,
  KT_KERNELS(X)
#undef X
  KT_N
} kt_id;

typedef struct kt_kernel {
  const char *name, *tmpl, *lang, *consts, *ref;
  double tol;
} kt_kernel;

extern const kt_kernel kt_kernels[KT_N];

/* The row's template (what a launcher asks jit_get for). */
static inline const char *kt_template(kt_id k) { return kt_kernels[k].tmpl; }
/* The row named name ("gemv"), or -1. */
int kt_find(const char *name);

/* Distinct kernels obtained per family since the last kt_counts_reset
 * (warm-up's summary): a launcher notes each kernel a dry step obtains,
 * and the MoE layer each kernel of a new bucket (fn: the jit_fn, which the
 * front door keeps unique per kernel); a real step's launches note nothing. */
void kt_note(kt_id k, const void *fn);
void kt_counts(uint64_t out[KT_N]);
void kt_counts_reset(void);

#endif
