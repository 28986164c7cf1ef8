/* test_fidelity.c: the CPU forward against transformers' fixtures.
 *
 * tests/fidelity/NAME.json files are written on the GPU host by make_fixtures.py from
 * transformers' GlmMoeDsaForCausalLM.  For each, this regenerates the
 * checkpoint with the recorded mkmodel arguments (and checks its CRC-32s, so
 * a changed generator is told apart from a changed forward pass), runs the
 * prompt through cpu_forward as one prefill, then feeds the recorded greedy
 * tokens one decode step at a time, and requires at every position
 *   max |ours - theirs| / max |theirs| <= 1e-3
 * and the same greedy token.  Each layer's prefill output is compared too,
 * to name the first layer that drifts when something fails.
 * Exit 77 (skip) while no fixture exists; 1 on any mismatch.
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

static const double TOL = 1e-3;

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
  const char *name = json_get(fx, "name")->str;
  int64_t np = json_get(fx, "n_prompt")->i, ns = json_get(fx, "n_steps")->i;
  int64_t V = json_get(fx, "vocab_size")->i, H = json_get(fx, "hidden_size")->i;
  int64_t NL = json_get(fx, "num_hidden_layers")->i;
  json *args = json_get(fx, "mkmodel_args"), *prompt = json_get(fx, "prompt"), *gen = json_get(fx, "generated");
  printf("%s: %s, decode %s\n", name, json_get(fx, "transformers_version")->str, json_get(fx, "decode")->str);

  /* Regenerate the checkpoint exactly as the GPU host did. */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", tmp, name);
  mj_buf cmd = {0};
  mj_buf_printf(&cmd, "'%s' mkmodel -q --force --out '%s'", moejit, dir);
  for (size_t i = 0; i < args->len; i++) mj_buf_printf(&cmd, " '%s'", args->items[i]->str);
  int rc = system(cmd.data);
  mj_buf_free(&cmd);
  T_CHECK(rc == 0);
  if (rc != 0) return;
  json *crcs = json_get(fx, "checkpoint_crc32");
  for (size_t i = 0; i < crcs->len; i++) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, crcs->keys[i]);
    char *d;
    size_t n;
    uint32_t got = 0;
    if (!mj_read_file(p, &d, &n, &err)) got = crc32_buf(0, (const uint8_t *)d, n), free(d);
    if (got != (uint32_t)crcs->items[i]->i) {
      fprintf(stderr, "  %s: CRC-32 %08x, fixture has %08x: mkmodel writes other bytes than when the fixture "
                      "was made (regenerate the fixtures if mkmodel changed on purpose)\n",
              crcs->keys[i], got, (uint32_t)crcs->items[i]->i);
      T_CHECK(!"checkpoint identical to the fixture's");
    }
    mj_err_clear(&err);
  }
  model *m;
  if (model_load(dir, &m, &err)) {
    fprintf(stderr, "  %s\n", err.msg);
    T_CHECK(!"model loads");
    return;
  }
  T_EQ_INT(m->cfg.vocab_size, V);
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

  double worst = 0;
  int bad_pos = 0, bad_tok = 0;
  for (int64_t i = 0; i < np + ns; i++) {
    int64_t at = 0;
    double e = rel_err(got + i * V, want + i * V, V, &at);
    worst = fmax(worst, e);
    if (e > TOL && bad_pos++ < 5)
      fprintf(stderr, "  position %lld: relative error %.3g (logit %lld: ours %.6g, reference %.6g)\n",
              (long long)i, e, (long long)at, got[i * V + at], want[i * V + at]);
    if (i >= np - 1) {
      int64_t ours = argmax(got + i * V, V), theirs = tok[i + 1];
      if (ours != theirs && bad_tok++ < 5)
        fprintf(stderr, "  position %lld: greedy token %lld, reference %lld\n", (long long)i, (long long)ours,
                (long long)theirs);
    }
  }
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
         (long long)(np + ns), worst, bad_pos, TOL, bad_tok);
  T_CHECK(bad_pos == 0);
  T_CHECK(bad_tok == 0);
  cpu_model_destroy(s);
  model_free(m);
  free(tok), free(got), free(layers), free(want), free(want_layers);
  mj_arena_free(&a);
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
    if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) {
      names = realloc(names, (size_t)(n + 1) * sizeof *names);
      names[n++] = strdup(e->d_name);
    }
  }
  if (d) closedir(d);
  if (!n) {
    printf("no fidelity fixtures in %s: run tests/fidelity/make_fixtures.py on the GPU host (skipped)\n", fixdir);
    return 77;
  }
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
  return t_status();
}
