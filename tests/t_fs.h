/* t_fs.h: file-system helpers the tests share: a scratch folder per run
 * (removed when every check passed, kept and named otherwise), paths in it,
 * stderr captured into a file, and counting a text in a file (to check that
 * a warning came exactly once). */
#ifndef MOEJIT_T_FS_H
#define MOEJIT_T_FS_H

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static char t_root[256];

static inline int t_rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st, (void)flag, (void)f;
  return remove(p);
}
static inline void t_rm_rf(const char *p) { nftw(p, t_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Make $TMPDIR/moejit-test-NAME-XXXXXX; 0 on success. */
static inline int t_scratch_init(const char *name) {
  const char *tmp = getenv("TMPDIR");
  snprintf(t_root, sizeof t_root, "%s/moejit-test-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
  if (mkdtemp(t_root)) return 0;
  perror(t_root);
  return -1;
}

/* Remove the scratch folder if the run passed (status 0), else name it. */
static inline int t_scratch_done(int status) {
  if (status == 0) t_rm_rf(t_root);
  else fprintf(stderr, "scratch folder kept: %s\n", t_root);
  return status;
}

/* t_root/name (eight results live at once). */
static inline const char *t_scratch(const char *name) {
  static char buf[8][512];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 512, "%s/%s", t_root, name);
  return p;
}

static int t_saved_stderr = -1;
static inline void t_stderr_to(const char *file) {
  fflush(stderr);
  t_saved_stderr = dup(2);
  int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  close(fd);
}
static inline void t_stderr_back(void) {
  fflush(stderr);
  dup2(t_saved_stderr, 2);
  close(t_saved_stderr);
}

/* How many times needle occurs in file (-1: unreadable). */
static inline int t_count_in(const char *file, const char *needle) {
  char *text = NULL;
  size_t n = 0;
  if (mj_read_file(file, &text, &n, NULL)) return -1;
  int c = 0;
  for (char *p = text; (p = strstr(p, needle)); p += strlen(needle)) c++;
  free(text);
  return c;
}

#endif
