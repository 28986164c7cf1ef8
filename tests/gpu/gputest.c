/* gputest.c: the one program that runs every GPU test.  Each test lives in
 * its own tests/gpu/test_NAME.c as gpu_test_NAME(); `make check` runs
 * `gputest tests/gpu/NAME.gpu` for each marker file (automake's .gpu log
 * compiler), so the GPU tests are listed and reported one by one while only
 * one binary (with LLVM linked in) has to travel to the GPU host.
 * Exits 77 (skip) when no GPU is found, 2 for an unknown test. */
#include <stdio.h>
#include <string.h>

#include "cudrv.h"

#define GPU_TESTS(X) X(gemv) X(rmsnorm) X(moe) X(dense) X(mla) X(attn) X(decode) X(replay) X(nccl) X(shard)

#define X(name) int gpu_test_##name(void);
GPU_TESTS(X)
#undef X

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gputest NAME|tests/gpu/NAME.gpu\n");
    return 2;
  }
  const char *base = strrchr(argv[1], '/');
  base = base ? base + 1 : argv[1];
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash keeps what was printed */
  mj_err err = {0};
  if (cu_init(&err)) {
    printf("skip: %s\n", err.msg);
    return 77;
  }
  printf("device: %s (%s, %d SMs)\n", cu_dev()->name, cu_dev()->arch, cu_dev()->sm_count);
#define X(n) \
  if (strcmp(name, #n) == 0) return gpu_test_##n();
  GPU_TESTS(X)
#undef X
  fprintf(stderr, "gputest: unknown test '%s'\n", name);
  return 2;
}
