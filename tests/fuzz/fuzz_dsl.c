/* fuzz_dsl.c: libFuzzer target for the DSL compiler: the input is a kernel
 * source, compiled through lex, parse, check, lowering, LLVM and NVPTX.
 * Any crash, sanitizer report or MJ_ASSERT is a finding; an error return is
 * the expected answer to garbage.  Seeds: tests/fuzz/dsl/ (valid kernels,
 * so mutations explore the checker and the lowering, not just the lexer). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 8192) return 0;
  /* Through LLVM to PTX at -O1 when the source checks; no nvJitLink (ptxas
   * is not under test, and it is slow). */
  dsl_options o = {.arch = "sm_90a", .opt_level = 1, .no_cubin = true};
  dsl_result r;
  mj_err err = {0};
  if (dsl_compile("fuzz.k", (const char *)data, size, NULL, 0, &o, &r, &err) == 0) dsl_result_free(&r);
  mj_err_clear(&err);
  return 0;
}
