/* server.c: `moejit serve`'s HTTP server (server.h) on libmicrohttpd.
 *
 * Threads.  libmicrohttpd runs one thread per connection (bounded by
 * max_connections); a completion request is submitted to the engine from its
 * connection's thread and that thread then polls the request's events
 * (moejit_poll) in slices of 100 ms, so blocking is where the work is and no
 * callback ever runs on the engine thread.  A whole response's events are
 * held until its last (hold_events), so its thread wakes once a request.  Between slices the thread peeks
 * at its socket: a client that has gone away (EOF or reset) has its request
 * released at once (moejit_release cancels it and frees its slot) rather
 * than when the next write fails.  A streamed response is a chunked body
 * whose reader produces one server-sent event per engine event; when no
 * token comes for a while it sends an SSE comment, so a slow first token
 * never looks like an idle connection to libmicrohttpd's timeout.
 *
 * Slow clients.  libmicrohttpd's connection timeout closes a connection
 * that is silent, but a client sending one byte a second is never silent;
 * so each connection is registered (the connection-notify callback) with
 * the deadline of its current request's arrival, and a watchdog thread
 * shuts down the socket of any request whose headers and body have not
 * all arrived by then: request_timeout_s after the request began.  A
 * connection's first request begins when it opens; a later one on a
 * kept-alive connection when its request line arrives (the URI-log
 * callback, libmicrohttpd's first word of a request), so an idle
 * keep-alive connection is left to the idle timeout, which is what it is
 * for.  Between requests the deadline is idle_timeout_s + request_timeout_s
 * after the last answer: a silent connection is closed by libmicrohttpd
 * before that, so only a request line trickling in meets it.  The
 * registry's lock is held across the shutdown and the entry is removed in
 * the CLOSED notification, which libmicrohttpd makes before it closes the
 * socket, so the watchdog never touches a reused descriptor.
 *
 * Log probabilities.  The engine's events carry token ids; the texts
 * OpenAI's bodies show are each id decoded alone (moejit_detokenize) on the
 * connection's thread, into an arena of the request's: a whole response's
 * for every token, a stream's for one chunk at a time.
 *
 * Memory.  A body is kept only up to max_body (a longer one is refused, 413,
 * before it is read when Content-Length says so); bodies are parsed one at
 * a time (parse_mu) and the parse tree freed at once (openai.c), so what a
 * connection holds is about two bodies, and connections are bounded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "openai.h"
#include "server.h"

/* Between polls of the engine (the disconnect check's period). */
#define POLL_MS 100
/* An SSE comment after this long without an event. */
#define KEEPALIVE_MS 5000

typedef enum {
  R_NONE, R_HEALTH, R_VERSION, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE
} route;

/* GET /v1/models/ID: the path's ID (after the prefix), up to
 * SRV_MAX_MODEL_NAME long (a longer one is no route). */
#define SRV_MODEL_PREFIX "/v1/models/"

/* One connection of the registry (under the server's mu). */
typedef struct srv_conn {
  int fd;
  double deadline; /* ms: its current request must have arrived by then; 0: it has (no deadline) */
  struct srv_conn *prev, *next;
} srv_conn;

/* One choice of a completion: an engine request of its own (a prompt of
 * the batch, drawn n times: index prompt x n + draw). */
typedef struct srv_choice {
  uint64_t id;          /* the engine's request; 0 once it ended or was let go (set under s->mu) */
  int index;
  int64_t prompt_tokens, completion_tokens;
  moejit_finish fin;    /* how it ended; MOEJIT_FINISH_NONE while it runs */
  char error[512];      /* FINISH_ERROR's message */
  mj_buf text;          /* stream false: the whole text (echo: the prompt's first) */
  /* logprobs asked: the tokens' (stream false: every one; true: the chunk's),
   * their texts in lpmem; the characters of their texts so far */
  oai_logprob *lps;
  size_t nlp, caplp;
  mj_arena lpmem;
  bool lpmem_on;
  int64_t lp_chars;
  bool sent_first;      /* stream: its first chunk is out (chat's role goes with it) */
} srv_choice;

/* One HTTP request (libmicrohttpd's per-request pointer). */
typedef struct srv_req {
  srv *s;
  struct MHD_Connection *c;
  srv_conn *conn;
  route rt;
  char model_id[SRV_MAX_MODEL_NAME + 1]; /* R_MODEL's ID */
  mj_buf body;
  bool too_large;
  oai_request q;
  bool parsed;
  /* its choices; live (in s->live) while any runs, nrun of them */
  srv_choice *ch;
  int nch, nrun, cursor; /* cursor: the choice polled first next (the streams' turn) */
  bool live;
  struct srv_req *prev, *next; /* s->live */
  /* what is answered */
  char rid[40];
  int64_t created;
  bool failed;          /* a choice ended badly: the request answers with its error */
  /* stream true: the bytes the reader hands out next, and a chunk's JSON (both reused) */
  mj_buf out, json;
  size_t out_off;
  bool stream_done;
} srv_req;

struct srv {
  moejit *engine;
  srv_opts o;
  char *model_name;
  char **keys; /* the API keys, n_keys of them (none: no key asked) */
  int n_keys;
  int64_t created;
  int port;
  struct MHD_Daemon *d;
  pthread_mutex_t mu;     /* conns, live, in_flight */
  srv_conn *conns;
  srv_req *live;
  int in_flight;
  pthread_mutex_t parse_mu;
  atomic_bool draining;
  bool cancelling;        /* under mu: srv_cancel_all has run */
  pthread_t watchdog;
  pthread_mutex_t wd_mu;
  pthread_cond_t wd_cv;
  bool wd_stop, wd_started;
  atomic_uint_fast64_t next_id;
  /* counters of /metrics beside the engine's */
  atomic_uint_fast64_t responses[600]; /* by status code */
  atomic_uint_fast64_t disconnects, timeouts;
};

void srv_opts_init(srv_opts *o) {
  *o = (srv_opts){.host = "127.0.0.1", .port = 8000, .model_name = "moejit", .max_body = 1 << 20,
                  .max_connections = 128, .idle_timeout_s = 60, .request_timeout_s = 30, .default_max_tokens = 16};
}

/* ---- responses ------------------------------------------------------------------------ */
static enum MHD_Result send_buf(srv *s, struct MHD_Connection *c, int status, const char *ctype, mj_buf *b,
                                const char *hname, const char *hval) {
  struct MHD_Response *r = MHD_create_response_from_buffer(b->len, b->len ? b->data : (void *)"",
                                                           b->len ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!r) {
    mj_buf_free(b);
    return MHD_NO;
  }
  if (b->len) b->data = NULL, b->len = b->cap = 0; /* the response frees it */
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  if (hname) MHD_add_response_header(r, hname, hval);
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  if (ok == MHD_YES && status >= 100 && status < 600) s->responses[status]++;
  return ok;
}

static enum MHD_Result send_json(srv *s, struct MHD_Connection *c, int status, mj_buf *b) {
  return send_buf(s, c, status, "application/json", b, NULL, NULL);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, const oai_error *e, const char *hname,
                                  const char *hval) {
  mj_buf b = {0};
  oai_write_error(&b, e);
  return send_buf(s, c, e->status, "application/json", &b, hname, hval);
}

static enum MHD_Result fail(srv *s, struct MHD_Connection *c, int status, const char *type, const char *param,
                            const char *code, const char *msg) {
  oai_error e;
  oai_fail(&e, status, type, param, code, "%s", msg);
  return send_error(s, c, &e, NULL, NULL);
}

/* ---- the live requests ------------------------------------------------------------------- */
/* q's choices are submitted: q goes on the live list (in flight). */
static void live_add(srv_req *q) {
  srv *s = q->s;
  pthread_mutex_lock(&s->mu);
  q->live = true;
  q->next = s->live, q->prev = NULL;
  if (s->live) s->live->prev = q;
  s->live = q;
  s->in_flight++;
  /* Submitted while srv_cancel_all walked the list: cancel them here. */
  for (int i = 0; i < q->nch && s->cancelling; i++)
    if (q->ch[i].id) moejit_cancel(s->engine, q->ch[i].id);
  pthread_mutex_unlock(&s->mu);
}

/* Under s->mu: choice c no longer runs; q leaves the live list with its last. */
static void choice_gone(srv_req *q, srv_choice *c) {
  srv *s = q->s;
  if (!c->id) return;
  c->id = 0;
  if (--q->nrun > 0 || !q->live) return;
  if (q->prev) q->prev->next = q->next;
  else s->live = q->next;
  if (q->next) q->next->prev = q->prev;
  q->live = false;
  s->in_flight--;
}

static void choice_ended(srv_req *q, srv_choice *c) {
  pthread_mutex_lock(&q->s->mu);
  choice_gone(q, c);
  pthread_mutex_unlock(&q->s->mu);
}

/* Let the running choices go (each cancelled, its slot freed, its events
 * dropped): the client went away, or one choice failed the request.  The
 * ids are taken under the lock, so srv_cancel_all never cancels one after. */
static void let_go(srv_req *q) {
  srv *s = q->s;
  uint64_t ids[OAI_MAX_CHOICES];
  int n = 0;
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < q->nch; i++)
    if (q->ch[i].id) ids[n++] = q->ch[i].id, choice_gone(q, &q->ch[i]);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++) moejit_release(s->engine, ids[i]);
}

/* The client went away: let its choices go. */
static void release(srv_req *q) {
  if (!q->nrun) return;
  let_go(q);
  q->s->disconnects++;
}

/* Has the peer closed its end (or reset)?  Data waiting (a pipelined
 * request) is not a close. */
static bool peer_gone(srv_req *q) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(q->c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return false;
  char b;
  ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Take an event of choice c (polled with timeout_ms) into ev: OK, or
 * ETIMEDOUT; an engine that lost the request ends c as an error. */
static moejit_status poll_choice(srv_req *q, srv_choice *c, moejit_event *ev, int timeout_ms) {
  moejit_status st = moejit_poll(q->s->engine, c->id, ev, timeout_ms);
  if (st == MOEJIT_OK || st == MOEJIT_ETIMEDOUT) return st;
  /* cannot happen while c->id is live; end it as an error (its message in c->error, where next_event keeps it) */
  snprintf(c->error, sizeof c->error, "the engine lost the request: %s", moejit_last_error());
  *ev = (moejit_event){.id = c->id, .token = -1, .text = "", .finish = MOEJIT_FINISH_ERROR,
                       .prompt_tokens = (int32_t)c->prompt_tokens, .completion_tokens = (int32_t)c->completion_tokens,
                       .status = st, .error = c->error};
  return MOEJIT_OK;
}

/* The next event of q's running choices into ev (its choice in *out),
 * waiting up to wait_ms: 1 with an event, 0 when none came (or none
 * runs), -1 when the client went away (released).  One choice is waited
 * on in slices of POLL_MS; a stream's several are first swept without
 * waiting from the cursor on, and then the cursor's is waited on for a
 * short slice.  A choice's last event takes it off the running ones. */
static int next_event(srv_req *q, srv_choice **out, moejit_event *ev, int wait_ms) {
  if (!q->nrun) return 0; /* nothing runs: no event will come */
  /* A whole response's choices hold their events until their last: it
   * waits on one at a time, in any order, and stays on it while it has
   * events; a stream's take turns, so none waits behind another. */
  const bool turns = q->q.stream && q->nrun > 1;
  const int slice = turns ? 5 : POLL_MS;
  for (int waited = 0, peeked = 0;;) {
    srv_choice *c = NULL;
    moejit_status st = MOEJIT_ETIMEDOUT;
    for (int k = 0; k < q->nch && turns && st == MOEJIT_ETIMEDOUT; k++) {
      c = &q->ch[(q->cursor + k) % q->nch];
      if (c->id) st = poll_choice(q, c, ev, 0);
    }
    if (st == MOEJIT_ETIMEDOUT) {
      while (!q->ch[q->cursor].id) q->cursor = (q->cursor + 1) % q->nch;
      c = &q->ch[q->cursor];
      st = poll_choice(q, c, ev, slice);
    }
    if (st == MOEJIT_OK) {
      if (turns) q->cursor = (int)(c - q->ch + 1) % q->nch;
      c->prompt_tokens = ev->prompt_tokens;
      c->completion_tokens = ev->completion_tokens;
      if (ev->finish != MOEJIT_FINISH_NONE) {
        c->fin = ev->finish;
        if (ev->finish == MOEJIT_FINISH_ERROR && ev->error != c->error)
          snprintf(c->error, sizeof c->error, "%s", ev->error ? ev->error : "");
        q->failed |= ev->finish == MOEJIT_FINISH_CANCELLED || ev->finish == MOEJIT_FINISH_ERROR;
        choice_ended(q, c);
      }
      *out = c;
      return 1;
    }
    q->cursor = (q->cursor + 1) % q->nch;
    waited += slice;
    if (waited - peeked >= POLL_MS) {
      peeked = waited;
      if (peer_gone(q)) {
        release(q);
        return -1;
      }
    }
    if (waited >= wait_ms) return 0;
  }
}

/* The error a request with a choice that ended badly answers with: that
 * choice's (cancelled: the server is shutting down; or failed). */
static void end_error(const srv_req *q, oai_error *e) {
  for (int i = 0; i < q->nch; i++)
    if (q->ch[i].fin == MOEJIT_FINISH_ERROR) {
      oai_fail(e, 500, "server_error", NULL, "engine_error", "the engine failed: %s", q->ch[i].error);
      return;
    }
  oai_fail(e, 503, "server_error", NULL, "shutting_down", "the server is shutting down; the request was cancelled");
}

/* What choice c reports, text aside; finish_reason is "stop" or "length"
 * once it ended well, NULL while it runs.  The log probabilities taken so
 * far go with it when the request asked (a chunk of no token: none). */
static void result_of(const srv_req *q, const srv_choice *c, oai_result *r, const char *text, size_t len) {
  *r = (oai_result){.index = c->index, .id = q->rid, .created = q->created, .model = q->s->model_name, .text = text,
                    .text_len = len, .finish_reason = c->fin == MOEJIT_FINISH_NONE ? NULL : moejit_finish_name(c->fin),
                    .prompt_tokens = c->prompt_tokens, .completion_tokens = c->completion_tokens,
                    .with_logprobs = q->q.logprobs && (!q->q.stream || c->nlp > 0), .logprobs = c->lps,
                    .n_logprobs = c->nlp};
}

/* usage: each prompt's tokens once (its first draw's), every choice's
 * completion tokens. */
static void usage_of(const srv_req *q, int64_t *prompt, int64_t *completion) {
  *prompt = *completion = 0;
  for (int i = 0; i < q->nch; i++) {
    if (q->ch[i].index % q->q.n == 0) *prompt += q->ch[i].prompt_tokens;
    *completion += q->ch[i].completion_tokens;
  }
}

/* ---- log probabilities --------------------------------------------------------------------- */
/* Token id as OpenAI's logprobs show it: the text its single id decodes to
 * as the response's text is decoded (a special token, which the text leaves
 * out, is ""; a piece of a character is U+FFFD), in c->lpmem. */
static oai_token token_of(srv_req *q, srv_choice *c, int32_t id, float lp) {
  oai_token t = {.text = "", .len = 0, .logprob = lp};
  char *text = NULL;
  size_t n = 0;
  if (moejit_detokenize(q->s->engine, &id, 1, true, &text, &n) == MOEJIT_OK)
    t.text = mj_arena_strndup(&c->lpmem, text, n), t.len = n;
  moejit_free(text);
  return t;
}

/* Drop the log probabilities taken (a stream's chunk is written). */
static void lp_reset(srv_choice *c) {
  if (c->lpmem_on) mj_arena_free(&c->lpmem);
  c->lpmem_on = false, c->nlp = 0;
}

/* Append ev's log probabilities (an event with a token, of a request that
 * asked) to c's; its text_offset is the characters of the tokens before. */
static void take_logprobs(srv_req *q, srv_choice *c, const moejit_event *ev) {
  if (!ev->has_logprob) return;
  if (!c->lpmem_on) mj_arena_init(&c->lpmem, 16384), c->lpmem_on = true;
  if (c->nlp == c->caplp) {
    c->caplp = c->caplp ? 2 * c->caplp : 16;
    c->lps = mj_xrealloc(c->lps, c->caplp * sizeof *c->lps);
  }
  oai_logprob *l = &c->lps[c->nlp++];
  l->tok = token_of(q, c, ev->token, ev->logprob);
  oai_token *top = ev->n_top_logprobs ? mj_arena_alloc(&c->lpmem, (size_t)ev->n_top_logprobs * sizeof *top) : NULL;
  for (int i = 0; i < ev->n_top_logprobs; i++)
    top[i] = token_of(q, c, ev->top_logprobs[i].token, ev->top_logprobs[i].logprob);
  l->top = top, l->n_top = ev->n_top_logprobs;
  l->text_offset = c->lp_chars;
  for (size_t i = 0; i < l->tok.len; i++) c->lp_chars += ((unsigned char)l->tok.text[i] & 0xC0) != 0x80;
}

/* ---- streaming ----------------------------------------------------------------------------- */
/* Append q->json to q->out as one server-sent event. */
static void sse(srv_req *q) {
  mj_buf_puts(&q->out, "data: ");
  mj_buf_put(&q->out, q->json.data, q->json.len);
  mj_buf_puts(&q->out, "\n\n");
}

/* Fill q->out with what comes next: the next event's chunk (and after the
 * last choice's last, the usage chunk and [DONE]), or a keep-alive comment
 * when none came in time.  A choice that ends badly sends the error as an
 * event of its own (OpenAI's streams carry one so) and ends the stream,
 * its other choices let go.  false when the client went away. */
static bool stream_more(srv_req *q) {
  q->out.len = q->out_off = 0;
  moejit_event ev;
  srv_choice *c;
  int got = next_event(q, &c, &ev, KEEPALIVE_MS);
  if (got < 0) return false;
  if (got == 0) {
    mj_buf_puts(&q->out, ": keep-alive\n\n");
    return true;
  }
  oai_result r;
  q->json.len = 0;
  if (q->failed) {
    let_go(q);
    oai_error e;
    end_error(q, &e);
    oai_write_error(&q->json, &e);
  } else { /* a token's chunk even when its text is held back (""): OpenAI's streams send one a token */
    lp_reset(c);
    take_logprobs(q, c, &ev);
    result_of(q, c, &r, ev.text, ev.text_len);
    oai_write_chunk(&q->json, q->q.kind, &r, q->q.kind == OAI_CHAT && !c->sent_first);
    c->sent_first = true;
  }
  sse(q);
  if (!q->nrun) {
    if (q->q.include_usage) {
      q->json.len = 0;
      r = (oai_result){.id = q->rid, .created = q->created, .model = q->s->model_name};
      usage_of(q, &r.prompt_tokens, &r.completion_tokens);
      oai_write_usage_chunk(&q->json, q->q.kind, &r);
      sse(q);
    }
    mj_buf_puts(&q->out, "data: [DONE]\n\n");
    q->stream_done = true;
  }
  return true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  srv_req *q = cls;
  while (q->out_off >= q->out.len) {
    if (q->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
    if (!stream_more(q)) return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  size_t n = q->out.len - q->out_off;
  if (n > max) n = max;
  memcpy(buf, q->out.data + q->out_off, n);
  q->out_off += n;
  return (ssize_t)n;
}

/* ---- completions ---------------------------------------------------------------------------- */
static const char *role_name(oai_role r) { return r == OAI_SYSTEM ? "system" : r == OAI_USER ? "user" : "assistant"; }

/* q's chat messages as the API takes them (the caller frees the array;
 * the texts stay q's). */
static moejit_message *messages_of(const srv_req *q) {
  moejit_message *m = mj_xcalloc(q->q.n_messages ? q->q.n_messages : 1, sizeof *m);
  for (size_t i = 0; i < q->q.n_messages; i++)
    m[i] = (moejit_message){role_name(q->q.messages[i].role), q->q.messages[i].content, q->q.messages[i].len};
  return m;
}

/* echo: prompt p's text into out, where a whole response's text begins (a
 * stream sends it as its choice's first chunk).  A text prompt as given;
 * token ids decoded as the completion's tokens are, special tokens left
 * out, before the request is submitted: an id the model takes may have no
 * text in the tokenizer, which is the client's error. */
static moejit_status echo_text(srv_req *q, const oai_prompt *p, mj_buf *out) {
  if (!p->ids) {
    mj_buf_put(out, p->text, p->len);
    return MOEJIT_OK;
  }
  char *dec = NULL;
  size_t n = 0;
  moejit_status st = moejit_detokenize(q->s->engine, p->ids, p->n_ids, true, &dec, &n);
  if (st == MOEJIT_OK) mj_buf_put(out, dec, n);
  moejit_free(dec);
  return st;
}

/* A model a request names: 0 when it is the served one, else 404
 * model_not_found into e. */
static int model_check(const srv *s, const char *name, oai_error *e) {
  if (strcmp(name, s->model_name) == 0) return 0;
  return oai_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                  "the model '%s' does not exist; this server serves '%s'", name, s->model_name);
}

/* q's body as a request of route kind into q->q (the body freed), and its
 * model checked: 0, else the status with e filled. */
static int parse_body(srv_req *q, oai_kind kind, oai_error *e) {
  srv *s = q->s;
  pthread_mutex_lock(&s->parse_mu);
  int st = oai_parse(kind, q->body.data ? q->body.data : "", q->body.len, &q->q, e);
  pthread_mutex_unlock(&s->parse_mu);
  mj_buf_free(&q->body);
  if (st) return st;
  q->parsed = true;
  return q->q.model ? model_check(s, q->q.model, e) : 0;
  return 0;
}

/* Submit every choice of q (nch of them): each prompt of its batch (chat: the messages)
 * n times, draw j seeded seed + j when a seed is given (so n = 1 is the
 * request alone, and its draws differ).  On a refusal the choices already
 * submitted are let go; the engine's status is returned, with the
 * message in moejit_last_error. */
static moejit_status submit_all(srv_req *q, int nch, moejit_request *rq, moejit_sampling *sp, bool *echo_failed,
                                int *failed_at) {
  srv *s = q->s;
  q->ch = mj_xcalloc((size_t)nch, sizeof *q->ch);
  q->nch = nch; /* with ch: on_completed frees nch choices */
  moejit_status ms = MOEJIT_OK;
  for (int i = 0; i < q->nch && ms == MOEJIT_OK; i++) {
    srv_choice *c = &q->ch[i];
    int64_t draw = i % q->q.n;
    c->index = i;
    if (q->q.kind == OAI_COMPLETION) {
      const oai_prompt *p = &q->q.prompts[i / q->q.n];
      rq->prompt = p->text, rq->prompt_len = p->len, rq->prompt_ids = p->ids, rq->n_prompt_ids = p->n_ids;
      if (q->q.echo && draw > 0) mj_buf_put(&c->text, q->ch[i - 1].text.data, q->ch[i - 1].text.len); /* decoded once */
      else if (q->q.echo && echo_text(q, p, &c->text) != MOEJIT_OK) ms = MOEJIT_EINVAL, *echo_failed = true;
    }
    sp->seed = q->q.has_seed ? (int64_t)(((uint64_t)q->q.seed + (uint64_t)draw) & INT64_MAX) : -1;
    if (ms == MOEJIT_OK) ms = s->draining ? MOEJIT_ECLOSED : moejit_submit(s->engine, rq, &c->id);
    if (ms != MOEJIT_OK) *failed_at = i;
    pthread_mutex_lock(&s->mu);
    q->nrun += ms == MOEJIT_OK;
    pthread_mutex_unlock(&s->mu);
  }
  if (q->nrun) live_add(q);
  if (ms != MOEJIT_OK) let_go(q);
  return ms;
}

static enum MHD_Result completion(srv_req *q) {
  srv *s = q->s;
  oai_error e;
  if (parse_body(q, q->rt == R_CHAT ? OAI_CHAT : OAI_COMPLETION, &e)) return send_error(s, q->c, &e, NULL, NULL);
  /* The API reads a prompt_len of 0 as "up to the NUL"; an empty prompt
   * would be refused there anyway, but here it names its field. */
  for (size_t i = 0; q->q.kind == OAI_COMPLETION && i < q->q.n_prompts; i++)
    if (!q->q.prompts[i].ids && q->q.prompts[i].len == 0) {
      if (q->q.n_prompts == 1) oai_fail(&e, 400, "invalid_request_error", "prompt", NULL, "'prompt' must not be empty");
      else oai_fail(&e, 400, "invalid_request_error", "prompt", NULL, "'prompt' %zu must not be empty", i);
      return send_error(s, q->c, &e, NULL, NULL);
    }
  moejit_sampling sp;
  moejit_sampling_init(&sp);
  sp.temperature = (float)q->q.temperature, sp.top_p = (float)q->q.top_p, sp.min_p = (float)q->q.min_p;
  sp.top_k = q->q.top_k > INT32_MAX ? INT32_MAX : (int32_t)q->q.top_k;
  sp.presence_penalty = (float)q->q.presence_penalty, sp.frequency_penalty = (float)q->q.frequency_penalty;
  /* vLLM's repetition_penalty is the engine's repeat penalty over every
   * token of the sequence, prompt included */
  if (q->q.repetition_penalty != 1) sp.repeat_penalty = (float)q->q.repetition_penalty, sp.repeat_last_n = 0;
  moejit_request rq;
  moejit_request_init(&rq);
  moejit_message *msgs = NULL; /* chat: the messages as the API takes them, until submitted */
  if (q->q.kind == OAI_CHAT) {
    msgs = messages_of(q);
    rq.messages = msgs, rq.n_messages = q->q.n_messages, rq.thinking = q->q.thinking;
  }
  rq.sampling = &sp;
  int64_t mt = q->q.max_tokens > 0 ? q->q.max_tokens : q->q.kind == OAI_COMPLETION ? s->o.default_max_tokens : 0;
  rq.max_tokens = mt > INT32_MAX ? INT32_MAX : (int32_t)mt;
  rq.stop = q->q.n_stop ? q->q.stop : NULL, rq.n_stop = (size_t)q->q.n_stop, rq.stop_lens = q->q.stop_len;
  rq.ignore_eos = q->q.ignore_eos;
  /* A whole response wakes its thread once a choice, at its end, not once a token. */
  rq.hold_events = !q->q.stream;
  rq.logprobs = q->q.logprobs, rq.top_logprobs = (int32_t)q->q.top_logprobs;
  /* More choices than the wait queue holds could never all be taken: a
   * 400 now, not a 503 that says to retry. */
  moejit_info info;
  int nch = (int)((q->q.kind == OAI_COMPLETION ? q->q.n_prompts : 1) * (size_t)q->q.n);
  if (nch > 1 && moejit_get_info(s->engine, &info) == MOEJIT_OK && nch > info.max_queue) {
    free(msgs);
    oai_fail(&e, 400, "invalid_request_error", "n", NULL,
             "the request's %d choices (prompts x n) exceed the server's wait queue of %d (--max-queue)", nch,
             (int)info.max_queue);
    return send_error(s, q->c, &e, NULL, NULL);
  }
  bool echo_failed = false;
  int failed_at = 0;
  moejit_status ms = submit_all(q, nch, &rq, &sp, &echo_failed, &failed_at);
  free(msgs);
  if (ms == MOEJIT_EQUEUE_FULL) {
    oai_fail(&e, 503, "server_error", NULL, "queue_full", "the server is busy (its wait queue is full); retry later");
    return send_error(s, q->c, &e, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  }
  if (ms == MOEJIT_ECLOSED) return fail(s, q->c, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
  if (ms == MOEJIT_EINVAL && q->q.kind == OAI_COMPLETION && q->q.n_prompts > 1) { /* name the prompt of the batch */
    oai_fail(&e, 400, "invalid_request_error", "prompt", NULL, "'prompt' %d: %s", failed_at / (int)q->q.n,
             moejit_last_error());
    return send_error(s, q->c, &e, NULL, NULL);
  }
  if (ms == MOEJIT_EINVAL) return fail(s, q->c, 400, "invalid_request_error", echo_failed ? "prompt" : NULL, NULL, moejit_last_error());
  if (ms != MOEJIT_OK) return fail(s, q->c, 500, "server_error", NULL, "engine_error", moejit_last_error());
  snprintf(q->rid, sizeof q->rid, "%s-%016llx", q->q.kind == OAI_CHAT ? "chatcmpl" : "cmpl",
           (unsigned long long)(s->next_id++ * 0x9E3779B97F4A7C15ull ^ (uint64_t)s->created));
  q->created = (int64_t)time(NULL);

  if (q->q.stream) {
    for (int i = 0; i < q->nch && q->q.echo; i++) { /* each choice's first chunk, handed out before any event */
      srv_choice *c = &q->ch[i];
      oai_result r;
      result_of(q, c, &r, c->text.data ? c->text.data : "", c->text.len);
      q->json.len = 0;
      oai_write_chunk(&q->json, q->q.kind, &r, false);
      sse(q);
      mj_buf_free(&c->text);
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, q, NULL);
    if (!r) return MHD_NO; /* srv_completed releases the request */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(q->c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES) s->responses[200]++;
    return ok;
  }
  moejit_event ev;
  srv_choice *c;
  while (q->nrun > 0 && !q->failed) {
    int got = next_event(q, &c, &ev, 1 << 30);
    if (got < 0) return MHD_NO; /* the client is gone: close */
    if (got > 0 && !q->failed) mj_buf_put(&c->text, ev.text, ev.text_len), take_logprobs(q, c, &ev);
  }
  if (q->failed) {
    let_go(q);
    end_error(q, &e);
    return send_error(s, q->c, &e, NULL, NULL);
  }
  oai_result *res = mj_xcalloc((size_t)q->nch, sizeof *res);
  for (int i = 0; i < q->nch; i++)
    result_of(q, &q->ch[i], &res[i], q->ch[i].text.data ? q->ch[i].text.data : "", q->ch[i].text.len);
  int64_t pt, ct;
  usage_of(q, &pt, &ct);
  mj_buf b = {0};
  oai_write_response(&b, q->q.kind, res, (size_t)q->nch, pt, ct);
  free(res);
  return send_json(s, q->c, 200, &b);
}

/* ---- /tokenize and /detokenize (vLLM's) ------------------------------------------------------ */
/* The tokenizer as the engine uses it, without running anything: a prompt's
 * ids (with the special tokens a completion's prompt gets, unless
 * add_special_tokens is false), chat messages' (the template a chat request
 * gets), or the text of ids (special tokens kept: the inverse of /tokenize). */
static enum MHD_Result tokens(srv_req *q) {
  srv *s = q->s;
  oai_error e;
  if (parse_body(q, q->rt == R_TOKENIZE ? OAI_TOKENIZE : OAI_DETOKENIZE, &e)) return send_error(s, q->c, &e, NULL, NULL);
  mj_buf b = {0};
  moejit_status ms;
  if (q->rt == R_DETOKENIZE) {
    char *text = NULL;
    size_t len = 0;
    ms = moejit_detokenize(s->engine, q->q.prompt_ids, q->q.n_prompt_ids, false, &text, &len);
    if (ms == MOEJIT_OK) oai_write_detokenized(&b, text, len);
    moejit_free(text);
  } else {
    int32_t *ids = NULL;
    size_t n = 0;
    if (q->q.messages) {
      moejit_message *msgs = messages_of(q);
      ms = moejit_chat_template(s->engine, msgs, q->q.n_messages, q->q.add_generation_prompt, q->q.thinking, &ids, &n);
      free(msgs);
    } else {
      ms = moejit_tokenize(s->engine, q->q.prompt, q->q.prompt_len, q->q.add_special, &ids, &n);
    }
    moejit_info info;
    if (ms == MOEJIT_OK && (ms = moejit_get_info(s->engine, &info)) == MOEJIT_OK)
      oai_write_tokens(&b, ids, n, info.context_length);
    moejit_free(ids);
  }
  if (ms != MOEJIT_OK) {
    mj_buf_free(&b);
    return fail(s, q->c, ms == MOEJIT_EINVAL ? 400 : 500, ms == MOEJIT_EINVAL ? "invalid_request_error" : "server_error",
                q->rt == R_DETOKENIZE ? "tokens" : NULL, NULL, moejit_last_error());
  }
  return send_json(s, q->c, 200, &b);
}

/* ---- metrics --------------------------------------------------------------------------------- */
static void metric(mj_buf *b, const char *name, const char *type, const char *help, double v) {
  mj_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static enum MHD_Result metrics(srv *s, struct MHD_Connection *c) {
  moejit_stats st;
  if (moejit_get_stats(s->engine, &st) != MOEJIT_OK)
    return fail(s, c, 500, "server_error", NULL, NULL, moejit_last_error());
  mj_buf b = {0};
  metric(&b, "moejit_requests_total", "counter", "Requests the engine accepted.", (double)st.requests_submitted);
  metric(&b, "moejit_requests_finished_total", "counter", "Requests that ended, for any reason.", (double)st.requests_finished);
  metric(&b, "moejit_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
         (double)st.requests_cancelled);
  metric(&b, "moejit_requests_failed_total", "counter", "Requests the backend failed.", (double)st.requests_failed);
  metric(&b, "moejit_prompt_tokens_total", "counter", "Prompt tokens run.", (double)st.prompt_tokens);
  metric(&b, "moejit_generation_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
  metric(&b, "moejit_queue_depth", "gauge", "Requests waiting for a slot.", st.queue_depth);
  metric(&b, "moejit_running_sequences", "gauge", "Sequences being decoded.", st.running);
  metric(&b, "moejit_prompt_steps_total", "counter", "Engine steps that ran prompt tokens (with chunked prefill, some also ran decode rows).", (double)st.prompt_steps);
  metric(&b, "moejit_decode_rows_total", "counter", "Rows of decode steps (over steps: the mean batch).",
         (double)st.decode_rows);
  static const double le_ms[] = MOEJIT_STEP_BUCKETS_MS;
  mj_buf_puts(&b, "# HELP moejit_decode_step_seconds Time of one decode step (a row of every decoding sequence, and any prompt "
                  "part beside them).\n"
                  "# TYPE moejit_decode_step_seconds histogram\n");
  for (int i = 0; i < MOEJIT_STEP_BUCKETS; i++) {
    if (i < MOEJIT_STEP_BUCKETS - 1)
      mj_buf_printf(&b, "moejit_decode_step_seconds_bucket{le=\"%g\"} %llu\n", le_ms[i] / 1000.0,
                    (unsigned long long)st.decode_step_le[i]);
    else
      mj_buf_printf(&b, "moejit_decode_step_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)st.decode_step_le[i]);
  }
  mj_buf_printf(&b, "moejit_decode_step_seconds_sum %.9g\nmoejit_decode_step_seconds_count %llu\n",
                st.decode_step_ms_sum / 1000.0, (unsigned long long)st.decode_steps);
  metric(&b, "moejit_engine_gap_seconds_total", "counter",
         "The engine thread's time between two decode steps in a row (tokens out, wake-ups, cancels, lock waits).",
         st.decode_gap_ms_sum / 1000.0);
  metric(&b, "moejit_engine_gaps_total", "counter", "Gaps counted in moejit_engine_gap_seconds_total.",
         (double)st.decode_gaps);
  metric(&b, "moejit_engine_events_seconds_total", "counter",
         "The engine thread's time turning decode steps' tokens into events (part of the gaps).",
         st.events_ms_sum / 1000.0);
  metric(&b, "moejit_kernel_cache_hits_total", "counter", "Kernels found in the memory table or the disk cache.",
         (double)st.kernel_cache_hits);
  metric(&b, "moejit_kernel_cache_misses_total", "counter", "Kernels not in any cache.", (double)st.kernel_cache_misses);
  metric(&b, "moejit_kernel_compiles_total", "counter", "Kernels compiled.", (double)st.kernel_compiles);
  pthread_mutex_lock(&s->mu);
  int inflight = s->in_flight, conns = 0;
  for (srv_conn *k = s->conns; k; k = k->next) conns++;
  pthread_mutex_unlock(&s->mu);
  metric(&b, "moejit_http_requests_in_flight", "gauge", "Completion requests the server is relaying.", inflight);
  metric(&b, "moejit_http_connections", "gauge", "Open HTTP connections.", conns);
  metric(&b, "moejit_http_client_disconnects_total", "counter", "Requests cancelled because their client went away.",
         (double)s->disconnects);
  metric(&b, "moejit_http_request_timeouts_total", "counter", "Connections closed because a request arrived too slowly.",
         (double)s->timeouts);
  mj_buf_puts(&b, "# HELP moejit_http_responses_total HTTP responses sent, by status code.\n"
                  "# TYPE moejit_http_responses_total counter\n");
  for (int code = 100; code < 600; code++)
    if (s->responses[code])
      mj_buf_printf(&b, "moejit_http_responses_total{code=\"%d\"} %llu\n", code, (unsigned long long)s->responses[code]);
  metric(&b, "moejit_draining", "gauge", "1 while the server shuts down.", s->draining ? 1 : 0);
  return send_buf(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL, NULL);
}

/* ---- routing ------------------------------------------------------------------------------- */
/* The route of url; /v1/models/ID's ID (which may hold '/': "org/name")
 * into id. */
static route route_of(const char *url, char *id) {
  static const struct { const char *path; route r; } t[] = {
      {"/health", R_HEALTH}, {"/version", R_VERSION}, {"/metrics", R_METRICS}, {"/v1/models", R_MODELS},
      {"/v1/completions", R_COMPLETIONS}, {"/v1/chat/completions", R_CHAT},
      {"/tokenize", R_TOKENIZE}, {"/detokenize", R_DETOKENIZE}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(t); i++)
    if (strcmp(url, t[i].path) == 0) return t[i].r;
  size_t pl = strlen(SRV_MODEL_PREFIX), n = strlen(url);
  if (n > pl && n - pl <= SRV_MAX_MODEL_NAME && strncmp(url, SRV_MODEL_PREFIX, pl) == 0) {
    memcpy(id, url + pl, n - pl + 1);
    return R_MODEL;
  }
  return R_NONE;
}

/* The bearer token against every key, each compared in time that does
 * not depend on where it differs, and all of them whatever matched. */
static bool key_ok(const srv *s, struct MHD_Connection *c) {
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
  h += 7;
  size_t n = strlen(h);
  if (n > SRV_MAX_KEY) return false; /* no key is longer: the work a request costs stays bounded */
  bool ok = false;
  for (int j = 0; j < s->n_keys; j++) {
    const char *key = s->keys[j];
    size_t k = strlen(key); /* never 0 (serve_cmd.c) */
    unsigned char d = n != k;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(h[i] ^ key[i % k]);
    ok |= d == 0;
  }
  return ok;
}

static srv_conn *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* The first call of a request: everything decided from its headers. */
static enum MHD_Result first_call(srv *s, srv_req *q, const char *method) {
  bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
  if (q->rt == R_NONE) return fail(s, q->c, 404, "invalid_request_error", NULL, "not_found", "no such route");
  bool want_post = q->rt == R_COMPLETIONS || q->rt == R_CHAT || q->rt == R_TOKENIZE || q->rt == R_DETOKENIZE;
  if (want_post ? !post : !get) {
    oai_error e;
    oai_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed here; use %s", method,
             want_post ? "POST" : "GET");
    return send_error(s, q->c, &e, MHD_HTTP_HEADER_ALLOW, want_post ? "POST" : "GET, HEAD");
  }
  if (s->n_keys && q->rt != R_HEALTH && q->rt != R_VERSION && q->rt != R_METRICS && !key_ok(s, q->c)) {
    oai_error e;
    oai_fail(&e, 401, "authentication_error", NULL, "invalid_api_key",
             "a missing or wrong API key: send the header Authorization: Bearer KEY");
    return send_error(s, q->c, &e, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  }
  if (s->draining && (q->rt == R_COMPLETIONS || q->rt == R_CHAT))
    return fail(s, q->c, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
  const char *cl = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (errno || end == cl || n > s->o.max_body) {
      oai_error e;
      oai_fail(&e, 413, "invalid_request_error", NULL, "body_too_large", "the body is %s bytes; this server takes at most %zu",
               cl, s->o.max_body);
      return send_error(s, q->c, &e, MHD_HTTP_HEADER_CONNECTION, "close");
    }
  }
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
  srv *s = cls;
  srv_req *q = *ctx;
  if (!q) {
    q = mj_xcalloc(1, sizeof *q);
    q->s = s, q->c = c, q->rt = route_of(url, q->model_id), q->conn = conn_of(c);
    *ctx = q;
    return first_call(s, q, method);
  }
  if (*upload_size) { /* a piece of the body */
    if (!q->too_large && q->body.len + *upload_size > s->o.max_body) q->too_large = true, mj_buf_free(&q->body);
    if (!q->too_large) mj_buf_put(&q->body, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  /* the whole request is in */
  if (q->conn) {
    pthread_mutex_lock(&s->mu);
    q->conn->deadline = 0;
    pthread_mutex_unlock(&s->mu);
  }
  if (q->too_large) {
    oai_error e;
    oai_fail(&e, 413, "invalid_request_error", NULL, "body_too_large", "the body is larger than %zu bytes", s->o.max_body);
    return send_error(s, c, &e, NULL, NULL);
  }
  mj_buf b = {0};
  switch (q->rt) {
  case R_HEALTH: {
    moejit_stats st;
    bool broken = moejit_get_stats(s->engine, &st) == MOEJIT_OK && st.broken; /* a sharded engine without a rank */
    mj_buf_puts(&b, s->draining ? "{\"status\":\"draining\"}" : broken ? "{\"status\":\"broken\"}" : "{\"status\":\"ok\"}");
    return send_json(s, c, s->draining || broken ? 503 : 200, &b);
  }
  case R_VERSION: /* vLLM's */
    mj_buf_printf(&b, "{\"version\":\"%s\"}", moejit_version());
    return send_json(s, c, 200, &b);
  case R_MODELS:
    oai_write_models(&b, s->model_name, s->created);
    return send_json(s, c, 200, &b);
  case R_MODEL: { /* OpenAI's retrieve: the one model, or the 404 a request naming another gets */
    oai_error e;
    if (model_check(s, q->model_id, &e)) return send_error(s, c, &e, NULL, NULL);
    oai_write_model(&b, s->model_name, s->created);
    return send_json(s, c, 200, &b);
  }
  case R_METRICS:
    return metrics(s, c);
  case R_COMPLETIONS:
  case R_CHAT:
    return completion(q);
  case R_TOKENIZE:
  case R_DETOKENIZE:
    return tokens(q);
  case R_NONE:
    break;
  }
  return MHD_NO;
}

/* A request is over (answered, failed, timed out or its client gone). */
static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe) {
  srv *s = cls;
  srv_req *q = *ctx;
  if (!q) return;
  *ctx = NULL;
  if (q->nrun) { /* still running: nobody will read it */
    let_go(q);
    s->disconnects++;
  }
  if (q->conn) { /* the next request's line: within the idle timeout, then its own time */
    pthread_mutex_lock(&s->mu);
    q->conn->deadline = mj_now_ms() + (s->o.idle_timeout_s + s->o.request_timeout_s) * 1000.0;
    pthread_mutex_unlock(&s->mu);
  }
  if (q->parsed) oai_request_free(&q->q);
  mj_buf_free(&q->body), mj_buf_free(&q->out), mj_buf_free(&q->json);
  for (int i = 0; i < q->nch; i++) mj_buf_free(&q->ch[i].text), lp_reset(&q->ch[i]), free(q->ch[i].lps);
  free(q->ch);
  free(q);
}

/* ---- the connection registry and its watchdog ----------------------------------------------- */
/* A request begins: its request line has arrived (libmicrohttpd calls this
 * once a request, before it reads the headers).  The first request of a
 * connection began when the connection opened, and keeps that deadline. */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c) {
  srv *s = cls;
  srv_conn *k = conn_of(c);
  if (k) {
    double d = mj_now_ms() + s->o.request_timeout_s * 1000.0;
    pthread_mutex_lock(&s->mu);
    if (k->deadline == 0 || d < k->deadline) k->deadline = d;
    pthread_mutex_unlock(&s->mu);
  }
  return NULL; /* on_request's first call still sees *ctx NULL */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode code) {
  srv *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    srv_conn *k = mj_xcalloc(1, sizeof *k);
    k->fd = ci ? ci->connect_fd : -1, k->deadline = mj_now_ms() + s->o.request_timeout_s * 1000.0;
    pthread_mutex_lock(&s->mu);
    k->next = s->conns;
    if (s->conns) s->conns->prev = k;
    s->conns = k;
    pthread_mutex_unlock(&s->mu);
    *socket_ctx = k;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_ctx) {
    srv_conn *k = *socket_ctx;
    pthread_mutex_lock(&s->mu);
    if (k->prev) k->prev->next = k->next;
    else s->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&s->mu);
    free(k);
    *socket_ctx = NULL;
  }
}

static void *watchdog(void *arg) {
  srv *s = arg;
  pthread_mutex_lock(&s->wd_mu);
  while (!s->wd_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->wd_cv, &s->wd_mu, &ts);
    double now = mj_now_ms();
    pthread_mutex_lock(&s->mu);
    for (srv_conn *k = s->conns; k; k = k->next)
      if (k->deadline > 0 && k->fd >= 0 && now > k->deadline) {
        shutdown(k->fd, SHUT_RDWR);
        k->fd = -1; /* once */
        s->timeouts++;
      }
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_unlock(&s->wd_mu);
  return NULL;
}

/* libmicrohttpd's own messages (a peer that reset, a timeout) are the
 * everyday weather of a server: shown at MOEJIT_LOG=2 and up. */
static void on_log(void *cls, const char *fmt, va_list ap) {
  if (mj_log_level() < 2) return;
  fprintf(stderr, "moejit: http: ");
  vfprintf(stderr, fmt, ap);
}

/* ---- start and stop ------------------------------------------------------------------------- */
/* The address to bind: o's host and port resolved (freeaddrinfo). */
static int resolve(const srv_opts *o, struct addrinfo **ai, mj_err *err) {
  if (o->port < 0 || o->port > 65535) return mj_fail(err, MJ_EUSAGE, "moejit serve: --port must be 0..65535, not %d", o->port);
  if (o->max_connections < 1) return mj_fail(err, MJ_EUSAGE, "moejit serve: --max-connections must be 1 or more");
  if (o->max_body < 1) return mj_fail(err, MJ_EUSAGE, "moejit serve: --max-body must be 1 or more bytes");
  if (o->idle_timeout_s < 1 || o->request_timeout_s < 1)
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --idle-timeout and --request-timeout must be 1 s or more");
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  char port[16];
  snprintf(port, sizeof port, "%d", o->port);
  *ai = NULL;
  int gr = getaddrinfo(o->host, port, &hints, ai);
  if (gr || !*ai) {
    if (*ai) freeaddrinfo(*ai);
    return mj_fail(err, MJ_EUSAGE, "moejit serve: --host %s: %s", o->host, gr ? gai_strerror(gr) : "no address");
  }
  return 0;
}

/* 1 to max visible ASCII characters (0x21-0x7e)? */
static bool visible_ascii(const char *t, size_t max) {
  size_t n = strlen(t);
  if (n < 1 || n > max) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)t[i] < 0x21 || (unsigned char)t[i] > 0x7e) return false;
  return true;
}

bool srv_key_valid(const char *k) { return visible_ascii(k, SRV_MAX_KEY); }

bool srv_model_name_valid(const char *name) { return visible_ascii(name, SRV_MAX_MODEL_NAME); }

static int check_keys(const srv_opts *o, mj_err *err) {
  if (o->n_api_keys > SRV_MAX_KEYS) return mj_fail(err, MJ_EUSAGE, "moejit serve: more than %d API keys", SRV_MAX_KEYS);
  for (int j = 0; j < o->n_api_keys; j++)
    if (!srv_key_valid(o->api_keys[j]))
      return mj_fail(err, MJ_EUSAGE, "moejit serve: API key %d is not 1 to %d visible ASCII characters", j + 1, SRV_MAX_KEY);
  return 0;
}

int srv_check(const srv_opts *o, mj_err *err) {
  int r = check_keys(o, err);
  if (r) return r;
  struct addrinfo *ai;
  r = resolve(o, &ai, err);
  if (!r) freeaddrinfo(ai);
  return r;
}

int srv_start(moejit *engine, const srv_opts *o, srv **out, mj_err *err) {
  *out = NULL;
  int r = check_keys(o, err);
  if (r) return r;
  struct addrinfo *ai;
  if ((r = resolve(o, &ai, err))) return r;
  srv *s = mj_xcalloc(1, sizeof *s);
  s->engine = engine, s->o = *o;
  s->model_name = mj_xstrdup(o->model_name ? o->model_name : "moejit");
  s->n_keys = o->n_api_keys;
  s->keys = mj_xcalloc(o->n_api_keys ? (size_t)o->n_api_keys : 1, sizeof *s->keys);
  for (int j = 0; j < o->n_api_keys; j++) s->keys[j] = mj_xstrdup(o->api_keys[j]);
  s->o.api_keys = NULL; /* the caller's: the copies above are the server's */
  s->created = (int64_t)time(NULL);
  s->next_id = 1;
  pthread_mutex_init(&s->mu, NULL), pthread_mutex_init(&s->parse_mu, NULL), pthread_mutex_init(&s->wd_mu, NULL);
  pthread_cond_init(&s->wd_cv, NULL);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                          MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_timeout_s,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                          MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                          MHD_OPTION_URI_LOG_CALLBACK, on_request_line, s,
                          MHD_OPTION_EXTERNAL_LOGGER, on_log, s,
                          MHD_OPTION_END);
  int e = errno;
  freeaddrinfo(ai);
  if (!s->d) {
    srv_destroy(s);
    return mj_fail(err, MJ_EIO, "moejit serve: cannot listen on %s port %d: %s", o->host, o->port,
                   e ? strerror(e) : "libmicrohttpd refused to start");
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : o->port;
  int pe = pthread_create(&s->watchdog, NULL, watchdog, s);
  if (pe) {
    srv_destroy(s);
    return mj_fail(err, MJ_ENOMEM, "moejit serve: cannot start the watchdog thread: %s", strerror(pe));
  }
  s->wd_started = true;
  *out = s;
  return 0;
}

int srv_port(const srv *s) { return s->port; }

void srv_drain(srv *s) { s->draining = true; }

int srv_in_flight(srv *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->in_flight;
  pthread_mutex_unlock(&s->mu);
  return n;
}

void srv_cancel_all(srv *s) {
  pthread_mutex_lock(&s->mu);
  s->cancelling = true;
  for (srv_req *q = s->live; q; q = q->next)
    for (int i = 0; i < q->nch; i++)
      if (q->ch[i].id) moejit_cancel(s->engine, q->ch[i].id);
  pthread_mutex_unlock(&s->mu);
}

void srv_destroy(srv *s) {
  if (!s) return;
  if (s->d) MHD_stop_daemon(s->d);
  if (s->wd_started) {
    pthread_mutex_lock(&s->wd_mu);
    s->wd_stop = true;
    pthread_cond_signal(&s->wd_cv);
    pthread_mutex_unlock(&s->wd_mu);
    pthread_join(s->watchdog, NULL);
  }
  pthread_mutex_destroy(&s->mu), pthread_mutex_destroy(&s->parse_mu), pthread_mutex_destroy(&s->wd_mu);
  pthread_cond_destroy(&s->wd_cv);
  for (int j = 0; j < s->n_keys; j++) free(s->keys[j]);
  free(s->model_name), free(s->keys);
  free(s);
}
