/* generate.c: `moejit generate`, text from a GLM-5-format model.
 *
 * What every user runs first: load the model folder, encode the prompt
 * (plain, or as a GLM-5 chat with --chat) or each line of --prompts, open
 * a decode session (src/session.c) on the GPU engine when a GPU is present
 * and the model fits its kernels, else on the CPU reference (--backend
 * picks one), and hand both to the one loop (src/generate_loop.c): prompts
 * run, then decode steps of every live sequence, sampling each token and
 * streaming one prompt's text as soon as it forms complete UTF-8, until an
 * end-of-sequence id or -n tokens.  It ends with the prompt and decode
 * speeds (tokens/s), or one JSON record per prompt with --json.  --trace
 * records the shapes of every GPU step (docs/trace.md).
 *
 * Without -m, moejit uses a small synthetic GLM-5 model (mkmodel's `medium`
 * preset with NVFP4 experts, 142 MB: the smallest widths the GPU kernels
 * take, so the same command runs on the GPU where there is one) that it
 * writes into its data folder on first use, so the command works on a
 * fresh machine with no download.  Its weights are random: the text is
 * noise, the machinery is real.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "generate.h"
#include "mkmodel.h"
#include "coll.h"
#include "nccldrv.h"

/* The data folder: MOEJIT_DATA_DIR, else $XDG_DATA_HOME/moejit, else
 * ~/.local/share/moejit. */
static int data_dir(char *buf, size_t n, mj_err *err) {
  const char *d = getenv("MOEJIT_DATA_DIR"), *x = getenv("XDG_DATA_HOME"), *h = getenv("HOME");
  if (d && *d) snprintf(buf, n, "%s", d);
  else if (x && *x) snprintf(buf, n, "%s/moejit", x);
  else if (h && *h) snprintf(buf, n, "%s/.local/share/moejit", h);
  else return mj_fail(err, MJ_EIO, "no data folder for the built-in model: set MOEJIT_DATA_DIR or pass -m DIR");
  return 0;
}

/* Remove a folder of plain files (a model folder mkmodel wrote). */
static void remove_flat_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  char p[4600];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
        snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p)
      unlink(p);
  closedir(d);
  rmdir(path);
}

/* The built-in model's folder, written on first use.  The folder name
 * carries the preset and seed so a future change of the built-in model
 * gets a new folder rather than a stale one. */
static int default_model(char *dir, size_t n, bool quiet, mj_err *err) {
  char base[2048];
  int r = data_dir(base, sizeof base, err);
  if (r) return r;
  if (snprintf(dir, n, "%s/default-medium-nvfp4-s1", base) >= (int)n)
    return mj_fail(err, MJ_EIO, "%s: data folder path too long", base);
  char cfg[4200];
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  struct stat st;
  if (stat(cfg, &st) == 0) return 0;
  if ((r = mj_mkdirs(base, err))) {
    mj_err_clear(err);
    return mj_fail(err, MJ_EIO, "%s: cannot create the data folder for the built-in model (set MOEJIT_DATA_DIR or pass -m DIR)",
                   base);
  }
  mkmodel_spec s;
  mkmodel_preset("medium", &s);
  s.nvfp4 = true;
  s.seed = 1;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  s.threads = ncpu > 8 ? 8 : ncpu > 0 ? ncpu : 1;
  if (!quiet) fprintf(stderr, "moejit: writing the built-in synthetic GLM-5 model (first use) to %s\n", dir);
  /* Written under a temporary name and renamed, so an interrupted first run
   * never leaves a half-written model that later runs would trust. */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
  uint64_t bytes;
  if ((r = mkmodel_write(&s, tmp, true, &bytes, err))) {
    remove_flat_dir(tmp);
    return r;
  }
  if (rename(tmp, dir) != 0) {
    int e = errno;
    /* Several first runs at once: each writes its own copy and the first
     * rename wins (a folder is renamed whole, so readers never see part of
     * one); the others find the winner's model and drop their copy. */
    remove_flat_dir(tmp);
    if (stat(cfg, &st) != 0)
      return mj_fail(err, MJ_EIO, "%s: cannot move the built-in model into place: %s", dir, strerror(e));
  }
  return 0;
}

int cmd_generate(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *prompt = NULL, *system = NULL, *backend = "auto", *graph_s = NULL, *trace_path = NULL,
             *prompts_path = NULL;
  int64_t n_predict = 64, top_k = 0, seed = -1, threads = 0, ctx = 0, parallel = 4, tp = 1, ep = 1;
  double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
  bool chat = false, no_think = false, as_json = false, quiet = false, no_graphs = false;
  cli_opt opts[] = {
      {"model", 'm', CLI_STR, &dir},       {"prompt", 'p', CLI_TEXT, &prompt},
      {"n-predict", 'n', CLI_INT, &n_predict}, {"chat", 0, CLI_FLAG, &chat},
      {"system", 0, CLI_TEXT, &system},     {"no-think", 0, CLI_FLAG, &no_think},
      {"temp", 0, CLI_NUM, &temp},         {"top-k", 0, CLI_INT, &top_k},
      {"top-p", 0, CLI_NUM, &top_p},       {"min-p", 0, CLI_NUM, &min_p},
      {"repeat-penalty", 0, CLI_NUM, &rep}, {"seed", 0, CLI_INT, &seed},
      {"backend", 0, CLI_STR, &backend},   {"json", 0, CLI_FLAG, &as_json},
      {"threads", 't', CLI_INT, &threads}, {"ctx", 'c', CLI_INT, &ctx},
      {"quiet", 'q', CLI_FLAG, &quiet},    {"graph-batches", 0, CLI_STR, &graph_s},
      {"no-graphs", 0, CLI_FLAG, &no_graphs}, {"trace", 0, CLI_STR, &trace_path},
      {"prompts", 0, CLI_STR, &prompts_path}, {"parallel", 0, CLI_INT, &parallel},
      {"tp", 0, CLI_INT, &tp},             {"ep", 0, CLI_INT, &ep},
  };
  int r = cli_parse("generate", argc, argv, opts, (int)MJ_ARRAY_LEN(opts), NULL, err);
  if (r) return r < 0 ? 0 : r;
  if (!prompt && !prompts_path)
    return mj_fail(err, MJ_EUSAGE, "moejit generate: -p TEXT is required (-p - reads stdin; --prompts FILE for many)");
  if (prompt && prompts_path) return mj_fail(err, MJ_EUSAGE, "moejit generate: give -p or --prompts, not both");
  if (parallel < 1 || parallel > 64) return mj_fail(err, MJ_EUSAGE, "moejit generate: --parallel must be 1..64");
  if (n_predict < 0 || n_predict > 1 << 20) return mj_fail(err, MJ_EUSAGE, "moejit generate: -n must be 0..1048576");
  if (threads < 0 || threads > CLI_MAX_THREADS || ctx < 0)
    return mj_fail(err, MJ_EUSAGE, "moejit generate: --threads must be 0 (all cores) to %d, --ctx 0 (as needed) or more",
                   CLI_MAX_THREADS);
  if (temp < 0 || top_p <= 0 || top_p > 1 || min_p < 0 || min_p >= 1 || rep <= 0 || top_k < 0)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit generate: --temp >= 0, --top-p in (0, 1], --min-p in [0, 1), --repeat-penalty > 0, --top-k >= 0");
  if ((system || no_think) && !chat)
    return mj_fail(err, MJ_EUSAGE, "moejit generate: --system and --no-think go with --chat");
  if (strcmp(backend, "cpu") && strcmp(backend, "cuda") && strcmp(backend, "auto"))
    return mj_fail(err, MJ_EUSAGE, "moejit generate: --backend must be auto, cpu or cuda, not '%s'", backend);
  gpu_opts go;
  gpu_opts_default(&go);
  go.use_graphs = !no_graphs;
  if (graph_s) {
    int64_t v[GPU_MAX_GRAPHS];
    int n = mj_parse_i64_list(graph_s, v, GPU_MAX_GRAPHS);
    if (n <= 0)
      return mj_fail(err, MJ_EUSAGE, "moejit generate: --graph-batches wants ascending sizes like 1,2,4,8 (at most %d), not '%s'",
                     GPU_MAX_GRAPHS, graph_s);
    for (int i = 0; i < n; i++) {
      if (v[i] < 1 || v[i] > 1024 || (i && v[i] <= v[i - 1]))
        return mj_fail(err, MJ_EUSAGE, "moejit generate: --graph-batches wants ascending sizes in 1..1024, not '%s'", graph_s);
      go.graph_batches[i] = (int)v[i];
    }
    go.n_graph_batches = n;
  }
  int world;
  if ((r = nc_parallel_check("generate", tp, ep, &world, err))) return r;
  if (world > 1 && ((prompt && strcmp(prompt, "-") == 0) || (prompts_path && strcmp(prompts_path, "-") == 0)))
    return mj_fail(err, MJ_EUSAGE, "moejit generate: with --tp/--ep every rank reads the prompt: give it as text or a file, not stdin");
  /* Several ranks: this process is the launcher (done when the ranks are),
   * or one rank, which runs the session on its share with NCCL. */
  coll *rank_coll = NULL;
  if (world > 1 && ((r = nc_parallel_run("generate", NULL, tp, ep, argc, argv, &rank_coll, err)) || !rank_coll)) return r;

  char defdir[4096];
  if (!dir) {
    if ((r = default_model(defdir, sizeof defdir, quiet || as_json, err))) return r;
    dir = defdir;
  }
  model *m = NULL;
  tok_tokenizer *tok = NULL;
  session *S = NULL;
  gen_seq *s = NULL;
  int np = 0;
  char *data = NULL;
  if ((r = model_load(dir, &m, err))) goto out;
  char tpath[4200];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
  if ((r = tok_load(tpath, &tok, err))) goto out;
  chat_format cf;
  bool have_chat = chat_format_init(&cf, tok, NULL) == 0;
  if (chat && !have_chat && (r = chat_format_init(&cf, tok, err))) goto out;

  /* The prompts: -p's one, or one per non-empty line of --prompts. */
  size_t len = 0;
  const char *src = prompts_path ? prompts_path : prompt;
  if (prompt && strcmp(prompt, "-") != 0) data = mj_xstrdup(prompt), len = strlen(prompt);
  else if ((r = mj_read_file(src, &data, &len, err))) goto out;
  int cap = 16, line = 0;
  s = mj_xcalloc((size_t)cap, sizeof *s);
  size_t longest = 0;
  for (char *p = data, *end = data + len; p <= end;) {
    char *nl = prompts_path ? memchr(p, '\n', (size_t)(end - p)) : NULL;
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    line++;
    if (prompts_path && n && p[n - 1] == '\r') n--;
    if (n || !prompts_path) {
      if (np == cap) s = mj_xrealloc(s, (size_t)(cap *= 2) * sizeof *s), memset(s + np, 0, (size_t)(cap - np) * sizeof *s);
      gen_seq *q = &s[np++];
      if (chat) {
        chat_msg msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (chat_msg){CHAT_SYSTEM, system, strlen(system)};
        msgs[nm++] = (chat_msg){CHAT_USER, p, n};
        r = chat_encode(tok, &cf, msgs, nm, true, !no_think, &q->ids, err);
      } else {
        r = tok_encode(tok, p, n, true, &q->ids, err);
      }
      if (r) goto out;
      if (q->ids.n == 0) {
        r = prompts_path ? mj_fail(err, MJ_EINPUT, "%s:%d: the prompt encodes to no tokens", prompts_path, line)
                         : mj_fail(err, MJ_EINPUT, "moejit generate: the prompt is empty");
        goto out;
      }
      q->n_prompt = q->ids.n;
      longest = q->ids.n > longest ? q->ids.n : longest;
    }
    if (!nl) break;
    p += n + 1 + (p[n] == '\r');
  }
  if (!np) {
    r = mj_fail(err, MJ_EINPUT, "%s: no prompts (one per line)", prompts_path);
    goto out;
  }
  const model_config *c = &m->cfg;
  int64_t need = (int64_t)longest + n_predict, max_ctx = ctx > 0 ? ctx : need;
  if (need > max_ctx || need > c->max_position_embeddings) {
    long long lim = (long long)(max_ctx < c->max_position_embeddings ? max_ctx : c->max_position_embeddings);
    r = prompts_path ? mj_fail(err, MJ_EUSAGE, "moejit generate: the longest prompt (%zu tokens) + -n %lld exceeds the context (%lld)",
                               longest, (long long)n_predict, lim)
                     : mj_fail(err, MJ_EUSAGE, "moejit generate: prompt (%zu tokens) + -n %lld exceeds the context (%lld)",
                               longest, (long long)n_predict, lim);
    goto out;
  }

  gen_opts o = {.n_predict = n_predict, .stream = !prompts_path, .as_json = as_json, .quiet = quiet,
                .model_dir = dir, .cfg = c, .tok = tok, .cf = &cf, .have_chat = have_chat};
  o.sp = sample_defaults();
  o.sp.temperature = (float)temp, o.sp.top_k = (int32_t)top_k, o.sp.top_p = (float)top_p;
  o.sp.min_p = (float)min_p, o.sp.repeat_penalty = (float)rep;
  o.sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)mj_now_ns();
  /* Every rank must draw the same ids (each embeds them next): without
   * --seed they take the launcher's (MOEJIT_RANK_SEED; 0 under mpirun). */
  if (rank_coll && seed < 0) {
    const char *rs = getenv("MOEJIT_RANK_SEED");
    o.sp.seed = rs && *rs ? strtoull(rs, NULL, 10) : 0;
  }
  sess_opts so;
  sess_opts_default(&so);
  if ((r = sess_pick_backend("moejit generate", backend, m, quiet || as_json, &so.backend, err))) goto out;
  if (rank_coll && so.backend != SESS_CUDA) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: --tp/--ep run on GPUs; this model runs on the CPU (--backend cpu)");
    goto out;
  }
  if (trace_path && so.backend != SESS_CUDA) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: --trace records the GPU's MoE shapes; this run is on the CPU");
    goto out;
  }
  so.slots = (int)(parallel < np ? parallel : np);
  so.max_ctx = max_ctx;
  so.threads = (int)(threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN));
  so.gpu = go;
  so.gpu.quiet = quiet || as_json;
  /* the device draws with these filters and the seed */
  so.gpu.sampling = sample_filters(o.sp.temperature, o.sp.top_k, o.sp.top_p, o.sp.min_p, o.sp.seed);
  so.trace_path = rank_coll && rank_coll->rank > 0 ? NULL : trace_path; /* rank 0 records the trace */
  so.model_name = dir;
  if (rank_coll) so.gpu.tp = (int)tp, so.gpu.ep = (int)ep, so.gpu.rank = rank_coll->rank, so.gpu.coll = rank_coll;
  if ((r = sess_create(m, &so, &S, err))) goto out;
  r = gen_run(&o, S, s, np, err);
  if (!r) r = sess_close(S, err);
  else sess_destroy(S);
  S = NULL;
out:
  free(data);
  for (int k = 0; k < np; k++) tok_ids_free(&s[k].ids), mj_buf_free(&s[k].text);
  free(s);
  sess_destroy(S);
  if (tok) tok_destroy(tok);
  if (m) model_free(m);
  coll_destroy(rank_coll);
  return r;
}
