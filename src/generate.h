/* generate.h: `moejit generate --prompts FILE` (src/generate_many.c), the
 * many-prompts path of cmd_generate (src/generate.c): the options it
 * parsed, and the model and tokenizer it loaded.  Command layer: linked
 * into the program only.
 */
#ifndef MOEJIT_GENERATE_H
#define MOEJIT_GENERATE_H

#include "chat.h"
#include "gpu_model.h"
#include "sample.h"
#include "tokenizer.h"

typedef struct gen_many_opts {
  const char *prompts_path; /* one prompt per line; "-": stdin */
  int parallel;             /* sequences live at once */
  int64_t n_predict, ctx;
  bool chat, no_think, as_json, quiet;
  const char *system;
  sample_params sp;         /* seed: of prompt 0; prompt k uses seed + k */
  bool gpu;                 /* else the CPU */
  gpu_opts go;
  int threads;
} gen_many_opts;
int generate_many(const gen_many_opts *o, const model *m, tok_tokenizer *tok, const chat_format *cf, bool have_chat,
                  mj_err *err);

#endif
