/* generate_loop.c: the loop of `moejit generate`, for one prompt or many.
 *
 * Up to the session's slots sequences are live at once, each in its own
 * cache slot.  A free slot takes the next prompt (its prompt runs on its
 * own, as rows of that slot), then every decode step runs one row per live
 * sequence, whatever their lengths; a sequence that ends (an end-of-
 * sequence id or -n tokens) frees its slot at once and the next prompt
 * joins before the next step.  One prompt (-p) is the case of one slot
 * and one prompt: its text streams as it forms and the speed line follows.
 * Each prompt's sampler is seeded with the seed plus the prompt's index
 * (the session draws on the device when it can, session.h).  On the CPU
 * each live sequence runs on its own cache, so a batched prompt's tokens
 * equal its single run exactly and the tests check the scheduling so.
 */
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "json.h"

/* Take id into seq q; true when q has ended. */
static bool take(const gen_opts *o, gen_seq *q, int32_t id) {
  bool eos = o->have_chat && chat_is_eos(o->cf, id);
  for (int i = 0; i < o->cfg->n_eos; i++) eos |= id == o->cfg->eos_token_id[i];
  if (eos) return q->stop = "eos", true;
  tok_ids_push(&q->ids, id);
  q->n_gen++;
  mj_buf piece = {0};
  if (tok_decode_stream(&q->ts, id, &piece)) {
    mj_buf_put(&q->text, piece.data, piece.len);
    if (o->stream && !o->as_json) {
      fwrite(piece.data, 1, piece.len, stdout);
      fflush(stdout);
    }
  }
  mj_buf_free(&piece);
  if (q->n_gen >= o->n_predict) return q->stop = "length", true;
  return false;
}

static void finish(const gen_opts *o, session *S, gen_seq *q) {
  mj_buf piece = {0};
  if (tok_stream_finish(&q->ts, &piece)) {
    mj_buf_put(&q->text, piece.data, piece.len);
    if (o->stream && !o->as_json) fwrite(piece.data, 1, piece.len, stdout);
  }
  mj_buf_free(&piece);
  sess_retire(S, q->slot);
  q->done = true, q->slot = -1;
  q->t_end = mj_now_ms();
}

/* Admit prompt k into a free slot and run its prompt; its first id is
 * drawn and taken. */
static int admit(const gen_opts *o, session *S, gen_seq *q, int k, mj_err *err) {
  sample_params sp = o->sp;
  sp.seed = o->sp.seed + (uint64_t)k;
  q->t_admit = mj_now_ms();
  int rc = sess_admit(S, &sp, &q->slot, err);
  if (rc) return rc;
  size_t n = q->ids.n;
  int32_t *slot = mj_xmalloc(n * sizeof *slot), *ids = mj_xmalloc(n * sizeof *ids);
  for (size_t i = 0; i < n; i++) slot[i] = q->slot;
  rc = sess_step(S, q->ids.v, slot, (int)n, ids, NULL, err);
  int32_t id = ids[n - 1];
  free(slot), free(ids);
  if (rc) return rc;
  q->t_first = mj_now_ms();
  if (take(o, q, id)) finish(o, S, q);
  return 0;
}

static void print_results(const gen_opts *o, const session *S, gen_seq *s, int np, double ms, int steps, int64_t rows) {
  sess_info si;
  sess_get_info(S, &si);
  const char *backend = sess_backend_name(si.backend);
  if (o->stream) { /* the one prompt */
    gen_seq *q = &s[0];
    double t_prompt = q->t_first - q->t_admit, t_decode = q->t_end - q->t_first;
    double pps = q->n_prompt / (t_prompt / 1000.0), dps = q->n_gen > 0 ? q->n_gen / (t_decode / 1000.0) : 0;
    if (o->as_json) {
      mj_buf j = {0};
      mj_buf_puts(&j, "{\"text\":");
      json_write_str(&j, q->text.data ? q->text.data : "", q->text.len);
      mj_buf_printf(&j, ",\"tokens\":[");
      for (size_t i = q->n_prompt; i < q->ids.n; i++) mj_buf_printf(&j, "%s%d", i > q->n_prompt ? "," : "", q->ids.v[i]);
      mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\","
                        "\"prompt_ms\":%.3f,\"decode_ms\":%.3f,\"prompt_tokens_per_s\":%.2f,\"decode_tokens_per_s\":%.2f,\"model\":",
                    q->n_prompt, (long long)q->n_gen, q->stop, backend, t_prompt, t_decode, pps, dps);
      json_write_str(&j, o->model_dir, strlen(o->model_dir));
      mj_buf_puts(&j, "}\n");
      fputs(j.data, stdout);
      mj_buf_free(&j);
    } else {
      printf("\n");
      fflush(stdout);
      if (!o->quiet)
        fprintf(stderr, "moejit: prompt %zu tokens in %.1f ms (%.1f tok/s), generated %lld tokens in %.1f ms (%.2f tok/s), stop: %s, backend %s\n",
                q->n_prompt, t_prompt, pps, (long long)q->n_gen, t_decode, dps, q->stop, backend);
    }
    return;
  }
  int64_t gen = 0;
  for (int k = 0; k < np; k++) {
    gen_seq *q = &s[k];
    gen += q->n_gen;
    if (o->as_json) {
      mj_buf j = {0};
      mj_buf_printf(&j, "{\"index\":%d,\"text\":", k);
      json_write_str(&j, q->text.data ? q->text.data : "", q->text.len);
      mj_buf_puts(&j, ",\"tokens\":[");
      for (size_t i = q->n_prompt; i < q->ids.n; i++) mj_buf_printf(&j, "%s%d", i > q->n_prompt ? "," : "", q->ids.v[i]);
      mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\"}\n",
                    q->n_prompt, (long long)q->n_gen, q->stop, backend);
      fputs(j.data, stdout);
      mj_buf_free(&j);
    } else {
      printf("[%d] %.*s\n", k, (int)q->text.len, q->text.data ? q->text.data : "");
    }
  }
  fflush(stdout);
  if (!o->quiet)
    fprintf(stderr, "moejit: %d prompts, %d at a time: %lld tokens in %.1f ms (%.2f tok/s), %d decode steps of %.1f rows "
                    "on average, backend %s\n",
            np, si.slots, (long long)gen, ms, gen / (ms / 1000.0), steps, steps ? (double)rows / steps : 0.0, backend);
}

int gen_run(const gen_opts *o, session *S, gen_seq *s, int np, mj_err *err) {
  sess_info si;
  sess_get_info(S, &si);
  int P = si.slots, rc = 0, next = 0, steps = 0;
  int64_t rows = 0;
  for (int k = 0; k < np; k++) tok_stream_init(&s[k].ts, o->tok, true), s[k].slot = -1;
  int32_t *tk = mj_xmalloc((size_t)P * 4), *sl = mj_xmalloc((size_t)P * 4), *ids = mj_xmalloc((size_t)P * 4);
  int *who = mj_xmalloc((size_t)P * sizeof *who), *owner = mj_xmalloc((size_t)P * sizeof *owner);
  for (int i = 0; i < P; i++) owner[i] = -1; /* the prompt live in each slot */
  double t0 = mj_now_ms();
  for (;;) {
    /* Free slots take the next prompts (one that ends at once frees its slot again). */
    while (next < np && sess_live(S) < P) {
      if ((rc = admit(o, S, &s[next], next, err))) goto out;
      if (s[next].slot >= 0) owner[s[next].slot] = next;
      next++;
    }
    /* One row per live sequence, in slot order. */
    int n = 0;
    for (int i = 0; i < P; i++) {
      int k = owner[i];
      if (k >= 0) who[n] = k, tk[n] = s[k].ids.v[s[k].ids.n - 1], sl[n] = i, n++;
    }
    if (n == 0) {
      if (next >= np) break;
      continue;
    }
    if ((rc = sess_step(S, tk, sl, n, ids, NULL, err))) goto out;
    steps++, rows += n;
    for (int i = 0; i < n; i++)
      if (take(o, &s[who[i]], ids[i])) finish(o, S, &s[who[i]]), owner[sl[i]] = -1;
  }
  print_results(o, S, s, np, mj_now_ms() - t0, steps, rows);
out:
  free(tk), free(sl), free(ids), free(who), free(owner);
  return rc;
}
