/* test_utf8.c: UTF-8 repair (WHATWG rules) and the normalization forms.
 *
 * With an argument, also runs the NFC, NFD, NFKC and NFKD columns of the Unicode conformance
 * file NormalizationTest.txt (tests/nfc_conformance.sh passes it where
 * Debian's unicode-data is installed). */
#include <stdlib.h>
#include <string.h>

#include "t.h"
#include "utf8.h"

static char *repaired(const char *s, size_t n) {
  mj_buf b = {0};
  utf8_repair(s, n, &b);
  mj_buf_putc(&b, 0);
  return mj_buf_steal(&b);
}

static char *nfc(const char *s) {
  mj_buf b = {0};
  utf8_nfc(s, strlen(s), &b);
  mj_buf_putc(&b, 0);
  return mj_buf_steal(&b);
}

#define R "\xEF\xBF\xBD"

static void test_repair(void) {
  static const struct { const char *in; size_t n; const char *want; size_t want_n; } cases[] = {
      {"abc", 3, "abc", 3},
      {"a\x80z", 3, "a" R "z", 5},
      {"\xC3\xA9", 2, "\xC3\xA9", 2},
      {"\xC3", 1, R, 3},                         /* unfinished at the end */
      {"\xE2\x82", 2, R, 3},                     /* one U+FFFD for the maximal subpart */
      {"\xE2\x82x", 3, R "x", 4},
      {"\xED\xA0\x80", 3, R R R, 9},             /* a surrogate: ED then two strays */
      {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80", 4},
      {"\xF0\x9F\x98", 3, R, 3},
      {"\xF4\x90\x80\x80", 4, R R R R, 12},      /* above U+10FFFF */
      {"\xC0\xAF", 2, R R, 6},                   /* overlong */
      {"\xE0\x80\x80", 3, R R R, 9},
      {"\xFF\xFE", 2, R R, 6},
      {"a\0b", 3, "a\0b", 3},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    char *got = repaired(cases[i].in, cases[i].n);
    T_CHECK(memcmp(got, cases[i].want, cases[i].want_n) == 0 && got[cases[i].want_n] == 0);
    free(got);
    bool valid = cases[i].n == cases[i].want_n && memcmp(cases[i].in, cases[i].want, cases[i].n) == 0;
    T_EQ_INT(utf8_valid_len(cases[i].in, cases[i].n) == cases[i].n, valid);
  }
}

static void test_next_incomplete(void) {
  size_t len;
  T_EQ_INT(utf8_next((const unsigned char *)"\xE4\xB8", 2, &len), UTF8_INCOMPLETE);
  T_EQ_INT(utf8_next((const unsigned char *)"\xE4\xB8\xAD", 3, &len), 0x4E2D);
  T_EQ_INT(len, 3);
  T_EQ_INT(utf8_next((const unsigned char *)"\xE4\x41", 2, &len), UTF8_INVALID);
  T_EQ_INT(len, 1);
}

static void test_nfc(void) {
  static const struct { const char *in, *want; } cases[] = {
      {"plain ascii", "plain ascii"},
      {"e\xCC\x81", "\xC3\xA9"},                           /* e + acute -> é */
      {"\xC3\xA9", "\xC3\xA9"},
      {"a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD"},               /* a + dot below + circumflex */
      {"a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD"},               /* reordered first */
      {"\xE1\x84\x80\xE1\x85\xA1", "\xEA\xB0\x80"},         /* L V -> 가 */
      {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* L V T -> 각 */
      {"\xEA\xB0\x80\xE1\x86\xA8", "\xEA\xB0\x81"},         /* LV T -> 각 */
      {"\xE2\x84\xAB", "\xC3\x85"},                        /* Angstrom sign -> Å */
      {"\xE2\x84\xA6", "\xCE\xA9"},                        /* Ohm sign -> Omega */
      {"\xCD\x84", "\xCC\x88\xCC\x81"},                    /* U+0344 stays decomposed */
      {"x\xCC\x81y", "x\xCC\x81y"},                        /* no composite */
      {"\xE0\xA4\xA8\xE0\xA4\xBC", "\xE0\xA4\xA9"},         /* excluded? U+0929 is not */
      {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"},         /* U+0958 excluded */
      {"Caf\xC3\xA9 e\xCC\x81t\xC3\xA9", "Caf\xC3\xA9 \xC3\xA9t\xC3\xA9"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    char *got = nfc(cases[i].in);
    T_EQ_STR(got, cases[i].want);
    T_EQ_INT(utf8_is_nfc(cases[i].in, strlen(cases[i].in)) && strcmp(cases[i].in, cases[i].want) != 0, 0);
    free(got);
  }
}

/* NormalizationTest.txt: c1;c2;c3;c4;c5; with NFC(c1..c3) = c2 and
 * NFC(c4, c5) = c4. */
static int parse_field(const char *s, mj_buf *out) {
  out->len = 0;
  while (*s && *s != ';') {
    char *end;
    unsigned long cp = strtoul(s, &end, 16);
    if (end == s) return -1;
    char b[4];
    mj_buf_put(out, b, (size_t)utf8_encode((uint32_t)cp, b));
    s = end;
    while (*s == ' ') s++;
  }
  mj_buf_putc(out, 0);
  out->len--;
  return 0;
}

static const char *conformance_file;

static void test_conformance(void) {
  FILE *f = fopen(conformance_file, "r");
  T_CHECK(f != NULL);
  if (!f) return;
  char line[4096];
  mj_buf col[5] = {{0}}, got = {0};
  long lines = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
    const char *p = line;
    for (int k = 0; k < 5; k++) {
      parse_field(p, &col[k]);
      p = strchr(p, ';') + 1;
    }
    lines++;
    /* The file's invariants (c1..c5 = columns 0..4): NFC(c1..c3) = c2,
     * NFC(c4, c5) = c4; NFD(c1..c3) = c3, NFD(c4, c5) = c5; NFKC(any) = c4;
     * NFKD(any) = c5. */
    static const int nfd_want[5] = {2, 2, 2, 4, 4};
    static const struct {
      const char *name;
      void (*fn)(const char *, size_t, mj_buf *);
    } forms[] = {{"NFD", utf8_nfd}, {"NFKC", utf8_nfkc}, {"NFKD", utf8_nfkd}};
    for (int k = 0; k < 5; k++)
      for (int f = 0; f < 3; f++) {
        int w = f == 0 ? nfd_want[k] : f == 1 ? 3 : 4;
        got.len = 0;
        forms[f].fn(col[k].data, col[k].len, &got);
        if ((got.len != col[w].len || memcmp(got.data, col[w].data, got.len) != 0) && bad++ < 5)
          fprintf(stderr, "%s mismatch (column %d) on line: %s", forms[f].name, k + 1, line);
      }
    static const int src[5] = {0, 1, 2, 3, 4}, want[5] = {1, 1, 1, 3, 3};
    for (int k = 0; k < 5; k++) {
      got.len = 0;
      utf8_nfc(col[src[k]].data, col[src[k]].len, &got);
      if (got.len != col[want[k]].len || memcmp(got.data, col[want[k]].data, got.len) != 0) {
        if (bad++ < 5) fprintf(stderr, "NFC mismatch on line: %s", line);
      }
      /* The quick check may say "maybe" but never a wrong "yes". */
      if (utf8_is_nfc(col[src[k]].data, col[src[k]].len) &&
          strcmp(col[src[k]].data, col[want[k]].data) != 0 && bad++ < 5)
        fprintf(stderr, "quick check wrong on line: %s", line);
    }
  }
  fclose(f);
  printf("conformance (NFC, NFD, NFKC, NFKD): %ld lines, %ld mismatches\n", lines, bad);
  T_CHECK(lines > 10000);
  T_EQ_INT(bad, 0);
  for (int k = 0; k < 5; k++) mj_buf_free(&col[k]);
  mj_buf_free(&got);
}

int main(int argc, char **argv) {
  T_RUN(test_repair);
  T_RUN(test_next_incomplete);
  T_RUN(test_nfc);
  if (argc > 1) {
    conformance_file = argv[1];
    T_RUN(test_conformance);
  }
  return t_status();
}
