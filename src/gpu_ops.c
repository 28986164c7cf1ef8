/* gpu_ops.c: what the op launchers share (gpu_ops.h): gop_get, jit_get
 * for the context's target with the "compile only" answer
 * that lets a dry step warm the cache on a machine without a GPU; the
 * widths of a config (gop_dims_of); the device fills of benchmarks
 * (gop_fill).  The launchers themselves live beside their kernels'
 * families: gop_dense.c, gop_mla.c, gop_attn.c. */
#include "gpu_ops.h"

#include <string.h>

int gop_get(const gop_ctx *cx, kt_id k, const char *entry, const dsl_define *defs, int ndefs, const jit_spec *generic,
            const jit_fn **f, bool *launch, mj_err *err) {
  jit_request req = {kt_template(k), {entry, defs, ndefs}, generic, cx->arch};
  int rc = jit_get(&req, f, err);
  if (rc) return rc;
  if (cx->dry) kt_note(k, *f); /* warm-up's count per family; nothing on a real step's launch path */
  *launch = (*f)->fn != NULL && !cx->dry;
  return 0;
}

gop_dims gop_dims_of(const model_config *c, int max_ctx) {
  return (gop_dims){.hidden = (int)c->hidden_size, .vocab = (int)c->vocab_size, .heads = (int)c->num_attention_heads,
                    .nope = (int)c->qk_nope_head_dim, .rope = (int)c->qk_rope_head_dim, .v = (int)c->v_head_dim,
                    .kv_rank = (int)c->kv_lora_rank, .q_rank = (int)c->q_lora_rank, .idx_heads = (int)c->index_n_heads,
                    .idx_dim = (int)c->index_head_dim, .idx_topk = (int)c->index_topk, .max_ctx = max_ctx,
                    .rms_eps = (float)c->rms_norm_eps, .ikey_bf16 = model_ikey_bf16()};
}

int gop_fill(CUdeviceptr p, size_t n, bool f32, uint64_t seed, float lo, float hi, const gop_ctx *cx, mj_err *err) {
  const jit_fn *f;
  bool launch;
  int rc = gop_get(cx, KT_fill, f32 ? "fill_f32" : "fill_bf16", NULL, 0, NULL, &f, &launch, err);
  if (rc || !launch || !n) return rc;
  unsigned long long nn = n, sd = seed;
  void *args[] = {&p, &nn, &sd, &lo, &hi};
  size_t blocks = (n + 255) / 256;
  return cu_launch_tpl(f->fn, (unsigned)(blocks < 8192 ? blocks : 8192), 1, 1, 256, 0, cx->s, args, err);
}
