/* test_openai.c: OpenAI request bodies read by oai_parse (fields, defaults,
 * the error of each wrong field, with its status and param; the penalties
 * and each route's logprobs fields) and the response bodies the writers
 * produce, read back with the JSON reader and compared byte for byte (with
 * log probabilities in each route's shape too). */
#include "json.h"
#include "openai.h"
#include "t.h"

static int parse(oai_kind k, const char *body, oai_request *r, oai_error *e) {
  memset(e, 0, sizeof *e);
  return oai_parse(k, body, strlen(body), r, e);
}

static void test_completion_fields(void) {
  oai_request r;
  oai_error e;
  T_EQ_INT(parse(OAI_COMPLETION,
                 "{\"model\":\"m\",\"prompt\":\"hi \\u00e9\",\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,"
                 "\"min_p\":0.1,\"max_tokens\":7,\"stop\":[\"a\",\"bc\"],\"seed\":-3,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true},\"n\":1,\"ignore_eos\":true,\"logit_bias\":{},\"user\":\"x\"}",
                 &r, &e),
           0);
  T_EQ_STR(r.model, "m");
  T_EQ_STR(r.prompt, "hi \xc3\xa9");
  T_EQ_INT(r.prompt_len, 5);
  T_NEAR(r.temperature, 0.5, 0);
  T_NEAR(r.top_p, 0.9, 0);
  T_NEAR(r.min_p, 0.1, 0);
  T_EQ_INT(r.top_k, 40);
  T_EQ_INT(r.max_tokens, 7);
  T_EQ_INT(r.n_stop, 2);
  T_EQ_STR(r.stop[1], "bc");
  T_CHECK(r.stop_len[0] == 1 && r.stop_len[1] == 2);
  T_CHECK(r.has_seed && r.seed == -3);
  T_CHECK(r.stream && r.include_usage && r.ignore_eos);
  oai_request_free(&r);
  /* defaults: OpenAI's sampling, no limit given, one stop string */
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"\",\"stop\":\"\\n\",\"top_k\":-1}", &r, &e), 0);
  T_CHECK(r.model == NULL && r.temperature == 1 && r.top_p == 1 && r.min_p == 0 && r.top_k == 0);
  T_EQ_INT(r.max_tokens, -1);
  T_CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "\n") && !r.has_seed && !r.stream);
  oai_request_free(&r);
  /* "\u0000" in a stop string is a character of it, as in content: kept,
   * with the length that says so (it was a 400 while the engine's stop
   * strings ended at their NUL) */
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\\u0000c\",\"\\u0000\"]}", &r, &e), 0);
  T_EQ_INT(r.n_stop, 3);
  T_CHECK(r.stop_len[1] == 3 && !memcmp(r.stop[1], "b\0c", 3));
  T_CHECK(r.stop_len[2] == 1 && r.stop[2][0] == 0);
  oai_request_free(&r);
  /* token ids, alone or a batch of one; a text as a batch of one; echo;
   * the neutral values of the fields refused otherwise */
  const char *ids_bodies[] = {"{\"prompt\":[5,0,2147483647],\"echo\":true}", "{\"prompt\":[[5,0,2147483647]],\"best_of\":1}"};
  for (int i = 0; i < 2; i++) {
    T_EQ_INT(parse(OAI_COMPLETION, ids_bodies[i], &r, &e), 0);
    T_CHECK(r.prompt == NULL && r.n_prompt_ids == 3 && r.prompt_ids);
    if (r.n_prompt_ids == 3) T_CHECK(r.prompt_ids[0] == 5 && r.prompt_ids[1] == 0 && r.prompt_ids[2] == INT32_MAX);
    T_CHECK(r.echo == (i == 0));
    oai_request_free(&r);
  }
  T_EQ_INT(parse(OAI_COMPLETION,
                 "{\"prompt\":[\"ab\"],\"suffix\":\"\",\"logit_bias\":null,\"response_format\":{\"type\":\"text\"},\"tools\":[]}",
                 &r, &e),
           0);
  T_CHECK(r.prompt && r.prompt_len == 2 && !strcmp(r.prompt, "ab") && !r.prompt_ids && !r.echo);
  oai_request_free(&r);
  /* a batch of prompts, texts and ids mixed, each drawn n times */
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":[\"ab\",[7,8],\"c\"],\"n\":2}", &r, &e), 0);
  T_EQ_INT(r.n_prompts, 3);
  T_EQ_INT(r.n, 2);
  if (r.n_prompts == 3) {
    T_CHECK(r.prompts[0].text && !strcmp(r.prompts[0].text, "ab") && !r.prompts[0].ids);
    T_CHECK(!r.prompts[1].text && r.prompts[1].n_ids == 2 && r.prompts[1].ids[1] == 8);
    T_CHECK(r.prompts[2].len == 1 && !strcmp(r.prompts[2].text, "c"));
    T_CHECK(r.prompt == r.prompts[0].text && r.prompt_len == 2);
  }
  oai_request_free(&r);
  /* 64 choices at most: 2 prompts x 32 */
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"],\"n\":32}", &r, &e), 0);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":64}", &r, &e), 0);
  T_EQ_INT(r.n, 64);
  oai_request_free(&r);
  /* /tokenize and /detokenize */
  T_EQ_INT(parse(OAI_TOKENIZE, "{\"model\":\"m\",\"prompt\":\"a b\",\"add_special_tokens\":false}", &r, &e), 0);
  T_CHECK(r.prompt && r.prompt_len == 3 && !r.add_special && !r.messages && r.model && !strcmp(r.model, "m"));
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_TOKENIZE, "{\"prompt\":\"\"}", &r, &e), 0);
  T_CHECK(r.prompt && r.prompt_len == 0 && r.add_special && r.add_generation_prompt);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_TOKENIZE,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":false,"
                 "\"chat_template_kwargs\":{\"enable_thinking\":true}}",
                 &r, &e),
           0);
  T_CHECK(r.n_messages == 1 && r.messages[0].role == OAI_USER && !r.add_generation_prompt && r.thinking && !r.prompt);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_DETOKENIZE, "{\"tokens\":[3,0,7]}", &r, &e), 0);
  T_CHECK(r.n_prompt_ids == 3 && r.prompt_ids[0] == 3 && r.prompt_ids[2] == 7);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_DETOKENIZE, "{\"tokens\":[]}", &r, &e), 0);
  T_CHECK(r.n_prompt_ids == 0 && r.prompt_ids);
  oai_request_free(&r);
}

static void test_chat_fields(void) {
  oai_request r;
  oai_error e;
  T_EQ_INT(parse(OAI_CHAT,
                 "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                 "{\"role\":\"assistant\",\"content\":null}],\"max_tokens\":3,\"max_completion_tokens\":5,"
                 "\"chat_template_kwargs\":{\"enable_thinking\":true}}",
                 &r, &e),
           0);
  T_EQ_INT(r.n_messages, 3);
  T_CHECK(r.messages[0].role == OAI_SYSTEM && r.messages[1].role == OAI_USER && r.messages[2].role == OAI_ASSISTANT);
  T_EQ_STR(r.messages[1].content, "ab");
  T_EQ_INT(r.messages[2].len, 0);
  T_EQ_INT(r.max_tokens, 5);
  T_CHECK(r.thinking);
  oai_request_free(&r);
  /* "\u0000" in content is a character: kept, with the length that says so */
  T_EQ_INT(parse(OAI_CHAT,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"c\\u0000\"},{\"type\":\"text\",\"text\":\"d\"}]}]}",
                 &r, &e),
           0);
  T_CHECK(r.messages[0].len == 3 && !memcmp(r.messages[0].content, "a\0b", 3));
  T_CHECK(r.messages[1].len == 3 && !memcmp(r.messages[1].content, "c\0d", 3));
  oai_request_free(&r);
}

/* The penalties, and logprobs as each route takes them. */
static void test_logprob_and_penalty_fields(void) {
  oai_request r;
  oai_error e;
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"x\"}", &r, &e), 0);
  T_CHECK(!r.logprobs && r.top_logprobs == 0 && r.presence_penalty == 0 && r.frequency_penalty == 0 &&
          r.repetition_penalty == 1);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_COMPLETION,
                 "{\"prompt\":\"x\",\"logprobs\":5,\"presence_penalty\":-2,\"frequency_penalty\":1.5,"
                 "\"repetition_penalty\":1.2}",
                 &r, &e),
           0);
  T_CHECK(r.logprobs && r.top_logprobs == 5);
  T_CHECK(r.presence_penalty == -2 && r.frequency_penalty == 1.5 && r.repetition_penalty == 1.2);
  oai_request_free(&r);
  /* 0: the drawn token's only; null: none */
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":0}", &r, &e), 0);
  T_CHECK(r.logprobs && r.top_logprobs == 0);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":null}", &r, &e), 0);
  T_CHECK(!r.logprobs);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20}",
                 &r, &e),
           0);
  T_CHECK(r.logprobs && r.top_logprobs == 20);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}", &r, &e), 0);
  T_CHECK(r.logprobs && r.top_logprobs == 0);
  oai_request_free(&r);
  T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false,\"top_logprobs\":null}",
                 &r, &e),
           0);
  T_CHECK(!r.logprobs);
  oai_request_free(&r);
}

/* body -> status 400, the param named and the message's start */
static void bad(oai_kind k, const char *body, const char *param, const char *msg) {
  oai_request r;
  oai_error e;
  int st = parse(k, body, &r, &e);
  T_EQ_INT(st, 400);
  if (st != 400) {
    oai_request_free(&r);
    return;
  }
  T_EQ_STR(e.type, "invalid_request_error");
  if (param) T_EQ_STR(e.param, param);
  else T_CHECK(e.param == NULL);
  if (strncmp(e.message, msg, strlen(msg)) != 0) T_EQ_STR(e.message, msg);
}

static void test_errors(void) {
  bad(OAI_COMPLETION, "{\"prompt\":\"x\"", NULL, "the body is not valid JSON: body:1:14: bad JSON: unterminated object");
  bad(OAI_COMPLETION, "{\"prompt\":\"\xff\"}", NULL, "the body is not valid JSON: body:1:12: bad JSON: invalid UTF-8 in string");
  bad(OAI_COMPLETION, "{\"prompt\":\"\\ud800\"}", NULL, "the body is not valid JSON");
  bad(OAI_COMPLETION, "[1]", NULL, "the body must be a JSON object, not array");
  bad(OAI_COMPLETION, "{}", "prompt", "'prompt' is required");
  bad(OAI_COMPLETION, "{\"prompt\":[\"a\",5]}", "prompt", "'prompt' 1 must be a string or an array of token ids, not number");
  bad(OAI_COMPLETION, "{\"prompt\":[\"a\",[]]}", "prompt", "'prompt' 1 is an empty array of token ids");
  bad(OAI_COMPLETION, "{\"prompt\":[[1],[2,-3]]}", "prompt", "'prompt' 1 token 1 must be a token id");
  bad(OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"],\"n\":33}", "n", "'n' must be 1 to 32 for this batch of prompts");
  char many[512] = "{\"prompt\":[\"a\"";
  for (int i = 1; i < 65; i++) strcat(many, ",\"a\"");
  strcat(many, "]}");
  bad(OAI_COMPLETION, many, "prompt", "'prompt' is a batch of 65 prompts; at most 64 a request");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"n\":0}", "n", "'n' must be 1 to 64, not 0");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"n\":65}", "n", "'n' must be 1 to 64, not 65");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":-1}", "n", "'n' must be 1 to 64, not -1");
  bad(OAI_COMPLETION, "{\"prompt\":5}", "prompt", "'prompt' must be a string or an array of token ids, not number");
  bad(OAI_COMPLETION, "{\"prompt\":[]}", "prompt", "'prompt' is an empty array of token ids");
  bad(OAI_COMPLETION, "{\"prompt\":[[]]}", "prompt", "'prompt' is an empty array of token ids");
  bad(OAI_COMPLETION, "{\"prompt\":[1,-2]}", "prompt", "'prompt' token 1 must be a token id (an integer, 0 or more), not that number");
  bad(OAI_COMPLETION, "{\"prompt\":[1,2.5]}", "prompt", "'prompt' token 1 must be a token id");
  bad(OAI_COMPLETION, "{\"prompt\":[1,2147483648]}", "prompt", "'prompt' token 1 must be a token id");
  bad(OAI_COMPLETION, "{\"prompt\":[1,[2]]}", "prompt", "'prompt' token 1 must be a token id (an integer, 0 or more), not array");
  bad(OAI_COMPLETION, "{\"prompt\":[{}]}", "prompt", "'prompt' token 0 must be a token id (an integer, 0 or more), not object");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"echo\":1}", "echo", "'echo' must be a boolean, not number");
  bad(OAI_TOKENIZE, "{}", "prompt", "'prompt' (a string) or 'messages' is required");
  bad(OAI_TOKENIZE, "{\"prompt\":[1]}", "prompt", "'prompt' must be a string, not array");
  bad(OAI_TOKENIZE, "{\"prompt\":\"x\",\"add_special_tokens\":1}", "add_special_tokens", "'add_special_tokens' must be a boolean");
  bad(OAI_TOKENIZE, "{\"messages\":[]}", "messages", "'messages' must not be empty");
  bad(OAI_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_generation_prompt\":\"no\"}",
      "add_generation_prompt", "'add_generation_prompt' must be a boolean");
  bad(OAI_TOKENIZE, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":5}",
      "chat_template_kwargs", "'chat_template_kwargs' must be an object, not number");
  bad(OAI_DETOKENIZE, "{}", "tokens", "'tokens' is required");
  bad(OAI_DETOKENIZE, "{\"tokens\":\"5\"}", "tokens", "'tokens' must be an array of token ids, not string");
  bad(OAI_DETOKENIZE, "{\"tokens\":[1,-1]}", "tokens", "'tokens' token 1 must be a token id");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}", "echo", "'echo' with 'logprobs' is not supported");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":-100}}", "logit_bias", "'logit_bias' is not supported by moejit");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2}", "best_of", "'best_of' must be 1");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix", "'suffix' (insertion) is not supported");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools",
      "'tools' (function calling) is not supported");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}",
      "response_format", "'response_format' other than {\"type\": \"text\"}");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":\"text\"}", "response_format",
      "'response_format' other than");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"f\"}]}", "functions",
      "'functions' (function calling) is not supported");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", "echo",
      "'echo' is taken by /v1/completions only");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens", "'max_tokens' must be 1 or more, not -1");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens", "'max_tokens' must be 1 or more, not 0");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":\"8\"}", "max_tokens", "'max_tokens' must be an integer, not string");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens", "'max_tokens' must be an integer, not a fraction");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature", "'temperature' must be a number, not string");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"temperature\":3}", "temperature", "'temperature' must be in [0, 2], not 3");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"top_p\":0}", "top_p", "'top_p' must be in (0, 1], not 0");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"top_k\":-2}", "top_k", "'top_k' must be 0 or -1 (off) or more");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stream\":1}", "stream", "'stream' must be a boolean, not number");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"ignore_eos\":\"yes\"}", "ignore_eos", "'ignore_eos' must be a boolean, not string");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "'stop' holds at most 4 strings");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[1]}", "stop", "'stop' must be a string or an array of strings, not number");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"a\",\"\"]}", "stop", "'stop' strings must not be empty");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"seed\":\"1\"}", "seed", "'seed' must be an integer, not string");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":\"yes\"}}", "stream_options",
      "'stream_options.include_usage' must be a boolean");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"presence_penalty\":2.5}", "presence_penalty",
      "'presence_penalty' must be in [-2, 2], not 2.5");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"frequency_penalty\":\"1\"}", "frequency_penalty",
      "'frequency_penalty' must be a number, not string");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"frequency_penalty\":-2.01}", "frequency_penalty",
      "'frequency_penalty' must be in [-2, 2], not -2.01");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"repetition_penalty\":0}", "repetition_penalty",
      "'repetition_penalty' must be in (0, inf), not 0");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":6}", "logprobs", "'logprobs' must be in [0, 5], not 6");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs", "'logprobs' must be in [0, 5], not -1");
  bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "'logprobs' must be an integer, not boolean");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":2}", "logprobs",
      "'logprobs' must be a boolean, not number");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
      "top_logprobs", "'top_logprobs' must be in [0, 20], not 21");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":1.5}",
      "top_logprobs", "'top_logprobs' must be an integer, not a fraction");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs",
      "'top_logprobs' needs 'logprobs': true");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false,\"top_logprobs\":0}",
      "top_logprobs", "'top_logprobs' needs 'logprobs': true");
  bad(OAI_CHAT, "{\"prompt\":\"x\"}", "messages", "'messages' is required");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":1}}",
      "chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean, not number");
  bad(OAI_CHAT, "{\"messages\":[]}", "messages", "'messages' must not be empty");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages",
      "messages[0].role must be system, developer, user or assistant, not 'tool'");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages", "messages[0].content must be a string");
  bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages",
      "messages[0].content[0] must be {\"type\": \"text\"");
}

/* A written body parses back, with the fields as given. */
static void test_writers(void) {
  mj_arena a;
  mj_arena_init(&a, 0);
  mj_err err = {0};
  json *v;
  mj_buf b = {0};
  oai_result r = {.id = "chatcmpl-1", .created = 1700000000, .model = "m\"x", .text = "a\nb\x01\"", .text_len = 5,
                  .finish_reason = "length", .prompt_tokens = 4, .completion_tokens = 2};
  oai_write_response(&b, OAI_CHAT, &r, 1, r.prompt_tokens, r.completion_tokens);
  T_EQ_INT(json_parse(&a, b.data, b.len, "resp", &v, &err), 0);
  T_EQ_STR(json_get(v, "object")->str, "chat.completion");
  T_EQ_STR(json_get(v, "model")->str, "m\"x");
  json *c0 = json_at(json_get(v, "choices"), 0);
  T_EQ_STR(json_get(json_get(c0, "message"), "content")->str, "a\nb\x01\"");
  T_EQ_STR(json_get(c0, "finish_reason")->str, "length");
  T_EQ_INT(json_get(json_get(v, "usage"), "total_tokens")->i, 6);
  /* Three choices: in the order given, each its index; usage as given
   * (the server counts each prompt once). */
  b.len = 0;
  oai_result three[3] = {r, r, r};
  three[1].index = 1, three[1].text = "x", three[1].text_len = 1, three[1].finish_reason = "stop";
  three[2].index = 2;
  oai_write_response(&b, OAI_COMPLETION, three, 3, 4, 7);
  T_EQ_INT(json_parse(&a, b.data, b.len, "resp3", &v, &err), 0);
  json *ch = json_get(v, "choices");
  T_EQ_INT(ch->len, 3);
  for (int i = 0; i < 3 && ch->len == 3; i++) T_EQ_INT(json_get(json_at(ch, (size_t)i), "index")->i, i);
  if (ch->len == 3) {
    T_EQ_STR(json_get(json_at(ch, 1), "text")->str, "x");
    T_EQ_STR(json_get(json_at(ch, 1), "finish_reason")->str, "stop");
  }
  T_EQ_INT(json_get(json_get(v, "usage"), "prompt_tokens")->i, 4);
  T_EQ_INT(json_get(json_get(v, "usage"), "total_tokens")->i, 11);
  b.len = 0;
  r.index = 5;
  oai_write_chunk(&b, OAI_COMPLETION, &r, false);
  T_EQ_INT(json_parse(&a, b.data, b.len, "chunk5", &v, &err), 0);
  T_EQ_INT(json_get(json_at(json_get(v, "choices"), 0), "index")->i, 5);
  r.index = 0;
  b.len = 0;
  r.finish_reason = NULL;
  oai_write_chunk(&b, OAI_CHAT, &r, true);
  T_EQ_INT(json_parse(&a, b.data, b.len, "chunk", &v, &err), 0);
  c0 = json_at(json_get(v, "choices"), 0);
  T_EQ_STR(json_get(v, "object")->str, "chat.completion.chunk");
  T_EQ_STR(json_get(json_get(c0, "delta"), "role")->str, "assistant");
  T_CHECK(json_get(c0, "finish_reason")->type == JSON_NULL);
  b.len = 0;
  oai_write_chunk(&b, OAI_COMPLETION, &r, false);
  T_EQ_INT(json_parse(&a, b.data, b.len, "chunk", &v, &err), 0);
  T_EQ_STR(json_get(v, "object")->str, "text_completion");
  T_EQ_STR(json_get(json_at(json_get(v, "choices"), 0), "text")->str, "a\nb\x01\"");
  b.len = 0;
  oai_write_usage_chunk(&b, OAI_COMPLETION, &r);
  T_EQ_INT(json_parse(&a, b.data, b.len, "usage", &v, &err), 0);
  T_EQ_INT(json_get(v, "choices")->len, 0);
  T_EQ_INT(json_get(json_get(v, "usage"), "completion_tokens")->i, 2);
  b.len = 0;
  oai_error e;
  oai_fail(&e, 413, "invalid_request_error", NULL, "body_too_large", "the body is %d bytes", 9);
  oai_write_error(&b, &e);
  T_EQ_INT(json_parse(&a, b.data, b.len, "error", &v, &err), 0);
  json *eo = json_get(v, "error");
  T_EQ_STR(json_get(eo, "message")->str, "the body is 9 bytes");
  T_CHECK(json_get(eo, "param")->type == JSON_NULL);
  T_EQ_STR(json_get(eo, "code")->str, "body_too_large");
  b.len = 0;
  oai_write_models(&b, "glm", 5);
  T_EQ_INT(json_parse(&a, b.data, b.len, "models", &v, &err), 0);
  T_EQ_STR(json_get(json_at(json_get(v, "data"), 0), "id")->str, "glm");
  b.len = 0;
  oai_write_model(&b, "org/glm", 5);
  mj_buf_putc(&b, 0);
  T_EQ_STR(b.data, "{\"id\":\"org/glm\",\"object\":\"model\",\"created\":5,\"owned_by\":\"moejit\"}");
  mj_buf_free(&b);
  mj_arena_free(&a);
}

/* The bodies byte for byte: whole and chunk, chat and completion, share
 * one writer of the choice, and clients parse exactly this. */
static void test_writers_exact(void) {
  oai_result r = {.id = "x-1", .created = 7, .model = "m", .text = "a\"\n", .text_len = 3, .finish_reason = "stop",
                  .prompt_tokens = 2, .completion_tokens = 1};
  static const struct {
    int what; /* 0 response, 1 chunk, 2 chunk with the role */
    oai_kind kind;
    bool fin;
    const char *want;
  } t[] = {
      {0, OAI_CHAT, true,
       "{\"id\":\"x-1\",\"object\":\"chat.completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"message\":{\"role\":\"assistant\",\"content\":\"a\\\"\\n\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
       "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}"},
      {0, OAI_COMPLETION, true,
       "{\"id\":\"x-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"text\":\"a\\\"\\n\",\"logprobs\":null,\"finish_reason\":\"stop\"}],"
       "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}"},
      {2, OAI_CHAT, false,
       "{\"id\":\"x-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"delta\":{\"role\":\"assistant\",\"content\":\"a\\\"\\n\"},\"logprobs\":null,\"finish_reason\":null}]}"},
      {1, OAI_CHAT, true,
       "{\"id\":\"x-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"delta\":{\"content\":\"a\\\"\\n\"},\"logprobs\":null,\"finish_reason\":\"stop\"}]}"},
      {1, OAI_COMPLETION, false,
       "{\"id\":\"x-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"text\":\"a\\\"\\n\",\"logprobs\":null,\"finish_reason\":null}]}"},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    mj_buf b = {0};
    r.finish_reason = t[i].fin ? "stop" : NULL;
    if (t[i].what == 0) oai_write_response(&b, t[i].kind, &r, 1, r.prompt_tokens, r.completion_tokens);
    else oai_write_chunk(&b, t[i].kind, &r, t[i].what == 2);
    mj_buf_putc(&b, 0);
    T_EQ_STR(b.data, t[i].want);
    mj_buf_free(&b);
  }
  /* /tokenize's and /detokenize's answers */
  mj_buf b = {0};
  const int32_t ids[] = {5, 0, 2147483647};
  oai_write_tokens(&b, ids, 3, 4096);
  oai_write_tokens(&b, ids, 0, 1);
  oai_write_detokenized(&b, "a\"\0b", 4);
  mj_buf_putc(&b, 0);
  T_EQ_STR(b.data, "{\"count\":3,\"max_model_len\":4096,\"tokens\":[5,0,2147483647]}"
                   "{\"count\":0,\"max_model_len\":1,\"tokens\":[]}{\"prompt\":\"a\\\"\\u0000b\"}");
  mj_buf_free(&b);
}

/* Log probabilities byte for byte: chat's content list and completions'
 * legacy arrays, in a response and in a chunk; completions' top object
 * adds the drawn token when it is not among the top and writes a text
 * twice only once; a chunk without a token writes null; below -9999 is
 * -9999. */
static void test_logprob_writers_exact(void) {
  static const oai_token top0[2] = {{"a", 1, -0.25f}, {"\xc3\xa9", 2, -1.5f}};
  static const oai_token top1[3] = {{"\"", 1, -0.5f}, {"", 0, -2.0f}, {"", 0, -3.0f}};
  const oai_logprob lps[2] = {{.tok = {"a", 1, -0.25f}, .top = top0, .n_top = 2, .text_offset = 0},
                              {.tok = {"b", 1, -1e30f}, .top = top1, .n_top = 3, .text_offset = 1}};
  /* a response of both tokens, a chunk of the second, a chunk of none (an
   * end-of-sequence finish: null) */
  static const struct {
    bool chunk;
    oai_kind kind;
    int first, n;
    bool with;
    const char *fin, *text;
    size_t len;
    const char *want;
  } t[] = {
      {false, OAI_CHAT, 0, 2, true, "length", "ab", 2,
       "{\"id\":\"x-1\",\"object\":\"chat.completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"message\":{\"role\":\"assistant\",\"content\":\"ab\"},\"logprobs\":{\"content\":["
       "{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97],\"top_logprobs\":[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97]},"
       "{\"token\":\"\xc3\xa9\",\"logprob\":-1.5,\"bytes\":[195,169]}]},"
       "{\"token\":\"b\",\"logprob\":-9999,\"bytes\":[98],\"top_logprobs\":[{\"token\":\"\\\"\",\"logprob\":-0.5,\"bytes\":[34]},"
       "{\"token\":\"\",\"logprob\":-2,\"bytes\":[]},{\"token\":\"\",\"logprob\":-3,\"bytes\":[]}]}],\"refusal\":null},"
       "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}"},
      {false, OAI_COMPLETION, 0, 2, true, "length", "ab", 2,
       "{\"id\":\"x-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"text\":\"ab\",\"logprobs\":{\"tokens\":[\"a\",\"b\"],\"token_logprobs\":[-0.25,-9999],"
       "\"top_logprobs\":[{\"a\":-0.25,\"\xc3\xa9\":-1.5},{\"\\\"\":-0.5,\"\":-2,\"b\":-9999}],\"text_offset\":[0,1]},"
       "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}"},
      {true, OAI_CHAT, 1, 1, true, NULL, "b", 1,
       "{\"id\":\"x-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"delta\":{\"content\":\"b\"},\"logprobs\":{\"content\":[{\"token\":\"b\",\"logprob\":-9999,\"bytes\":[98],"
       "\"top_logprobs\":[{\"token\":\"\\\"\",\"logprob\":-0.5,\"bytes\":[34]},{\"token\":\"\",\"logprob\":-2,\"bytes\":[]},"
       "{\"token\":\"\",\"logprob\":-3,\"bytes\":[]}]}],\"refusal\":null},\"finish_reason\":null}]}"},
      {true, OAI_COMPLETION, 1, 1, true, NULL, "b", 1,
       "{\"id\":\"x-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"text\":\"b\",\"logprobs\":{\"tokens\":[\"b\"],\"token_logprobs\":[-9999],\"top_logprobs\":[{\"\\\"\":-0.5,\"\":-2,"
       "\"b\":-9999}],\"text_offset\":[1]},\"finish_reason\":null}]}"},
      {true, OAI_COMPLETION, 1, 0, false, "stop", "", 0,
       "{\"id\":\"x-1\",\"object\":\"text_completion\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,"
       "\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"}]}"},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    oai_result r = {.id = "x-1", .created = 7, .model = "m", .text = t[i].text, .text_len = t[i].len,
                    .finish_reason = t[i].fin, .prompt_tokens = 2, .completion_tokens = 2, .with_logprobs = t[i].with,
                    .logprobs = lps + t[i].first, .n_logprobs = (size_t)t[i].n};
    mj_buf b = {0};
    if (t[i].chunk) oai_write_chunk(&b, t[i].kind, &r, false);
    else oai_write_response(&b, t[i].kind, &r, 1, r.prompt_tokens, r.completion_tokens);
    mj_buf_putc(&b, 0);
    T_EQ_STR(b.data, t[i].want);
    mj_buf_free(&b);
  }
}

int main(void) {
  T_RUN(test_completion_fields);
  T_RUN(test_logprob_and_penalty_fields);
  T_RUN(test_chat_fields);
  T_RUN(test_errors);
  T_RUN(test_writers);
  T_RUN(test_writers_exact);
  T_RUN(test_logprob_writers_exact);
  return t_status();
}
