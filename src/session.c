/* session.c: one decode session over the CPU reference or the GPU engine
 * (session.h).
 *
 * The session keeps, per slot, whether a sequence lives there, its tokens
 * (the history a repetition penalty reads, and the next position) and its
 * sampler.  sess_step checks every row first (so a bad row runs nothing),
 * then runs them: on the GPU as engine steps of at most max_rows rows
 * (each padded to a captured size and replayed as its graph), on the CPU as
 * one cpu_forward per slot's run of rows, each slot on its own cache.  The
 * token after a slot's last row is the device's draw or the host's.
 */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu_forward.h"
#include "cudrv.h"
#include "trace.h"

typedef struct sess_seq {
  bool live;
  bool dev_sample; /* the device's draw (GPU, device filters, nothing host-only) */
  bool hold;       /* draw nothing after its rows (sess_hold: a prompt fed in parts) */
  int32_t *hist;   /* the tokens run, oldest first */
  int64_t len, cap;
  sampler *smp;
  bool logprobs;   /* report each draw's log probabilities: */
  int ntop;        /* top_logprobs asked */
  bool has_lp;     /* lp and top hold the last draw's */
  float lp;
  sample_logprob top[SAMPLE_MAX_LOGPROBS];
} sess_seq;

struct session {
  sess_opts o;
  model_config cfg; /* widths only (the checkpoint's pointers are not kept) */
  int64_t vocab;
  gpu_model *g;
  cpu_model **cm;   /* [slots] */
  int max_rows;
  sess_seq *seq;    /* [slots] */
  float *lg;        /* host logits, [max_rows][vocab] */
  int32_t *pos, *out, *last; /* [max_rows], and [slots] (a slot's last row in the step) */
  trace_writer *trace;
  int64_t trace_steps;
};

void sess_opts_default(sess_opts *o) {
  memset(o, 0, sizeof *o);
  o->backend = SESS_CPU;
  o->slots = 1;
  o->max_ctx = 4096;
  gpu_opts_default(&o->gpu);
}

const char *sess_backend_name(sess_backend b) { return b == SESS_CUDA ? "cuda" : "cpu"; }

int sess_pick_backend(const char *who, const char *name, const model *m, bool quiet, sess_backend *out, mj_err *err) {
  if (!strcmp(name, "cpu")) return *out = SESS_CPU, 0;
  if (!strcmp(name, "cuda")) return *out = SESS_CUDA, 0;
  if (strcmp(name, "auto"))
    return mj_fail(err, MJ_EUSAGE, "%s: --backend must be auto, cpu or cuda, not '%s'", who, name);
  mj_err e = {0};
  bool gpu = cu_init(&e) == 0;
  mj_err_clear(&e);
  if (gpu && gpu_model_supports(m, &e)) {
    gpu = false;
    if (!quiet) fprintf(stderr, "moejit: running on the CPU: %s\n", e.msg);
    mj_err_clear(&e);
  }
  *out = gpu ? SESS_CUDA : SESS_CPU;
  return 0;
}

static int open_trace(session *s, mj_err *err) {
  const model_config *c = &s->cfg;
  const cu_device *dv = cu_dev();
  trace_header th = {.version = TRACE_VERSION, .hidden = (int)c->hidden_size, .inter = (int)c->moe_intermediate_size,
                     .n_experts = (int)c->n_routed_experts, .topk = (int)c->num_experts_per_tok,
                     .n_group = (int)c->n_group, .topk_group = (int)c->topk_group, .layers = (int)c->num_hidden_layers};
  snprintf(th.moejit_version, sizeof th.moejit_version, "%s", PACKAGE_VERSION);
  snprintf(th.model, sizeof th.model, "%s", s->o.model_name ? s->o.model_name : "");
  snprintf(th.device, sizeof th.device, "%.127s", dv->name);
  snprintf(th.arch, sizeof th.arch, "%s", dv->arch);
  return trace_open(s->o.trace_path, &th, &s->trace, err);
}

/* What both constructors share once the backend exists. */
static int finish_create(session *s, mj_err *err) {
  s->max_rows = s->g ? gpu_max_rows(s->g) : 1;
  s->seq = mj_xcalloc((size_t)s->o.slots, sizeof *s->seq);
  s->lg = mj_xmalloc((size_t)s->max_rows * s->vocab * sizeof *s->lg);
  s->pos = mj_xmalloc((size_t)s->max_rows * 4);
  s->out = mj_xmalloc((size_t)s->max_rows * 4);
  s->last = mj_xmalloc((size_t)s->o.slots * 4);
  if (s->o.trace_path && (!s->g))
    return mj_fail(err, MJ_EUSAGE, "a trace records the GPU's MoE shapes; this session runs on the CPU");
  return s->o.trace_path ? open_trace(s, err) : 0;
}

static session *new_session(const model_config *c, const sess_opts *o) {
  session *s = mj_xcalloc(1, sizeof *s);
  s->o = *o;
  s->cfg = *c;
  s->vocab = c->vocab_size;
  s->o.gpu.slots = o->slots;
  s->o.gpu.max_ctx = o->max_ctx;
  s->o.gpu.trace = o->trace_path != NULL || o->gpu.trace;
  s->o.gpu.on_queued = o->on_queued, s->o.gpu.on_queued_ctx = o->on_queued_ctx;
  return s;
}

int sess_create(const model *m, const sess_opts *o, session **out, mj_err *err) {
  *out = NULL;
  if (o->slots < 1 || o->max_ctx < 1)
    return mj_fail(err, MJ_EUSAGE, "session: %d slots and a context of %lld tokens (both must be >= 1)", o->slots,
                   (long long)o->max_ctx);
  session *s = new_session(&m->cfg, o);
  int rc;
  if (o->backend == SESS_CUDA) {
    rc = gpu_model_create(m, &s->o.gpu, &s->g, err);
  } else {
    s->cm = mj_xcalloc((size_t)o->slots, sizeof *s->cm);
    /* a rank's --tp/--ep: the whole sharded forward, every rank's share summed here */
    cpu_params cp = {.max_ctx = o->max_ctx, .threads = o->threads, .tp = o->gpu.tp, .ep = o->gpu.ep};
    rc = 0;
    for (int i = 0; i < o->slots && !rc; i++) rc = cpu_model_create(m, &cp, &s->cm[i], err);
  }
  if (!rc) rc = finish_create(s, err);
  if (rc) {
    sess_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

int sess_create_synthetic(const model_config *cfg, uint64_t seed, const sess_opts *o, session **out, mj_err *err) {
  *out = NULL;
  if (o->backend != SESS_CUDA)
    return mj_fail(err, MJ_EUSAGE, "session: a synthetic model's weights are made on the GPU (backend cuda)");
  session *s = new_session(cfg, o);
  s->cfg.layer_sparse = NULL; /* the arena that held them may go */
  int rc = gpu_model_synthetic(cfg, seed, &s->o.gpu, &s->g, err);
  if (!rc) rc = finish_create(s, err);
  if (rc) {
    sess_destroy(s);
    return rc;
  }
  *out = s;
  return 0;
}

int sess_close(session *s, mj_err *err) {
  if (!s) return 0;
  int rc = trace_close(s->trace, err);
  s->trace = NULL;
  for (int i = 0; s->seq && i < s->o.slots; i++) sess_retire(s, i);
  for (int i = 0; s->cm && i < s->o.slots; i++) cpu_model_destroy(s->cm[i]);
  free(s->cm);
  for (int i = 0; s->seq && i < s->o.slots; i++) free(s->seq[i].hist);
  free(s->seq);
  if (s->g) gpu_model_destroy(s->g);
  free(s->lg), free(s->pos), free(s->out), free(s->last);
  free(s);
  return rc;
}

void sess_destroy(session *s) {
  mj_err e = {0};
  sess_close(s, &e);
  mj_err_clear(&e);
}

/* ---- sequences ------------------------------------------------------------------ */
static bool same_filters(const sample_params *a, const sample_params *b) {
  return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p && a->min_p == b->min_p;
}

int sess_admit(session *s, const sample_params *sp, int *slot, mj_err *err) {
  int i = 0;
  while (i < s->o.slots && s->seq[i].live) i++;
  if (i == s->o.slots) return mj_fail(err, MJ_EUSAGE, "session: all %d slots hold live sequences", s->o.slots);
  sess_seq *q = &s->seq[i];
  q->live = true;
  q->hold = false;
  q->len = 0;
  /* From sp, never from q->logprobs: a follower rank (no_logprobs) must
   * draw where rank 0 draws, or its token checks fail on GPUs. */
  q->dev_sample = s->g && !sample_host_only(sp) && same_filters(sp, &s->o.gpu.sampling);
  q->logprobs = sp->logprobs && !s->o.no_logprobs, q->has_lp = false;
  q->ntop = sp->top_logprobs < 0 ? 0 : sp->top_logprobs > SAMPLE_MAX_LOGPROBS ? SAMPLE_MAX_LOGPROBS : sp->top_logprobs;
  if (q->ntop > s->vocab) q->ntop = (int)s->vocab; /* what sample_logprobs fills (a vocabulary under 20 ids) */
  /* The device's draw is keyed by the sequence's own seed, as the host's
   * sampler is: the same seed draws the same tokens in any slot. */
  if (q->dev_sample) gpu_set_seed(s->g, i, sp->seed);
  q->smp = sample_create(sp, (int32_t)s->vocab);
  *slot = i;
  return 0;
}

void sess_retire(session *s, int slot) {
  if (slot < 0 || slot >= s->o.slots || !s->seq[slot].live) return;
  sess_seq *q = &s->seq[slot];
  sample_destroy(q->smp);
  q->smp = NULL;
  q->live = false;
  q->len = 0;
}

void sess_hold(session *s, int slot, bool hold) {
  if (slot >= 0 && slot < s->o.slots && s->seq[slot].live) s->seq[slot].hold = hold;
}

int sess_live(const session *s) {
  int n = 0;
  for (int i = 0; i < s->o.slots; i++) n += s->seq[i].live;
  return n;
}

int64_t sess_len(const session *s, int slot) {
  return slot >= 0 && slot < s->o.slots && s->seq[slot].live ? s->seq[slot].len : 0;
}

/* ---- the step ------------------------------------------------------------------ */
static void push(sess_seq *q, int32_t t) {
  if (q->len == q->cap) {
    q->cap = q->cap ? 2 * q->cap : 64;
    q->hist = mj_xrealloc(q->hist, (size_t)q->cap * sizeof *q->hist);
  }
  q->hist[q->len++] = t;
}

/* The token after a slot's last row, whose logits are lg (vocab of them;
 * NULL when the device drew), with its log probabilities when asked. */
static int32_t draw(sess_seq *q, int32_t dev_id, const float *lg, int64_t vocab) {
  if (q->dev_sample) return dev_id;
  int32_t id = sample_next(q->smp, lg, q->hist, (size_t)q->len);
  if (q->logprobs) q->lp = sample_logprobs(lg, (int32_t)vocab, id, q->ntop, q->top), q->has_lp = true;
  return id;
}

bool sess_logprobs(const session *s, int slot, float *lp, const sample_logprob **top, int *n) {
  if (slot < 0 || slot >= s->o.slots || !s->seq[slot].live || !s->seq[slot].has_lp) return false;
  const sess_seq *q = &s->seq[slot];
  *lp = q->lp, *top = q->top, *n = q->ntop;
  return true;
}

/* Every row valid, each slot's rows adjacent and within its context:
 * s->last[slot] gets its last row (-1 for slots without rows). */
static int check_rows(session *s, const int32_t *token, const int32_t *slot, int n, mj_err *err) {
  if (n < 1) return mj_fail(err, MJ_EINPUT, "session: a step of %d rows", n);
  for (int i = 0; i < s->o.slots; i++) s->last[i] = -1;
  for (int i = 0; i < n; i++) {
    int k = slot[i];
    if (k < 0 || k >= s->o.slots || !s->seq[k].live)
      return mj_fail(err, MJ_EINPUT, "session: row %d names slot %d, which holds no live sequence", i, k);
    if (token[i] < 0 || token[i] >= s->vocab)
      return mj_fail(err, MJ_EINPUT, "session: token id %d is outside the vocabulary (0..%lld)", token[i],
                     (long long)s->vocab - 1);
    if (s->last[k] >= 0 && s->last[k] != i - 1)
      return mj_fail(err, MJ_EINPUT, "session: the rows of slot %d are not adjacent (rows %d and %d)", k, s->last[k], i);
    s->last[k] = i;
  }
  for (int i = 0, first = 0; i < n; i++) { /* first: the first row of slot[i]'s run */
    int k = slot[i];
    if (i > 0 && slot[i - 1] != k) first = i;
    if (s->last[k] == i && s->seq[k].len + (i - first + 1) > s->o.max_ctx)
      return mj_fail(err, MJ_EINPUT, "session: slot %d would hold %lld tokens, past its context of %lld", k,
                     (long long)(s->seq[k].len + (i - first + 1)), (long long)s->o.max_ctx);
  }
  return 0;
}

static int step_gpu(session *s, const int32_t *token, const int32_t *slot, int n, int32_t *ids, float *logits,
                    mj_err *err) {
  int64_t V = s->vocab;
  for (int i0 = 0; i0 < n; i0 += s->max_rows) {
    int k = n - i0 < s->max_rows ? n - i0 : s->max_rows;
    bool host = false;
    /* Each slot continues where it is (its rows are adjacent; those of an
     * earlier chunk are already in its length). */
    for (int i = i0; i < i0 + k; i++) {
      bool cont = i > i0 && slot[i - 1] == slot[i];
      s->pos[i - i0] = cont ? s->pos[i - i0 - 1] + 1 : (int32_t)s->seq[slot[i]].len;
      host |= s->last[slot[i]] == i && !s->seq[slot[i]].dev_sample && !s->seq[slot[i]].hold;
    }
    float *lg = logits ? logits + (size_t)i0 * V : host ? s->lg : NULL;
    int rc = gpu_step(s->g, token + i0, slot + i0, s->pos, k, s->out, lg, err);
    if (!rc && s->trace) rc = gpu_trace_step(s->g, k, s->trace_steps++, s->trace, err);
    if (rc) return rc;
    for (int i = i0; i < i0 + k; i++) {
      sess_seq *q = &s->seq[slot[i]];
      push(q, token[i]);
      ids[i] = s->last[slot[i]] == i && !q->hold ? draw(q, s->out[i - i0], lg ? lg + (size_t)(i - i0) * V : NULL, V) : -1;
    }
  }
  return 0;
}

static int step_cpu(session *s, const int32_t *token, const int32_t *slot, int n, int32_t *ids, float *logits,
                    mj_err *err) {
  int64_t V = s->vocab;
  if (s->o.on_queued) s->o.on_queued(s->o.on_queued_ctx);
  for (int i = 0; i < n;) {
    int k = slot[i], j = i;
    while (j < n && slot[j] == k) j++;
    sess_seq *q = &s->seq[k];
    float *lg = logits ? logits + (size_t)i * V : s->lg;
    int rc = cpu_forward(s->cm[k], token + i, j - i, q->len, lg, logits != NULL, err);
    if (rc) return rc;
    for (int r = i; r < j; r++) push(q, token[r]), ids[r] = -1;
    ids[j - 1] = q->hold ? -1 : draw(q, -1, logits ? logits + (size_t)(j - 1) * V : s->lg, V);
    i = j;
  }
  return 0;
}

int sess_step(session *s, const int32_t *token, const int32_t *slot, int n, int32_t *ids, float *logits, mj_err *err) {
  int rc = check_rows(s, token, slot, n, err);
  if (rc) return rc;
  return s->g ? step_gpu(s, token, slot, n, ids, logits, err) : step_cpu(s, token, slot, n, ids, logits, err);
}

/* ---- measuring ------------------------------------------------------------------ */
static int need_gpu(const session *s, const char *what, mj_err *err) {
  return s->g ? 0 : mj_fail(err, MJ_EUSAGE, "session: %s needs the GPU backend", what);
}

int sess_fill_cache(session *s, uint64_t seed, mj_err *err) {
  int rc = need_gpu(s, "filling the caches", err);
  return rc ? rc : gpu_fill_cache(s->g, seed, err);
}

int sess_measure_rows(session *s, const int32_t *token, const int32_t *slot, const int32_t *pos, int n,
                      sess_measure *m, mj_err *err) {
  int rc = need_gpu(s, "measuring a step", err);
  if (rc) return rc;
  switch (m->mode) {
  case SESS_GRAPH:
  case SESS_EAGER:
    return gpu_time(s->g, token, slot, pos, n, m->mode == SESS_GRAPH, m->run_as, m->steps, m->reps, &m->us, err);
  case SESS_PROFILE: return gpu_profile(s->g, token, slot, pos, n, &m->prof, err);
  case SESS_REGION: return gpu_profile_region(s->g, token, slot, pos, n, err);
  case SESS_CHECK:
    if ((rc = gpu_step(s->g, token, slot, pos, n, m->ids, m->logits, err))) return rc;
    return gpu_step_eager(s->g, token, slot, pos, n, m->ids2, NULL, err);
  }
  return mj_fail(err, MJ_EINTERNAL, "session: unknown measure mode %d", (int)m->mode);
}

int sess_capture_all(session *s, mj_err *err) {
  int rc = need_gpu(s, "capturing graphs", err);
  return rc ? rc : gpu_capture_all(s->g, err);
}

/* ---- what the session is ----------------------------------------------------------- */
void sess_get_info(const session *s, sess_info *i) {
  memset(i, 0, sizeof *i);
  i->backend = s->g ? SESS_CUDA : SESS_CPU;
  i->slots = s->o.slots, i->max_rows = s->max_rows;
  i->max_ctx = s->o.max_ctx, i->vocab = s->vocab;
  if (s->g) {
    i->weight_bytes = gpu_weight_bytes(s->g);
    gpu_counters_get(s->g, &i->counters);
    i->dims = gpu_dims(s->g);
    i->plan = gpu_plan(s->g);
  }
}

void sess_drop_graphs(session *s) {
  if (s->g) gpu_drop_graphs(s->g);
}

int sess_padded(const session *s, int n, bool *graph) {
  if (!s->g) return *graph = false, n;
  return gpu_padded(s->g, n, graph);
}
