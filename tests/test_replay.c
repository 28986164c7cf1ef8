/* test_replay.c: the host side of `moejit replay` (replay.h), no GPU.
 *
 * The routing tables replay_tables_build makes must be tables moe_route.k
 * could have written: slot 0 the shared expert over every token, routed
 * slots in expert order with the recorded counts, pairs numbered slot by
 * slot with each slot's rows in token order, every token's pairs distinct
 * experts and at most topk, weights summing to the scaling factor, spare
 * combine entries on a pair no slot writes.  They are checked here for
 * full, short, lopsided and over-full records.  Buckets are counted on a
 * trace built in memory.
 *
 * The program also serves tests/replay.sh: `--write-trace PATH [HIDDEN]`
 * writes a small GLM-5 trace through the trace writer (buckets 1, 8 and 64,
 * one eager step), and `--compile-bucket N ARCH` compiles that bucket's
 * MoE kernels into the cache through the front door, so the script can
 * watch `replay --dry-run` flip from "compile" to "cached".
 */
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "replay.h"
#include "t.h"

/* The invariants of a routing table (docs/moe.md "Routing on the device"). */
static void check_tables(const moe_plan *p, const trace_moe *m, const replay_tables *t) {
  const model_moe_cfg *c = &p->cfg;
  int K = c->topk, B = t->B;
  T_CHECK(B >= 1 && B <= p->bcap);
  T_EQ_INT(t->slot_expert[0], c->n_experts);
  T_EQ_INT(t->slot_count[0], B);
  T_EQ_INT(t->slot_off[0], 0);
  int off = B, R = 0;
  for (int s = 1; s <= t->nexp; s++) {
    T_EQ_INT(t->slot_off[s], off);
    if (s > 1) T_CHECK(t->slot_expert[s] > t->slot_expert[s - 1]);
    for (int r = 1; r < t->slot_count[s]; r++) T_CHECK(t->pair_token[off + r] > t->pair_token[off + r - 1]);
    off += t->slot_count[s], R += t->slot_count[s];
  }
  T_EQ_INT(R, t->R);
  for (int s = t->nexp + 1; s < moe_slots(p); s++) T_EQ_INT(t->slot_count[s], 0);
  if (!t->clamped) {
    T_EQ_INT(t->nexp, m->n);
    for (int i = 0; i < m->n; i++) T_EQ_INT(t->slot_count[1 + i], m->rows[i]);
  }
  bool short_tok = false;
  for (int b = 0; b < B; b++) {
    T_EQ_INT(t->tok_pair[b * (K + 1)], b);
    T_CHECK(t->tok_n[b] <= K);
    float sum = 0;
    for (int k = 0; k < t->tok_n[b]; k++) {
      int pr = t->tok_pair[b * (K + 1) + 1 + k];
      T_CHECK(pr >= B && pr < B + t->R);
      T_EQ_INT(t->pair_token[pr], b);
      T_CHECK(fabsf(t->pair_weight[pr] - t->tok_weight[b * K + k]) == 0);
      /* the pair's slot holds the expert the token names */
      int s = 1;
      while (s <= t->nexp && !(pr >= t->slot_off[s] && pr < t->slot_off[s] + t->slot_count[s])) s++;
      T_CHECK(s <= t->nexp);
      if (s <= t->nexp) T_EQ_INT(t->slot_expert[s], t->tok_expert[b * K + k]);
      for (int j = 0; j < k; j++) T_CHECK(t->tok_expert[b * K + j] != t->tok_expert[b * K + k]);
      sum += t->tok_weight[b * K + k];
    }
    if (t->tok_n[b]) T_CHECK(fabsf(sum - c->scaling) < 1e-4f);
    for (int k = t->tok_n[b]; k < K; k++) {
      short_tok = true;
      T_EQ_INT(t->tok_pair[b * (K + 1) + 1 + k], t->zero_pair);
    }
  }
  if (short_tok) T_CHECK(t->zero_pair >= B + t->R && t->zero_pair < moe_pairs(p));
  else T_EQ_INT(t->zero_pair, -1);
}

static void test_tables(void) {
  t_current = "tables";
  model_moe_cfg c = model_moe_glm5();
  uint64_t rng = 1;
  mj_err err = {0};
  /* Batch 1: 8 experts, one row each. */
  {
    moe_plan p;
    moe_plan_default(&c, 1, &p);
    int32_t e[8] = {3, 17, 40, 41, 99, 128, 200, 255}, r[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    trace_moe m = {.layer = 3, .bucket = 1, .n = 8, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 1, &rng, &t, &err), 0);
    T_EQ_INT(t.B, 1);
    T_EQ_INT(t.R, 8);
    T_CHECK(!t.clamped);
    check_tables(&p, &m, &t);
    replay_tables_free(&t);
  }
  /* Batch 5 in bucket 8, 40 pairs over experts of uneven popularity. */
  {
    moe_plan p;
    moe_plan_default(&c, 8, &p);
    int32_t e[12] = {0, 1, 2, 5, 9, 30, 31, 64, 100, 101, 102, 250}, r[12] = {5, 5, 4, 4, 3, 3, 3, 3, 3, 3, 2, 2};
    trace_moe m = {.layer = 3, .bucket = 8, .n = 12, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 5, &rng, &t, &err), 0);
    T_EQ_INT(t.B, 5);
    T_EQ_INT(t.R, 40);
    T_EQ_INT(t.zero_pair, -1);
    check_tables(&p, &m, &t);
    for (int b = 0; b < 5; b++) T_EQ_INT(t.tok_n[b], 8);
    replay_tables_free(&t);
  }
  /* A short record (fewer pairs than rows x topk): spare entries read the zero pair. */
  {
    moe_plan p;
    moe_plan_default(&c, 16, &p);
    int32_t e[3] = {7, 8, 9}, r[3] = {4, 2, 1};
    trace_moe m = {.layer = 0, .bucket = 16, .n = 3, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 4, &rng, &t, &err), 0);
    T_EQ_INT(t.B, 4);
    T_EQ_INT(t.zero_pair, 4 + 7);
    check_tables(&p, &m, &t);
    replay_tables_free(&t);
  }
  /* The step claims 1 row, but an expert has 3: tokens grow to 3. */
  {
    moe_plan p;
    moe_plan_default(&c, 4, &p);
    int32_t e[2] = {1, 2}, r[2] = {3, 1};
    trace_moe m = {.layer = 0, .bucket = 4, .n = 2, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 1, &rng, &t, &err), 0);
    T_EQ_INT(t.B, 3);
    check_tables(&p, &m, &t);
    replay_tables_free(&t);
  }
  /* Over-full: 3 experts of 2 rows in bucket 1 (top-8 allows 8 pairs, 1 per expert). */
  {
    model_moe_cfg c2 = c;
    c2.topk = 2;
    moe_plan p;
    moe_plan_default(&c2, 1, &p);
    int32_t e[3] = {1, 2, 3}, r[3] = {2, 2, 2};
    trace_moe m = {.layer = 0, .bucket = 1, .n = 3, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 1, &rng, &t, &err), 0);
    T_CHECK(t.clamped);
    T_EQ_INT(t.R, 2);
    T_EQ_INT(t.nexp, 2);
    check_tables(&p, &m, &t);
    replay_tables_free(&t);
  }
  /* An expert id out of range is an input error. */
  {
    moe_plan p;
    moe_plan_default(&c, 1, &p);
    int32_t e[1] = {256}, r[1] = {1};
    trace_moe m = {.layer = 0, .bucket = 1, .n = 1, .expert = e, .rows = r};
    replay_tables t;
    T_EQ_INT(replay_tables_build(&p, &m, 1, &rng, &t, &err), MJ_EINPUT);
    mj_err_clear(&err);
  }
}

static void test_buckets(void) {
  t_current = "buckets";
  int32_t e[2] = {1, 2}, r[2] = {1, 1};
  trace_moe m8[2] = {{.layer = 3, .bucket = 8, .n = 2, .expert = e, .rows = r},
                     {.layer = 4, .bucket = 8, .n = 1, .expert = e, .rows = r}};
  trace_moe m1[1] = {{.layer = 3, .bucket = 1, .n = 2, .expert = e, .rows = r}};
  trace_step s[3] = {{.step = 0, .rows = 5, .captured = 8, .nmoe = 2, .moe = m8},
                     {.step = 1, .rows = 1, .captured = 1, .nmoe = 1, .moe = m1},
                     {.step = 2, .rows = 7, .captured = 0, .nmoe = 2, .moe = m8}};
  trace_file tf = {.steps = s, .nsteps = 3};
  replay_bucket *b = NULL;
  int n = replay_buckets(&tf, &b);
  T_EQ_INT(n, 2);
  if (n == 2) {
    T_EQ_INT(b[0].bucket, 1);
    T_EQ_INT(b[0].records, 1);
    T_EQ_INT(b[1].bucket, 8);
    T_EQ_INT(b[1].records, 4);
    T_EQ_INT(b[1].steps, 2);
    T_EQ_INT(b[1].eager, 2);
    T_EQ_INT(b[1].max_rows, 7);
    T_CHECK(b[1].experts_sum == 6);
  }
  free(b);
}

/* A small trace: one step of 1 row (bucket 1), two of 5 rows (bucket 8;
 * the second eager), one of 40 rows (bucket 64); two MoE layers a step. */
static int write_trace(const char *path, int hidden) {
  trace_header h = {.version = TRACE_VERSION, .hidden = hidden, .inter = 2048, .n_experts = 256, .topk = 8,
                    .n_group = 1, .topk_group = 1, .layers = 5};
  snprintf(h.model, sizeof h.model, "synthetic:glm5");
  snprintf(h.moejit_version, sizeof h.moejit_version, "test");
  mj_err err = {0};
  trace_writer *w = NULL;
  int rc = trace_open(path, &h, &w, &err);
  int rows[4] = {1, 5, 5, 40}, buckets[4] = {1, 8, 8, 64}, captured[4] = {1, 8, 0, 64};
  int32_t ex[256], rw[256];
  for (int s = 0; s < 4 && !rc; s++) {
    trace_moe m[2];
    for (int l = 0; l < 2; l++) {
      /* rows x 8 pairs over the experts: expert i gets min(rows, what is left) */
      int left = rows[s] * 8, n = 0;
      for (int i = 0; left > 0; i++) {
        int r = rows[s] < left ? rows[s] : left;
        if (r > 3 && i % 2) r = 3; /* uneven popularity */
        ex[n] = (int32_t)(i * 3 + l), rw[n] = r, left -= r, n++;
      }
      int32_t *e = mj_xmalloc((size_t)n * 4), *r = mj_xmalloc((size_t)n * 4);
      memcpy(e, ex, (size_t)n * 4), memcpy(r, rw, (size_t)n * 4);
      m[l] = (trace_moe){.layer = 3 + l, .bucket = buckets[s], .n = n, .expert = e, .rows = r};
    }
    trace_step st = {.step = s, .rows = rows[s], .captured = captured[s], .nmoe = 2, .moe = m};
    rc = trace_write_step(w, &st, &err);
    for (int l = 0; l < 2; l++) free(m[l].expert), free(m[l].rows);
  }
  if (!rc) rc = trace_close(w, &err);
  if (rc) mj_err_print(&err, stderr);
  mj_err_clear(&err);
  return rc ? 1 : 0;
}

static int compile_bucket(int bucket, const char *arch) {
  model_moe_cfg c = model_moe_glm5();
  moe_plan p;
  moe_plan_engine(&c, bucket, false, &p); /* what replay --dry-run probes: the synthetic GLM-5's engine plan */
  moe_kernels k;
  mj_err err = {0};
  int rc = moe_kernels_load(&k, &p, arch, &err);
  if (rc) mj_err_print(&err, stderr);
  else moe_kernels_free(&k);
  mj_err_clear(&err);
  jit_shutdown();
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--write-trace") == 0) return write_trace(argv[2], argc >= 4 ? atoi(argv[3]) : 6144);
  if (argc >= 4 && strcmp(argv[1], "--compile-bucket") == 0) return compile_bucket(atoi(argv[2]), argv[3]);
  T_RUN(test_tables);
  T_RUN(test_buckets);
  return t_status();
}
