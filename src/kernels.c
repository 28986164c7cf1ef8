/* kernels.c: the kernel table's rows (kernels.h) and the per-family
 * counts of kernels obtained (warm-up's summary). */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const kt_kernel kt_kernels[KT_N] = {
#define X(id, t, l, c, r, tol) {#id, t, l, c, r, tol},
    KT_KERNELS(X)
#undef X
};

int kt_find(const char *name) {
  for (int i = 0; i < KT_N; i++)
    if (strcmp(kt_kernels[i].name, name) == 0) return i;
  return -1;
}

/* The kernels seen, per family (a few hundred at most in a warm-up). */
static struct {
  const void **fn;
  size_t n, cap;
} seen[KT_N];
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

void kt_note(kt_id k, const void *fn) {
  if ((int)k < 0 || k >= KT_N || !fn) return;
  pthread_mutex_lock(&seen_lock);
  size_t i = 0;
  while (i < seen[k].n && seen[k].fn[i] != fn) i++;
  if (i == seen[k].n) {
    if (seen[k].n == seen[k].cap) {
      seen[k].cap = seen[k].cap ? 2 * seen[k].cap : 16;
      seen[k].fn = mj_xrealloc(seen[k].fn, seen[k].cap * sizeof *seen[k].fn);
    }
    seen[k].fn[seen[k].n++] = fn;
  }
  pthread_mutex_unlock(&seen_lock);
}

void kt_counts(uint64_t out[KT_N]) {
  pthread_mutex_lock(&seen_lock);
  for (int i = 0; i < KT_N; i++) out[i] = seen[i].n;
  pthread_mutex_unlock(&seen_lock);
}

void kt_counts_reset(void) {
  pthread_mutex_lock(&seen_lock);
  for (int i = 0; i < KT_N; i++) free(seen[i].fn), seen[i].fn = NULL, seen[i].n = seen[i].cap = 0;
  pthread_mutex_unlock(&seen_lock);
}
