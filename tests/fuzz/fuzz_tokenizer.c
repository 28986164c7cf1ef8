/* fuzz_tokenizer.c: libFuzzer target for the tokenizer: loading a
 * tokenizer.json (tok_load_mem) and encoding and decoding arbitrary bytes
 * (tok_encode, tok_decode, tok_decode_stream).
 *
 * The first byte picks the mode.  Even: the rest is text, encoded with the
 * fixed GLM-style tokenizer of tests/data/glm-tiny-tokenizer.json (loaded
 * once, from $srcdir or the current folder); the ids must lie in the
 * vocabulary, decoding must give back the text with invalid UTF-8 replaced
 * (that tokenizer has no normalizer, so the round trip is exact unless the
 * text holds its whitespace-stripping tokens <ls> and <rs>), and the
 * streamed pieces must be valid UTF-8 that add up to the whole decode.
 * Odd: the rest is a tokenizer.json, loaded; when it loads, a fixed
 * multilingual text is encoded, decoded and streamed with the same checks
 * except the round trip.  A refused file must be one MJ_EINPUT line.
 * Seeds: tests/fuzz/tokenizer/. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "utf8.h"

static tok_tokenizer *fixed;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *srcdir = getenv("srcdir");
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/data/glm-tiny-tokenizer.json", srcdir ? srcdir : ".");
  mj_err err = {0};
  if (tok_load(path, &fixed, &err) != 0) {
    mj_err_print(&err, stderr);
    abort();
  }
  return 0;
}

/* Encode text with t and check the ids and both decodes; when exact, the
 * decode must equal the text after UTF-8 repair. */
static void run(tok_tokenizer *t, const char *text, size_t n, bool exact) {
  tok_ids ids = {0};
  mj_err err = {0};
  if (tok_encode(t, text, n, n & 1, &ids, &err) != 0) {
    /* Any bytes encode with the fixed tokenizer; a loaded one may hold a
     * regex that gives up (PCRE2's match limit): one MJ_EINPUT line. */
    if (exact || err.code != MJ_EINPUT || strchr(err.msg, '\n')) abort();
    mj_err_clear(&err);
    tok_ids_free(&ids);
    return;
  }
  int32_t vs = tok_vocab_size(t);
  for (size_t i = 0; i < ids.n; i++)
    if (ids.v[i] < 0 || ids.v[i] >= vs) abort();
  mj_buf dec = {0}, streamed = {0};
  tok_decode(t, ids.v, ids.n, false, &dec);
  tok_stream st;
  tok_stream_init(&st, t, false);
  for (size_t i = 0; i < ids.n; i++) {
    size_t before = streamed.len;
    size_t k = tok_decode_stream(&st, ids.v[i], &streamed);
    if (k != streamed.len - before || (k && utf8_valid_len(streamed.data + before, k) != k)) abort();
  }
  tok_stream_finish(&st, &streamed);
  if (dec.len != streamed.len || (dec.len && memcmp(dec.data, streamed.data, dec.len) != 0)) abort();
  if (dec.len && utf8_valid_len(dec.data, dec.len) != dec.len) abort();
  /* The fixture's <ls> and <rs> are added tokens with lstrip / rstrip: they
   * absorb the whitespace beside them, as the reference does, so text
   * holding them does not round-trip (a harness finding, not a bug). */
  if (exact && !(n & 1) && !memmem(text, n, "<ls>", 4) && !memmem(text, n, "<rs>", 4)) {
    mj_buf want = {0};
    utf8_repair(text, n, &want);
    if (want.len != dec.len || (want.len && memcmp(want.data, dec.data, want.len) != 0)) abort();
    mj_buf_free(&want);
  }
  /* Decoding arbitrary ids, unused and out of range ones included, must
   * not crash either. */
  int32_t junk[4] = {-1, vs, vs - 1, (int32_t)(n * 7919u % (unsigned)(vs + 3))};
  mj_buf j = {0};
  tok_decode(t, junk, 4, n & 2, &j);
  mj_buf_free(&j);
  mj_buf_free(&dec);
  mj_buf_free(&streamed);
  tok_ids_free(&ids);
  mj_err_clear(&err);
}

static const char sample[] =
    "Hello, world! It's 2026: naïve café, Straße, ünïcödé. 你好，世界。こんにちは 안녕하세요 "
    "Привет мир مرحبا 🙂👍🏽 \t\r\n  x = f(1, 2);\n<|user|>hi<|assistant|><think></think>\xff\xc3";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > (1 << 16)) return 0;
  const char *text = (const char *)data + 1;
  size_t n = size - 1;
  if (!(data[0] & 1)) {
    run(fixed, text, n, true);
    return 0;
  }
  tok_tokenizer *t;
  mj_err err = {0};
  if (tok_load_mem(text, n, "tokenizer.json", &t, &err) == 0) {
    run(t, sample, sizeof sample - 1, false);
    run(t, sample + 7, 40, false);
    tok_destroy(t);
  } else if (err.code != MJ_EINPUT || !err.msg[0] || strchr(err.msg, '\n')) {
    abort();
  }
  mj_err_clear(&err);
  return 0;
}
