/* tok_compare.c: compares moejit's tokenizer with the oracle's records, and
 * measures encoding speed.
 *
 *   tok_compare TOKENIZER.json EXPECTED FILE...
 *     EXPECTED is what tests/tokenizer/oracle.mjs printed for the same
 *     FILEs: per line of each FILE, then per whole FILE, the ids and the
 *     decoded text.  Every record is encoded here and compared id for id;
 *     the ids are decoded (at once and streamed one id at a time) and
 *     compared with the oracle's text.  The first mismatches are shown with
 *     both token lists side by side.  Exit 0 only when all records match.
 *   tok_compare --bench TOKENIZER.json FILE MB
 *     Encodes FILE repeated to at least MB megabytes as one text, after one
 *     cold pass over FILE alone, and prints the throughput of both.
 */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "tokenizer.h"
#include "utf8.h"

static int shown;

static void show_pieces(const tok_tokenizer *t, const char *label, const int32_t *v, size_t n,
                        size_t from) {
  fprintf(stderr, "  %s:", label);
  for (size_t i = from; i < n && i < from + 12; i++) {
    size_t len = 0;
    const char *p = tok_piece(t, v[i], &len);
    fprintf(stderr, " %d'%.*s'", v[i], (int)len, p ? p : "?");
  }
  fprintf(stderr, "%s\n", n > from + 12 ? " ..." : "");
}

/* One record: "ids<TAB>json string". */
static int check_record(tok_tokenizer *t, const char *text, size_t len, char *rec, long recno,
                        const char *where, long *bad_ids, long *bad_text) {
  char *tab = strchr(rec, '\t');
  if (!tab) {
    fprintf(stderr, "EXPECTED record %ld has no TAB\n", recno);
    return -1;
  }
  *tab = 0;
  tok_ids want = {0}, got = {0};
  for (char *p = rec; *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    tok_ids_push(&want, (int32_t)v);
    p = end;
  }
  mj_err err = {0};
  if (tok_encode(t, text, len, true, &got, &err)) {
    fprintf(stderr, "%s: encode failed: %s\n", where, err.msg);
    mj_err_clear(&err);
    (*bad_ids)++;
  } else if (got.n != want.n || (got.n && memcmp(got.v, want.v, got.n * sizeof *got.v) != 0)) {
    (*bad_ids)++;
    if (shown++ < 8) {
      size_t k = 0;
      while (k < got.n && k < want.n && got.v[k] == want.v[k]) k++;
      fprintf(stderr, "%s: ids differ at token %zu (moejit %zu tokens, oracle %zu): %.*s%s\n",
              where, k, got.n, want.n, (int)MJ_MIN(len, 120), text, len > 120 ? "..." : "");
      size_t from = k > 3 ? k - 3 : 0;
      show_pieces(t, "moejit", got.v, got.n, from);
      show_pieces(t, "oracle", want.v, want.n, from);
    }
  }
  /* decode(encode(x)) against the oracle's decode of its own ids */
  mj_arena a;
  mj_arena_init(&a, 0);
  json *j;
  if (json_parse(&a, tab + 1, strlen(tab + 1), "EXPECTED", &j, &err) || j->type != JSON_STR) {
    fprintf(stderr, "EXPECTED record %ld: bad decoded text: %s\n", recno, err.msg);
    mj_err_clear(&err);
    mj_arena_free(&a);
    tok_ids_free(&want);
    tok_ids_free(&got);
    return -1;
  }
  mj_buf dec = {0}, str = {0};
  tok_decode(t, got.v, got.n, false, &dec);
  tok_stream s;
  tok_stream_init(&s, t, false);
  for (size_t i = 0; i < got.n; i++) {
    size_t before = str.len;
    tok_decode_stream(&s, got.v[i], &str);
    /* Every streamed piece must be valid UTF-8 on its own. */
    if (utf8_valid_len(str.data + before, str.len - before) != str.len - before) (*bad_text)++;
  }
  tok_stream_finish(&s, &str);
  /* (An empty decode has no buffer: memcmp must not see its null.) */
  bool same = dec.len == j->len && (dec.len == 0 || memcmp(dec.data, j->str, dec.len) == 0);
  bool same_stream = str.len == dec.len && (dec.len == 0 || memcmp(str.data, dec.data, dec.len) == 0);
  if (!same || !same_stream) {
    (*bad_text)++;
    if (shown++ < 8)
      fprintf(stderr, "%s: decoded text differs%s:\n  moejit: %.*s\n  oracle: %.*s\n", where,
              same ? " (streamed)" : "", (int)MJ_MIN(dec.len, 200), dec.data ? dec.data : "",
              (int)MJ_MIN(j->len, 200), j->str);
  }
  mj_buf_free(&dec);
  mj_buf_free(&str);
  mj_arena_free(&a);
  tok_ids_free(&want);
  tok_ids_free(&got);
  return 0;
}

static int compare(int argc, char **argv) {
  tok_tokenizer *t;
  mj_err err = {0};
  if (tok_load(argv[1], &t, &err)) {
    mj_err_print(&err, stderr);
    return 2;
  }
  char *exp;
  size_t exp_len;
  if (mj_read_file(argv[2], &exp, &exp_len, &err)) {
    mj_err_print(&err, stderr);
    return 2;
  }
  char *rec = exp, *exp_end = exp + exp_len;
  long recno = 0, bad_ids = 0, bad_text = 0;
  int status = 0;
  for (int f = 3; f < argc && !status; f++) {
    char *data;
    size_t len;
    if (mj_read_file(argv[f], &data, &len, &err)) {
      mj_err_print(&err, stderr);
      return 2;
    }
    /* Lines (split on \n), then the whole file: the order oracle.mjs
     * writes. */
    size_t nspans = 0, cap = 1024, start = 0;
    size_t (*spans)[2] = mj_xmalloc(cap * sizeof *spans);
    for (size_t i = 0; i <= len; i++) {
      if (i < len && data[i] != '\n') continue;
      if (i == len && start == len) break;
      if (nspans + 2 > cap) spans = mj_xrealloc(spans, (cap *= 2) * sizeof *spans);
      spans[nspans][0] = start;
      spans[nspans++][1] = i;
      start = i + 1;
    }
    spans[nspans][0] = 0;
    spans[nspans++][1] = len;
    for (size_t k = 0; k < nspans && !status; k++) {
      char *nl = memchr(rec, '\n', (size_t)(exp_end - rec));
      if (!nl) {
        fprintf(stderr, "EXPECTED ends early at record %ld\n", recno);
        status = 2;
        break;
      }
      *nl = 0;
      char where[512];
      if (k + 1 == nspans) snprintf(where, sizeof where, "%s (whole file)", argv[f]);
      else snprintf(where, sizeof where, "%s:%zu", argv[f], k + 1);
      if (check_record(t, data + spans[k][0], spans[k][1] - spans[k][0], rec, recno++, where,
                       &bad_ids, &bad_text))
        status = 2;
      rec = nl + 1;
    }
    free(spans);
    free(data);
  }
  printf("%s: %ld records, %ld id mismatches, %ld decode mismatches\n", argv[1], recno, bad_ids,
         bad_text);
  free(exp);
  tok_destroy(t);
  if (status) return status;
  return bad_ids || bad_text ? 1 : 0;
}

static int bench(char **argv) {
  tok_tokenizer *t;
  mj_err err = {0};
  double t0 = mj_now_ms();
  if (tok_load(argv[2], &t, &err)) {
    mj_err_print(&err, stderr);
    return 2;
  }
  double load_ms = mj_now_ms() - t0;
  char *data;
  size_t len;
  if (mj_read_file(argv[3], &data, &len, &err)) {
    mj_err_print(&err, stderr);
    return 2;
  }
  double mb = atof(argv[4]);
  tok_ids ids = {0};
  t0 = mj_now_ms();
  tok_encode(t, data, len, false, &ids, &err);
  double cold_ms = mj_now_ms() - t0;
  size_t cold_tokens = ids.n;
  mj_buf big = {0};
  while ((double)big.len < mb * 1e6) mj_buf_put(&big, data, len);
  ids.n = 0;
  t0 = mj_now_ms();
  if (tok_encode(t, big.data, big.len, false, &ids, &err)) {
    mj_err_print(&err, stderr);
    return 2;
  }
  double ms = mj_now_ms() - t0;
  printf("load %.0f ms; cold pass: %zu bytes, %zu tokens, %.1f MB/s; "
         "repeated: %zu bytes, %zu tokens, %.1f ms, %.1f MB/s, %.2f M tokens/s\n",
         load_ms, len, cold_tokens, (double)len / 1e3 / cold_ms, big.len, ids.n, ms,
         (double)big.len / 1e3 / ms, (double)ids.n / 1e3 / ms);
  tok_ids_free(&ids);
  mj_buf_free(&big);
  free(data);
  tok_destroy(t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--bench") == 0) return bench(argv);
  if (argc < 4) {
    fprintf(stderr, "usage: tok_compare TOKENIZER.json EXPECTED FILE...\n"
                    "       tok_compare --bench TOKENIZER.json FILE MB\n");
    return 2;
  }
  return compare(argc, argv);
}
