/* ref_model.c: CPU reference ops of the GLM-5 forward pass (ref_model.h).
 *
 * Matmuls decode one weight row at a time into float32 (model_weight_row)
 * and dot it with every token, so each weight byte is read once per call
 * whatever the batch, and NVFP4 rows are dequantised with the reference's
 * exact product order.  Sums run in float32 with four partial sums (the
 * compiler vectorises them); the reference's own float32 sums are blocked
 * differently, which is why comparisons use a tolerance, not equality.
 */
#include "ref_model.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void ref_rmsnorm(const float *x, const model_vec *w, double eps, int64_t n, float *y) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float var = (float)(ss / (double)n);
  float r = 1.0f / sqrtf(var + (float)eps);
  for (int64_t i = 0; i < n; i++) y[i] = model_vec_at(w, i) * (x[i] * r);
}

void ref_layernorm(const float *x, const model_vec *w, const model_vec *b, double eps, int64_t n, float *y) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += x[i];
  float mean = (float)(s / (double)n);
  double v = 0;
  for (int64_t i = 0; i < n; i++) v += (double)(x[i] - mean) * (x[i] - mean);
  float r = 1.0f / sqrtf((float)(v / (double)n) + (float)eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * r * model_vec_at(w, i) + model_vec_at(b, i);
}

static float dot(const float *a, const float *b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; i++) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

typedef struct {
  const model_weight *w;
  const float *x;
  int64_t n, r0, r1;
  float *y;
} mm_job;

static void *mm_run(void *arg) {
  mm_job *j = arg;
  int64_t K = j->w->cols, R = j->w->rows;
  float *row = malloc((size_t)K * sizeof *row);
  if (!row) return NULL; /* cannot happen for sane widths; y stays as is */
  for (int64_t r = j->r0; r < j->r1; r++) {
    model_weight_row(j->w, r, row);
    for (int64_t t = 0; t < j->n; t++) j->y[t * R + r] = dot(row, j->x + t * K, K);
  }
  free(row);
  return NULL;
}

void ref_matmul(const model_weight *w, const float *x, int64_t n, float *y, int nthreads) {
  int64_t R = w->rows;
  /* Below ~4 M multiply-adds a thread costs more than it saves. */
  if (nthreads < 1 || (double)R * (double)w->cols * (double)n < 4e6) nthreads = 1;
  if (nthreads > 64) nthreads = 64;
  if (nthreads > R) nthreads = (int)R;
  mm_job jobs[64];
  pthread_t th[64];
  int started[64] = {0};
  for (int i = 0; i < nthreads; i++)
    jobs[i] = (mm_job){w, x, n, R * i / nthreads, R * (i + 1) / nthreads, y};
  for (int i = 1; i < nthreads; i++) started[i] = pthread_create(&th[i], NULL, mm_run, &jobs[i]) == 0;
  mm_run(&jobs[0]);
  for (int i = 1; i < nthreads; i++) {
    if (started[i]) pthread_join(th[i], NULL);
    else mm_run(&jobs[i]); /* no thread: do its share here */
  }
}

float ref_silu(float x) { return x / (1.0f + expf(-x)); }
float ref_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void ref_swiglu(const model_mlp *m, const float *x, int64_t n, float *y, int nthreads) {
  int64_t I = m->gate.rows;
  float *g = malloc((size_t)(n * I) * sizeof *g), *u = malloc((size_t)(n * I) * sizeof *u);
  MJ_ASSERT(g && u);
  ref_matmul(&m->gate, x, n, g, nthreads);
  ref_matmul(&m->up, x, n, u, nthreads);
  for (int64_t i = 0; i < n * I; i++) g[i] = ref_silu(g[i]) * u[i];
  ref_matmul(&m->down, g, n, y, nthreads);
  free(g), free(u);
}

void ref_rope_interleaved(float *x, int64_t dim, int64_t pos, const float *inv) {
  int64_t h = dim / 2;
  float tmp[1024];
  float *o = dim <= 1024 ? tmp : malloc((size_t)dim * sizeof *o);
  MJ_ASSERT(o);
  for (int64_t i = 0; i < h; i++) {
    /* freqs = inv_freq * position in float32; cos/sin of that float. */
    float ang = inv[i] * (float)pos;
    float c = (float)cos((double)ang), s = (float)sin((double)ang);
    float x1 = x[2 * i], x2 = x[2 * i + 1];
    o[i] = x1 * c - x2 * s;
    o[h + i] = x2 * c + x1 * s;
  }
  memcpy(x, o, (size_t)dim * sizeof *o);
  if (o != tmp) free(o);
}

void ref_attend(const float *qa, const float *ka, int64_t na, int64_t ka_stride, const float *qr, const float *kr,
                int64_t dr, int64_t kr_stride, const uint8_t *sel, int64_t vis, float scale, const float *val,
                int64_t nv, int64_t v_stride, float *p, float *out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < vis; j++) {
    if (!sel[j]) continue;
    const float *kj = ka + j * ka_stride, *rj = kr + j * kr_stride;
    float d = 0;
    for (int64_t e = 0; e < na; e++) d += qa[e] * kj[e];
    for (int64_t e = 0; e < dr; e++) d += qr[e] * rj[e];
    p[j] = d * scale;
    if (p[j] > mx) mx = p[j];
  }
  float sum = 0;
  for (int64_t j = 0; j < vis; j++)
    if (sel[j]) sum += (p[j] = expf(p[j] - mx));
  memset(out, 0, (size_t)nv * sizeof *out);
  for (int64_t j = 0; j < vis; j++) {
    if (!sel[j]) continue;
    float pj = p[j] / sum;
    const float *vj = val + j * v_stride;
    for (int64_t e = 0; e < nv; e++) out[e] += pj * vj[e];
  }
}

typedef struct {
  float v;
  int64_t i;
} vi;

static int vi_cmp(const void *a, const void *b) {
  const vi *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

void ref_topk(const float *v, int64_t n, int64_t k, int64_t *idx) {
  vi *a = malloc((size_t)(n ? n : 1) * sizeof *a);
  MJ_ASSERT(a);
  for (int64_t i = 0; i < n; i++) a[i] = (vi){v[i], i};
  qsort(a, (size_t)n, sizeof *a, vi_cmp);
  for (int64_t i = 0; i < k && i < n; i++) idx[i] = a[i].i;
  free(a);
}

void ref_route(const float *logits, const model_vec *bias, const model_config *c, int64_t *idx, float *w) {
  int64_t E = c->n_routed_experts, G = c->n_group, per = E / G, K = c->num_experts_per_tok;
  float *s = malloc((size_t)E * sizeof *s), *choice = malloc((size_t)E * sizeof *choice);
  float *gs = malloc((size_t)G * sizeof *gs);
  int64_t *gi = malloc((size_t)G * sizeof *gi);
  MJ_ASSERT(s && choice && gs && gi);
  for (int64_t e = 0; e < E; e++) {
    s[e] = ref_sigmoid(logits[e]);
    choice[e] = s[e] + model_vec_at(bias, e);
  }
  if (G > 1) {
    /* Group score: the sum of the group's two best choice values. */
    for (int64_t g = 0; g < G; g++) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; e++) {
        if (choice[e] > b1) b2 = b1, b1 = choice[e];
        else if (choice[e] > b2) b2 = choice[e];
      }
      gs[g] = b1 + b2;
    }
    ref_topk(gs, G, c->topk_group, gi);
    uint8_t keep[4096] = {0};
    MJ_ASSERT(G <= 4096);
    for (int64_t k = 0; k < c->topk_group; k++) keep[gi[k]] = 1;
    for (int64_t e = 0; e < E; e++)
      if (!keep[e / per]) choice[e] = -INFINITY;
  }
  ref_topk(choice, E, K, idx);
  ref_route_weights(logits, c, idx, w);
  free(s), free(choice), free(gs), free(gi);
}

void ref_route_weights(const float *logits, const model_config *c, const int64_t *idx, float *w) {
  int64_t K = c->num_experts_per_tok;
  float sum = 0;
  for (int64_t k = 0; k < K; k++) sum += (w[k] = ref_sigmoid(logits[idx[k]]));
  for (int64_t k = 0; k < K; k++) {
    if (c->norm_topk_prob) w[k] /= sum + 1e-20f;
    w[k] *= (float)c->routed_scaling_factor;
  }
}
