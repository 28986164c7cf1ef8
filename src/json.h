/* json.h: a strict JSON (RFC 8259) reader into an arena, and small writers.
 *
 * moejit reads JSON written by others: config.json, hf_quant_config.json,
 * safetensors headers and indexes, tokenizer.json, shape traces.  The reader
 * is strict (no comments, no trailing commas, no NaN), keeps the line and
 * column of every value so callers can name where a bad value is, keeps
 * integers exactly (int64) beside their double value, and allocates
 * everything from the caller's arena so a whole document is freed at once.
 * Duplicate object keys are kept; json_get returns the last one, as
 * Python's json module does.  Prefix: json_.
 */
#ifndef MOEJIT_JSON_H
#define MOEJIT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum {
  JSON_NULL,
  JSON_BOOL,
  JSON_NUM,
  JSON_STR,
  JSON_ARR,
  JSON_OBJ
} json_type;

typedef struct json json;
struct json {
  json_type type;
  int line, col; /* 1-based position of the value's first character */
  bool b;        /* JSON_BOOL */
  bool is_int;   /* JSON_NUM written without fraction/exponent, fits int64 */
  int64_t i;     /* JSON_NUM when is_int */
  double num;    /* JSON_NUM, always */
  const char *str; /* JSON_STR: decoded UTF-8, NUL-terminated (may hold NULs) */
  size_t len;      /* JSON_STR: byte length; JSON_ARR/JSON_OBJ: item count */
  json **items;    /* JSON_ARR: values; JSON_OBJ: values */
  const char **keys; /* JSON_OBJ: decoded keys */
  size_t *key_lens;  /* JSON_OBJ: key byte lengths */
};

/* Parse text[0..len).  name is used in messages ("config.json:3:14: ...").
 * Nesting deeper than 512 levels is refused (no stack overflow on hostile
 * input).  On error returns MJ_EINPUT with err naming name:line:col. */
int json_parse(mj_arena *a, const char *text, size_t len, const char *name,
               json **out, mj_err *err);

/* Object member by key (last one wins), or NULL (also when o is not an
 * object). */
json *json_get(const json *o, const char *key);
/* Array item, or NULL when out of range or not an array. */
json *json_at(const json *a, size_t i);
const char *json_type_name(json_type t);

/* Typed lookups for configuration readers: return 0 and set *out when key
 * is present with the right type; 1 when absent (out untouched); MJ_EINPUT
 * with a message naming name, the key and the line when the type is wrong. */
int json_get_int(const json *o, const char *key, int64_t *out,
                 const char *name, mj_err *err);
int json_get_num(const json *o, const char *key, double *out,
                 const char *name, mj_err *err);
int json_get_bool(const json *o, const char *key, bool *out,
                  const char *name, mj_err *err);
int json_get_str(const json *o, const char *key, const char **out,
                 const char *name, mj_err *err);

/* Writers: append a JSON string literal (quoted, escaped) to b. */
void json_write_str(mj_buf *b, const char *s, size_t len);

#endif
