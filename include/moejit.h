/* moejit.h: the public C API of moejit, for programs that embed the engine
 * (the HTTP server, tools, tests).
 *
 * One handle, `moejit`, is one loaded model (weights and tokenizer) and one
 * engine thread that owns the decode session and batches every live
 * request continuously: waiting requests are admitted into free slots (up
 * to max_parallel), each prompt runs, then one decode step runs a row of
 * every live sequence; a sequence that ends frees its slot at once for the
 * next waiting request.  Requests are submitted from any thread and come
 * back as events, one per generated token, either through a callback
 * called on the engine thread or through a per-request queue the caller
 * drains (moejit_poll).  docs/api.md says it at length, with an example.
 *
 * Conventions.  Every call returns a moejit_status (MOEJIT_OK is 0); a
 * failed call also leaves a one-line message for the calling thread
 * (moejit_last_error).  Strings are UTF-8 and NUL-terminated unless a
 * length goes with them.  Memory the library returns (token arrays, text)
 * is freed with moejit_free.  Option and parameter structs are filled with
 * their _init function first, then changed field by field, so a program
 * keeps compiling when fields are added (MOEJIT_API_VERSION counts changes
 * of this header).  The header needs only the C standard's stddef.h,
 * stdint.h and stdbool.h.  Prefix: moejit_ / MOEJIT_ (the library's
 * internal modules use other prefixes).
 */
#ifndef MOEJIT_H
#define MOEJIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever this header changes incompatibly or grows.
 * 2: moejit_message.content_len.  3: moejit_stats' engine time between
 * decode steps (decode_gap_ms_sum, decode_gaps, events_ms_sum).
 * 4: moejit_request.stop_lens.  5: log probabilities (moejit_request.logprobs
 * and top_logprobs, moejit_event.has_logprob, logprob, top_logprobs and
 * n_top_logprobs, moejit_logprob), moejit_sampling.presence_penalty and
 * frequency_penalty.  6: moejit_request.hold_events.
 * 7: moejit_open_opts.prefill_chunk (prompts fed in parts beside the
 * decode rows).  Fields are only ever added at the end of a struct;
 * a struct that holds another by value (moejit_open_opts' default_sampling)
 * sees its later fields move when that one grows: rebuild against the
 * header (the library is static). */
#define MOEJIT_API_VERSION 7

/* The header's MOEJIT_API_VERSION the library was built with (a program
 * may check that it equals its own), and the package version ("0.1.0"). */
int moejit_api_version(void);
const char *moejit_version(void);

/* ---- errors -----------------------------------------------------------------------
 * X(name, description): one table, the enum and moejit_status_name /
 * moejit_strerror generated from it. */
#define MOEJIT_STATUSES(X)                                                                   \
  X(MOEJIT_OK, "success")                                                                    \
  X(MOEJIT_EINVAL, "bad argument")                                                           \
  X(MOEJIT_EMODEL, "bad model: a file of the model folder is missing, malformed or unsupported") \
  X(MOEJIT_ENOMEM, "out of memory")                                                          \
  X(MOEJIT_EQUEUE_FULL, "the wait queue is full")                                            \
  X(MOEJIT_ECANCELLED, "the request was cancelled")                                          \
  X(MOEJIT_ENOBACKEND, "the backend asked for is not available (no GPU, or the model does not fit its kernels)") \
  X(MOEJIT_EBACKEND, "the backend failed while running (CUDA driver, kernel compile or kernel cache)") \
  X(MOEJIT_ENOTFOUND, "no such request (never submitted, or finished and released)")        \
  X(MOEJIT_ETIMEDOUT, "nothing arrived before the timeout")                                  \
  X(MOEJIT_ECLOSED, "the engine is closing: no new requests")                                \
  X(MOEJIT_EINTERNAL, "internal error (a bug in moejit)")

typedef enum moejit_status {
#define MOEJIT_X_(name, desc) name,
  MOEJIT_STATUSES(MOEJIT_X_)
#undef MOEJIT_X_
  MOEJIT_NSTATUS
} moejit_status;

/* "MOEJIT_EINVAL"; "MOEJIT_?" for a value outside the table. */
const char *moejit_status_name(moejit_status s);
/* The table's description ("bad argument"). */
const char *moejit_strerror(moejit_status s);
/* The message of the last call made on this thread that failed: one line
 * naming the argument or file and what is wrong ("" when none failed).
 * Valid until the next failing call on this thread. */
const char *moejit_last_error(void);

/* Frees what the library returned (token arrays, text); NULL is fine. */
void moejit_free(void *p);

/* ---- opening a model --------------------------------------------------------------- */
typedef struct moejit moejit; /* a model and its engine thread */

typedef enum moejit_backend {
  MOEJIT_BACKEND_AUTO, /* the GPU when there is one and the model fits its kernels, else the CPU */
  MOEJIT_BACKEND_CPU,  /* the CPU reference forward */
  MOEJIT_BACKEND_CUDA, /* the GPU engine; MOEJIT_ENOBACKEND without a usable GPU */
} moejit_backend;

/* Sampling of one request (the order of Hugging Face transformers:
 * repetition penalty, then OpenAI's frequency and presence penalties as
 * vLLM applies them, temperature, top-k, top-p, min-p, then a draw). */
typedef struct moejit_sampling {
  float temperature;      /* >= 0; 0: greedy (the seed does not matter) */
  int32_t top_k;          /* >= 0; 0: off */
  float top_p;            /* in (0, 1]; 1: off */
  float min_p;            /* in [0, 1); 0: off */
  float repeat_penalty;   /* > 0; 1: off */
  int32_t repeat_last_n;  /* the penalty sees this many recent tokens (prompt included); <= 0: all */
  int64_t seed;           /* >= 0: reproducible; < 0: a seed from the clock */
  /* OpenAI's penalties, each in [-2, 2], 0: off.  With count[t] the times
   * token t was generated so far by this request (its output only, not the
   * prompt): logit[t] -= frequency_penalty * count[t], then
   * logit[t] -= presence_penalty where count[t] > 0. */
  float presence_penalty;
  float frequency_penalty;
} moejit_sampling;

/* temperature 1, top_k 0, top_p 1, min_p 0, repeat_penalty 1, repeat_last_n 64, seed -1,
 * presence_penalty 0, frequency_penalty 0 */
void moejit_sampling_init(moejit_sampling *s);

typedef struct moejit_open_opts {
  moejit_backend backend;   /* default MOEJIT_BACKEND_AUTO */
  int32_t context_length;   /* tokens a sequence may hold, prompt and generated; 0 (default): the
                               model's own limit, at most 4096 */
  int32_t max_parallel;     /* sequences decoded at once (cache slots); 0 (default): 4 */
  int32_t max_queue;        /* requests waiting for a slot; moejit_submit past it is MOEJIT_EQUEUE_FULL;
                               0 (default): 256 */
  const int32_t *graph_batch_sizes; /* GPU: batch sizes captured as CUDA graphs, ascending, 1..1024,
                                       at most 16 (copied at open); NULL (default): 1,2,4,..,64 */
  int32_t n_graph_batch_sizes;
  bool no_graphs;           /* GPU: launch every step eagerly */
  int32_t threads;          /* CPU: matmul threads; 0 (default): every core */
  /* The sampling of requests submitted without their own (moejit_request.sampling
   * left NULL).  On the GPU, a request whose temperature, top_k, top_p and min_p
   * equal these, that has no penalty (repeat, presence, frequency) and that
   * asks for no log probabilities is drawn on the device (faster; the draw is
   * keyed by the request's seed and the token's position, not by its slot,
   * but it is not the host sampler's draw for that seed); any other request
   * is drawn on the host with its own seed (its step copies its logits).
   * Default: moejit_sampling_init's, with seed 0. */
  moejit_sampling default_sampling;
  bool quiet;               /* nothing on stderr (backend choice, progress bars, first-use notes) */
  /* The folder of compiled kernels (sets MOEJIT_CACHE_DIR for the whole
   * process, before the first kernel is compiled: the kernel cache is one
   * per process); NULL (default): MOEJIT_CACHE_DIR, else ~/.cache/moejit. */
  const char *kernel_cache_dir;
  /* (version 7) Prompt tokens one engine step takes beside the rows of the
   * sequences already decoding (chunked prefill: a long prompt is fed in
   * parts over several steps, so the others keep drawing tokens meanwhile;
   * a sequence draws its first token with the part that ends its prompt,
   * the same token as with the prompt run whole on the CPU; on the GPU the
   * parts run at other batch sizes, whose kernels may round differently).
   * 0 (default): on the GPU the rows the step has left below the rows of
   * an engine step (the largest graph batch size, at least 64), at least
   * half of them; on the CPU 32, or a whole prompt while no sequence
   * decodes.  At most 65536.  < 0: each prompt
   * whole, as a step of its own, before the next decode step (what a
   * sharded engine always does). */
  int32_t prefill_chunk;
} moejit_open_opts;

void moejit_open_opts_init(moejit_open_opts *o);

/* Load the model folder model_dir (config.json, tokenizer.json and the
 * safetensors of a GLM-5-format checkpoint) or, with NULL, the built-in
 * synthetic model `moejit generate` uses without -m (written into the data
 * folder on first use: MOEJIT_DATA_DIR, else $XDG_DATA_HOME/moejit, else
 * ~/.local/share/moejit; random weights, so its text is noise), pick the
 * backend, open the session and start the engine thread.  opts may be NULL
 * (defaults).  Errors: MOEJIT_EINVAL (an option), MOEJIT_EMODEL,
 * MOEJIT_ENOBACKEND, MOEJIT_ENOMEM, MOEJIT_EBACKEND. */
moejit_status moejit_open(const char *model_dir, const moejit_open_opts *opts, moejit **out);

/* Stop admitting (moejit_submit is MOEJIT_ECLOSED from now on), let the
 * requests already submitted run for up to drain_ms milliseconds (0:
 * none; < 0: until they all finish), cancel whatever is left (each gets
 * its last event, finish MOEJIT_FINISH_CANCELLED), join the engine thread
 * and free everything, undrained poll queues included.  NULL is fine.
 * Must not be called from a callback (MOEJIT_EINVAL).  Returns the first
 * error the backend reported during the engine's life, else MOEJIT_OK;
 * the handle is freed either way. */
moejit_status moejit_close(moejit *m, int drain_ms);

/* ---- what was opened --------------------------------------------------------------- */
#define MOEJIT_MAX_EOS 8

typedef struct moejit_info {
  const char *name;         /* the model folder's last component ("default-medium-nvfp4-s1" for the built-in) */
  const char *path;         /* the model folder */
  const char *backend;      /* the backend actually used: "cpu" or "cuda" */
  int32_t vocab_size;
  int32_t context_length;   /* the engine's: tokens a sequence may hold */
  int32_t model_context_length; /* the model's max_position_embeddings */
  int32_t max_parallel, max_queue;
  int32_t eos_ids[MOEJIT_MAX_EOS]; /* the ids that end a sequence: the model's, then the chat format's */
  int32_t n_eos;
  bool has_chat_template;   /* the tokenizer has GLM-5's role tokens (moejit_chat_template works) */
} moejit_info;

/* The strings stay valid until moejit_close. */
moejit_status moejit_get_info(const moejit *m, moejit_info *out);

/* ---- text and tokens (any thread) ------------------------------------------------------ */
/* Encode text[0..len) (len (size_t)-1: up to its NUL); add_special adds the
 * tokenizer's post-processor tokens.  *ids (moejit_free) holds *n ids. */
moejit_status moejit_tokenize(moejit *m, const char *text, size_t len, bool add_special, int32_t **ids,
                              size_t *n);
/* The text of ids (skip_special: special tokens left out); *text
 * (moejit_free) is NUL-terminated, *len bytes (len may be NULL).  An id
 * outside the vocabulary is MOEJIT_EINVAL. */
moejit_status moejit_detokenize(moejit *m, const int32_t *ids, size_t n, bool skip_special, char **text,
                                size_t *len);

/* One turn of a chat.  role: "system", "user", "assistant" or
 * "observation" ("tool" is taken as "observation").  content is
 * content_len bytes, which may hold NUL (JSON's "\u0000" is a character
 * like any other); content_len 0 means up to content's NUL, so
 * {role, content} initialisers of NUL-terminated text keep working. */
typedef struct moejit_message {
  const char *role;
  const char *content;
  size_t content_len;
} moejit_message;

/* The GLM-5 chat prompt of msgs as token ids: [gMASK]<sop>, each turn's
 * role token and text, and with add_generation_prompt <|assistant|>
 * followed by <think> (thinking) or </think>.  An assistant turn of the
 * history keeps its text only.  MOEJIT_EINVAL when the tokenizer lacks
 * the role tokens (moejit_info.has_chat_template) or a role is unknown. */
moejit_status moejit_chat_template(moejit *m, const moejit_message *msgs, size_t n, bool add_generation_prompt,
                                   bool thinking, int32_t **ids, size_t *n_ids);

/* ---- requests ------------------------------------------------------------------------ */
typedef enum moejit_finish {
  MOEJIT_FINISH_NONE,      /* not the last event */
  MOEJIT_FINISH_STOP,      /* an end-of-sequence id (not delivered as a token) or a stop string */
  MOEJIT_FINISH_LENGTH,    /* max_tokens generated, or the context is full */
  MOEJIT_FINISH_CANCELLED, /* moejit_cancel, or moejit_close before it finished */
  MOEJIT_FINISH_ERROR,     /* the backend failed; status and moejit_event.error say why */
} moejit_finish;

/* "stop", "length", "cancelled", "error" (and "" for NONE). */
const char *moejit_finish_name(moejit_finish f);

/* The most alternatives a request may ask for (moejit_request.top_logprobs). */
#define MOEJIT_MAX_TOP_LOGPROBS 20

/* A token and its log probability. */
typedef struct moejit_logprob {
  int32_t token;
  float logprob;
} moejit_logprob;

/* One event of a request: a generated token with the text it completed,
 * and on the last event of the request the finish reason.  Pointers (text,
 * error, top_logprobs) are valid during the callback; for an event taken
 * by moejit_poll, until the same thread's next moejit_poll or
 * moejit_release on the same handle (of any request), its moejit_close of
 * the handle, or its exit. */
typedef struct moejit_event {
  uint64_t id;             /* the request */
  int32_t token;           /* the token drawn; -1 on a last event that carries none (an end-of-
                              sequence id, cancel, error) */
  const char *text;        /* the new text (UTF-8, NUL-terminated, may be ""): an incomplete multibyte
                              character and a possible start of a stop string are held back until
                              they resolve; a matched stop string and what follows are never returned */
  size_t text_len;
  moejit_finish finish;    /* MOEJIT_FINISH_NONE but on the last event */
  int32_t stop_index;      /* FINISH_STOP: the index of the stop string matched, -1 for end-of-sequence */
  int32_t prompt_tokens;   /* the prompt's length in tokens */
  int32_t completion_tokens; /* tokens generated so far, this one included (an end-of-sequence id is not) */
  /* Last event only (else 0): milliseconds spent waiting for a slot, running
   * the prompt (admission to the first token), and decoding (first token to
   * the end). */
  double queue_ms, prompt_ms, decode_ms;
  moejit_status status;    /* last event: MOEJIT_OK, MOEJIT_ECANCELLED, or the backend's error */
  const char *error;       /* last event with FINISH_ERROR: the one-line message; else "" */
  /* A request with logprobs, on an event that carries a token (token >= 0):
   * has_logprob is true, logprob is the token's log probability and
   * top_logprobs the request's top_logprobs most likely tokens at this
   * position (n_top_logprobs of them, most likely first, the lower id first
   * on ties).  Log probabilities are the log-softmax of the model's raw
   * logits for the position, before temperature, penalties and filters
   * (vLLM's default): a greedy token is top_logprobs[0].  Else false, 0,
   * NULL and 0. */
  bool has_logprob;
  float logprob;
  const moejit_logprob *top_logprobs;
  int32_t n_top_logprobs;
} moejit_event;

/* Called on the engine thread, in order, once per event of the request; the
 * last call has finish != MOEJIT_FINISH_NONE, after which the request is
 * forgotten (its id becomes MOEJIT_ENOTFOUND).  A callback should return
 * quickly (every live request waits for it); it may call moejit_submit and
 * moejit_cancel, not moejit_close. */
typedef void (*moejit_event_fn)(const moejit_event *ev, void *user);

typedef struct moejit_request {
  /* The prompt: exactly one of the three. */
  const char *prompt;            /* text, encoded with the tokenizer's special tokens added */
  size_t prompt_len;             /* 0: up to its NUL */
  const int32_t *prompt_ids;     /* token ids as they are */
  size_t n_prompt_ids;
  const moejit_message *messages; /* a chat: moejit_chat_template with the generation prompt */
  size_t n_messages;
  bool thinking;                 /* messages: end the prompt with <think> rather than </think> (default false) */

  const moejit_sampling *sampling; /* NULL: the open's default_sampling */
  int32_t max_tokens;            /* tokens to generate, >= 0; 0 (default): until the context is full */
  const char *const *stop;       /* stop strings (non-empty, copied at submit); the text ends before the
                                    first match, found across token boundaries */
  size_t n_stop;
  const size_t *stop_lens;       /* NULL (default): each stop string up to its NUL; else stop[i] is
                                    stop_lens[i] bytes, which may hold NUL (0: up to its NUL) */
  bool ignore_eos;               /* end-of-sequence ids do not end the request (default false) */

  moejit_event_fn on_event;      /* NULL (default): the events queue for moejit_poll */
  void *user;                    /* handed to on_event */
  /* Log probabilities on every token event (moejit_event.has_logprob and
   * after): the token's, and top_logprobs (0 to MOEJIT_MAX_TOP_LOGPROBS)
   * alternatives'; top_logprobs without logprobs is MOEJIT_EINVAL.  Such a
   * request is drawn on the host (its step copies its logits).  Default
   * false, 0. */
  bool logprobs;
  int32_t top_logprobs;
  /* A polled request's events are held until its last is queued:
   * moejit_poll returns none before (MOEJIT_ETIMEDOUT), and then each in
   * turn without waiting.  Its poller wakes once a request, not once a
   * token: for a caller that wants the whole response (moejit serve's
   * stream false).  With on_event it is MOEJIT_EINVAL.  Default false. */
  bool hold_events;
} moejit_request;

void moejit_request_init(moejit_request *r);

/* Queue a request (any thread, callbacks included); *id receives its id
 * (never 0).  The prompt is encoded here, on the calling thread.
 * Errors: MOEJIT_EINVAL (no prompt or two, an empty prompt, an id outside
 * the vocabulary, max_tokens < 0, a sampling value out of range, an empty
 * stop string, prompt + max_tokens past the context, top_logprobs outside
 * 0..MOEJIT_MAX_TOP_LOGPROBS or given without logprobs), MOEJIT_EQUEUE_FULL
 * (max_queue requests already wait), MOEJIT_ECLOSED. */
moejit_status moejit_submit(moejit *m, const moejit_request *r, uint64_t *id);

/* Cancel a request (any thread, callbacks included): a waiting one never
 * runs; a running one is retired, and its slot freed, at the next step
 * boundary.  Either way its last event (finish MOEJIT_FINISH_CANCELLED,
 * status MOEJIT_ECANCELLED) follows, through its callback or its queue.
 * MOEJIT_ENOTFOUND for an id unknown or already finished and forgotten;
 * cancelling a request whose last event is already out is MOEJIT_OK and
 * changes nothing. */
moejit_status moejit_cancel(moejit *m, uint64_t id);

/* Polled requests (submitted without on_event): take the next event of
 * request id into *ev, waiting up to timeout_ms milliseconds (0: do not
 * wait; < 0: wait without bound).  MOEJIT_ETIMEDOUT when none came.  After
 * the last event has been taken the request is forgotten.  One thread at a
 * time should poll a given request, and none may release it meanwhile.
 * MOEJIT_EINVAL for a request that has a callback.  A poll waiting when
 * moejit_close begins returns (close cancels its request, whose last event
 * wakes it) before close frees anything; a poll begun after close began
 * is a use after free. */
moejit_status moejit_poll(moejit *m, uint64_t id, moejit_event *ev, int timeout_ms);

/* Forget a polled request whose events nobody will take (a client that went
 * away): cancel it if it has not finished and drop its queue now.  The id is
 * MOEJIT_ENOTFOUND afterwards.  MOEJIT_EINVAL for a request with a callback
 * (moejit_cancel it: its callback gets the last event and it is forgotten). */
moejit_status moejit_release(moejit *m, uint64_t id);

/* ---- counters (for metrics) ----------------------------------------------------------- */
/* Upper bounds (milliseconds) of the decode-step histogram's buckets; a
 * last bucket, above the largest bound, catches the rest. */
#define MOEJIT_STEP_BUCKETS_MS {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}
#define MOEJIT_STEP_BUCKETS 13 /* the 12 bounds and +infinity */

typedef struct moejit_stats {
  uint64_t requests_submitted;  /* accepted by moejit_submit */
  uint64_t requests_finished;   /* last event delivered, any reason (cancelled and failed included) */
  uint64_t requests_cancelled;
  uint64_t requests_failed;     /* FINISH_ERROR */
  uint64_t prompt_tokens;       /* prompt tokens run */
  uint64_t generated_tokens;    /* tokens drawn (end-of-sequence ids included) */
  uint32_t queue_depth;         /* requests waiting for a slot now */
  uint32_t running;             /* sequences live now */
  uint64_t prompt_steps;        /* engine steps that ran prompt tokens (a step that also ran decode rows
                                   counts in decode_steps too: prefill_chunk) */
  uint64_t decode_steps;        /* engine steps that ran one row of each decoding sequence (their time
                                   includes the prompt parts fed beside them) */
  uint64_t decode_rows;         /* rows of those steps (decode_rows / decode_steps: the mean batch) */
  double decode_step_ms_sum;    /* the time of all decode steps */
  /* Decode steps whose time was <= MOEJIT_STEP_BUCKETS_MS[i], cumulative as
   * Prometheus wants; the last entry counts every step (le="+Inf"). */
  uint64_t decode_step_le[MOEJIT_STEP_BUCKETS];
  /* The kernel cache of the whole process (one per process): kernels found
   * in memory or on disk, kernels missed, and compiled. */
  uint64_t kernel_cache_hits, kernel_cache_misses, kernel_compiles;
  /* The engine thread's own time between two decode steps in a row (from
   * the end of one to the start of the next, with no prompt step and no
   * idle wait between): handing out the first step's tokens, waking
   * pollers, cancels, waits for the engine's lock.  The device (or the
   * CPU backend) does nothing meanwhile, so decode_gap_ms_sum / decode_gaps
   * against decode_step_ms_sum / decode_steps is the engine's overhead per
   * step.  events_ms_sum is the part spent turning steps' ids into events
   * (detokenizing, stop strings, event queues, callbacks). */
  double decode_gap_ms_sum;
  uint64_t decode_gaps;
  double events_ms_sum;
  /* (version 5) 1 when the engine admits nothing again: a sharded engine
   * that lost a follower rank (moejit_submit answers MOEJIT_EBACKEND).  A
   * server's health check says so, so a balancer stops sending to it. */
  uint32_t broken;
} moejit_stats;

moejit_status moejit_get_stats(moejit *m, moejit_stats *out);

#ifdef __cplusplus
}
#endif

#endif
