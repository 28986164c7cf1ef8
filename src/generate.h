/* generate.h: `moejit generate`'s one loop (src/generate_loop.c) and what
 * cmd_generate (src/generate.c) hands it: the options it parsed, the
 * prompts it encoded and the session it opened.  Command layer: linked
 * into the program only.
 */
#ifndef MOEJIT_GENERATE_H
#define MOEJIT_GENERATE_H

#include "chat.h"
#include "sample.h"
#include "session.h"
#include "tokenizer.h"

typedef struct gen_opts {
  int64_t n_predict;
  bool stream;        /* one prompt (-p): print its text as it forms, then the speed line */
  bool as_json, quiet;
  sample_params sp;   /* seed: of prompt 0; prompt k uses seed + k */
  const char *model_dir; /* for the single prompt's JSON record */
  const model_config *cfg;
  tok_tokenizer *tok;
  const chat_format *cf; /* its end-of-turn ids end a sequence too */
  bool have_chat;
} gen_opts;

/* One prompt's sequence. */
typedef struct gen_seq {
  tok_ids ids;        /* the prompt, then what was generated */
  size_t n_prompt;
  int64_t n_gen;
  int slot;           /* -1: waiting or done */
  bool done;
  const char *stop;   /* "eos" or "length" */
  tok_stream ts;
  mj_buf text;
  double t_admit, t_first, t_end; /* ms: admitted, its prompt run, ended */
} gen_seq;

/* Decode every prompt of s[0..np) on the session (as many at once as it
 * has slots, continuously batched), then print the results. */
int gen_run(const gen_opts *o, session *S, gen_seq *s, int np, mj_err *err);

#endif
