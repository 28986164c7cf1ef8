/* simple.c: the smallest program on moejit's C API (include/moejit.h).
 *
 * It opens the built-in model on the CPU, then two threads submit one
 * request each at the same time, with their own seeds: the first takes its
 * tokens through a callback (called on the engine thread), the second by
 * polling its queue.  Both texts are printed.  Then each request runs
 * again alone, and the program checks that the text is the same (a seed
 * reproduces a request whatever else shares the engine): exit status 0
 * when both match, 1 when not, 2 when the API failed.  make check runs it
 * (tests/example_simple.sh).
 *
 *   cc simple.c $(pkg-config --cflags --static --libs moejit)
 */
#include <moejit.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one request produced, filled by either delivery. */
typedef struct job {
  moejit *m;
  const char *prompt;
  int64_t seed;
  int by_callback;
  char text[8192];
  size_t len;
  int tokens;
  moejit_status status;
  /* the callback's end, signalled to the submitting thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} job;

static void add_text(job *j, const moejit_event *ev) {
  if (j->len + ev->text_len < sizeof j->text) memcpy(j->text + j->len, ev->text, ev->text_len), j->len += ev->text_len;
  j->tokens = ev->completion_tokens;
}

/* Called on the engine thread, once per token and once at the end. */
static void on_event(const moejit_event *ev, void *user) {
  job *j = user;
  add_text(j, ev);
  if (ev->finish == MOEJIT_FINISH_NONE) return;
  pthread_mutex_lock(&j->mu);
  j->status = ev->status;
  j->done = 1;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

static void *run(void *arg) {
  job *j = arg;
  j->len = 0, j->done = 0;
  moejit_sampling s;
  moejit_sampling_init(&s);
  s.temperature = 0.8f, s.top_p = 0.95f, s.seed = j->seed;
  moejit_request r;
  moejit_request_init(&r);
  r.prompt = j->prompt;
  r.sampling = &s;
  r.max_tokens = 24;
  if (j->by_callback) r.on_event = on_event, r.user = j;
  uint64_t id;
  if ((j->status = moejit_submit(j->m, &r, &id))) {
    fprintf(stderr, "simple: submit: %s\n", moejit_last_error());
    return NULL;
  }
  if (j->by_callback) {
    pthread_mutex_lock(&j->mu);
    while (!j->done) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    return NULL;
  }
  for (;;) {
    moejit_event ev;
    if ((j->status = moejit_poll(j->m, id, &ev, -1))) {
      fprintf(stderr, "simple: poll: %s\n", moejit_last_error());
      return NULL;
    }
    add_text(j, &ev);
    if (ev.finish != MOEJIT_FINISH_NONE) {
      j->status = ev.status;
      return NULL;
    }
  }
}

int main(void) {
  moejit_open_opts o;
  moejit_open_opts_init(&o);
  o.backend = MOEJIT_BACKEND_CPU;
  o.max_parallel = 2;
  o.quiet = 1;
  moejit *m;
  if (moejit_open(NULL, &o, &m) != MOEJIT_OK) {
    fprintf(stderr, "simple: %s\n", moejit_last_error());
    return 2;
  }
  job jobs[2] = {{.m = m, .prompt = "The quick brown fox", .seed = 1, .by_callback = 1},
                 {.m = m, .prompt = "Once upon a time", .seed = 2, .by_callback = 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    pthread_mutex_init(&jobs[i].mu, NULL);
    pthread_cond_init(&jobs[i].cv, NULL);
    pthread_create(&th[i], NULL, run, &jobs[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  char together[2][8192];
  size_t len[2];
  int rc = 0;
  for (int i = 0; i < 2; i++) {
    if (jobs[i].status != MOEJIT_OK) rc = 2;
    printf("[%s, seed %lld, %d tokens] %s%.*s\n", jobs[i].by_callback ? "callback" : "poll", (long long)jobs[i].seed,
           jobs[i].tokens, jobs[i].prompt, (int)jobs[i].len, jobs[i].text);
    memcpy(together[i], jobs[i].text, jobs[i].len), len[i] = jobs[i].len;
  }
  /* Each again, alone: the same seed must give the same text. */
  for (int i = 0; i < 2 && !rc; i++) {
    run(&jobs[i]);
    if (jobs[i].status != MOEJIT_OK) rc = 2;
    else if (jobs[i].len != len[i] || memcmp(jobs[i].text, together[i], len[i])) {
      fprintf(stderr, "simple: request %d alone gave other text: %.*s\n", i, (int)jobs[i].len, jobs[i].text);
      rc = 1;
    }
  }
  moejit_stats st;
  moejit_get_stats(m, &st);
  printf("%llu requests, %llu tokens generated, %llu decode steps\n", (unsigned long long)st.requests_finished,
         (unsigned long long)st.generated_tokens, (unsigned long long)st.decode_steps);
  if (moejit_close(m, 0) != MOEJIT_OK) rc = 2;
  for (int i = 0; i < 2; i++) pthread_mutex_destroy(&jobs[i].mu), pthread_cond_destroy(&jobs[i].cv);
  if (!rc) printf("ok: each text equals its request run alone\n");
  return rc;
}
