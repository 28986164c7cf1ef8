/* test_fidelity.c: the CPU forward against transformers' fixtures.
 *
 * Two kinds of fixture live in tests/fidelity, both written on the GPU host
 * from transformers' GlmMoeDsaForCausalLM (float32, eager attention):
 *   make_fixtures.py's (NAME.json with "mkmodel_args"): a checkpoint of
 *     mkmodel's own, regenerated here from the recorded arguments, a
 *     48-token prompt and 8 greedy steps, and each layer's prefill output
 *     (to name the first layer that drifts when something fails);
 *   sweep.py's (NAME.json with "kind": "sweep"): a random configuration
 *     saved by transformers itself (NAME.config.json, byte for byte), its
 *     weights regenerated here with `moejit mkmodel --config`, a prompt of 5
 *     to 70 tokens and 16 greedy steps, and every layer's DSA selection.
 * Either way the checkpoint's CRC-32s are checked first (a changed
 * generator is told apart from a changed forward pass), the prompt runs as
 * one prefill and the recorded greedy tokens are fed one decode step at a
 * time, and at every position
 *   max |ours - theirs| / max |theirs| <= 1e-4
 * (float32 against float32: 1e-6 is what is achieved), the same greedy
 * token unless transformers' own top-2 margin is below 1e-4 of the row's
 * largest logit (sweep fixtures record it), and, for sweep fixtures, the
 * same set of attended keys for every query that sees more than index_topk
 * keys, in every layer that runs its own indexer: ties in the indexer's
 * scores are common in small models, and the set decides the logits.
 * Exit 77 (skip) while no fixture exists; 1 on any mismatch.
 *
 * Under MOEJIT_INDEXER_KEYS=bf16 (the indexer's keys rounded to bf16,
 * model.h) the same fixtures measure what that rounding changes against
 * transformers' f32 keys: a fixture where no query sees more than
 * index_topk keys must still pass every check (the keys decide nothing
 * there); where the selection is active the differences are counted and
 * printed, not held, and the run must find at least one (else the switch
 * did not reach the forward pass).
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_forward.h"
#include "json.h"
#include "model.h"
#include "t.h"

static const double TOL = 1e-4;

/* MOEJIT_INDEXER_KEYS=bf16: what the fixtures with an active selection
 * measure (see above). */
static bool kb16;
static int kb_fixtures, kb_moved, kb_checked, kb_sel_bad, kb_tok_bad;

static uint32_t crc32_buf(uint32_t crc, const uint8_t *p, size_t n) {
  static uint32_t table[256];
  if (!table[1])
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p);
}

static float *read_f32(const char *path, size_t want) {
  char *data;
  size_t len;
  mj_err err = {0};
  if (mj_read_file(path, &data, &len, &err)) {
    fprintf(stderr, "  %s\n", err.msg);
    return NULL;
  }
  if (len != want * 4) {
    fprintf(stderr, "  %s: %zu bytes, expected %zu\n", path, len, want * 4);
    free(data);
    return NULL;
  }
  return (float *)data; /* malloc'd, aligned for float */
}

static double rel_err(const float *a, const float *b, int64_t n, int64_t *where) {
  double md = 0, mb = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!isfinite(a[i])) d = INFINITY;
    if (d > md) md = d, *where = i;
    mb = fmax(mb, fabs((double)b[i]));
  }
  return md / (mb > 0 ? mb : 1);
}

static int64_t argmax(const float *v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

/* Run `moejit mkmodel ARGS --out DIR`. */
static bool regenerate(const char *moejit, const char *args, const char *dir) {
  mj_buf cmd = {0};
  mj_buf_printf(&cmd, "'%s' mkmodel -q --force --out '%s' %s", moejit, dir, args);
  int rc = system(cmd.data);
  mj_buf_free(&cmd);
  T_CHECK(rc == 0);
  return rc == 0;
}

/* The regenerated file must be the one the fixture was made from. */
static void check_crc(const char *dir, const char *file, uint32_t want) {
  char p[8192];
  mj_err err = {0};
  snprintf(p, sizeof p, "%s/%s", dir, file);
  char *d;
  size_t n;
  uint32_t got = 0;
  if (!mj_read_file(p, &d, &n, &err)) got = crc32_buf(0, (const uint8_t *)d, n), free(d);
  if (got != want) {
    fprintf(stderr, "  %s: CRC-32 %08x, fixture has %08x: mkmodel writes other bytes than when the fixture "
                    "was made (regenerate the fixtures if mkmodel changed on purpose)\n",
            file, got, want);
    T_CHECK(!"checkpoint identical to the fixture's");
  }
  mj_err_clear(&err);
}

/* Load the regenerated checkpoint; NULL (and a failed check) if it does not. */
static model *load_checked(const char *dir, int64_t vocab) {
  mj_err err = {0};
  model *m;
  if (model_load(dir, &m, &err)) {
    fprintf(stderr, "  %s\n", err.msg);
    T_CHECK(!"model loads");
    mj_err_clear(&err);
    return NULL;
  }
  T_EQ_INT(m->cfg.vocab_size, vocab);
  return m;
}

/* Every row of ours against the reference: the relative error, and the
 * greedy token of rows first..rows-1 against the reference's argmax unless
 * its top-2 margin (margins, may be NULL: none is a near tie) is under TOL.
 * Prints the first mismatches; counts into the out parameters. */
typedef struct row_stats {
  double worst;
  int bad_pos, bad_tok, near;
} row_stats;
static row_stats compare_rows(const float *got, const float *want, int64_t rows, int64_t V, int64_t first,
                              const json *margins) {
  row_stats r = {0};
  for (int64_t i = 0; i < rows; i++) {
    int64_t at = 0;
    double e = rel_err(got + i * V, want + i * V, V, &at);
    r.worst = fmax(r.worst, e);
    if (e > TOL && r.bad_pos++ < 5)
      fprintf(stderr, "  position %lld: relative error %.3g (logit %lld: ours %.6g, reference %.6g)\n",
              (long long)i, e, (long long)at, got[i * V + at], want[i * V + at]);
    int64_t ours = argmax(got + i * V, V), theirs = argmax(want + i * V, V);
    if (i < first || ours == theirs) continue;
    double margin = margins ? margins->items[i]->num : INFINITY;
    if (margin < TOL) {
      r.near++;
      continue;
    }
    if (r.bad_tok++ < 5)
      fprintf(stderr, "  position %lld: greedy token %lld, reference %lld (its top-2 margin %.3g)\n", (long long)i,
              (long long)ours, (long long)theirs, margin);
  }
  return r;
}

static void check_sweep(const char *fixdir, const json *fx, const char *moejit, const char *tmp);

static void check_fixture(const char *fixdir, const char *file, const char *moejit, const char *tmp) {
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", fixdir, file);
  char *text;
  size_t len;
  mj_err err = {0};
  mj_arena a;
  mj_arena_init(&a, 1 << 16);
  json *fx;
  if (mj_read_file(path, &text, &len, &err) || json_parse(&a, text, len, path, &fx, &err)) {
    fprintf(stderr, "  %s\n", err.msg);
    T_CHECK(!"fixture readable");
    return;
  }
  free(text);
  const json *kind = json_get(fx, "kind");
  if (kind && kind->type == JSON_STR && strcmp(kind->str, "sweep") == 0) {
    check_sweep(fixdir, fx, moejit, tmp);
    mj_arena_free(&a);
    return;
  }
  const char *name = json_get(fx, "name")->str;
  int64_t np = json_get(fx, "n_prompt")->i, ns = json_get(fx, "n_steps")->i;
  int64_t V = json_get(fx, "vocab_size")->i, H = json_get(fx, "hidden_size")->i;
  int64_t NL = json_get(fx, "num_hidden_layers")->i;
  json *args = json_get(fx, "mkmodel_args"), *prompt = json_get(fx, "prompt"), *gen = json_get(fx, "generated");
  printf("%s: %s, decode %s\n", name, json_get(fx, "transformers_version")->str, json_get(fx, "decode")->str);

  /* Regenerate the checkpoint exactly as the GPU host did. */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", tmp, name);
  mj_buf margs = {0};
  for (size_t i = 0; i < args->len; i++) mj_buf_printf(&margs, " '%s'", args->items[i]->str);
  bool made = regenerate(moejit, margs.data, dir);
  mj_buf_free(&margs);
  if (!made) return;
  json *crcs = json_get(fx, "checkpoint_crc32");
  for (size_t i = 0; i < crcs->len; i++) check_crc(dir, crcs->keys[i], (uint32_t)crcs->items[i]->i);
  model *m = load_checked(dir, V);
  if (!m) return;
  T_EQ_INT(m->cfg.hidden_size, H);
  snprintf(path, sizeof path, "%s/%s", fixdir, json_get(fx, "logits_file")->str);
  float *want = read_f32(path, (size_t)((np + ns) * V));
  snprintf(path, sizeof path, "%s/%s", fixdir, json_get(fx, "layers_file")->str);
  float *want_layers = read_f32(path, (size_t)(NL * np * H));
  T_CHECK(want && want_layers);
  if (!want || !want_layers) return;

  cpu_params p = {.max_ctx = np + ns + 1, .threads = 2};
  cpu_model *s;
  T_CHECK(cpu_model_create(m, &p, &s, &err) == 0);
  int32_t *tok = malloc((size_t)(np + ns + 1) * sizeof *tok);
  for (int64_t i = 0; i < np; i++) tok[i] = (int32_t)prompt->items[i]->i;
  for (int64_t i = 0; i <= ns; i++) tok[np + i] = (int32_t)gen->items[i]->i;
  float *got = malloc((size_t)((np + ns) * V) * sizeof *got);
  float *layers = malloc((size_t)(NL * np * H) * sizeof *layers);
  cpu_model_set_dump(s, layers);
  T_CHECK(cpu_forward(s, tok, np, 0, got, true, &err) == 0);
  for (int64_t k = 0; k < ns; k++) T_CHECK(cpu_forward(s, tok + np + k, 1, np + k, got + (np + k) * V, false, &err) == 0);

  /* The reference's argmax of each row from the last prompt row on is its greedy token. */
  row_stats rs = compare_rows(got, want, np + ns, V, np - 1, NULL);
  for (int64_t L = 0; L < NL; L++) {
    int64_t at = 0;
    double e = rel_err(layers + L * np * H, want_layers + L * np * H, np * H, &at);
    if (e > TOL) {
      fprintf(stderr, "  first layer to drift: %lld (relative error %.3g at token %lld, feature %lld)\n",
              (long long)L, e, (long long)(at / H), (long long)(at % H));
      break;
    }
  }
  printf("  %lld positions, worst relative error %.3g, %d over %g, %d greedy tokens differ\n",
         (long long)(np + ns), rs.worst, rs.bad_pos, TOL, rs.bad_tok);
  bool active = false; /* does a query see more keys than index_topk in a layer with an indexer? */
  for (int64_t L = 0; L < NL; L++) active |= m->layers[L].has_indexer && np + ns > m->cfg.index_topk;
  if (kb16 && active) {
    kb_fixtures++, kb_moved += rs.bad_pos > 0, kb_tok_bad += rs.bad_tok;
    printf("  (bf16 indexer keys, the selection active: measured, not held)\n");
  } else {
    T_CHECK(rs.bad_pos == 0);
    T_CHECK(rs.bad_tok == 0);
  }
  cpu_model_destroy(s);
  model_free(m);
  free(tok), free(got), free(layers), free(want), free(want_layers);
  mj_arena_free(&a);
}

/* Our DSA masks of `rows` queries (the dump of one call: [layer][DUMPMAX][ctx])
 * at positions pos0.. against transformers' selections; returns how many
 * (layer, query) pairs differ and prints the first. */
enum { DUMPMAX = 128 };
static int compare_sel(const model *m, const uint8_t *dump, int64_t ctx, int64_t pos0, int64_t rows, const json *sels,
                       int *checked) {
  const model_config *c = &m->cfg;
  int bad = 0;
  for (size_t k = 0; k < sels->len; k++) {
    const json *e = sels->items[k];
    int64_t L = e->items[0]->i, pos = e->items[1]->i;
    const json *ix = e->items[2];
    if (pos < pos0 || pos >= pos0 + rows) continue;
    (*checked)++;
    const uint8_t *mask = dump + (L * DUMPMAX + (pos - pos0)) * ctx;
    int64_t n_ours = 0, miss = -1, extra = -1;
    for (int64_t t = 0; t <= pos; t++) n_ours += mask[t];
    for (size_t j = 0; j < ix->len; j++)
      if (ix->items[j]->i < 0 || ix->items[j]->i > pos || !mask[ix->items[j]->i]) miss = ix->items[j]->i;
    if (miss < 0 && n_ours == (int64_t)ix->len) continue;
    for (int64_t t = 0; t <= pos && extra < 0; t++) {
      bool theirs = false;
      for (size_t j = 0; j < ix->len; j++) theirs |= ix->items[j]->i == t;
      if (mask[t] && !theirs) extra = t;
    }
    if (bad++ < 5)
      fprintf(stderr, "  layer %lld, query %lld: DSA selection differs (theirs has key %lld, ours key %lld; %lld of "
                      "%lld keys)\n", (long long)L, (long long)pos, (long long)miss, (long long)extra,
              (long long)n_ours, (long long)c->index_topk);
  }
  return bad;
}

static void check_sweep(const char *fixdir, const json *fx, const char *moejit, const char *tmp) {
  const char *name = json_get(fx, "name")->str;
  int64_t np = json_get(fx, "n_prompt")->i, ns = json_get(fx, "n_steps")->i, V = json_get(fx, "vocab_size")->i;
  const json *prompt = json_get(fx, "prompt"), *gen = json_get(fx, "generated"), *margins = json_get(fx, "margins");
  const json *sels = json_get(fx, "dsa_selections");
  bool nvfp4 = json_get(fx, "nvfp4")->b;
  printf("%s: transformers %s, its own config.json\n", name, json_get(fx, "transformers_version")->str);
  T_CHECK(np <= DUMPMAX && (int64_t)margins->len == np + ns && (int64_t)gen->len == ns + 1);
  if (np > DUMPMAX || (int64_t)margins->len != np + ns || (int64_t)gen->len != ns + 1) return;

  char dir[4096], cfg[8192], args[8400], path[8192];
  snprintf(dir, sizeof dir, "%s/%s", tmp, name);
  snprintf(cfg, sizeof cfg, "%s/%s", fixdir, json_get(fx, "config_file")->str);
  snprintf(args, sizeof args, "--config '%s' --seed %lld%s", cfg, (long long)json_get(fx, "mkmodel_seed")->i,
           nvfp4 ? " --nvfp4" : "");
  if (!regenerate(moejit, args, dir)) return;
  check_crc(dir, "model.safetensors", (uint32_t)json_get(fx, "weights_crc32")->i);
  mj_err err = {0};
  model *m = load_checked(dir, V);
  if (!m) return;
  snprintf(path, sizeof path, "%s/%s", fixdir, json_get(fx, "logits_file")->str);
  float *want = read_f32(path, (size_t)((np + ns) * V));
  T_CHECK(want != NULL);
  if (!want) {
    model_free(m);
    return;
  }
  int64_t ctx = np + ns + 1, NL = m->cfg.num_hidden_layers;
  cpu_params p = {.max_ctx = ctx, .threads = 2};
  cpu_model *s = NULL;
  T_CHECK(cpu_model_create(m, &p, &s, &err) == 0);
  int32_t *tok = malloc((size_t)ctx * sizeof *tok);
  for (int64_t i = 0; i < np; i++) tok[i] = (int32_t)prompt->items[i]->i;
  for (int64_t i = 0; i <= ns; i++) tok[np + i] = (int32_t)gen->items[i]->i;
  float *got = malloc((size_t)((np + ns) * V) * sizeof *got);
  uint8_t *dump = calloc((size_t)(NL * DUMPMAX * ctx), 1);
  int sel_bad = 0, sel_checked = 0;
  cpu_model_set_choice_dump(s, dump, NULL, DUMPMAX);
  T_CHECK(cpu_forward(s, tok, np, 0, got, true, &err) == 0);
  sel_bad += compare_sel(m, dump, ctx, 0, np, sels, &sel_checked);
  for (int64_t k = 0; k < ns; k++) {
    T_CHECK(cpu_forward(s, tok + np + k, 1, np + k, got + (np + k) * V, false, &err) == 0);
    sel_bad += compare_sel(m, dump, ctx, np + k, 1, sels, &sel_checked);
  }
  row_stats rs = compare_rows(got, want, np + ns, V, 0, margins);
  printf("  %lld positions, worst relative error %.3g, %d over %g; %d greedy tokens differ (%d more within a near "
         "tie); DSA selections: %d checked, %d differ\n",
         (long long)(np + ns), rs.worst, rs.bad_pos, TOL, rs.bad_tok, rs.near, sel_checked, sel_bad);
  T_EQ_INT(sel_checked, (int)sels->len);
  if (kb16 && sels->len > 0) {
    kb_fixtures++, kb_moved += rs.bad_pos > 0, kb_checked += sel_checked, kb_sel_bad += sel_bad;
    kb_tok_bad += rs.bad_tok;
    printf("  (bf16 indexer keys, the selection active: measured, not held)\n");
  } else {
    T_CHECK(rs.bad_pos == 0);
    T_CHECK(rs.bad_tok == 0);
    T_CHECK(sel_bad == 0);
  }
  cpu_model_destroy(s);
  model_free(m);
  free(tok), free(got), free(dump), free(want);
}

int main(void) {
  const char *srcdir = getenv("srcdir") ? getenv("srcdir") : ".";
  const char *moejit = getenv("MOEJIT") ? getenv("MOEJIT") : "./moejit";
  char fixdir[4096];
  snprintf(fixdir, sizeof fixdir, "%s/tests/fidelity", srcdir);
  DIR *d = opendir(fixdir);
  char **names = NULL;
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0 &&
        !(l > 12 && strcmp(e->d_name + l - 12, ".config.json") == 0)) {
      names = realloc(names, (size_t)(n + 1) * sizeof *names);
      names[n++] = strdup(e->d_name);
    }
  }
  if (d) closedir(d);
  if (!n) {
    printf("no fidelity fixtures in %s: run tests/fidelity/make_fixtures.py on the GPU host (skipped)\n", fixdir);
    return 77;
  }
  kb16 = model_ikey_bf16();
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s/moejit-fid.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(tmp)) return 1;
  for (int i = 0; i < n; i++) {
    t_current = names[i];
    check_fixture(fixdir, names[i], moejit, tmp);
    free(names[i]);
  }
  free(names);
  nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  if (kb16) {
    t_current = "bf16 indexer keys";
    printf("bf16 indexer keys against transformers' f32 keys, in the %d fixtures whose selection is active: %d of "
           "%d DSA selections differ (sweep fixtures), %d fixtures with logits past %g, %d greedy tokens differ\n",
           kb_fixtures, kb_sel_bad, kb_checked, kb_moved, TOL, kb_tok_bad);
    T_CHECK(kb_fixtures > 0);
    T_CHECK(kb_sel_bad > 0); /* the rounding reached the forward pass */
  }
  return t_status();
}
