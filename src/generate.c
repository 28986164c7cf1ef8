/* generate.c: `moejit generate`, text from a GLM-5-format model.
 *
 * What every user runs first: load the model folder, encode the prompt
 * (plain, or as a GLM-5 chat with --chat) or each line of --prompts, open
 * the engine of the C API (src/api.c: a decode session on the GPU engine
 * when a GPU is present and the model fits its kernels, else on the CPU
 * reference; --backend picks one) and submit every prompt to it in the
 * one loop (src/generate_loop.c): prompts run, then decode steps of every
 * live sequence, sampling each token and streaming one prompt's text as
 * soon as it forms complete UTF-8, until an end-of-sequence id or -n
 * tokens.  The command is a client of the API like any embedding program;
 * src/api.h gives it the rest (the error record, the context sized from
 * its prompts, the trace and a rank's options).  It ends with the prompt and decode
 * speeds (tokens/s), or one JSON record per prompt with --json.  --trace
 * records the shapes of every GPU step (docs/trace.md).
 *
 * Without -m, moejit uses a small synthetic GLM-5 model (mkmodel's `medium`
 * preset with NVFP4 experts, 142 MB: the smallest widths the GPU kernels
 * take, so the same command runs on the GPU where there is one) that the
 * API writes into its data folder on first use, so the command works on a
 * fresh machine with no download.  Its weights are random: the text is
 * noise, the machinery is real.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "coll.h"
#include "generate.h"
#include "gpu_model.h"
#include "nccldrv.h"

/* The library's error of this thread's last failed API call. */
static int api_fail(mj_err *err) { return mj_fail(err, api_last_code(), "%s", moejit_last_error()); }

int cmd_generate(int argc, char **argv, mj_err *err) {
  const char *dir = NULL, *prompt = NULL, *system = NULL, *backend = "auto", *graph_s = NULL, *trace_path = NULL,
             *prompts_path = NULL;
  int64_t n_predict = 64, top_k = 0, seed = -1, threads = 0, ctx = 0, parallel = 4, tp = 1, ep = 1, chunk = 0;
  double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
  bool chat = false, no_think = false, as_json = false, quiet = false, no_graphs = false, ignore_eos = false;
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
      {"ignore-eos", 0, CLI_FLAG, &ignore_eos}, {"prefill-chunk", 0, CLI_INT, &chunk},
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
  if (chunk < -1 || chunk > 65536)
    return mj_fail(err, MJ_EUSAGE, "moejit generate: --prefill-chunk must be -1 (each prompt whole) to 65536, not %lld",
                   (long long)chunk);
  moejit_open_opts oo;
  moejit_open_opts_init(&oo);
  oo.no_graphs = no_graphs;
  oo.prefill_chunk = (int32_t)chunk;
  int32_t graphs[GPU_MAX_GRAPHS];
  if (graph_s) {
    int64_t v[GPU_MAX_GRAPHS];
    int n = mj_parse_i64_list(graph_s, v, GPU_MAX_GRAPHS);
    if (n <= 0)
      return mj_fail(err, MJ_EUSAGE, "moejit generate: --graph-batches wants ascending sizes like 1,2,4,8 (at most %d), not '%s'",
                     GPU_MAX_GRAPHS, graph_s);
    for (int i = 0; i < n; i++) {
      if (v[i] < 1 || v[i] > 1024 || (i && v[i] <= v[i - 1]))
        return mj_fail(err, MJ_EUSAGE, "moejit generate: --graph-batches wants ascending sizes in 1..1024, not '%s'", graph_s);
      graphs[i] = (int32_t)v[i];
    }
    oo.graph_batch_sizes = graphs, oo.n_graph_batch_sizes = n;
  }
  int world;
  if ((r = nc_parallel_check("generate", tp, ep, &world, err))) return r;
  if (world > 1 && ((prompt && strcmp(prompt, "-") == 0) || (prompts_path && strcmp(prompts_path, "-") == 0)))
    return mj_fail(err, MJ_EUSAGE, "moejit generate: with --tp/--ep every rank reads the prompt: give it as text or a file, not stdin");
  /* Several ranks: this process is the launcher (done when the ranks are),
   * or one rank, which runs the session on its share with NCCL. */
  coll *rank_coll = NULL;
  if (world > 1 && ((r = nc_parallel_run("generate", NULL, tp, ep, argc, argv, &rank_coll, err)) || !rank_coll)) return r;

  gen_opts o = {.n_predict = n_predict, .stream = !prompts_path, .as_json = as_json, .quiet = quiet, .ignore_eos = ignore_eos};
  moejit_sampling_init(&o.sp);
  o.sp.temperature = (float)temp, o.sp.top_k = (int32_t)top_k, o.sp.top_p = (float)top_p;
  o.sp.min_p = (float)min_p, o.sp.repeat_penalty = (float)rep;
  o.sp.seed = seed >= 0 ? seed : (int64_t)(mj_now_ns() & INT64_MAX);
  /* Every rank must draw the same ids (each embeds them next): without
   * --seed they take the launcher's (MOEJIT_RANK_SEED; 0 under mpirun). */
  if (rank_coll && seed < 0) {
    const char *rs = getenv("MOEJIT_RANK_SEED");
    o.sp.seed = rs && *rs ? (int64_t)(strtoull(rs, NULL, 10) & INT64_MAX) : 0;
  }
  oo.backend = !strcmp(backend, "cpu") ? MOEJIT_BACKEND_CPU : !strcmp(backend, "cuda") ? MOEJIT_BACKEND_CUDA : MOEJIT_BACKEND_AUTO;
  bool cpu_ranks = rank_coll && nc_test_cpu_ranks(); /* the test hook: every rank on the CPU (nccldrv.h) */
  if (cpu_ranks) oo.backend = MOEJIT_BACKEND_CPU;
  oo.threads = (int32_t)threads;
  oo.quiet = quiet || as_json;
  oo.default_sampling = o.sp; /* the device draws with these filters and the seed */

  moejit *A = NULL;
  gen_seq *s = NULL;
  int np = 0;
  char *data = NULL;
  if ((r = api_load(dir, &oo, &A, err))) goto out;
  moejit_info info;
  moejit_get_info(A, &info);
  o.model_dir = info.path;
  int32_t *none;
  size_t nnone;
  if (chat && !info.has_chat_template && moejit_chat_template(A, NULL, 0, true, true, &none, &nnone)) {
    r = api_fail(err);
    goto out;
  }

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
      moejit_status st;
      if (chat) {
        char *user = mj_xcalloc(1, n + 1);
        memcpy(user, p, n);
        moejit_message msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (moejit_message){"system", system};
        msgs[nm++] = (moejit_message){"user", user};
        st = moejit_chat_template(A, msgs, nm, true, !no_think, &q->prompt, &q->n_prompt);
        free(user);
      } else {
        st = moejit_tokenize(A, p, n, true, &q->prompt, &q->n_prompt);
      }
      if (st) {
        r = api_fail(err);
        goto out;
      }
      if (q->n_prompt == 0) {
        r = prompts_path ? mj_fail(err, MJ_EINPUT, "%s:%d: the prompt encodes to no tokens", prompts_path, line)
                         : mj_fail(err, MJ_EINPUT, "moejit generate: the prompt is empty");
        goto out;
      }
      longest = q->n_prompt > longest ? q->n_prompt : longest;
    }
    if (!nl) break;
    p += n + 1 + (p[n] == '\r');
  }
  if (!np) {
    r = mj_fail(err, MJ_EINPUT, "%s: no prompts (one per line)", prompts_path);
    goto out;
  }
  int64_t need = (int64_t)longest + n_predict, max_ctx = ctx > 0 ? ctx : need, mp = info.model_context_length;
  if (need > max_ctx || need > mp) {
    long long lim = (long long)(max_ctx < mp ? max_ctx : mp);
    r = prompts_path ? mj_fail(err, MJ_EUSAGE, "moejit generate: the longest prompt (%zu tokens) + -n %lld exceeds the context (%lld)",
                               longest, (long long)n_predict, lim)
                     : mj_fail(err, MJ_EUSAGE, "moejit generate: prompt (%zu tokens) + -n %lld exceeds the context (%lld)",
                               longest, (long long)n_predict, lim);
    goto out;
  }
  bool on_gpu = !strcmp(info.backend, "cuda");
  if (rank_coll && !on_gpu && !cpu_ranks) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: --tp/--ep run on GPUs; this model runs on the CPU (--backend cpu)");
    goto out;
  }
  if (trace_path && !on_gpu) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: --trace records the GPU's MoE shapes; this run is on the CPU");
    goto out;
  }
  /* Paused until every prompt is queued, so the slots they take do not
   * depend on how fast they were submitted (every rank must agree). */
  api_start_opts x = {.context_length = max_ctx + (n_predict == 0), /* -n 0 still draws one token */
                      .trace_path = rank_coll && rank_coll->rank > 0 ? NULL : trace_path, /* rank 0 records the trace */
                      .model_name = info.path, .max_parallel = (int)(parallel < np ? parallel : np), .max_queue = np,
                      .paused = true};
  if (rank_coll) x.tp = (int)tp, x.ep = (int)ep, x.rank = rank_coll->rank, x.coll = rank_coll;
  if ((r = api_start(A, &x, err))) goto out;
  r = gen_run(&o, A, s, np, err);
out:;
  int rc = api_close(A, 0, r ? NULL : err);
  if (!r) r = rc;
  free(data);
  for (int k = 0; k < np; k++) moejit_free(s[k].prompt), tok_ids_free(&s[k].gen), mj_buf_free(&s[k].text);
  free(s);
  coll_destroy(rank_coll);
  return r;
}
