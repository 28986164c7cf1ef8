/* test_api.c: the public C API (include/moejit.h, src/api.c) on the CPU
 * backend with a tiny synthetic model.
 *
 * A request's tokens are held to the session driven by hand (sess_admit,
 * the prompt as one step, then one row a step, the same sampler seed) and,
 * when make check names the program ($MOEJIT), to `moejit generate --json`
 * for the same prompt and parameters.  Checked besides: the same seed twice
 * gives the same tokens and another seed others; stop strings, one of them
 * spanning two tokens and one holding a NUL byte (stop_lens), cut the text
 * before the match; cancel of a running
 * request frees its slot for the next, and of a waiting one ends it before
 * it runs; a full wait queue refuses with MOEJIT_EQUEUE_FULL; bad arguments
 * give their status and a message; 8 threads submitting and polling at once
 * get exactly the tokens they asked for, each poller woken by its own
 * request's events only; 300 requests known at once are each found by id;
 * requests without a seed draw alike on two ranks of a sharded engine;
 * threads that poll and exit leave no event parked; close with requests running
 * (cancelled, or drained to their end); an engine (its waker thread, the first started) that cannot start
 * reports pthread_create's own error; a request whose events are held
 * (hold_events) polls none until its end, then all; log probabilities (each token's the
 * log-softmax of the logits the session computes for that position, the
 * top list sorted and of the size asked, the same through a callback) and
 * the presence and frequency penalties (the session's draws; a request
 * without either draws the tokens it drew before they existed).  A
 * callback that blocks holds the
 * engine still, which is how the queue and timeout cases get a fixed state.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "mkmodel.h"
#include "model.h"
#include "moejit.h"
#include "session.h"
#include "t.h"
#include "t_fs.h"

static char dir[512], dir2[512]; /* the tiny model; another seed of it */

static moejit *open_tiny(int parallel, int queue) {
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU;
  o.context_length = 64;
  o.max_parallel = parallel;
  o.max_queue = queue;
  o.threads = 1;
  o.quiet = true;
  moejit *m = NULL;
  moejit_status st = moejit_open(dir, &o, &m);
  if (st) fprintf(stderr, "moejit_open: %s: %s\n", moejit_status_name(st), moejit_last_error());
  T_CHECK(st == MOEJIT_OK && m);
  return m;
}

/* What one polled request gave. */
typedef struct result {
  int32_t tok[128];
  int ntok, nev;
  char text[4096];
  size_t len;
  moejit_event last;
} result;

/* Poll request id to its last event; false when a poll failed (no T_
 * checks here: worker threads call it too). */
static bool drain(moejit *m, uint64_t id, result *r) {
  memset(r, 0, sizeof *r);
  for (;;) {
    moejit_event ev;
    moejit_status st = moejit_poll(m, id, &ev, 10000);
    if (st) {
      fprintf(stderr, "  poll %llu: %s: %s\n", (unsigned long long)id, moejit_status_name(st), moejit_last_error());
      return false;
    }
    r->nev++;
    if (ev.token >= 0 && r->ntok < 128) r->tok[r->ntok++] = ev.token;
    if (r->len + ev.text_len < sizeof r->text) memcpy(r->text + r->len, ev.text, ev.text_len), r->len += ev.text_len;
    if (ev.finish != MOEJIT_FINISH_NONE) {
      r->last = ev;
      r->last.text = r->last.error = NULL; /* parked until this thread's next poll */
      return true;
    }
  }
}

static moejit_sampling seeded(int64_t seed) {
  moejit_sampling s;
  moejit_sampling_init(&s);
  s.temperature = 0.9f, s.top_p = 0.95f, s.min_p = 0.02f, s.seed = seed;
  return s;
}

static const int32_t prompt[] = {5, 9, 2, 7, 30, 31};
#define NPROMPT ((int)(sizeof prompt / sizeof *prompt))

static uint64_t submit_ids(moejit *m, const moejit_sampling *s, int max_tokens, bool ignore_eos) {
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT;
  r.sampling = s, r.max_tokens = max_tokens, r.ignore_eos = ignore_eos;
  uint64_t id = 0;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  return id;
}

/* The sequence of prompt p (np tokens) on a session driven by hand, the
 * prompt fed whole: n tokens. */
static void by_hand_p(const int32_t *p, int np, const moejit_sampling *s, int n, int32_t *out) {
  model *M;
  mj_err err = {0};
  T_CHECK(model_load(dir, &M, &err) == 0);
  sess_opts o;
  sess_opts_default(&o);
  o.slots = 1, o.max_ctx = 64, o.threads = 1;
  session *S;
  T_CHECK(sess_create(M, &o, &S, &err) == 0);
  sample_params sp = sample_defaults();
  sp.temperature = s->temperature, sp.top_p = s->top_p, sp.min_p = s->min_p, sp.seed = (uint64_t)s->seed;
  sp.presence_penalty = s->presence_penalty, sp.frequency_penalty = s->frequency_penalty;
  int slot;
  T_CHECK(sess_admit(S, &sp, &slot, &err) == 0);
  int32_t *sl = malloc((size_t)np * sizeof *sl), *ids = malloc((size_t)np * sizeof *ids);
  for (int i = 0; i < np; i++) sl[i] = slot;
  T_CHECK(sess_step(S, p, sl, np, ids, NULL, &err) == 0);
  out[0] = ids[np - 1];
  for (int i = 1; i < n; i++) T_CHECK(sess_step(S, &out[i - 1], &slot, 1, &out[i], NULL, &err) == 0);
  free(sl), free(ids);
  sess_destroy(S);
  model_free(M);
}
static void by_hand(const moejit_sampling *s, int n, int32_t *out) { by_hand_p(prompt, NPROMPT, s, n, out); }

/* The logits of the prompt's last row and then of each of toks[0..n-1)
 * fed in turn, from a session driven by hand: n rows of vocab floats. */
static float *logits_by_hand(const int32_t *toks, int n, int64_t *vocab) {
  model *M;
  mj_err err = {0};
  T_CHECK(model_load(dir, &M, &err) == 0);
  int64_t V = *vocab = M->cfg.vocab_size;
  sess_opts o;
  sess_opts_default(&o);
  o.slots = 1, o.max_ctx = 64, o.threads = 1;
  session *S;
  T_CHECK(sess_create(M, &o, &S, &err) == 0);
  sample_params sp = sample_filters(0, 0, 1, 0, 0);
  int slot;
  T_CHECK(sess_admit(S, &sp, &slot, &err) == 0);
  float *all = malloc((size_t)NPROMPT * V * sizeof *all), *rows = malloc((size_t)n * V * sizeof *rows);
  int32_t sl[NPROMPT], ids[NPROMPT];
  for (int i = 0; i < NPROMPT; i++) sl[i] = slot;
  T_CHECK(sess_step(S, prompt, sl, NPROMPT, ids, all, &err) == 0);
  memcpy(rows, all + (size_t)(NPROMPT - 1) * V, (size_t)V * sizeof *rows);
  for (int i = 1; i < n; i++) T_CHECK(sess_step(S, &toks[i - 1], &slot, 1, ids, rows + (size_t)i * V, &err) == 0);
  free(all);
  sess_destroy(S);
  model_free(M);
  return rows;
}

/* What a request with logprobs gave, token by token. */
typedef struct lp_result {
  int n;
  int32_t tok[16];
  bool has[16];
  float lp[16];
  int ntop[16];
  moejit_logprob top[16][MOEJIT_MAX_TOP_LOGPROBS];
} lp_result;

static void lp_take(lp_result *r, const moejit_event *ev) {
  if (ev->token < 0 || r->n == 16) return;
  int i = r->n++;
  r->tok[i] = ev->token, r->has[i] = ev->has_logprob, r->lp[i] = ev->logprob, r->ntop[i] = ev->n_top_logprobs;
  T_CHECK(ev->n_top_logprobs == 0 || ev->top_logprobs != NULL);
  for (int k = 0; k < ev->n_top_logprobs && k < MOEJIT_MAX_TOP_LOGPROBS; k++) r->top[i][k] = ev->top_logprobs[k];
}

static void lp_run(moejit *m, const moejit_sampling *s, bool logprobs, int top, int n, lp_result *r) {
  memset(r, 0, sizeof *r);
  moejit_request q;
  moejit_request_init(&q);
  q.prompt_ids = prompt, q.n_prompt_ids = NPROMPT, q.sampling = s, q.max_tokens = n, q.ignore_eos = true;
  q.logprobs = logprobs, q.top_logprobs = top;
  uint64_t id;
  moejit_stats st;
  moejit_get_stats(m, &st);
  uint64_t done = st.requests_finished;
  T_EQ_INT(moejit_submit(m, &q, &id), MOEJIT_OK);
  /* Taken once all are queued: each event's top_logprobs must be its own
   * copy, not the engine's buffer of the last token. */
  for (int w = 0; w < 1000 && (moejit_get_stats(m, &st), st.requests_finished == done); w++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  for (moejit_event ev;;) {
    if (moejit_poll(m, id, &ev, 10000) != MOEJIT_OK) {
      T_CHECK(!"poll");
      return;
    }
    lp_take(r, &ev);
    if (ev.finish != MOEJIT_FINISH_NONE) return;
  }
}

static void lp_cb(const moejit_event *ev, void *user) {
  lp_take(user, ev);
  if (ev->finish != MOEJIT_FINISH_NONE) ((lp_result *)user)->tok[15] = -2; /* done */
}

/* Log probabilities of a greedy request: each token's is the log-softmax
 * (computed here in long double) of the logits the session gives for its
 * position, its top list holds the largest in order, the greedy token
 * first; the size asked is the size given; a callback sees the same. */
static void test_logprobs(void) {
  moejit *m = open_tiny(2, 8);
  moejit_sampling g;
  moejit_sampling_init(&g);
  g.temperature = 0, g.seed = 1;
  enum { N = 10, K = 5 };
  lp_result r;
  lp_run(m, &g, true, K, N, &r);
  T_EQ_INT(r.n, N);
  int64_t V;
  float *rows = logits_by_hand(r.tok, N, &V);
  double worst = 0;
  for (int i = 0; i < N; i++) {
    const float *x = rows + (size_t)i * V;
    long double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    for (int64_t j = 0; j < V; j++) sum += expl((long double)x[j] - mx);
    long double lse = mx + logl(sum);
    T_CHECK(r.has[i]);
    T_EQ_INT(r.ntop[i], K);
    double want = (double)((long double)x[r.tok[i]] - lse), rel = fabs(r.lp[i] - want) / fabs(want);
    worst = rel > worst ? rel : worst;
    T_CHECK(rel <= 2e-7); /* a float's rounding: 2.5e-8 seen */
    T_CHECK(r.lp[i] <= 0);
    /* greedy: the token is the first of the top list, to the bit */
    T_EQ_INT(r.top[i][0].token, r.tok[i]);
    T_CHECK(r.top[i][0].logprob == r.lp[i]);
    for (int k = 0; k < K; k++) {
      const moejit_logprob *t = &r.top[i][k];
      double w = (double)((long double)x[t->token] - lse);
      T_CHECK(fabs(t->logprob - w) <= 2e-7 * fabs(w) + 1e-7);
      if (k) T_CHECK(t->logprob <= r.top[i][k - 1].logprob);
    }
    int above = 0; /* the K are the K largest */
    for (int64_t j = 0; j < V; j++) above += x[j] > x[r.top[i][K - 1].token];
    T_EQ_INT(above, K - 1);
  }
  printf("  logprobs: worst relative difference from the session's logits %.2g\n", worst);
  free(rows);
  /* the size asked: 0 (the token's own only) and 20 */
  lp_result r0, r20;
  lp_run(m, &g, true, 0, 3, &r0);
  lp_run(m, &g, true, MOEJIT_MAX_TOP_LOGPROBS, 3, &r20);
  for (int i = 0; i < 3; i++) {
    T_CHECK(r0.has[i] && r0.ntop[i] == 0 && r0.lp[i] == r.lp[i] && r0.tok[i] == r.tok[i]);
    T_CHECK(r20.has[i] && r20.ntop[i] == MOEJIT_MAX_TOP_LOGPROBS && r20.lp[i] == r.lp[i]);
    T_CHECK(!memcmp(r20.top[i], r.top[i], K * sizeof r.top[i][0]));
  }
  /* through a callback: the same values (the pointers valid during the call) */
  lp_result rc = {0};
  moejit_request q;
  moejit_request_init(&q);
  q.prompt_ids = prompt, q.n_prompt_ids = NPROMPT, q.sampling = &g, q.max_tokens = N, q.ignore_eos = true;
  q.logprobs = true, q.top_logprobs = K, q.on_event = lp_cb, q.user = &rc;
  uint64_t id;
  T_EQ_INT(moejit_submit(m, &q, &id), MOEJIT_OK);
  for (int w = 0; w < 1000 && rc.tok[15] != -2; w++) nanosleep(&(struct timespec){0, 10000000}, NULL);
  T_EQ_INT(rc.n, N);
  T_CHECK(!memcmp(rc.lp, r.lp, sizeof r.lp) && !memcmp(rc.top, r.top, N * sizeof r.top[0]));
  /* without logprobs: nothing reported, and a seeded request draws what it
   * drew before log probabilities and the new penalties existed (recorded
   * at commit 07bab7f), with or without them asked */
  static const int32_t before[16] = {100, 254, 305, 318, 60, 166, 308, 354, 285, 213, 218, 219, 113, 181, 107, 39};
  static const int32_t before_rep[16] = {97, 23, 41, 307, 59, 220, 165, 369, 288, 98, 28, 177, 115, 45, 157, 322};
  moejit_sampling s7 = seeded(7), rp;
  moejit_sampling_init(&rp);
  rp.temperature = 1.0f, rp.top_k = 50, rp.repeat_penalty = 1.3f, rp.seed = 11;
  lp_result a, b, c;
  lp_run(m, &s7, false, 0, 16, &a);
  lp_run(m, &s7, true, 3, 16, &b);
  lp_run(m, &rp, false, 0, 16, &c);
  T_EQ_INT(a.n, 16);
  T_CHECK(!memcmp(a.tok, before, sizeof before) && !memcmp(b.tok, before, sizeof before));
  T_CHECK(!memcmp(c.tok, before_rep, sizeof before_rep));
  for (int i = 0; i < 16; i++) T_CHECK(!a.has[i] && a.ntop[i] == 0 && b.has[i] && b.lp[i] <= 0);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* The presence and frequency penalties reach the session's sampler: a
 * greedy request with them draws what the session by hand draws with them,
 * and not what it draws without. */
static void test_penalties(void) {
  moejit *m = open_tiny(1, 4);
  moejit_sampling g, p;
  moejit_sampling_init(&g);
  g.temperature = 0, g.seed = 1;
  p = g;
  p.presence_penalty = 1.5f, p.frequency_penalty = 2.0f;
  lp_result plain, pen;
  lp_run(m, &g, false, 0, 16, &plain);
  lp_run(m, &p, false, 0, 16, &pen);
  int32_t want[16];
  by_hand(&p, 16, want);
  T_CHECK(!memcmp(pen.tok, want, sizeof want));
  T_CHECK(memcmp(pen.tok, plain.tok, sizeof want) != 0);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

static void test_info_and_text(void) {
  moejit *m = open_tiny(2, 8);
  moejit_info in;
  T_EQ_INT(moejit_get_info(m, &in), MOEJIT_OK);
  T_EQ_STR(in.backend, "cpu");
  T_EQ_STR(in.name, "m");
  T_EQ_INT(in.vocab_size, 384);
  T_EQ_INT(in.context_length, 64);
  T_EQ_INT(in.max_parallel, 2);
  T_CHECK(in.n_eos >= 3 && in.eos_ids[0] == 348 && in.has_chat_template);
  int32_t *ids;
  size_t n;
  T_EQ_INT(moejit_tokenize(m, "hello world", (size_t)-1, false, &ids, &n), MOEJIT_OK);
  T_CHECK(n > 0);
  char *text;
  size_t len;
  T_EQ_INT(moejit_detokenize(m, ids, n, true, &text, &len), MOEJIT_OK);
  T_EQ_STR(text, "hello world");
  T_EQ_INT(len, 11);
  moejit_free(ids), moejit_free(text);
  moejit_message msgs[] = {{"system", "be brief"}, {"user", "hi"}};
  T_EQ_INT(moejit_chat_template(m, msgs, 2, true, false, &ids, &n), MOEJIT_OK);
  T_CHECK(n >= 6); /* [gMASK]<sop><|system|>..<|user|>..<|assistant|></think> */
  moejit_free(ids);
  /* content holding NUL: content_len bytes reach the tokenizer (0 would stop at the NUL) */
  moejit_message nul[] = {{"user", "hi\0there", 8}}, cut[] = {{"user", "hi\0there", 0}};
  int32_t *with, *plain, *body;
  size_t nwith, nplain, nbody;
  T_EQ_INT(moejit_chat_template(m, nul, 1, true, false, &with, &nwith), MOEJIT_OK);
  T_EQ_INT(moejit_chat_template(m, cut, 1, true, false, &plain, &nplain), MOEJIT_OK);
  T_EQ_INT(moejit_tokenize(m, "hi\0there", 8, false, &body, &nbody), MOEJIT_OK);
  T_EQ_INT(nwith, 5 + nbody); /* [gMASK]<sop><|user|> the text <|assistant|></think> */
  T_CHECK(nwith == 5 + nbody && !memcmp(with + 3, body, nbody * sizeof *body));
  T_CHECK(nplain < nwith);
  moejit_free(with), moejit_free(plain), moejit_free(body);
  /* a chat request: its prompt is the template's */
  moejit_request r;
  moejit_request_init(&r);
  r.messages = msgs, r.n_messages = 2, r.max_tokens = 2, r.ignore_eos = true;
  uint64_t id;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  result res;
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.last.prompt_tokens, (int)n);
  T_EQ_INT(res.last.completion_tokens, 2);
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_LENGTH);
  T_EQ_STR(moejit_finish_name(res.last.finish), "length");
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

static void test_determinism(void) {
  moejit *m = open_tiny(2, 8);
  moejit_sampling s7 = seeded(7), s8 = seeded(8);
  result a, b, c;
  T_CHECK(drain(m, submit_ids(m, &s7, 12, true), &a));
  T_CHECK(drain(m, submit_ids(m, &s7, 12, true), &b));
  T_CHECK(drain(m, submit_ids(m, &s8, 12, true), &c));
  T_EQ_INT(a.ntok, 12);
  T_EQ_INT(a.last.finish, MOEJIT_FINISH_LENGTH);
  T_CHECK(a.ntok == b.ntok && !memcmp(a.tok, b.tok, sizeof a.tok));
  T_CHECK(memcmp(a.tok, c.tok, sizeof a.tok) != 0); /* the seed is used */
  int32_t want[12];
  by_hand(&s7, 12, want);
  T_CHECK(!memcmp(a.tok, want, sizeof want));
  /* a batched neighbour changes nothing: two at once, each as alone */
  uint64_t x = submit_ids(m, &s7, 12, true), y = submit_ids(m, &s8, 12, true);
  T_CHECK(drain(m, y, &b));
  T_CHECK(!memcmp(b.tok, c.tok, sizeof b.tok));
  T_CHECK(drain(m, x, &b));
  T_CHECK(!memcmp(b.tok, a.tok, sizeof b.tok));
  /* max_tokens 0: until the context (64) is full */
  T_CHECK(drain(m, submit_ids(m, &s7, 0, true), &b));
  T_EQ_INT(b.last.completion_tokens, 64 - NPROMPT);
  T_EQ_INT(b.last.finish, MOEJIT_FINISH_LENGTH);
  T_CHECK(!memcmp(b.tok, a.tok, 12 * sizeof *a.tok));
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* `moejit generate --json` and a text request with its parameters give the
 * same tokens (when make check names the program). */
static void test_same_as_generate(void) {
  const char *exe = getenv("MOEJIT");
  if (!exe || !*exe) return;
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'the quick fox' -n 10 --seed 21 --temp 0.7 --top-p 0.9 --min-p 0.05 --json -q",
           exe, dir);
  FILE *p = popen(cmd, "r");
  T_CHECK(p != NULL);
  if (!p) return;
  char line[8192] = "";
  T_CHECK(fgets(line, sizeof line, p) != NULL);
  T_EQ_INT(pclose(p), 0);
  char *t = strstr(line, "\"tokens\":[");
  T_CHECK(t != NULL);
  if (!t) return;
  t += 10;
  moejit *m = open_tiny(1, 4);
  moejit_sampling s;
  moejit_sampling_init(&s);
  s.temperature = 0.7f, s.top_p = 0.9f, s.min_p = 0.05f, s.seed = 21;
  moejit_request r;
  moejit_request_init(&r);
  r.prompt = "the quick fox", r.sampling = &s, r.max_tokens = 10;
  uint64_t id;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  result res;
  T_CHECK(drain(m, id, &res));
  char got[2048] = "";
  for (int i = 0; i < res.ntok; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? "," : "", res.tok[i]);
  *strchr(t, ']') = 0;
  T_EQ_STR(got, t);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* The pieces of a run with no stop strings, one per token, and their
 * concatenation all[0..*len) (a token may decode to a NUL byte). */
static int pieces(moejit *m, const moejit_sampling *s, char piece[][64], char *all, size_t *len) {
  uint64_t id = submit_ids(m, s, 24, true);
  int n = 0;
  *len = 0;
  for (;;) {
    moejit_event ev;
    if (moejit_poll(m, id, &ev, 10000)) return n;
    if (ev.token >= 0 && n < 24) {
      snprintf(piece[n++], 64, "%.*s", (int)ev.text_len, ev.text);
      memcpy(all + *len, ev.text, ev.text_len);
      *len += ev.text_len;
    }
    if (ev.finish) return n;
  }
}

static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static void test_stop_strings(void) {
  moejit *m = open_tiny(2, 8);
  moejit_sampling s = seeded(3);
  char piece[24][64], all[2048];
  size_t all_len;
  int n = pieces(m, &s, piece, all, &all_len);
  T_EQ_INT(n, 24);
  /* A stop string made of the last character of one token's text and the
   * first of the next one's: it spans the token boundary. */
  char stop[16] = "";
  int k = 0;
  for (k = 4; k + 1 < n && !stop[0]; k++) {
    size_t la = strlen(piece[k]), lb = strlen(piece[k + 1]);
    if (!la || !lb) continue;
    size_t a0 = la;
    while (a0 > 0 && ((unsigned char)piece[k][a0 - 1] & 0xC0) == 0x80) a0--;
    a0--; /* the last character's first byte */
    snprintf(stop, sizeof stop, "%s%.*s", piece[k] + a0, (int)utf8_len((unsigned char)piece[k + 1][0]), piece[k + 1]);
  }
  T_CHECK(stop[0] != 0);
  const char *at = memmem(all, all_len, stop, strlen(stop));
  T_CHECK(at != NULL);
  if (!at) return;
  const char *stops[] = {"never-in-this-text", stop};
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.sampling = &s, r.max_tokens = 24, r.ignore_eos = true;
  r.stop = stops, r.n_stop = 2;
  uint64_t id;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  result res;
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, (size_t)(at - all));
  T_CHECK(!strncmp(res.text, all, (size_t)(at - all)));
  T_CHECK(memmem(res.text, res.len, stop, strlen(stop)) == NULL);
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_STOP);
  T_EQ_INT(res.last.stop_index, 1);
  T_CHECK(res.ntok < 24);
  /* Stops that never match return the whole text: one whose start does
   * occur (the spanning stop and more) is held back there, then let go. */
  char longer[32];
  snprintf(longer, sizeof longer, "%s\x7f\x7f\x7f", stop);
  const char *stops2[] = {"never-in-this-text", longer};
  r.stop = stops2, r.n_stop = 2;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, all_len);
  T_CHECK(!memcmp(res.text, all, all_len));
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_LENGTH);
  /* A stop string may hold NUL, given its length (stop_lens).  This text
   * holds a NUL byte (a token of the byte-level vocabulary): the character
   * before its first NUL and the NUL end the text there. */
  const char *z = memchr(all, 0, all_len);
  T_CHECK(z != NULL && z > all);
  if (!z || z == all) return (void)moejit_close(m, 0);
  const char *c0 = z - 1;
  while (c0 > all && ((unsigned char)*c0 & 0xC0) == 0x80) c0--;
  char nul[8];
  size_t nl = (size_t)(z + 1 - c0);
  memcpy(nul, c0, nl);
  const char *stops3[] = {nul, "\0"};
  size_t lens3[] = {nl, 1};
  r.stop = stops3, r.n_stop = 1, r.stop_lens = lens3;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, (size_t)(c0 - all));
  T_CHECK(!memcmp(res.text, all, res.len));
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_STOP);
  T_EQ_INT(res.last.stop_index, 0);
  /* A NUL alone, as the second stop string: found at the same NUL. */
  r.n_stop = 2;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, (size_t)(c0 - all));
  T_EQ_INT(res.last.stop_index, 0);
  lens3[0] = 0; /* 0: up to its NUL, the character alone; the NUL, one byte, ends the text later */
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  const char *ch = memmem(all, all_len, c0, (size_t)(z - c0));
  T_EQ_INT(res.len, (size_t)(ch - all));
  T_EQ_INT(res.last.stop_index, 0);
  /* The character, the NUL and a byte the text lacks: no match, the
   * whole text (cut at its NUL, the stop string would match the character). */
  nul[nl] = '\x7f';
  lens3[0] = nl + 1;
  r.n_stop = 1;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, all_len);
  T_CHECK(!memcmp(res.text, all, all_len));
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_LENGTH);
  /* stop_lens NULL, as callers before it: each stop string up to its NUL,
   * the character alone again. */
  r.stop_lens = NULL;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  T_CHECK(drain(m, id, &res));
  T_EQ_INT(res.len, (size_t)(ch - all));
  T_EQ_INT(res.last.finish, MOEJIT_FINISH_STOP);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* A callback that blocks the engine on its first event (or its at-th)
 * until let go. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool entered, open;
  int events, last, at;
} gate;

static void gate_cb(const moejit_event *ev, void *user) {
  gate *g = user;
  pthread_mutex_lock(&g->mu);
  g->events++;
  if (ev->finish) g->last = ev->finish;
  if (g->events < g->at) {
    pthread_mutex_unlock(&g->mu);
    return;
  }
  g->entered = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_init(gate *g) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
}
static void gate_wait_entered(gate *g) {
  pthread_mutex_lock(&g->mu);
  while (!g->entered) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}
static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}
static void gate_free(gate *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

static uint64_t submit_gated(moejit *m, gate *g, int max_tokens) {
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.max_tokens = max_tokens, r.ignore_eos = true;
  r.on_event = gate_cb, r.user = g;
  uint64_t id = 0;
  T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  return id;
}

static void test_queue_full_and_timeout(void) {
  moejit *m = open_tiny(1, 2);
  gate g;
  gate_init(&g);
  uint64_t a = submit_gated(m, &g, 4);
  gate_wait_entered(&g); /* a holds the one slot, and the engine */
  moejit_sampling s = seeded(1);
  uint64_t b = submit_ids(m, &s, 3, true), c = submit_ids(m, &s, 3, true);
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT;
  uint64_t d = 0;
  T_EQ_INT(moejit_submit(m, &r, &d), MOEJIT_EQUEUE_FULL);
  T_CHECK(strstr(moejit_last_error(), "max_queue") != NULL);
  moejit_stats st;
  T_EQ_INT(moejit_get_stats(m, &st), MOEJIT_OK);
  T_EQ_INT(st.queue_depth, 2);
  T_EQ_INT(st.running, 1);
  T_EQ_INT(st.requests_submitted, 3);
  moejit_event ev;
  T_EQ_INT(moejit_poll(m, b, &ev, 0), MOEJIT_ETIMEDOUT);
  T_EQ_INT(moejit_poll(m, b, &ev, 30), MOEJIT_ETIMEDOUT);
  T_EQ_INT(moejit_poll(m, a, &ev, 0), MOEJIT_EINVAL); /* a has a callback */
  gate_open(&g);
  result rb, rc;
  T_CHECK(drain(m, b, &rb));
  T_CHECK(drain(m, c, &rc));
  T_EQ_INT(rb.ntok, 3);
  T_EQ_INT(rc.ntok, 3);
  T_EQ_INT(g.events, 4);
  T_EQ_INT(g.last, MOEJIT_FINISH_LENGTH);
  T_EQ_INT(moejit_poll(m, b, &ev, 0), MOEJIT_ENOTFOUND); /* forgotten after its last event */
  T_EQ_INT(moejit_cancel(m, a), MOEJIT_ENOTFOUND);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
  gate_free(&g);
}

/* hold_events: a held request's poll finds nothing while it runs, though
 * its tokens are queued (a request beside it, not held, finds its own),
 * then each event without waiting; the tokens are the same.  A gated
 * request admitted after them holds the engine meanwhile; their 300
 * tokens leave the main thread that long to reach the gate (on the CPU,
 * ~0.4 ms each). */
static void test_hold(void) {
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU, o.context_length = 320, o.max_parallel = 3, o.max_queue = 8, o.threads = 1, o.quiet = true;
  moejit *m = NULL;
  T_EQ_INT(moejit_open(dir, &o, &m), MOEJIT_OK);
  if (!m) return;
  enum { N = 300 };
  moejit_sampling s = seeded(11);
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT;
  r.sampling = &s, r.max_tokens = N, r.ignore_eos = true, r.hold_events = true;
  uint64_t b = 0;
  T_EQ_INT(moejit_submit(m, &r, &b), MOEJIT_OK);
  uint64_t c = submit_ids(m, &s, N, true);
  gate g;
  gate_init(&g);
  uint64_t a = submit_gated(m, &g, 4);
  gate_wait_entered(&g); /* admitted after b and c, a holds the engine in its first event */
  moejit_event ev;
  T_EQ_INT(moejit_poll(m, b, &ev, 0), MOEJIT_ETIMEDOUT);
  T_CHECK(strstr(moejit_last_error(), "held") != NULL);
  T_EQ_INT(moejit_poll(m, b, &ev, 30), MOEJIT_ETIMEDOUT);
  T_EQ_INT(moejit_poll(m, c, &ev, 0), MOEJIT_OK); /* c's first token, queued */
  T_CHECK(ev.token >= 0 && ev.finish == MOEJIT_FINISH_NONE);
  int32_t first_c = ev.token;
  gate_open(&g);
  result rc; /* c's tokens 2 to 129 */
  T_CHECK(drain(m, c, &rc));
  T_EQ_INT(rc.nev, N - 1);
  /* b: the first poll waits for its end, the rest find their events queued */
  int32_t tok[N];
  int n = 0;
  T_EQ_INT(moejit_poll(m, b, &ev, 10000), MOEJIT_OK);
  for (;;) {
    if (ev.token >= 0 && n < N) tok[n++] = ev.token;
    if (ev.finish != MOEJIT_FINISH_NONE) break;
    moejit_status st = moejit_poll(m, b, &ev, 0);
    T_EQ_INT(st, MOEJIT_OK);
    if (st) break;
  }
  T_EQ_INT(ev.finish, MOEJIT_FINISH_LENGTH);
  T_EQ_INT(n, N);
  T_EQ_INT(tok[0], first_c);
  T_CHECK(n == N && !memcmp(tok + 1, rc.tok, 128 * sizeof *tok)); /* c's, as the same seed draws */
  T_EQ_INT(moejit_poll(m, b, &ev, 0), MOEJIT_ENOTFOUND);
  T_EQ_INT(moejit_cancel(m, a), MOEJIT_ENOTFOUND);
  T_EQ_INT(g.last, MOEJIT_FINISH_LENGTH);
  /* released while it runs held: forgotten at once, its slot freed */
  gate g2;
  gate_init(&g2);
  uint64_t d = 0;
  T_EQ_INT(moejit_submit(m, &r, &d), MOEJIT_OK);
  uint64_t a2 = submit_gated(m, &g2, 2);
  gate_wait_entered(&g2);
  T_EQ_INT(moejit_poll(m, d, &ev, 20), MOEJIT_ETIMEDOUT);
  T_EQ_INT(moejit_release(m, d), MOEJIT_OK);
  T_EQ_INT(moejit_poll(m, d, &ev, 0), MOEJIT_ENOTFOUND);
  gate_open(&g2);
  (void)a2;
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
  gate_free(&g);
  gate_free(&g2);
}

static void test_cancel(void) {
  moejit *m = open_tiny(1, 4);
  gate g;
  gate_init(&g);
  uint64_t a = submit_gated(m, &g, 0); /* until the context is full */
  gate_wait_entered(&g);               /* a holds the slot, the engine waits in its callback */
  moejit_sampling s = seeded(5);
  uint64_t b = submit_ids(m, &s, 5, true);
  uint64_t c = submit_ids(m, &s, 5, true);
  T_EQ_INT(moejit_cancel(m, c), MOEJIT_OK); /* waiting: never runs */
  T_EQ_INT(moejit_cancel(m, a), MOEJIT_OK); /* running: retired at the next step boundary */
  gate_open(&g);
  result rb, rc;
  T_CHECK(drain(m, b, &rb)); /* a's slot went to b */
  T_EQ_INT(rb.ntok, 5);
  T_EQ_INT(rb.last.finish, MOEJIT_FINISH_LENGTH);
  T_EQ_INT(g.events, 2); /* its first token, then the end */
  T_EQ_INT(g.last, MOEJIT_FINISH_CANCELLED);
  T_CHECK(drain(m, c, &rc));
  T_EQ_INT(rc.last.finish, MOEJIT_FINISH_CANCELLED);
  T_EQ_INT(rc.last.status, MOEJIT_ECANCELLED);
  T_EQ_STR(moejit_finish_name(rc.last.finish), "cancelled");
  T_EQ_INT(rc.ntok, 0);
  T_EQ_INT(rc.last.prompt_ms, 0);
  moejit_stats st;
  moejit_get_stats(m, &st);
  T_EQ_INT(st.requests_cancelled, 2);
  T_EQ_INT(st.requests_finished, 3);
  T_EQ_INT(st.running, 0);
  T_EQ_INT(st.queue_depth, 0);
  T_EQ_INT(moejit_cancel(m, a), MOEJIT_ENOTFOUND);
  /* released: dropped without polling, then unknown */
  uint64_t d = submit_ids(m, &s, 0, true);
  moejit_event ev;
  T_EQ_INT(moejit_release(m, d), MOEJIT_OK);
  T_EQ_INT(moejit_poll(m, d, &ev, 0), MOEJIT_ENOTFOUND);
  uint64_t e = submit_ids(m, &s, 2, true);
  result re;
  T_CHECK(drain(m, e, &re));
  T_EQ_INT(re.ntok, 2);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
  gate_free(&g);
}

static void test_bad_arguments(void) {
  moejit *m = open_tiny(1, 4);
  moejit_request r;
  moejit_sampling s;
  uint64_t id;
#define BAD(want, text)                                                                                               \
  do {                                                                                                                \
    T_EQ_INT(moejit_submit(m, &r, &id), want);                                                                        \
    T_CHECK(strstr(moejit_last_error(), text) != NULL);                                                               \
    if (!strstr(moejit_last_error(), text)) fprintf(stderr, "  message: %s\n", moejit_last_error());                 \
  } while (0)
  moejit_request_init(&r);
  BAD(MOEJIT_EINVAL, "exactly one of prompt, prompt_ids and messages (0 given)");
  r.prompt = "x", r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT;
  BAD(MOEJIT_EINVAL, "(2 given)");
  r.prompt = NULL, r.max_tokens = -1;
  BAD(MOEJIT_EINVAL, "max_tokens is -1");
  r.max_tokens = 4;
  moejit_sampling_init(&s);
  s.top_p = 1.5f, r.sampling = &s;
  BAD(MOEJIT_EINVAL, "top_p 1.5");
  moejit_sampling_init(&s);
  s.temperature = -1;
  BAD(MOEJIT_EINVAL, "temperature -1");
  moejit_sampling_init(&s);
  s.min_p = 1;
  BAD(MOEJIT_EINVAL, "min_p in [0, 1)");
  moejit_sampling_init(&s);
  s.repeat_penalty = INFINITY; /* seen tokens' logits would go to 0, -inf or NaN */
  BAD(MOEJIT_EINVAL, "repeat_penalty inf");
  moejit_sampling_init(&s);
  s.temperature = INFINITY;
  BAD(MOEJIT_EINVAL, "temperature inf");
  moejit_sampling_init(&s);
  s.presence_penalty = 2.5f;
  BAD(MOEJIT_EINVAL, "presence_penalty 2.5, frequency_penalty 0: each must be in [-2, 2]");
  moejit_sampling_init(&s);
  s.frequency_penalty = -2.01f;
  BAD(MOEJIT_EINVAL, "frequency_penalty -2.01");
  r.sampling = NULL;
  r.logprobs = true, r.top_logprobs = 21;
  BAD(MOEJIT_EINVAL, "top_logprobs is 21 (0 to 20, and only with logprobs)");
  r.logprobs = false, r.top_logprobs = 2;
  BAD(MOEJIT_EINVAL, "top_logprobs is 2");
  r.top_logprobs = 0;
  r.hold_events = true, r.on_event = gate_cb;
  BAD(MOEJIT_EINVAL, "hold_events is for a polled request");
  r.hold_events = false, r.on_event = NULL;
  const char *empty[] = {""};
  r.stop = empty, r.n_stop = 1;
  BAD(MOEJIT_EINVAL, "stop string 0 is empty");
  r.stop = NULL, r.n_stop = 0, r.max_tokens = 60;
  BAD(MOEJIT_EINVAL, "prompt (6 tokens) + max_tokens 60 exceeds the context (64)");
  int32_t bad_ids[] = {1, 384};
  r.prompt_ids = bad_ids, r.n_prompt_ids = 2, r.max_tokens = 1;
  BAD(MOEJIT_EINVAL, "prompt token 1 is 384, outside the vocabulary (0..383)");
  r.prompt_ids = prompt, r.n_prompt_ids = 0;
  BAD(MOEJIT_EINVAL, "the prompt is empty");
  moejit_message bad_role[] = {{"wizard", "hi"}};
  r.prompt_ids = NULL, r.messages = bad_role, r.n_messages = 1;
  BAD(MOEJIT_EINVAL, "role 'wizard'");
#undef BAD
  T_EQ_INT(moejit_submit(NULL, &r, &id), MOEJIT_EINVAL);
  T_EQ_INT(moejit_submit(m, NULL, &id), MOEJIT_EINVAL);
  T_CHECK(strstr(moejit_last_error(), "NULL") != NULL);
  moejit_event ev;
  T_EQ_INT(moejit_poll(m, 12345, &ev, 0), MOEJIT_ENOTFOUND);
  T_EQ_INT(moejit_cancel(m, 12345), MOEJIT_ENOTFOUND);
  T_EQ_INT(moejit_release(m, 12345), MOEJIT_ENOTFOUND);
  int32_t out_of_vocab = 9999;
  char *text;
  T_EQ_INT(moejit_detokenize(m, &out_of_vocab, 1, false, &text, NULL), MOEJIT_EINVAL);
  moejit_stats st;
  moejit_get_stats(m, &st);
  T_EQ_INT(st.requests_submitted, 0);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);

  /* opening */
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.quiet = true;
  moejit *x = (moejit *)&o;
  T_EQ_INT(moejit_open(t_scratch("nothing-here"), &o, &x), MOEJIT_EMODEL);
  T_CHECK(x == NULL && strstr(moejit_last_error(), "nothing-here") != NULL);
  o.max_parallel = -1;
  T_EQ_INT(moejit_open(dir, &o, &x), MOEJIT_EINVAL);
  T_CHECK(strstr(moejit_last_error(), "max_parallel -1") != NULL);
  moejit_open_opts_init(&o);
  o.quiet = true, o.backend = MOEJIT_BACKEND_CUDA; /* the tiny model is too narrow for the GPU kernels */
  T_EQ_INT(moejit_open(dir, &o, &x), MOEJIT_ENOBACKEND);
  T_CHECK(strstr(moejit_last_error(), "GPU MoE kernels") != NULL);
  T_EQ_INT(moejit_open(dir, &o, NULL), MOEJIT_EINVAL);
  T_EQ_STR(moejit_status_name(MOEJIT_EQUEUE_FULL), "MOEJIT_EQUEUE_FULL");
  T_EQ_STR(moejit_strerror(MOEJIT_ECANCELLED), "the request was cancelled");
  T_EQ_INT(moejit_api_version(), MOEJIT_API_VERSION);
}

/* The engine thread cannot start (its stack cannot be had): the message is
 * pthread_create's own error, which it returns (errno says nothing). */
static void test_thread_start_error(void) {
  pthread_attr_t def, huge;
  T_EQ_INT(pthread_getattr_default_np(&def), 0);
  pthread_attr_init(&huge);
  pthread_attr_setstacksize(&huge, (size_t)1 << 62); /* past any address space: no mapping holds it */
  T_EQ_INT(pthread_setattr_default_np(&huge), 0);
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU, o.quiet = true;
  moejit *m = NULL;
  moejit_status st = moejit_open(dir, &o, &m);
  T_EQ_INT(pthread_setattr_default_np(&def), 0);
  pthread_attr_destroy(&huge), pthread_attr_destroy(&def);
  T_EQ_INT(st, MOEJIT_EINTERNAL);
  T_CHECK(m == NULL);
  char want[256];
  /* the waker starts first (it must be there before the engine's first step) */
  snprintf(want, sizeof want, "moejit: cannot start the engine's waker thread: %s", strerror(EAGAIN));
  T_EQ_STR(moejit_last_error(), want);
  if (st == MOEJIT_OK) moejit_close(m, 0);
}

/* ---- 8 threads at once ------------------------------------------------------------------ */
typedef struct worker {
  moejit *m;
  int t;
  int tokens[4], events[4];
  int finish[4];
  bool same[4], ok[4];
} worker;

static void *work(void *arg) {
  worker *w = arg;
  uint64_t id[4];
  moejit_sampling s = seeded(100 + w->t);
  for (int k = 0; k < 4; k++) {
    moejit_request r;
    moejit_request_init(&r);
    r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.sampling = &s, r.max_tokens = 3 + w->t + k, r.ignore_eos = true;
    if (moejit_submit(w->m, &r, &id[k])) id[k] = 0;
  }
  for (int k = 0; k < 4; k++) {
    result r;
    w->ok[k] = drain(w->m, id[k], &r);
    w->tokens[k] = r.last.completion_tokens, w->events[k] = r.nev, w->finish[k] = r.last.finish;
    int32_t want[16];
    by_hand(&s, 3 + w->t + k, want);
    w->same[k] = !memcmp(r.tok, want, (size_t)(3 + w->t + k) * sizeof *want);
  }
  return NULL;
}

/* Polled requests released while they run (a server's client gone
 * mid-stream): each has had tokens, so it may sit in the waker's list
 * when its last event comes; nothing may touch it after it is freed
 * (ASan in .ci/run), and the others go on. */
static void test_release_running(void) {
  moejit *m = open_tiny(4, 64);
  moejit_sampling s = seeded(9);
  moejit_event ev;
  for (int round = 0; round < 8; round++) {
    uint64_t id[4];
    for (int i = 0; i < 4; i++) id[i] = submit_ids(m, &s, 40, true);
    for (int i = 0; i < 4; i++) {
      T_EQ_INT(moejit_poll(m, id[i], &ev, 10000), MOEJIT_OK);
      T_EQ_INT(moejit_poll(m, id[i], &ev, 10000), MOEJIT_OK);
      T_EQ_INT(moejit_release(m, id[i]), MOEJIT_OK);
    }
  }
  uint64_t e = submit_ids(m, &s, 3, true);
  result re;
  T_CHECK(drain(m, e, &re));
  T_EQ_INT(re.ntok, 3);
  moejit_stats st;
  moejit_get_stats(m, &st);
  T_EQ_INT(st.requests_finished, 33);
  T_EQ_INT(st.running, 0);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* Chunked prefill (moejit_open_opts.prefill_chunk): a long prompt admitted
 * while another sequence decodes is fed in parts, one a step, beside that
 * sequence's rows, so the other keeps drawing tokens meanwhile; both draw
 * the tokens of their prompts run whole (by hand).  With prefill_chunk < 0
 * the prompt runs whole as a step of its own: the other draws nothing
 * meanwhile.  a's callback holds the engine at its second token while b is
 * submitted, so what follows does not depend on timing. */
typedef struct order_log {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t ids[256];
  int32_t tok[256];
  int n, finished, a_tokens;
  bool entered, open;
} order_log;
static void log_add(order_log *l, const moejit_event *ev) {
  if (ev->token >= 0 && l->n < 256) l->ids[l->n] = ev->id, l->tok[l->n++] = ev->token;
  l->finished += ev->finish != MOEJIT_FINISH_NONE;
  pthread_cond_broadcast(&l->cv);
}
static void log_event(const moejit_event *ev, void *user) {
  order_log *l = user;
  pthread_mutex_lock(&l->mu);
  log_add(l, ev);
  pthread_mutex_unlock(&l->mu);
}
static void log_event_gated(const moejit_event *ev, void *user) { /* a's: holds the engine at its 2nd token */
  order_log *l = user;
  pthread_mutex_lock(&l->mu);
  log_add(l, ev);
  if (ev->token >= 0 && ++l->a_tokens == 2) {
    l->entered = true;
    pthread_cond_broadcast(&l->cv);
    while (!l->open) pthread_cond_wait(&l->cv, &l->mu);
  }
  pthread_mutex_unlock(&l->mu);
}
static void run_chunked(int chunk, int *during, int32_t *toks_a, int32_t *toks_b, int *n_a, int *n_b,
                        moejit_stats *st) {
  enum { NA = 40, NB = 4, LONG = 40 };
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU, o.context_length = 64, o.max_parallel = 2, o.threads = 1, o.quiet = true;
  o.prefill_chunk = chunk;
  moejit *m = NULL;
  T_EQ_INT(moejit_open(dir, &o, &m), MOEJIT_OK);
  if (!m) return;
  order_log l = {.n = 0};
  pthread_mutex_init(&l.mu, NULL);
  pthread_cond_init(&l.cv, NULL);
  moejit_sampling s = seeded(5);
  int32_t longp[LONG];
  for (int i = 0; i < LONG; i++) longp[i] = prompt[i % NPROMPT] + i;
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.sampling = &s, r.max_tokens = NA, r.ignore_eos = true;
  r.on_event = log_event_gated, r.user = &l;
  uint64_t a = 0, b = 0;
  T_EQ_INT(moejit_submit(m, &r, &a), MOEJIT_OK);
  pthread_mutex_lock(&l.mu);
  while (!l.entered) pthread_cond_wait(&l.cv, &l.mu); /* the engine waits in a's 2nd token */
  int at_submit = l.n;
  pthread_mutex_unlock(&l.mu);
  r.prompt_ids = longp, r.n_prompt_ids = LONG, r.max_tokens = NB, r.on_event = log_event;
  T_EQ_INT(moejit_submit(m, &r, &b), MOEJIT_OK);
  pthread_mutex_lock(&l.mu);
  l.open = true;
  pthread_cond_broadcast(&l.cv);
  while (l.finished < 2) pthread_cond_wait(&l.cv, &l.mu);
  pthread_mutex_unlock(&l.mu);
  /* a's tokens after b's submission and before b's first */
  *during = 0, *n_a = 0, *n_b = 0;
  bool b_started = false;
  for (int i = 0; i < l.n; i++) {
    if (l.ids[i] == b) b_started = true;
    if (l.ids[i] == a && i >= at_submit && !b_started) ++*during;
    if (l.ids[i] == a && *n_a < NA) toks_a[(*n_a)++] = l.tok[i];
    if (l.ids[i] == b && *n_b < NB) toks_b[(*n_b)++] = l.tok[i];
  }
  moejit_get_stats(m, st);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
  pthread_mutex_destroy(&l.mu);
  pthread_cond_destroy(&l.cv);
}
static void test_chunked_prefill(void) {
  enum { NA = 40, NB = 4, LONG = 40 };
  int32_t want_a[NA], want_b[NB], longp[LONG], a[NA], b[NB];
  for (int i = 0; i < LONG; i++) longp[i] = prompt[i % NPROMPT] + i;
  moejit_sampling s = seeded(5);
  by_hand(&s, NA, want_a);
  by_hand_p(longp, LONG, &s, NB, want_b);
  /* parts of 4: b's prompt in 10 steps, each with a row of a's (its token
   * ahead of b's in the step that ends b's prompt); the rule (32 on the
   * CPU while a decodes): 32 and 8; whole: none of a's */
  static const struct { int chunk, during, prompt_steps; } runs[] = {
      {4, LONG / 4, (NPROMPT + 3) / 4 + LONG / 4}, /* a's own prompt: parts of 4 and 2 */
      {0, 2, 1 + 2},                               /* a's whole: nothing decodes yet */
      {-1, 0, 2},
  };
  for (size_t c = 0; c < MJ_ARRAY_LEN(runs); c++) {
    int during = -1, na = 0, nb = 0;
    moejit_stats st;
    memset(&st, 0, sizeof st);
    run_chunked(runs[c].chunk, &during, a, b, &na, &nb, &st);
    printf("  prefill_chunk %2d: a drew %d tokens while b's %d-token prompt was fed; prompt steps %llu\n",
           runs[c].chunk, during, LONG, (unsigned long long)st.prompt_steps);
    T_EQ_INT(na, NA);
    T_EQ_INT(nb, NB);
    T_CHECK(!memcmp(a, want_a, sizeof a));
    T_CHECK(!memcmp(b, want_b, sizeof b));
    T_EQ_INT(st.prompt_tokens, NPROMPT + LONG);
    T_EQ_INT(st.generated_tokens, NA + NB);
    T_EQ_INT(during, runs[c].during);
    T_EQ_INT(st.prompt_steps, runs[c].prompt_steps);
  }
  /* bad values */
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU, o.quiet = true, o.prefill_chunk = 65537;
  moejit *m = NULL;
  T_EQ_INT(moejit_open(dir, &o, &m), MOEJIT_EINVAL);
  T_CHECK(strstr(moejit_last_error(), "prefill_chunk 65537") != NULL);
}

static void test_threads(void) {
  moejit *m = open_tiny(4, 64);
  pthread_t th[8];
  worker w[8];
  double t0 = mj_now_ms();
  for (int t = 0; t < 8; t++) w[t] = (worker){.m = m, .t = t}, pthread_create(&th[t], NULL, work, &w[t]);
  uint64_t want = 0;
  for (int t = 0; t < 8; t++) {
    pthread_join(th[t], NULL);
    for (int k = 0; k < 4; k++) {
      T_CHECK(w[t].ok[k]);
      T_EQ_INT(w[t].tokens[k], 3 + t + k);
      T_EQ_INT(w[t].events[k], 3 + t + k);
      T_EQ_INT(w[t].finish[k], MOEJIT_FINISH_LENGTH);
      T_CHECK(w[t].same[k]);
      want += (uint64_t)(3 + t + k);
    }
  }
  moejit_stats st;
  moejit_get_stats(m, &st);
  T_EQ_INT(st.requests_submitted, 32);
  T_EQ_INT(st.requests_finished, 32);
  T_EQ_INT(st.generated_tokens, want);
  T_EQ_INT(st.prompt_tokens, 32 * NPROMPT);
  /* each prompt whole in one step (6 tokens, a step's budget 32), some
   * of them sharing a step */
  T_CHECK(st.prompt_steps >= 8 && st.prompt_steps <= 32);
  T_EQ_INT(st.decode_rows, want - 32); /* the first token of each comes from its prompt's step */
  T_EQ_INT(st.decode_step_le[MOEJIT_STEP_BUCKETS - 1], st.decode_steps);
  T_CHECK(st.decode_steps < st.decode_rows); /* steps carried several sequences */
  /* The engine's time between steps: counted between two decode steps in
   * a row only (each prompt step breaks the run), and never overlapping a
   * step, so steps and gaps together fit in the run's wall time. */
  double wall = mj_now_ms() - t0;
  T_CHECK(st.decode_gaps > 0 && st.decode_gaps < st.decode_steps);
  T_CHECK(st.decode_gap_ms_sum > 0 && st.events_ms_sum > 0);
  T_CHECK(st.decode_step_ms_sum + st.decode_gap_ms_sum <= wall);
  /* A token wakes its own poller only: the 8 pollers' waits ended by an
   * event of another request were most of them when all shared one
   * condition variable (a broadcast a token: 404 for these 256 tokens).
   * A few remain possible: a poller may take a token already queued
   * before the waker's signal for the one before reaches it. */
  uint64_t idle = api_idle_wakeups(m);
  if (idle * 8 > want) fprintf(stderr, "  %llu wakeups without an event\n", (unsigned long long)idle);
  T_CHECK(idle * 8 <= want);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
}

/* ---- a sharded engine ------------------------------------------------------------------- */
/* One rank of a sharded engine (api_start's tp; on the CPU the session
 * runs whole, but the API takes its seeds as a rank's would), self-seeded
 * (c NULL, as generate's ranks) or a server's rank 0 or follower (ctl.h). */
static moejit *open_sharded(int64_t default_seed, int tp, int rank, ctl *c, mj_err *err) {
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU, o.context_length = 64, o.max_parallel = 2, o.threads = 1, o.quiet = true;
  o.default_sampling.seed = default_seed;
  moejit *m = NULL;
  T_CHECK(api_load(dir, &o, &m, err) == 0);
  api_start_opts x = {.tp = tp, .rank = rank, .ctl = c, .follow = c && rank > 0};
  if (m && api_start(m, &x, err)) api_close(m, 0, NULL), m = NULL;
  return m;
}

/* The ranks of a sharded engine must draw the same tokens, and a request
 * without a seed took one from the clock, which differs between them.  On
 * a self-seeded rank (each rank runs its own copy of the requests, as
 * generate's do) it comes from the open's default seed and the request's
 * id, so two ranks given the same requests draw alike (and the requests of
 * one rank differ); a default seed from the clock is refused there.  An
 * engine alone keeps the clock's seeds, and so does a server's rank 0,
 * whose followers take its seeds with each admission (ctl.h). */
static void test_sharded_seedless(void) {
  mj_err err = {0};
  moejit *unseeded = open_sharded(-1, 2, 0, NULL, &err);
  T_CHECK(unseeded == NULL);
  if (unseeded) api_close(unseeded, 0, NULL);
  T_EQ_INT(err.code, MJ_EUSAGE);
  T_CHECK(strstr(err.msg, "needs default_sampling.seed >= 0") != NULL);
  mj_err_clear(&err);
  moejit_sampling none = seeded(-1);
  result got[2][2];
  for (int rank = 0; rank < 2; rank++) {
    moejit *m = open_sharded(11, 2, rank, NULL, &err);
    T_CHECK(m != NULL);
    if (!m) return;
    uint64_t a = submit_ids(m, &none, 12, true), b = submit_ids(m, &none, 12, true);
    T_CHECK(drain(m, a, &got[rank][0]) && drain(m, b, &got[rank][1]));
    T_EQ_INT(api_close(m, 0, &err), 0);
  }
  for (int k = 0; k < 2; k++) T_CHECK(got[0][k].ntok == 12 && !memcmp(got[0][k].tok, got[1][k].tok, sizeof got[0][k].tok));
  T_CHECK(memcmp(got[0][0].tok, got[0][1].tok, sizeof got[0][0].tok) != 0);
  result alone[2];
  for (int run = 0; run < 2; run++) { /* alone: the clock's */
    moejit *m = open_sharded(11, 1, 0, NULL, &err);
    T_CHECK(m != NULL);
    if (!m) return;
    T_CHECK(drain(m, submit_ids(m, &none, 12, true), &alone[run]));
    T_EQ_INT(api_close(m, 0, &err), 0);
  }
  T_CHECK(memcmp(alone[0].tok, alone[1].tok, sizeof alone[0].tok) != 0);
  /* A server's ranks: a follower whose default seed is the clock's is
   * accepted, and rank 0's seedless request (the clock's seed, not the one
   * a self-seeded rank 0 of the same default seed drew) is replayed by the
   * follower token for token (its engine checks every token). */
  ctl *lc = NULL, *fc = NULL;
  T_EQ_INT(ctl_pair(&lc, &fc, &err), 0);
  moejit *f = open_sharded(-1, 2, 1, fc, &err), *m = open_sharded(11, 2, 0, lc, &err);
  T_CHECK(f && m);
  result r;
  if (m) T_CHECK(drain(m, submit_ids(m, &none, 12, true), &r));
  if (m) T_CHECK(r.ntok == 12 && memcmp(r.tok, got[0][0].tok, sizeof r.tok) != 0);
  if (m) T_EQ_INT(moejit_close(m, -1), MOEJIT_OK); /* its end message ends the follower's engine */
  else ctl_close(lc), lc = NULL;                    /* as would a rank 0 gone */
  if (f) {
    mj_err fe = {0};
    T_EQ_INT(api_follow_wait(f, &fe), 0);
    if (fe.code) fprintf(stderr, "  follower: %s\n", fe.msg);
    mj_err_clear(&fe);
    api_close(f, 0, NULL);
  }
  ctl_close(lc), ctl_close(fc);
  mj_err_clear(&err);
}

/* ---- parked events ------------------------------------------------------------------------ */
static void *drain_one(void *arg) {
  moejit *m = arg;
  moejit_sampling s = seeded(3);
  result r;
  bool *ok = mj_xmalloc(sizeof *ok);
  *ok = drain(m, submit_ids(m, &s, 2, true), &r);
  return ok;
}

/* A polled event's text lives until the same thread's next poll or release
 * on the same handle, or the close of that handle, or the thread's exit:
 * threads that poll and go (a server's connections) leave nothing parked,
 * and one thread polling two handles keeps an event of each. */
static void test_parked(void) {
  size_t base = api_parked_events();
  moejit *m1 = open_tiny(2, 64), *m2 = open_tiny(1, 4);
  pthread_t th[16];
  for (int t = 0; t < 16; t++) pthread_create(&th[t], NULL, drain_one, m1);
  for (int t = 0; t < 16; t++) {
    void *ok;
    pthread_join(th[t], &ok);
    T_CHECK(*(bool *)ok);
    free(ok);
  }
  T_EQ_INT(api_parked_events(), base); /* each thread's last event went with it */
  moejit_event ev1;
  uint64_t c = submit_ids(m1, NULL, 1, true), b = submit_ids(m2, NULL, 3, true);
  T_EQ_INT(moejit_poll(m1, c, &ev1, 10000), MOEJIT_OK); /* c's last event: its text parked */
  T_EQ_INT(ev1.finish, MOEJIT_FINISH_LENGTH);
  char keep[256];
  snprintf(keep, sizeof keep, "%.*s", (int)ev1.text_len, ev1.text);
  T_EQ_INT(api_parked_events(), base + 1);
  result rb;
  T_CHECK(drain(m2, b, &rb)); /* another handle's polls leave m1's event alone */
  T_EQ_INT(api_parked_events(), base + 2);
  T_CHECK(strlen(ev1.text) == ev1.text_len && !strcmp(ev1.text, keep));
  /* A stream polled token by token: each event takes the place of the one
   * before (one event of m2 parked throughout); a poll that takes nothing
   * frees it. */
  uint64_t d = submit_ids(m2, NULL, 4, true);
  for (int i = 0; i < 4; i++) {
    moejit_event ev;
    T_EQ_INT(moejit_poll(m2, d, &ev, 10000), MOEJIT_OK);
    T_EQ_INT(ev.finish, i < 3 ? MOEJIT_FINISH_NONE : MOEJIT_FINISH_LENGTH);
    T_EQ_INT(api_parked_events(), base + 2);
  }
  moejit_event ev2;
  T_EQ_INT(moejit_poll(m2, d, &ev2, 0), MOEJIT_ENOTFOUND); /* d's last event is taken: d is forgotten */
  T_EQ_INT(api_parked_events(), base + 1);
  T_CHECK(strlen(ev1.text) == ev1.text_len && !strcmp(ev1.text, keep)); /* m1's event stays */
  T_EQ_INT(moejit_close(m1, 0), MOEJIT_OK); /* frees this thread's event of m1 */
  T_EQ_INT(api_parked_events(), base);
  T_CHECK(drain(m2, submit_ids(m2, NULL, 2, true), &rb));
  T_EQ_INT(api_parked_events(), base + 1);
  T_EQ_INT(moejit_close(m2, 0), MOEJIT_OK);
  T_EQ_INT(api_parked_events(), base);
}

/* Many requests known at once (the table of ids grows past its first
 * size): each found by poll, cancel and release, in any order. */
static void test_many_known(void) {
  moejit *m = open_tiny(4, 1024);
  gate g;
  gate_init(&g);
  submit_gated(m, &g, 1);
  gate_wait_entered(&g); /* nothing runs until the gate opens */
  enum { N = 300 };
  uint64_t id[N];
  for (int i = 0; i < N; i++) id[i] = submit_ids(m, NULL, 1, true);
  for (int i = 0; i < N; i += 3) T_EQ_INT(moejit_cancel(m, id[i]), MOEJIT_OK);
  for (int i = 1; i < N; i += 3) T_EQ_INT(moejit_release(m, id[i]), MOEJIT_OK);
  gate_open(&g);
  int ok = 0;
  for (int i = N - 1; i >= 0; i--) {
    if (i % 3 == 1) {
      moejit_event ev;
      ok += moejit_poll(m, id[i], &ev, 0) == MOEJIT_ENOTFOUND;
      continue;
    }
    result r;
    ok += drain(m, id[i], &r) && r.last.finish == (i % 3 == 0 ? MOEJIT_FINISH_CANCELLED : MOEJIT_FINISH_LENGTH);
  }
  T_EQ_INT(ok, N);
  moejit_stats st;
  moejit_get_stats(m, &st);
  T_EQ_INT(st.requests_finished, N + 1);
  T_EQ_INT(moejit_close(m, 0), MOEJIT_OK);
  gate_free(&g);
}

/* ---- closing with requests running --------------------------------------------------------- */
typedef struct counter {
  pthread_mutex_t mu;
  int events, last[5];
} counter;

static void count_cb(const moejit_event *ev, void *user) {
  counter *c = user;
  pthread_mutex_lock(&c->mu);
  c->events++;
  if (ev->finish) c->last[ev->finish]++;
  pthread_mutex_unlock(&c->mu);
}

/* Opens the gate once close has begun: when moejit_submit says
 * MOEJIT_ECLOSED (close cannot free the handle while the engine waits in
 * the gate).  What it submits before that waits and is cancelled too,
 * counted apart. */
typedef struct opener {
  moejit *m;
  gate *g;
  counter extra;
} opener;

static void *open_when_closing(void *arg) {
  opener *o = arg;
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.max_tokens = 2;
  r.on_event = count_cb, r.user = &o->extra;
  uint64_t id;
  struct timespec t = {0, 1000000L};
  while (moejit_submit(o->m, &r, &id) != MOEJIT_ECLOSED) nanosleep(&t, NULL);
  gate_open(o->g);
  return NULL;
}

/* Close with a polled request live and its events left untaken, and 5
 * requests with callbacks: with drain 0 the first of them holds the engine
 * in its callback until close has begun, so every other one is cancelled
 * unrun. */
static void close_with(int drain_ms, counter *c, gate *g) {
  moejit *m = open_tiny(2, 16);
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  uint64_t polled = submit_ids(m, NULL, 20, true);
  moejit_event ev;
  T_EQ_INT(moejit_poll(m, polled, &ev, 10000), MOEJIT_OK);
  if (g) submit_gated(m, g, 20), gate_wait_entered(g);
  moejit_request r;
  moejit_request_init(&r);
  r.prompt_ids = prompt, r.n_prompt_ids = NPROMPT, r.max_tokens = 20, r.ignore_eos = true;
  r.on_event = count_cb, r.user = c;
  uint64_t id;
  for (int i = 0; i < 4; i++) T_EQ_INT(moejit_submit(m, &r, &id), MOEJIT_OK);
  pthread_t th;
  opener op = {.m = m, .g = g};
  pthread_mutex_init(&op.extra.mu, NULL);
  if (g) pthread_create(&th, NULL, open_when_closing, &op);
  T_EQ_INT(moejit_close(m, drain_ms), MOEJIT_OK);
  if (g) pthread_join(th, NULL);
  T_EQ_INT(op.extra.events, op.extra.last[MOEJIT_FINISH_CANCELLED]); /* each ended at once, unrun */
  pthread_mutex_destroy(&op.extra.mu);
  pthread_mutex_destroy(&c->mu);
}

static void test_close_running(void) {
  counter c;
  gate g;
  gate_init(&g);
  close_with(0, &c, &g);
  T_EQ_INT(c.last[MOEJIT_FINISH_CANCELLED], 4);
  T_EQ_INT(c.events, 4);
  T_EQ_INT(g.events, 2);
  T_EQ_INT(g.last, MOEJIT_FINISH_CANCELLED);
  gate_free(&g);
  close_with(-1, &c, NULL); /* drained: all run to their end */
  T_EQ_INT(c.last[MOEJIT_FINISH_LENGTH], 4);
  T_EQ_INT(c.events, 4 * 20);
}

/* ---- a sharded server's ranks (ctl.h) --------------------------------------------------- */
/* The tiny model at d opened as a rank of a sharded server: rank 0, which
 * sends its engine's decisions through c, or a follower replaying them. */
static moejit *open_rank(const char *d, ctl *c, bool follow) {
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU;
  o.context_length = 64;
  o.max_parallel = 4;
  o.max_queue = 64;
  o.threads = 1;
  o.quiet = true;
  moejit *m = NULL;
  mj_err err = {0};
  int r = api_load(d, &o, &m, &err);
  api_start_opts x = {.ctl = c, .follow = follow, .rank = follow ? 1 : 0};
  if (!r) r = api_start(m, &x, &err);
  if (r) fprintf(stderr, "open_rank: %s\n", err.msg);
  mj_err_clear(&err);
  T_CHECK(!r && m);
  return m;
}

/* A follower's end (api_follow_wait), its counters, then api_close: the
 * follower's error, or 0. */
static int follower_end(moejit *f, moejit_stats *st, mj_err *err) {
  int rc = api_follow_wait(f, err);
  moejit_get_stats(f, st);
  api_close(f, 0, NULL);
  return rc;
}

/* A follower replays rank 0's schedule: eight polling threads' requests,
 * sequences joining and leaving at every step, and requests released
 * mid-stream (cancelled at a step boundary).  The follower's own draws
 * must equal every token rank 0 feeds it (else its engine stops with the
 * error), and its steps and rows are rank 0's. */
static void test_follow(void) {
  ctl *lc = NULL, *fc = NULL;
  mj_err err = {0};
  T_EQ_INT(ctl_pair(&lc, &fc, &err), 0);
  moejit *f = open_rank(dir, fc, true), *m = open_rank(dir, lc, false);
  moejit_sampling s0 = seeded(1);
  moejit_request rq;
  moejit_request_init(&rq);
  rq.prompt_ids = prompt, rq.n_prompt_ids = NPROMPT, rq.sampling = &s0;
  uint64_t none;
  T_EQ_INT(moejit_submit(f, &rq, &none), MOEJIT_EINVAL);
  T_CHECK(strstr(moejit_last_error(), "a follower rank takes no requests") != NULL);
  pthread_t th[8];
  worker w[8];
  for (int t = 0; t < 8; t++) w[t] = (worker){.m = m, .t = t}, pthread_create(&th[t], NULL, work, &w[t]);
  moejit_sampling s = seeded(9);
  moejit_event ev;
  for (int i = 0; i < 4; i++) {
    uint64_t id = submit_ids(m, &s, 40, true);
    T_EQ_INT(moejit_poll(m, id, &ev, 10000), MOEJIT_OK);
    T_EQ_INT(moejit_release(m, id), MOEJIT_OK);
  }
  for (int t = 0; t < 8; t++) {
    pthread_join(th[t], NULL);
    for (int k = 0; k < 4; k++) T_CHECK(w[t].ok[k] && w[t].same[k]);
  }
  moejit_stats ls, fs;
  do /* the released requests end at a step boundary */
    moejit_get_stats(m, &ls);
  while (ls.running || ls.queue_depth);
  T_EQ_INT(moejit_close(m, -1), MOEJIT_OK); /* its end message ends the follower's engine */
  mj_err ce = {0};
  T_EQ_INT(follower_end(f, &fs, &ce), 0);
  if (ce.code) fprintf(stderr, "  follower: %s\n", ce.msg);
  mj_err_clear(&ce);
  T_CHECK(ls.decode_steps > 40 && ls.prompt_steps == 36);
  T_EQ_INT(fs.decode_steps, ls.decode_steps);
  T_EQ_INT(fs.decode_rows, ls.decode_rows);
  T_EQ_INT(fs.prompt_steps, ls.prompt_steps);
  T_EQ_INT(fs.prompt_tokens, ls.prompt_tokens);
  T_EQ_INT(fs.generated_tokens, ls.generated_tokens);
  ctl_close(lc), ctl_close(fc);

  /* A follower whose weights differ (another seed of the model) draws
   * other tokens: it stops at the first one rank 0 feeds, with the line
   * saying so, while rank 0 finishes its requests. */
  T_EQ_INT(ctl_pair(&lc, &fc, &err), 0);
  f = open_rank(dir2, fc, true), m = open_rank(dir, lc, false);
  uint64_t id = submit_ids(m, &s, 12, true);
  result r;
  T_CHECK(drain(m, id, &r));
  T_EQ_INT(r.last.finish, MOEJIT_FINISH_LENGTH);
  T_EQ_INT(moejit_close(m, -1), MOEJIT_OK);
  T_EQ_INT(follower_end(f, &fs, &ce), MJ_EINTERNAL);
  T_CHECK(strstr(ce.msg, "rank 1 drew token") && strstr(ce.msg, "the ranks' logits have parted"));
  T_CHECK(fs.decode_steps < 11);
  mj_err_clear(&ce);
  ctl_close(lc), ctl_close(fc);

  /* A follower gone: rank 0's request fails at its admission, and rank 0
   * takes no request again. */
  T_EQ_INT(ctl_pair(&lc, &fc, &err), 0);
  ctl_close(fc);
  m = open_rank(dir, lc, false);
  id = submit_ids(m, &s, 4, true);
  T_EQ_INT(moejit_poll(m, id, &ev, 10000), MOEJIT_OK); /* its first event is its last */
  T_EQ_INT(ev.finish, MOEJIT_FINISH_ERROR);
  T_CHECK(strstr(ev.error, "a follower rank is gone") != NULL);
  T_EQ_INT(moejit_submit(m, &rq, &none), MOEJIT_EBACKEND);
  T_CHECK(strstr(moejit_last_error(), "a follower rank of this sharded engine is gone") != NULL);
  moejit_close(m, 0);
  ctl_close(lc);

  /* Rank 0 gone without its end message (a crash): the follower's engine
   * stops with the line that says so. */
  T_EQ_INT(ctl_pair(&lc, &fc, &err), 0);
  f = open_rank(dir, fc, true);
  ctl_close(lc);
  T_EQ_INT(follower_end(f, &fs, &ce), MJ_EIO);
  T_CHECK(strstr(ce.msg, "rank 0 closed the control socket") != NULL);
  mj_err_clear(&ce);
  ctl_close(fc);
  mj_err_clear(&err);
}

int main(void) {
  if (t_scratch_init("api")) return 1;
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.seed = 5;
  snprintf(dir, sizeof dir, "%s/m", t_root);
  mj_err err = {0};
  if (mkmodel_write(&s, dir, true, NULL, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  s.seed = 6;
  snprintf(dir2, sizeof dir2, "%s/m2", t_root);
  if (mkmodel_write(&s, dir2, true, NULL, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  T_RUN(test_info_and_text);
  T_RUN(test_determinism);
  T_RUN(test_same_as_generate);
  T_RUN(test_stop_strings);
  T_RUN(test_logprobs);
  T_RUN(test_penalties);
  T_RUN(test_queue_full_and_timeout);
  T_RUN(test_cancel);
  T_RUN(test_hold);
  T_RUN(test_release_running);
  T_RUN(test_bad_arguments);
  T_RUN(test_thread_start_error);
  T_RUN(test_threads);
  T_RUN(test_chunked_prefill);
  T_RUN(test_sharded_seedless);
  T_RUN(test_parked);
  T_RUN(test_many_known);
  T_RUN(test_close_running);
  T_RUN(test_follow);
  return t_scratch_done(t_status());
}
