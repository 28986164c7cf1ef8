/* test_trace.c: shape traces (trace.h, docs/trace.md): a written trace reads
 * back equal; synthetic traces are deterministic for a seed and show the
 * requested skew; every broken rule gives its exact "FILE:LINE: ..." line;
 * a trace of 1000 steps x 75 layers reads in linear time. */
#include <stdlib.h>
#include <unistd.h>

#include "t.h"
#include "trace.h"

static char tmpdir[] = "/tmp/test_trace.XXXXXX";

static const char *tmp_path(const char *name) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

static trace_header glm5_header(void) {
  trace_header h = {.version = TRACE_VERSION, .hidden = 6144, .inter = 2048, .n_experts = 256,
                    .topk = 8, .n_group = 8, .topk_group = 4, .layers = 78};
  snprintf(h.moejit_version, sizeof h.moejit_version, "0.1.0");
  snprintf(h.model, sizeof h.model, "/models/glm-5 \"nvfp4\"\\\xc3\xa9");
  snprintf(h.device, sizeof h.device, "NVIDIA H200");
  snprintf(h.arch, sizeof h.arch, "sm_90a");
  return h;
}

static void test_round_trip(void) {
  trace_header h = glm5_header();
  int32_t e0[] = {0, 5, 17, 200, 255}, r0[] = {1, 2, 1, 3, 1};
  int32_t e1[] = {7}, r1[] = {4};
  trace_moe m[2] = {{.layer = 3, .bucket = 4, .n = 5, .expert = e0, .rows = r0, .nkernels = 2},
                    {.layer = 77, .bucket = 4, .n = 1, .expert = e1, .rows = r1}};
  snprintf(m[0].kernels[0], 33, "0123456789abcdef0123456789abcdef");
  snprintf(m[0].kernels[1], 33, "ffffffffffffffffffffffffffffffff");
  trace_step s[3] = {{.step = 0, .rows = 3, .captured = 4, .nmoe = 2, .moe = m},
                     {.step = 1, .rows = 100, .captured = 0, .nmoe = 0},
                     {.step = 2, .rows = 4, .captured = 4, .nmoe = 1, .moe = m + 1}};
  s[1].moe = m; /* nmoe 0: not read */
  mj_err err = {0};
  trace_writer *w;
  T_EQ_INT(trace_open(tmp_path("rt.jsonl"), &h, &w, &err), 0);
  for (int i = 0; i < 3; i++) T_EQ_INT(trace_write_step(w, &s[i], &err), 0);
  /* a step out of order is refused before anything is written */
  T_EQ_INT(trace_write_step(w, &s[0], &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "step 3 would not read back: step 0 comes after step 2") != NULL);
  mj_err_clear(&err);
  T_EQ_INT(trace_close(w, &err), 0);
  trace_file *t;
  T_EQ_INT(trace_read(tmp_path("rt.jsonl"), &t, &err), 0);
  if (!t) return;
  T_EQ_STR(t->h.model, h.model);
  T_EQ_STR(t->h.device, "NVIDIA H200");
  T_EQ_STR(t->h.arch, "sm_90a");
  T_EQ_STR(t->h.moejit_version, "0.1.0");
  T_EQ_INT(t->h.version, TRACE_VERSION);
  T_CHECK(t->h.hidden == 6144 && t->h.inter == 2048 && t->h.n_experts == 256 && t->h.topk == 8 &&
          t->h.n_group == 8 && t->h.topk_group == 4 && t->h.layers == 78);
  T_EQ_INT(t->nsteps, 3);
  for (int i = 0; i < 3 && t->nsteps == 3; i++) {
    const trace_step *a = &s[i], *b = &t->steps[i];
    T_CHECK(a->step == b->step && a->rows == b->rows && a->captured == b->captured &&
            a->nmoe == b->nmoe);
    for (int k = 0; k < a->nmoe && a->nmoe == b->nmoe; k++) {
      const trace_moe *x = &a->moe[k], *y = &b->moe[k];
      T_CHECK(x->layer == y->layer && x->bucket == y->bucket && x->n == y->n &&
              x->nkernels == y->nkernels);
      T_CHECK(memcmp(x->expert, y->expert, (size_t)x->n * 4) == 0);
      T_CHECK(memcmp(x->rows, y->rows, (size_t)x->n * 4) == 0);
      for (int j = 0; j < x->nkernels; j++) T_EQ_STR(y->kernels[j], x->kernels[j]);
    }
  }
  trace_free(t);
  /* a missing file is an I/O error */
  T_EQ_INT(trace_read(tmp_path("nope.jsonl"), &t, &err), MJ_EIO);
  mj_err_clear(&err);
}

static char *slurp(const char *path, size_t *len) {
  char *d = NULL;
  mj_err err = {0};
  T_EQ_INT(mj_read_file(path, &d, len, &err), 0);
  mj_err_clear(&err);
  return d;
}

static void test_synth_deterministic(void) {
  trace_synth_opts o = {.experts = 256, .topk = 8, .batch = 5, .steps = 20, .layers = 4,
                        .zipf = 1.2, .seed = 42};
  mj_err err = {0};
  T_EQ_INT(trace_synth(&o, tmp_path("a.jsonl"), &err), 0);
  T_EQ_INT(trace_synth(&o, tmp_path("b.jsonl"), &err), 0);
  o.seed = 43;
  T_EQ_INT(trace_synth(&o, tmp_path("c.jsonl"), &err), 0);
  size_t na, nb, nc;
  char *a = slurp(tmp_path("a.jsonl"), &na), *b = slurp(tmp_path("b.jsonl"), &nb),
       *c = slurp(tmp_path("c.jsonl"), &nc);
  T_CHECK(a && b && c && na == nb && memcmp(a, b, na) == 0);
  T_CHECK(a && c && (na != nc || memcmp(a, c, na) != 0));
  free(a), free(b), free(c);
  /* the shape of a step: bucket, captured, layers from 3 */
  trace_file *t;
  T_EQ_INT(trace_read(tmp_path("a.jsonl"), &t, &err), 0);
  if (!t) return;
  T_EQ_INT(t->nsteps, 20);
  T_EQ_INT(t->h.layers, 78);
  T_EQ_STR(t->h.model, "synthetic:glm5");
  const trace_step *s = &t->steps[7];
  T_CHECK(s->step == 7 && s->rows == 5 && s->captured == 8 && s->nmoe == 4);
  int sum = 0;
  for (int e = 0; e < s->moe[2].n; e++) sum += s->moe[2].rows[e];
  T_EQ_INT(sum, 5 * 8); /* every row picks topk distinct experts */
  T_CHECK(s->moe[0].layer == 3 && s->moe[3].layer == 6 && s->moe[1].bucket == 8);
  T_EQ_INT(s->moe[0].nkernels, 0);
  trace_free(t);
  /* beyond the largest captured size: bucket = batch, eager */
  o.batch = 100, o.steps = 1, o.layers = 1;
  T_EQ_INT(trace_synth(&o, tmp_path("d.jsonl"), &err), 0);
  T_EQ_INT(trace_read(tmp_path("d.jsonl"), &t, &err), 0);
  if (t) T_CHECK(t->steps[0].moe[0].bucket == 100 && t->steps[0].captured == 0);
  trace_free(t);
  /* options out of range are refused */
  o.topk = 300;
  T_EQ_INT(trace_synth(&o, tmp_path("e.jsonl"), &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "trace synth: topk is 300, outside 1..256");
  mj_err_clear(&err);
}

/* Rows each expert of layer 3 received over a synthetic trace. */
static void expert_rows(double zipf, int64_t *rows) {
  trace_synth_opts o = {.experts = 256, .topk = 8, .batch = 64, .steps = 100, .zipf = zipf,
                        .seed = 9};
  mj_err err = {0};
  T_EQ_INT(trace_synth(&o, tmp_path("z.jsonl"), &err), 0);
  trace_file *t;
  memset(rows, 0, 256 * sizeof *rows);
  T_EQ_INT(trace_read(tmp_path("z.jsonl"), &t, &err), 0);
  if (!t) return;
  for (int64_t i = 0; i < t->nsteps; i++)
    for (int e = 0; e < t->steps[i].moe[0].n; e++)
      rows[t->steps[i].moe[0].expert[e]] += t->steps[i].moe[0].rows[e];
  trace_free(t);
}

static void test_synth_skew(void) {
  int64_t rows[256], lo, hi, total;
  /* s = 1.2: the hottest expert is picked by almost every token, the
   * coldest rarely (weights 1 : 256^-1.2, about 780 : 1). */
  expert_rows(1.2, rows);
  lo = hi = rows[0], total = 0;
  for (int e = 0; e < 256; e++) lo = MJ_MIN(lo, rows[e]), hi = MJ_MAX(hi, rows[e]), total += rows[e];
  T_EQ_INT(total, 64 * 100 * 8);
  T_CHECK(hi > 5500);          /* of 6400 tokens (about 5950 expected) */
  T_CHECK(hi > 50 * (lo + 1)); /* far more than the least (about 20 expected) */
  /* s = 0: uniform, 200 rows per expert expected */
  expert_rows(0, rows);
  lo = hi = rows[0];
  for (int e = 0; e < 256; e++) lo = MJ_MIN(lo, rows[e]), hi = MJ_MAX(hi, rows[e]);
  T_CHECK(lo > 140 && hi < 260);
}

/* ---- malformed traces: the exact message of each broken rule ------------------------- */
#define HDR "{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\"," \
            "\"moe\":{\"hidden\":64,\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,"       \
            "\"topk_group\":1},\"layers\":6}\n"
#define STEP0 "{\"step\":0,\"rows\":2,\"captured\":2,\"moe\":[{\"layer\":3,\"bucket\":2,"     \
              "\"experts\":[1,4,9],\"rows\":[2,1,1],\"kernels\":[]}]}\n"

static void expect_bad(const char *text, const char *msg) {
  trace_file *t = NULL;
  mj_err err = {0};
  int r = trace_parse("t.jsonl", text, strlen(text), &t, &err);
  T_EQ_INT(r, MJ_EINPUT);
  T_EQ_STR(err.msg, msg);
  T_CHECK(t == NULL);
  mj_err_clear(&err);
}

/* Step 1 after STEP0 with the MoE layer entries moe: the error is on line 3. */
static void expect_bad_moe(const char *moe, const char *msg) {
  char text[4096];
  snprintf(text, sizeof text, HDR STEP0 "{\"step\":1,\"rows\":2,\"captured\":2,\"moe\":[%s]}", moe);
  expect_bad(text, msg);
}

static void expect_ok(const char *text, int64_t nsteps) {
  trace_file *t = NULL;
  mj_err err = {0};
  T_EQ_INT(trace_parse("t.jsonl", text, strlen(text), &t, &err), 0);
  if (err.code) fprintf(stderr, "  %s\n", err.msg);
  if (t) T_EQ_INT(t->nsteps, nsteps);
  trace_free(t);
  mj_err_clear(&err);
}

static void test_accepted(void) {
  expect_ok(HDR STEP0, 1);
  expect_ok(HDR STEP0 "{\"step\":1,\"rows\":2,\"captured\":2,\"moe\":[{\"layer\":3,\"bucket\":2,"
                  "\"experts\":[0],\"rows\":[2],\"kernels\":[]}]}", 2);
  expect_ok(HDR, 0);                                                /* no steps yet */
  expect_ok("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\","
            "\"moe\":{\"hidden\":64,\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,"
            "\"topk_group\":1},\"layers\":6}", 0);                  /* no final newline */
  expect_ok(HDR "{\"step\":0,\"rows\":9,\"captured\":0,\"moe\":[]}\r\n", 1); /* CRLF, eager */
}

static void test_malformed(void) {
  /* the file and its lines */
  expect_bad("", "t.jsonl:1: empty file (a trace starts with its header line)");
  expect_bad(HDR "\n" STEP0, "t.jsonl:2: empty line (a trace has none; only the last line's newline is optional)");
  expect_bad(HDR STEP0 "  \n", "t.jsonl:3: empty line (a trace has none; only the last line's newline is optional)");
  expect_bad(HDR "{\"step\":0,", "t.jsonl:2:11: bad JSON: unterminated object");
  expect_bad(HDR "{\"step\":0} x\n", "t.jsonl:2:12: bad JSON: trailing characters after the value");
  /* the header */
  expect_bad(STEP0, "t.jsonl:1: the header is missing: the first line is a step (a trace starts with {\"moejit_trace\":1,...})");
  expect_bad("[1,2]\n", "t.jsonl:1: not a moejit trace: the first line must be the header {\"moejit_trace\":1,...}");
  expect_bad("{\"moejit_trace\":2,\"what\":1}\n", "t.jsonl:1: unsupported trace version 2 (this moejit reads version 1)");
  expect_bad("{\"moejit_trace\":\"1\"}\n", "t.jsonl:1: moejit_trace (the format version) must be an integer, not string");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\"}\n", "t.jsonl:1: header: missing field \"model\"");
  expect_bad("{\"moejit_trace\":1,\"modle\":\"x\"}\n",
             "t.jsonl:1: header: unknown field \"modle\" (known: moejit_trace, moejit, model, device, arch, moe, layers)");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\",\"moe\":{\"hidden\":64,"
             "\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,\"topk_group\":1},\"layers\":6,\"layers\":6}\n",
             "t.jsonl:1: header: field \"layers\" appears twice");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":7,\"device\":\"\",\"arch\":\"\",\"moe\":{},\"layers\":6}\n",
             "t.jsonl:1: header.moe: missing field \"hidden\"");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":7,\"device\":\"\",\"arch\":\"\",\"moe\":{\"hidden\":64,"
             "\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,\"topk_group\":1},\"layers\":6}\n",
             "t.jsonl:1: model must be a string, not number");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"sm_90a_and_more_\",\"moe\":{\"hidden\":64,"
             "\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,\"topk_group\":1},\"layers\":6}\n",
             "t.jsonl:1: arch is longer than 15 bytes");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\",\"moe\":{\"hidden\":64,"
             "\"inter\":32,\"experts\":16,\"topk\":17,\"n_group\":1,\"topk_group\":1},\"layers\":6}\n",
             "t.jsonl:1: moe.topk is 17, outside 1..16");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\",\"moe\":{\"hidden\":64,"
             "\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":3,\"topk_group\":1},\"layers\":6}\n",
             "t.jsonl:1: moe.n_group (3) does not divide moe.experts (16)");
  expect_bad("{\"moejit_trace\":1,\"moejit\":\"0.1.0\",\"model\":\"m\",\"device\":\"\",\"arch\":\"\",\"moe\":{\"hidden\":64.5,"
             "\"inter\":32,\"experts\":16,\"topk\":2,\"n_group\":1,\"topk_group\":1},\"layers\":6}\n",
             "t.jsonl:1: moe.hidden must be an integer, not 64.5");
  expect_bad("{\"moejit_trace\":1.0}\n",
             "t.jsonl:1: moejit_trace (the format version) must be written as an integer (no fraction or exponent)");
  expect_bad(HDR HDR, "t.jsonl:2: a second header (a trace has one, on line 1)");
  /* steps */
  expect_bad(HDR "[]\n", "t.jsonl:2: a step line must be an object, not array");
  expect_bad(HDR "{\"step\":0,\"rows\":2,\"moe\":[]}\n", "t.jsonl:2: missing field \"captured\"");
  expect_bad(HDR "{\"step\":0,\"rows\":2,\"captured\":2,\"moe\":[],\"extra\":1}\n",
             "t.jsonl:2: unknown field \"extra\" (known: step, rows, captured, moe)");
  expect_bad(HDR "{\"step\":\"0\",\"rows\":2,\"captured\":2,\"moe\":[]}\n", "t.jsonl:2: step must be an integer, not string");
  expect_bad(HDR "{\"step\":1,\"rows\":2,\"captured\":2,\"moe\":[]}\n", "t.jsonl:2: the first step is 1, not 0");
  expect_bad(HDR STEP0 "{\"step\":0,\"rows\":2,\"captured\":2,\"moe\":[]}\n",
             "t.jsonl:3: step 0 comes after step 0 (steps count 0, 1, 2, ... in order)");
  expect_bad(HDR STEP0 "{\"step\":5,\"rows\":2,\"captured\":2,\"moe\":[]}\n",
             "t.jsonl:3: step 5 comes after step 0 (steps count 0, 1, 2, ... in order)");
  expect_bad(HDR "{\"step\":0,\"rows\":0,\"captured\":2,\"moe\":[]}\n", "t.jsonl:2: rows is 0, outside 1..1048576");
  expect_bad(HDR "{\"step\":0,\"rows\":4,\"captured\":2,\"moe\":[]}\n",
             "t.jsonl:2: captured is 2: 0 (eager) or a size holding the step's 4 rows");
  expect_bad(HDR "{\"step\":0,\"rows\":4,\"captured\":0,\"moe\":{}}\n", "t.jsonl:2: moe must be an array, not object");
  expect_bad(HDR "{\"step\":0,\"rows\":3,\"captured\":0,\"moe\":[{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]}]}\n",
             "t.jsonl:2: moe[0]: bucket 2 is smaller than the step's rows (3)");
  expect_bad(HDR "{\"step\":0,\"rows\":99999999999,\"captured\":0,\"moe\":[]}\n",
             "t.jsonl:2: rows is 99999999999, out of range");
  expect_bad(HDR "{\"step\":0,\"rows\":1e20,\"captured\":0,\"moe\":[]}\n", "t.jsonl:2: rows is 1e+20, out of range");
  /* MoE layers */
  expect_bad_moe("{\"layer\":3,\"bucket\":0,\"experts\":[1],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].bucket is 0, outside 1..1048576");
  expect_bad_moe("{\"layer\":6,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].layer is 6, outside 0..5");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]},"
                             "{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[1]: layer 3 repeats layer 3 of moe[0] (layers ascend, each once)");
  expect_bad_moe("{\"layer\":4,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]},"
                             "{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[1]: layer 3 comes after layer 4 of moe[0] (layers ascend, each once)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1]}",
             "t.jsonl:3: moe[0]: missing field \"kernels\"");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[],\"k\":0}",
             "t.jsonl:3: moe[0]: unknown field \"k\" (known: layer, bucket, experts, rows, kernels)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[16],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts[0] is 16, outside 0..15");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[-1],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts[0] is -1, outside 0..15");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[4,2],\"rows\":[1,1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts[1]: expert 2 comes after 4 (experts ascend, each once)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[4,4],\"rows\":[1,1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts[1]: expert 4 repeats 4 (experts ascend, each once)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1.5],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts[0] must be an integer, not 1.5");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[],\"rows\":[],\"kernels\":[]}",
             "t.jsonl:3: moe[0]: 0 experts; a layer lists 1..16 (the experts with rows)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"
                             "\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0].experts has 17 items, more than 16");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1,2],\"rows\":[1],\"kernels\":[]}",
             "t.jsonl:3: moe[0]: 2 experts but 1 rows (one count per expert)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[0],\"kernels\":[]}",
             "t.jsonl:3: moe[0].rows[0]: expert 1 has 0 rows, outside 1..2 (the bucket)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[3],\"kernels\":[]}",
             "t.jsonl:3: moe[0].rows[0]: expert 1 has 3 rows, outside 1..2 (the bucket)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1,2,3],\"rows\":[2,2,1],\"kernels\":[]}",
             "t.jsonl:3: moe[0]: 5 rows in all, more than bucket 2 x topk 2");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[\"0123\"]}",
             "t.jsonl:3: moe[0].kernels[0] must be a string of 32 lowercase hex digits (a cache key hash)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],"
                             "\"kernels\":[\"0123456789ABCDEF0123456789abcdef\"]}",
             "t.jsonl:3: moe[0].kernels[0] must be a string of 32 lowercase hex digits (a cache key hash)");
  expect_bad_moe("{\"layer\":3,\"bucket\":2,\"experts\":[1],\"rows\":[1],\"kernels\":[1,2,3,4,5,6,7,8,9,"
                             "10,11,12,13,14,15,16,17]}",
             "t.jsonl:3: moe[0].kernels has 17 items, more than 16");
  expect_bad(HDR STEP0 "{\"step\":1,\"rows\":2,\"captured\":2,\"moe\":[1,2,3,4,5,6,7]}",
             "t.jsonl:3: moe has 7 items, more than 6");
  expect_bad(HDR STEP0 "{\"step\":1,\"rows\":2,\"captured\":2,\"moe\":[7]}",
             "t.jsonl:3: moe[0] must be an object, not number");
}

/* 1000 steps of 75 MoE layers (GLM-5's decode) read in one linear pass. */
static void test_large(void) {
  trace_synth_opts o = {.experts = 256, .topk = 8, .batch = 4, .steps = 1000, .layers = 75,
                        .zipf = 1.0, .seed = 1};
  mj_err err = {0};
  T_EQ_INT(trace_synth(&o, tmp_path("big.jsonl"), &err), 0);
  double t0 = mj_now_ms();
  trace_file *t;
  T_EQ_INT(trace_read(tmp_path("big.jsonl"), &t, &err), 0);
  double ms = mj_now_ms() - t0;
  if (t) T_CHECK(t->nsteps == 1000 && t->steps[999].nmoe == 75 && t->steps[999].moe[74].layer == 77);
  trace_free(t);
  printf("     1000 steps x 75 layers read in %.0f ms\n", ms);
  T_CHECK(ms < 30000); /* about 0.5 s here; quadratic reading would take hours */
}

int main(void) {
  if (!mkdtemp(tmpdir)) return 1;
  T_RUN(test_round_trip);
  T_RUN(test_synth_deterministic);
  T_RUN(test_synth_skew);
  T_RUN(test_accepted);
  T_RUN(test_malformed);
  T_RUN(test_large);
  const char *names[] = {"rt.jsonl", "a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl", "e.jsonl",
                         "z.jsonl", "big.jsonl"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(names); i++) unlink(tmp_path(names[i]));
  rmdir(tmpdir);
  return t_status();
}
