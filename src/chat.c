/* chat.c: the GLM-5 chat prompt (see chat.h).  Built from ids rather than
 * by rendering text and tokenizing it, which gives the same ids (added
 * tokens are split off before anything else) without a template engine. */
#include "chat.h"

static const char *const role_names[4] = {"<|system|>", "<|user|>", "<|assistant|>",
                                          "<|observation|>"};

static int need(const tok_tokenizer *t, const char *content, int32_t *id, mj_err *err) {
  *id = tok_added(t, content);
  if (*id < 0)
    return mj_fail(err, MJ_EINPUT, "%s: no added token '%s' (the GLM-5 chat format needs it)",
                   tok_name(t), content);
  return 0;
}

int chat_format_init(chat_format *f, const tok_tokenizer *t, mj_err *err) {
  *f = (chat_format){0};
  int r = need(t, "[gMASK]", &f->gmask, err);
  if (!r) r = need(t, "<sop>", &f->sop, err);
  for (int i = 0; i < 4 && !r; i++) r = need(t, role_names[i], &f->role[i], err);
  if (!r) r = need(t, "<think>", &f->think, err);
  if (!r) r = need(t, "</think>", &f->end_think, err);
  if (r) return r;
  f->eos[f->neos++] = f->role[CHAT_USER];
  f->eos[f->neos++] = f->role[CHAT_OBSERVATION];
  int32_t eot = tok_added(t, "<|endoftext|>");
  if (eot >= 0) f->eos[f->neos++] = eot;
  return 0;
}

int chat_encode(tok_tokenizer *t, const chat_format *f, const chat_msg *msgs, size_t n,
                bool generation_prompt, bool thinking, tok_ids *out, mj_err *err) {
  tok_ids_push(out, f->gmask);
  tok_ids_push(out, f->sop);
  for (size_t i = 0; i < n; i++) {
    if ((unsigned)msgs[i].role > CHAT_OBSERVATION)
      return mj_fail(err, MJ_EINPUT, "chat message %zu has an unknown role", i);
    tok_ids_push(out, f->role[msgs[i].role]);
    if (msgs[i].role == CHAT_ASSISTANT) tok_ids_push(out, f->end_think);
    int r = tok_encode(t, msgs[i].text, msgs[i].len, false, out, err);
    if (r) return r;
  }
  if (generation_prompt) {
    tok_ids_push(out, f->role[CHAT_ASSISTANT]);
    tok_ids_push(out, thinking ? f->think : f->end_think);
  }
  return 0;
}

bool chat_is_eos(const chat_format *f, int32_t id) {
  for (int i = 0; i < f->neos; i++)
    if (f->eos[i] == id) return true;
  return false;
}
