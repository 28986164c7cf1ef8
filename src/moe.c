/* moe.c: the device side of the MoE layer (see moe.h and docs/moe.md).
 *
 * The layout is chosen for the kernel's decode, not for the checkpoint: a
 * weight row becomes one record, its codes (16 bytes per 32 values) then
 * its scales, so a warp streams a row's bytes from one place; the four
 * 32-bit words of a 16-byte chunk each hold 8 codes with their bits
 * scattered so that four masks and a few shifts turn a word into four
 * bf16x2 values (moe_record_value below is that decode in C, and the
 * repack round-trip test checks it against the checkpoint's values).
 * Repacking happens once, on the host, when weights are loaded. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"
#include "embed.h"
#include "moe.h"
#include "jit.h"
#include "kernels.h"

/* Where the bits m, e0, e1, s (e2m1: s e1 e0 m) of output o's low value sit
 * in the word; the high value's are 16 higher.  The kernel's decode:
 *   o0 = v & 0x81C081C0            bits 6,7,8,15  -> 6,7,8,15
 *   o1 = (v << 3) & 0x81C081C0     bits 3,4,5,12
 *   o2 = (v << 6) & 0x81C081C0     bits 0,1,2,9
 *   o3 = (v >> 4) & 0x00C000C0 | (v >> 5) & 0x01000100 | (v << 1) & 0x80008000
 *                                  bits 10,11 -> 6,7; 13 -> 8; 14 -> 15
 * leaving each value as bf16 bits s<<15 | e<<7 | m<<6 = e2m1 * 2^-126. */
static const int bitpos[4][4] = {{6, 7, 8, 15}, {3, 4, 5, 12}, {0, 1, 2, 9}, {10, 11, 13, 14}};

size_t moe_gate_up_bytes(const model_moe_cfg *c) { return 2 * (size_t)c->inter * moe_record_bytes(c->hidden); }
size_t moe_down_bytes(const model_moe_cfg *c) { return (size_t)c->hidden * moe_record_bytes(c->inter); }

void moe_repack_row(const uint8_t *codes, const uint8_t *scales, int k, uint8_t *rec) {
  for (int c = 0; c < k / 32; c++)
    for (int q = 0; q < 4; q++) {
      uint32_t v = 0;
      for (int o = 0; o < 4; o++)
        for (int hf = 0; hf < 2; hf++) {
          int col = 32 * c + 8 * q + 2 * o + hf;
          unsigned code = (codes[col / 2] >> (4 * (col & 1))) & 15;
          for (int bit = 0; bit < 4; bit++)
            v |= (uint32_t)((code >> bit) & 1) << (bitpos[o][bit] + 16 * hf);
        }
      uint8_t *w = rec + 16 * c + 4 * q; /* little-endian, as the GPU reads it */
      w[0] = (uint8_t)v, w[1] = (uint8_t)(v >> 8), w[2] = (uint8_t)(v >> 16), w[3] = (uint8_t)(v >> 24);
    }
  memcpy(rec + k / 2, scales, (size_t)k / 16);
}

void moe_repack_gate_up(const model_nvfp4 *gate, const model_nvfp4 *up, uint8_t *dst) {
  size_t rb = moe_record_bytes(gate->k);
  for (int r = 0; r < gate->n; r++) {
    moe_repack_row(gate->w + (size_t)r * gate->k / 2, gate->s + (size_t)r * gate->k / 16, gate->k, dst + 2 * r * rb);
    moe_repack_row(up->w + (size_t)r * up->k / 2, up->s + (size_t)r * up->k / 16, up->k, dst + (2 * r + 1) * rb);
  }
}

void moe_repack_down(const model_nvfp4 *down, uint8_t *dst) {
  size_t rb = moe_record_bytes(down->k);
  for (int r = 0; r < down->n; r++)
    moe_repack_row(down->w + (size_t)r * down->k / 2, down->s + (size_t)r * down->k / 16, down->k, dst + r * rb);
}

float moe_record_value(const uint8_t *rec, int k, int col) {
  int c = col / 32, q = (col % 32) / 8, o = (col % 8) / 2, hf = col & 1;
  const uint8_t *p = rec + 16 * c + 4 * q;
  uint32_t v = p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  uint32_t out[4] = {v & 0x81C081C0u, (v << 3) & 0x81C081C0u, (v << 6) & 0x81C081C0u,
                     ((v >> 4) & 0x00C000C0u) | ((v >> 5) & 0x01000100u) | ((v << 1) & 0x80008000u)};
  bf16 bits = (bf16)(out[o] >> (16 * hf));
  float w = dt_bf16_to_f32(bits) * 0x1p126f; /* exact: the decode is e2m1 * 2^-126 */
  return w * dt_e4m3_to_f32(rec[k / 2 + col / 16]);
}

/* ---- plan -------------------------------------------------------------------------- */
void moe_plan_default(const model_moe_cfg *c, int bcap, moe_plan *p) {
  memset(p, 0, sizeof *p);
  p->cfg = *c;
  p->bcap = bcap;
  /* Expected rows per active expert: 1 at batch 1, ~1.1 at 8, ~2.3 at 64,
   * ~4 at 128 (glm5.md) under uniform routing, more where routing is
   * skewed (the benchmark's random router: 3.4 at 64).  A slot of more rows
   * than MT takes more passes, each reading its tile of weights again, which
   * at bucket 32 and up no longer hits in L2: MT 8 (the tensor-core tile's n)
   * took the layer from 55.6% to 62.9% of copy at 32 and from 47.5% to
   * 55.6% at 64 against MT 4 on the H200 (bench/results/2026-12-05-moe-mt.md).  Where a target cannot declare
   * MT rows of staged x (gate_up's 96 KiB at MT 8 needs sm_90a or
   * sm_100a), moe_kernel_mt takes fewer for a staged tile; XG tiles stage
   * nothing and keep MT. */
  p->mt = bcap <= 1 ? 1 : bcap <= 16 ? 2 : 8;
  /* Buckets not measured follow the instruction count: from MT 2 the
   * bf16x2 FMAs (0.5 a weight per row of the pass) cost more than the
   * tensor-core path's fixed 0.5 a weight (the block-scale multiply), so
   * tensor cores from bucket 4, four chunks a load batch (8 loads of 16
   * bytes in flight a lane, as gemv_bf16); below, the FMA path. */
  static const moe_tile fma_gu = {.rows = 2, .threads = 256, .chain = 8}, fma_dn = {.rows = 4, .threads = 256, .chain = 8},
                        mma4 = {.rows = 16, .threads = 256, .chain = 8, .mma = 4};
  p->gu = bcap >= 4 ? mma4 : fma_gu;
  p->dn = bcap >= 4 ? mma4 : fma_dn;
  /* Buckets 1 to 64 as measured on the H200: bucket 1's capped registers
   * (bench/results/2026-12-02-moe-2.md: 15% over the uncapped tiles), the
   * rest `moejit warmup --tune`'s winners over the capture set
   * (bench/results/2026-12-04-tune.md). */
  /* From bucket 32 gate_up reads x from L1 (XG): its 96 KiB of staged x
   * held an SM to two blocks, each waiting for its staging before its
   * first weight load; on an H100 the XG tile took gate_up from 72.9% to
   * 85.0% of copy at 64, from 77.4% to 89.4% at 32 and 10.8% faster at
   * 128, and lost 4-6% at 8 and 16 to the staged FMA tile; bucket 8's FMA
   * tile with x from L1 in turn gained 3.9% alone (286.7 against 298.2 us,
   * the layer 85.0% of copy) (bench/results/2026-12-06-s21.md; not yet
   * measured on the H200; at bucket 1 the FMA XG tiles' gains alone, 0-4%,
   * did not show in the layer, so bucket 1 stays staged).  Bucket 4 takes
   * bucket 8's gate_up: an FMA gate_up won over the tensor-core tile in
   * each of three tuning runs on H100s; with this one (x from L1) alone
   * changed the layer was 7.2% faster, and 8.8% and 9.4% in the runs
   * whose down tile was tuned too (bench/results/2026-12-06-s20.md, its
   * gate_up the staged 4:256:8:0:0:2, and 2026-12-06-s22.md). */
  static const moe_tile gu4 = {.rows = 4, .threads = 256, .chain = 8, .minb = 2},
                        dn1 = {.rows = 4, .threads = 256, .chain = 8, .minb = 3},
                        gu4xg = {.rows = 4, .threads = 256, .chain = 8, .minb = 2, .xg = 1},
                        guxg = {.rows = 16, .threads = 128, .chain = 8, .mma = 4, .xg = 1},
                        mma8 = {.rows = 16, .threads = 256, .chain = 8, .mma = 8},
                        dn32 = {.rows = 16, .threads = 256, .chain = 8, .minb = 2, .mma = 4};
  static const struct {
    int bcap;
    const moe_tile *gu, *dn;
  } measured[] = {{1, &gu4, &dn1},  {2, &gu4, &mma8},  {4, &gu4xg, &mma8}, {8, &gu4xg, &mma8},
                  {16, &gu4, &mma8}, {32, &guxg, &dn32}, {64, &guxg, &mma8}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(measured); i++)
    if (measured[i].bcap == bcap) p->gu = *measured[i].gu, p->dn = *measured[i].dn;
  if (bcap > 64) p->gu = guxg; /* one XG tile from 32 up: at 128 its KJ 8 twin ran 2.8% faster, once */
  p->router_tb = bcap < 8 ? bcap : 8;
  /* The shared expert beside the routing (moe_forward_overlap) up to
   * bucket 16, inside the routed launches from 32: on an H100 the side
   * stream made the layer 0.6-6.8% faster at 1, 2.0-5.4% at 2 and
   * 0.7-3.2% at 4 to 16, but 0.4-4.6% slower at 32 and 1.9-3.1% at 64
   * (five runs on two machines, bench/results/2026-12-06-s22.md).  MOEJIT_MOE_SIDE=0|1
   * takes one layout at every bucket (diagnosis). */
  const char *side = getenv("MOEJIT_MOE_SIDE");
  bool side_ok = side && (!strcmp(side, "0") || !strcmp(side, "1"));
  p->side = side_ok ? side[0] == '1' : bcap <= 16;
  /* MOEJIT_MOE_PATH=fma|mma forces one path for every bucket, =staged
   * keeps the plan's tiles but stages x in shared memory (diagnosis). */
  const char *force = getenv("MOEJIT_MOE_PATH");
  if (force && !strcmp(force, "fma") && (p->gu.mma || p->dn.mma)) p->gu = fma_gu, p->dn = fma_dn;
  if (force && !strcmp(force, "mma")) p->gu = p->dn = mma4;
  if (force && !strcmp(force, "staged")) p->gu.xg = p->dn.xg = 0;
  /* A value neither takes is one warning a process (the plan is made per
   * bucket), and the plan's own choice. */
  static int warned_side, warned_path;
  if (side && *side && !side_ok && !__atomic_exchange_n(&warned_side, 1, __ATOMIC_RELAXED))
    mj_warn("MOEJIT_MOE_SIDE=%s ignored: it takes 0 or 1", side);
  if (force && *force && strcmp(force, "fma") && strcmp(force, "mma") && strcmp(force, "staged") &&
      !__atomic_exchange_n(&warned_path, 1, __ATOMIC_RELAXED))
    mj_warn("MOEJIT_MOE_PATH=%s ignored: it takes fma, mma or staged", force);
}

void moe_plan_engine(const model_moe_cfg *c, int bcap, bool bf16_shared, moe_plan *p) {
  moe_plan_default(c, bcap, p);
  p->out_f32 = true, p->acc = bf16_shared;
}

/* Row tiles of an expert kernel, and its blocks per slot (gx 0: all). */
static int expert_tiles(const moe_plan *p, int mode) {
  const moe_tile *t = mode ? &p->dn : &p->gu;
  int recs = mode ? p->cfg.hidden : 2 * p->cfg.inter;
  return recs / (t->rows * t->threads / 32);
}
static unsigned expert_gx(const moe_plan *p, int mode) {
  const moe_tile *t = mode ? &p->dn : &p->gu;
  int tiles = expert_tiles(p, mode);
  return (unsigned)(t->gx > 0 && t->gx < tiles ? t->gx : tiles);
}

/* ---- kernels ----------------------------------------------------------------------- */
const char *const moe_kernel_names[MOE_NK] = {
#define X(k) #k,
    MOE_KERNELS(X)
#undef X
};

typedef struct defs {
  dsl_define d[16];
  char v[16][24];
  int n;
} defs;
static void def_i(defs *d, const char *name, long v) {
  MJ_ASSERT(d->n < (int)MJ_ARRAY_LEN(d->d));
  snprintf(d->v[d->n], sizeof d->v[0], "%ld", v);
  d->d[d->n] = (dsl_define){name, d->v[d->n]};
  d->n++;
}

/* Every kernel comes through the front door (jit.h): memory table, disk
 * cache, compile.  compile_ms is the time jit_get took (a cache hit is a
 * fraction of a millisecond); cached says whether it compiled. */
/* Each MoE kernel's family in the kernel table (kernels.h): its template. */
static const kt_id kernel_family[MOE_NK] = {KT_moe_router, KT_moe_route, KT_moe_expert, KT_moe_expert,
                                            KT_moe_combine};
#define kernel_files(i) kt_template(kernel_family[i])

static int load_one(moe_kernels *k, int id, const char *file, const defs *d, const char *arch, mj_err *err) {
  jit_request req = {file, {NULL, d->d, d->n}, NULL, arch};
  const jit_fn *f;
  cache_stats s0, s1;
  jit_stats(&s0);
  double t0 = mj_now_ms();
  int rc = jit_get(&req, &f, err);
  if (rc) return rc;
  kt_note(kernel_family[id], f);
  jit_stats(&s1);
  k->fn[id] = f->fn;
  snprintf(k->key[id], sizeof k->key[id], "%s", f->key);
  k->regs[id] = f->meta.regs;
  k->spills[id] = f->meta.spill_stores;
  k->compile_ms[id] = mj_now_ms() - t0;
  k->compiled[id] = s1.v[CACHE_STAT_compiles] > s0.v[CACHE_STAT_compiles];
  return 0;
}

/* The template and constants of each kernel of a plan: one table for
 * moe_kernels_load and moe_kernels_probe, so what is probed is what is
 * loaded. */
int moe_kernel_mt(const moe_plan *p, int mode, const char *arch) {
  if (!arch && !cu_dev()) return p->mt; /* no target yet: jit_get will name the GPU's or fail without one */
  if (!arch) arch = cu_dev()->arch;     /* the front door's target: the GPU's */
  if ((mode ? &p->dn : &p->gu)->xg) return p->mt; /* no x in shared memory */
  int K = mode ? p->cfg.inter : p->cfg.hidden, fit = dsl_target_static_smem(arch) / (2 * K);
  return p->mt < fit ? p->mt : fit > 1 ? fit : 1;
}

static void plan_defs(const moe_plan *p, const char *arch, defs d[MOE_NK]) {
  const model_moe_cfg *c = &p->cfg;
  memset(d, 0, MOE_NK * sizeof *d);
  defs *r = &d[MOE_K_router];
  def_i(r, "E", c->n_experts), def_i(r, "K", c->hidden), def_i(r, "TB", p->router_tb);
  r = &d[MOE_K_route];
  def_i(r, "E", c->n_experts), def_i(r, "TOPK", c->topk), def_i(r, "BCAP", p->bcap);
  def_i(r, "NG", c->n_group > 0 ? c->n_group : 1), def_i(r, "TG", c->topk_group > 0 ? c->topk_group : 1);
  def_i(r, "NORM", c->norm_topk_prob);
  if (c->e_count > 0) def_i(r, "E0", c->e_first), def_i(r, "EL", c->e_count);
  if (p->force) def_i(r, "FORCE", 1);
  snprintf(r->v[r->n], sizeof r->v[0], "%.9g", (double)c->scaling);
  r->d[r->n] = (dsl_define){"SCALE", r->v[r->n]}, r->n++;
  for (int mode = 0; mode < 2; mode++) {
    const moe_tile *t = mode ? &p->dn : &p->gu;
    r = &d[mode ? MOE_K_down : MOE_K_gate_up];
    def_i(r, "MODE", mode), def_i(r, "K", mode ? c->inter : c->hidden), def_i(r, "N", mode ? c->hidden : c->inter);
    def_i(r, "MT", moe_kernel_mt(p, mode, arch)), def_i(r, "ROWS", t->rows), def_i(r, "THREADS", t->threads), def_i(r, "CHAIN", t->chain);
    if (t->prefetch) def_i(r, "PREFETCH", 1);
    if (t->minb > 1) def_i(r, "MINB", t->minb);
    if (t->mma > 0) def_i(r, "MMA", 1), def_i(r, "KJ", t->mma);
    if (t->xg) def_i(r, "XG", 1);
  }
  r = &d[MOE_K_combine];
  def_i(r, "N", c->hidden), def_i(r, "TOPK", c->topk);
  if (p->out_f32 || c->e_count > 0) def_i(r, "PARTIAL", p->acc ? 2 : 1);
}

int moe_kernels_load(moe_kernels *k, const moe_plan *p, const char *arch, mj_err *err) {
  memset(k, 0, sizeof *k);
  defs d[MOE_NK];
  plan_defs(p, arch, d);
  int rc = 0;
  for (int i = 0; i < MOE_NK && !rc; i++) rc = load_one(k, i, kernel_files(i), &d[i], arch, err);
  if (rc) moe_kernels_free(k);
  return rc;
}

int moe_kernels_probe(const moe_plan *p, const char *arch, bool cached[MOE_NK], uint64_t ids[MOE_NK], mj_err *err) {
  defs d[MOE_NK];
  plan_defs(p, arch, d);
  for (int i = 0; i < MOE_NK; i++) {
    if (ids) {
      mj_buf b = {0};
      mj_buf_puts(&b, kernel_files(i));
      for (int j = 0; j < d[i].n; j++) mj_buf_printf(&b, " %s=%s", d[i].d[j].name, d[i].d[j].value);
      ids[i] = mj_hash128(b.data, b.len).lo;
      mj_buf_free(&b);
    }
    jit_request req = {kernel_files(i), {NULL, d[i].d, d[i].n}, NULL, arch};
    int rc = jit_probe(&req, &cached[i], err);
    if (rc) return rc;
  }
  return 0;
}

int moe_kernel_check(const moe_plan *p, moe_kernel_id id, const char *arch, mj_err *err) {
  defs d[MOE_NK];
  plan_defs(p, arch, d);
  jit_request req = {kernel_files(id), {NULL, d[id].d, d[id].n}, NULL, arch};
  const jit_fn *f;
  return jit_get(&req, &f, err);
}

void moe_kernels_free(moe_kernels *k) {
  /* The modules belong to the front door (unloaded by jit_shutdown). */
  memset(k->fn, 0, sizeof k->fn);
}

/* ---- device memory ----------------------------------------------------------------- */
/* Carve a layer's weights out of base (0: only count); returns the bytes
 * used.  Each piece starts on a 256-byte boundary. */
static size_t carve(CUdeviceptr base, size_t *off, size_t bytes, CUdeviceptr *p) {
  *off = (*off + 255) & ~(size_t)255;
  if (base) *p = base + *off;
  *off += bytes;
  return *off;
}

size_t moe_weights_carve(moe_weights *w, const model_moe_cfg *c, CUdeviceptr base) {
  size_t E = (size_t)c->n_experts, L = (size_t)model_moe_local(c), off = 0;
  carve(base, &off, E * (size_t)c->hidden * 2, &w->router);
  carve(base, &off, E * 4, &w->bias);
  carve(base, &off, (L + 1) * moe_gate_up_bytes(c), &w->gate_up);
  carve(base, &off, (L + 1) * moe_down_bytes(c), &w->down);
  return carve(base, &off, (L + 1) * 16, &w->gscale);
}

int moe_weights_alloc(moe_weights *w, const model_moe_cfg *c, mj_err *err) {
  memset(w, 0, sizeof *w);
  int rc = cu_alloc(&w->base, moe_weights_carve(w, c, 0), "MoE layer weights", err);
  if (!rc) moe_weights_carve(w, c, w->base);
  return rc;
}

void moe_weights_free(moe_weights *w) {
  if (w->base) cu.cuMemFree(w->base);
  memset(w, 0, sizeof *w);
}

int moe_weights_set_expert(const moe_weights *w, const model_moe_cfg *c, int e, const model_nvfp4 *gate,
                           const model_nvfp4 *up, const model_nvfp4 *down, mj_err *err) {
  if (gate->n != c->inter || gate->k != c->hidden || up->n != c->inter || up->k != c->hidden ||
      down->n != c->hidden || down->k != c->inter || e < 0 || e > model_moe_local(c))
    return mj_fail(err, MJ_EINPUT, "moe: expert %d has the wrong shape for this layer", e);
  size_t gub = moe_gate_up_bytes(c), dnb = moe_down_bytes(c);
  uint8_t *buf = mj_xmalloc(gub > dnb ? gub : dnb);
  int rc = MJ_ECUDA;
  moe_repack_gate_up(gate, up, buf);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(w->gate_up + (size_t)e * gub, buf, gub), out);
  moe_repack_down(down, buf);
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(w->down + (size_t)e * dnb, buf, dnb), out);
  float gs[4] = {gate->s2, up->s2, down->s2, 0.0f};
  CU_CHECK_GOTO(err, cu.cuMemcpyHtoD(w->gscale + (size_t)e * 16, gs, 16), out);
  rc = 0;
out:
  free(buf);
  return rc;
}

int moe_weights_set_all(const moe_weights *w, const model_moe_cfg *c, const model_nvfp4 *gate, const model_nvfp4 *up,
                        const model_nvfp4 *down, mj_err *err) {
  size_t gub = moe_gate_up_bytes(c), dnb = moe_down_bytes(c);
  for (int e = 0; e <= model_moe_local(c); e++) {
    int same = 0;
    while (same < e && !(gate[same].w == gate[e].w && gate[same].s == gate[e].s && up[same].w == up[e].w &&
                         up[same].s == up[e].s && down[same].w == down[e].w && down[same].s == down[e].s))
      same++;
    if (same == e) {
      int rc = moe_weights_set_expert(w, c, e, &gate[e], &up[e], &down[e], err);
      if (rc) return rc;
      continue;
    }
    float gs[4] = {gate[e].s2, up[e].s2, down[e].s2, 0.0f};
    CU_CHECK(err, cu.cuMemcpyDtoD(w->gate_up + (size_t)e * gub, w->gate_up + (size_t)same * gub, gub));
    CU_CHECK(err, cu.cuMemcpyDtoD(w->down + (size_t)e * dnb, w->down + (size_t)same * dnb, dnb));
    CU_CHECK(err, cu.cuMemcpyHtoD(w->gscale + (size_t)e * 16, gs, 16));
  }
  CU_CHECK(err, cu.cuCtxSynchronize());
  return 0;
}

int moe_weights_copy_experts(const moe_weights *dst, const moe_weights *src, const model_moe_cfg *c, CUstream s,
                             mj_err *err) {
  size_t n = (size_t)model_moe_local(c) + 1;
  CU_CHECK(err, cu.cuMemcpyDtoDAsync(dst->gate_up, src->gate_up, n * moe_gate_up_bytes(c), s));
  CU_CHECK(err, cu.cuMemcpyDtoDAsync(dst->down, src->down, n * moe_down_bytes(c), s));
  CU_CHECK(err, cu.cuMemcpyDtoDAsync(dst->gscale, src->gscale, n * 16, s));
  return 0;
}

void moe_random_make(moe_random *r, const model_moe_cfg *c, int npool, uint64_t seed) {
  memset(r, 0, sizeof *r);
  r->npool = npool < 1 ? 1 : npool > MOE_RANDOM_POOL ? MOE_RANDOM_POOL : npool;
  uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int p = 0; p < r->npool; p++)
    for (int t = 0; t < 3; t++) {
      size_t nk = (size_t)c->hidden * c->inter;
      uint8_t *codes = r->buf[p][2 * t] = mj_xmalloc(nk / 2), *scales = r->buf[p][2 * t + 1] = mj_xmalloc(nk / 16);
      for (size_t j = 0; j < nk / 2; j++) st = st * 6364136223846793005ull + 1442695040888963407ull, codes[j] = (uint8_t)(st >> 33);
      for (size_t j = 0; j < nk / 16; j++)
        st = st * 6364136223846793005ull + 1442695040888963407ull, scales[j] = (uint8_t)(0x20 + (st >> 33) % 24);
    }
  int E = c->n_experts, H = c->hidden, I = c->inter;
  r->gate = mj_xcalloc((size_t)E + 1, sizeof *r->gate);
  r->up = mj_xcalloc((size_t)E + 1, sizeof *r->up);
  r->down = mj_xcalloc((size_t)E + 1, sizeof *r->down);
  for (int e = 0; e <= E; e++) {
    uint8_t *const *b = r->buf[e % r->npool];
    float f = 0.25f * (1.0f + (float)e / 512.0f);
    r->gate[e] = (model_nvfp4){b[0], b[1], f / sqrtf((float)H), I, H};
    r->up[e] = (model_nvfp4){b[2], b[3], f / sqrtf((float)H), I, H};
    r->down[e] = (model_nvfp4){b[4], b[5], f / sqrtf((float)I), H, I};
  }
}

void moe_random_free(moe_random *r) {
  for (int p = 0; p < MOE_RANDOM_POOL; p++)
    for (int t = 0; t < 6; t++) free(r->buf[p][t]);
  free(r->gate), free(r->up), free(r->down);
  memset(r, 0, sizeof *r);
}

size_t moe_bufs_carve(moe_bufs *b, const moe_plan *p, CUdeviceptr base) {
  size_t B = (size_t)p->bcap, H = (size_t)p->cfg.hidden, E = (size_t)p->cfg.n_experts, K = (size_t)p->cfg.topk;
  size_t S = (size_t)moe_slots(p), P = (size_t)moe_pairs(p), off = 0;
  struct { CUdeviceptr *ptr; size_t bytes; } t[] = {
      {&b->x, B * H * 2},           {&b->out, B * H * 2},       {&b->outf, B * H * 4},      {&b->logits, B * E * 4},
      {&b->slot_expert, S * 4},     {&b->slot_count, S * 4},    {&b->slot_off, S * 4},
      {&b->pair_token, P * 4},      {&b->pair_weight, P * 4},   {&b->tok_pair, B * (K + 1) * 4},
      {&b->tok_expert, B * K * 4},  {&b->tok_weight, B * K * 4}, {&b->h, P * (size_t)p->cfg.inter * 2},
      {&b->y, P * H * 4}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(t); i++) carve(base, &off, t[i].bytes, t[i].ptr);
  return off;
}

int moe_bufs_alloc(moe_bufs *b, const moe_plan *p, mj_err *err) {
  memset(b, 0, sizeof *b);
  int rc = cu_alloc(&b->base, moe_bufs_carve(b, p, 0), "MoE activations", err);
  if (!rc) moe_bufs_carve(b, p, b->base);
  return rc;
}

void moe_bufs_free(moe_bufs *b) {
  if (b->base) cu.cuMemFree(b->base);
  memset(b, 0, sizeof *b);
}

/* ---- launches ---------------------------------------------------------------------- */
static int launch2(CUfunction fn, unsigned gx, unsigned gy, unsigned block, CUstream s, void **args, mj_err *err) {
  return cu_launch_tpl(fn, gx, gy, 1, block, 0, s, args, err);
}

int moe_launch(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
               CUdeviceptr x_in, int B, moe_kernel_id which, CUstream s, mj_err *err) {
  const model_moe_cfg *c = &p->cfg;
  if (B < 1 || B > p->bcap) return mj_fail(err, MJ_EINPUT, "moe: batch %d outside 1..%d", B, p->bcap);
  unsigned slots = (unsigned)moe_slots(p);
  CUdeviceptr x = x_in;
  switch (which) {
  case MOE_K_router: {
    void *a[] = {(void *)&w->router, &x, (void *)&b->logits, &B};
    return launch2(k->fn[which], (unsigned)c->n_experts, (unsigned)((B + p->router_tb - 1) / p->router_tb), 128, s, a, err);
  }
  case MOE_K_route: {
    void *a[] = {(void *)&b->logits, (void *)&w->bias, &B, (void *)&b->slot_expert, (void *)&b->slot_count,
                 (void *)&b->slot_off, (void *)&b->pair_token, (void *)&b->pair_weight, (void *)&b->tok_pair,
                 (void *)&b->tok_expert, (void *)&b->tok_weight, (void *)&b->force};
    return launch2(k->fn[which], 1, 1, 1024, s, a, err);
  }
  case MOE_K_gate_up:
  case MOE_K_down: return moe_launch_slots(k, p, w, b, x_in, B, which, 0, (int)slots, s, err);
  case MOE_K_combine: {
    /* out (bf16) on one GPU; a partial combine (expert parallelism) writes outf (f32) */
    void *a[] = {(void *)&b->y, (void *)&b->tok_pair, (void *)&b->out, (void *)&b->outf};
    return launch2(k->fn[which], (unsigned)(c->hidden / 1024), (unsigned)B, 256, s, a, err);
  }
  case MOE_NK: break;
  }
  return mj_fail(err, MJ_EINTERNAL, "moe: no kernel %d", (int)which);
}

int moe_launch_slots(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                     CUdeviceptr x_in, int B, moe_kernel_id which, int first, int n, CUstream s, mj_err *err) {
  if (which != MOE_K_gate_up && which != MOE_K_down)
    return mj_fail(err, MJ_EINTERNAL, "moe: kernel %d has no slots", (int)which);
  if (B < 1 || B > p->bcap) return mj_fail(err, MJ_EINPUT, "moe: batch %d outside 1..%d", B, p->bcap);
  if (first < 0 || n < 0 || first + n > moe_slots(p))
    return mj_fail(err, MJ_EINTERNAL, "moe: slots %d..%d outside 0..%d", first, first + n - 1, moe_slots(p) - 1);
  if (n == 0) return 0;
  int mode = which == MOE_K_down, nexp = model_moe_local(&p->cfg); /* the shared expert's index */
  const moe_tile *t = mode ? &p->dn : &p->gu;
  CUdeviceptr W = mode ? w->down : w->gate_up, in = mode ? b->h : x_in;
  void *a[] = {&W, (void *)&w->gscale, &in, (void *)&b->slot_expert, (void *)&b->slot_count,
               (void *)&b->slot_off, (void *)&b->pair_token, (void *)&b->pair_weight, (void *)&b->h, (void *)&b->y,
               &B, &nexp, &first};
  return launch2(k->fn[which], expert_gx(p, mode), (unsigned)n, (unsigned)t->threads, s, a, err);
}

int moe_side_create(moe_side *side, mj_err *err) {
  memset(side, 0, sizeof *side);
  CU_CHECK(err, cu.cuStreamCreate(&side->s, CU_STREAM_NON_BLOCKING));
  CU_CHECK(err, cu.cuEventCreate(&side->fork, CU_EVENT_DISABLE_TIMING));
  CU_CHECK(err, cu.cuEventCreate(&side->join, CU_EVENT_DISABLE_TIMING));
  return 0;
}

void moe_side_destroy(moe_side *side) {
  if (side->fork) cu.cuEventDestroy(side->fork);
  if (side->join) cu.cuEventDestroy(side->join);
  if (side->s) cu.cuStreamDestroy(side->s);
  memset(side, 0, sizeof *side);
}

int moe_clear_shared(const moe_bufs *b, const moe_plan *p, int B, CUstream s, mj_err *err) {
  CU_CHECK(err, cu.cuMemsetD32Async(b->y, 0, (size_t)B * p->cfg.hidden, s));
  return 0;
}

int moe_forward_overlap(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                        CUdeviceptr x_in, int B, bool shared, CUstream s, const moe_side *side, mj_err *err) {
  return moe_forward_overlap_after(k, p, w, b, x_in, B, shared, s, side, NULL, err);
}

int moe_forward_overlap_after(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                              CUdeviceptr x_in, int B, bool shared, CUstream s, const moe_side *side, CUevent before,
                              mj_err *err) {
  int slots = moe_slots(p), rc;
  if (!shared && (rc = moe_clear_shared(b, p, B, s, err))) return rc;
  if (shared && p->side) {
    CU_CHECK(err, cu.cuEventRecord(side->fork, s));
    CU_CHECK(err, cu.cuStreamWaitEvent(side->s, side->fork, 0));
    if ((rc = moe_launch_slots(k, p, w, b, x_in, B, MOE_K_gate_up, 0, 1, side->s, err)) ||
        (rc = moe_launch_slots(k, p, w, b, x_in, B, MOE_K_down, 0, 1, side->s, err)))
      return rc;
    CU_CHECK(err, cu.cuEventRecord(side->join, side->s));
  }
  int first = shared && !p->side ? 0 : 1; /* slot 0 in the routed launches, or beside them (or skipped) */
  if ((rc = moe_launch(k, p, w, b, x_in, B, MOE_K_router, s, err)) ||
      (rc = moe_launch(k, p, w, b, x_in, B, MOE_K_route, s, err)) ||
      (rc = moe_launch_slots(k, p, w, b, x_in, B, MOE_K_gate_up, first, slots - first, s, err)) ||
      (rc = moe_launch_slots(k, p, w, b, x_in, B, MOE_K_down, first, slots - first, s, err)))
    return rc;
  if (shared && p->side) CU_CHECK(err, cu.cuStreamWaitEvent(s, side->join, 0));
  if (before) CU_CHECK(err, cu.cuStreamWaitEvent(s, before, 0));
  return moe_launch(k, p, w, b, x_in, B, MOE_K_combine, s, err);
}

int moe_forward(const moe_kernels *k, const moe_plan *p, const moe_weights *w, const moe_bufs *b,
                CUdeviceptr x_in, int B, CUstream s, mj_err *err) {
  for (int i = 0; i < MOE_NK; i++) {
    int rc = moe_launch(k, p, w, b, x_in, B, (moe_kernel_id)i, s, err);
    if (rc) return rc;
  }
  return 0;
}
