/* api.h: what the public C API (include/moejit.h, src/api.c) offers the
 * program itself, and never installs.
 *
 * `moejit generate` runs on the public API (moejit_submit, events), but it
 * needs three things an embedding program does not (`moejit serve` needs
 * the first, so that its errors are generate's): the original error
 * record (its exit status and a compile log's detail lines), the context
 * sized from prompts it can only encode once the tokenizer is loaded, and
 * the options of a GPU run that are the command line's business (a shape
 * trace, one rank of a sharded model, requests queued before any runs so
 * every rank schedules them alike).  So opening is split here in two:
 * api_load (model, tokenizer, backend choice: enough to tokenize) and
 * api_start (the session and the engine thread).  moejit_open is the two
 * in a row.  The tests read two counts besides (api_parked_events,
 * api_idle_wakeups).  Prefix: api_.
 */
#ifndef MOEJIT_API_H
#define MOEJIT_API_H

#include "coll.h"
#include "ctl.h"
#include "moejit.h"
#include "util.h"

/* The built-in model's folder into dir (mkmodel's medium preset with NVFP4
 * experts, seed 1, under the data folder: MOEJIT_DATA_DIR, else
 * $XDG_DATA_HOME/moejit, else ~/.local/share/moejit), written there on first
 * use: what moejit_open opens without a folder, and `moejit warmup` warms
 * without -m. */
int api_default_model(char *dir, size_t n, bool quiet, mj_err *err);

/* Load the model folder (NULL: the built-in model) and its tokenizer and
 * pick the backend, checking that it can run the model; no engine yet.
 * err keeps the library's code and message. */
int api_load(const char *dir, const moejit_open_opts *o, moejit **out, mj_err *err);

typedef struct api_start_opts {
  int64_t context_length;  /* 0: the open options' (or the model's, at most 4096) */
  const char *trace_path;  /* GPU: record every step's MoE shapes there (docs/trace.md) */
  const char *model_name;  /* the trace header's model */
  int tp, ep, rank;        /* one rank of a sharded model (docs/multigpu.md), with coll; without
                              ctl (each rank runs its own copy of the requests, as generate's) it
                              needs the open's default_sampling.seed >= 0, shared by the ranks, and
                              the seed of a request without one comes from it and the request's id */
  coll *coll;
  int max_parallel, max_queue; /* > 0: instead of the open options' */
  bool paused;            /* admit nothing until api_resume */
  /* A sharded server's ranks (ctl.h): rank 0 sends each admission, step
   * and retirement to the followers through ctl (follow false); a follower
   * (follow true) takes no requests of its own and replays rank 0's, its
   * draws checked against the tokens rank 0 feeds, until rank 0's end
   * message or an error (api_follow_wait returns it; api_close frees). */
  ctl *ctl;
  bool follow;
} api_start_opts;

/* Create the session on a new engine thread and start it.  On failure the
 * handle stays loaded (api_close frees it). */
int api_start(moejit *m, const api_start_opts *x, mj_err *err);
/* A follower (api_start_opts.follow): wait until its engine has ended, at
 * rank 0's end message or an error; that error (as api_close would give
 * it), or 0.  The handle's counters are then final; api_close frees it. */
int api_follow_wait(moejit *m, mj_err *err);
/* Let a paused engine admit. */
void api_resume(moejit *m);
/* moejit_close with the first error of the engine's life (a failed step,
 * a trace that did not finish) in err. */
int api_close(moejit *m, int drain_ms, mj_err *err);

/* The library's code of this thread's last failed public call (the public
 * status folds several into one). */
mj_code api_last_code(void);

/* Events taken by moejit_poll and parked (kept for their text) in the
 * whole process, every thread and handle: what tests read to see that
 * threads which poll and exit leave none behind. */
size_t api_parked_events(void);

/* The times a moejit_poll of m woke and found no event of its request (nor
 * its timeout): with one condition variable a request, next to none. */
uint64_t api_idle_wakeups(moejit *m);

#endif
