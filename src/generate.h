/* generate.h: `moejit generate`'s one loop (src/generate_loop.c) and what
 * cmd_generate (src/generate.c) hands it: the options it parsed, the
 * prompts it encoded and the engine it opened through the C API
 * (include/moejit.h; src/api.h for what only the program needs).  Command
 * layer: linked into the program only.
 */
#ifndef MOEJIT_GENERATE_H
#define MOEJIT_GENERATE_H

#include "api.h"
#include "tokenizer.h"

typedef struct gen_opts {
  int64_t n_predict;
  bool stream;        /* one prompt (-p): print its text as it forms, then the speed line */
  bool as_json, quiet;
  bool ignore_eos;     /* end-of-sequence ids do not end a sequence (-n tokens each: benchmarks) */
  moejit_sampling sp; /* seed: of prompt 0; prompt k uses seed + k */
  const char *model_dir; /* for the single prompt's JSON record */
} gen_opts;

/* One prompt's request. */
typedef struct gen_seq {
  int32_t *prompt;    /* moejit_tokenize's (moejit_free) */
  size_t n_prompt;
  tok_ids gen;        /* what was generated */
  const char *stop;   /* "eos" or "length" */
  bool failed;
  mj_buf text;
  double prompt_ms, decode_ms; /* its prompt's run; first token to the end */
} gen_seq;

/* Submit every prompt of s[0..np) to the engine A (paused: api_resume lets
 * it run them, as many at once as it has slots, continuously batched),
 * wait for them all and print the results.  A request the engine failed
 * prints nothing: api_close returns that error. */
int gen_run(const gen_opts *o, moejit *A, gen_seq *s, int np, mj_err *err);

#endif
