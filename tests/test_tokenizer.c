/* test_tokenizer.c: the tokenizer and the GLM-5 chat format on a small
 * hand-made tokenizer.json (tests/data/glm-tiny-tokenizer.json: the 256
 * byte tokens as ids 0-255, sixteen merges, the GLM-4 split pattern, and
 * GLM-5's special tokens at GLM-5's ids, plus three added tokens that
 * exercise lstrip, rstrip and single_word).  The comparison with real
 * vocabularies is tests/tokenizer.sh. */
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "t.h"
#include "tokenizer.h"
#include "utf8.h"

static char *fixture_text;
static size_t fixture_len;
static tok_tokenizer *tk;

static void load_fixture(void) {
  const char *srcdir = getenv("srcdir");
  char path[4096];
  snprintf(path, sizeof path, "%s/tests/data/glm-tiny-tokenizer.json", srcdir ? srcdir : ".");
  mj_err err = {0};
  if (mj_read_file(path, &fixture_text, &fixture_len, &err) ||
      tok_load_mem(fixture_text, fixture_len, path, &tk, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
}

/* Encode s and compare with the ids in want (terminated by -1). */
static int enc_eq(const char *s, size_t n, const int32_t *want) {
  tok_ids ids = {0};
  mj_err err = {0};
  int ok = tok_encode(tk, s, n, true, &ids, &err) == 0;
  size_t k = 0;
  while (want[k] >= 0) k++;
  ok = ok && ids.n == k && (k == 0 || memcmp(ids.v, want, k * sizeof *want) == 0);
  if (!ok) {
    fprintf(stderr, "  encode '%.*s' gave:", (int)n, s);
    for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.v[i]);
    fprintf(stderr, "\n");
  }
  tok_ids_free(&ids);
  return ok;
}
#define ENC(s, ...) enc_eq(s, sizeof(s) - 1, (const int32_t[]){__VA_ARGS__, -1})

static void test_lookup(void) {
  T_EQ_INT(tok_vocab_size(tk), 154903);
  T_EQ_INT(tok_added(tk, "<think>"), 154841);
  T_EQ_INT(tok_added(tk, "<nope>"), -1);
  T_EQ_INT(tok_find(tk, "\xC4\xA0the", 5), 258); /* "Ġthe" */
  T_EQ_INT(tok_find(tk, "[gMASK]", 7), 154822);
  T_CHECK(tok_is_special(tk, 154822));
  T_CHECK(!tok_is_special(tk, 154902));
  size_t len;
  const char *b = tok_bytes(tk, 258, &len);
  T_CHECK(b && len == 4 && memcmp(b, " the", 4) == 0);
  T_CHECK(tok_piece(tk, 300, &len) == NULL); /* a hole in the ids */
}

static void test_bpe(void) {
  T_CHECK(ENC("hello the world", 257, 259, 111, 258, 267)); /* he ll o Ġthe Ġworld */
  T_CHECK(ENC("12345", 271, 52, 53));                        /* digits in groups of 3 */
  T_CHECK(ENC("    ", 269));                                 /* ĠĠĠĠ */
  tok_ids ids = {0};
  T_EQ_INT(tok_encode(tk, "", 0, true, &ids, NULL), 0);
  T_EQ_INT(ids.n, 0);
  tok_ids_free(&ids);
}

static void test_added_tokens(void) {
  T_CHECK(ENC("[gMASK]<sop>x", 154822, 154824, 120));
  T_CHECK(ENC("a <ls>", 97, 154900));               /* lstrip eats the space */
  T_CHECK(ENC("<rs>  b", 154901, 98));              /* rstrip eats both */
  T_CHECK(ENC("a word b", 97, 32, 154902, 32, 98)); /* single_word matches */
  T_CHECK(ENC("swords", 115, 119, 111, 114, 100, 115)); /* ...not inside a word */
  T_CHECK(ENC("<|user|", 60, 124, 117, 115, 101, 114, 124)); /* unfinished: plain text */
}

static void test_invalid_utf8(void) {
  tok_ids a = {0}, b = {0};
  tok_encode(tk, "a\xFF" "b\xE4\xB8", 5, true, &a, NULL);
  tok_encode(tk, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8, true, &b, NULL);
  T_CHECK(a.n == b.n && memcmp(a.v, b.v, a.n * sizeof *a.v) == 0);
  tok_ids_free(&a);
  tok_ids_free(&b);
}

static void test_decode_stream(void) {
  /* 你 is E4 BD A0: three byte tokens with no merges in the fixture. */
  int32_t ids[] = {104, 0xE4, 0xBD, 0xA0, 154841, 0xE4, 65};
  tok_stream s;
  tok_stream_init(&s, tk, false);
  mj_buf out = {0};
  size_t got[7];
  for (int i = 0; i < 7; i++) got[i] = tok_decode_stream(&s, ids[i], &out);
  got[6] += tok_stream_finish(&s, &out);
  T_EQ_INT(got[0], 1);
  T_EQ_INT(got[1], 0); /* held back */
  T_EQ_INT(got[2], 0);
  T_EQ_INT(got[3], 3);
  T_EQ_INT(got[4], 7);     /* <think> */
  T_EQ_INT(got[5], 0);
  T_EQ_INT(got[6], 3 + 1); /* U+FFFD for the lone E4, then A */
  mj_buf_putc(&out, 0);
  T_EQ_STR(out.data, "h\xE4\xBD\xA0<think>\xEF\xBF\xBD" "A");
  mj_buf_free(&out);

  mj_buf full = {0};
  tok_decode(tk, ids, 7, true, &full); /* without the special token */
  mj_buf_putc(&full, 0);
  T_EQ_STR(full.data, "h\xE4\xBD\xA0\xEF\xBF\xBD" "A");
  mj_buf_free(&full);

  /* An unfinished character at the end becomes U+FFFD. */
  mj_buf end = {0};
  tok_decode(tk, (int32_t[]){0xE4, 0xBD}, 2, false, &end);
  mj_buf_putc(&end, 0);
  T_EQ_STR(end.data, "\xEF\xBF\xBD");
  mj_buf_free(&end);
}

/* decode(encode(x)) == x with invalid bytes replaced, on random bytes: the
 * fixture has no normalizer, so nothing else may change. */
static void test_roundtrip_random(void) {
  uint64_t s = 12345;
  int bad = 0;
  for (int it = 0; it < 3000; it++) {
    char buf[64];
    size_t n = (size_t)(it % 64);
    for (size_t i = 0; i < n; i++) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      unsigned r = (unsigned)(s >> 33);
      /* mostly ASCII and spaces, some high bytes, some valid UTF-8 */
      buf[i] = (char)(r % 4 == 0 ? 0x80 + r % 0x80 : r % 3 == 0 ? ' ' : 'a' + r % 26);
    }
    tok_ids ids = {0};
    mj_buf dec = {0}, want = {0};
    T_EQ_INT(tok_encode(tk, buf, n, false, &ids, NULL), 0);
    tok_decode(tk, ids.v, ids.n, false, &dec);
    utf8_repair(buf, n, &want);
    if (dec.len != want.len || (want.len && memcmp(dec.data, want.data, want.len) != 0)) bad++;
    tok_ids_free(&ids);
    mj_buf_free(&dec);
    mj_buf_free(&want);
  }
  T_EQ_INT(bad, 0);
}

static void test_long_runs(void) {
  size_t n = 1 << 20;
  char *s = malloc(n);
  memset(s, ' ', n);
  s[n - 1] = 'x';
  tok_ids ids = {0};
  mj_err err = {0};
  T_EQ_INT(tok_encode(tk, s, n, false, &ids, &err), 0);
  mj_buf dec = {0};
  tok_decode(tk, ids.v, ids.n, false, &dec);
  T_CHECK(dec.len == n && memcmp(dec.data, s, n) == 0);
  T_CHECK(ids.n < n / 3); /* ĠĠĠĠ merges happened */
  mj_buf_free(&dec);
  tok_ids_free(&ids);
  free(s);
}

/* The fixture with one substring replaced, loaded; returns the load status. */
static int load_variant(const char *from, const char *to, tok_tokenizer **out, mj_err *err) {
  const char *at = strstr(fixture_text, from);
  MJ_ASSERT(at);
  mj_buf b = {0};
  mj_buf_put(&b, fixture_text, (size_t)(at - fixture_text));
  mj_buf_puts(&b, to);
  mj_buf_puts(&b, at + strlen(from));
  int r = tok_load_mem(b.data, b.len, "variant.json", out, err);
  mj_buf_free(&b);
  return r;
}

static void test_post_processor(void) {
  tok_tokenizer *t;
  mj_err err = {0};
  T_EQ_INT(load_variant("\"post_processor\": null",
                        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
                        "{\"SpecialToken\": {\"id\": \"[gMASK]\", \"type_id\": 0}},"
                        "{\"SpecialToken\": {\"id\": \"<sop>\", \"type_id\": 0}},"
                        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
                        "{\"SpecialToken\": {\"id\": \"<|endoftext|>\", \"type_id\": 0}}],"
                        "\"pair\": [], \"special_tokens\": {}}",
                        &t, &err),
           0);
  tok_ids ids = {0};
  tok_encode(t, "x", 1, true, &ids, NULL);
  T_EQ_INT(ids.n, 4);
  T_EQ_INT(ids.v[0], 154822);
  T_EQ_INT(ids.v[2], 120);
  T_EQ_INT(ids.v[3], 154820);
  ids.n = 0;
  tok_encode(t, "x", 1, false, &ids, NULL);
  T_EQ_INT(ids.n, 1);
  tok_ids_free(&ids);
  tok_destroy(t);
}

/* Split's behaviors and invert, as Hugging Face tokenizers' NormalizedString
 * split defines them (the JS oracle of tests/tokenizer.sh implements only
 * Isolated, Removed and "keep the matches"), on a pre-tokenizer of one Split
 * with a String or a Regex pattern: the words handed to BPE, joined by |. */
static void piece_cat(void *ctx, const char *p, size_t n) {
  mj_buf *b = ctx;
  if (b->len) mj_buf_putc(b, '|');
  mj_buf_put(b, p, n);
}

/* The pieces of text under a pre-tokenizer of `step` (one JSON object)
 * followed by ByteLevel, joined by |, equal want. */
static bool step_pieces_are(const char *step, const char *text, const char *want) {
  mj_buf j = {0}, got = {0};
  mj_buf_printf(&j,
                "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [],"
                " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [%s,"
                "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
                " \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}}",
                step);
  tok_tokenizer *t = NULL;
  mj_err err = {0};
  bool ok = tok_load_mem(j.data, j.len, "split.json", &t, &err) == 0 &&
            tok_pre_pieces(t, text, strlen(text), piece_cat, &got, &err) == 0;
  ok = ok && strcmp(got.len ? got.data : "", want) == 0;
  if (!ok) fprintf(stderr, "  %s on '%s': got '%s', want '%s' %s\n", step, text, got.len ? got.data : "", want, err.msg);
  tok_destroy(t);
  mj_err_clear(&err);
  mj_buf_free(&j), mj_buf_free(&got);
  return ok;
}

static bool pieces_are(const char *pattern, const char *behavior, bool invert, const char *text, const char *want) {
  char step[512];
  snprintf(step, sizeof step, "{\"type\": \"Split\", \"pattern\": %s, \"behavior\": \"%s\", \"invert\": %s}",
           pattern, behavior, invert ? "true" : "false");
  return step_pieces_are(step, text, want);
}

/* The fixed splitters, by the reference's (Rust) definitions: Whitespace
 * keeps the runs of \w (Unicode: letters, marks, Nd, Pc) and of other
 * non-space characters; WhitespaceSplit drops each White_Space character;
 * Digits isolates each numeric character or keeps runs; Punctuation isolates
 * ASCII punctuation and the P categories (or as its behavior says). */
static void test_fixed_splitters(void) {
  T_CHECK(step_pieces_are("{\"type\": \"Whitespace\"}", "Hello, world!! x_y 12", "Hello|,|world|!!|x_y|12"));
  T_CHECK(step_pieces_are("{\"type\": \"Whitespace\"}", "caf\xc3\xa9\xe2\x80\x94ol\xc3\xa9", "caf\xc3\xa9|\xe2\x80\x94|ol\xc3\xa9"));
  T_CHECK(step_pieces_are("{\"type\": \"WhitespaceSplit\"}", " a  b\tc\xc2\xa0" "d ", "a|b|c|d"));
  T_CHECK(step_pieces_are("{\"type\": \"Digits\", \"individual_digits\": true}", "a123b", "a|1|2|3|b"));
  T_CHECK(step_pieces_are("{\"type\": \"Digits\", \"individual_digits\": false}", "a123b45", "a|123|b|45"));
  T_CHECK(step_pieces_are("{\"type\": \"Digits\", \"individual_digits\": true}", "x\xd9\xa3\xd9\xa4", "x|\xd9\xa3|\xd9\xa4"));
  T_CHECK(step_pieces_are("{\"type\": \"Punctuation\"}", "hi...there! $5", "hi|.|.|.|there|!| |$|5"));
  T_CHECK(step_pieces_are("{\"type\": \"Punctuation\", \"behavior\": \"Contiguous\"}", "hi...there", "hi|...|there"));
  T_CHECK(step_pieces_are("{\"type\": \"Punctuation\"}", "a\xe2\x80\x94" "b", "a|\xe2\x80\x94|" "b"));
}

static void test_split_behaviors(void) {
  const char *dash = "{\"String\": \"-\"}", *digits = "{\"Regex\": \"\\\\d+\"}";
  /* the-final--x: segments the | - | final | - | - | x */
  T_CHECK(pieces_are(dash, "Isolated", false, "the-final--x", "the|-|final|-|-|x"));
  T_CHECK(pieces_are(dash, "Removed", false, "the-final--x", "the|final|x"));
  T_CHECK(pieces_are(dash, "MergedWithPrevious", false, "the-final--x", "the-|final-|-|x"));
  T_CHECK(pieces_are(dash, "MergedWithNext", false, "the-final--x", "the|-final|-|-x"));
  T_CHECK(pieces_are(dash, "Contiguous", false, "the-final--x", "the|-|final|--|x"));
  /* Inverted, the words are the "matches" and each dash is text between;
   * two dashes stay two segments (two matches of the pattern). */
  T_CHECK(pieces_are(dash, "Removed", true, "the-final--x", "-|-|-"));
  T_CHECK(pieces_are(dash, "Isolated", true, "the-final--x", "the|-|final|-|-|x"));
  T_CHECK(pieces_are(dash, "MergedWithPrevious", true, "the-final--x", "the|-final|-|-x"));
  T_CHECK(pieces_are(dash, "MergedWithNext", true, "the-final--x", "the-|final-|-|x"));
  T_CHECK(pieces_are(dash, "Contiguous", true, "the-final--x", "the|-|final|--|x"));
  /* A leading and a trailing match; a Regex pattern. */
  T_CHECK(pieces_are(digits, "MergedWithPrevious", false, "12ab34cd56", "12|ab34|cd56"));
  T_CHECK(pieces_are(digits, "MergedWithNext", false, "12ab34cd56", "12ab|34cd|56"));
  T_CHECK(pieces_are(digits, "Removed", false, "12ab34cd56", "ab|cd"));
  T_CHECK(pieces_are(digits, "Removed", true, "12ab34cd56", "12|34|56"));
  T_CHECK(pieces_are(digits, "Contiguous", false, "1a", "1|a"));
  T_CHECK(pieces_are(digits, "Removed", false, "123", ""));
}

/* Normalizer steps where the JS oracle departs from the reference, held to
 * the reference: Prepend leaves empty text empty (a Strip can empty it);
 * Strip removes White_Space, U+0085 included, and keeps U+FEFF. */
static void test_normalizers(void) {
  tok_tokenizer *saved = tk, *t = NULL;
  mj_err err = {0};
  T_EQ_INT(load_variant("\"normalizer\": null",
                        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Strip\", "
                        "\"strip_left\": true, \"strip_right\": true}, {\"type\": \"Prepend\", \"prepend\": \"x\"}]}",
                        &t, &err),
           0);
  if (!t) return;
  tk = t;
  T_CHECK(enc_eq("  ", 2, (const int32_t[]){-1}));
  T_CHECK(ENC("\xc2\x85" "a ", 120, 97));
  T_CHECK(ENC("\xef\xbb\xbf" "a", 120, 239, 187, 191, 97));
  tk = saved;
  tok_destroy(t);
  /* Lowercase is Rust's char::to_lowercase, character by character: a
   * final capital sigma becomes σ (CF 83), not ς (the JS oracle's
   * toLowerCase applies the final-sigma rule); İ becomes i + U+0307. */
  t = NULL;
  T_EQ_INT(load_variant("\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}", &t, &err), 0);
  if (!t) return;
  tk = t;
  T_CHECK(ENC("AB", 97, 98));
  T_CHECK(ENC("\xce\xa3\xce\xa3", 207, 131, 207, 131));      /* ΣΣ -> σσ */
  T_CHECK(ENC("\xc4\xb0", 105, 204, 135));                  /* İ -> i U+0307 */
  tk = saved;
  tok_destroy(t);
}

static void test_load_errors(void) {
  static const struct { const char *from, *to, *msg; } cases[] = {
      {"\"normalizer\": null", "\"normalizer\": {\"type\": \"BertNormalizer\"}",
       "normalizer \"BertNormalizer\" is not supported"},
      {"\"normalizer\": null", "\"normalizer\": {\"type\": \"Prepend\"}", "normalizer Prepend has no string"},
      {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model type \"WordPiece\" is not supported"},
      {"\"byte_fallback\": false", "\"byte_fallback\": true",
       "model.byte_fallback with a ByteLevel pre_tokenizer is not supported"},
      {"\"behavior\": \"Isolated\"", "\"behavior\": \"Sideways\"",
       "Split behavior \"Sideways\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous"},
      {"\"pattern\": {\"Regex\": \"", "\"pattern\": {\"Regex\": \"(\", \"x\": \"",
       "does not compile"},
      {"\"type\": \"ByteLevel\", \"add_prefix_space\": false", "\"type\": \"Metaspace\", \"x\": false",
       "pre_tokenizer Metaspace needs a one-character \"replacement\""},
      {"\"type\": \"ByteLevel\", \"add_prefix_space\": false", "\"type\": \"CharDelimiterSplit\", \"x\": false",
       "pre_tokenizer \"CharDelimiterSplit\" is not supported"},
      {"\"decoder\": {\"type\": \"ByteLevel\",", "\"decoder\": {\"type\": \"WordPiece\",",
       "decoder \"WordPiece\" is not supported"},
      {"\"decoder\": {\"type\": \"ByteLevel\",", "\"decoder\": {\"type\": \"Fuse\",",
       "a ByteLevel pre_tokenizer needs a ByteLevel decoder"},
      {"\"merges\": [", "\"merges\": [7, ", "is neither"},
      /* Merges the reference refuses (MergeTokenOutOfVocabulary): a part,
       * or the token made, missing from the vocabulary. */
      {"\"merges\": [", "\"merges\": [\"zz q\", ", "merge 0 (\"zz\" + \"q\"): \"zz\" is not in the vocabulary"},
      {"\"merges\": [", "\"merges\": [\"q zz\", ", "merge 0 (\"q\" + \"zz\"): \"zz\" is not in the vocabulary"},
      {"\"merges\": [", "\"merges\": [[\"q\", \"x\"], ", "merge 0 (\"q\" + \"x\"): \"qx\" is not in the vocabulary"},
      {"{", "[", "bad JSON"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    tok_tokenizer *t = NULL;
    mj_err err = {0};
    T_EQ_INT(load_variant(cases[i].from, cases[i].to, &t, &err), MJ_EINPUT);
    T_CHECK(t == NULL);
    if (!strstr(err.msg, cases[i].msg) || strncmp(err.msg, "variant.json:", 13) != 0)
      fprintf(stderr, "  message: %s\n  wanted:  %s\n", err.msg, cases[i].msg);
    T_CHECK(strstr(err.msg, cases[i].msg) != NULL);
    T_CHECK(strncmp(err.msg, "variant.json:", 13) == 0);
    mj_err_clear(&err);
  }
  tok_tokenizer *t = NULL;
  mj_err err = {0};
  T_EQ_INT(tok_load("/nonexistent/tokenizer.json", &t, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "/nonexistent/tokenizer.json") != NULL);
  mj_err_clear(&err);
  /* A top level that is not an object (the fuzzer's "9": the message once
   * read the freed JSON tree for its line). */
  T_EQ_INT(tok_load_mem("9", 1, "nine.json", &t, &err), MJ_EINPUT);
  T_CHECK(strcmp(err.msg, "nine.json:1: the top level is not an object") == 0);
  mj_err_clear(&err);
}

static void test_chat(void) {
  chat_format f;
  mj_err err = {0};
  T_EQ_INT(chat_format_init(&f, tk, &err), 0);
  chat_msg msgs[] = {{CHAT_SYSTEM, "be", 2}, {CHAT_USER, "hi", 2}};
  tok_ids ids = {0};
  T_EQ_INT(chat_encode(tk, &f, msgs, 2, true, true, &ids, &err), 0);
  const int32_t want[] = {154822, 154824, 154826, 98, 101, 154827, 104, 105, 154828, 154841};
  T_EQ_INT(ids.n, MJ_ARRAY_LEN(want));
  T_CHECK(ids.n == MJ_ARRAY_LEN(want) && memcmp(ids.v, want, sizeof want) == 0);
  ids.n = 0;
  T_EQ_INT(chat_encode(tk, &f, msgs + 1, 1, true, false, &ids, &err), 0);
  const int32_t want2[] = {154822, 154824, 154827, 104, 105, 154828, 154842};
  T_CHECK(ids.n == MJ_ARRAY_LEN(want2) && memcmp(ids.v, want2, sizeof want2) == 0);
  /* The same ids as tokenizing the rendered text. */
  tok_ids direct = {0};
  const char *text = "[gMASK]<sop><|user|>hi<|assistant|></think>";
  tok_encode(tk, text, strlen(text), false, &direct, NULL);
  T_CHECK(direct.n == ids.n && memcmp(direct.v, ids.v, ids.n * sizeof *ids.v) == 0);
  tok_ids_free(&direct);
  tok_ids_free(&ids);
  T_CHECK(chat_is_eos(&f, 154820));
  T_CHECK(chat_is_eos(&f, 154827));
  T_CHECK(chat_is_eos(&f, 154829));
  T_CHECK(!chat_is_eos(&f, 154828));

  tok_tokenizer *t;
  T_EQ_INT(load_variant("\"[gMASK]\"", "\"[MASK]\"", &t, &err), 0);
  T_EQ_INT(chat_format_init(&f, t, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "'[gMASK]'") != NULL);
  mj_err_clear(&err);
  tok_destroy(t);
}

/* ---- BPE over characters (SentencePiece's way) ------------------------------------------- */
/* A tiny char-level vocabulary: a, b, ab, the space marker, <0x..> tokens
 * for é's two bytes, and <unk>; pre_tokenizer, normalizer and decoder
 * given by the caller. */
static tok_tokenizer *char_bpe(const char *model_extra, const char *normalizer, const char *pre, const char *decoder,
                               mj_err *err) {
  mj_buf j = {0};
  mj_buf_printf(&j,
                "{\"model\": {\"type\": \"BPE\", %s \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3,"
                " \"\xe2\x96\x81\": 4, \"\xe2\x96\x81" "a\": 5, \"<0xC3>\": 6, \"<0xA9>\": 7, \"<s>\": 8},"
                " \"merges\": [\"a b\", \"\xe2\x96\x81 a\"]},"
                " \"added_tokens\": [{\"id\": 8, \"content\": \"<s>\", \"special\": true}],"
                " \"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": null, \"decoder\": %s}",
                model_extra, normalizer, pre, decoder);
  tok_tokenizer *t = NULL;
  if (tok_load_mem(j.data, j.len, "char.json", &t, err)) t = NULL;
  mj_buf_free(&j);
  return t;
}

static bool char_ids_are(tok_tokenizer *t, const char *text, const int32_t *want, size_t n, const char *decoded) {
  tok_ids ids = {0};
  mj_err err = {0};
  bool ok = tok_encode(t, text, strlen(text), false, &ids, &err) == 0 && ids.n == n;
  for (size_t i = 0; ok && i < n; i++) ok = ids.v[i] == want[i];
  mj_buf d = {0}, st = {0};
  tok_decode(t, ids.v, ids.n, true, &d);
  tok_stream s;
  tok_stream_init(&s, t, true);
  for (size_t i = 0; i < ids.n; i++) tok_decode_stream(&s, ids.v[i], &st);
  tok_stream_finish(&s, &st);
  bool dok = d.len == strlen(decoded) && !memcmp(d.data, decoded, d.len) && st.len == d.len &&
             !memcmp(st.data, d.data, d.len);
  if (!ok || !dok) {
    fprintf(stderr, "  '%s':", text);
    for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.v[i]);
    fprintf(stderr, " decoded '%.*s' streamed '%.*s' (want '%s')\n", (int)d.len, d.data ? d.data : "", (int)st.len,
            st.data ? st.data : "", decoded);
  }
  tok_ids_free(&ids);
  mj_buf_free(&d), mj_buf_free(&st);
  mj_err_clear(&err);
  return ok && dok;
}
#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / 4

static void test_char_bpe(void) {
  mj_err err = {0};
  const char *llama_norm = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"},"
                           " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}]}";
  const char *llama_dec = "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
                          "\"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
                          " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}";
  /* byte_fallback: é is not in the vocabulary, its two bytes are */
  tok_tokenizer *t = char_bpe("\"byte_fallback\": true, \"unk_token\": \"<unk>\", \"fuse_unk\": true,", llama_norm,
                              "null", llama_dec, &err);
  T_CHECK(t != NULL);
  if (t) {
    T_CHECK(char_ids_are(t, "ab a", IDS(4, 3, 5), "ab a"));                 /* ▁ ab ▁a; the first space stripped */
    T_CHECK(char_ids_are(t, "a\xc3\xa9" "b", IDS(5, 6, 7, 2), "a\xc3\xa9" "b")); /* é by its bytes */
    T_CHECK(char_ids_are(t, "axxb", IDS(5, 0, 2), "a<unk>b"));             /* fuse_unk: one <unk> for xx */
    T_CHECK(char_ids_are(t, "<s>a", IDS(8, 5), "a"));                       /* the special one skipped, then ▁a */
    tok_destroy(t);
  }
  /* without byte_fallback é is unknown; without fuse_unk every unknown character is one <unk> */
  t = char_bpe("\"unk_token\": \"<unk>\",", llama_norm, "null", llama_dec, &err);
  T_CHECK(t != NULL);
  if (t) {
    T_CHECK(char_ids_are(t, "a\xc3\xa9\xc3\xa9", IDS(5, 0, 0), "a<unk><unk>"));
    tok_destroy(t);
  }
  /* Metaspace, the reference's own cases (metaspace.rs): split puts each
   * replacement of a run of spaces in its own piece; "first" prepends only
   * at the start of the input, not after an added token; the decoder drops
   * the first token's replacements. */
  const char *ms = "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"%s\", \"split\": %s}";
  char pre[256], dec[512];
  snprintf(pre, sizeof pre, ms, "always", "true");
  snprintf(dec, sizeof dec, ms, "always", "true");
  t = char_bpe("\"byte_fallback\": true,", "null", pre, dec, &err);
  T_CHECK(t != NULL);
  if (t) {
    mj_buf got = {0};
    T_EQ_INT(tok_pre_pieces(t, "Hey   friend!", 13, piece_cat, &got, &err), 0);
    T_EQ_STR(got.data, "\xe2\x96\x81Hey|\xe2\x96\x81|\xe2\x96\x81|\xe2\x96\x81" "friend!");
    mj_buf_free(&got);
    T_CHECK(char_ids_are(t, "a  a", IDS(5, 4, 5), "a  a"));
    tok_destroy(t);
  }
  snprintf(pre, sizeof pre, ms, "first", "false");
  snprintf(dec, sizeof dec, ms, "first", "false");
  t = char_bpe("\"byte_fallback\": true,", "null", pre, dec, &err);
  T_CHECK(t != NULL);
  if (t) {
    T_CHECK(char_ids_are(t, "a", IDS(5), "a"));
    T_CHECK(char_ids_are(t, "<s>a", IDS(8, 1), "a")); /* after an added token: no ▁ */
    tok_destroy(t);
  }
  /* what is refused, one line each */
  T_CHECK(char_bpe("", "null", "null", "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": "
                   "\"Strip\", \"content\": \" \", \"start\": 0, \"stop\": 1}]}", &err) == NULL);
  T_CHECK(strstr(err.msg, "after Fuse only a Strip of leading characters (stop 0) is supported") != NULL);
  mj_err_clear(&err);
  T_CHECK(char_bpe("", "null", "null", "{\"type\": \"ByteLevel\"}", &err) == NULL);
  T_CHECK(strstr(err.msg, "a ByteLevel decoder without a ByteLevel pre_tokenizer is not supported") != NULL);
  mj_err_clear(&err);
  T_CHECK(char_bpe("", "null", "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}",
                   "{\"type\": \"Fuse\"}", &err) == NULL);
  T_CHECK(strstr(err.msg, "prepend_scheme \"sometimes\" is not always, first or never") != NULL);
  mj_err_clear(&err);
}

/* continuing_subword_prefix and end_of_word_suffix, by the reference's
 * rules (tokenizers' BPE::merge_word; tokenizers.js implements only the
 * suffix, which tests/tokenizer.sh compares): every character but a
 * word's first carries the prefix, the last the suffix; a merge (a, b)
 * makes a followed by b without its prefix, and the file must hold that. */
static void test_affixes(void) {
  const char *fmt =
      "{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"end_of_word_suffix\": %s,"
      " \"vocab\": {\"h\": 0, \"##e\": 1, \"##l\": 2, \"##o\": 3, \"he\": 4, \"hel\": 5, \"##lo\": 6, \"##o</w>\": 7,"
      " \"##lo</w>\": 8, \"o\": 9, \"o</w>\": 10, \"[UNK]\": 11}, \"unk_token\": \"[UNK]\","
      " \"merges\": [\"h ##e\", \"he ##l\", %s]},"
      " \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"WhitespaceSplit\"},"
      " \"post_processor\": null, \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\","
      " \"pattern\": {\"String\": \"##\"}, \"content\": \"\"}, {\"type\": \"Replace\", \"pattern\": {\"String\":"
      " \"</w>\"}, \"content\": \" \"}]}}";
  mj_buf j = {0};
  mj_err err = {0};
  tok_tokenizer *t = NULL;
  /* prefix only: hello -> h ##e ##l ##l ##o -> he -> hel, ##l ##o -> ##lo */
  mj_buf_printf(&j, fmt, "null", "\"##l ##o\"");
  T_EQ_INT(tok_load_mem(j.data, j.len, "affix.json", &t, &err), 0);
  if (t) {
    T_CHECK(char_ids_are(t, "hello", IDS(5, 6), "hello"));
    T_CHECK(char_ids_are(t, "o oh", IDS(9, 9, 11), "oo[UNK]")); /* "##h" is not in the vocabulary */
    tok_destroy(t);
  }
  /* both: the last character is ##o</w>; ##l + ##o</w> makes ##lo</w> */
  j.len = 0;
  mj_buf_printf(&j, fmt, "\"</w>\"", "\"##l ##o</w>\"");
  T_EQ_INT(tok_load_mem(j.data, j.len, "affix.json", &t, &err), 0);
  if (t) {
    T_CHECK(char_ids_are(t, "hello o", IDS(5, 8, 10), "hello o "));
    tok_destroy(t);
  }
  /* a merge whose product (a + b without the prefix) is missing */
  j.len = 0;
  mj_buf_printf(&j, fmt, "null", "\"##e ##o\"");
  T_EQ_INT(tok_load_mem(j.data, j.len, "affix.json", &t, &err), MJ_EINPUT);
  T_CHECK(strstr(err.msg, "merge 2 (\"##e\" + \"##o\"): \"##eo\" is not in the vocabulary") != NULL);
  mj_err_clear(&err);
  mj_buf_free(&j);
}

int main(void) {
  load_fixture();
  T_RUN(test_lookup);
  T_RUN(test_bpe);
  T_RUN(test_added_tokens);
  T_RUN(test_invalid_utf8);
  T_RUN(test_decode_stream);
  T_RUN(test_roundtrip_random);
  T_RUN(test_long_runs);
  T_RUN(test_post_processor);
  T_RUN(test_load_errors);
  T_RUN(test_split_behaviors);
  T_RUN(test_fixed_splitters);
  T_RUN(test_normalizers);
  T_RUN(test_char_bpe);
  T_RUN(test_affixes);
  T_RUN(test_chat);
  tok_destroy(tk);
  free(fixture_text);
  return t_status();
}
