/* util.h: the small pieces every module of moejit uses.
 *
 * Arenas (one per compilation or per loaded file, freed at once), a growable
 * string buffer, the error record that every fallible call fills in, file
 * reading, monotonic time and logging.  Prefix: mj_.
 *
 * Failure kinds are kept apart (style.md, practice 5): user errors fill an
 * mj_err and return non-zero; broken invariants hit MJ_ASSERT, which names
 * the C file and line; library failures (CUDA, NVRTC, nvJitLink, LLVM) are
 * recorded through their module's check macro into an mj_err as well.  The
 * library never calls exit(): only the CLI chooses an exit code.
 */
#ifndef MOEJIT_UTIL_H
#define MOEJIT_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- error codes: one table, every view generated from it ---------------
 * X(name, exit status, description).  The CLI exits with the status of the
 * error it prints; README.md documents the same table (`moejit help exit`). */
#define MJ_ERRORS(X)                                                          \
  X(MJ_OK, 0, "success")                                                      \
  X(MJ_EINPUT, 1, "bad input: a file, kernel source, flag or argument is wrong") \
  X(MJ_EUSAGE, 1, "bad command line")                                         \
  X(MJ_EIO, 2, "a file could not be read or written")                         \
  X(MJ_ENOGPU, 3, "no usable GPU (the command needs one)")                    \
  X(MJ_ECOMPILE, 4, "a kernel failed to compile or link")                     \
  X(MJ_ECUDA, 5, "the CUDA driver reported an error")                         \
  X(MJ_ENOMEM, 6, "out of memory")                                            \
  X(MJ_ECACHE, 7, "the kernel cache refused the request")                     \
  X(MJ_EINTERNAL, 8, "internal error (a bug in moejit)")

typedef enum {
#define X(name, status, desc) name,
  MJ_ERRORS(X)
#undef X
  MJ_NERRORS
} mj_code;

const char *mj_code_name(mj_code c);
const char *mj_code_desc(mj_code c);
int mj_code_exit(mj_code c);

/* The error record.  msg is one line naming the file or argument and what is
 * wrong; detail may hold more lines (a source line with a caret, a compile
 * log) that the CLI prints after it. */
typedef struct mj_err {
  mj_code code;
  char msg[1024];
  char *detail; /* malloc'd, may be NULL */
} mj_err;

/* Fill err (if non-NULL) and return code.  Only the first error is kept, so
 * the innermost, most precise message wins. */
int mj_fail(mj_err *err, mj_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mj_err_set_detail(mj_err *err, const char *detail);
void mj_err_clear(mj_err *err);
/* Print "moejit: msg" and the detail to f. */
void mj_err_print(const mj_err *err, FILE *f);

/* ---- invariants --------------------------------------------------------- */
void mj_assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));
#define MJ_ASSERT(e) ((e) ? (void)0 : mj_assert_fail(#e, __FILE__, __LINE__))

/* ---- memory ------------------------------------------------------------- */
void *mj_xmalloc(size_t n);
void *mj_xcalloc(size_t n, size_t m);
void *mj_xrealloc(void *p, size_t n);
char *mj_xstrdup(const char *s);

/* An arena: bump allocation from large blocks, freed all at once. */
typedef struct mj_arena_block mj_arena_block;
typedef struct mj_arena {
  mj_arena_block *head;
  size_t block_size;
  size_t total;
} mj_arena;

void mj_arena_init(mj_arena *a, size_t block_size);
void *mj_arena_alloc(mj_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *mj_arena_strdup(mj_arena *a, const char *s);
char *mj_arena_strndup(mj_arena *a, const char *s, size_t n);
char *mj_arena_printf(mj_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mj_arena_free(mj_arena *a);

/* ---- string buffer ------------------------------------------------------ */
typedef struct mj_buf {
  char *data;
  size_t len, cap;
} mj_buf;

void mj_buf_put(mj_buf *b, const void *p, size_t n);
void mj_buf_puts(mj_buf *b, const char *s);
void mj_buf_putc(mj_buf *b, char c);
void mj_buf_printf(mj_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mj_buf_vprintf(mj_buf *b, const char *fmt, va_list ap);
char *mj_buf_steal(mj_buf *b); /* NUL-terminated, caller frees */
void mj_buf_free(mj_buf *b);

/* ---- files -------------------------------------------------------------- */
/* Read a whole file (NUL-terminated for convenience). */
int mj_read_file(const char *path, char **data, size_t *len, mj_err *err);
/* Write a whole file atomically: temp file in the same folder, fsync, rename. */
int mj_write_file_atomic(const char *path, const void *data, size_t len,
                         mj_err *err);
/* mkdir -p */
int mj_mkdirs(const char *path, mj_err *err);

/* ---- time --------------------------------------------------------------- */
double mj_now_ms(void); /* monotonic, milliseconds */
uint64_t mj_now_ns(void);

/* ---- logging ------------------------------------------------------------ */
/* MOEJIT_LOG=0..3 (0 quiet, 1 warnings (default), 2 info, 3 debug). */
int mj_log_level(void);
void mj_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mj_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mj_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- parsing helpers for the CLI ---------------------------------------- */
/* Parse a whole string as an integer / float; 0 on success. */
int mj_parse_i64(const char *s, int64_t *out);
int mj_parse_f64(const char *s, double *out);
/* "1,2,4,8" -> array; returns count or -1. */
int mj_parse_i64_list(const char *s, int64_t *out, int max);

/* ---- hashing ------------------------------------------------------------- */
/* XXH3-128 of data; hex writes 2*n lowercase hex digits and a NUL. */
typedef struct { uint64_t lo, hi; } mj_hash;
mj_hash mj_hash128(const void *data, size_t len);
void mj_hash_hex(mj_hash h, char out[33]);

/* Human-readable byte count ("1.5 GiB") into buf. */
const char *mj_fmt_bytes(double bytes, char *buf, size_t n);

/* Progress of a long transfer on stderr: on a terminal a bar redrawn at
 * most 10 times a second (bytes, rate, time left); otherwise nothing until
 * mj_progress_end, which prints one summary line.  quiet: nothing at all. */
typedef struct mj_progress {
  const char *what;
  double total, done, t0, last;
  bool tty, quiet;
} mj_progress;
void mj_progress_begin(mj_progress *p, const char *what, double total_bytes, bool quiet);
void mj_progress_add(mj_progress *p, double bytes);
void mj_progress_end(mj_progress *p);

#define MJ_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The one shape of every library call check (CUDA, NCCL, NVRTC, nvJitLink,
 * LLVM): evaluate call, whose result has type T; unless it equals ok,
 * record it with fail(err, result, "call", __FILE__, __LINE__), which
 * returns the mj_code, and return that code from the enclosing function
 * (MJ_CHECK_RET) or jump to label (MJ_CHECK_GOTO).  Each library names its
 * pair after it: CU_CHECK / CU_CHECK_GOTO (cudrv.h), NC_ (nccldrv.h),
 * NVRTC_ (src/kc.c), JL_ and LLVM_ (codegen/target.c). */
#define MJ_CHECK_RET(T, ok, fail, err, call)                          \
  do {                                                                \
    T mj_r_ = (call);                                                 \
    if (mj_r_ != (ok)) return fail((err), mj_r_, #call, __FILE__, __LINE__); \
  } while (0)
#define MJ_CHECK_GOTO(T, ok, fail, err, call, label)                  \
  do {                                                                \
    T mj_r_ = (call);                                                 \
    if (mj_r_ != (ok)) {                                              \
      fail((err), mj_r_, #call, __FILE__, __LINE__);                  \
      goto label;                                                     \
    }                                                                 \
  } while (0)
#define MJ_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MJ_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
