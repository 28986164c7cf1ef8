/* tokenizer.h: Hugging Face tokenizer.json (byte-level BPE) in C.
 *
 * GLM-5 ships its tokenizer as a Hugging Face tokenizer.json: a byte-level
 * BPE model, added tokens matched before anything else, an optional NFC
 * normalizer, a pre-tokenizer made of regex Splits and ByteLevel, a
 * ByteLevel decoder and optionally a TemplateProcessing post-processor.
 * This module reads exactly that family of files (Qwen, DeepSeek and GLM
 * files are all of it) and refuses, with one line naming the file and the
 * field, any component it does not implement, rather than tokenizing
 * differently from the reference.  Encoding works on bytes: the byte-level
 * alphabet is a bijection, so vocabulary and merges are translated to byte
 * strings once at load and BPE merges token ids, ranked through a hash
 * table, with a cache of recent words.  Regexes run in PCRE2 (UTF, UCP,
 * JIT).  Semantics follow the reference (huggingface/tokenizers); the test
 * tests/tokenizer.sh compares ids against a JavaScript implementation on a
 * multilingual corpus.  Prefix: tok_.
 */
#ifndef MOEJIT_TOKENIZER_H
#define MOEJIT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct tok_tokenizer tok_tokenizer;

/* A growable list of token ids. */
typedef struct tok_ids {
  int32_t *v;
  size_t n, cap;
} tok_ids;
void tok_ids_push(tok_ids *ids, int32_t id);
void tok_ids_free(tok_ids *ids);

/* Load a tokenizer.json.  A missing or unreadable file, malformed JSON and
 * unsupported components are MJ_EINPUT errors naming the file (and the
 * JSON line where there is one). */
int tok_load(const char *path, tok_tokenizer **out, mj_err *err);
/* The same from memory; name is used in messages. */
int tok_load_mem(const char *json_text, size_t len, const char *name, tok_tokenizer **out,
                 mj_err *err);
void tok_destroy(tok_tokenizer *t);

/* The file name given to tok_load (for messages). */
const char *tok_name(const tok_tokenizer *t);
/* Number of ids: one more than the largest id of the vocabulary or the
 * added tokens. */
int32_t tok_vocab_size(const tok_tokenizer *t);
/* The id of a vocabulary entry or added token given as it is written in
 * the file (so "Ġthe" or "<|user|>"), or -1. */
int32_t tok_find(const tok_tokenizer *t, const char *piece, size_t len);
/* The id of an added token by its content, or -1. */
int32_t tok_added(const tok_tokenizer *t, const char *content);
/* The entry of id as written in the file ("Ġthe", "<|user|>"), NULL when
 * the id is unused. */
const char *tok_piece(const tok_tokenizer *t, int32_t id, size_t *len);
/* The bytes id stands for when decoded (may be an unfinished UTF-8
 * character), NULL when unused. */
const char *tok_bytes(const tok_tokenizer *t, int32_t id, size_t *len);
bool tok_is_special(const tok_tokenizer *t, int32_t id);

/* Encode text[0..len) (any bytes: invalid UTF-8 becomes U+FFFD first, as
 * the reference's string conversion does) and append the ids to out.
 * add_special applies the post-processor's special tokens.  Not thread
 * safe: the word cache is updated. */
/* For tests and tools: the words the pre-tokenizer steps hand to BPE for
 * text (valid UTF-8; no normalizer, no added tokens), each passed to fn in
 * order. */
int tok_pre_pieces(tok_tokenizer *t, const char *text, size_t len, void (*fn)(void *ctx, const char *s, size_t n),
                   void *ctx, mj_err *err);
int tok_encode(tok_tokenizer *t, const char *text, size_t len, bool add_special, tok_ids *out,
               mj_err *err);

/* Append the text of ids to out: added tokens as their content, other
 * tokens as their bytes, with invalid UTF-8 replaced by U+FFFD per run of
 * ordinary tokens.  skip_special leaves special tokens out. */
void tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                mj_buf *out);

/* Streaming decode for generation: feed ids one at a time and get the text
 * that became complete.  A character split across tokens is held back
 * until its last byte arrives, so every piece of output is valid UTF-8,
 * and the concatenation of all pieces and tok_stream_finish equals
 * tok_decode of all the ids. */
typedef struct tok_stream {
  const tok_tokenizer *t;
  bool skip_special;
  unsigned char pend[4];
  int npend;
  size_t ntok;     /* tokens decoded (the first may decode differently: Metaspace) */
  int stripped;    /* leading characters a Strip after Fuse removed so far */
  bool strip_done; /* the text has begun: nothing more to strip */
} tok_stream;
void tok_stream_init(tok_stream *s, const tok_tokenizer *t, bool skip_special);
/* Append the newly complete text to out; returns the number of bytes
 * appended. */
size_t tok_decode_stream(tok_stream *s, int32_t id, mj_buf *out);
/* End of stream: an unfinished character becomes U+FFFD. */
size_t tok_stream_finish(tok_stream *s, mj_buf *out);

#endif
