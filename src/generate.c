/* generate.c: `moejit generate`, text from a GLM-5-format model.
 *
 * The loop every user runs first: load the model folder, encode the prompt
 * (plain, or as a GLM-5 chat with --chat), prefill it, then decode one token
 * at a time, sampling each from the logits and streaming its text as soon
 * as it forms complete UTF-8, until an end-of-sequence id or -n tokens.  It
 * ends with the prompt and decode speeds (tokens/s), or one JSON record with
 * --json.  The backend is the GPU decode engine (src/gpu_model.c) when a
 * GPU is present and the model fits its kernels, else the CPU reference
 * forward (src/cpu_forward.c); --backend picks one.  On the GPU the prompt
 * runs as steps of up to the largest captured batch of rows, decode steps
 * as the batch-1 graph, and sampling happens on the device (the sampled id
 * is the only read-back) unless a repetition penalty needs the host's
 * sampler and the logits.
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

#include "config.h"
#include "chat.h"
#include "cli.h"
#include "generate.h"
#include "cpu_forward.h"
#include "gpu_model.h"
#include "json.h"
#include "mkmodel.h"
#include "model.h"
#include "nccldrv.h"
#include "sample.h"
#include "tokenizer.h"
#include "trace.h"

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

/* The forward pass behind the loop: one of the two backends. */
typedef struct gen_backend {
  cpu_model *cm;
  gpu_model *gm;
  bool host_sample; /* the GPU's logits come back and the host samples */
  float *rows_logits; /* GPU: [max rows][vocab] for host sampling */
  trace_writer *trace; /* --trace: each step's shapes */
  int64_t steps;
  int32_t *routing;    /* [layers][max rows][topk] */
  int topk, n_experts;
} gen_backend;

/* One step's record: rows, the size it ran as, per MoE layer the rows of
 * each expert the real rows chose, the bucket and the kernels' keys. */
static int trace_step_out(gen_backend *b, int n, mj_err *err) {
  bool graph;
  int np = gpu_padded(b->gm, n, &graph), L = gpu_layers(b->gm), K = b->topk, max = gpu_max_rows(b->gm);
  int r = gpu_read_routing(b->gm, b->routing, err);
  if (r) return r;
  char keys[MOE_NK][33];
  if ((r = gpu_moe_keys(b->gm, np, keys, err))) return r;
  trace_moe *mo = mj_xcalloc((size_t)L, sizeof *mo);
  int32_t *cnt = mj_xcalloc((size_t)b->n_experts, 4), *buf = mj_xmalloc((size_t)L * 2 * b->n_experts * 4);
  int nm = 0;
  for (int l = 0; l < L; l++) {
    if (!gpu_layer_sparse(b->gm, l)) continue;
    memset(cnt, 0, (size_t)b->n_experts * 4);
    for (int i = 0; i < n * K; i++) {
      int e = b->routing[((size_t)l * max) * K + i];
      if (e >= 0 && e < b->n_experts) cnt[e]++;
    }
    trace_moe *t = &mo[nm++];
    t->layer = l, t->bucket = np;
    t->expert = buf + (size_t)l * 2 * b->n_experts, t->rows = t->expert + b->n_experts;
    for (int e = 0; e < b->n_experts; e++)
      if (cnt[e]) t->expert[t->n] = e, t->rows[t->n++] = cnt[e];
    t->nkernels = MOE_NK;
    for (int k = 0; k < MOE_NK; k++) memcpy(t->kernels[k], keys[k], 33);
  }
  trace_step st = {b->steps++, n, graph ? np : 0, nm, mo};
  r = trace_write_step(b->trace, &st, err);
  free(mo), free(cnt), free(buf);
  return r;
}

/* Run tokens[0..n) at positions pos..; leave the last token's logits in
 * logits (CPU, or GPU with host sampling) or its sampled id in *id (GPU). */
static int run(gen_backend *b, const int32_t *tokens, int64_t n, int64_t pos, int64_t vocab, float *logits, int32_t *id,
               mj_err *err) {
  if (b->cm) return cpu_forward(b->cm, tokens, n, pos, logits, false, err);
  int max = gpu_max_rows(b->gm);
  int32_t slot[1024], p[1024], out[1024];
  for (int64_t i0 = 0; i0 < n; i0 += max) {
    int k = (int)(n - i0 < max ? n - i0 : max);
    for (int i = 0; i < k; i++) slot[i] = 0, p[i] = (int32_t)(pos + i0 + i);
    bool last = i0 + k == n;
    int r = gpu_step(b->gm, tokens + i0, slot, p, k, out, last && b->host_sample ? b->rows_logits : NULL, err);
    if (!r && b->trace) r = trace_step_out(b, k, err);
    if (r) return r;
    if (last) {
      *id = out[k - 1];
      if (b->host_sample) memcpy(logits, b->rows_logits + (size_t)(k - 1) * vocab, (size_t)vocab * sizeof *logits);
    }
  }
  return 0;
}

/* --backend: cuda, cpu, or auto (the GPU when there is one and the model
 * fits its kernels; otherwise the CPU, saying why unless quiet). */
static bool pick_gpu(const char *backend, const model *m, bool quiet) {
  if (strcmp(backend, "auto") != 0) return strcmp(backend, "cuda") == 0;
  mj_err e = {0};
  bool gpu = cu_init(&e) == 0;
  mj_err_clear(&e);
  if (gpu && gpu_model_supports(m, &e)) {
    gpu = false;
    if (!quiet) fprintf(stderr, "moejit: running on the CPU: %s\n", e.msg);
    mj_err_clear(&e);
  }
  return gpu;
}

static char *read_prompt(const char *p, size_t *len, mj_err *err) {
  if (strcmp(p, "-") != 0) {
    *len = strlen(p);
    return mj_xstrdup(p);
  }
  char *data;
  if (mj_read_file("-", &data, len, err)) return NULL;
  return data;
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
  if (prompts_path && trace_path)
    return mj_fail(err, MJ_EUSAGE, "moejit generate: --trace records a single prompt's run (not --prompts)");
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
  if (world > 1) return nc_parallel_run("generate", NULL, tp, ep, argc, argv, err);

  char defdir[4096];
  if (!dir) {
    if ((r = default_model(defdir, sizeof defdir, quiet || as_json, err))) return r;
    dir = defdir;
  }
  size_t plen = 0;
  char *ptext = NULL;
  if (prompt && !(ptext = read_prompt(prompt, &plen, err))) return MJ_EIO;

  model *m = NULL;
  tok_tokenizer *tok = NULL;
  gen_backend be = {0};
  sampler *smp = NULL;
  float *logits = NULL;
  tok_ids ids = {0};
  mj_buf text = {0}, piece = {0};
  if ((r = model_load(dir, &m, err))) goto out;
  char tpath[4200];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
  if ((r = tok_load(tpath, &tok, err))) goto out;
  chat_format cf;
  bool have_chat = chat_format_init(&cf, tok, NULL) == 0;
  if (chat && !have_chat && (r = chat_format_init(&cf, tok, err))) goto out;
  if (prompts_path) {
    gen_many_opts mo = {.prompts_path = prompts_path, .parallel = (int)parallel, .n_predict = n_predict, .ctx = ctx,
                        .chat = chat, .no_think = no_think, .as_json = as_json, .quiet = quiet, .system = system,
                        .go = go, .threads = (int)(threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN))};
    mo.sp = sample_defaults();
    mo.sp.temperature = (float)temp, mo.sp.top_k = (int32_t)top_k, mo.sp.top_p = (float)top_p;
    mo.sp.min_p = (float)min_p, mo.sp.repeat_penalty = (float)rep;
    mo.sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)mj_now_ns();
    mo.go.quiet = quiet || as_json;
    mo.go.sampling = mo.sp; /* the device reads the filters and the seed */
    mo.gpu = pick_gpu(backend, m, quiet || as_json);
    r = generate_many(&mo, m, tok, &cf, have_chat, err);
    goto out;
  }
  if (chat) {
    chat_msg msgs[2];
    size_t nm = 0;
    if (system) msgs[nm++] = (chat_msg){CHAT_SYSTEM, system, strlen(system)};
    msgs[nm++] = (chat_msg){CHAT_USER, ptext, plen};
    if ((r = chat_encode(tok, &cf, msgs, nm, true, !no_think, &ids, err))) goto out;
  } else if ((r = tok_encode(tok, ptext, plen, true, &ids, err))) {
    goto out;
  }
  if (ids.n == 0) {
    r = mj_fail(err, MJ_EINPUT, "moejit generate: the prompt is empty");
    goto out;
  }
  const model_config *c = &m->cfg;
  int64_t need = (int64_t)ids.n + n_predict;
  cpu_params cp = {.max_ctx = ctx > 0 ? ctx : need, .threads = (int)(threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN))};
  if (need > cp.max_ctx || need > c->max_position_embeddings) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: prompt (%zu tokens) + -n %lld exceeds the context (%lld)", ids.n,
                (long long)n_predict, (long long)(cp.max_ctx < c->max_position_embeddings ? cp.max_ctx : c->max_position_embeddings));
    goto out;
  }
  bool gpu = pick_gpu(backend, m, quiet || as_json);
  if (trace_path && !gpu) {
    r = mj_fail(err, MJ_EUSAGE, "moejit generate: --trace records the GPU's MoE shapes; this run is on the CPU");
    goto out;
  }
  if (gpu) {
    go.trace = trace_path != NULL;
    go.slots = 1;
    go.max_ctx = cp.max_ctx;
    go.quiet = quiet || as_json;
    go.sampling = sample_filters((float)temp, (int32_t)top_k, (float)top_p, (float)min_p,
                                 seed >= 0 ? (uint64_t)seed : mj_now_ns());
    if ((r = gpu_model_create(m, &go, &be.gm, err))) goto out;
    be.host_sample = rep != 1.0;
    if (be.host_sample) be.rows_logits = mj_xmalloc((size_t)gpu_max_rows(be.gm) * c->vocab_size * sizeof(float));
    backend = "cuda";
    if (trace_path) {
      const cu_device *dv = cu_dev();
      trace_header th = {.version = TRACE_VERSION, .hidden = (int)c->hidden_size, .inter = (int)c->moe_intermediate_size,
                         .n_experts = (int)c->n_routed_experts, .topk = (int)c->num_experts_per_tok,
                         .n_group = (int)c->n_group, .topk_group = (int)c->topk_group,
                         .layers = (int)c->num_hidden_layers};
      snprintf(th.moejit_version, sizeof th.moejit_version, "%s", PACKAGE_VERSION);
      snprintf(th.model, sizeof th.model, "%s", dir);
      snprintf(th.device, sizeof th.device, "%.127s", dv->name);
      snprintf(th.arch, sizeof th.arch, "%s", dv->arch);
      be.topk = th.topk, be.n_experts = th.n_experts;
      be.routing = mj_xmalloc((size_t)gpu_layers(be.gm) * gpu_max_rows(be.gm) * be.topk * 4);
      if ((r = trace_open(trace_path, &th, &be.trace, err))) goto out;
    }
  } else {
    if ((r = cpu_model_create(m, &cp, &be.cm, err))) goto out;
    backend = "cpu";
  }
  sample_params sp = sample_defaults();
  sp.temperature = (float)temp;
  sp.top_k = (int32_t)top_k;
  sp.top_p = (float)top_p;
  sp.min_p = (float)min_p;
  sp.repeat_penalty = (float)rep;
  sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)mj_now_ns();
  smp = sample_create(&sp, (int32_t)c->vocab_size);
  logits = mj_xmalloc((size_t)c->vocab_size * sizeof *logits);

  size_t n_prompt = ids.n;
  double t0 = mj_now_ms();
  int32_t next = 0; /* the device's sampled id (GPU without host sampling) */
  bool dev_sample = be.gm && !be.host_sample;
  if ((r = run(&be, ids.v, (int64_t)ids.n, 0, c->vocab_size, logits, &next, err))) goto out;
  double t_prompt = mj_now_ms() - t0;
  tok_stream ts;
  tok_stream_init(&ts, tok, true);
  const char *stop = "length";
  int64_t n_gen = 0;
  double t1 = mj_now_ms();
  for (;;) {
    int32_t id = dev_sample ? next : sample_next(smp, logits, ids.v, ids.n);
    bool eos = have_chat ? chat_is_eos(&cf, id) : false;
    for (int i = 0; i < c->n_eos; i++) eos |= id == c->eos_token_id[i];
    if (eos) {
      stop = "eos";
      break;
    }
    tok_ids_push(&ids, id);
    n_gen++;
    piece.len = 0;
    if (tok_decode_stream(&ts, id, &piece)) {
      mj_buf_put(&text, piece.data, piece.len);
      if (!as_json) {
        fwrite(piece.data, 1, piece.len, stdout);
        fflush(stdout);
      }
    }
    if (n_gen >= n_predict) break;
    if ((r = run(&be, &id, 1, (int64_t)ids.n - 1, c->vocab_size, logits, &next, err))) goto out;
  }
  double t_decode = mj_now_ms() - t1;
  piece.len = 0;
  if (tok_stream_finish(&ts, &piece)) {
    mj_buf_put(&text, piece.data, piece.len);
    if (!as_json) fwrite(piece.data, 1, piece.len, stdout);
  }
  double pps = n_prompt / (t_prompt / 1000.0), dps = n_gen > 0 ? n_gen / (t_decode / 1000.0) : 0;
  if (as_json) {
    mj_buf j = {0};
    mj_buf_puts(&j, "{\"text\":");
    json_write_str(&j, text.data ? text.data : "", text.len);
    mj_buf_printf(&j, ",\"tokens\":[");
    for (size_t i = n_prompt; i < ids.n; i++) mj_buf_printf(&j, "%s%d", i > n_prompt ? "," : "", ids.v[i]);
    mj_buf_printf(&j, "],\"prompt_tokens\":%zu,\"generated_tokens\":%lld,\"stop\":\"%s\",\"backend\":\"%s\","
                      "\"prompt_ms\":%.3f,\"decode_ms\":%.3f,\"prompt_tokens_per_s\":%.2f,\"decode_tokens_per_s\":%.2f,\"model\":",
                  n_prompt, (long long)n_gen, stop, backend, t_prompt, t_decode, pps, dps);
    json_write_str(&j, dir, strlen(dir));
    mj_buf_puts(&j, "}\n");
    fputs(j.data, stdout);
    mj_buf_free(&j);
  } else {
    printf("\n");
    fflush(stdout);
    if (!quiet)
      fprintf(stderr, "moejit: prompt %zu tokens in %.1f ms (%.1f tok/s), generated %lld tokens in %.1f ms (%.2f tok/s), stop: %s, backend %s\n",
              n_prompt, t_prompt, pps, (long long)n_gen, t_decode, dps, stop, backend);
  }
  r = 0;
out:
  free(ptext);
  free(logits);
  tok_ids_free(&ids);
  mj_buf_free(&text);
  mj_buf_free(&piece);
  if (smp) sample_destroy(smp);
  if (be.cm) cpu_model_destroy(be.cm);
  if (be.trace) {
    mj_err te = {0};
    if (trace_close(be.trace, &te) && !r) r = te.code, *err = te;
    else mj_err_clear(&te);
  }
  free(be.routing);
  if (be.gm) gpu_model_destroy(be.gm);
  free(be.rows_logits);
  if (tok) tok_destroy(tok);
  if (m) model_free(m);
  return r;
}
