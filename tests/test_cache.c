/* test_cache.c: the on-disk cubin cache without a GPU.
 *
 * Keys (stable across processes, sensitive to every input), the store/load
 * round trip, every read fault being a miss followed by a good entry, eight
 * processes sharing one folder, writers killed mid-store, folders that
 * cannot be written (missing, read-only, full), least-recently-used eviction
 * under the cap, the assert-warm and ro modes, and counters that survive
 * the process.  Scenarios that need a failing or shared state run in child
 * processes; a child's failed checks make it exit non-zero, which the
 * parent checks.
 *
 * Root ignores permission bits, so "read-only" and "full" folders are made
 * with mounts in a private mount namespace (a read-only bind mount, a tiny
 * tmpfs) where the kernel allows it, and with RLIMIT_FSIZE (SIGXFSZ
 * ignored) everywhere; "cannot be created" is a regular file standing where
 * the folder should be.  A scenario the machine cannot set up prints
 * "skip:" and is not counted.
 */
#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "t.h"
#include "t_fs.h"
#include "util.h"

/* The tests' producer: the cache takes whatever its caller names. */
static const cache_producer TEST_PRODUCER = {"0.1.0", "feedfacefeedface", "19.1.7", "13.0", "13.0"};

static void make_key(cache_key *k, int i) {
  cache_key_begin(k, &TEST_PRODUCER);
  cache_key_add(k, "lang", "test");
  cache_key_addf(k, "index", "%d", i);
  cache_key_end(k);
}

/* Deterministic "cubin" bytes for key i: a wrong binary shows as a
 * mismatch. */
static unsigned char *fake_cubin(int i, size_t n) {
  unsigned char *p = mj_xmalloc(n);
  uint32_t x = 2654435761u * (uint32_t)(i + 1);
  for (size_t j = 0; j < n; j++) {
    x = x * 1664525u + 1013904223u;
    p[j] = (unsigned char)(x >> 24);
  }
  return p;
}
static size_t fake_size(int i) { return 1000 + (size_t)(i % 7) * 333; }

static cache_meta fake_meta(int i) {
  cache_meta m = {0};
  snprintf(m.kernel_name, sizeof m.kernel_name, "kernel_%d", i);
  snprintf(m.ptx_version, sizeof m.ptx_version, "8.5");
  m.max_threads = 256;
  m.min_blocks = 2;
  m.regs = 40 + i;
  m.shared_bytes = 1024;
  m.spill_stores = i % 3;
  return m;
}

static void store_i(cache *c, int i) {
  cache_key k;
  make_key(&k, i);
  unsigned char *cb = fake_cubin(i, fake_size(i));
  cache_meta m = fake_meta(i);
  cache_store(c, &k, cb, fake_size(i), &m);
  free(cb);
  cache_key_free(&k);
}

/* 1 hit with the right bytes, 0 miss, -1 hit with wrong bytes. */
static int load_i(cache *c, int i) {
  cache_key k;
  make_key(&k, i);
  cache_blob b;
  bool hit = false;
  mj_err err = {0};
  int r = cache_load(c, &k, &b, &hit, &err);
  cache_key_free(&k);
  mj_err_clear(&err);
  if (r || !hit) return 0;
  unsigned char *want = fake_cubin(i, fake_size(i));
  cache_meta m = fake_meta(i);
  int ok = b.cubin_size == fake_size(i) && memcmp(b.cubin, want, b.cubin_size) == 0 &&
           strcmp(b.meta.kernel_name, m.kernel_name) == 0 && b.meta.regs == m.regs &&
           b.meta.max_threads == 256 && b.meta.min_blocks == 2 &&
           strcmp(b.meta.ptx_version, "8.5") == 0;
  free(want);
  cache_blob_free(&b);
  return ok ? 1 : -1;
}

static cache *open_at(const char *dir, cache_mode mode, uint64_t max) {
  cache_config cfg = {dir, mode, max ? max : CACHE_DEFAULT_MAX, &TEST_PRODUCER};
  cache *c = NULL;
  mj_err err = {0};
  if (cache_open(&cfg, &c, &err)) {
    fprintf(stderr, "cache_open: %s\n", err.msg);
    abort();
  }
  return c;
}

static char *entry_path_i(const char *dir, int i) {
  cache_key k;
  make_key(&k, i);
  char *p = cache_entry_path(dir, k.hex);
  cache_key_free(&k);
  return p;
}

/* Verify every entry under dir; returns the count of entries, adds bad
 * ones to *bad. */
static int verify_all(const char *dir, int *bad) {
  cache_item *items = NULL;
  int n = cache_scan(dir, &items, NULL);
  for (int i = 0; i < n; i++) {
    mj_err e = {0};
    if (cache_verify_file(items[i].path, NULL, NULL, &e)) {
      fprintf(stderr, "bad entry %s: %s\n", items[i].path, e.msg);
      (*bad)++;
    }
    mj_err_clear(&e);
  }
  free(items);
  return n;
}

/* Run fn in a child process with stderr to errfile (if given); returns the
 * child's exit status (or 128 + signal). */
static int in_child(void (*fn)(void *), void *arg, const char *errfile) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (errfile) {
      int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      close(fd);
    }
    t_failures = 0;
    fn(arg);
    fflush(NULL);
    _exit(t_failures ? 1 : 0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- parsing ------------------------------------------------------------------- */
static void test_parse(void) {
  uint64_t v = 0;
  T_CHECK(cache_parse_size("512M", &v) == 0 && v == 512ull << 20);
  T_CHECK(cache_parse_size("2G", &v) == 0 && v == 2ull << 30);
  T_CHECK(cache_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
  T_CHECK(cache_parse_size("3k", &v) == 0 && v == 3072);
  T_CHECK(cache_parse_size("123456", &v) == 0 && v == 123456);
  T_CHECK(cache_parse_size("1T", &v) == 0 && v == 1ull << 40);
  T_CHECK(cache_parse_size("", &v) != 0);
  T_CHECK(cache_parse_size("0", &v) != 0);
  T_CHECK(cache_parse_size("-5M", &v) != 0);
  T_CHECK(cache_parse_size("5X", &v) != 0);
  T_CHECK(cache_parse_size("5MM", &v) != 0);
  T_CHECK(cache_parse_size("99999999999999999999", &v) != 0);
  T_CHECK(cache_parse_size("20000000000T", &v) != 0);
  cache_mode m;
  T_CHECK(cache_parse_mode("assert-warm", &m) == 0 && m == CACHE_ASSERT_WARM);
  T_CHECK(cache_parse_mode("ro", &m) == 0 && m == CACHE_RO);
  T_CHECK(cache_parse_mode("off", &m) == 0 && m == CACHE_OFF);
  T_CHECK(cache_parse_mode("yes", &m) != 0);

  /* The folder: MOEJIT_CACHE_DIR, else XDG, else ~/.cache; the defaults
   * with nothing else set (make check sets MOEJIT_CACHE=off). */
  unsetenv("MOEJIT_CACHE");
  unsetenv("MOEJIT_CACHE_MAX");
  cache_config cfg;
  setenv("MOEJIT_CACHE_DIR", "/x/y", 1);
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  setenv("HOME", "/home/u", 1);
  T_CHECK(cache_config_from_env(&cfg, NULL) == 0);
  T_EQ_STR(cfg.dir, "/x/y");
  unsetenv("MOEJIT_CACHE_DIR");
  T_CHECK(cache_config_from_env(&cfg, NULL) == 0);
  T_EQ_STR(cfg.dir, "/xdg/moejit");
  unsetenv("XDG_CACHE_HOME");
  T_CHECK(cache_config_from_env(&cfg, NULL) == 0);
  T_EQ_STR(cfg.dir, "/home/u/.cache/moejit");
  T_EQ_INT(cfg.max_bytes, CACHE_DEFAULT_MAX);
  T_EQ_INT(cfg.mode, CACHE_ON);
  mj_err err = {0};
  setenv("MOEJIT_CACHE_MAX", "lots", 1);
  T_EQ_INT(cache_config_from_env(&cfg, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "MOEJIT_CACHE_MAX=lots: expected a size such as 512M or 2G");
  mj_err_clear(&err);
  setenv("MOEJIT_CACHE_MAX", "64M", 1);
  setenv("MOEJIT_CACHE", "sometimes", 1);
  T_EQ_INT(cache_config_from_env(&cfg, &err), MJ_EINPUT);
  T_EQ_STR(err.msg, "MOEJIT_CACHE=sometimes: expected on, off, ro or assert-warm");
  mj_err_clear(&err);
  setenv("MOEJIT_CACHE", "ro", 1);
  T_CHECK(cache_config_from_env(&cfg, NULL) == 0);
  T_EQ_INT(cfg.mode, CACHE_RO);
  T_EQ_INT(cfg.max_bytes, 64ull << 20);
  unsetenv("MOEJIT_CACHE");
  unsetenv("MOEJIT_CACHE_MAX");
}

/* ---- keys ----------------------------------------------------------------------- */
/* The baseline key of the sensitivity test; field i (0..) replaced by a
 * different value when vary == i. */
#define KEY_FIELDS 12
static void key_variant(cache_key *k, int vary) {
  cache_producer p = TEST_PRODUCER;
  if (vary == 0) p.moejit = "0.1.1";
  if (vary == 1) p.build_id = "0000000000000000";
  if (vary == 2) p.llvm = "19.1.8";
  if (vary == 3) p.nvrtc = "13.1";
  if (vary == 4) p.nvjitlink = "13.1";
  cache_key_begin(k, &p);
  cache_key_add(k, "lang", "nvrtc");
  cache_key_add(k, "target", vary == 5 ? "sm_90" : "sm_90a");
  cache_key_add(k, "ptx_isa", vary == 6 ? "8.4" : "8.5");
  cache_key_add(k, "option", vary == 7 ? "-std=c++20" : "-std=c++17");
  cache_key_add_hash(k, "source_hash", vary == 8 ? "src2" : "src1", 4);
  cache_key_add(k, "def.HIDDEN", vary == 9 ? "6145" : "6144");
  cache_key_add(k, "entry", vary == 10 ? "f<1>" : "f<2>");
  /* A value with a newline may not pose as two fields. */
  cache_key_add(k, "note", vary == 11 ? "a\nb=c" : "a\\nb=c");
  cache_key_end(k);
}

static void test_key_stable(void) {
  cache_key a, b;
  key_variant(&a, -1);
  key_variant(&b, -1);
  T_EQ_STR(a.hex, b.hex);
  T_CHECK(a.text.len == b.text.len && memcmp(a.text.data, b.text.data, a.text.len) == 0);
  T_EQ_INT(strlen(a.hex), 32);
  /* Another process (a fresh exec, other addresses) makes the same key. */
  char self[1024], cmd[1100], line[128] = "";
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  T_CHECK(n > 0);
  self[n > 0 ? n : 0] = 0;
  snprintf(cmd, sizeof cmd, "'%s' --print-key", self);
  FILE *f = popen(cmd, "r");
  T_CHECK(f && fgets(line, sizeof line, f));
  if (f) pclose(f);
  line[strcspn(line, "\n")] = 0;
  T_EQ_STR(line, a.hex);
  /* The text is line-oriented and starts with the format version. */
  T_CHECK(strncmp(a.text.data, "format=moejit-cubin-cache 1\nmoejit=", 35) == 0);
  T_CHECK(strstr(a.text.data, "\nenv.MOEJIT_NVRTC_FLAGS") != NULL);
  cache_key_free(&a);
  cache_key_free(&b);
}

static void test_key_sensitive(void) {
  char hex[KEY_FIELDS + 1 + 4][33]; /* the baseline, each field, two variables twice */
  int n = 0;
  for (int vary = -1; vary < KEY_FIELDS; vary++) {
    cache_key k;
    key_variant(&k, vary);
    memcpy(hex[n++], k.hex, 33);
    cache_key_free(&k);
  }
  /* Each environment variable that changes generated code: unset, empty
   * and set all differ. */
  const char *vars[] = {"MOEJIT_NVRTC_FLAGS", "MOEJIT_DSL_OPT"};
  for (int v = 0; v < 2; v++) {
    const char *old = getenv(vars[v]);
    char *saved = old ? mj_xstrdup(old) : NULL;
    for (int s = 0; s < 2; s++) {
      setenv(vars[v], s ? "2" : "", 1);
      cache_key k;
      key_variant(&k, -1);
      memcpy(hex[n++], k.hex, 33);
      cache_key_free(&k);
    }
    if (saved) setenv(vars[v], saved, 1);
    else unsetenv(vars[v]);
    free(saved);
  }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (strcmp(hex[i], hex[j]) == 0) {
        t_checks++;
        t_failures++;
        fprintf(stderr, "keys %d and %d are equal: %s\n", i, j, hex[i]);
      }
  T_CHECK(n == KEY_FIELDS + 1 + 4);
}

/* ---- entries ------------------------------------------------------------------------ */
static void test_round_trip(void) {
  const char *dir = t_scratch("rt");
  cache *c = open_at(dir, CACHE_ON, 0);
  T_CHECK(cache_writable(c));
  T_EQ_INT(load_i(c, 1), 0);
  store_i(c, 1);
  T_EQ_INT(load_i(c, 1), 1);
  T_EQ_INT(load_i(c, 2), 0);
  /* The file sits in its fan-out folder and verifies. */
  char *p = entry_path_i(dir, 1);
  cache_meta m;
  char *key = NULL;
  T_EQ_INT(cache_verify_file(p, &m, &key, NULL), 0);
  T_EQ_STR(m.kernel_name, "kernel_1");
  T_CHECK(key && strstr(key, "\nindex=1\n"));
  /* The producer the caller named is in the key and written into the entry. */
  T_CHECK(key && strstr(key, "\nbuild=feedfacefeedface\n"));
  char *bytes = NULL;
  size_t nb = 0;
  T_EQ_INT(mj_read_file(p, &bytes, &nb, NULL), 0);
  const char *want = "moejit 0.1.0 (build feedfacefeedface); LLVM 19.1.7; NVRTC 13.0; nvJitLink 13.0";
  T_CHECK(bytes && memmem(bytes, nb, want, strlen(want)) != NULL);
  free(bytes);
  free(key);
  free(p);
  cache_stats s;
  cache_stats_local(c, &s);
  T_EQ_INT(s.v[CACHE_STAT_disk_hits], 1);
  T_EQ_INT(s.v[CACHE_STAT_misses], 2);
  T_EQ_INT(s.v[CACHE_STAT_stores], 1);
  cache_close(c);
  /* Counters persist: a second process-lifetime adds to them. */
  c = open_at(dir, CACHE_ON, 0);
  T_EQ_INT(load_i(c, 1), 1);
  cache_close(c);
  T_EQ_INT(cache_stats_read(dir, &s, NULL), 0);
  T_EQ_INT(s.v[CACHE_STAT_disk_hits], 2);
  T_EQ_INT(s.v[CACHE_STAT_misses], 2);
  T_EQ_INT(s.v[CACHE_STAT_stores], 1);
}

static void patch_checksum(unsigned char *p, size_t n) {
  mj_hash h = mj_hash128(p, n - 16);
  for (int i = 0; i < 8; i++) p[n - 16 + i] = (unsigned char)(h.lo >> (8 * i));
  for (int i = 0; i < 8; i++) p[n - 8 + i] = (unsigned char)(h.hi >> (8 * i));
}

/* Each fault: damage entry 5's file, expect a miss (counted corrupt when
 * corrupt is set), then a store and a good hit. */
enum { F_FLIP_HEADER, F_FLIP_KEY, F_FLIP_CUBIN, F_FLIP_SUM, F_TRUNC_HALF, F_TRUNC_1,
       F_EMPTY, F_OTHER_KEY, F_GARBAGE, F_VERSION, F_LENGTHS, F_DIR, F_NFAULTS };
static const char *fault_names[] = {"flip header", "flip key", "flip cubin", "flip checksum",
                                    "truncate half", "truncate 1", "empty", "other key",
                                    "garbage", "other format version", "lying lengths",
                                    "folder in place"};

static void test_faults(void) {
  const char *dir = t_scratch("faults");
  for (int f = 0; f < F_NFAULTS; f++) {
    cache *c = open_at(dir, CACHE_ON, 0);
    store_i(c, 5);
    store_i(c, 6);
    char *p5 = entry_path_i(dir, 5), *p6 = entry_path_i(dir, 6);
    unsigned char *d = NULL;
    size_t n = 0;
    T_CHECK(mj_read_file(p5, (char **)&d, &n, NULL) == 0);
    bool corrupt = true;
    switch (f) {
    case F_FLIP_HEADER: d[25] ^= 0x40; break;
    case F_FLIP_KEY: d[80] ^= 1; break;
    case F_FLIP_CUBIN: d[n - 100] ^= 0x80; break;
    case F_FLIP_SUM: d[n - 1] ^= 1; break;
    case F_TRUNC_HALF: n /= 2; break;
    case F_TRUNC_1: n -= 1; break;
    case F_EMPTY: n = 0; break;
    case F_OTHER_KEY: /* entry 6's file under entry 5's name */
      free(d);
      T_CHECK(mj_read_file(p6, (char **)&d, &n, NULL) == 0);
      corrupt = false;
      break;
    case F_GARBAGE: memset(d, 'x', n); break;
    case F_VERSION: d[8] = 2, patch_checksum(d, n); break;
    case F_LENGTHS: d[31] = 0x7f, patch_checksum(d, n); break; /* cubin length 2^62 */
    case F_DIR: break;
    }
    if (f == F_DIR) {
      unlink(p5);
      mkdir(p5, 0755);
    } else {
      T_CHECK(mj_write_file_atomic(p5, d, n, NULL) == 0);
    }
    free(d);
    cache_stats before, after;
    cache_stats_local(c, &before);
    int r = load_i(c, 5);
    cache_stats_local(c, &after);
    if (r != 0) {
      t_checks++;
        t_failures++;
      fprintf(stderr, "fault '%s': load gave %d, want a miss\n", fault_names[f], r);
    }
    T_EQ_INT(after.v[CACHE_STAT_misses] - before.v[CACHE_STAT_misses], 1);
    if (f != F_DIR) {
      T_EQ_INT(after.v[CACHE_STAT_corrupt] - before.v[CACHE_STAT_corrupt], corrupt ? 1 : 0);
      /* A corrupt file is removed at once; another key's entry stays until
       * the store replaces it. */
      T_EQ_INT(access(p5, F_OK) == 0, corrupt ? 0 : 1);
    }
    if (f == F_DIR) rmdir(p5);
    store_i(c, 5);
    if (load_i(c, 5) != 1) {
      t_checks++;
        t_failures++;
      fprintf(stderr, "fault '%s': no good entry after the store\n", fault_names[f]);
    }
    T_EQ_INT(load_i(c, 6), 1);
    free(p5);
    free(p6);
    cache_close(c);
  }
  int bad = 0;
  T_EQ_INT(verify_all(dir, &bad), 2);
  T_EQ_INT(bad, 0);
}

/* ---- concurrency -------------------------------------------------------------------------- */
#define NPROC 8
#define NKEYS 24
#define NOPS 120

static void worker(void *arg) {
  int id = *(int *)arg;
  cache *c = open_at(t_scratch("conc"), CACHE_ON, 0);
  srand((unsigned)id * 7919u + 1);
  for (int op = 0; op < NOPS; op++) {
    int i = rand() % NKEYS;
    int r = load_i(c, i);
    T_CHECK(r != -1); /* never a wrong binary */
    if (r == 0) store_i(c, i);
  }
  cache_close(c);
}

static void test_concurrent(void) {
  pid_t pids[NPROC];
  int ids[NPROC];
  fflush(NULL);
  for (int p = 0; p < NPROC; p++) {
    ids[p] = p;
    pids[p] = fork();
    if (pids[p] == 0) {
      t_failures = 0;
      worker(&ids[p]);
      _exit(t_failures ? 1 : 0);
    }
  }
  for (int p = 0; p < NPROC; p++) {
    int st = 0;
    waitpid(pids[p], &st, 0);
    T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  int bad = 0;
  int n = verify_all(t_scratch("conc"), &bad);
  T_EQ_INT(bad, 0);
  T_CHECK(n <= NKEYS && n >= NKEYS - 2); /* random picks may skip a key or two */
  cache *c = open_at(t_scratch("conc"), CACHE_RO, 0);
  for (int i = 0; i < NKEYS; i++) T_CHECK(load_i(c, i) != -1);
  cache_close(c);
  /* Every process's counts were merged under the lock: nothing lost. */
  cache_stats s;
  cache_stats_read(t_scratch("conc"), &s, NULL);
  T_EQ_INT(s.v[CACHE_STAT_disk_hits] + s.v[CACHE_STAT_misses], NPROC * NOPS + NKEYS);
}

static int killed_done = -1; /* the writer tells the test of each store it finished (a pipe) */

static void killed_writer(void *arg) {
  cache *c = open_at(t_scratch("kill"), CACHE_ON, 0);
  for (int i = 0;; i++) {
    cache_key k;
    make_key(&k, 1000 + i % 16);
    size_t n = (1 + (size_t)(i % 3)) << 20;
    unsigned char *cb = fake_cubin(1000 + i % 16, n);
    cache_meta m = fake_meta(i);
    cache_store(c, &k, cb, n, &m);
    free(cb);
    cache_key_free(&k);
    if (killed_done >= 0 && write(killed_done, "s", 1) != 1) killed_done = -1;
  }
}

static void test_sigkill(void) {
  const char *dir = t_scratch("kill");
  srand((unsigned)time(NULL));
  int total_bad = 0, entries = 0;
  for (int round = 0; round < 30; round++) {
    fflush(NULL);
    int pfd[2];
    T_EQ_INT(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(pfd[0]);
      killed_done = pfd[1];
      killed_writer(NULL);
      _exit(0);
    }
    close(pfd[1]);
    /* Killed at a random time, but after its first store: on a loaded
     * machine a store (1-3 MB and a rename) may take longer than the
     * random delay, and a run in which no writer ever finished one would
     * test nothing (entries > 0 below). */
    struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
    T_CHECK(poll(&pf, 1, 30000) == 1);
    struct timespec ts = {0, (long)(1 + rand() % 40) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    close(pfd[0]);
    int st;
    waitpid(pid, &st, 0);
    T_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    entries = verify_all(dir, &total_bad);
  }
  T_EQ_INT(total_bad, 0);
  T_CHECK(entries > 0);
  /* Leftover temporary files are not entries; prune removes them once
   * they are old. */
  cache_item *items = NULL;
  T_EQ_INT(cache_scan(dir, &items, NULL), entries);
  free(items);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s/v1/00/abc.tmp.XXXXXX", dir);
  mkdir(t_scratch("kill/v1"), 0755);
  mkdir(t_scratch("kill/v1/00"), 0755);
  int fd = mkstemp(tmp);
  T_CHECK(fd >= 0);
  close(fd);
  struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
  utimensat(AT_FDCWD, tmp, old, 0);
  uint64_t removed, freed;
  T_EQ_INT(cache_prune(dir, CACHE_DEFAULT_MAX, &removed, &freed, NULL), 0);
  T_CHECK(access(tmp, F_OK) != 0);
  T_EQ_INT(removed, 0);
}

/* ---- folders that cannot be written ------------------------------------------------------- */
/* In a child, with stderr captured: the cache must keep working in memory
 * and warn exactly once. */
static void keeps_working(void *arg) {
  const char *dir = arg;
  cache *c = open_at(dir, CACHE_ON, 0);
  T_CHECK(!cache_writable(c));
  for (int i = 0; i < 3; i++) {
    T_EQ_INT(load_i(c, 300 + i), 0);
    store_i(c, 300 + i);
    T_EQ_INT(load_i(c, 300 + i), 1);
  }
  cache_close(c);
}

static void test_cannot_create(void) {
  /* A regular file where the folder should be: mkdir fails even for root. */
  const char *file = t_scratch("afile");
  T_CHECK(mj_write_file_atomic(file, "x", 1, NULL) == 0);
  char dir[600], err[600];
  snprintf(dir, sizeof dir, "%s/cache", file);
  snprintf(err, sizeof err, "%s.err", file);
  T_EQ_INT(in_child(keeps_working, dir, err), 0);
  T_EQ_INT(t_count_in(err, "moejit: warning: cache folder"), 1);
  T_EQ_INT(t_count_in(err, "kept in memory only"), 1);
}

/* Private mount namespace, so nothing leaks to the machine. */
static int private_mounts(void) {
  if (unshare(CLONE_NEWNS) != 0) return -1;
  return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

static void readonly_child(void *arg) {
  const char *dir = arg;
  if (private_mounts() != 0 || mount(dir, dir, NULL, MS_BIND, NULL) != 0 ||
      mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
    fprintf(stderr, "no-mount: %s\n", strerror(errno));
    _exit(77);
  }
  /* Entries already there are read; new ones stay in memory. */
  cache *c = open_at(dir, CACHE_ON, 0);
  T_CHECK(!cache_writable(c));
  T_EQ_INT(load_i(c, 7), 1);
  cache_close(c);
  keeps_working((void *)dir);
}

static void test_readonly(void) {
  const char *dir = t_scratch("ro");
  cache *c = open_at(dir, CACHE_ON, 0);
  store_i(c, 7);
  cache_close(c);
  const char *err = t_scratch("ro.err");
  int st = in_child(readonly_child, (void *)dir, err);
  if (st == 77) {
    printf("skip: test_readonly: read-only bind mounts are not permitted here\n");
    return;
  }
  T_EQ_INT(st, 0);
  T_EQ_INT(t_count_in(err, "moejit: warning: cache folder"), 2); /* two opens */
  T_EQ_INT(t_count_in(err, "Read-only file system"), 2);
}

static void fsize_child(void *arg) {
  /* Files may not grow past 8 KiB: the first entry of 10+ KiB fails with
   * EFBIG (SIGXFSZ ignored, as a server would). */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {8192, 8192};
  setrlimit(RLIMIT_FSIZE, &rl);
  cache *c = open_at(arg, CACHE_ON, 0);
  T_CHECK(cache_writable(c)); /* the probe file is empty: fine */
  cache_key k;
  make_key(&k, 400);
  unsigned char *big = fake_cubin(400, 10000);
  cache_meta m = fake_meta(400);
  cache_store(c, &k, big, 10000, &m);
  T_CHECK(!cache_writable(c));
  cache_blob b;
  bool hit = false;
  T_EQ_INT(cache_load(c, &k, &b, &hit, NULL), 0);
  T_CHECK(hit && b.cubin_size == 10000 && memcmp(b.cubin, big, 10000) == 0);
  cache_blob_free(&b);
  free(big);
  cache_key_free(&k);
  for (int i = 0; i < 3; i++) {
    store_i(c, 410 + i);
    T_EQ_INT(load_i(c, 410 + i), 1);
  }
  cache_stats s;
  cache_stats_local(c, &s);
  T_EQ_INT(s.v[CACHE_STAT_failures], 1);
  cache_close(c);
}

static void test_full_fsize(void) {
  const char *err = t_scratch("fsize.err");
  T_EQ_INT(in_child(fsize_child, (void *)t_scratch("fsize"), err), 0);
  T_EQ_INT(t_count_in(err, "moejit: warning: cache folder"), 1);
  T_EQ_INT(t_count_in(err, "File too large"), 1);
  /* Nothing half-written is visible. */
  int bad = 0;
  T_EQ_INT(verify_all(t_scratch("fsize"), &bad), 0);
  T_EQ_INT(bad, 0);
}

static void tmpfs_child(void *arg) {
  const char *dir = arg;
  if (private_mounts() != 0 || mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
    fprintf(stderr, "no-mount: %s\n", strerror(errno));
    _exit(77);
  }
  cache *c = open_at(dir, CACHE_ON, 0);
  T_CHECK(cache_writable(c));
  /* 40 entries of 1-3 KiB overflow 64 KiB: every one stays loadable. */
  for (int i = 0; i < 40; i++) {
    store_i(c, 500 + i);
    T_EQ_INT(load_i(c, 500 + i), 1);
  }
  for (int i = 0; i < 40; i++) T_EQ_INT(load_i(c, 500 + i), 1);
  T_CHECK(!cache_writable(c));
  int bad = 0;
  int n = verify_all(dir, &bad);
  T_CHECK(n > 5 && n < 40);
  T_EQ_INT(bad, 0);
  cache_close(c);
}

static void test_full_tmpfs(void) {
  const char *dir = t_scratch("tiny");
  mkdir(dir, 0755);
  const char *err = t_scratch("tiny.err");
  int st = in_child(tmpfs_child, (void *)dir, err);
  if (st == 77) {
    printf("skip: test_full_tmpfs: mounting a tmpfs is not permitted here\n");
    return;
  }
  T_EQ_INT(st, 0);
  T_EQ_INT(t_count_in(err, "moejit: warning: cache folder"), 1);
  T_EQ_INT(t_count_in(err, "No space left on device"), 1);
}

/* ---- eviction -------------------------------------------------------------------------------- */
static void nap(void) {
  /* File times tick with the kernel's coarse clock (a few ms). */
  struct timespec ts = {0, 30 * 1000000L};
  nanosleep(&ts, NULL);
}

static uint64_t tree_bytes(const char *dir) {
  cache_item *items = NULL;
  int n = cache_scan(dir, &items, NULL);
  uint64_t t = 0;
  for (int i = 0; i < n; i++) t += items[i].size;
  free(items);
  return t;
}

static void test_eviction(void) {
  const char *dir = t_scratch("lru");
  /* Keys 700, 707, 714, ... share i % 7, so their entries have one size:
   * measure it and cap the cache at three and a half entries. */
  cache *c = open_at(dir, CACHE_ON, 0);
  store_i(c, 700);
  cache_close(c);
  uint64_t one = tree_bytes(dir);
  T_CHECK(one > 1000);
  t_rm_rf(dir);
  uint64_t cap = one * 7 / 2;
  c = open_at(dir, CACHE_ON, cap);
  store_i(c, 700), nap();
  store_i(c, 707), nap();
  store_i(c, 714), nap();
  T_EQ_INT(load_i(c, 700), 1); /* 700 is now the most recently used */
  nap();
  store_i(c, 721); /* 4 entries > 3.5: evict to 90% of the cap: one goes */
  T_CHECK(tree_bytes(dir) <= cap);
  T_EQ_INT(load_i(c, 707), 0); /* the least recently used went */
  T_EQ_INT(load_i(c, 700), 1);
  T_EQ_INT(load_i(c, 714), 1);
  T_EQ_INT(load_i(c, 721), 1);
  cache_stats s;
  cache_stats_local(c, &s);
  T_EQ_INT(s.v[CACHE_STAT_evictions], 1);
  /* Many more stores never leave it over the cap. */
  for (int i = 0; i < 30; i++) {
    store_i(c, 728 + 7 * i);
    if (tree_bytes(dir) > cap) {
      t_checks++;
        t_failures++;
      fprintf(stderr, "over the cap after store %d: %llu > %llu\n", i,
              (unsigned long long)tree_bytes(dir), (unsigned long long)cap);
      break;
    }
  }
  T_EQ_INT(load_i(c, 728 + 7 * 29), 1); /* the newest stays */
  cache_close(c);
  /* prune to a smaller cap keeps the newest. */
  uint64_t removed = 0, freed = 0;
  T_EQ_INT(cache_prune(dir, one + one / 2, &removed, &freed, NULL), 0);
  T_CHECK(removed >= 1);
  T_EQ_INT(tree_bytes(dir), one);
  c = open_at(dir, CACHE_RO, 0);
  T_EQ_INT(load_i(c, 728 + 7 * 29), 1);
  cache_close(c);
  T_EQ_INT(cache_clear(dir, &removed, NULL), 0);
  T_EQ_INT(removed, 1);
  T_EQ_INT(tree_bytes(dir), 0);
}

/* ---- modes ------------------------------------------------------------------------------------- */
static void test_modes(void) {
  const char *dir = t_scratch("modes");
  mj_err err = {0};
  /* assert-warm: a miss is an error ... */
  cache *c = open_at(dir, CACHE_ASSERT_WARM, 0);
  cache_key k;
  make_key(&k, 800);
  cache_blob b;
  bool hit = true;
  T_EQ_INT(cache_load(c, &k, &b, &hit, &err), MJ_ECACHE);
  T_CHECK(!hit);
  T_CHECK(strstr(err.msg, "MOEJIT_CACHE=assert-warm: cache miss for key ") == err.msg);
  T_CHECK(strstr(err.msg, k.hex) != NULL);
  mj_err_clear(&err);
  store_i(c, 800); /* assert-warm never stores */
  cache_close(c);
  /* ... ro uses but never stores ... */
  c = open_at(dir, CACHE_RO, 0);
  store_i(c, 800);
  T_EQ_INT(load_i(c, 800), 0);
  cache_close(c);
  T_EQ_INT(tree_bytes(dir), 0);
  /* ... after a warm-up, assert-warm passes. */
  c = open_at(dir, CACHE_ON, 0);
  store_i(c, 800);
  cache_close(c);
  char *p = entry_path_i(dir, 800);
  struct stat before, after;
  stat(p, &before);
  nap();
  c = open_at(dir, CACHE_ASSERT_WARM, 0);
  T_EQ_INT(cache_load(c, &k, &b, &hit, &err), 0);
  T_CHECK(hit);
  cache_blob_free(&b);
  cache_close(c);
  c = open_at(dir, CACHE_RO, 0);
  T_EQ_INT(load_i(c, 800), 1);
  cache_close(c);
  stat(p, &after); /* ro and assert-warm do not touch the entry's time */
  T_CHECK(before.st_mtim.tv_nsec == after.st_mtim.tv_nsec &&
          before.st_mtim.tv_sec == after.st_mtim.tv_sec);
  c = open_at(dir, CACHE_ON, 0);
  T_EQ_INT(load_i(c, 800), 1);
  cache_close(c);
  stat(p, &after); /* on does: least recently used */
  T_CHECK(before.st_mtim.tv_nsec != after.st_mtim.tv_nsec ||
          before.st_mtim.tv_sec != after.st_mtim.tv_sec);
  free(p);
  /* off: nothing read or written. */
  c = open_at(dir, CACHE_OFF, 0);
  T_CHECK(cache_dir(c) == NULL);
  T_EQ_INT(load_i(c, 800), 0);
  store_i(c, 801);
  T_EQ_INT(load_i(c, 801), 0);
  cache_close(c);
  cache_key_free(&k);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--print-key") == 0) {
    cache_key k;
    key_variant(&k, -1);
    printf("%s\n", k.hex);
    cache_key_free(&k);
    return 0;
  }
  if (argc > 3 && strcmp(argv[1], "--populate") == 0) {
    /* For tests/cache_cli.sh: N entries (keys 0..N-1) in DIR. */
    cache *c = open_at(argv[2], CACHE_ON, 0);
    for (int i = 0; i < atoi(argv[3]); i++) store_i(c, i), nap();
    cache_close(c);
    return 0;
  }
  setenv("MOEJIT_LOG", "1", 1);
  if (t_scratch_init("cache")) return 1;
  T_RUN(test_parse);
  T_RUN(test_key_stable);
  T_RUN(test_key_sensitive);
  T_RUN(test_round_trip);
  T_RUN(test_faults);
  T_RUN(test_concurrent);
  T_RUN(test_sigkill);
  T_RUN(test_cannot_create);
  T_RUN(test_readonly);
  T_RUN(test_full_fsize);
  T_RUN(test_full_tmpfs);
  T_RUN(test_eviction);
  T_RUN(test_modes);
  return t_scratch_done(t_status());
}
