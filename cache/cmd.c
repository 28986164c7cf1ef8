/* cmd.c: `moejit cache stats|list|verify|prune|clear`, the user's view of
 * the cubin cache and its tuning records (see cache.h).
 *
 * The command works on the folder the engine would use (the environment,
 * or --dir) and never compiles anything.  Only verify judges entries: it
 * reads each one whole, checks its checksum and layout, reads every tuning
 * record (its check line, its fields, its slot), names every bad file with
 * the reason and exits with MJ_ECACHE when any is bad; the engine itself
 * would only have seen those as misses, or warned once about a record.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cache.h"
#include "cli.h"
#include "kc.h"

static const char *fmt_age(int64_t mtime_ns, char *buf, size_t n) {
  double s = (double)time(NULL) - (double)mtime_ns / 1e9;
  if (s < 0) s = 0;
  if (s < 120) snprintf(buf, n, "%.0fs", s);
  else if (s < 7200) snprintf(buf, n, "%.0fm", s / 60);
  else if (s < 172800) snprintf(buf, n, "%.0fh", s / 3600);
  else snprintf(buf, n, "%.0fd", s / 86400);
  return buf;
}

/* The folder exists (0), does not (1), or is something else (error). */
static int check_dir(const char *dir, mj_err *err) {
  struct stat st;
  if (stat(dir, &st) != 0) return 1;
  if (!S_ISDIR(st.st_mode)) return mj_fail(err, MJ_EIO, "%s: not a folder", dir);
  return 0;
}

static int cache_cmd_stats(const char *dir, const cache_config *cfg, mj_err *err) {
  cache_item *items = NULL;
  int n = cache_scan(dir, &items, err);
  if (n < 0) return MJ_EIO;
  uint64_t bytes = 0, stale = 0;
  for (int i = 0; i < n; i++) {
    bytes += items[i].size;
    stale += !items[i].current;
  }
  free(items);
  cache_stats s;
  cache_stats_read(dir, &s, err);
  char b1[32], b2[32];
  printf("folder          %s (MOEJIT_CACHE=%s)\n", dir, cache_mode_name(cfg->mode));
  printf("entries         %d", n);
  if (stale) printf(" (%llu of an older format, evicted first)", (unsigned long long)stale);
  printf("\nsize            %s of %s cap (%.1f%%)\n", mj_fmt_bytes((double)bytes, b1, sizeof b1),
         mj_fmt_bytes((double)cfg->max_bytes, b2, sizeof b2),
         100.0 * (double)bytes / (double)cfg->max_bytes);
  for (int i = 0; i < CACHE_NSTATS; i++) {
    if (i == CACHE_STAT_compile_us || i == CACHE_STAT_load_us) continue;
    printf("%-16s%llu", cache_stat_desc((cache_stat)i), (unsigned long long)s.v[i]);
    uint64_t us = i == CACHE_STAT_compiles ? s.v[CACHE_STAT_compile_us]
                  : i == CACHE_STAT_loads  ? s.v[CACHE_STAT_load_us]
                                           : 0;
    if (us) printf(" (%.1f ms in all, %.2f ms each)", (double)us / 1e3,
                   (double)us / 1e3 / (double)s.v[i]);
    printf("\n");
  }
  uint64_t lookups = s.v[CACHE_STAT_mem_hits] + s.v[CACHE_STAT_disk_hits] + s.v[CACHE_STAT_misses];
  if (lookups)
    printf("hit rate        %.1f%%\n",
           100.0 * (double)(lookups - s.v[CACHE_STAT_misses]) / (double)lookups);
  return 0;
}

static int by_time(const void *a, const void *b) {
  const cache_item *x = a, *y = b;
  return (x->mtime_ns < y->mtime_ns) - (x->mtime_ns > y->mtime_ns);
}

/* The value of field in a key text ("target" -> "sm_90a"), into out. */
static const char *key_field(const char *key, size_t n, const char *field, char *out, size_t cap) {
  size_t fl = strlen(field);
  out[0] = 0;
  for (const char *p = key; p && p < key + n; p = memchr(p, '\n', (size_t)(key + n - p)), p = p ? p + 1 : NULL)
    if ((size_t)(key + n - p) > fl && strncmp(p, field, fl) == 0 && p[fl] == '=') {
      const char *v = p + fl + 1, *e = memchr(v, '\n', (size_t)(key + n - v));
      snprintf(out, cap, "%.*s", (int)((e ? e : key + n) - v), v);
      break;
    }
  return out;
}

/* Read an entry whole: its metadata, its key's target and the target its
 * cubin's ELF says (kc_cubin_arch); verify holds the two to each other. */
static int read_entry(const char *path, cache_meta *m, char *target, char *elf_arch, mj_err *err) {
  char *data = NULL;
  size_t n = 0;
  if (mj_read_file(path, &data, &n, NULL)) return mj_fail(err, MJ_ECACHE, "cannot read the file");
  const char *key;
  size_t kl, cl;
  const void *cubin;
  int r = cache_entry_decode(data, n, m, &key, &kl, &cubin, &cl, err);
  if (!r) {
    key_field(key, kl, "target", target, 16);
    mj_err e = {0};
    if (kc_cubin_arch(cubin, cl, elf_arch, 16, &e)) snprintf(elf_arch, 16, "?");
    mj_err_clear(&e);
  }
  free(data);
  return r;
}

/* list (verify = false) or verify (true, counting the bad in *nbad). */
static int cache_cmd_entries(const char *dir, bool verify, int *nbad, mj_err *err) {
  cache_item *items = NULL;
  int n = cache_scan(dir, &items, err);
  if (n < 0) return MJ_EIO;
  if (n > 1) qsort(items, (size_t)n, sizeof *items, by_time); /* most recently used first */
  int bad = 0;
  if (!verify && n) printf("%-32s %9s %6s %-8s %s\n", "key", "size", "used", "arch", "kernel");
  for (int i = 0; i < n; i++) {
    cache_meta m;
    mj_err e = {0};
    char target[16] = "", elf[16] = "";
    int r = items[i].current ? read_entry(items[i].path, &m, target, elf, &e)
                             : mj_fail(&e, MJ_ECACHE, "an entry of an older format");
    /* A cubin that is not for its key's target would load on the wrong
     * chip (or fail to): as bad as a torn file.  (Every key the front
     * door writes names its target; the tests' made-up keys do not.) */
    if (r == 0 && target[0] && strcmp(target, elf) != 0)
      r = mj_fail(&e, MJ_ECACHE, "the cubin is for %s, its key says %s", elf, target);
    const char *base = strrchr(items[i].path, '/');
    char key[40], size[32], age[16];
    snprintf(key, sizeof key, "%.2s%s", base - 2, base + 1);
    if (verify) {
      if (r) printf("%s: %s\n", items[i].path, e.msg), bad++;
    } else {
      printf("%-32s %9s %6s %-8s %s\n", key, mj_fmt_bytes((double)items[i].size, size, sizeof size),
             fmt_age(items[i].mtime_ns, age, sizeof age), r == 0 ? target : "-",
             r == 0 ? m.kernel_name : !items[i].current ? "(older format)" : "(bad entry)");
    }
    mj_err_clear(&e);
  }
  free(items);
  if (verify) printf("%d entries checked, %d bad\n", n, bad);
  *nbad = bad;
  return 0;
}

/* The tuning records: after the entries of `list`, a line each and a line
 * for each bad file; for verify (nbad not NULL), each bad file named with
 * its reason and counted in *nbad. */
static int cache_cmd_tuning(const char *dir, int *nbad, mj_err *err) {
  cache_tune *t = NULL;
  mj_buf why = {0};
  int bad = 0, n = cache_tune_scan(dir, &t, &bad, &why, err);
  if (n < 0) return MJ_EIO;
  if (nbad) {
    printf("%s%d tuning records checked, %d bad\n", why.data ? why.data : "", n + bad, bad);
    *nbad = bad;
    mj_buf_free(&why);
    free(t);
    return 0;
  }
  if (n) printf("\ntuning records (moejit warmup --tune), one a kernel and shape:\n");
  for (int i = 0; i < n; i++) {
    char date[32];
    time_t d = (time_t)t[i].date;
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", gmtime_r(&d, &tm));
    printf("%s  %s  winner %s %.1f us  built-in %s %.1f us (%+.1f%%)  %s %s driver %s  %s UTC\n", t[i].family,
           t[i].shape, t[i].choice, t[i].us, t[i].builtin, t[i].builtin_us,
           t[i].builtin_us > 0 ? 100.0 * (t[i].us - t[i].builtin_us) / t[i].builtin_us : 0.0, t[i].gpu, t[i].arch,
           t[i].driver, date);
  }
  if (bad)
    printf("%s%d bad tuning record%s (never used: the engine warns and takes the built-in plan)\n", why.data,
           bad, bad == 1 ? "" : "s");
  mj_buf_free(&why);
  free(t);
  return 0;
}

/* verify: every entry and every tuning record. */
static int cache_cmd_verify(const char *dir, mj_err *err) {
  int be = 0, bt = 0, r = cache_cmd_entries(dir, true, &be, err);
  if (!r) r = cache_cmd_tuning(dir, &bt, err);
  if (r) return r;
  if (be || bt) {
    mj_buf b = {0};
    if (be) mj_buf_printf(&b, "%d bad entr%s (they are misses; `moejit cache prune` or the next compile replaces them)",
                          be, be == 1 ? "y" : "ies");
    if (bt) mj_buf_printf(&b, "%s%d bad tuning record%s (never used; `moejit cache clear --tuning` removes the records)",
                          be ? ", " : "", bt, bt == 1 ? "" : "s");
    mj_fail(err, MJ_ECACHE, "%s: %s", dir, b.data);
    mj_buf_free(&b);
    return MJ_ECACHE;
  }
  return 0;
}

int cmd_cache(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *max = NULL;
  bool tuning = false;
  cli_opt opts[] = {{"dir", 0, CLI_STR, &dir}, {"max", 0, CLI_STR, &max}, {"tuning", 0, CLI_FLAG, &tuning}};
  cli_list pos = {0};
  int r = cli_parse("cache", argc, argv, opts, 3, &pos, err);
  if (r) {
    free(pos.v);
    return r < 0 ? 0 : r;
  }
  const char *sub = pos.n ? pos.v[0] : NULL;
  int npos = pos.n;
  free(pos.v);
  static const char *subs[] = {"stats", "list", "verify", "prune", "clear"};
  int which = -1;
  for (int i = 0; sub && i < 5; i++)
    if (strcmp(sub, subs[i]) == 0) which = i;
  if (!sub)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit cache: name an action: stats, list, verify, prune or clear");
  if (which < 0)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit cache: unknown action '%s' (stats, list, verify, prune or clear)", sub);
  if (npos > 1) return mj_fail(err, MJ_EUSAGE, "moejit cache %s: unexpected argument", sub);
  if (max && which != 3)
    return mj_fail(err, MJ_EUSAGE, "moejit cache %s: --max belongs to prune", sub);
  if (tuning && which != 4)
    return mj_fail(err, MJ_EUSAGE, "moejit cache %s: --tuning belongs to clear", sub);
  cache_config cfg;
  if (cache_config_from_env(&cfg, err)) return MJ_EINPUT;
  if (dir) cfg.dir = dir;
  if (max && cache_parse_size(max, &cfg.max_bytes))
    return mj_fail(err, MJ_EUSAGE, "moejit cache prune: --max expects a size such as 512M or "
                                   "2G, not '%s'", max);
  r = check_dir(cfg.dir, err);
  if (r > 1) return r;
  bool missing = r == 1;
  uint64_t removed = 0, freed = 0;
  char b[32];
  switch (which) {
  case 0:
    return cache_cmd_stats(cfg.dir, &cfg, err);
  case 1:
    if ((r = cache_cmd_entries(cfg.dir, false, &(int){0}, err))) return r;
    return missing ? 0 : cache_cmd_tuning(cfg.dir, NULL, err);
  case 2:
    return cache_cmd_verify(cfg.dir, err);
  case 3:
    if (!missing && cache_prune(cfg.dir, cfg.max_bytes, &removed, &freed, err)) return MJ_EIO;
    printf("removed %llu entr%s (%s) to fit %s\n", (unsigned long long)removed,
           removed == 1 ? "y" : "ies", mj_fmt_bytes((double)freed, b, sizeof b),
           mj_fmt_bytes((double)cfg.max_bytes, (char[32]){0}, 32));
    return 0;
  case 4:
    if (tuning) {
      if (!missing && cache_tune_clear(cfg.dir, &removed, err)) return MJ_EIO;
      printf("removed %llu tuning record%s from %s\n", (unsigned long long)removed, removed == 1 ? "" : "s", cfg.dir);
      return 0;
    }
    if (!missing && cache_clear(cfg.dir, &removed, err)) return MJ_EIO;
    printf("removed %llu entr%s from %s\n", (unsigned long long)removed,
           removed == 1 ? "y" : "ies", cfg.dir);
    return 0;
  }
  return 0;
}
