/* gpu_ops.c: what the op launchers share (gpu_ops.h): gop_get, jit_get
 * for the context's target with the "compile only" answer
 * that lets a dry step warm the cache on a machine without a GPU.  The
 * launchers themselves live beside their kernels' families: gop_dense.c,
 * gop_mla.c, gop_attn.c. */
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
