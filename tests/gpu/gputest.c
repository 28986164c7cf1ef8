/* gputest.c: the one program that runs every GPU test.  Each test lives in
 * its own tests/gpu/test_NAME.c as gpu_test_NAME(); `make check` runs
 * `gputest tests/gpu/NAME.gpu` for each marker file (automake's .gpu log
 * compiler), so the GPU tests are listed and reported one by one while only
 * one binary (with LLVM linked in) has to travel to the GPU host.
 * A test may take words after its name (`gputest perf gemv mla_vout`); its
 * check of them (and of its environment) runs before the GPU is opened, so
 * a mistyped word is an error on any machine.
 * Exits 77 (skip) when no GPU is found, 2 for an unknown test or a bad word. */
#include <stdio.h>
#include <string.h>

#include "cudrv.h"

/* X(name, check): check(argc, argv) takes the words after the name and
 * returns 0 or 2 (having said why); NULL for a test that takes none. */
#define GPU_TESTS(X)                                                                                                  \
  X(gemv, NULL) X(rmsnorm, NULL) X(moe, NULL) X(dense, NULL) X(mla, NULL) X(attn, NULL) X(decode, NULL)             \
  X(replay, NULL) X(nccl, NULL) X(shard, NULL) X(perf, gpu_perf_args) X(tune, NULL)

int gpu_perf_args(int argc, char **argv);
#define X(name, check) int gpu_test_##name(int argc, char **argv);
GPU_TESTS(X)
#undef X

typedef struct gpu_test {
  const char *name;
  int (*run)(int argc, char **argv);
  int (*check)(int argc, char **argv);
} gpu_test;

static const gpu_test tests[] = {
#define X(name, check) {#name, gpu_test_##name, check},
    GPU_TESTS(X)
#undef X
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gputest NAME|tests/gpu/NAME.gpu [WORD...]\n");
    return 2;
  }
  const char *base = strrchr(argv[1], '/');
  base = base ? base + 1 : argv[1];
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
  const gpu_test *t = NULL;
  for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
    if (strcmp(name, tests[i].name) == 0) t = &tests[i];
  if (!t) {
    fprintf(stderr, "gputest: unknown test '%s'\n", name);
    return 2;
  }
  if (t->check ? t->check(argc - 2, argv + 2) != 0 : argc > 2) {
    if (!t->check) fprintf(stderr, "gputest: test '%s' takes no words after its name\n", name);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash keeps what was printed */
  mj_err err = {0};
  if (cu_init(&err)) {
    printf("skip: %s\n", err.msg);
    return 77;
  }
  printf("device: %s (%s, %d SMs)\n", cu_dev()->name, cu_dev()->arch, cu_dev()->sm_count);
  return t->run(argc - 2, argv + 2);
}
