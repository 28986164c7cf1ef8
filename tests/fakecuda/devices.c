/* devices.c: the entry points of the fake driver that do something (see
 * stubs.c): cuInit succeeds, cuDeviceGetCount says FAKE_GPUS (default 1),
 * and cuDeviceGet says on stderr which ordinal the process opened (the
 * launcher's test checks that rank k opens device k) and then fails, so a
 * rank stops with a CUDA error (exit 5) before it needs a real GPU.  With
 * FAKE_FIRST=k, rank k fails after 1 s and the other ranks after 5 s, so
 * every rank has said which device it opened before the first failure,
 * and which rank fails first is known. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

CUresult cuInit(unsigned flags) {
  (void)flags;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  const char *s = getenv("FAKE_GPUS");
  *n = s ? atoi(s) : 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  const char *r = getenv("MOEJIT_RANK");
  fprintf(stderr, "fake driver: rank %s opens device %d\n", r ? r : "-", ordinal);
  const char *first = getenv("FAKE_FIRST");
  if (r && first) sleep(strcmp(r, first) == 0 ? 1 : 5);
  *d = ordinal;
  return CUDA_ERROR_NOT_SUPPORTED;
}
