/* cli.h: the moejit command table and the option parser (src/cli.c).
 *
 * Every subcommand is one row of MJ_COMMANDS: its name, a one-line summary
 * and its usage text.  `moejit help`, the dispatcher and each command's
 * --help are all generated from the table, so adding a command is one row
 * plus its cmd_NAME function (in the file of the module it belongs to).
 * A command returns 0 or an mj_code with err filled; it never exits.
 */
#ifndef MOEJIT_CLI_H
#define MOEJIT_CLI_H

#include "util.h"

#define MJ_COMMANDS(X)                                                        \
  X(help, "show the commands, or the usage of one",                           \
    "moejit help [COMMAND]\n"                                                 \
    "  moejit help exit   lists the exit codes\n")                           \
  X(version, "print the versions of moejit, LLVM, NVRTC, nvJitLink and the driver", \
    "moejit version [--json]\n")                                             \
  X(compile, "compile a DSL kernel to LLVM IR, PTX or a cubin",              \
    "moejit compile FILE.k [-D NAME=VALUE]... [--arch sm_90a] [--emit llvm|ptx|cubin]\n" \
    "               [-o OUT] [-O 0..3] [--repeat N] [-q] [-v]\n"                  \
    "  FILE.k may also name a built-in template (gemv_bf16_b.k).\n"          \
    "  -D NAME=VALUE  binds a specialisation constant (repeatable)\n"        \
    "  --arch         the target, default sm_90a (a wrong one is answered with the list)\n" \
    "  --emit         llvm, ptx (default without -o) or cubin (default with -o)\n" \
    "  --repeat N     compile N times, report the median time\n"             \
    "  -v             also print nvJitLink's log (the ptxas report)\n"       \
    "  MOEJIT_DUMP=tokens,ast,llvm-raw,llvm,ptx prints those stages to stderr\n") \
  X(bench, "GPU benchmarks: time kernels against the measured copy bandwidth", \
    "moejit bench gemv [--n N] [--k K] [--configs THREADS:ROWS:UNROLL,...] \n" \
    "moejit bench moe [--batches 1,2,4,...] [--gu-configs ROWS:THREADS:CHAIN:GX[:PF[:MINB[:MMA[:XG]]]],...]\n" \
    "                 [--dn-configs ROWS:THREADS:CHAIN:GX[:PF[:MINB[:MMA[:XG]]]],...] [--mt N] [--sets N] [--copies N]\n" \
    "                 [--check-tokens N] [--experts E] [--hidden H] [--inter I] [--plan builtin|tuned] [--seed S]\n" \
    "moejit bench decode [-m DIR | --synthetic glm5 [--layers N] [--dense D]] [--batch 1,8,32]\n" \
    "                 [--ctx N] [--steps N] [--reps N] [--seed S] [--no-graphs] [--profile-region]\n" \
    "                 [--tp N] [--ep M] [--rank R] [--allreduce-us US] [--head-whole] [--max-ctx N]\n" \
    "  gemv: the decode step's GEMV, gemv_bf16_b.k, at B = 1 (default N = K = 8192), one row\n" \
    "  per tile THREADS:ROWS:UNROLL, checked against the CPU reference, then timed\n" \
    "  decode: the whole GLM-5 step (default: 18 full-width layers, 3 dense, random\n" \
    "  weights made on the GPU), graph and eager times, per-op breakdown, roofline share\n" \
    "  --rank R: with --tp/--ep, only rank R's share on this one GPU, its collectives NCCL\n" \
    "  calls with a world of one, and a projection for all ranks at --allreduce-us a collective\n") \
  X(replay, "replay a shape trace on the MoE kernels: what it compiles, how fast it runs", \
    "moejit replay FILE.jsonl [-m DIR | --synthetic glm5] [--dry-run] [--verify] [--steps]\n" \
    "              [--json] [--arch ARCH] [--copies N] [--reps N] [--verify-max N]\n" \
    "              [--verify-tokens N] [--layers N] [--ctx N] [--seed S]\n" \
    "  FILE.jsonl      a trace from moejit generate --trace or moejit trace synth (docs/trace.md)\n" \
    "  --dry-run       no GPU needed: the trace's capacity buckets, and whether each bucket's\n" \
    "                  MoE kernels are in the disk cache already (cached) or not (compile)\n" \
    "  --arch ARCH     the target --dry-run asks about (default: the trace's, else sm_90a)\n" \
    "  (default)       on the GPU: every step's MoE records run on the recorded expert row\n" \
    "                  counts (gate_up, down, combine; router and route once per bucket);\n" \
    "                  per bucket: compile or cache status, median kernel times, GB/s and\n" \
    "                  % of the copy bandwidth measured in the same run\n" \
    "  --synthetic glm5  random NVFP4 experts at GLM-5's widths (the default)\n" \
    "  -m DIR          the weights of the checkpoint's first MoE layer\n" \
    "  --copies N      weight copies the timed launches rotate over (default 4; L2 hygiene)\n" \
    "  --reps N        timed replays per record (default 5; the median is kept)\n" \
    "  --verify        each distinct record shape (at most --verify-max, default 50) against\n" \
    "                  the CPU reference on --verify-tokens tokens (default 2); rel err <= 1e-2,\n" \
    "                  else exit 4 (the kernels compiled but compute the wrong thing)\n" \
    "  --steps         whole decode steps of a synthetic GLM-5 (--layers N, default the trace's,\n" \
    "                  at most 18) at each recorded batch size, graph or eager as recorded\n" \
    "  --json          one JSON object instead of the tables\n")               \
  X(tokenize, "print the tokens of a text (ids, pieces or JSON)",            \
    "moejit tokenize (-m DIR | --tokenizer FILE.json) [--ids|--pieces] [--chat [--no-think]]\n" \
    "                [--json] TEXT|-\n"                                        \
    "  -m DIR            a model folder: uses DIR/tokenizer.json\n"             \
    "  --tokenizer FILE  a tokenizer.json\n"                                    \
    "  --ids             one token id per line (the default)\n"                 \
    "  --pieces          one token per line as the vocabulary writes it (Ġ is a space)\n" \
    "  --chat            wrap TEXT as a user turn of the GLM-5 chat prompt\n"    \
    "  --no-think        with --chat: end with <|assistant|></think>\n"         \
    "  --json            {\"ids\":[...]} (and \"pieces\" with --pieces)\n"         \
    "  TEXT              the text, or - to read it from stdin\n") \
  X(generate, "generate text from a GLM-5-format model (streams tokens, reports speed)", \
    "moejit generate [-m DIR] (-p TEXT|- | --prompts FILE [--parallel P]) [-n N] [--ignore-eos] [--chat]\n" \
    "                [--system TEXT] [--no-think]\n" \
    "                [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n" \
    "                [--seed S] [--backend auto|cpu|cuda] [--graph-batches 1,2,4,..] [--no-graphs]\n" \
    "                [--threads T] [--ctx N] [--prefill-chunk N] [--trace FILE.jsonl] [--json] [-q]\n" \
    "                [--tp N] [--ep M]\n" \
    "  -m DIR       a Hugging Face GLM-5 folder (config.json, safetensors, tokenizer.json);\n" \
    "               without it, a built-in synthetic model written to the data folder\n" \
    "               (MOEJIT_DATA_DIR, else $XDG_DATA_HOME/moejit) on first use\n" \
    "  -p TEXT      the prompt; -p - reads it from stdin\n"                   \
    "  --prompts F  one prompt per line of F (- : stdin), decoded together, P at a time\n" \
    "               (--parallel, default 4): a finished sequence's slot takes the next\n" \
    "               prompt at once; the texts are printed in order (or a JSON line each)\n" \
    "  -n N         generate at most N tokens (default 64); stops early on an eos id\n" \
    "  --ignore-eos an eos id does not stop a sequence: N tokens each (benchmarks;\n" \
    "               the server's ignore_eos)\n" \
    "  --chat       format as a GLM-5 chat: [gMASK]<sop><|system|>..<|user|>..<|assistant|>\n" \
    "  --no-think   with --chat: answer without the thinking block\n"       \
    "  --temp T     0 is greedy (default 0.8); --top-k 0 and --top-p 1 turn those off\n" \
    "  --seed S     makes sampling reproducible\n"                           \
    "  --backend    auto (the GPU when one is present and the model fits its kernels,\n" \
    "               else the CPU), cpu, or cuda (the GPU or an error)\n"      \
    "  --graph-batches  batch sizes captured as CUDA graphs (default 1,2,4,8,16,32,64)\n" \
    "  --no-graphs  run every step eagerly (for comparison)\n"             \
    "  --prefill-chunk N  prompt tokens a step takes beside the decoding sequences' rows,\n" \
    "               so a long prompt is fed in parts while they go on (default 0: the rows\n" \
    "               left below an engine step's, at least half of them; 32 on the CPU);\n" \
    "               -1: each prompt whole, a step of its own\n" \
    "  --trace F    record each step's MoE shapes to F (docs/trace.md; GPU only)\n" \
    "  --json       print one JSON record instead of streaming\n"             \
    "  --tp N --ep M  tensor / expert parallel over max(N, M) GPUs, one process each\n" \
    "               (each 1 or that number; docs/multigpu.md; not yet run on several GPUs)\n")           \
  X(serve, "serve the model over HTTP: OpenAI's completion and chat API, metrics", \
    "moejit serve [-m DIR] [--host 127.0.0.1] [--port 8000] [--parallel P]\n" \
    "             [--api-key KEY] [--api-key-file F] [--served-model-name NAME]\n" \
    "             [--backend auto|cpu|cuda] [--max-queue N] [--max-body BYTES] [--ctx N]\n" \
    "             [--shutdown-timeout S] [--max-connections N] [--idle-timeout S]\n" \
    "             [--request-timeout S] [--threads T] [--prefill-chunk N] [--tp N] [--ep M] [-q]\n" \
    "  routes: POST /v1/completions, POST /v1/chat/completions (stream true: server-sent\n" \
    "  events), GET /v1/models[/ID], GET /health, GET /version, GET /metrics (Prometheus),\n" \
    "  POST /tokenize, POST /detokenize; docs/serve.md\n" \
    "  -m DIR             a GLM-5 folder; without it, the built-in model (as moejit generate)\n" \
    "  --port 0           an ephemeral port; the stderr line 'listening on http://HOST:PORT'\n" \
    "                     names the one bound\n" \
    "  --parallel P       sequences decoded at once, every client's batched together (default 4)\n" \
    "  --api-key KEY      /v1/ routes want 'Authorization: Bearer KEY' (else 401); with\n" \
    "                     neither key flag, $MOEJIT_API_KEY\n" \
    "  --api-key-file F   more keys, one a line (# comments), kept out of the process list\n" \
    "  --served-model-name NAME  the model's id in /v1/models and answers, and the one requests\n" \
    "                     may name (default: the model folder's last component)\n" \
    "  --max-queue N      requests waiting for a slot (default 256); past it 503 + Retry-After\n" \
    "  --max-body BYTES   a request body's limit (default 1048576); past it 413\n" \
    "  --ctx N            tokens a sequence may hold (default: the model's, at most 4096)\n" \
    "  --shutdown-timeout S  on SIGTERM/SIGINT: new requests 503, running ones get S s\n" \
    "                     (default 10), the rest are cancelled; then exit 0\n" \
    "  --max-connections N  open connections (default 128)\n" \
    "  --idle-timeout S   close a connection silent for S s (default 60)\n" \
    "  --request-timeout S  a request's headers and body must arrive within S s (default 30)\n" \
    "  --prefill-chunk N  prompt tokens a step takes beside the decoding sequences' rows\n" \
    "                     (as moejit generate; default 0, the rule; -1: each prompt whole)\n" \
    "  --tp N --ep M      tensor / expert parallel over max(N, M) GPUs, one process each: rank 0\n" \
    "                     serves and the others replay its steps (docs/multigpu.md; not yet run\n" \
    "                     on several GPUs); SIGTERM to this process stops them all in order\n") \
  X(warmup, "compile every kernel a deployment needs into the cache, ahead of serving", \
    "moejit warmup [-m DIR | --synthetic glm5 [--layers N] [--dense D]] [--batches 1,2,4,..]\n" \
    "              [--trace FILE.jsonl] [--arch sm_90a] [-j N] [--ctx N] [--no-graphs] [-q]\n" \
    "              [--tp N] [--ep M] [--tune]\n" \
    "  obtains through the front door every kernel the decode steps of the batch\n" \
    "  sizes (default 1,2,4,8,16,32,64, or the sizes a trace ran) need; no GPU is\n" \
    "  needed with --arch (sm_90a, or Blackwell: sm_100a, sm_120, sm_120a, never run);\n" \
    "  with a GPU of the target it also captures the graphs.  Without -m or\n" \
    "  --synthetic: the built-in model, as generate and serve open it.\n" \
    "  -j N splits the compiles between N processes; --tp/--ep: every rank's kernels\n" \
    "  --tune (GPU): first times the candidate tiles of the MoE expert kernels per\n" \
    "  bucket and of the dense GEMVs per shape and row block, stores the winners in\n" \
    "  the cache (`moejit cache list` shows them) and warms them\n") \
  X(info, "load and validate a GLM-5 checkpoint folder and summarise it",     \
    "moejit info -m DIR [--json] [--tp N --ep M [--rank R]] [--read]\n"     \
    "  checks config.json, hf_quant_config.json and every safetensors header,\n" \
    "  then prints layers, widths, experts, quantisation, bytes, and whether\n" \
    "  the GPU decode engine takes the model (and why not); with --tp/--ep, the\n" \
    "  weight bytes each GPU would hold (docs/multigpu.md); --read drops the\n" \
    "  checkpoint from the page cache, reads rank R's share (default 0) as its\n" \
    "  upload will, and says how many bytes came from storage\n"               \
    "moejit info --preset glm5 [--layers 78] [--dense 3] [--tp N] [--ep M] [--rank R] [--gpu-mem 141]\n" \
    "  will it fit, from the config alone: weights a GPU, KV cache bytes a token\n" \
    "  a GPU, and the tokens of context left on a GPU of --gpu-mem GB\n")     \
  X(mkmodel, "write a synthetic GLM-5 checkpoint (Hugging Face / ModelOpt layout)", \
    "moejit mkmodel --out DIR [--preset tiny|small|medium|glm5] [--layers N]\n"     \
    "       [--dense-layers N] [--experts E] [--experts-per-tok K]\n"        \
    "       [--n-group G] [--topk-group T] [--shared-experts S]\n"           \
    "       [--index-topk K] [--indexer-types FSF..] [--vocab V] [--merges M]\n" \
    "       [--seed S] [--nvfp4] [--shard-size BYTES] [--threads T] [--force] [-q]\n" \
    "       or: moejit mkmodel --out DIR --config config.json [--seed S] [--nvfp4] ...\n" \
    "  deterministic for a seed; --nvfp4 quantises the routed experts;\n" \
    "  --config writes random weights for that config.json, copied as is\n")   \
  X(forward, "run token ids through the CPU reference (or the GPU engine), greedy decode", \
    "moejit forward -m DIR --tokens ID,ID,... [--steps N] [--feed ID,ID,...] [--logits FILE]\n" \
    "               [--backend cpu|cuda] [--choices FILE] [--threads T] [--absorbed]\n" \
    "  prefill the ids, then N greedy decode steps; prints tokens and timings;\n" \
    "  --feed: the steps take these ids instead of their own argmax (N = their\n" \
    "  count unless --steps); --logits: float32 [prompt + N][vocab] of every row;\n" \
    "  --choices (GPU): each row's experts and DSA selection, a JSON line per row\n") \
  X(cache, "show and manage the on-disk cubin cache",                         \
    "moejit cache stats|list|verify|prune|clear [--dir DIR] [--max SIZE] [--tuning]\n"   \
    "  stats    counters (all runs) and size against the cap\n"              \
    "  list     entries, most recently used first: key, size, age, target, kernel;\n" \
    "           then the tuning records (moejit warmup --tune)\n"            \
    "  verify   check every entry's checksum and its cubin's target, and every tuning\n" \
    "           record (check line, fields, slot); exit 7 if any is bad\n"       \
    "  prune    evict least recently used entries down to the cap\n"         \
    "           (MOEJIT_CACHE_MAX, default 2G, or --max SIZE: 512M, 2G)\n"   \
    "  clear    remove every entry (the counters and the tuning records stay);\n" \
    "           clear --tuning removes the tuning records only\n"           \
    "  --dir DIR  the cache folder (default: MOEJIT_CACHE_DIR, else\n"       \
    "             $XDG_CACHE_HOME/moejit, else ~/.cache/moejit)\n")      \
  X(trace, "make and check shape traces (which MoE shapes decode steps use)",  \
    "moejit trace synth -o FILE [--experts 256] [--topk 8] [--batch B] [--steps N]\n" \
    "                   [--skew zipf:S|uniform] [--seed X] [--layers L] [--hidden H] [--inter I]\n" \
    "moejit trace check FILE [--ep M]\n"                                      \
    "  synth  a synthetic trace: B rows a step (default 1), N steps (default 16),\n" \
    "         L MoE layers from layer 3 (default 1); each row picks topk distinct\n" \
    "         experts, the expert of popularity rank r with weight 1/r^S (default\n" \
    "         uniform); deterministic for a seed\n"                            \
    "  check  validate a trace and summarise it: steps, rows, buckets, experts;\n" \
    "         --ep M: the experts and rows of the busiest of M expert-parallel ranks\n" \
    "  the format: docs/trace.md\n")

#define X(name, summary, usage) int cmd_##name(int argc, char **argv, mj_err *err);
MJ_COMMANDS(X)
#undef X

/* The table as data, ending with a NULL name; one command by name (NULL if
 * there is none). */
typedef struct cli_command_def {
  const char *name, *summary, *usage;
  int (*fn)(int argc, char **argv, mj_err *err);
} cli_command_def;
extern const cli_command_def cli_commands[];
const cli_command_def *cli_command(const char *name);

/* Print a command's usage (from the table) to f. */
void cli_usage(const char *cmd, FILE *f);

/* A small option parser with clear errors.  Options are declared in a table;
 * cli_parse fills the values and collects positional arguments.  An unknown
 * option, a missing value or a bad number is an MJ_EUSAGE error naming the
 * command and the option.  "--help" makes cli_parse print the usage and
 * return -1: the command then returns 0 (`if (r) return r < 0 ? 0 : r;`).
 * CLI_STR values (paths, names) must not be empty; CLI_TEXT (a prompt) may
 * be.  CLI_NUM refuses NaN and infinities. */
/* The most threads a --threads option accepts. */
#define CLI_MAX_THREADS 1024

typedef enum { CLI_FLAG, CLI_STR, CLI_TEXT, CLI_INT, CLI_NUM, CLI_MULTI } cli_kind;
typedef struct cli_opt {
  const char *long_name; /* "arch" for --arch */
  char short_name;       /* 'o' for -o, or 0 */
  cli_kind kind;
  void *out; /* bool*, const char** (STR, TEXT), int64_t*, double*, or cli_list* */
} cli_opt;
typedef struct cli_list {
  const char **v;
  int n;
} cli_list; /* CLI_MULTI: every occurrence (caller frees v) */

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts,
              int nopts, cli_list *positional, mj_err *err);

#endif
