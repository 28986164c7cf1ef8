/* generate_many.c: `moejit generate --prompts FILE`, many prompts decoded
 * together with continuous batching.
 *
 * Up to --parallel sequences are live at once, each in its own cache slot.
 * A free slot takes the next prompt (its prefill runs on its own, as rows
 * of that slot), then every decode step runs one row per live sequence,
 * whatever their lengths; a sequence that ends (an eos id or -n tokens)
 * frees its slot at once and the next prompt joins before the next step.
 * On the GPU a step is one gpu_step (padded to a captured batch size and
 * replayed as its graph); on the CPU each live sequence runs its own
 * cpu_forward, so the CPU's answers equal single-prompt runs exactly and
 * the tests can check the scheduling against them.  Each prompt's sampler
 * is seeded with the seed plus the prompt's index.  The texts are printed
 * in the input's order when all are done (or one JSON record each).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "generate.h"
#include "cpu_forward.h"
#include "json.h"

typedef struct seq {
  tok_ids ids;     /* prompt, then generated */
  size_t n_prompt;
  int64_t n_gen;
  int slot;        /* -1: waiting or done */
  bool done;
  const char *stop;
  int32_t next;    /* GPU sampling: the id drawn for the next position */
  sampler *smp;
  tok_stream ts;
  mj_buf text;
} seq;

typedef struct many {
  const gen_many_opts *o;
  const model *m;
  tok_tokenizer *tok;
  const chat_format *cf;
  bool have_chat;
  gpu_model *g;
  cpu_model **cm; /* [parallel] */
  float *logits;  /* [max rows][vocab] */
  int max_rows;
  seq *s;
} many;

/* The id after seq k's last forward: the device's draw, or the host's. */
static int32_t choose(many *M, seq *q, const float *logits) {
  bool dev = M->g && M->o->sp.repeat_penalty == 1.0f;
  return dev ? q->next : sample_next(q->smp, logits, q->ids.v, q->ids.n);
}

/* Take id into seq q; true when q has ended. */
static bool take(many *M, seq *q, int32_t id) {
  const model_config *c = &M->m->cfg;
  bool eos = M->have_chat && chat_is_eos(M->cf, id);
  for (int i = 0; i < c->n_eos; i++) eos |= id == c->eos_token_id[i];
  if (eos) return q->stop = "eos", true;
  tok_ids_push(&q->ids, id);
  q->n_gen++;
  mj_buf piece = {0};
  if (tok_decode_stream(&q->ts, id, &piece)) mj_buf_put(&q->text, piece.data, piece.len);
  mj_buf_free(&piece);
  if (q->n_gen >= M->o->n_predict) return q->stop = "length", true;
  return false;
}

static void finish(seq *q) {
  mj_buf piece = {0};
  if (tok_stream_finish(&q->ts, &piece)) mj_buf_put(&q->text, piece.data, piece.len);
  mj_buf_free(&piece);
  q->done = true, q->slot = -1;
}

/* Run rows (token, slot, pos) through the backend; logits of row i in
 * M->logits + i * vocab (host sampling and CPU) and the device's draws in
 * out. */
static int step(many *M, const int32_t *tok, const int32_t *slot, const int32_t *pos, int n, int32_t *out,
                bool want_logits, mj_err *err) {
  int64_t V = M->m->cfg.vocab_size;
  if (M->g) return gpu_step(M->g, tok, slot, pos, n, out, want_logits ? M->logits : NULL, err);
  for (int i = 0; i < n; i++) {
    int r = cpu_forward(M->cm[slot[i]], tok + i, 1, pos[i], M->logits + (size_t)i * V, false, err);
    if (r) return r;
  }
  return 0;
}

/* Prefill seq q into slot; leaves its first id chosen and taken. */
static int admit(many *M, seq *q, int slot, mj_err *err) {
  int64_t V = M->m->cfg.vocab_size, n = (int64_t)q->ids.n;
  bool host = !M->g || M->o->sp.repeat_penalty != 1.0f;
  q->slot = slot;
  if (!M->g) {
    int r = cpu_forward(M->cm[slot], q->ids.v, n, 0, M->logits, false, err);
    if (r) return r;
  } else {
    int32_t s[1024], p[1024], out[1024];
    for (int64_t i0 = 0; i0 < n; i0 += M->max_rows) {
      int k = (int)(n - i0 < M->max_rows ? n - i0 : M->max_rows);
      for (int i = 0; i < k; i++) s[i] = slot, p[i] = (int32_t)(i0 + i);
      bool last = i0 + k == n;
      int r = step(M, q->ids.v + i0, s, p, k, out, last && host, err);
      if (r) return r;
      if (last) {
        q->next = out[k - 1];
        if (host) memmove(M->logits, M->logits + (size_t)(k - 1) * V, (size_t)V * sizeof *M->logits);
      }
    }
  }
  if (take(M, q, choose(M, q, M->logits))) finish(q);
  return 0;
}

int generate_many(const gen_many_opts *o, const model *m, tok_tokenizer *tok, const chat_format *cf, bool have_chat,
                  mj_err *err) {
  const model_config *c = &m->cfg;
  char *data = NULL;
  size_t len;
  int r = mj_read_file(o->prompts_path, &data, &len, err);
  if (r) return r;
  /* One prompt per non-empty line. */
  int np = 0, cap = 16;
  seq *s = mj_xcalloc((size_t)cap, sizeof *s);
  size_t longest = 0;
  int line = 0;
  for (char *p = data, *end = data + len; p < end;) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    line++;
    if (n && p[n - 1] == '\r') n--;
    if (n) {
      if (np == cap) s = mj_xrealloc(s, (size_t)(cap *= 2) * sizeof *s), memset(s + np, 0, (size_t)(cap - np) * sizeof *s);
      seq *q = &s[np++];
      if (o->chat) {
        chat_msg msgs[2];
        size_t nm = 0;
        if (o->system) msgs[nm++] = (chat_msg){CHAT_SYSTEM, o->system, strlen(o->system)};
        msgs[nm++] = (chat_msg){CHAT_USER, p, n};
        r = chat_encode(tok, cf, msgs, nm, true, !o->no_think, &q->ids, err);
      } else {
        r = tok_encode(tok, p, n, true, &q->ids, err);
      }
      if (r) goto out;
      if (q->ids.n == 0) {
        r = mj_fail(err, MJ_EINPUT, "%s:%d: the prompt encodes to no tokens", o->prompts_path, line);
        goto out;
      }
      q->n_prompt = q->ids.n, q->slot = -1;
      longest = q->ids.n > longest ? q->ids.n : longest;
    }
    p += (nl ? n + 1 + (p[n] == '\r') : n);
    if (!nl) break;
  }
  if (!np) {
    r = mj_fail(err, MJ_EINPUT, "%s: no prompts (one per line)", o->prompts_path);
    goto out;
  }
  int64_t need = (int64_t)longest + o->n_predict, ctx = o->ctx > 0 ? o->ctx : need;
  if (need > ctx || need > c->max_position_embeddings) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: the longest prompt (%zu tokens) + -n %lld exceeds the context (%lld)",
                longest, (long long)o->n_predict, (long long)(ctx < c->max_position_embeddings ? ctx : c->max_position_embeddings));
    goto out;
  }
  int P = o->parallel < np ? o->parallel : np;
  many M = {.o = o, .m = m, .tok = tok, .cf = cf, .have_chat = have_chat, .s = s};
  if (o->gpu) {
    gpu_opts go = o->go;
    go.slots = P, go.max_ctx = ctx;
    if ((r = gpu_model_create(m, &go, &M.g, err))) goto done;
    M.max_rows = gpu_max_rows(M.g);
  } else {
    M.cm = mj_xcalloc((size_t)P, sizeof *M.cm);
    cpu_params cp = {.max_ctx = ctx, .threads = o->threads};
    for (int i = 0; i < P; i++)
      if ((r = cpu_model_create(m, &cp, &M.cm[i], err))) goto done;
    M.max_rows = P;
  }
  M.logits = mj_xmalloc((size_t)(M.max_rows > P ? M.max_rows : P) * c->vocab_size * sizeof *M.logits);
  for (int k = 0; k < np; k++) {
    sample_params sp = o->sp;
    sp.seed = o->sp.seed + (uint64_t)k;
    s[k].smp = sample_create(&sp, (int32_t)c->vocab_size);
    tok_stream_init(&s[k].ts, tok, true);
  }

  int next = 0, steps = 0;
  int64_t rows = 0, gen = 0;
  int32_t *tk = mj_xmalloc((size_t)P * 4), *sl = mj_xmalloc((size_t)P * 4), *ps = mj_xmalloc((size_t)P * 4),
          *out = mj_xmalloc((size_t)P * 4);
  int *who = mj_xmalloc((size_t)P * sizeof *who);
  bool *busy = mj_xcalloc((size_t)P, 1);
  double t0 = mj_now_ms();
  for (;;) {
    /* Free slots take the next prompts. */
    for (int sl_i = 0; sl_i < P && next < np; sl_i++) {
      if (busy[sl_i]) continue;
      seq *q = &s[next++];
      if ((r = admit(&M, q, sl_i, err))) goto freeing;
      busy[sl_i] = !q->done;
    }
    int n = 0;
    for (int sl_i = 0; sl_i < P; sl_i++)
      if (busy[sl_i]) {
        int k = 0;
        while (s[k].slot != sl_i || s[k].done) k++;
        who[n] = k, tk[n] = s[k].ids.v[s[k].ids.n - 1], sl[n] = sl_i, ps[n] = (int32_t)s[k].ids.n - 1, n++;
      }
    if (n == 0) {
      if (next >= np) break;
      continue;
    }
    bool host = !M.g || o->sp.repeat_penalty != 1.0f;
    if ((r = step(&M, tk, sl, ps, n, out, host, err))) goto freeing;
    steps++, rows += n;
    for (int i = 0; i < n; i++) {
      seq *q = &s[who[i]];
      q->next = out[i];
      if (take(&M, q, choose(&M, q, M.logits + (size_t)i * c->vocab_size))) {
        busy[q->slot] = false;
        finish(q);
      }
    }
  }
  double ms = mj_now_ms() - t0;
  for (int k = 0; k < np; k++) gen += s[k].n_gen;
  for (int k = 0; k < np; k++) {
    seq *q = &s[k];
    if (o->as_json) {
      mj_buf j = {0};
      mj_buf_printf(&j, "{\"index\":%d,\"text\":", k);
      json_write_str(&j, q->text.data ? q->text.data : "", q->text.len);
      mj_buf_puts(&j, ",\"tokens\":[");
      for (size_t i = q->n_prompt; i < q->ids.n; i++) mj_buf_printf(&j, "%s%d", i > q->n_prompt ? "," : "", q->ids.v[i]);
      mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\"}\n",
                    q->n_prompt, (long long)q->n_gen, q->stop, M.g ? "cuda" : "cpu");
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
            np, P, (long long)gen, ms, gen / (ms / 1000.0), steps, steps ? (double)rows / steps : 0.0, M.g ? "cuda" : "cpu");
  r = 0;
freeing:
  free(tk), free(sl), free(ps), free(out), free(who), free(busy);
done:
  if (M.g) gpu_model_destroy(M.g);
  for (int i = 0; M.cm && i < P; i++) cpu_model_destroy(M.cm[i]);
  free(M.cm);
  free(M.logits);
out:
  for (int k = 0; k < np; k++) {
    tok_ids_free(&s[k].ids);
    mj_buf_free(&s[k].text);
    if (s[k].smp) sample_destroy(s[k].smp);
  }
  free(s);
  free(data);
  return r;
}
