/* test_json.c: the JSON reader, dtype conversions and util helpers. */
#include "dtype.h"
#include "json.h"
#include "t.h"
#include "util.h"

static json *parse(mj_arena *a, const char *s, mj_err *err) {
  json *v = NULL;
  mj_err_clear(err);
  if (json_parse(a, s, strlen(s), "t.json", &v, err)) return NULL;
  return v;
}

static void test_values(void) {
  mj_arena a;
  mj_arena_init(&a, 0);
  mj_err err = {0};
  json *v = parse(&a, "{\"a\": [1, -2.5, true, null, \"x\\u00e9\\ud83d\\ude00\"], \"n\": 9007199254740993}", &err);
  T_CHECK(v && v->type == JSON_OBJ);
  json *arr = json_get(v, "a");
  T_EQ_INT(arr->len, 5);
  T_CHECK(json_at(arr, 0)->is_int && json_at(arr, 0)->i == 1);
  T_NEAR(json_at(arr, 1)->num, -2.5, 0);
  T_CHECK(!json_at(arr, 1)->is_int);
  T_CHECK(json_at(arr, 2)->type == JSON_BOOL && json_at(arr, 2)->b);
  T_CHECK(json_at(arr, 3)->type == JSON_NULL);
  T_EQ_STR(json_at(arr, 4)->str, "x\xc3\xa9\xf0\x9f\x98\x80");
  /* integers beyond 2^53 stay exact */
  T_EQ_INT(json_get(v, "n")->i, 9007199254740993LL);
  T_CHECK(json_at(arr, 5) == NULL);
  /* last duplicate wins */
  v = parse(&a, "{\"k\":1,\"k\":2}", &err);
  T_EQ_INT(json_get(v, "k")->i, 2);
  mj_arena_free(&a);
}

static void expect_error(const char *text, const char *msg) {
  mj_arena a;
  mj_arena_init(&a, 0);
  mj_err err = {0};
  json *v = parse(&a, text, &err);
  T_CHECK(v == NULL);
  T_EQ_STR(err.msg, msg);
  mj_err_clear(&err);
  mj_arena_free(&a);
}

static void test_errors(void) {
  expect_error("{\"a\": 1,}", "t.json:1:9: bad JSON: expected a string key");
  expect_error("{\n  \"a\": tru\n}", "t.json:2:8: bad JSON: unexpected word");
  expect_error("[1, 2", "t.json:1:6: bad JSON: unterminated array");
  expect_error("\"abc", "t.json:1:1: bad JSON: unterminated string");
  expect_error("01", "t.json:1:2: bad JSON: trailing characters after the value");
  expect_error("\"\\ud800\"", "t.json:1:2: bad JSON: lone surrogate in \\u escape");
  expect_error("\"\xff\"", "t.json:1:2: bad JSON: invalid UTF-8 in string");
  expect_error("", "t.json:1:1: bad JSON: unexpected end of input");
  expect_error("NaN", "t.json:1:1: bad JSON: unexpected character");
  expect_error("1e999", "t.json:1:1: bad JSON: number out of range");
  /* deep nesting is refused, not a stack overflow */
  char deep[2000];
  memset(deep, '[', sizeof deep - 1);
  deep[sizeof deep - 1] = 0;
  expect_error(deep, "t.json:1:513: bad JSON: nesting deeper than 512 levels");
}

static void test_typed(void) {
  mj_arena a;
  mj_arena_init(&a, 0);
  mj_err err = {0};
  json *v = parse(&a, "{\"h\": 6144, \"f\": 2.0, \"s\": \"x\", \"b\": \"yes\"}", &err);
  int64_t i = 0;
  bool b;
  T_EQ_INT(json_get_int(v, "h", &i, "config.json", &err), 0);
  T_EQ_INT(i, 6144);
  T_EQ_INT(json_get_int(v, "f", &i, "config.json", &err), 0);
  T_EQ_INT(i, 2);
  T_EQ_INT(json_get_int(v, "missing", &i, "config.json", &err), 1);
  T_EQ_INT(json_get_bool(v, "b", &b, "config.json", &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "config.json:1:38: \"b\" must be true or false, not string");
  mj_arena_free(&a);
}

static void test_dtypes(void) {
  /* bf16 round trip and round-to-nearest-even */
  T_EQ_INT(dt_f32_to_bf16(1.0f), 0x3F80);
  T_NEAR(dt_bf16_to_f32(dt_f32_to_bf16(3.140625f)), 3.140625, 0);
  T_EQ_INT(dt_f32_to_bf16(dt_bits_f32(0x3F808000)), 0x3F80); /* tie -> even */
  T_EQ_INT(dt_f32_to_bf16(dt_bits_f32(0x3F818000)), 0x3F82); /* tie -> even */
  /* f16 */
  T_EQ_INT(dt_f32_to_f16(1.0f), 0x3C00);
  T_NEAR(dt_f16_to_f32(0x3555), 0.333251953125, 0);
  T_NEAR(dt_f16_to_f32(0x0001), 5.960464477539063e-08, 0);
  /* every e4m3 code converts back to itself (except NaN) */
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7F) == 0x7F) continue;
    float f = dt_e4m3_to_f32((uint8_t)c);
    uint8_t back = dt_f32_to_e4m3(f);
    if (back != c && !(f == 0 && (back & 0x7F) == 0)) bad++;
  }
  T_EQ_INT(bad, 0);
  T_NEAR(dt_e4m3_to_f32(0x7E), 448.0, 0);
  T_EQ_INT(dt_f32_to_e4m3(1000.0f), 0x7E); /* saturates */
  T_NEAR(dt_e4m3_to_f32(0x01), 0.001953125, 0); /* smallest subnormal 2^-9 */
  /* e2m1 table and rounding */
  static const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; c++)
    T_NEAR(dt_e2m1_to_f32((uint8_t)c), c < 8 ? vals[c] : -vals[c - 8], 0);
  T_EQ_INT(dt_f32_to_e2m1(2.5f), 4);  /* tie between 2 (code 4) and 3 (code 5) -> even */
  T_EQ_INT(dt_f32_to_e2m1(1.25f), 2); /* tie between 1 and 1.5 -> 1 */
  T_EQ_INT(dt_f32_to_e2m1(5.0f), 6);  /* tie between 4 and 6 -> 4 */
  T_EQ_INT(dt_f32_to_e2m1(-7.0f), 15);
  T_EQ_INT(dt_f32_to_e2m1(0.2f), 0);
}

static void test_util(void) {
  int64_t v[8];
  T_EQ_INT(mj_parse_i64_list("1,2,4", v, 8), 3);
  T_EQ_INT(v[2], 4);
  T_EQ_INT(mj_parse_i64_list("1,,2", v, 8), -1);
  T_EQ_INT(mj_parse_i64_list("1,x", v, 8), -1);
  T_EQ_INT(mj_parse_i64_list("1,", v, 8), -1);
  char h1[33], h2[33];
  mj_hash_hex(mj_hash128("abc", 3), h1);
  mj_hash_hex(mj_hash128("abd", 3), h2);
  T_CHECK(strlen(h1) == 32 && strcmp(h1, h2) != 0);
  mj_err err = {0};
  mj_fail(&err, MJ_EINPUT, "first");
  mj_fail(&err, MJ_EIO, "second");
  T_EQ_STR(err.msg, "first");
  T_EQ_INT(mj_code_exit(err.code), 1);
}

int main(void) {
  T_RUN(test_values);
  T_RUN(test_errors);
  T_RUN(test_typed);
  T_RUN(test_dtypes);
  T_RUN(test_util);
  return t_status();
}
