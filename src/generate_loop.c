/* generate_loop.c: the loop of `moejit generate`, for one prompt or many,
 * on the C API.
 *
 * Every prompt is one request submitted to the engine before it starts, so
 * the engine admits them in order into its slots, as many at once as it
 * has, and every rank of a sharded run schedules them alike.  The engine
 * (src/api.c) runs each admitted prompt as a step of its own, then decode
 * steps with one row per live sequence, whatever their lengths; a sequence
 * that ends (an end-of-sequence id or -n tokens) frees its slot at once
 * and the next prompt joins before the next step.  One prompt (-p) is the
 * case of one slot and one prompt: its text streams, from the engine's
 * callback, as it forms, and the speed line follows.  Each prompt's
 * sampler is seeded with the seed plus the prompt's index (the engine
 * draws on the device when it can, session.h).  On the CPU each live
 * sequence runs on its own cache, so a batched prompt's tokens equal its
 * single run exactly and the tests check the scheduling so.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "json.h"

typedef struct gen_wait {
  const gen_opts *o;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int left; /* requests without their last event */
} gen_wait;

typedef struct gen_job {
  gen_wait *w;
  gen_seq *q;
} gen_job;

/* An event of one prompt's request, on the engine thread. */
static void on_event(const moejit_event *ev, void *user) {
  gen_job *j = user;
  gen_seq *q = j->q;
  const gen_opts *o = j->w->o;
  if (ev->token >= 0) tok_ids_push(&q->gen, ev->token);
  if (ev->text_len) {
    mj_buf_put(&q->text, ev->text, ev->text_len);
    if (o->stream && !o->as_json) {
      fwrite(ev->text, 1, ev->text_len, stdout);
      if (!ev->finish) fflush(stdout);
    }
  }
  if (!ev->finish) return;
  q->stop = ev->finish == MOEJIT_FINISH_LENGTH ? "length" : "eos";
  q->failed = ev->finish != MOEJIT_FINISH_STOP && ev->finish != MOEJIT_FINISH_LENGTH;
  q->prompt_ms = ev->prompt_ms, q->decode_ms = ev->decode_ms;
  pthread_mutex_lock(&j->w->mu);
  j->w->left--;
  pthread_cond_signal(&j->w->cv);
  pthread_mutex_unlock(&j->w->mu);
}

/* The tokens generated, as a JSON list's items. */
static void put_tokens(mj_buf *j, const gen_seq *q) {
  for (size_t i = 0; i < q->gen.n; i++) mj_buf_printf(j, "%s%d", i ? "," : "", q->gen.v[i]);
}

static void print_results(const gen_opts *o, const moejit_info *in, const moejit_stats *st, gen_seq *s, int np,
                          double ms) {
  const char *backend = in->backend;
  if (o->stream) { /* the one prompt */
    gen_seq *q = &s[0];
    int64_t n_gen = (int64_t)q->gen.n;
    double t_prompt = q->prompt_ms, t_decode = q->decode_ms;
    double pps = q->n_prompt / (t_prompt / 1000.0), dps = n_gen > 0 ? n_gen / (t_decode / 1000.0) : 0;
    if (o->as_json) {
      mj_buf j = {0};
      mj_buf_puts(&j, "{\"text\":");
      json_write_str(&j, q->text.data ? q->text.data : "", q->text.len);
      mj_buf_printf(&j, ",\"tokens\":[");
      put_tokens(&j, q);
      mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\","
                        "\"prompt_ms\":%.3f,\"decode_ms\":%.3f,\"prompt_tokens_per_s\":%.2f,\"decode_tokens_per_s\":%.2f,\"model\":",
                    q->n_prompt, (long long)n_gen, q->stop, backend, t_prompt, t_decode, pps, dps);
      json_write_str(&j, o->model_dir, strlen(o->model_dir));
      mj_buf_puts(&j, "}\n");
      fputs(j.data, stdout);
      mj_buf_free(&j);
    } else {
      printf("\n");
      fflush(stdout);
      if (!o->quiet)
        fprintf(stderr, "moejit: prompt %zu tokens in %.1f ms (%.1f tok/s), generated %lld tokens in %.1f ms (%.2f tok/s), stop: %s, backend %s\n",
                q->n_prompt, t_prompt, pps, (long long)n_gen, t_decode, dps, q->stop, backend);
    }
    return;
  }
  int64_t gen = 0;
  for (int k = 0; k < np; k++) {
    gen_seq *q = &s[k];
    gen += (int64_t)q->gen.n;
    if (o->as_json) {
      mj_buf j = {0};
      mj_buf_printf(&j, "{\"index\":%d,\"text\":", k);
      json_write_str(&j, q->text.data ? q->text.data : "", q->text.len);
      mj_buf_puts(&j, ",\"tokens\":[");
      put_tokens(&j, q);
      mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\"}\n",
                    q->n_prompt, (long long)q->gen.n, q->stop, backend);
      fputs(j.data, stdout);
      mj_buf_free(&j);
    } else {
      printf("[%d] %.*s\n", k, (int)q->text.len, q->text.data ? q->text.data : "");
    }
  }
  fflush(stdout);
  int steps = (int)st->decode_steps;
  if (!o->quiet)
    fprintf(stderr, "moejit: %d prompts, %d at a time: %lld tokens in %.1f ms (%.2f tok/s), %d decode steps of %.1f rows "
                    "on average (%.1f us each, %.1f us of the engine's between them), backend %s\n",
            np, in->max_parallel, (long long)gen, ms, gen / (ms / 1000.0), steps,
            steps ? (double)st->decode_rows / steps : 0.0, steps ? 1000 * st->decode_step_ms_sum / steps : 0.0,
            st->decode_gaps ? 1000 * st->decode_gap_ms_sum / (double)st->decode_gaps : 0.0, backend);
}

int gen_run(const gen_opts *o, moejit *A, gen_seq *s, int np, mj_err *err) {
  gen_wait w = {.o = o, .left = 0};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  gen_job *jobs = mj_xcalloc((size_t)np, sizeof *jobs);
  int rc = 0;
  double t0 = mj_now_ms();
  for (int k = 0; k < np && !rc; k++) {
    moejit_sampling sp = o->sp;
    sp.seed = (int64_t)(((uint64_t)o->sp.seed + (uint64_t)k) & INT64_MAX);
    moejit_request r;
    moejit_request_init(&r);
    r.prompt_ids = s[k].prompt, r.n_prompt_ids = s[k].n_prompt;
    r.sampling = &sp;
    r.max_tokens = o->n_predict > 0 ? (int32_t)o->n_predict : 1; /* -n 0 has always drawn the one token of the prompt's step */
    r.ignore_eos = o->ignore_eos;
    jobs[k] = (gen_job){&w, &s[k]};
    r.on_event = on_event, r.user = &jobs[k];
    uint64_t id;
    pthread_mutex_lock(&w.mu);
    w.left++;
    pthread_mutex_unlock(&w.mu);
    if (moejit_submit(A, &r, &id)) {
      rc = mj_fail(err, api_last_code(), "%s", moejit_last_error());
      pthread_mutex_lock(&w.mu);
      w.left--;
      pthread_mutex_unlock(&w.mu);
    }
  }
  api_resume(A);
  pthread_mutex_lock(&w.mu);
  while (w.left > 0) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  double ms = mj_now_ms() - t0;
  bool failed = false;
  for (int k = 0; k < np; k++) failed |= s[k].failed;
  if (!rc && !failed) {
    moejit_info in;
    moejit_stats st;
    moejit_get_info(A, &in);
    moejit_get_stats(A, &st);
    print_results(o, &in, &st, s, np, ms);
  }
  free(jobs);
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
  return rc;
}
