/* chat.h: the GLM-5 chat prompt, built as token ids.
 *
 * GLM-5 is prompted as [gMASK]<sop>, then one special role token per turn
 * followed by its text (<|system|>..., <|user|>..., <|assistant|>...,
 * <|observation|>...), then the generation prompt <|assistant|><think>
 * (thinking on) or <|assistant|></think> (thinking off); no newlines are
 * inserted anywhere (docs/glm5.md).  The role tokens are looked up by
 * their content among the tokenizer's added tokens, so a tokenizer.json
 * that lacks them is refused with the name of the missing token, and the
 * text of each turn is encoded separately (special-token strings inside a
 * turn still become special tokens, as when the reference renders the
 * template to text and tokenizes it).  Prefix: chat_.
 */
#ifndef MOEJIT_CHAT_H
#define MOEJIT_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "util.h"

typedef enum { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_OBSERVATION } chat_role;

typedef struct chat_msg {
  chat_role role;
  const char *text;
  size_t len;
} chat_msg;

/* The special token ids of the format, and the ids that end generation. */
typedef struct chat_format {
  int32_t gmask, sop, role[4], think, end_think;
  int32_t eos[3]; /* <|endoftext|>, <|user|>, <|observation|> */
  int neos;
} chat_format;

/* Look up the special tokens in t; MJ_EINPUT naming a missing one. */
int chat_format_init(chat_format *f, const tok_tokenizer *t, mj_err *err);

/* Append the prompt for msgs to out; with generation_prompt, end with
 * <|assistant|> and <think> (thinking) or </think>.  An assistant turn of
 * the history is written <|assistant|></think>TEXT: its reasoning is not
 * kept. */
int chat_encode(tok_tokenizer *t, const chat_format *f, const chat_msg *msgs, size_t n,
                bool generation_prompt, bool thinking, tok_ids *out, mj_err *err);

/* True when id ends generation. */
bool chat_is_eos(const chat_format *f, int32_t id);

#endif
