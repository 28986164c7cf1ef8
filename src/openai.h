/* openai.h: the OpenAI HTTP API's request and response bodies, as `moejit
 * serve` speaks them (docs/serve.md).
 *
 * The server's routes (src/server.c) read a request body with oai_parse and
 * write every body they send with the oai_write_* functions, so the JSON of
 * the protocol lives in one file that a unit test drives without a socket.
 * Requests are read with the project's strict JSON reader (json.h: invalid
 * UTF-8, lone surrogates and malformed text are refused there) and checked
 * field by field as OpenAI's servers do: a field of the wrong type or out of
 * range is an error naming it (`param`), a field moejit does not know is
 * ignored.  Log probabilities are written in each route's own shape:
 * completions' legacy one (tokens, token_logprobs, top_logprobs as
 * {token: logprob}, text_offset) and chat's (content: [{token, logprob,
 * bytes, top_logprobs}]).  The parse tree lives in an arena freed before
 * oai_parse returns; the request keeps only its strings, in its own arena,
 * so a request holds at most about its body's size however its JSON is
 * shaped.  Responses are written with json_write_str's escaping.
 * Prefix: oai_.
 */
#ifndef MOEJIT_OPENAI_H
#define MOEJIT_OPENAI_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"

/* The routes with a body: completions, chat, and vLLM's /tokenize and
 * /detokenize. */
typedef enum oai_kind { OAI_COMPLETION, OAI_CHAT, OAI_TOKENIZE, OAI_DETOKENIZE } oai_kind;

/* The most stop strings a request may give (OpenAI's limit). */
#define OAI_MAX_STOP 4

typedef enum oai_role { OAI_SYSTEM, OAI_USER, OAI_ASSISTANT } oai_role;

typedef struct oai_message {
  oai_role role;
  const char *content;
  size_t len;
} oai_message;

/* The most choices a completion request may ask for: prompts x n. */
#define OAI_MAX_CHOICES 64

/* One prompt of a completion request: a text, or token ids (n_ids > 0). */
typedef struct oai_prompt {
  const char *text;
  size_t len;
  const int32_t *ids;
  size_t n_ids;
} oai_prompt;

/* A parsed request.  Absent fields hold the defaults oai_parse states. */
typedef struct oai_request {
  oai_kind kind;
  const char *model;       /* NULL when absent */
  const char *prompt;      /* OAI_COMPLETION: a text, or */
  size_t prompt_len;
  const int32_t *prompt_ids; /* token ids (an array of integers), n_prompt_ids > 0 of them;
                                detokenize: its tokens (n_prompt_ids may be 0) */
  size_t n_prompt_ids;
  oai_prompt *prompts;     /* OAI_COMPLETION: the batch (a prompt alone is a batch of one), n_prompts >= 1;
                              the first is also prompt / prompt_ids above */
  size_t n_prompts;
  int64_t n;               /* choices a prompt, >= 1 (default 1); n_prompts x n <= OAI_MAX_CHOICES */
  bool echo;               /* completions: the prompt's text before the completion's */
  bool add_special;        /* tokenize a prompt: add_special_tokens (default true) */
  bool add_generation_prompt; /* tokenize messages: end with the assistant's turn (default true) */
  oai_message *messages;   /* OAI_CHAT */
  size_t n_messages;
  double temperature;      /* default 1 (OpenAI's); 0 is greedy */
  double top_p;            /* default 1 */
  double min_p;            /* default 0 */
  int64_t top_k;           /* default 0: off (-1 is read as off too, vLLM's way) */
  int64_t max_tokens;      /* >= 1; -1 when absent (the server picks) */
  const char *stop[OAI_MAX_STOP]; /* stop_len[i] bytes each (a "\u0000" is a NUL byte of it), NUL-terminated */
  size_t stop_len[OAI_MAX_STOP];  /* as moejit_request.stop_lens takes them */
  int n_stop;
  bool has_seed;
  int64_t seed;            /* any int64, as OpenAI takes */
  bool stream;
  bool include_usage;      /* stream_options.include_usage */
  bool ignore_eos;         /* vLLM's field: end-of-sequence ids do not end the request (benchmarks) */
  bool thinking;           /* chat: chat_template_kwargs.enable_thinking (vLLM's field; default false) */
  double presence_penalty; /* [-2, 2], default 0 */
  double frequency_penalty; /* [-2, 2], default 0 */
  double repetition_penalty; /* vLLM's: > 0, default 1 (off); over the prompt and the output, as moejit's
                                repeat penalty with every token in its window */
  bool logprobs;           /* completions: logprobs given (an integer); chat: logprobs true */
  int64_t top_logprobs;    /* completions: logprobs' value (0..5); chat: top_logprobs (0..20; default 0) */
  mj_arena mem;            /* the strings above */
} oai_request;

/* An error as OpenAI's servers send it: the HTTP status and the body's
 * {"error": {"message", "type", "param", "code"}}. */
typedef struct oai_error {
  int status;
  const char *type;  /* "invalid_request_error", "authentication_error", ... */
  const char *param; /* the field, or NULL */
  const char *code;  /* a short code, or NULL */
  char message[512];
} oai_error;

/* Fill e and return e->status. */
int oai_fail(oai_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Parse a request body of route kind.  0 on success (free with
 * oai_request_free), else e->status (400) with e filled. */
int oai_parse(oai_kind kind, const char *body, size_t len, oai_request *out, oai_error *e);
void oai_request_free(oai_request *r);

/* ---- writers: each appends one JSON value to b ------------------------------ */
void oai_write_error(mj_buf *b, const oai_error *e);

/* The most alternatives of each route (OpenAI's limits). */
#define OAI_MAX_LOGPROBS_COMPLETION 5
#define OAI_MAX_TOP_LOGPROBS 20

/* A token's text (valid UTF-8, as its single id decodes) and its log
 * probability. */
typedef struct oai_token {
  const char *text;
  size_t len;
  float logprob;
} oai_token;

/* One generated token's log probabilities. */
typedef struct oai_logprob {
  oai_token tok;         /* the token drawn */
  const oai_token *top;  /* the most likely at its position, most likely first */
  int n_top;
  int64_t text_offset;   /* completions: where tok starts in the text, in characters */
} oai_logprob;

/* What a finished (or streaming) request reports. */
typedef struct oai_result {
  int index;             /* the choice's: prompt x n + draw */
  const char *id;        /* "cmpl-..." / "chatcmpl-..." */
  int64_t created;       /* Unix seconds */
  const char *model;
  const char *text;
  size_t text_len;
  const char *finish_reason; /* "stop", "length", or NULL (a chunk mid-stream) */
  int64_t prompt_tokens, completion_tokens; /* the choice's (a usage chunk's: the request's) */
  /* The request asked for log probabilities: the choice's logprobs hold
   * these n_logprobs tokens' (a response's: every token's; a chunk's: its
   * token's, and null when it has none); else it is null. */
  bool with_logprobs;
  const oai_logprob *logprobs;
  size_t n_logprobs;
} oai_result;

/* The whole response of a request with stream false: its nr choices, in
 * index order (the head from r[0]), and usage: the prompts' tokens (each
 * prompt once) and every choice's completion tokens. */
void oai_write_response(mj_buf *b, oai_kind kind, const oai_result *r, size_t nr, int64_t prompt_tokens,
                        int64_t completion_tokens);
/* One streamed chunk of choice r->index: text (r->text, maybe empty) and,
 * on the choice's last one, finish_reason; chat chunks carry the choice's
 * delta (with the role on its first chunk, role_first); completion chunks
 * its text. */
void oai_write_chunk(mj_buf *b, oai_kind kind, const oai_result *r, bool role_first);
/* The usage chunk of stream_options.include_usage: empty choices, usage. */
void oai_write_usage_chunk(mj_buf *b, oai_kind kind, const oai_result *r);
/* GET /v1/models: the one model, in a list; GET /v1/models/ID: it alone. */
void oai_write_models(mj_buf *b, const char *model, int64_t created);
void oai_write_model(mj_buf *b, const char *model, int64_t created);
/* POST /tokenize's answer, vLLM's shape: {"count", "max_model_len", "tokens"}. */
void oai_write_tokens(mj_buf *b, const int32_t *ids, size_t n, int64_t max_model_len);
/* POST /detokenize's answer: {"prompt": TEXT}. */
void oai_write_detokenized(mj_buf *b, const char *text, size_t len);

#endif
