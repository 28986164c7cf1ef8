/* tokenize_cmd.c: `moejit tokenize`, which prints the tokens of a text one
 * per line or as JSON, as llama.cpp's llama-tokenize does; --chat wraps the
 * text as one user turn of the GLM-5 chat prompt.  Kept out of libmoejit.a
 * with the other command-line code (it prints; the library never does). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "json.h"
#include "tokenizer.h"

int cmd_tokenize(int argc, char **argv, mj_err *err) {
  const char *model_dir = NULL, *file = NULL;
  bool ids_only = false, pieces = false, chat = false, json_out = false, no_think = false;
  cli_opt opts[] = {
      {"model", 'm', CLI_STR, &model_dir}, {"tokenizer", 0, CLI_STR, &file},
      {"ids", 0, CLI_FLAG, &ids_only},     {"pieces", 0, CLI_FLAG, &pieces},
      {"chat", 0, CLI_FLAG, &chat},        {"no-think", 0, CLI_FLAG, &no_think},
      {"json", 0, CLI_FLAG, &json_out},
  };
  cli_list pos = {0};
  int r = cli_parse("tokenize", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), &pos, err);
  if (r) {
    free(pos.v);
    return r < 0 ? 0 : r;
  }
  char *path = NULL, *text = NULL;
  size_t text_len = 0;
  tok_tokenizer *t = NULL;
  tok_ids ids = {0};
  if (!model_dir == !file) {
    r = mj_fail(err, MJ_EUSAGE, "moejit tokenize: give exactly one of -m DIR and --tokenizer FILE.json");
  } else if (pos.n != 1) {
    r = mj_fail(err, MJ_EUSAGE, "moejit tokenize: give one TEXT argument, or - to read stdin");
  } else if (ids_only && pieces) {
    r = mj_fail(err, MJ_EUSAGE, "moejit tokenize: --ids and --pieces exclude each other");
  } else if (no_think && !chat) {
    r = mj_fail(err, MJ_EUSAGE, "moejit tokenize: --no-think needs --chat");
  }
  if (r) goto done;
  if (model_dir) {
    mj_buf b = {0};
    mj_buf_printf(&b, "%s/tokenizer.json", model_dir);
    path = mj_buf_steal(&b);
  } else {
    path = mj_xstrdup(file);
  }
  if ((r = tok_load(path, &t, err))) goto done;
  if (strcmp(pos.v[0], "-") == 0) {
    if ((r = mj_read_file("-", &text, &text_len, err))) goto done;
  } else {
    text = mj_xstrdup(pos.v[0]);
    text_len = strlen(text);
  }
  if (chat) {
    chat_format cf;
    if ((r = chat_format_init(&cf, t, err))) goto done;
    chat_msg m = {CHAT_USER, text, text_len};
    r = chat_encode(t, &cf, &m, 1, true, !no_think, &ids, err);
  } else {
    r = tok_encode(t, text, text_len, true, &ids, err);
  }
  if (r) goto done;
  mj_buf out = {0};
  if (json_out) {
    mj_buf_puts(&out, "{\"ids\":[");
    for (size_t i = 0; i < ids.n; i++) mj_buf_printf(&out, "%s%d", i ? "," : "", ids.v[i]);
    mj_buf_puts(&out, "]");
    if (pieces) {
      mj_buf_puts(&out, ",\"pieces\":[");
      for (size_t i = 0; i < ids.n; i++) {
        size_t len;
        const char *p = tok_piece(t, ids.v[i], &len);
        if (i) mj_buf_putc(&out, ',');
        json_write_str(&out, p ? p : "", p ? len : 0);
      }
      mj_buf_puts(&out, "]");
    }
    mj_buf_puts(&out, "}\n");
  } else {
    for (size_t i = 0; i < ids.n; i++) {
      size_t len;
      const char *p = tok_piece(t, ids.v[i], &len);
      if (pieces) {
        /* Pieces are written as in the vocabulary (byte-level text: a
         * space is Ġ, a newline Ċ), so each fits on one line. */
        mj_buf_put(&out, p ? p : "", p ? len : 0);
        mj_buf_putc(&out, '\n');
      } else {
        mj_buf_printf(&out, "%d\n", ids.v[i]);
      }
    }
  }
  fwrite(out.data ? out.data : "", 1, out.len, stdout);
  mj_buf_free(&out);
done:
  free(pos.v);
  free(path);
  free(text);
  tok_ids_free(&ids);
  tok_destroy(t);
  return r;
}
