/* gpu_ops.c: what the op launchers share (gpu_ops.h): the target they
 * obtain kernels for, and gop_get, jit_get with the "compile only" answer
 * that lets a dry step warm the cache on a machine without a GPU.  The
 * launchers themselves live beside their kernels' families: gop_dense.c,
 * gop_mla.c, gop_attn.c. */
#include "gpu_ops.h"

#include <string.h>

static const char *gop_arch; /* NULL: the GPU's */
static bool gop_dry;

void gop_set_arch(const char *arch) { gop_arch = arch; }
const char *gop_get_arch(void) { return gop_arch; }
void gop_set_dry(bool dry) { gop_dry = dry; }
bool gop_is_dry(void) { return gop_dry; }

int gop_get(const char *kernel, const char *entry, const dsl_define *defs, int ndefs, const jit_spec *generic,
            const jit_fn **f, bool *launch, mj_err *err) {
  jit_request req = {kernel, {entry, defs, ndefs}, generic, gop_arch};
  int rc = jit_get(&req, f, err);
  if (rc) return rc;
  *launch = (*f)->fn != NULL && !gop_dry;
  return 0;
}
