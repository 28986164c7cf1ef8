/* fuzz_trace.c: libFuzzer target for the shape-trace reader (trace_parse).
 *
 * Arbitrary bytes go to trace_parse.  A refusal must be one MJ_EINPUT line
 * naming the file and a line ("trace.jsonl:N: ..."); an accepted trace
 * must obey every rule of docs/trace.md, checked here again from the
 * structs (steps in order, layers and experts ascending and in range, rows
 * within their bucket), and must survive a write and a second read
 * unchanged, so the writer and the reader agree on everything the reader
 * accepts.  Seeds: tests/fuzz/trace/. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"

static void check_refusal(const mj_err *err) {
  if (err->code != MJ_EINPUT || strncmp(err->msg, "trace.jsonl:", 12) != 0 ||
      strchr(err->msg, '\n'))
    abort();
}

static void check_rules(const trace_file *t) {
  const trace_header *h = &t->h;
  if (h->n_experts < 1 || h->topk < 1 || h->topk > h->n_experts || h->layers < 1) abort();
  for (int64_t i = 0; i < t->nsteps; i++) {
    const trace_step *s = &t->steps[i];
    if (s->step != i || s->rows < 1 || s->nmoe < 0 || s->nmoe > h->layers) abort();
    for (int k = 0; k < s->nmoe; k++) {
      const trace_moe *m = &s->moe[k];
      if (m->layer < 0 || m->layer >= h->layers || (k && m->layer <= s->moe[k - 1].layer)) abort();
      if (m->bucket < s->rows || m->n < 1 || m->nkernels > TRACE_MAX_KERNELS) abort();
      int64_t sum = 0;
      for (int e = 0; e < m->n; e++) {
        if (m->expert[e] < 0 || m->expert[e] >= h->n_experts) abort();
        if (e && m->expert[e] <= m->expert[e - 1]) abort();
        if (m->rows[e] < 1 || m->rows[e] > m->bucket) abort();
        sum += m->rows[e];
      }
      if (sum > (int64_t)m->bucket * h->topk) abort();
      for (int j = 0; j < m->nkernels; j++)
        if (strlen(m->kernels[j]) != 32) abort();
    }
  }
}

/* Write t and read it back: the same trace. */
static void round_trip(const trace_file *t) {
  char path[] = "/tmp/fuzz_trace.XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return;
  close(fd);
  mj_err err = {0};
  trace_writer *w;
  if (trace_open(path, &t->h, &w, &err)) abort();
  for (int64_t i = 0; i < t->nsteps; i++)
    if (trace_write_step(w, &t->steps[i], &err)) abort();
  if (trace_close(w, &err)) abort();
  trace_file *u;
  if (trace_read(path, &u, &err)) abort();
  unlink(path);
  if (memcmp(&u->h, &t->h, sizeof t->h) != 0 || u->nsteps != t->nsteps) abort();
  for (int64_t i = 0; i < t->nsteps; i++) {
    const trace_step *a = &t->steps[i], *b = &u->steps[i];
    if (a->rows != b->rows || a->captured != b->captured || a->nmoe != b->nmoe) abort();
    for (int k = 0; k < a->nmoe; k++) {
      const trace_moe *x = &a->moe[k], *y = &b->moe[k];
      if (x->layer != y->layer || x->bucket != y->bucket || x->n != y->n ||
          x->nkernels != y->nkernels ||
          memcmp(x->expert, y->expert, (size_t)x->n * sizeof *x->expert) ||
          memcmp(x->rows, y->rows, (size_t)x->n * sizeof *x->rows) ||
          memcmp(x->kernels, y->kernels, (size_t)x->nkernels * sizeof x->kernels[0]))
        abort();
    }
  }
  trace_free(u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1 << 16)) return 0;
  trace_file *t = NULL;
  mj_err err = {0};
  if (trace_parse("trace.jsonl", (const char *)data, size, &t, &err) == 0) {
    check_rules(t);
    round_trip(t);
    trace_free(t);
  } else {
    check_refusal(&err);
  }
  mj_err_clear(&err);
  return 0;
}
