/* utf8.h: UTF-8 decoding with the WHATWG replacement rules, and Unicode NFC.
 *
 * The tokenizer must accept any bytes and behave as the reference
 * implementations do.  Those work on Unicode strings: text that is not valid
 * UTF-8 reaches them through a decoder that turns each maximal invalid
 * subpart into one U+FFFD (the WHATWG "utf-8 decode" algorithm, which
 * Node's TextDecoder, Rust's String::from_utf8_lossy and Python's
 * errors="replace" all follow), so utf8_repair does exactly that.  NFC is
 * the tokenizer's usual normalizer; it is implemented here from tables that
 * scripts/gen-nfc.py generates from the Unicode Character Database
 * (src/nfc_tables.inc), with Hangul handled algorithmically.  Prefix: utf8_.
 */
#ifndef MOEJIT_UTF8_H
#define MOEJIT_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define UTF8_REPLACEMENT 0xFFFDu

/* Results of utf8_next besides a code point (>= 0). */
enum {
  UTF8_INVALID = -1,   /* *len bytes form one maximal invalid subpart */
  UTF8_INCOMPLETE = -2 /* the n bytes are a valid but unfinished prefix */
};

/* Decode the character at s[0..n), n >= 1.  Returns the code point and sets
 * *len, or UTF8_INVALID with *len the bytes that one U+FFFD replaces, or
 * UTF8_INCOMPLETE when every byte left is a proper prefix of some valid
 * character (a stream should wait for more; at the end of input it is one
 * U+FFFD). */
int32_t utf8_next(const unsigned char *s, size_t n, size_t *len);

/* Encode cp (<= 0x10FFFF, not a surrogate) into out; returns its length. */
int utf8_encode(uint32_t cp, char out[4]);

/* Length of the longest prefix of s that is valid UTF-8. */
size_t utf8_valid_len(const char *s, size_t n);

/* Append s to out with each maximal invalid subpart (and an unfinished
 * character at the end) replaced by U+FFFD. */
void utf8_repair(const char *s, size_t n, mj_buf *out);

/* True when the valid UTF-8 text s is certainly in NFC (the quick check of
 * UAX #15: no character with NFC_Quick_Check No/Maybe, combining classes in
 * order).  Cheap: ASCII and most text pass at memory speed. */
bool utf8_is_nfc(const char *s, size_t n);

/* Append the NFC form of the valid UTF-8 text s to out. */
void utf8_nfc(const char *s, size_t n, mj_buf *out);
/* Append the NFD form of valid UTF-8 s (canonical decomposition, canonical
 * order, no composition). */
void utf8_nfd(const char *s, size_t n, mj_buf *out);
/* Append the NFKD form (compatibility decomposition, canonical order) and
 * the NFKC form (NFKD, then canonical composition) of valid UTF-8 s. */
void utf8_nfkd(const char *s, size_t n, mj_buf *out);
void utf8_nfkc(const char *s, size_t n, mj_buf *out);
/* Append valid UTF-8 s lowercased character by character with the full
 * (unconditional) Unicode mappings: Rust's char::to_lowercase, which Hugging
 * Face's Lowercase normalizer applies (so no final-sigma rule: Σ is σ). */
void utf8_lower(const char *s, size_t n, mj_buf *out);

#endif
