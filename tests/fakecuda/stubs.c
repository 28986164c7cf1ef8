/* stubs.c: a fake CUDA driver for tests/launch.sh, built as
 * tests/fakecuda/libcuda.so.1 and loaded through MOEJIT_LIBCUDA.
 *
 * It lets the launcher's path run on a machine without a GPU: cuInit
 * succeeds, cuDeviceGetCount reports FAKE_GPUS devices (devices.c), and
 * every other entry point cudrv resolves exists and fails.  The stubs are
 * generated from cudrv.h's own CU_FUNCS table, under the exact symbols
 * cudrv looks up (cuMemAlloc -> cuMemAlloc_v2), so the fake follows the
 * table as it grows.  They are weak, so devices.c's real definitions win. */
#include "cudrv.h"

#define SYM_(f) #f
#define SYM(f) SYM_(f)
#define X(f)                                                                  \
  __attribute__((weak)) int fake_##f(void) __asm__(SYM(f));                  \
  __attribute__((weak)) int fake_##f(void) { return CUDA_ERROR_NOT_SUPPORTED; }
CU_FUNCS(X)
#undef X
