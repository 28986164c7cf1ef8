/* openai.c: reading OpenAI request bodies and writing OpenAI response
 * bodies (openai.h).
 *
 * Each field is looked up once and checked for its type and range; the
 * first wrong one is the error, named in `param`, as OpenAI's own servers
 * report.  Strings the request keeps are copied into its arena and the JSON
 * tree is freed at once, so what a queued request holds is bounded by its
 * body, not by how many values its JSON has.  A log probability below
 * -9999 (or not a number) is written as -9999, OpenAI's "very unlikely",
 * so every body is valid JSON.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "openai.h"

int oai_fail(oai_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
  e->status = status, e->type = type, e->param = param, e->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return status;
}

#define BAD(e, param, ...) oai_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* A number field in [lo, hi] (open at an end when lo_open / hi_open). */
static int get_num(const json *o, const char *key, double lo, bool lo_open, double hi, bool hi_open, double *out,
                   oai_error *e) {
  const json *v = json_get(o, key);
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_NUM) return BAD(e, key, "'%s' must be a number, not %s", key, json_type_name(v->type));
  if (v->num < lo || (lo_open && v->num == lo) || v->num > hi || (hi_open && v->num == hi))
    return BAD(e, key, "'%s' must be in %c%g, %g%c, not %g", key, lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']',
               v->num);
  *out = v->num;
  return 0;
}

/* An integer field; *present says whether it was given (not null). */
static int get_int(const json *o, const char *key, int64_t *out, bool *present, oai_error *e) {
  const json *v = json_get(o, key);
  if (present) *present = false;
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_NUM || !v->is_int)
    return BAD(e, key, "'%s' must be an integer, not %s", key, v->type == JSON_NUM ? "a fraction" : json_type_name(v->type));
  *out = v->i;
  if (present) *present = true;
  return 0;
}

static int get_bool(const json *o, const char *key, bool *out, oai_error *e) {
  const json *v = json_get(o, key);
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_BOOL) return BAD(e, key, "'%s' must be a boolean, not %s", key, json_type_name(v->type));
  *out = v->b;
  return 0;
}

/* The boolean field key of the object field obj ("stream_options":
 * {"include_usage": true}); either may be absent or null. */
static int get_sub_bool(const json *o, const char *obj, const char *key, bool *out, oai_error *e) {
  const json *v = json_get(o, obj);
  if (!v || v->type == JSON_NULL) return 0;
  if (v->type != JSON_OBJ) return BAD(e, obj, "'%s' must be an object, not %s", obj, json_type_name(v->type));
  const json *b = json_get(v, key);
  if (!b || b->type == JSON_NULL) return 0;
  if (b->type != JSON_BOOL) return BAD(e, obj, "'%s.%s' must be a boolean, not %s", obj, key, json_type_name(b->type));
  *out = b->b;
  return 0;
}

static int add_stop(oai_request *r, const json *s, oai_error *e) {
  if (s->type != JSON_STR) return BAD(e, "stop", "'stop' must be a string or an array of strings, not %s", json_type_name(s->type));
  if (s->len == 0) return BAD(e, "stop", "'stop' strings must not be empty");
  if (r->n_stop == OAI_MAX_STOP) return BAD(e, "stop", "'stop' holds at most %d strings", OAI_MAX_STOP);
  /* With its length: a "\u0000" in it is a character of the stop string,
   * as in a message's content. */
  r->stop_len[r->n_stop] = s->len;
  r->stop[r->n_stop++] = mj_arena_strndup(&r->mem, s->str, s->len);
  return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...}
 * parts, joined. */
static int get_content(oai_request *r, const json *c, size_t i, oai_message *m, oai_error *e) {
  if (c && c->type == JSON_STR) {
    m->content = mj_arena_strndup(&r->mem, c->str, c->len), m->len = c->len;
    return 0;
  }
  if (!c || c->type != JSON_ARR)
    return BAD(e, "messages", "messages[%zu].content must be a string or an array of text parts, not %s", i,
               c ? json_type_name(c->type) : "absent");
  mj_buf b = {0};
  for (size_t k = 0; k < c->len; k++) {
    const json *p = c->items[k], *t = json_get(p, "type"), *x = json_get(p, "text");
    if (!t || t->type != JSON_STR || strcmp(t->str, "text") || !x || x->type != JSON_STR) {
      mj_buf_free(&b);
      return BAD(e, "messages", "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": STRING} (moejit reads text only)",
                 i, k);
    }
    mj_buf_put(&b, x->str, x->len);
  }
  m->content = mj_arena_strndup(&r->mem, b.data ? b.data : "", b.len), m->len = b.len;
  mj_buf_free(&b);
  return 0;
}

static int get_messages(oai_request *r, const json *o, oai_error *e) {
  const json *ms = json_get(o, "messages");
  if (!ms) return BAD(e, "messages", "'messages' is required");
  if (ms->type != JSON_ARR) return BAD(e, "messages", "'messages' must be an array, not %s", json_type_name(ms->type));
  if (ms->len == 0) return BAD(e, "messages", "'messages' must not be empty");
  r->messages = mj_arena_alloc(&r->mem, ms->len * sizeof *r->messages);
  for (size_t i = 0; i < ms->len; i++) {
    const json *m = ms->items[i], *role = json_get(m, "role");
    if (m->type != JSON_OBJ) return BAD(e, "messages", "messages[%zu] must be an object, not %s", i, json_type_name(m->type));
    if (!role || role->type != JSON_STR) return BAD(e, "messages", "messages[%zu].role must be a string", i);
    oai_message *out = &r->messages[i];
    if (!strcmp(role->str, "system") || !strcmp(role->str, "developer")) out->role = OAI_SYSTEM;
    else if (!strcmp(role->str, "user")) out->role = OAI_USER;
    else if (!strcmp(role->str, "assistant")) out->role = OAI_ASSISTANT;
    else
      return BAD(e, "messages", "messages[%zu].role must be system, developer, user or assistant, not '%s'", i,
                 role->str);
    const json *c = json_get(m, "content");
    if (out->role == OAI_ASSISTANT && (!c || c->type == JSON_NULL)) {
      out->content = "", out->len = 0;
    } else if (get_content(r, c, i, out, e)) {
      return e->status;
    }
  }
  r->n_messages = ms->len;
  return 0;
}

/* Completions: logprobs, an integer 0..5.  Chat: logprobs, a boolean, and
 * top_logprobs 0..20, which needs logprobs true. */
static int get_logprobs(oai_request *r, const json *o, oai_error *e) {
  bool given = false;
  int64_t n = 0;
  if (r->kind == OAI_COMPLETION) {
    if (get_int(o, "logprobs", &n, &given, e)) return e->status;
    if (given && (n < 0 || n > OAI_MAX_LOGPROBS_COMPLETION))
      return BAD(e, "logprobs", "'logprobs' must be in [0, %d], not %lld", OAI_MAX_LOGPROBS_COMPLETION, (long long)n);
    r->logprobs = given, r->top_logprobs = n;
    return 0;
  }
  if (get_bool(o, "logprobs", &r->logprobs, e) || get_int(o, "top_logprobs", &n, &given, e)) return e->status;
  if (given && (n < 0 || n > OAI_MAX_TOP_LOGPROBS))
    return BAD(e, "top_logprobs", "'top_logprobs' must be in [0, %d], not %lld", OAI_MAX_TOP_LOGPROBS, (long long)n);
  if (given && !r->logprobs) return BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r->top_logprobs = n;
  return 0;
}

/* The array v of token ids (integers 0 to INT32_MAX) of field key, named
 * what in errors ("'prompt'", or "'prompt' 2" for a batch's third). */
static int get_ids(oai_request *r, const json *v, const char *key, const char *what, const int32_t **out, size_t *n,
                   oai_error *e) {
  int32_t *ids = mj_arena_alloc(&r->mem, (v->len ? v->len : 1) * sizeof *ids);
  for (size_t i = 0; i < v->len; i++) {
    const json *t = v->items[i];
    if (t->type != JSON_NUM || !t->is_int || t->i < 0 || t->i > INT32_MAX)
      return BAD(e, key, "%s token %zu must be a token id (an integer, 0 or more), not %s", what, i,
                 t->type == JSON_NUM ? "that number" : json_type_name(t->type));
    ids[i] = (int32_t)t->i;
  }
  *out = ids, *n = v->len;
  return 0;
}

/* One prompt: a string or token ids (at: its place in a batch, or -1). */
static int get_one_prompt(oai_request *r, const json *v, long at, oai_prompt *p, oai_error *e) {
  if (v->type == JSON_STR) {
    p->text = mj_arena_strndup(&r->mem, v->str, v->len), p->len = v->len;
    return 0;
  }
  char what[32] = "'prompt'";
  if (at >= 0) snprintf(what, sizeof what, "'prompt' %ld", at);
  if (v->type != JSON_ARR)
    return BAD(e, "prompt", "%s must be a string or an array of token ids, not %s", what, json_type_name(v->type));
  if (v->len == 0) return BAD(e, "prompt", "%s is an empty array of token ids", what);
  return get_ids(r, v, "prompt", what, &p->ids, &p->n_ids, e);
}

/* Completions' prompt: a string, or token ids (an array of integers), or a
 * batch of either ([STRING, ...] or [[IDS], ...], or the two mixed), each
 * drawn n times (the caller checks the product).  An empty prompt of ids
 * is refused here, an empty string by the server. */
static int get_prompt(oai_request *r, const json *v, oai_error *e) {
  if (!v) return BAD(e, "prompt", "'prompt' is required");
  bool batch = v->type == JSON_ARR && v->len >= 1 && (v->items[0]->type == JSON_STR || v->items[0]->type == JSON_ARR);
  if (batch && v->len > OAI_MAX_CHOICES)
    return BAD(e, "prompt", "'prompt' is a batch of %zu prompts; at most %d a request", v->len, OAI_MAX_CHOICES);
  r->n_prompts = batch ? v->len : 1;
  r->prompts = mj_arena_alloc(&r->mem, r->n_prompts * sizeof *r->prompts);
  memset(r->prompts, 0, r->n_prompts * sizeof *r->prompts);
  for (size_t i = 0; i < r->n_prompts; i++)
    if (get_one_prompt(r, batch ? v->items[i] : v, batch && v->len > 1 ? (long)i : -1, &r->prompts[i], e))
      return e->status;
  r->prompt = r->prompts[0].text, r->prompt_len = r->prompts[0].len;
  r->prompt_ids = r->prompts[0].ids, r->n_prompt_ids = r->prompts[0].n_ids;
  return 0;
}

/* Fields whose meaning moejit does not give are refused, not ignored: an
 * answer that silently leaves them out would look right and be wrong.
 * Their neutral values (an empty logit_bias, best_of 1, an empty suffix,
 * no tools, a text response_format) pass. */
static int refuse_unsupported(const oai_request *r, const json *o, oai_error *e) {
  const json *v = json_get(o, "logit_bias");
  if (v && v->type != JSON_NULL && !(v->type == JSON_OBJ && v->len == 0))
    return BAD(e, "logit_bias", "'logit_bias' is not supported by moejit");
  v = json_get(o, "best_of");
  if (v && v->type != JSON_NULL && !(v->type == JSON_NUM && v->is_int && v->i == 1))
    return BAD(e, "best_of", "'best_of' must be 1 (moejit draws one sequence a request)");
  v = json_get(o, "suffix");
  if (v && v->type != JSON_NULL && !(v->type == JSON_STR && v->len == 0))
    return BAD(e, "suffix", "'suffix' (insertion) is not supported by moejit");
  const char *fn[] = {"tools", "functions"}; /* functions: the older name */
  for (int i = 0; i < 2; i++) {
    v = json_get(o, fn[i]);
    if (v && v->type != JSON_NULL && !(v->type == JSON_ARR && v->len == 0))
      return BAD(e, fn[i], "'%s' (function calling) is not supported by moejit", fn[i]);
  }
  v = json_get(o, "echo");
  if (r->kind == OAI_CHAT && v && v->type != JSON_NULL && !(v->type == JSON_BOOL && !v->b))
    return BAD(e, "echo", "'echo' is taken by /v1/completions only");
  v = json_get(o, "response_format");
  const json *t = v && v->type == JSON_OBJ ? json_get(v, "type") : NULL;
  if (v && v->type != JSON_NULL && !(t && t->type == JSON_STR && !strcmp(t->str, "text")))
    return BAD(e, "response_format", "'response_format' other than {\"type\": \"text\"} (JSON mode, schemas) is not supported by moejit");
  if (r->echo && r->logprobs)
    return BAD(e, "echo", "'echo' with 'logprobs' is not supported (moejit has no log probabilities of the prompt)");
  return 0;
}

/* /tokenize: a prompt (a string, add_special_tokens) or chat messages
 * (add_generation_prompt, chat_template_kwargs.enable_thinking);
 * /detokenize: tokens, an array of ids. */
static int parse_token_fields(oai_request *r, const json *o, oai_error *e) {
  const json *v;
  if (r->kind == OAI_DETOKENIZE) {
    v = json_get(o, "tokens");
    if (!v) return BAD(e, "tokens", "'tokens' is required");
    if (v->type != JSON_ARR) return BAD(e, "tokens", "'tokens' must be an array of token ids, not %s", json_type_name(v->type));
    return get_ids(r, v, "tokens", "'tokens'", &r->prompt_ids, &r->n_prompt_ids, e);
  }
  r->add_special = r->add_generation_prompt = true;
  if (json_get(o, "messages")) {
    if (get_messages(r, o, e) || get_bool(o, "add_generation_prompt", &r->add_generation_prompt, e)) return e->status;
    return get_sub_bool(o, "chat_template_kwargs", "enable_thinking", &r->thinking, e);
  }
  v = json_get(o, "prompt");
  if (!v) return BAD(e, "prompt", "'prompt' (a string) or 'messages' is required");
  if (v->type != JSON_STR) return BAD(e, "prompt", "'prompt' must be a string, not %s", json_type_name(v->type));
  r->prompt = mj_arena_strndup(&r->mem, v->str, v->len), r->prompt_len = v->len;
  return get_bool(o, "add_special_tokens", &r->add_special, e);
}

static int parse_fields(oai_request *r, const json *o, oai_error *e) {
  if (o->type != JSON_OBJ) return BAD(e, NULL, "the body must be a JSON object, not %s", json_type_name(o->type));
  const json *v = json_get(o, "model");
  if (v && v->type != JSON_NULL) {
    if (v->type != JSON_STR) return BAD(e, "model", "'model' must be a string, not %s", json_type_name(v->type));
    r->model = mj_arena_strndup(&r->mem, v->str, v->len);
  }
  if (r->kind == OAI_TOKENIZE || r->kind == OAI_DETOKENIZE) return parse_token_fields(r, o, e);
  if (r->kind == OAI_COMPLETION) {
    if (get_prompt(r, json_get(o, "prompt"), e) || get_bool(o, "echo", &r->echo, e)) return e->status;
  } else if (get_messages(r, o, e)) {
    return e->status;
  }
  if (get_num(o, "temperature", 0, false, 2, false, &r->temperature, e) ||
      get_num(o, "top_p", 0, true, 1, false, &r->top_p, e) || get_num(o, "min_p", 0, false, 1, true, &r->min_p, e))
    return e->status;
  if (get_int(o, "top_k", &r->top_k, NULL, e)) return e->status;
  if (r->top_k == -1) r->top_k = 0;
  if (r->top_k < 0) return BAD(e, "top_k", "'top_k' must be 0 or -1 (off) or more, not %lld", (long long)r->top_k);
  /* Chat's newer name for the same limit wins when both are given. */
  bool given;
  if (get_int(o, "max_tokens", &r->max_tokens, &given, e)) return e->status;
  if (given && r->max_tokens < 1)
    return BAD(e, "max_tokens", "'max_tokens' must be 1 or more, not %lld", (long long)r->max_tokens);
  if (r->kind == OAI_CHAT) {
    int64_t mct = -1;
    if (get_int(o, "max_completion_tokens", &mct, &given, e)) return e->status;
    if (given && mct < 1)
      return BAD(e, "max_completion_tokens", "'max_completion_tokens' must be 1 or more, not %lld", (long long)mct);
    if (given) r->max_tokens = mct;
  }
  int64_t seed = 0;
  r->n = 1;
  if (get_int(o, "n", &r->n, NULL, e)) return e->status;
  size_t np = r->kind == OAI_COMPLETION ? r->n_prompts : 1;
  if ((r->n < 1 || r->n > OAI_MAX_CHOICES / (int64_t)np) && np > 1)
    return BAD(e, "n", "'n' must be 1 to %lld for this batch of prompts (at most %d choices a request), not %lld",
               (long long)(OAI_MAX_CHOICES / np), OAI_MAX_CHOICES, (long long)r->n);
  if (r->n < 1 || r->n > OAI_MAX_CHOICES) return BAD(e, "n", "'n' must be 1 to %d, not %lld", OAI_MAX_CHOICES, (long long)r->n);
  if (get_int(o, "seed", &seed, &r->has_seed, e)) return e->status;
  r->seed = seed;
  if (get_bool(o, "stream", &r->stream, e) || get_bool(o, "ignore_eos", &r->ignore_eos, e)) return e->status;
  v = json_get(o, "stop");
  if (v && v->type == JSON_ARR) {
    for (size_t i = 0; i < v->len; i++)
      if (add_stop(r, v->items[i], e)) return e->status;
  } else if (v && v->type != JSON_NULL && add_stop(r, v, e)) {
    return e->status;
  }
  if (get_num(o, "presence_penalty", -2, false, 2, false, &r->presence_penalty, e) ||
      get_num(o, "frequency_penalty", -2, false, 2, false, &r->frequency_penalty, e) ||
      get_num(o, "repetition_penalty", 0, true, INFINITY, true, &r->repetition_penalty, e))
    return e->status;
  if (get_logprobs(r, o, e) || refuse_unsupported(r, o, e)) return e->status;
  if (r->kind == OAI_CHAT && get_sub_bool(o, "chat_template_kwargs", "enable_thinking", &r->thinking, e)) return e->status;
  return get_sub_bool(o, "stream_options", "include_usage", &r->include_usage, e);
}

int oai_parse(oai_kind kind, const char *body, size_t len, oai_request *out, oai_error *e) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  out->temperature = 1, out->top_p = 1, out->min_p = 0, out->top_k = 0, out->max_tokens = -1;
  out->repetition_penalty = 1;
  mj_arena_init(&out->mem, len + 4096 > 65536 ? 65536 : len + 4096);
  mj_arena tree;
  mj_arena_init(&tree, 65536);
  mj_err jerr = {0};
  json *root = NULL;
  int r = 0;
  if (json_parse(&tree, body, len, "body", &root, &jerr)) {
    r = oai_fail(e, 400, "invalid_request_error", NULL, "invalid_json", "the body is not valid JSON: %s", jerr.msg);
    mj_err_clear(&jerr);
  } else {
    r = parse_fields(out, root, e);
  }
  mj_arena_free(&tree);
  if (r) oai_request_free(out);
  return r;
}

void oai_request_free(oai_request *r) { mj_arena_free(&r->mem); }

/* ---- writers ------------------------------------------------------------------------- */
static void put_str(mj_buf *b, const char *s) {
  if (s) json_write_str(b, s, strlen(s));
  else mj_buf_puts(b, "null");
}

void oai_write_error(mj_buf *b, const oai_error *e) {
  mj_buf_puts(b, "{\"error\":{\"message\":");
  put_str(b, e->message);
  mj_buf_puts(b, ",\"type\":");
  put_str(b, e->type);
  mj_buf_puts(b, ",\"param\":");
  put_str(b, e->param);
  mj_buf_puts(b, ",\"code\":");
  put_str(b, e->code);
  mj_buf_puts(b, "}}");
}

static void head(mj_buf *b, const char *object, const oai_result *r) {
  mj_buf_puts(b, "{\"id\":");
  put_str(b, r->id);
  mj_buf_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object, (long long)r->created);
  put_str(b, r->model);
}

static void usage(mj_buf *b, const oai_result *r) {
  mj_buf_printf(b, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld}",
                (long long)r->prompt_tokens, (long long)r->completion_tokens,
                (long long)(r->prompt_tokens + r->completion_tokens));
}

/* A log probability as a JSON number: float's digits, -9999 at the least. */
static void put_lp(mj_buf *b, float lp) { mj_buf_printf(b, "%.9g", lp >= -9999.0f ? (double)lp : -9999.0); }

/* Chat's {"token", "logprob", "bytes"} (and its top list when top). */
static void chat_token(mj_buf *b, const oai_token *t, const oai_logprob *top) {
  mj_buf_puts(b, "{\"token\":");
  json_write_str(b, t->text, t->len);
  mj_buf_puts(b, ",\"logprob\":");
  put_lp(b, t->logprob);
  mj_buf_puts(b, ",\"bytes\":[");
  for (size_t i = 0; i < t->len; i++) mj_buf_printf(b, "%s%u", i ? "," : "", (unsigned char)t->text[i]);
  mj_buf_puts(b, "]");
  if (top) {
    mj_buf_puts(b, ",\"top_logprobs\":[");
    for (int i = 0; i < top->n_top; i++) {
      if (i) mj_buf_putc(b, ',');
      chat_token(b, &top->top[i], NULL);
    }
    mj_buf_puts(b, "]");
  }
  mj_buf_puts(b, "}");
}

static bool same_text(const oai_token *a, const oai_token *b) { return a->len == b->len && !memcmp(a->text, b->text, a->len); }

/* Completions' top_logprobs entry: {token: logprob} of the most likely, the
 * drawn token added when it is not among them (OpenAI's "up to logprobs +
 * 1"); a text already written (two ids that decode alike) keeps its first,
 * likelier, value, so the object has no key twice. */
static void completion_top(mj_buf *b, const oai_logprob *l) {
  mj_buf_putc(b, '{');
  int n = 0;
  for (int i = 0; i <= l->n_top; i++) {
    const oai_token *t = i < l->n_top ? &l->top[i] : &l->tok;
    bool dup = false;
    for (int k = 0; k < i && !dup; k++) dup = same_text(&l->top[k], t);
    if (dup) continue;
    if (n++) mj_buf_putc(b, ',');
    json_write_str(b, t->text, t->len);
    mj_buf_putc(b, ':');
    put_lp(b, t->logprob);
  }
  mj_buf_putc(b, '}');
}

/* A choice's logprobs in the route's shape, or null. */
static void write_logprobs(mj_buf *b, oai_kind kind, const oai_result *r) {
  if (!r->with_logprobs) {
    mj_buf_puts(b, "null");
    return;
  }
  if (kind == OAI_CHAT) {
    mj_buf_puts(b, "{\"content\":[");
    for (size_t i = 0; i < r->n_logprobs; i++) {
      if (i) mj_buf_putc(b, ',');
      chat_token(b, &r->logprobs[i].tok, &r->logprobs[i]);
    }
    mj_buf_puts(b, "],\"refusal\":null}");
    return;
  }
  mj_buf_puts(b, "{\"tokens\":[");
  for (size_t i = 0; i < r->n_logprobs; i++) {
    if (i) mj_buf_putc(b, ',');
    json_write_str(b, r->logprobs[i].tok.text, r->logprobs[i].tok.len);
  }
  mj_buf_puts(b, "],\"token_logprobs\":[");
  for (size_t i = 0; i < r->n_logprobs; i++) {
    if (i) mj_buf_putc(b, ',');
    put_lp(b, r->logprobs[i].tok.logprob);
  }
  mj_buf_puts(b, "],\"top_logprobs\":[");
  for (size_t i = 0; i < r->n_logprobs; i++) {
    if (i) mj_buf_putc(b, ',');
    completion_top(b, &r->logprobs[i]);
  }
  mj_buf_puts(b, "],\"text_offset\":[");
  for (size_t i = 0; i < r->n_logprobs; i++) mj_buf_printf(b, "%s%lld", i ? "," : "", (long long)r->logprobs[i].text_offset);
  mj_buf_puts(b, "]}");
}

/* One choice of a response or a chunk.  Its text is completions' "text";
 * a chat's "message" (a response) or "delta" (a chunk), with the role when
 * with_role (a response always, a stream's first chunk of the choice). */
static void write_choice(mj_buf *b, oai_kind kind, const oai_result *r, const char *chat_field, bool with_role) {
  mj_buf_printf(b, "{\"index\":%d,", r->index);
  if (kind == OAI_CHAT) mj_buf_printf(b, "\"%s\":{%s\"content\":", chat_field, with_role ? "\"role\":\"assistant\"," : "");
  else mj_buf_puts(b, "\"text\":");
  json_write_str(b, r->text ? r->text : "", r->text_len);
  if (kind == OAI_CHAT) mj_buf_puts(b, "}");
  mj_buf_puts(b, ",\"logprobs\":");
  write_logprobs(b, kind, r);
  mj_buf_puts(b, ",\"finish_reason\":");
  put_str(b, r->finish_reason);
  mj_buf_puts(b, "}");
}

void oai_write_response(mj_buf *b, oai_kind kind, const oai_result *r, size_t nr, int64_t prompt_tokens,
                        int64_t completion_tokens) {
  head(b, kind == OAI_CHAT ? "chat.completion" : "text_completion", r);
  mj_buf_puts(b, ",\"choices\":[");
  for (size_t i = 0; i < nr; i++) {
    if (i) mj_buf_putc(b, ',');
    write_choice(b, kind, &r[i], "message", true);
  }
  mj_buf_puts(b, "],");
  oai_result u = {.prompt_tokens = prompt_tokens, .completion_tokens = completion_tokens};
  usage(b, &u);
  mj_buf_puts(b, "}");
}

void oai_write_chunk(mj_buf *b, oai_kind kind, const oai_result *r, bool role_first) {
  head(b, kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", r);
  mj_buf_puts(b, ",\"choices\":[");
  write_choice(b, kind, r, "delta", role_first);
  mj_buf_puts(b, "]}");
}

void oai_write_usage_chunk(mj_buf *b, oai_kind kind, const oai_result *r) {
  head(b, kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", r);
  mj_buf_puts(b, ",\"choices\":[],");
  usage(b, r);
  mj_buf_puts(b, "}");
}

void oai_write_tokens(mj_buf *b, const int32_t *ids, size_t n, int64_t max_model_len) {
  mj_buf_printf(b, "{\"count\":%zu,\"max_model_len\":%lld,\"tokens\":[", n, (long long)max_model_len);
  for (size_t i = 0; i < n; i++) mj_buf_printf(b, i ? ",%d" : "%d", (int)ids[i]);
  mj_buf_puts(b, "]}");
}

void oai_write_detokenized(mj_buf *b, const char *text, size_t len) {
  mj_buf_puts(b, "{\"prompt\":");
  json_write_str(b, text, len);
  mj_buf_putc(b, '}');
}

void oai_write_model(mj_buf *b, const char *model, int64_t created) {
  mj_buf_puts(b, "{\"id\":");
  put_str(b, model);
  mj_buf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"moejit\"}", (long long)created);
}

void oai_write_models(mj_buf *b, const char *model, int64_t created) {
  mj_buf_puts(b, "{\"object\":\"list\",\"data\":[");
  oai_write_model(b, model, created);
  mj_buf_puts(b, "]}");
}
