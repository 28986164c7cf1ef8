/* replay.c: runs a libFuzzer target on given files, without libFuzzer.
 *
 * Each tests/fuzz/fuzz_NAME.c is linked twice: with libFuzzer by
 * scripts/fuzz.sh (make fuzz), and with this main() into
 * tests/fuzz/replay_NAME, an ordinary test program built by make check with
 * the project's compiler and flags (sanitizers included in the sanitizer
 * build).  tests/fuzz_regress.sh replays every input a fuzzer once crashed
 * on (tests/fuzz/regress/NAME-*) and the seed corpus through it, so a fixed
 * finding stays fixed.  Arguments are files or folders (every file in
 * them); a target signals a finding by crashing or aborting. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
  char *data;
  size_t len;
  mj_err err = {0};
  if (mj_read_file(path, &data, &len, &err) != 0) {
    mj_err_print(&err, stderr);
    mj_err_clear(&err);
    return 1;
  }
  LLVMFuzzerTestOneInput((const uint8_t *)data, len);
  free(data);
  printf("ok   %s\n", path);
  return 0;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int status = 0, n = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      struct dirent **list;
      int k = scandir(argv[i], &list, NULL, alphasort);
      for (int j = 0; j < k; j++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], list[j]->d_name);
        if (list[j]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
          status |= run_file(path), n++;
        free(list[j]);
      }
      free(list);
    } else {
      status |= run_file(argv[i]), n++;
    }
  }
  if (!n) fprintf(stderr, "replay: no inputs\n");
  return n ? status : 1;
}
