/* tokenizer.c: BPE from a Hugging Face tokenizer.json, over bytes
 * (ByteLevel: GLM-5, Qwen, DeepSeek, GPT-2) or over characters
 * (SentencePiece exports: Llama 2, Mistral; byte_fallback, Metaspace).
 *
 * Encoding follows the reference pipeline (huggingface/tokenizers,
 * Tokenizer::encode):
 *   1. invalid UTF-8 becomes U+FFFD (the reference only sees strings);
 *   2. added tokens whose "normalized" is false are found in the raw text,
 *      leftmost-longest, honouring single_word, lstrip and rstrip;
 *   3. the text between them is normalized (the normalizer's steps in
 *      order: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend),
 *      then split on the added tokens whose "normalized" is true;
 *   4. each remaining piece goes through the pre-tokenizer steps (Splits
 *      with any behaviour, the fixed splitters as Splits, then ByteLevel),
 *      each step splitting the pieces of the one before independently;
 *   5. each final piece (a "word") is merged by BPE, through a word cache;
 *   6. the post-processor adds its special tokens.
 * With ByteLevel, BPE works on bytes: ByteLevel maps every byte to one
 * character, one to one, so a word's characters are its bytes, and every
 * vocabulary entry is translated to the bytes it stands for at load time.
 * Without it, a word starts as one symbol per character (or its
 * <0xXX> byte tokens, or the unk_token), and each entry's decoded text is
 * what the decoder's token-level steps make of it (load_decoder).  A merge is then a
 * pair of token ids with a rank and a result id, kept in an open-addressing
 * table; a word starts as one token per byte and the lowest-ranked
 * adjacent pair (leftmost on ties) is merged until none is left, using a
 * binary heap so long words (whitespace runs) stay O(n log n).
 */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "json.h"
#include "utf8.h"

/* ---- small hash tables -------------------------------------------------------- */
/* Strings (not owned) to ids. */
typedef struct {
  uint64_t h;
  const char *s;
  uint32_t len;
  int32_t id;
} smap_slot;
typedef struct {
  smap_slot *slots;
  size_t mask, n;
} smap;

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

static void smap_grow(smap *m);
static void smap_put(smap *m, const char *s, size_t len, int32_t id) {
  if ((m->n + 1) * 2 > m->mask + 1 || !m->slots) smap_grow(m);
  uint64_t h = hash_bytes(s, len);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    smap_slot *e = &m->slots[i];
    if (!e->s) {
      *e = (smap_slot){h, s, (uint32_t)len, id};
      m->n++;
      return;
    }
    if (e->h == h && e->len == len && memcmp(e->s, s, len) == 0) {
      e->id = id; /* a later entry replaces an earlier one */
      return;
    }
  }
}
static void smap_grow(smap *m) {
  size_t cap = m->slots ? (m->mask + 1) * 2 : 1024;
  smap old = *m;
  m->slots = mj_xcalloc(cap, sizeof *m->slots);
  m->mask = cap - 1;
  m->n = 0;
  if (old.slots) {
    for (size_t i = 0; i <= old.mask; i++)
      if (old.slots[i].s) smap_put(m, old.slots[i].s, old.slots[i].len, old.slots[i].id);
    free(old.slots);
  }
}
static int32_t smap_get(const smap *m, const char *s, size_t len) {
  if (!m->slots) return -1;
  uint64_t h = hash_bytes(s, len);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const smap_slot *e = &m->slots[i];
    if (!e->s) return -1;
    if (e->h == h && e->len == len && memcmp(e->s, s, len) == 0) return e->id;
  }
}

/* 64-bit keys to two int32 values: merges ((left, right) -> rank, result)
 * and the added-token tries ((node, byte) -> child). */
typedef struct {
  uint64_t key; /* UINT64_MAX: empty */
  int32_t a, b;
} pmap_slot;
typedef struct {
  pmap_slot *slots;
  size_t mask, n;
} pmap;

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}
static void pmap_put(pmap *m, uint64_t key, int32_t a, int32_t b) {
  if ((m->n + 1) * 2 > m->mask + 1 || !m->slots) {
    size_t cap = m->slots ? (m->mask + 1) * 2 : 1024;
    pmap old = *m;
    m->slots = mj_xmalloc(cap * sizeof *m->slots);
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
    if (old.slots) {
      for (size_t i = 0; i <= old.mask; i++)
        if (old.slots[i].key != UINT64_MAX) pmap_put(m, old.slots[i].key, old.slots[i].a, old.slots[i].b);
      free(old.slots);
    }
  }
  for (size_t i = mix64(key) & m->mask;; i = (i + 1) & m->mask) {
    pmap_slot *e = &m->slots[i];
    if (e->key == UINT64_MAX) {
      *e = (pmap_slot){key, a, b};
      m->n++;
      return;
    }
    if (e->key == key) {
      e->a = a;
      e->b = b;
      return;
    }
  }
}
static inline const pmap_slot *pmap_get(const pmap *m, uint64_t key) {
  if (!m->slots) return NULL;
  for (size_t i = mix64(key) & m->mask;; i = (i + 1) & m->mask) {
    const pmap_slot *e = &m->slots[i];
    if (e->key == key) return e;
    if (e->key == UINT64_MAX) return NULL;
  }
}

/* ---- the tokenizer -------------------------------------------------------------- */
typedef struct {
  const char *piece, *bytes; /* as written in the file; what it decodes to */
  uint32_t piece_len, bytes_len;
  bool used, added, special;
} tok_entry;

typedef struct {
  const char *content;
  size_t len;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
} added_token;

/* A trie over added-token contents, stored in a pmap: (node << 8 | byte) ->
 * child; term[node] is the added token ending there or -1. */
typedef struct {
  pmap edges;
  int32_t *term; /* index into added[] */
  int32_t nnodes, cap;
  bool first[256]; /* bytes that start some token: a fast skip */
  bool empty;
} trie;

enum { STEP_SPLIT, STEP_BYTELEVEL, STEP_METASPACE };
/* Split's behaviors: what becomes of the matches (the delimiters). */
#define SPLIT_BEHAVIORS(X) X(Removed) X(Isolated) X(MergedWithPrevious) X(MergedWithNext) X(Contiguous)
#define X(name) SPLIT_##name,
enum { SPLIT_BEHAVIORS(X) };
#undef X
typedef struct {
  int kind;
  pcre2_code *re; /* NULL: ByteLevel without regex */
  bool add_prefix_space;
  int behavior; /* Split: SPLIT_* */
  bool invert;  /* Split: the pattern's matches and the text between trade places */
  pcre2_match_data *md;
  const char *rep;      /* Metaspace: the replacement character (UTF-8) */
  size_t rep_len;
  int prepend;          /* Metaspace: 0 never, 1 always, 2 first (only at the input's start) */
  bool split;           /* Metaspace: split before each replacement */
} pre_step;

#define MAX_STEPS 8

/* Normalizer steps, applied in order (a Sequence flattened). */
enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_STRIP, NORM_REPLACE, NORM_PREPEND };
typedef struct {
  int kind;
  bool left, right;   /* Strip */
  pcre2_code *re;     /* Replace: the pattern */
  pcre2_match_data *md;
  const char *text;   /* Replace: the content; Prepend: the prefix (in the arena) */
  size_t text_len;
} norm_op;
#define MAX_NORMS 16

/* Decoder steps, in order (a Sequence flattened).  Those before a Fuse act
 * on each token's text; a Strip after it on the whole text. */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct {
  int kind;
  const char *from, *to; /* Replace: a String pattern and its content; Metaspace: the replacement */
  size_t from_len, to_len;
  char content[8];       /* Strip: the character (UTF-8) */
  size_t content_len;
  int start, stop;       /* Strip */
  bool prefix;           /* Metaspace: prepend_scheme is not "never" (the first token loses its replacements) */
} dec_op;
#define MAX_DECS 8

/* The word cache: word bytes -> ids, cleared when full. */
typedef struct {
  uint64_t h;
  uint32_t off, len;   /* word bytes in bytes pool */
  uint32_t ioff, nids; /* ids in ids pool; len == 0: empty slot */
} cache_slot;
#define CACHE_SLOTS (1u << 17)
#define CACHE_MAX_WORD 256

typedef struct {
  int32_t rank, pos, r, lid, rid;
} heap_item;

struct tok_tokenizer {
  char *name;
  mj_arena arena;
  tok_entry *ent;
  int32_t nent;
  smap vocab_bytes; /* model vocabulary by decoded bytes (BPE symbols) */
  smap pieces;      /* everything by its written form */
  int32_t byte_id[256];
  pmap merges;
  bool ignore_merges;
  bool byte_level;          /* a ByteLevel pre-tokenizer: BPE over bytes (else over characters) */
  bool byte_fallback, fuse_unk;
  const char *cont_prefix, *word_suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
  size_t cont_len, suffix_len;
  int32_t unk_id;           /* the model's unk_token, -1 if none */
  int32_t fallback_id[256]; /* byte_fallback: the <0xXX> tokens, -1 where missing */
  dec_op dec[MAX_DECS];     /* the decoder, flattened */
  int ndec, fuse_at;        /* fuse_at: index of Fuse, ndec if none (ops after it see the whole text) */
  bool first_differs;       /* a Metaspace decoder with a prepend scheme: the first token decodes apart */

  added_token *added;
  int nadded;
  trie raw_trie, norm_trie;
  pcre2_code *word_re; /* single_word: is a character a word character */
  pcre2_match_data *word_md;

  norm_op norms[MAX_NORMS]; /* the normalizer, in order */
  int nnorms;
  pre_step steps[MAX_STEPS];
  int nsteps;
  tok_ids prefix, suffix; /* TemplateProcessing around $A */

  pcre2_match_context *mctx;
  pcre2_jit_stack *jit_stack;

  /* encode scratch */
  mj_buf repair, norm, norm2, prefixed[MAX_STEPS], affixed;
  int32_t *sym_id, *sym_prev, *sym_next;
  size_t sym_cap;
  heap_item *heap;
  size_t heap_cap;
  tok_ids word_ids;
  cache_slot *cache;
  mj_buf cache_bytes;
  tok_ids cache_ids;
  size_t cache_n;
  mj_err *err; /* the current encode call's error record */
  void (*piece_fn)(void *ctx, const char *s, size_t n); /* tok_pre_pieces: words go here, not to BPE */
  void *piece_ctx;
  const char *first_ptr; /* where the input's first character is in the text being pre-tokenized (Metaspace "first") */
  int failed;
};

void tok_ids_push(tok_ids *ids, int32_t id) {
  if (ids->n == ids->cap) {
    ids->cap = ids->cap ? ids->cap * 2 : 64;
    ids->v = mj_xrealloc(ids->v, ids->cap * sizeof *ids->v);
  }
  ids->v[ids->n++] = id;
}
void tok_ids_free(tok_ids *ids) {
  free(ids->v);
  *ids = (tok_ids){0};
}

/* ---- byte-level alphabet ---------------------------------------------------------- */
/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
static uint32_t byte_char[256];
static int16_t char_byte[0x144]; /* inverse, -1 where unused */

static void init_byte_level(void) {
  static bool done;
  if (done) return;
  int n = 0;
  for (int c = 0; c < (int)MJ_ARRAY_LEN(char_byte); c++) char_byte[c] = -1;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    byte_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    char_byte[byte_char[b]] = (int16_t)b;
  }
  done = true;
}

/* Decode a byte-level piece into bytes; false when some character is not
 * in the alphabet (such an entry can never come out of BPE). */
static bool piece_to_bytes(const char *s, size_t n, mj_buf *out) {
  out->len = 0;
  for (size_t i = 0; i < n;) {
    size_t len;
    int32_t c = utf8_next((const unsigned char *)s + i, n - i, &len);
    if (c < 0 || c >= (int32_t)MJ_ARRAY_LEN(char_byte) || char_byte[c] < 0) return false;
    mj_buf_putc(out, (char)char_byte[c]);
    i += len;
  }
  return true;
}

/* ---- regex ------------------------------------------------------------------------ */
/* Translate an Oniguruma pattern (what tokenizer.json files are written
 * for) to PCRE2 where the two differ on the patterns in use: \s and \S mean
 * the White_Space property (PCRE2's \s also takes U+180E), and (?i:...)
 * folds ASCII letters only, as the reference implementations do in
 * practice (PCRE2 would also let 's' match U+017F). */
static char *translate_pattern(const char *pat, size_t n) {
  mj_buf b = {0};
  bool fold_stack[64] = {false};
  int depth = 0;
  bool in_class = false;
  for (size_t i = 0; i < n; i++) {
    char c = pat[i];
    bool fold = fold_stack[depth];
    if (c == '\\' && i + 1 < n) {
      char d = pat[i + 1];
      if (d == 's') {
        mj_buf_puts(&b, "\\p{White_Space}");
      } else if (d == 'S') {
        mj_buf_puts(&b, "\\P{White_Space}");
      } else if (i + 2 < n && pat[i + 2] == '{') { /* \p{..}, \x{..}: copied whole */
        const char *close = memchr(pat + i, '}', n - i);
        size_t len = close ? (size_t)(close - (pat + i)) + 1 : n - i;
        mj_buf_put(&b, pat + i, len);
        i += len - 1;
        continue;
      } else {
        mj_buf_put(&b, pat + i, 2);
      }
      i++;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (fold && letter && i + 2 < n && pat[i + 1] == '-' &&
          ((pat[i + 2] >= 'a' && pat[i + 2] <= 'z') || (pat[i + 2] >= 'A' && pat[i + 2] <= 'Z'))) {
        char lo = c, hi = pat[i + 2];
        mj_buf_printf(&b, "%c-%c%c-%c", lo, hi, lo ^ 0x20, hi ^ 0x20);
        i += 2;
        continue;
      }
      mj_buf_putc(&b, c);
      if (fold && letter) mj_buf_putc(&b, (char)(c ^ 0x20));
      continue;
    }
    if (c == '[') {
      in_class = true;
      mj_buf_putc(&b, c);
      if (i + 1 < n && pat[i + 1] == '^') mj_buf_putc(&b, pat[++i]);
      if (i + 1 < n && pat[i + 1] == ']') mj_buf_putc(&b, pat[++i]); /* literal ] first */
      continue;
    }
    if (c == '(') {
      if (depth < 63) depth++;
      fold_stack[depth] = fold;
      if (n - i >= 4 && memcmp(pat + i, "(?i:", 4) == 0) {
        fold_stack[depth] = true;
        mj_buf_puts(&b, "(?:");
        i += 3;
        continue;
      }
      mj_buf_putc(&b, c);
      continue;
    }
    if (c == ')' && depth > 0) depth--;
    if (fold && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      mj_buf_printf(&b, "[%c%c]", c, c ^ 0x20);
      continue;
    }
    mj_buf_putc(&b, c);
  }
  mj_buf_putc(&b, 0);
  return mj_buf_steal(&b);
}

static pcre2_code *compile_re(const char *pat, size_t n, bool literal, const char *name,
                              const json *where, mj_err *err) {
  char *src;
  if (literal) {
    mj_buf b = {0};
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)pat[i];
      if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
        mj_buf_putc(&b, '\\');
      if (c == 0) mj_buf_puts(&b, "x{0}");
      else mj_buf_putc(&b, (char)c);
    }
    mj_buf_putc(&b, 0);
    src = mj_buf_steal(&b);
  } else {
    src = translate_pattern(pat, n);
  }
  int ec;
  PCRE2_SIZE eo;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                 &ec, &eo, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    mj_fail(err, MJ_EINPUT, "%s:%d: pre_tokenizer regex '%s' does not compile at offset %zu: %s",
            name, where ? where->line : 0, src, (size_t)eo, (char *)msg);
    free(src);
    return NULL;
  }
  free(src);
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
  return re;
}

/* ---- loading ---------------------------------------------------------------------- */
static int bad(mj_err *err, const char *name, const json *v, const char *fmt, const char *what) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, what);
  return mj_fail(err, MJ_EINPUT, "%s:%d: %s", name, v ? v->line : 1, msg);
}

static const char *type_of(const json *v) {
  const json *t = json_get(v, "type");
  return t && t->type == JSON_STR ? t->str : NULL;
}

static bool is_null(const json *v) { return !v || v->type == JSON_NULL; }

static bool get_flag(const json *o, const char *key, bool dflt) {
  const json *v = json_get(o, key);
  return v && v->type == JSON_BOOL ? v->b : dflt;
}

/* The largest token id accepted.  The entry table is indexed by id, so an
 * absurd id in a file (the fuzzer's 1000000000) would ask for gigabytes;
 * real vocabularies stop near 262k (GLM-5: 154880). */
#define TOK_MAX_ID 2097151
#define TOK_STR2(x) #x
#define TOK_STR(x) TOK_STR2(x)

static void ensure_entries(tok_tokenizer *t, int32_t id) {
  if (id < t->nent) return;
  int32_t n = t->nent ? t->nent : 1024;
  while (n <= id) n *= 2;
  t->ent = mj_xrealloc(t->ent, (size_t)n * sizeof *t->ent);
  memset(t->ent + t->nent, 0, (size_t)(n - t->nent) * sizeof *t->ent);
  t->nent = n;
}

static void trie_init(trie *tr) {
  tr->cap = 256;
  tr->term = mj_xmalloc((size_t)tr->cap * sizeof *tr->term);
  tr->term[0] = -1;
  tr->nnodes = 1;
  tr->empty = true;
}
static void trie_add(trie *tr, const char *s, size_t n, int32_t idx) {
  int32_t node = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i];
    const pmap_slot *e = pmap_get(&tr->edges, key);
    if (e) {
      node = e->a;
      continue;
    }
    if (tr->nnodes == tr->cap) {
      tr->cap *= 2;
      tr->term = mj_xrealloc(tr->term, (size_t)tr->cap * sizeof *tr->term);
    }
    tr->term[tr->nnodes] = -1;
    pmap_put(&tr->edges, key, tr->nnodes, 0);
    node = tr->nnodes++;
  }
  tr->term[node] = idx; /* a later duplicate wins */
  tr->first[(unsigned char)s[0]] = true;
  tr->empty = false;
}
/* Longest added token starting at s[0], as an index into added[], or -1. */
static int32_t trie_match(const trie *tr, const char *s, size_t n, size_t *len) {
  int32_t node = 0, best = -1;
  for (size_t i = 0; i < n; i++) {
    const pmap_slot *e = pmap_get(&tr->edges, (uint64_t)node << 8 | (unsigned char)s[i]);
    if (!e) break;
    node = e->a;
    if (tr->term[node] >= 0) {
      best = tr->term[node];
      *len = i + 1;
    }
  }
  return best;
}

static int load_model(tok_tokenizer *t, const json *model, const char *name, mj_err *err) {
  if (!model || model->type != JSON_OBJ) return bad(err, name, model, "%s", "no \"model\" object");
  const char *type = type_of(model);
  const json *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
  if (type && strcmp(type, "BPE") != 0)
    return bad(err, name, model, "model type \"%s\" is not supported (only BPE)", type);
  if (!vocab || vocab->type != JSON_OBJ)
    return bad(err, name, model, "%s", "model.vocab is missing or not an object");
  if (!merges || merges->type != JSON_ARR)
    return bad(err, name, model, "%s", "model.merges is missing or not an array");
  t->byte_fallback = get_flag(model, "byte_fallback", false);
  t->fuse_unk = get_flag(model, "fuse_unk", false);
  if (t->byte_fallback && t->byte_level)
    return bad(err, name, model, "%s", "model.byte_fallback with a ByteLevel pre_tokenizer is not supported");
  const json *dropout = json_get(model, "dropout");
  if (!is_null(dropout) && !(dropout->type == JSON_NUM && dropout->num == 0))
    return bad(err, name, dropout, "%s", "model.dropout is not supported");
  static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    const json *v = json_get(model, affixes[k]);
    if (is_null(v) || (v->type == JSON_STR && v->len == 0)) continue;
    if (v->type != JSON_STR) return bad(err, name, v, "model.%s is not a string", affixes[k]);
    const char *a = mj_arena_strndup(&t->arena, v->str, v->len);
    if (k == 0) t->cont_prefix = a, t->cont_len = v->len;
    else t->word_suffix = a, t->suffix_len = v->len;
  }
  t->ignore_merges = get_flag(model, "ignore_merges", false);

  mj_buf tmp = {0};
  for (size_t i = 0; i < vocab->len; i++) {
    const json *v = vocab->items[i];
    if (v->type != JSON_NUM || !v->is_int || v->i < 0 || v->i > TOK_MAX_ID) {
      mj_buf_free(&tmp);
      return bad(err, name, v, "model.vocab entry \"%s\" has no valid id (an integer 0.." TOK_STR(TOK_MAX_ID) ")",
                 vocab->keys[i]);
    }
    int32_t id = (int32_t)v->i;
    ensure_entries(t, id);
    tok_entry *e = &t->ent[id];
    e->used = true;
    e->piece = mj_arena_strndup(&t->arena, vocab->keys[i], vocab->key_lens[i]);
    e->piece_len = (uint32_t)vocab->key_lens[i];
    if (!t->byte_level) {
      /* BPE over characters: a symbol is its own text (the decoder's
       * reading of it is set by load_decoder). */
      e->bytes = e->piece;
      e->bytes_len = e->piece_len;
      smap_put(&t->vocab_bytes, e->bytes, e->bytes_len, id);
    } else if (piece_to_bytes(e->piece, e->piece_len, &tmp)) {
      e->bytes = mj_arena_strndup(&t->arena, tmp.data ? tmp.data : "", tmp.len);
      e->bytes_len = (uint32_t)tmp.len;
      smap_put(&t->vocab_bytes, e->bytes, e->bytes_len, id);
    } else {
      /* Not byte-level text: decodes as its own UTF-8, as the reference
       * decoder does. */
      e->bytes = e->piece;
      e->bytes_len = e->piece_len;
    }
    smap_put(&t->pieces, e->piece, e->piece_len, id);
  }
  for (int b = 0; b < 256; b++) {
    char c = (char)b, fb[8];
    t->byte_id[b] = b < 0x80 || t->byte_level ? smap_get(&t->vocab_bytes, &c, 1) : -1;
    snprintf(fb, sizeof fb, "<0x%02X>", b); /* the reference's byte_fallback token */
    t->fallback_id[b] = smap_get(&t->pieces, fb, 6);
  }
  t->unk_id = -1;
  const json *unk = json_get(model, "unk_token");
  /* (An unk_token the vocabulary lacks is an error in the reference only
   * when a character needs it; here such a character is dropped.) */
  if (unk && unk->type == JSON_STR) t->unk_id = smap_get(&t->pieces, unk->str, unk->len);

  for (size_t r = 0; r < merges->len; r++) {
    const json *m = merges->items[r];
    const char *a, *b;
    size_t alen, blen;
    if (m->type == JSON_STR) {
      const char *sp = memchr(m->str, ' ', m->len);
      if (!sp) {
        mj_buf_free(&tmp);
        return bad(err, name, m, "merge \"%s\" is not two tokens separated by a space", m->str);
      }
      a = m->str;
      alen = (size_t)(sp - m->str);
      b = sp + 1;
      blen = m->len - alen - 1;
    } else if (m->type == JSON_ARR && m->len == 2 && m->items[0]->type == JSON_STR &&
               m->items[1]->type == JSON_STR) {
      a = m->items[0]->str;
      alen = m->items[0]->len;
      b = m->items[1]->str;
      blen = m->items[1]->len;
    } else {
      mj_buf_free(&tmp);
      return bad(err, name, m, "%s", "a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
    /* The reference refuses a file whose merge names a token, or makes
     * one, that the vocabulary lacks (MergeTokenOutOfVocabulary). */
    int32_t ia = smap_get(&t->pieces, a, alen), ib = smap_get(&t->pieces, b, blen);
    /* The token a merge makes is a followed by b without its
     * continuing_subword_prefix (the reference cuts that many bytes). */
    size_t cut = t->cont_prefix && blen >= t->cont_len ? t->cont_len : 0;
    tmp.len = 0;
    mj_buf_put(&tmp, a, alen);
    mj_buf_put(&tmp, b + cut, blen - cut);
    int32_t joined = ia < 0 || ib < 0 ? -1 : smap_get(&t->pieces, tmp.data, tmp.len);
    if (joined < 0) {
      int rc = mj_fail(err, MJ_EINPUT, "%s:%d: merge %zu (\"%.*s\" + \"%.*s\"): \"%.*s\" is not in the vocabulary",
                       name, m->line, r, (int)MJ_MIN(alen, 100), a, (int)MJ_MIN(blen, 100), b,
                       ia < 0 ? (int)MJ_MIN(alen, 200) : ib < 0 ? (int)MJ_MIN(blen, 200) : (int)MJ_MIN(tmp.len, 200),
                       ia < 0 ? a : ib < 0 ? b : tmp.data);
      mj_buf_free(&tmp);
      return rc;
    }
    tmp.len = 0;
    mj_buf_put(&tmp, t->ent[ia].bytes, t->ent[ia].bytes_len);
    size_t bcut = cut && t->ent[ib].bytes_len >= cut ? cut : 0; /* the prefix is its own bytes in either alphabet */
    mj_buf_put(&tmp, t->ent[ib].bytes + bcut, t->ent[ib].bytes_len - bcut);
    int32_t res = smap_get(&t->vocab_bytes, tmp.data, tmp.len);
    if (res < 0) continue;
    pmap_put(&t->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, (int32_t)r, res);
  }
  mj_buf_free(&tmp);
  return 0;
}

static int load_added(tok_tokenizer *t, const json *added, const char *name, mj_err *err) {
  trie_init(&t->raw_trie);
  trie_init(&t->norm_trie);
  if (is_null(added)) return 0;
  if (added->type != JSON_ARR) return bad(err, name, added, "%s", "added_tokens is not an array");
  t->added = mj_xcalloc(added->len ? added->len : 1, sizeof *t->added);
  bool any_single = false;
  for (size_t i = 0; i < added->len; i++) {
    const json *a = added->items[i], *id = json_get(a, "id"), *content = json_get(a, "content");
    if (!id || id->type != JSON_NUM || !id->is_int || id->i < 0 || id->i > TOK_MAX_ID || !content ||
        content->type != JSON_STR || content->len == 0)
      return bad(err, name, a, "%s", "an added token lacks a valid \"id\" (0.." TOK_STR(TOK_MAX_ID) ") or \"content\"");
    added_token *k = &t->added[t->nadded++];
    k->content = mj_arena_strndup(&t->arena, content->str, content->len);
    k->len = content->len;
    k->id = (int32_t)id->i;
    k->special = get_flag(a, "special", false);
    k->lstrip = get_flag(a, "lstrip", false);
    k->rstrip = get_flag(a, "rstrip", false);
    k->single_word = get_flag(a, "single_word", false);
    k->normalized = get_flag(a, "normalized", !k->special);
    any_single |= k->single_word;
    ensure_entries(t, k->id);
    tok_entry *e = &t->ent[k->id];
    *e = (tok_entry){k->content, k->content, (uint32_t)k->len, (uint32_t)k->len, true, true, k->special};
    smap_put(&t->pieces, k->content, k->len, k->id);
  }
  if (any_single) {
    int ec;
    PCRE2_SIZE eo;
    t->word_re = pcre2_compile((PCRE2_SPTR) "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                               PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec,
                               &eo, NULL);
    MJ_ASSERT(t->word_re);
    t->word_md = pcre2_match_data_create(1, NULL);
  }
  return 0;
}

/* ---- normalization ------------------------------------------------------------------------- */
static bool is_white(uint32_t c);

/* s[0..n) after every normalizer step, in t->norm or t->norm2 (or s itself
 * when nothing changes it); *out_n its length.  Valid UTF-8 in and out. */
static const char *normalize(tok_tokenizer *t, const char *s, size_t n, size_t *out_n) {
  mj_buf *dst = &t->norm;
  for (int i = 0; i < t->nnorms; i++) {
    const norm_op *o = &t->norms[i];
    mj_buf *b = dst;
    switch (o->kind) {
    case NORM_NFC:
      if (utf8_is_nfc(s, n)) continue; /* the common case: no copy */
      b->len = 0;
      utf8_nfc(s, n, b);
      break;
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD:
    case NORM_LOWER:
      b->len = 0;
      (o->kind == NORM_NFD    ? utf8_nfd
       : o->kind == NORM_NFKC ? utf8_nfkc
       : o->kind == NORM_NFKD ? utf8_nfkd
                              : utf8_lower)(s, n, b);
      break;
    case NORM_STRIP: {
      size_t a = 0, e = n, l;
      while (o->left && a < e && is_white((uint32_t)utf8_next((const unsigned char *)s + a, e - a, &l))) a += l;
      while (o->right && e > a) {
        size_t c = e - 1;
        while (c > a && ((unsigned char)s[c] & 0xC0) == 0x80) c--;
        if (!is_white((uint32_t)utf8_next((const unsigned char *)s + c, e - c, &l))) break;
        e = c;
      }
      s += a, n = e - a;
      continue;
    }
    case NORM_PREPEND:
      if (n == 0) continue; /* the reference prepends to non-empty text only */
      b->len = 0;
      mj_buf_put(b, o->text, o->text_len);
      mj_buf_put(b, s, n);
      break;
    case NORM_REPLACE: {
      b->len = 0;
      size_t pos = 0, prev = 0;
      while (pos <= n) {
        int rc = pcre2_match(o->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, o->md, t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { /* a match limit or another regex failure: say so, as pre_tokenize does */
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          t->failed = mj_fail(t->err, MJ_EINPUT, "%s: normalizer Replace regex failed on the input: %s", t->name,
                              (char *)msg);
          break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(o->md);
        if (ov[0] == ov[1]) { /* an empty match replaces nothing */
          size_t len = 1;
          if (ov[0] < n) utf8_next((const unsigned char *)s + ov[0], n - ov[0], &len);
          pos = ov[0] + len;
          continue;
        }
        mj_buf_put(b, s + prev, ov[0] - prev);
        mj_buf_put(b, o->text, o->text_len);
        prev = pos = ov[1];
      }
      mj_buf_put(b, s + prev, n - prev);
      break;
    }
    }
    s = b->data ? b->data : "", n = b->len;
    dst = b == &t->norm ? &t->norm2 : &t->norm; /* the next step writes the other buffer */
  }
  *out_n = n;
  return s;
}

/* The normalized trie needs the normalizer (an added token marked
 * "normalized" is matched in its normalized form). */
static void build_tries(tok_tokenizer *t) {
  mj_buf b = {0};
  for (int i = 0; i < t->nadded; i++) {
    added_token *k = &t->added[i];
    if (k->normalized && t->nnorms) {
      size_t n;
      const char *s = normalize(t, k->content, k->len, &n);
      b.len = 0;
      mj_buf_put(&b, s, n);
      trie_add(&t->norm_trie, b.data, b.len, i);
    } else if (k->normalized) {
      trie_add(&t->norm_trie, k->content, k->len, i);
    } else {
      trie_add(&t->raw_trie, k->content, k->len, i);
    }
  }
  mj_buf_free(&b);
}

/* A "Sequence" component: load each item of its array key in order. */
typedef int (*load_fn)(tok_tokenizer *t, const json *v, const char *name, mj_err *err);
static int load_sequence(tok_tokenizer *t, const json *seq, const char *key, const char *what,
                         load_fn fn, const char *name, mj_err *err) {
  const json *list = json_get(seq, key);
  if (!list || list->type != JSON_ARR)
    return mj_fail(err, MJ_EINPUT, "%s:%d: %s Sequence has no \"%s\" array", name, seq->line, what, key);
  for (size_t i = 0; i < list->len; i++) {
    int r = fn(t, list->items[i], name, err);
    if (r) return r;
  }
  return 0;
}

static int load_normalizer(tok_tokenizer *t, const json *n, const char *name, mj_err *err) {
  if (is_null(n)) return 0;
  const char *type = type_of(n);
  if (!type) return bad(err, name, n, "%s", "normalizer has no \"type\"");
  if (strcmp(type, "Sequence") == 0)
    return load_sequence(t, n, "normalizers", "normalizer", load_normalizer, name, err);
  if (t->nnorms == MAX_NORMS) return bad(err, name, n, "%s", "too many normalizer steps");
  norm_op *o = &t->norms[t->nnorms];
  memset(o, 0, sizeof *o);
  if (strcmp(type, "NFC") == 0) {
    o->kind = NORM_NFC;
  } else if (strcmp(type, "NFD") == 0) {
    o->kind = NORM_NFD;
  } else if (strcmp(type, "Lowercase") == 0) {
    o->kind = NORM_LOWER;
  } else if (strcmp(type, "NFKC") == 0) {
    o->kind = NORM_NFKC;
  } else if (strcmp(type, "NFKD") == 0) {
    o->kind = NORM_NFKD;
  } else if (strcmp(type, "Strip") == 0) {
    o->kind = NORM_STRIP;
    o->left = get_flag(n, "strip_left", true), o->right = get_flag(n, "strip_right", true);
  } else if (strcmp(type, "Prepend") == 0 || strcmp(type, "Replace") == 0) {
    bool rep = type[0] == 'R';
    const json *v = json_get(n, rep ? "content" : "prepend");
    if (!v || v->type != JSON_STR)
      return bad(err, name, n, "normalizer %s has no string to insert (\"content\" or \"prepend\")", type);
    o->kind = rep ? NORM_REPLACE : NORM_PREPEND;
    o->text = mj_arena_strndup(&t->arena, v->str, v->len), o->text_len = v->len;
    if (rep) {
      const json *pat = json_get(n, "pattern");
      const json *rx = pat ? json_get(pat, "Regex") : NULL, *str = pat ? json_get(pat, "String") : NULL;
      if (rx && rx->type == JSON_STR) o->re = compile_re(rx->str, rx->len, false, name, rx, err);
      else if (str && str->type == JSON_STR) o->re = compile_re(str->str, str->len, true, name, str, err);
      else return bad(err, name, n, "%s", "normalizer Replace has no Regex or String pattern");
      if (!o->re) return MJ_EINPUT;
      o->md = pcre2_match_data_create_from_pattern(o->re, NULL);
    }
  } else {
    return bad(err, name, n,
               "normalizer \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend, "
               "Sequence or null)",
               type);
  }
  t->nnorms++;
  return 0;
}

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A Split behavior by its name in tokenizer.json, or -1. */
static int split_behavior(const char *name) {
  static const char *const behaviors[] = {
#define X(name) #name,
      SPLIT_BEHAVIORS(X)
#undef X
  };
  for (int k = 0; k < (int)MJ_ARRAY_LEN(behaviors); k++)
    if (strcmp(name, behaviors[k]) == 0) return k;
  return -1;
}

static int add_step(tok_tokenizer *t, const json *p, const char *name, mj_err *err) {
  const char *type = type_of(p);
  if (!type) return bad(err, name, p, "%s", "pre_tokenizer has no \"type\"");
  if (t->nsteps == MAX_STEPS) return bad(err, name, p, "%s", "too many pre_tokenizer steps");
  if (t->nsteps > 0 && t->steps[t->nsteps - 1].kind == STEP_BYTELEVEL)
    return bad(err, name, p, "pre_tokenizer \"%s\" after ByteLevel is not supported", type);
  pre_step *s = &t->steps[t->nsteps];
  if (strcmp(type, "Split") == 0) {
    const json *pat = json_get(p, "pattern"), *beh = json_get(p, "behavior");
    const json *rx = pat ? json_get(pat, "Regex") : NULL, *str = pat ? json_get(pat, "String") : NULL;
    s->behavior = beh && beh->type == JSON_STR ? split_behavior(beh->str) : -1;
    if (s->behavior < 0)
      return bad(err, name, p,
                 "pre_tokenizer Split behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                 "MergedWithNext, Contiguous",
                 beh && beh->type == JSON_STR ? beh->str : "?");
    s->invert = get_flag(p, "invert", false);
    if (rx && rx->type == JSON_STR) s->re = compile_re(rx->str, rx->len, false, name, rx, err);
    else if (str && str->type == JSON_STR) s->re = compile_re(str->str, str->len, true, name, str, err);
    else return bad(err, name, p, "%s", "pre_tokenizer Split has no Regex or String pattern");
    if (!s->re) return MJ_EINPUT;
    s->kind = STEP_SPLIT;
  } else if (strcmp(type, "ByteLevel") == 0) {
    s->kind = STEP_BYTELEVEL;
    s->behavior = SPLIT_Isolated; /* its own regex splits as Split's Isolated does */
    s->add_prefix_space = get_flag(p, "add_prefix_space", true);
    if (get_flag(p, "use_regex", true)) {
      s->re = compile_re(gpt2_pattern, strlen(gpt2_pattern), false, name, p, err);
      if (!s->re) return MJ_EINPUT;
    }
  } else if (strcmp(type, "Metaspace") == 0) {
    const json *rep = json_get(p, "replacement"), *ps = json_get(p, "prepend_scheme");
    if (!rep || rep->type != JSON_STR || rep->len == 0 || rep->len > 4 || utf8_valid_len(rep->str, rep->len) != rep->len)
      return bad(err, name, p, "%s", "pre_tokenizer Metaspace needs a one-character \"replacement\"");
    s->kind = STEP_METASPACE;
    s->rep = mj_arena_strndup(&t->arena, rep->str, rep->len);
    s->rep_len = rep->len;
    /* prepend_scheme, or the older add_prefix_space (true: always) */
    const char *scheme = ps && ps->type == JSON_STR ? ps->str : get_flag(p, "add_prefix_space", true) ? "always" : "never";
    s->prepend = !strcmp(scheme, "always") ? 1 : !strcmp(scheme, "first") ? 2 : !strcmp(scheme, "never") ? 0 : -1;
    if (s->prepend < 0)
      return bad(err, name, p, "pre_tokenizer Metaspace prepend_scheme \"%s\" is not always, first or never", scheme);
    s->split = get_flag(p, "split", true);
  } else if (strcmp(type, "Sequence") == 0) {
    return load_sequence(t, p, "pretokenizers", "pre_tokenizer", add_step, name, err);
  } else if (strcmp(type, "Whitespace") == 0 || strcmp(type, "WhitespaceSplit") == 0 || strcmp(type, "Digits") == 0 ||
             strcmp(type, "Punctuation") == 0) {
    /* The reference's fixed splitters, as Splits: a pattern (one character
     * for those that test a character) and a behavior.  Rust's \w is
     * Alphabetic, marks, Nd, Pc and Join_Control; char::is_whitespace is
     * White_Space; char::is_numeric is the N categories; Punctuation's test
     * is ASCII punctuation or the P categories. */
    const char *pat;
    s->behavior = SPLIT_Removed;
    if (strcmp(type, "Whitespace") == 0) {
      pat = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
            "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\p{White_Space}]+";
      s->invert = true; /* the matches are the words: keep them, drop the rest */
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
      pat = "\\p{White_Space}";
    } else if (strcmp(type, "Digits") == 0) {
      pat = "\\p{N}";
      s->behavior = get_flag(p, "individual_digits", false) ? SPLIT_Isolated : SPLIT_Contiguous;
    } else {
      pat = "[\\p{P}!-/:-@\\[-`{-~]";
      const json *beh = json_get(p, "behavior");
      s->behavior = SPLIT_Isolated;
      if (beh && !is_null(beh) && (beh->type != JSON_STR || (s->behavior = split_behavior(beh->str)) < 0))
        return bad(err, name, p, "pre_tokenizer Punctuation behavior \"%s\" is not one of Removed, Isolated, "
                   "MergedWithPrevious, MergedWithNext, Contiguous", beh->type == JSON_STR ? beh->str : "?");
    }
    s->re = compile_re(pat, strlen(pat), false, name, p, err);
    if (!s->re) return MJ_EINPUT;
    s->kind = STEP_SPLIT;
  } else {
    return bad(err, name, p,
               "pre_tokenizer \"%s\" is not supported (Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, "
               "Digits, Punctuation, Sequence)", type);
  }
  if (s->re) s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
  t->byte_level |= s->kind == STEP_BYTELEVEL;
  t->nsteps++;
  return 0;
}

static int special_ids(tok_tokenizer *t, const json *pp, const json *item, tok_ids *out,
                       const char *name, mj_err *err) {
  const json *st = json_get(item, "SpecialToken");
  const json *sid = st ? json_get(st, "id") : NULL;
  if (!sid || sid->type != JSON_STR)
    return bad(err, name, item, "%s", "post_processor template item is not understood");
  const json *def = json_get(json_get(pp, "special_tokens"), sid->str);
  const json *ids = def ? json_get(def, "ids") : NULL;
  if (ids && ids->type == JSON_ARR) {
    for (size_t i = 0; i < ids->len; i++) {
      if (ids->items[i]->type != JSON_NUM || !ids->items[i]->is_int)
        return bad(err, name, ids, "%s", "post_processor special token ids are not integers");
      tok_ids_push(out, (int32_t)ids->items[i]->i);
    }
    return 0;
  }
  int32_t id = smap_get(&t->pieces, sid->str, sid->len);
  if (id < 0) return bad(err, name, item, "post_processor special token \"%s\" is unknown", sid->str);
  tok_ids_push(out, id);
  return 0;
}

static int load_post(tok_tokenizer *t, const json *pp, const char *name, mj_err *err) {
  if (is_null(pp)) return 0;
  const char *type = type_of(pp);
  if (!type) return bad(err, name, pp, "%s", "post_processor has no \"type\"");
  if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
  if (strcmp(type, "Sequence") == 0)
    return load_sequence(t, pp, "processors", "post_processor", load_post, name, err);
  if (strcmp(type, "TemplateProcessing") == 0) {
    const json *single = json_get(pp, "single");
    if (!single || single->type != JSON_ARR)
      return bad(err, name, pp, "%s", "post_processor TemplateProcessing has no \"single\" array");
    bool seen_a = false;
    for (size_t i = 0; i < single->len; i++) {
      const json *item = single->items[i];
      if (json_get(item, "Sequence")) {
        seen_a = true;
        continue;
      }
      int r = special_ids(t, pp, item, seen_a ? &t->suffix : &t->prefix, name, err);
      if (r) return r;
    }
    return 0;
  }
  return bad(err, name, pp, "post_processor \"%s\" is not supported (TemplateProcessing, ByteLevel)", type);
}

/* One token's text through the decoder's token-level steps (those before
 * a Fuse), into out.  first: the first token of a decode (Metaspace with a
 * prepend scheme drops its replacements there instead of writing spaces). */
static void decode_token(const tok_tokenizer *t, const char *p, size_t n, bool first, mj_buf *out) {
  mj_buf a = {0}, b = {0};
  mj_buf_put(&a, p, n);
  for (int i = 0; i < t->fuse_at; i++) {
    const dec_op *o = &t->dec[i];
    b.len = 0;
    if (o->kind == DEC_REPLACE || o->kind == DEC_METASPACE) {
      bool drop = o->kind == DEC_METASPACE && first && o->prefix;
      const char *to = o->kind == DEC_METASPACE ? " " : o->to;
      size_t to_len = o->kind == DEC_METASPACE ? 1 : o->to_len;
      for (size_t k = 0; k < a.len;)
        if (k + o->from_len <= a.len && memcmp(a.data + k, o->from, o->from_len) == 0) {
          if (!drop) mj_buf_put(&b, to, to_len);
          k += o->from_len;
        } else {
          mj_buf_putc(&b, a.data[k++]);
        }
    } else if (o->kind == DEC_BYTEFALLBACK) {
      /* "<0xXX>" is the byte XX (the reference parses it so) */
      unsigned v;
      char tail;
      if (a.len == 6 && memcmp(a.data, "<0x", 3) == 0 && a.data[5] == '>' &&
          sscanf(a.data + 3, "%2x%c", &v, &tail) == 2 && tail == '>')
        mj_buf_putc(&b, (char)v);
      else
        mj_buf_put(&b, a.data, a.len);
    } else if (o->kind == DEC_STRIP) {
      size_t st = 0, en = a.len;
      for (int k = 0; k < o->start && st + o->content_len <= en && !memcmp(a.data + st, o->content, o->content_len); k++)
        st += o->content_len;
      for (int k = 0; k < o->stop && en >= st + o->content_len && !memcmp(a.data + en - o->content_len, o->content, o->content_len); k++)
        en -= o->content_len;
      mj_buf_put(&b, a.data + st, en - st);
    } else { /* ByteLevel: translated at load time, never here */
      mj_buf_put(&b, a.data, a.len);
    }
    mj_buf tmp = a;
    a = b, b = tmp;
  }
  mj_buf_put(out, a.data, a.len);
  mj_buf_free(&a), mj_buf_free(&b);
}

static int add_decoder(tok_tokenizer *t, const json *d, const char *name, mj_err *err) {
  const char *type = type_of(d);
  if (!type) return bad(err, name, d, "%s", "decoder has no \"type\"");
  if (!strcmp(type, "Sequence")) return load_sequence(t, d, "decoders", "decoder", add_decoder, name, err);
  if (t->ndec == MAX_DECS) return bad(err, name, d, "%s", "too many decoder steps");
  dec_op *o = &t->dec[t->ndec];
  memset(o, 0, sizeof *o);
  if (!strcmp(type, "ByteLevel")) {
    o->kind = DEC_BYTELEVEL;
  } else if (!strcmp(type, "Replace")) {
    const json *pat = json_get(d, "pattern"), *str = pat ? json_get(pat, "String") : NULL, *c = json_get(d, "content");
    if (!str || str->type != JSON_STR || str->len == 0 || !c || c->type != JSON_STR)
      return bad(err, name, d, "%s", "decoder Replace needs a String pattern and a content (a Regex one is not supported)");
    o->kind = DEC_REPLACE;
    o->from = mj_arena_strndup(&t->arena, str->str, str->len), o->from_len = str->len;
    o->to = mj_arena_strndup(&t->arena, c->str, c->len), o->to_len = c->len;
  } else if (!strcmp(type, "ByteFallback")) {
    o->kind = DEC_BYTEFALLBACK;
  } else if (!strcmp(type, "Fuse")) {
    o->kind = DEC_FUSE;
  } else if (!strcmp(type, "Strip")) {
    const json *c = json_get(d, "content"), *st = json_get(d, "start"), *sp = json_get(d, "stop");
    if (!c || c->type != JSON_STR || c->len == 0 || c->len >= sizeof o->content ||
        (st && (st->type != JSON_NUM || !st->is_int || st->i < 0 || st->i > 1000)) ||
        (sp && (sp->type != JSON_NUM || !sp->is_int || sp->i < 0 || sp->i > 1000)))
      return bad(err, name, d, "%s", "decoder Strip needs a one-character content and counts start and stop");
    o->kind = DEC_STRIP;
    memcpy(o->content, c->str, c->len), o->content_len = c->len;
    o->start = st ? (int)st->i : 0, o->stop = sp ? (int)sp->i : 0;
  } else if (!strcmp(type, "Metaspace")) {
    const json *rep = json_get(d, "replacement"), *ps = json_get(d, "prepend_scheme");
    if (!rep || rep->type != JSON_STR || rep->len == 0)
      return bad(err, name, d, "%s", "decoder Metaspace needs a \"replacement\"");
    o->kind = DEC_METASPACE;
    o->from = mj_arena_strndup(&t->arena, rep->str, rep->len), o->from_len = rep->len;
    const char *scheme = ps && ps->type == JSON_STR ? ps->str : get_flag(d, "add_prefix_space", true) ? "always" : "never";
    o->prefix = strcmp(scheme, "never") != 0;
  } else {
    return bad(err, name, d, "decoder \"%s\" is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, "
               "Sequence)", type);
  }
  t->ndec++;
  return 0;
}

/* The decoder, flattened; then every model token's text as decoded (the
 * byte-level translation was done by load_model). */
static int load_decoder(tok_tokenizer *t, const json *d, const char *name, mj_err *err) {
  if (is_null(d)) return bad(err, name, d, "%s", "no decoder");
  int r = add_decoder(t, d, name, err);
  if (r) return r;
  bool bl = false;
  t->fuse_at = t->ndec;
  for (int i = 0; i < t->ndec; i++) {
    bl |= t->dec[i].kind == DEC_BYTELEVEL;
    if (t->dec[i].kind == DEC_FUSE && t->fuse_at == t->ndec) t->fuse_at = i;
  }
  if (bl != t->byte_level)
    return bad(err, name, d, "%s", bl ? "a ByteLevel decoder without a ByteLevel pre_tokenizer is not supported"
                                      : "a ByteLevel pre_tokenizer needs a ByteLevel decoder");
  if (bl && t->ndec != 1)
    return bad(err, name, d, "%s", "a ByteLevel decoder with other decoder steps is not supported");
  for (int i = t->fuse_at + 1; i < t->ndec; i++)
    if (t->dec[i].kind != DEC_STRIP || t->dec[i].stop != 0)
      return bad(err, name, d, "%s", "after Fuse only a Strip of leading characters (stop 0) is supported");
  /* Added tokens go through the decoder too, as in the reference (their
   * content, where it is all byte-level alphabet, becomes those bytes). */
  mj_buf b = {0};
  if (bl) {
    for (int32_t id = 0; id < t->nent; id++) {
      tok_entry *e = &t->ent[id];
      if (!e->used || !e->added || !piece_to_bytes(e->piece, e->piece_len, &b)) continue;
      e->bytes = mj_arena_strndup(&t->arena, b.data ? b.data : "", b.len);
      e->bytes_len = (uint32_t)b.len;
    }
    mj_buf_free(&b);
    return 0;
  }
  for (int i = 0; i < t->fuse_at; i++) t->first_differs |= t->dec[i].kind == DEC_METASPACE && t->dec[i].prefix;
  for (int32_t id = 0; id < t->nent; id++) {
    tok_entry *e = &t->ent[id];
    if (!e->used) continue;
    b.len = 0;
    decode_token(t, e->piece, e->piece_len, false, &b);
    e->bytes = mj_arena_strndup(&t->arena, b.data ? b.data : "", b.len);
    e->bytes_len = (uint32_t)b.len;
  }
  mj_buf_free(&b);
  return 0;
}

int tok_load_mem(const char *text, size_t len, const char *name, tok_tokenizer **out, mj_err *err) {
  init_byte_level();
  *out = NULL;
  mj_arena ja;
  mj_arena_init(&ja, 1 << 20);
  json *root;
  if (json_parse(&ja, text, len, name, &root, err)) {
    mj_arena_free(&ja);
    return MJ_EINPUT;
  }
  if (root->type != JSON_OBJ) {
    int r = bad(err, name, root, "%s", "the top level is not an object"); /* root lives in ja */
    mj_arena_free(&ja);
    return r;
  }
  tok_tokenizer *t = mj_xcalloc(1, sizeof *t);
  t->name = mj_xstrdup(name);
  mj_arena_init(&t->arena, 1 << 20);
  /* The pre-tokenizer first: a ByteLevel step makes the model's BPE work
   * on bytes, its absence on characters. */
  const json *pre = json_get(root, "pre_tokenizer");
  int r = load_normalizer(t, json_get(root, "normalizer"), name, err);
  if (!r && !is_null(pre)) r = add_step(t, pre, name, err);
  if (!r) r = load_model(t, json_get(root, "model"), name, err);
  if (!r) r = load_added(t, json_get(root, "added_tokens"), name, err);
  if (!r) r = load_post(t, json_get(root, "post_processor"), name, err);
  if (!r) r = load_decoder(t, json_get(root, "decoder"), name, err);
  mj_arena_free(&ja); /* everything kept was copied */
  if (r) {
    tok_destroy(t);
    return r;
  }
  t->mctx = pcre2_match_context_create(NULL);
  t->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
  if (t->jit_stack) pcre2_jit_stack_assign(t->mctx, NULL, t->jit_stack);
  build_tries(t); /* after the match context: the normalizer may run a Replace */
  t->cache = mj_xcalloc(CACHE_SLOTS, sizeof *t->cache);
  *out = t;
  return 0;
}

int tok_load(const char *path, tok_tokenizer **out, mj_err *err) {
  char *data;
  size_t len;
  mj_err e = {0};
  if (mj_read_file(path, &data, &len, &e)) {
    /* A tokenizer that cannot be read is the user's input error. */
    mj_fail(err, MJ_EINPUT, "%s", e.msg);
    mj_err_clear(&e);
    return MJ_EINPUT;
  }
  int r = tok_load_mem(data, len, path, out, err);
  free(data);
  return r;
}

void tok_destroy(tok_tokenizer *t) {
  if (!t) return;
  for (int i = 0; i < t->nsteps; i++) {
    pcre2_code_free(t->steps[i].re);
    pcre2_match_data_free(t->steps[i].md);
  }
  for (int i = 0; i < MAX_STEPS; i++) mj_buf_free(&t->prefixed[i]);
  pcre2_code_free(t->word_re);
  pcre2_match_data_free(t->word_md);
  pcre2_match_context_free(t->mctx);
  if (t->jit_stack) pcre2_jit_stack_free(t->jit_stack);
  free(t->raw_trie.edges.slots);
  free(t->raw_trie.term);
  free(t->norm_trie.edges.slots);
  free(t->norm_trie.term);
  free(t->vocab_bytes.slots);
  free(t->pieces.slots);
  free(t->merges.slots);
  free(t->added);
  free(t->ent);
  tok_ids_free(&t->prefix);
  tok_ids_free(&t->suffix);
  mj_buf_free(&t->repair);
  mj_buf_free(&t->affixed);
  mj_buf_free(&t->norm);
  mj_buf_free(&t->norm2);
  for (int i = 0; i < t->nnorms; i++) {
    pcre2_code_free(t->norms[i].re);
    pcre2_match_data_free(t->norms[i].md);
  }
  free(t->sym_id);
  free(t->sym_prev);
  free(t->sym_next);
  free(t->heap);
  tok_ids_free(&t->word_ids);
  free(t->cache);
  mj_buf_free(&t->cache_bytes);
  tok_ids_free(&t->cache_ids);
  mj_arena_free(&t->arena);
  free(t->name);
  free(t);
}

/* ---- lookups ------------------------------------------------------------------------ */
const char *tok_name(const tok_tokenizer *t) { return t->name; }
int32_t tok_vocab_size(const tok_tokenizer *t) {
  int32_t n = t->nent;
  while (n > 0 && !t->ent[n - 1].used) n--;
  return n;
}
int32_t tok_find(const tok_tokenizer *t, const char *piece, size_t len) {
  return smap_get(&t->pieces, piece, len);
}
int32_t tok_added(const tok_tokenizer *t, const char *content) {
  for (int i = t->nadded - 1; i >= 0; i--)
    if (strlen(content) == t->added[i].len && memcmp(content, t->added[i].content, t->added[i].len) == 0)
      return t->added[i].id;
  return -1;
}
const char *tok_piece(const tok_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->nent || !t->ent[id].used) return NULL;
  *len = t->ent[id].piece_len;
  return t->ent[id].piece;
}
const char *tok_bytes(const tok_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->nent || !t->ent[id].used) return NULL;
  *len = t->ent[id].bytes_len;
  return t->ent[id].bytes;
}
bool tok_is_special(const tok_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->nent && t->ent[id].used && t->ent[id].special;
}

/* ---- BPE -------------------------------------------------------------------------------- */
static inline bool heap_less(const heap_item *a, const heap_item *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}
static void heap_push(tok_tokenizer *t, size_t *n, heap_item it) {
  if (*n == t->heap_cap) {
    t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 256;
    t->heap = mj_xrealloc(t->heap, t->heap_cap * sizeof *t->heap);
  }
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&it, &t->heap[p])) break;
    t->heap[i] = t->heap[p];
    i = p;
  }
  t->heap[i] = it;
}
static heap_item heap_pop(tok_tokenizer *t, size_t *n) {
  heap_item top = t->heap[0], last = t->heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap_less(&t->heap[c + 1], &t->heap[c])) c++;
    if (!heap_less(&t->heap[c], &last)) break;
    t->heap[i] = t->heap[c];
    i = c;
  }
  if (*n) t->heap[i] = last;
  return top;
}

static void push_pair(tok_tokenizer *t, size_t *nheap, int32_t l, int32_t r) {
  const pmap_slot *m =
      pmap_get(&t->merges, (uint64_t)(uint32_t)t->sym_id[l] << 32 | (uint32_t)t->sym_id[r]);
  if (m) heap_push(t, nheap, (heap_item){m->a, l, r, t->sym_id[l], t->sym_id[r]});
}

/* Merge one word (its bytes) into ids appended to out. */
static void bpe_word(tok_tokenizer *t, const unsigned char *w, size_t n, tok_ids *out) {
  if (t->ignore_merges) {
    int32_t id = smap_get(&t->vocab_bytes, (const char *)w, n);
    if (id >= 0) {
      tok_ids_push(out, id);
      return;
    }
  }
  if (n > t->sym_cap) {
    t->sym_cap = n * 2;
    t->sym_id = mj_xrealloc(t->sym_id, t->sym_cap * sizeof *t->sym_id);
    t->sym_prev = mj_xrealloc(t->sym_prev, t->sym_cap * sizeof *t->sym_prev);
    t->sym_next = mj_xrealloc(t->sym_next, t->sym_cap * sizeof *t->sym_next);
  }
  /* Byte-level: one symbol per byte whose token exists (a byte-level
   * vocabulary has all 256; a missing one is dropped, as the reference
   * does without an unknown token).  Over characters: one symbol per
   * character in the vocabulary; else, with byte_fallback, one per byte
   * (its <0xXX> token) when all exist; else the unk_token (one for a run
   * of them with fuse_unk); else nothing. */
  int32_t m = 0;
  bool unk_run = false;
#define SYM(x)                 \
  do {                         \
    t->sym_id[m] = (x);        \
    t->sym_prev[m] = m - 1;    \
    t->sym_next[m] = m + 1;    \
    m++;                       \
  } while (0)
  bool affixed = t->cont_prefix || t->word_suffix;
  for (size_t i = 0; i < n;) {
    size_t len = 1;
    if (!t->byte_level && utf8_next(w + i, n - i, &len) < 0) len = 1;
    /* The unit's text: with the continuing_subword_prefix unless it is
     * the word's first, the end_of_word_suffix if it is its last. */
    const unsigned char *u = w + i;
    size_t ul = len;
    if (affixed) {
      mj_buf *b = &t->affixed;
      b->len = 0;
      if (t->cont_prefix && i > 0) mj_buf_put(b, t->cont_prefix, t->cont_len);
      mj_buf_put(b, (const char *)w + i, len);
      if (t->word_suffix && i + len == n) mj_buf_put(b, t->word_suffix, t->suffix_len);
      u = (const unsigned char *)b->data, ul = b->len;
    }
    if (t->byte_level) {
      int32_t id = affixed ? smap_get(&t->vocab_bytes, (const char *)u, ul) : t->byte_id[w[i]];
      if (id >= 0) SYM(id);
      i++;
      continue;
    }
    int32_t id = smap_get(&t->vocab_bytes, (const char *)u, ul);
    bool fb = id < 0 && t->byte_fallback;
    for (size_t k = 0; fb && k < ul; k++) fb = t->fallback_id[u[k]] >= 0;
    if (id >= 0) {
      SYM(id);
    } else if (fb) {
      for (size_t k = 0; k < ul; k++) SYM(t->fallback_id[u[k]]);
    } else if (t->unk_id >= 0) {
      if (!(t->fuse_unk && unk_run)) SYM(t->unk_id);
    }
    unk_run = id < 0 && !fb && t->unk_id >= 0;
    i += len;
  }
#undef SYM
  if (m == 0) return;
  t->sym_next[m - 1] = -1;
  size_t nheap = 0;
  for (int32_t i = 0; i + 1 < m; i++) push_pair(t, &nheap, i, i + 1);
  while (nheap) {
    heap_item it = heap_pop(t, &nheap);
    int32_t l = it.pos, r = it.r;
    /* Stale entries: a side was merged away or changed since the push. */
    if (t->sym_id[l] != it.lid || t->sym_next[l] != r || t->sym_id[r] != it.rid) continue;
    const pmap_slot *mg = pmap_get(&t->merges, (uint64_t)(uint32_t)it.lid << 32 | (uint32_t)it.rid);
    t->sym_id[l] = mg->b;
    t->sym_next[l] = t->sym_next[r];
    if (t->sym_next[r] >= 0) t->sym_prev[t->sym_next[r]] = l;
    t->sym_id[r] = -1; /* dead */
    if (t->sym_prev[l] >= 0) push_pair(t, &nheap, t->sym_prev[l], l);
    if (t->sym_next[l] >= 0) push_pair(t, &nheap, l, t->sym_next[l]);
  }
  for (int32_t i = 0; i >= 0; i = t->sym_next[i]) tok_ids_push(out, t->sym_id[i]);
}

static void cache_clear(tok_tokenizer *t) {
  memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
  t->cache_bytes.len = 0;
  t->cache_ids.n = 0;
  t->cache_n = 0;
}

static void encode_word(tok_tokenizer *t, const char *w, size_t n, tok_ids *out) {
  if (n == 1 && t->byte_id[(unsigned char)w[0]] >= 0 && !t->word_suffix) {
    tok_ids_push(out, t->byte_id[(unsigned char)w[0]]);
    return;
  }
  if (n > CACHE_MAX_WORD) {
    bpe_word(t, (const unsigned char *)w, n, out);
    return;
  }
  uint64_t h = hash_bytes(w, n);
  size_t i = h & (CACHE_SLOTS - 1);
  for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
    cache_slot *c = &t->cache[i];
    if (c->len == 0) break;
    if (c->h == h && c->len == n && memcmp(t->cache_bytes.data + c->off, w, n) == 0) {
      for (uint32_t k = 0; k < c->nids; k++) tok_ids_push(out, t->cache_ids.v[c->ioff + k]);
      return;
    }
  }
  size_t before = out->n;
  bpe_word(t, (const unsigned char *)w, n, out);
  if (t->cache_n * 2 >= CACHE_SLOTS) {
    cache_clear(t);
    for (i = h & (CACHE_SLOTS - 1); t->cache[i].len; i = (i + 1) & (CACHE_SLOTS - 1)) {}
  }
  cache_slot *c = &t->cache[i];
  c->h = h;
  c->off = (uint32_t)t->cache_bytes.len;
  c->len = (uint32_t)n;
  c->ioff = (uint32_t)t->cache_ids.n;
  c->nids = (uint32_t)(out->n - before);
  mj_buf_put(&t->cache_bytes, w, n);
  for (size_t k = before; k < out->n; k++) tok_ids_push(&t->cache_ids, out->v[k]);
  t->cache_n++;
}

/* ---- pre-tokenization ------------------------------------------------------------------ */
/* The next non-empty match of st's pattern in s[0..n) at or after *pos:
 * 1 with [*ms, *me), 0 when there is none, -1 on a regex failure (recorded).
 * An empty match splits nothing: the search steps one character past it. */
static int next_match(tok_tokenizer *t, pre_step *st, const char *s, size_t n, size_t *pos, size_t *ms, size_t *me) {
  while (*pos <= n) {
    int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, *pos, PCRE2_NO_UTF_CHECK, st->md, t->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      t->failed = mj_fail(t->err, MJ_EINPUT, "%s: pre_tokenizer regex failed on the input: %s", t->name, (char *)msg);
      return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
    if (ov[0] == ov[1]) {
      size_t len = 1;
      if (ov[0] < n) utf8_next((const unsigned char *)s + ov[0], n - ov[0], &len);
      *pos = ov[0] + len;
      continue;
    }
    *ms = ov[0], *me = ov[1];
    return 1;
  }
  return 0;
}

static void pre_tokenize(tok_tokenizer *t, int step, const char *s, size_t n, tok_ids *out);

/* Split with any behavior, as the reference's NormalizedString::split does
 * it: the text becomes alternating segments, the pattern's matches and the
 * text between them (their roles swapped when inverted); then Removed drops
 * the matches, Isolated keeps every segment, Contiguous joins neighbouring
 * segments of the same kind, MergedWithPrevious appends a match to the
 * segment before it (unless that was a match too), MergedWithNext prepends
 * it to the segment after; empty pieces are dropped. */
typedef struct {
  size_t s, e;
  bool match;
} split_seg;

static void split_pieces(tok_tokenizer *t, int step, pre_step *st, const char *s, size_t n, tok_ids *out) {
  split_seg *v = mj_xmalloc(8 * sizeof *v);
  size_t nv = 0, cap = 8, pos = 0, prev = 0, ms, me;
#define PUSH(a, b, m)                                  \
  do {                                                 \
    if (nv == cap) v = mj_xrealloc(v, (cap *= 2) * sizeof *v); \
    v[nv++] = (split_seg){(a), (b), (m)};              \
  } while (0)
  int rc;
  while ((rc = next_match(t, st, s, n, &pos, &ms, &me)) > 0) {
    if (ms > prev) PUSH(prev, ms, st->invert);
    PUSH(ms, me, !st->invert);
    prev = pos = me;
  }
  if (rc < 0) {
    free(v);
    return;
  }
  if (prev < n) PUSH(prev, n, st->invert);
#undef PUSH
  /* Fold in place: k pieces kept so far (match now means "remove"). */
  size_t k = 0;
  bool prev_match = false;
  switch (st->behavior) {
  case SPLIT_Removed: k = nv; break;
  case SPLIT_Isolated:
    for (size_t i = 0; i < nv; i++) v[i].match = false;
    k = nv;
    break;
  case SPLIT_Contiguous:
  case SPLIT_MergedWithPrevious:
    for (size_t i = 0; i < nv; i++) {
      bool join = st->behavior == SPLIT_Contiguous ? v[i].match == prev_match : v[i].match && !prev_match;
      prev_match = v[i].match;
      if (join && k > 0) v[k - 1].e = v[i].e;
      else v[k++] = (split_seg){v[i].s, v[i].e, false};
    }
    break;
  case SPLIT_MergedWithNext:
    /* From the end: a match joins the segment after it. */
    for (size_t i = nv; i-- > 0;) {
      bool join = v[i].match && !prev_match;
      prev_match = v[i].match;
      if (join && k > 0) v[nv - k].s = v[i].s;
      else k++, v[nv - k] = (split_seg){v[i].s, v[i].e, false};
    }
    memmove(v, v + nv - k, k * sizeof *v);
    break;
  }
  for (size_t i = 0; i < k && !t->failed; i++)
    if (!v[i].match && v[i].e > v[i].s) pre_tokenize(t, step + 1, s + v[i].s, v[i].e - v[i].s, out);
  free(v);
}

/* Metaspace, as the reference's: every space becomes the replacement; the
 * replacement is prepended (unless the text starts with one) always, or
 * with "first" only to the piece that starts the input; with split, each
 * replacement starts a new piece (MergedWithNext). */
static void metaspace(tok_tokenizer *t, int step, const pre_step *st, const char *s, size_t n, tok_ids *out) {
  mj_buf *b = &t->prefixed[step];
  b->len = 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] == ' ') mj_buf_put(b, st->rep, st->rep_len);
    else mj_buf_putc(b, s[i]);
  bool starts = b->len >= st->rep_len && memcmp(b->data, st->rep, st->rep_len) == 0;
  if (!starts && (st->prepend == 1 || (st->prepend == 2 && s == t->first_ptr))) {
    mj_buf_put(b, st->rep, st->rep_len); /* room, then shift */
    memmove(b->data + st->rep_len, b->data, b->len - st->rep_len);
    memcpy(b->data, st->rep, st->rep_len);
  }
  const char *d = b->data;
  size_t m = b->len, from = 0;
  if (st->split)
    for (size_t i = 1; i + st->rep_len <= m; i++)
      if (memcmp(d + i, st->rep, st->rep_len) == 0) {
        pre_tokenize(t, step + 1, d + from, i - from, out);
        from = i;
      }
  pre_tokenize(t, step + 1, d + from, m - from, out);
}

static void pre_tokenize(tok_tokenizer *t, int step, const char *s, size_t n, tok_ids *out) {
  if (t->failed || n == 0) return;
  if (step == t->nsteps) {
    if (t->piece_fn) t->piece_fn(t->piece_ctx, s, n);
    else encode_word(t, s, n, out);
    return;
  }
  pre_step *st = &t->steps[step];
  if (st->kind == STEP_METASPACE) {
    metaspace(t, step, st, s, n, out);
    return;
  }
  if (st->kind == STEP_BYTELEVEL && st->add_prefix_space && s[0] != ' ') {
    mj_buf *b = &t->prefixed[step];
    b->len = 0;
    mj_buf_putc(b, ' ');
    mj_buf_put(b, s, n);
    s = b->data;
    n = b->len;
  }
  if (!st->re) {
    pre_tokenize(t, step + 1, s, n, out);
    return;
  }
  if (st->behavior != SPLIT_Isolated || st->invert) {
    split_pieces(t, step, st, s, n, out);
    return;
  }
  /* Isolated (the common case, kept allocation-free): every match is a
   * piece, and so is the text between. */
  size_t pos = 0, prev = 0;
  while (pos <= n) {
    size_t ms, me;
    int rc = next_match(t, st, s, n, &pos, &ms, &me);
    if (rc <= 0) break;
    if (ms > prev) pre_tokenize(t, step + 1, s + prev, ms - prev, out);
    pre_tokenize(t, step + 1, s + ms, me - ms, out);
    prev = pos = me;
  }
  if (prev < n) pre_tokenize(t, step + 1, s + prev, n - prev, out);
}

/* ---- added tokens ------------------------------------------------------------------------ */
static bool is_white(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* Start of the character that ends at s[end) (s is valid UTF-8). */
static size_t char_before(const char *s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
  return b;
}

static bool word_char_at(tok_tokenizer *t, const char *s, size_t n, size_t at) {
  return pcre2_match(t->word_re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, t->word_md, NULL) >= 0;
}

typedef void (*segment_fn)(tok_tokenizer *t, const char *s, size_t n, tok_ids *out);

/* Split s on the added tokens of tr; pass the text between them to fn and
 * append the ids of the tokens. */
static void split_added(tok_tokenizer *t, const trie *tr, const char *s, size_t n, segment_fn fn,
                        tok_ids *out) {
  if (tr->empty) {
    fn(t, s, n, out);
    return;
  }
  size_t start = 0; /* text not yet handed out */
  for (size_t i = 0; i < n && !t->failed;) {
    if (!tr->first[(unsigned char)s[i]]) {
      i++;
      continue;
    }
    size_t len = 0;
    int32_t k = trie_match(tr, s + i, n - i, &len);
    if (k < 0) {
      i++;
      continue;
    }
    const added_token *a = &t->added[k];
    size_t ms = i, me = i + len;
    if (a->single_word) {
      bool word_before = ms > 0 && word_char_at(t, s, n, char_before(s, ms));
      bool word_after = me < n && word_char_at(t, s, n, me);
      if (word_before || word_after) {
        i++;
        continue;
      }
    }
    if (a->lstrip) {
      while (ms > start) {
        size_t b = char_before(s, ms), l;
        if (!is_white((uint32_t)utf8_next((const unsigned char *)s + b, n - b, &l))) break;
        ms = b;
      }
    }
    if (a->rstrip) {
      size_t l;
      while (me < n && is_white((uint32_t)utf8_next((const unsigned char *)s + me, n - me, &l))) me += l;
    }
    if (ms > start) fn(t, s + start, ms - start, out);
    tok_ids_push(out, a->id);
    start = i = me;
  }
  if (start < n && !t->failed) fn(t, s + start, n - start, out);
}

static void model_segment(tok_tokenizer *t, const char *s, size_t n, tok_ids *out) {
  pre_tokenize(t, 0, s, n, out);
}

static void raw_segment(tok_tokenizer *t, const char *s, size_t n, tok_ids *out) {
  /* The normalized copy must outlive the recursion below; nothing inside
   * normalizes again, so one buffer pair serves. */
  bool first = s == t->first_ptr;
  s = normalize(t, s, n, &n);
  t->first_ptr = first ? s : NULL;
  split_added(t, &t->norm_trie, s, n, model_segment, out);
}

int tok_pre_pieces(tok_tokenizer *t, const char *text, size_t len, void (*fn)(void *ctx, const char *s, size_t n),
                   void *ctx, mj_err *err) {
  tok_ids none = {0};
  t->err = err, t->failed = 0, t->piece_fn = fn, t->piece_ctx = ctx, t->first_ptr = text;
  pre_tokenize(t, 0, text, len, &none);
  t->piece_fn = NULL, t->piece_ctx = NULL;
  tok_ids_free(&none);
  return t->failed;
}

int tok_encode(tok_tokenizer *t, const char *text, size_t len, bool add_special, tok_ids *out,
               mj_err *err) {
  t->err = err;
  t->failed = 0;
  if (utf8_valid_len(text, len) != len) {
    t->repair.len = 0;
    utf8_repair(text, len, &t->repair);
    text = t->repair.data;
    len = t->repair.len;
  }
  if (add_special)
    for (size_t i = 0; i < t->prefix.n; i++) tok_ids_push(out, t->prefix.v[i]);
  t->first_ptr = text;
  split_added(t, &t->raw_trie, text, len, raw_segment, out);
  if (add_special)
    for (size_t i = 0; i < t->suffix.n; i++) tok_ids_push(out, t->suffix.v[i]);
  t->err = NULL;
  return t->failed;
}

/* ---- decoding ------------------------------------------------------------------------------ */
void tok_stream_init(tok_stream *s, const tok_tokenizer *t, bool skip_special) {
  *s = (tok_stream){.t = t, .skip_special = skip_special};
}

/* Emit the complete characters of pend + b[0..n); keep an unfinished tail. */
static size_t stream_bytes(tok_stream *s, const char *b, size_t n, mj_buf *out) {
  size_t before = out->len;
  size_t i = 0;
  while (s->npend > 0 && i < n) {
    /* Finish or reject the held-back character first. */
    s->pend[s->npend++] = (unsigned char)b[i++];
    size_t len;
    int32_t c = utf8_next(s->pend, (size_t)s->npend, &len);
    if (c == UTF8_INCOMPLETE) continue;
    if (c >= 0) {
      mj_buf_put(out, (const char *)s->pend, len);
    } else {
      mj_buf_put(out, "\xEF\xBF\xBD", 3);
    }
    /* Bytes after the consumed ones are handed back to the main loop. */
    size_t rest = (size_t)s->npend - len;
    s->npend = 0;
    i -= rest;
  }
  if (i >= n) return out->len - before;
  /* Everything but an unfinished character at the very end goes out now. */
  size_t end = n;
  size_t k = n - i > 3 ? n - 3 : i;
  for (size_t j = k; j < n; j++) {
    size_t len;
    if (((unsigned char)b[j] & 0xC0) == 0x80) continue;
    if (utf8_next((const unsigned char *)b + j, n - j, &len) == UTF8_INCOMPLETE) {
      end = j;
      break;
    }
  }
  utf8_repair(b + i, end - i, out);
  for (size_t j = end; j < n; j++) s->pend[s->npend++] = (unsigned char)b[j];
  return out->len - before;
}

size_t tok_stream_finish(tok_stream *s, mj_buf *out) {
  if (s->npend == 0) return 0;
  s->npend = 0;
  mj_buf_put(out, "\xEF\xBF\xBD", 3);
  return 3;
}

/* A Strip after Fuse: up to start copies of its character leave the front
 * of the whole text (what was appended since before, while it begins). */
static void strip_front(tok_stream *s, mj_buf *out, size_t before) {
  const tok_tokenizer *t = s->t;
  if (s->strip_done) return;
  const dec_op *o = NULL;
  for (int i = t->fuse_at + 1; i < t->ndec && !o; i++) o = &t->dec[i];
  if (!o) {
    s->strip_done = true;
    return;
  }
  size_t k = before;
  while (s->stripped < o->start && out->len - k >= o->content_len && !memcmp(out->data + k, o->content, o->content_len))
    k += o->content_len, s->stripped++;
  if (k > before) { /* (nothing appended: out may still be empty, data NULL) */
    memmove(out->data + before, out->data + k, out->len - k);
    out->len -= k - before;
  }
  if (out->len > before || s->stripped == o->start) s->strip_done = true;
}

size_t tok_decode_stream(tok_stream *s, int32_t id, mj_buf *out) {
  const tok_tokenizer *t = s->t;
  if (id < 0 || id >= t->nent || !t->ent[id].used) return 0;
  const tok_entry *e = &t->ent[id];
  if (e->added && e->special && s->skip_special) return 0;
  size_t before = out->len;
  bool first = s->ntok++ == 0;
  if (first && t->first_differs) {
    mj_buf b = {0};
    decode_token(t, e->piece, e->piece_len, true, &b);
    if (e->added) tok_stream_finish(s, out), mj_buf_put(out, b.data, b.len);
    else stream_bytes(s, b.data ? b.data : "", b.len, out);
    mj_buf_free(&b);
  } else if (e->added) {
    tok_stream_finish(s, out);
    mj_buf_put(out, e->bytes, e->bytes_len);
  } else {
    stream_bytes(s, e->bytes, e->bytes_len, out);
  }
  strip_front(s, out, before);
  return out->len - before;
}

void tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, mj_buf *out) {
  tok_stream s;
  tok_stream_init(&s, t, skip_special);
  for (size_t i = 0; i < n; i++) tok_decode_stream(&s, ids[i], out);
  tok_stream_finish(&s, out);
}
