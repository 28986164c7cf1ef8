/* cli.c: the command table's views and the option parser every command
 * uses (cli.h).  Part of the program, not of libmoejit.a: the library below
 * the commands takes its options as structs, never as argv.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

const cli_command_def cli_commands[] = {
#define X(name, summary, usage) {#name, summary, usage, cmd_##name},
    MJ_COMMANDS(X)
#undef X
    {NULL, NULL, NULL, NULL},
};

const cli_command_def *cli_command(const char *name) {
  for (const cli_command_def *c = cli_commands; c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

void cli_usage(const char *cmd, FILE *f) {
  size_t n = strcspn(cmd, " "); /* "trace synth": the usage of trace */
  for (const cli_command_def *c = cli_commands; c->name; c++)
    if (strlen(c->name) == n && strncmp(c->name, cmd, n) == 0) {
      fprintf(f, "%s: %s\nusage: %s", c->name, c->summary, c->usage);
      return;
    }
}

static const cli_opt *find_long(const cli_opt *opts, int n, const char *name, size_t len) {
  for (int i = 0; i < n; i++)
    if (opts[i].long_name && strlen(opts[i].long_name) == len &&
        memcmp(opts[i].long_name, name, len) == 0)
      return &opts[i];
  return NULL;
}

static int set_opt(const char *cmd, const cli_opt *o, const char *shown, const char *val,
                   mj_err *err) {
  switch (o->kind) {
  case CLI_FLAG:
    *(bool *)o->out = true;
    return 0;
  case CLI_STR:
    if (!*val) return mj_fail(err, MJ_EUSAGE, "moejit %s: %s needs a value, not an empty string", cmd, shown);
    *(const char **)o->out = val;
    return 0;
  case CLI_TEXT:
    *(const char **)o->out = val;
    return 0;
  case CLI_INT:
    if (mj_parse_i64(val, (int64_t *)o->out))
      return mj_fail(err, MJ_EUSAGE, "moejit %s: %s expects an integer, not '%s'", cmd, shown, val);
    return 0;
  case CLI_NUM:
    if (mj_parse_f64(val, (double *)o->out))
      return mj_fail(err, MJ_EUSAGE, "moejit %s: %s expects a number, not '%s'", cmd, shown, val);
    return 0;
  case CLI_MULTI: {
    cli_list *l = o->out;
    l->v = mj_xrealloc(l->v, (size_t)(l->n + 1) * sizeof *l->v);
    l->v[l->n++] = val;
    return 0;
  }
  }
  return 0;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, int nopts,
              cli_list *pos, mj_err *err) {
  bool only_pos = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (only_pos || a[0] != '-' || strcmp(a, "-") == 0) {
      if (!pos)
        return mj_fail(err, MJ_EUSAGE, "moejit %s: unexpected argument '%s'", cmd, a);
      pos->v = mj_xrealloc(pos->v, (size_t)(pos->n + 1) * sizeof *pos->v);
      pos->v[pos->n++] = a;
      continue;
    }
    if (strcmp(a, "--") == 0) {
      only_pos = true;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      cli_usage(cmd, stdout);
      return -1;
    }
    const cli_opt *o = NULL;
    const char *val = NULL;
    char shown[64];
    if (a[1] == '-') {
      const char *eq = strchr(a + 2, '=');
      size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
      o = find_long(opts, nopts, a + 2, len);
      snprintf(shown, sizeof shown, "--%.*s", (int)len, a + 2);
      if (!o) return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s' (see moejit %s --help)", cmd, shown, cmd);
      if (eq) {
        if (o->kind == CLI_FLAG)
          return mj_fail(err, MJ_EUSAGE, "moejit %s: %s takes no value", cmd, shown);
        val = eq + 1;
      }
    } else {
      for (int k = 0; k < nopts; k++)
        if (opts[k].short_name == a[1]) o = &opts[k];
      snprintf(shown, sizeof shown, "-%c", a[1]);
      if (!o) return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s' (see moejit %s --help)", cmd, a, cmd);
      if (a[2]) {
        if (o->kind == CLI_FLAG)
          return mj_fail(err, MJ_EUSAGE, "moejit %s: unknown option '%s'", cmd, a);
        val = a + 2; /* -DNAME=1, -o/x */
      }
    }
    if (o->kind != CLI_FLAG && !val) {
      if (i + 1 >= argc)
        return mj_fail(err, MJ_EUSAGE, "moejit %s: %s needs a value", cmd, shown);
      val = argv[++i];
    }
    int r = set_opt(cmd, o, shown, val, err);
    if (r) return r;
  }
  return 0;
}

