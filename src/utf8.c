/* utf8.c: UTF-8 decoding with WHATWG replacement, and Unicode NFC.
 *
 * NFC is done segment by segment.  A character whose property word is zero
 * (combining class 0, NFC_Quick_Check Yes) can neither compose with what
 * precedes it nor be reordered across, so the text is cut before every such
 * character; a segment without any other character is copied through, and
 * only the rare segments that hold one are decoded, fully decomposed,
 * canonically reordered and recomposed (UAX #15).  This keeps normalisation
 * of ordinary text close to a memcpy.
 */
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

#include "nfc_tables.inc"
#include "case_tables.inc"

/* Hangul syllable arithmetic (Unicode chapter 3.12). */
enum {
  S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
  L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT,
  S_COUNT = L_COUNT * N_COUNT
};

int32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
  unsigned c = s[0];
  if (c < 0x80) {
    *len = 1;
    return (int32_t)c;
  }
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F; /* no surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return UTF8_INVALID;
  }
  /* The byte after the lead has the narrowed range; later ones 80..BF. */
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n) {
      *len = n;
      return UTF8_INCOMPLETE;
    }
    unsigned b = s[i];
    if (b < lo || b > hi) {
      *len = (size_t)i;
      return UTF8_INVALID;
    }
    lo = 0x80;
    hi = 0xBF;
    cp = cp << 6 | (b & 0x3F);
  }
  *len = (size_t)need + 1;
  return (int32_t)cp;
}

int utf8_encode(uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | cp >> 18);
  out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

size_t utf8_valid_len(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    /* Eight ASCII bytes at a time: most text is mostly ASCII. */
    while (i + 8 <= n) {
      uint64_t w;
      memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    size_t len;
    if (utf8_next(p + i, n - i, &len) < 0) return i;
    i += len;
  }
  return n;
}

void utf8_repair(const char *s, size_t n, mj_buf *out) {
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    size_t ok = utf8_valid_len(s + i, n - i);
    mj_buf_put(out, s + i, ok);
    i += ok;
    if (i >= n) break;
    size_t len;
    utf8_next(p + i, n - i, &len); /* invalid or unfinished: one U+FFFD */
    mj_buf_put(out, "\xEF\xBF\xBD", 3);
    i += len;
  }
}

/* ---- NFC ------------------------------------------------------------------ */
static inline unsigned prop(uint32_t cp) {
  return nfc_blocks[nfc_index[cp / NFC_BLOCK]][cp % NFC_BLOCK];
}
static inline unsigned ccc(uint32_t cp) { return prop(cp) & 0xFF; }

/* Decoding valid UTF-8 (callers guarantee it). */
static inline uint32_t next_cp(const unsigned char *s, size_t n, size_t *len) {
  int32_t c = utf8_next(s, n, len);
  MJ_ASSERT(c >= 0);
  return (uint32_t)c;
}

bool utf8_is_nfc(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  unsigned last = 0;
  size_t i = 0;
  while (i < n) {
    /* Lead bytes below 0xCC start characters below U+0300, which all have
     * property zero. */
    if (p[i] < 0xCC) {
      last = 0;
      i += p[i] < 0x80 ? 1 : 2;
      continue;
    }
    size_t len;
    unsigned pr = prop(next_cp(p + i, n - i, &len));
    unsigned cc = pr & 0xFF;
    if (pr & 0x100) return false;
    if (cc && last > cc) return false;
    last = cc;
    i += len;
  }
  return true;
}

/* Binary search of a table of n rows of stride bytes, sorted by a uint32_t
 * code point that starts each row (nfc_decomp, nfkd_decomp, case_lower):
 * the row of cp, or -1. */
static long find_cp(const void *table, size_t n, size_t stride, uint32_t cp) {
  const char *base = table;
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (*(const uint32_t *)(base + mid * stride) < cp) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && *(const uint32_t *)(base + lo * stride) == cp ? (long)lo : -1;
}
#define FIND_CP(table, cp) find_cp(table, MJ_ARRAY_LEN(table), sizeof table[0], cp)

static const uint32_t *decomposition(uint32_t cp, int *len) {
  long i = FIND_CP(nfc_decomp, cp);
  if (i < 0) return NULL;
  *len = nfc_decomp[i].len;
  return nfc_decomp_seq + nfc_decomp[i].off;
}

/* The full compatibility decomposition, where it differs from the
 * canonical one. */
static const uint32_t *kdecomposition(uint32_t cp, int *len) {
  long i = FIND_CP(nfkd_decomp, cp);
  if (i < 0) return decomposition(cp, len);
  *len = nfkd_decomp[i].len;
  return nfkd_decomp_seq + nfkd_decomp[i].off;
}

static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
    return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
  if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
      b < T_BASE + T_COUNT)
    return a + (b - T_BASE);
  uint64_t key = (uint64_t)a << 21 | b;
  size_t lo = 0, hi = MJ_ARRAY_LEN(nfc_compose);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (nfc_compose[mid].key < key) lo = mid + 1;
    else hi = mid;
  }
  return lo < MJ_ARRAY_LEN(nfc_compose) && nfc_compose[lo].key == key ? nfc_compose[lo].cp : 0;
}

typedef struct {
  uint32_t *v;
  size_t n, cap;
} cpvec;

static void cp_push(cpvec *c, uint32_t cp) {
  if (c->n == c->cap) {
    c->cap = c->cap ? c->cap * 2 : 64;
    c->v = mj_xrealloc(c->v, c->cap * sizeof *c->v);
  }
  c->v[c->n++] = cp;
}

/* Canonical (or, with compat, compatibility) decomposition of s[0..n)
 * into c, in canonical order (NFD, NFKD). */
static void decompose(const unsigned char *s, size_t n, bool compat, cpvec *c) {
  c->n = 0;
  for (size_t i = 0; i < n;) {
    size_t len;
    uint32_t cp = next_cp(s + i, n - i, &len);
    i += len;
    int dl;
    const uint32_t *d;
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
      uint32_t k = cp - S_BASE;
      cp_push(c, L_BASE + k / N_COUNT);
      cp_push(c, V_BASE + k % N_COUNT / T_COUNT);
      if (k % T_COUNT) cp_push(c, T_BASE + k % T_COUNT);
    } else if ((d = compat ? kdecomposition(cp, &dl) : decomposition(cp, &dl)) != NULL) {
      for (int k = 0; k < dl; k++) cp_push(c, d[k]);
    } else {
      cp_push(c, cp);
    }
  }
  /* Canonical ordering: a stable insertion sort of each run of non-starters
   * by combining class (runs are short). */
  for (size_t i = 1; i < c->n; i++) {
    uint32_t x = c->v[i];
    unsigned cx = ccc(x);
    if (!cx) continue;
    size_t j = i;
    while (j > 0 && ccc(c->v[j - 1]) > cx) {
      c->v[j] = c->v[j - 1];
      j--;
    }
    c->v[j] = x;
  }
}

static void put_cps(const cpvec *c, size_t m, mj_buf *out) {
  for (size_t i = 0; i < m; i++) {
    char b[4];
    mj_buf_put(out, b, (size_t)utf8_encode(c->v[i], b));
  }
}

void utf8_nfd(const char *s, size_t n, mj_buf *out) {
  cpvec c = {0};
  decompose((const unsigned char *)s, n, false, &c);
  put_cps(&c, c.n, out);
  free(c.v);
}

void utf8_nfkd(const char *s, size_t n, mj_buf *out) {
  cpvec c = {0};
  decompose((const unsigned char *)s, n, true, &c);
  put_cps(&c, c.n, out);
  free(c.v);
}

static size_t compose_all(cpvec *c);

void utf8_nfkc(const char *s, size_t n, mj_buf *out) {
  cpvec c = {0};
  decompose((const unsigned char *)s, n, true, &c);
  put_cps(&c, compose_all(&c), out);
  free(c.v);
}

/* Decompose, reorder and recompose one segment, appending it to out. */
static void nfc_segment(const unsigned char *s, size_t n, cpvec *c, mj_buf *out) {
  decompose(s, n, false, c);
  put_cps(c, compose_all(c), out);
}

/* Canonical composition of c in place; returns the new length. */
static size_t compose_all(cpvec *c) {
  /* Canonical composition: C joins the last starter S unless some character
   * between them has class 0 or a class >= C's. */
  size_t m = 0;
  long starter = -1;
  unsigned last_cc = 0;
  for (size_t i = 0; i < c->n; i++) {
    uint32_t x = c->v[i];
    unsigned cx = ccc(x);
    if (starter >= 0) {
      bool adjacent = (size_t)starter == m - 1;
      if (adjacent || (last_cc != 0 && last_cc < cx)) {
        uint32_t p = compose(c->v[starter], x);
        if (p) {
          c->v[starter] = p;
          continue;
        }
      }
    }
    if (cx == 0) starter = (long)m;
    c->v[m++] = x;
    last_cc = cx;
  }
  return m;
}

void utf8_nfc(const char *s, size_t n, mj_buf *out) {
  const unsigned char *p = (const unsigned char *)s;
  cpvec c = {0};
  size_t seg = 0; /* start of the current segment */
  bool dirty = false;
  size_t i = 0;
  while (i < n) {
    size_t len;
    unsigned pr;
    if (p[i] < 0xCC) {
      pr = 0;
      len = p[i] < 0x80 ? 1 : 2;
    } else {
      pr = prop(next_cp(p + i, n - i, &len));
    }
    if (pr == 0) { /* a safe boundary: close the segment before it */
      if (dirty) {
        nfc_segment(p + seg, i - seg, &c, out);
        seg = i;
        dirty = false;
      }
      /* Clean text is copied in one piece when the segment closes. */
      if (!dirty && seg < i && i - seg > 4096) {
        mj_buf_put(out, s + seg, i - seg);
        seg = i;
      }
    } else {
      if (!dirty) {
        /* The segment starts at the last safe character before i; flush
         * the clean text before that. */
        size_t back = i;
        while (back > seg) {
          size_t b = back - 1;
          while (b > seg && (p[b] & 0xC0) == 0x80) b--;
          size_t l;
          uint32_t cp = next_cp(p + b, n - b, &l);
          back = b;
          if (cp < 0x300 || prop(cp) == 0) break;
        }
        mj_buf_put(out, s + seg, back - seg);
        seg = back;
        dirty = true;
      }
    }
    i += len;
  }
  if (dirty) nfc_segment(p + seg, n - seg, &c, out);
  else mj_buf_put(out, s + seg, n - seg);
  free(c.v);
}

/* ---- lowercase ------------------------------------------------------------------------ */
void utf8_lower(const char *s, size_t n, mj_buf *out) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) { /* ASCII: no table */
      mj_buf_putc(out, (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]));
      i++;
      continue;
    }
    size_t len;
    uint32_t cp = next_cp(p + i, n - i, &len);
    long at = FIND_CP(case_lower, cp);
    if (at >= 0) {
      char b[4];
      for (int k = 0; k < 2 && case_lower[at].lo[k]; k++) mj_buf_put(out, b, (size_t)utf8_encode(case_lower[at].lo[k], b));
    } else {
      mj_buf_put(out, s + i, len);
    }
    i += len;
  }
}
