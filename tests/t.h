/* t.h: the unit-test harness.  A test file defines test functions, lists
 * them in main with T_RUN, and exits with t_status(): 0 when every check
 * passed, 1 otherwise, 77 when the whole program was skipped (no GPU).
 * A failed check prints file:line, the expression and, for the typed
 * checks, both values, then the test goes on (so one run shows every
 * failure). */
#ifndef MOEJIT_T_H
#define MOEJIT_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int t_failures, t_checks; /* atomic: checks may run on several threads (test_api's workers) */
static const char *t_current = "";

#define T_CHECK(e)                                                                 \
  do {                                                                             \
    t_checks++;                                                                    \
    if (!(e)) {                                                                    \
      t_failures++;                                                                \
      fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__, t_current, #e); \
    }                                                                              \
  } while (0)

#define T_EQ_INT(a, b)                                                             \
  do {                                                                             \
    long long t_a = (long long)(a), t_b = (long long)(b);                          \
    t_checks++;                                                                    \
    if (t_a != t_b) {                                                              \
      t_failures++;                                                                \
      fprintf(stderr, "%s:%d: %s: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, \
              t_current, #a, #b, t_a, t_b);                                        \
    }                                                                              \
  } while (0)

#define T_EQ_STR(a, b)                                                             \
  do {                                                                             \
    const char *t_a = (a), *t_b = (b);                                             \
    t_checks++;                                                                    \
    if (!t_a || !t_b || strcmp(t_a, t_b) != 0) {                                   \
      t_failures++;                                                                \
      fprintf(stderr, "%s:%d: %s: %s == %s failed:\n  got:  %s\n  want: %s\n", __FILE__, \
              __LINE__, t_current, #a, #b, t_a ? t_a : "(null)", t_b ? t_b : "(null)"); \
    }                                                                              \
  } while (0)

#define T_NEAR(a, b, tol)                                                          \
  do {                                                                             \
    double t_a = (a), t_b = (b);                                                   \
    t_checks++;                                                                    \
    if (!(fabs(t_a - t_b) <= (tol))) {                                             \
      t_failures++;                                                                \
      fprintf(stderr, "%s:%d: %s: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__, \
              __LINE__, t_current, #a, #b, (double)(tol), t_a, t_b);               \
    }                                                                              \
  } while (0)

/* T_ONLY=name,name runs only the cases named (a long GPU test, in parts). */
#define T_RUN(fn)                                                                  \
  do {                                                                             \
    const char *t_only = getenv("T_ONLY");                                         \
    if (t_only && *t_only && !strstr(t_only, #fn)) break;                          \
    t_current = #fn;                                                               \
    int t_before = t_failures;                                                     \
    fn();                                                                          \
    printf("%s %s\n", t_failures == t_before ? "ok  " : "FAIL", #fn);              \
  } while (0)

static inline int t_status(void) {
  printf("%d checks, %d failed\n", t_checks, t_failures);
  return t_failures ? 1 : 0;
}

#endif
