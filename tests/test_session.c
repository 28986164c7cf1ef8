/* test_session.c: the decode session (src/session.c) on the CPU backend.
 *
 * The session's answers are held to the CPU reference driven by hand:
 * each sequence alone on its own cpu_model, its prompt as one forward,
 * then one token at a time, drawn by a sampler of the same parameters.
 * Checked: a prompt's rows and other sequences' decode rows in one step,
 * sequences joining and retiring (a reused slot starts clean), every
 * row's logits, host sampling with a repetition penalty, and bad rows
 * refused before anything runs.  The GPU backend is held to the CPU by
 * the GPU tests (gputest decode) and `generate --prompts` (scripts/gpu-run.sh many).
 */
#include <ftw.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_forward.h"
#include "mkmodel.h"
#include "model.h"
#include "session.h"
#include "t.h"
#include "t_fs.h"

static model *M;

/* What the session should give: sequence `toks` run alone, one forward
 * for the prompt of np tokens, then the rest one at a time; out[i] is the
 * draw after each of toks[np-1..n).  Logits of the last row in last. */
static void alone(const sample_params *sp, const int32_t *toks, int np, int n, int32_t *out, float *last) {
  cpu_params cp = {.max_ctx = 64};
  cpu_model *cm;
  mj_err err = {0};
  int64_t V = M->cfg.vocab_size;
  float *lg = malloc((size_t)V * 4);
  sampler *smp = sample_create(sp, (int32_t)V);
  T_CHECK(cpu_model_create(M, &cp, &cm, &err) == 0);
  T_CHECK(cpu_forward(cm, toks, np, 0, lg, false, &err) == 0);
  out[0] = sample_next(smp, lg, toks, (size_t)np);
  for (int i = np; i < n; i++) {
    T_CHECK(cpu_forward(cm, toks + i, 1, i, lg, false, &err) == 0);
    out[i - np + 1] = sample_next(smp, lg, toks, (size_t)i + 1);
  }
  if (last) memcpy(last, lg, (size_t)V * 4);
  free(lg);
  sample_destroy(smp);
  cpu_model_destroy(cm);
}

static session *open_cpu(int slots) {
  sess_opts o;
  sess_opts_default(&o);
  o.slots = slots, o.max_ctx = 64, o.threads = 1;
  session *S = NULL;
  mj_err err = {0};
  T_CHECK(sess_create(M, &o, &S, &err) == 0);
  return S;
}

/* Two sequences: A's prompt, then A decoding while B's prompt runs in the
 * same step, then both decoding; each token equals its run alone. */
static void test_mixed_steps(void) {
  session *S = open_cpu(3);
  mj_err err = {0};
  sample_params sp = sample_defaults();
  sp.temperature = 0.9f, sp.top_p = 0.9f, sp.seed = 11;
  sample_params sq = sp;
  sq.seed = 12;
  int a, b;
  T_CHECK(sess_admit(S, &sp, &a, &err) == 0);
  T_CHECK(sess_admit(S, &sq, &b, &err) == 0);
  T_EQ_INT(sess_live(S), 2);
  int32_t A[12] = {5, 9, 2, 7}, B[12] = {3, 1, 4, 1, 5};
  int32_t ids[8], tok[8], sl[8];
  /* step 1: A's prompt (4 rows) */
  for (int i = 0; i < 4; i++) tok[i] = A[i], sl[i] = a;
  T_CHECK(sess_step(S, tok, sl, 4, ids, NULL, &err) == 0);
  T_EQ_INT(ids[0], -1);
  A[4] = ids[3];
  /* step 2: A's decode row, then B's prompt (5 rows) */
  tok[0] = A[4], sl[0] = a;
  for (int i = 0; i < 5; i++) tok[1 + i] = B[i], sl[1 + i] = b;
  T_CHECK(sess_step(S, tok, sl, 6, ids, NULL, &err) == 0);
  A[5] = ids[0], B[5] = ids[5];
  /* steps 3-6: both decode (B first this time) */
  for (int k = 0; k < 4; k++) {
    tok[0] = B[5 + k], sl[0] = b, tok[1] = A[5 + k], sl[1] = a;
    T_CHECK(sess_step(S, tok, sl, 2, ids, NULL, &err) == 0);
    B[6 + k] = ids[0], A[6 + k] = ids[1];
  }
  T_EQ_INT(sess_len(S, a), 9);
  T_EQ_INT(sess_len(S, b), 9);
  int32_t ra[8], rb[8];
  alone(&sp, A, 4, 9, ra, NULL);
  alone(&sq, B, 5, 9, rb, NULL);
  for (int i = 0; i < 6; i++) T_EQ_INT(A[4 + i], ra[i]);
  for (int i = 0; i < 5; i++) T_EQ_INT(B[5 + i], rb[i]);
  sess_destroy(S);
}

/* A retired slot is taken by the next sequence and starts clean; every
 * row's logits come back when asked; a repetition penalty is applied by
 * the host's sampler from the sequence's own history. */
static void test_retire_reuse_logits(void) {
  session *S = open_cpu(1);
  mj_err err = {0};
  int64_t V = M->cfg.vocab_size;
  sample_params sp = sample_defaults();
  sp.temperature = 0, sp.repeat_penalty = 1.3f;
  int s0, s1;
  T_CHECK(sess_admit(S, &sp, &s0, &err) == 0);
  int32_t junk[3] = {8, 8, 8}, sl[6] = {0, 0, 0, 0, 0, 0}, ids[6];
  T_CHECK(sess_step(S, junk, sl, 3, ids, NULL, &err) == 0);
  T_CHECK(sess_admit(S, &sp, &s1, &err) == MJ_EUSAGE); /* one slot, taken */
  mj_err_clear(&err);
  sess_retire(S, s0);
  T_EQ_INT(sess_live(S), 0);
  T_CHECK(sess_admit(S, &sp, &s1, &err) == 0);
  T_EQ_INT(s1, s0);
  T_EQ_INT(sess_len(S, s1), 0);
  int32_t P[10] = {2, 6, 2, 6, 2};
  float *lg = malloc((size_t)5 * V * 4), *want = malloc((size_t)V * 4);
  T_CHECK(sess_step(S, P, sl, 5, ids, lg, &err) == 0);
  P[5] = ids[4];
  for (int k = 0; k < 3; k++) {
    T_CHECK(sess_step(S, &P[5 + k], sl, 1, ids, NULL, &err) == 0);
    P[6 + k] = ids[0];
  }
  int32_t r[4];
  float *first = malloc((size_t)V * 4);
  alone(&sp, P, 5, 5, r, first);
  double worst = 0;
  for (int64_t v = 0; v < V; v++) worst = fmax(worst, fabs(lg[4 * V + v] - first[v]));
  T_NEAR(worst, 0, 0); /* the same forward on the same cache: bit-equal */
  alone(&sp, P, 5, 8, r, want);
  for (int i = 0; i < 4; i++) T_EQ_INT(P[5 + i], r[i]);
  /* without the penalty some token would differ (the test can fail) */
  sample_params plain = sp;
  plain.repeat_penalty = 1.0f;
  int32_t q[4];
  alone(&plain, P, 5, 8, q, NULL);
  bool differs = false;
  for (int i = 0; i < 4; i++) differs |= q[i] != r[i];
  T_CHECK(differs);
  free(lg), free(want), free(first);
  sess_destroy(S);
}

/* Bad rows: refused with MJ_EINPUT, nothing run (lengths unchanged). */
static void test_bad_rows(void) {
  session *S = open_cpu(2);
  mj_err err = {0};
  sample_params sp = sample_defaults();
  int a;
  T_CHECK(sess_admit(S, &sp, &a, &err) == 0);
  int32_t tok[70] = {1, 2, 3}, sl[70] = {0}, ids[70];
  T_CHECK(sess_step(S, tok, sl, 2, ids, NULL, &err) == 0);
  struct {
    int32_t tok[3], sl[3];
    int n;
    const char *msg;
  } bad[] = {
      {{1, 2, 3}, {0, 1, 0}, 3, "session: row 1 names slot 1, which holds no live sequence"},
      {{1, 2, 3}, {0, 0, 7}, 3, "session: row 2 names slot 7, which holds no live sequence"},
      {{1, 99999, 3}, {0, 0, 0}, 3, NULL},
      {{1, 2, 3}, {0, 0, 0}, 0, "session: a step of 0 rows"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    T_EQ_INT(sess_step(S, bad[i].tok, bad[i].sl, bad[i].n, ids, NULL, &err), MJ_EINPUT);
    if (bad[i].msg) T_EQ_STR(err.msg, bad[i].msg);
    mj_err_clear(&err);
  }
  int b;
  T_CHECK(sess_admit(S, &sp, &b, &err) == 0);
  int32_t t2[3] = {1, 2, 3}, s2[3] = {a, b, a};
  T_EQ_INT(sess_step(S, t2, s2, 3, ids, NULL, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "session: the rows of slot 0 are not adjacent (rows 0 and 2)");
  mj_err_clear(&err);
  for (int i = 0; i < 63; i++) tok[i] = 1, sl[i] = a;
  T_EQ_INT(sess_step(S, tok, sl, 63, ids, NULL, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "session: slot 0 would hold 65 tokens, past its context of 64");
  mj_err_clear(&err);
  T_EQ_INT(sess_len(S, a), 2);
  T_EQ_INT(sess_len(S, b), 0);
  /* the measuring calls and a trace need the GPU */
  sess_measure me = {.mode = SESS_EAGER, .steps = 1, .reps = 1};
  int32_t pos[1] = {0};
  T_EQ_INT(sess_measure_rows(S, tok, sl, pos, 1, &me, &err), MJ_EUSAGE);
  T_EQ_STR(err.msg, "session: measuring a step needs the GPU backend");
  mj_err_clear(&err);
  sess_destroy(S);
  sess_opts o;
  sess_opts_default(&o);
  o.trace_path = "/nonexistent/t.jsonl";
  T_EQ_INT(sess_create(M, &o, &S, &err), MJ_EUSAGE);
  T_CHECK(S == NULL);
  mj_err_clear(&err);
  sess_backend be;
  T_EQ_INT(sess_pick_backend("who", "tpu", M, true, &be, &err), MJ_EUSAGE);
  T_EQ_STR(err.msg, "who: --backend must be auto, cpu or cuda, not 'tpu'");
  mj_err_clear(&err);
}

int main(void) {
  if (t_scratch_init("session")) return 1;
  mkmodel_spec s;
  mkmodel_preset("tiny", &s);
  s.seed = 3;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/m", t_root);
  mj_err err = {0};
  if (mkmodel_write(&s, dir, true, NULL, &err) || model_load(dir, &M, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  T_RUN(test_mixed_steps);
  T_RUN(test_retire_reuse_logits);
  T_RUN(test_bad_rows);
  model_free(M);
  return t_scratch_done(t_status());
}
