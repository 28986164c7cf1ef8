/* api.c: the public C API (include/moejit.h): a model, its tokenizer and
 * one engine thread that owns the decode session.
 *
 * The engine thread is the only one that touches the session (src/session.h),
 * so the session needs no lock and a GPU context is bound once, on that
 * thread.  Every other thread talks to it through one mutex: submit appends
 * to a bounded FIFO wait queue, cancel sets a flag, and the engine, at each
 * step boundary, retires what was cancelled, admits waiting requests into
 * free slots one at a time, then runs one step: a row of every decoding
 * sequence and, beside them, the next part of the prompts being fed
 * (chunked prefill: prefill_chunk, or the rule at prefill_budget), oldest
 * admission first, so a long prompt no longer stalls the sequences already
 * decoding; a prompt's sequence draws nothing (sess_hold) until the part
 * that ends its prompt, so its tokens equal those of the prompt run whole.
 * A sharded engine (followers replay rank 0's messages, ctl.h) and
 * prefill_chunk < 0 run each prompt whole as a step of its own.
 * With nothing to do it sleeps on a condition variable that submit,
 * cancel and close signal: no polling anywhere.
 *
 * Locking.  The handle's `lock` guards the wait queue, the table of the
 * requests the handle knows (by id: a hash table, so poll, cancel and
 * release find theirs in constant time), each request's state, flags and
 * queue of untaken events, and the counters.  `tok_lock` guards the
 * tokenizer.  The engine thread alone touches the session, the slots'
 * owners and a running request's decoding state, without a lock.  Four
 * kinds of condition variable wait on `lock`: `work` (the engine waiting
 * for work; api_start waiting for the engine), a polled request's own `cv`
 * (its poller waiting for its next event: a token wakes that poller and no
 * other, so a step of n sequences costs n wakeups, not n times the
 * pollers), `waker_cv` (a second thread, the waker, given a step's pollers
 * by the engine thread once the next step is queued on the device, and
 * waking them while that step runs; it signals them outside the lock, see
 * waker_main and on_queued), and
 * `closing_cv`, broadcast only while moejit_close runs (close waiting for
 * the engine to run dry and for the pollers to leave).
 *
 * A drawn token becomes text through the tokenizer's streaming decoder
 * (which holds back an unfinished UTF-8 character); the text then waits in
 * a per-request buffer while its end could still be the start of a stop
 * string, so a stop string split over several tokens is found whole and
 * never returned.  A request with logprobs draws on the host (sess_admit's
 * rule) and its token events carry the session's log probabilities of the
 * draw, copied into the request (a callback's) or into the queued event's
 * one block (a polled one's), as its text is.  Events go to the request's
 * callback (on the engine thread, without the lock held, so a callback may
 * submit or cancel) or to its queue, which moejit_poll drains; a taken
 * event is parked with the polling thread until that thread's next call
 * on the handle, which is how its text outlives the request it belonged to.  The parking place is the
 * thread's own (a pthread key: no lock, nothing to search, and a thread
 * that exits frees what it parked), so threads that come and go, as a
 * server's connections do, leave nothing behind.  Prompts are encoded on
 * the submitting thread, under a lock of their own (the tokenizer's word
 * cache is not thread-safe), so a long prompt never stalls the engine.
 *
 * Errors: the library's mj_err (util.h) inside, folded into the public
 * status table at the boundary, with the message kept per thread.
 */
#include "api.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "config.h"
#include "cudrv.h"
#include "gpu_model.h"
#include "jit.h"
#include "mkmodel.h"
#include "model.h"
#include "sample.h"
#include "session.h"
#include "tokenizer.h"

static void *waker_main(void *arg);
static void waker_stop(moejit *a);

/* ---- errors ------------------------------------------------------------------------ */
static __thread struct {
  mj_code code;
  char msg[1024];
} last_err;

const char *moejit_last_error(void) { return last_err.msg; }
mj_code api_last_code(void) { return last_err.code; }

static const char *const status_names[] = {
#define X(name, desc) #name,
    MOEJIT_STATUSES(X)
#undef X
};
static const char *const status_descs[] = {
#define X(name, desc) desc,
    MOEJIT_STATUSES(X)
#undef X
};

const char *moejit_status_name(moejit_status s) {
  return (unsigned)s < MOEJIT_NSTATUS ? status_names[s] : "MOEJIT_?";
}
const char *moejit_strerror(moejit_status s) {
  return (unsigned)s < MOEJIT_NSTATUS ? status_descs[s] : "unknown status";
}

/* The public status of a library code; input is what MJ_EINPUT means at
 * the call (a bad model file when opening, a bad argument elsewhere). */
static moejit_status status_of(mj_code c, moejit_status input) {
  switch (c) {
  case MJ_OK: return MOEJIT_OK;
  case MJ_EINPUT: return input;
  case MJ_EUSAGE: return MOEJIT_EINVAL;
  case MJ_EIO: return MOEJIT_EMODEL;
  case MJ_ENOGPU: return MOEJIT_ENOBACKEND;
  case MJ_ECOMPILE:
  case MJ_ECUDA:
  case MJ_ECACHE: return MOEJIT_EBACKEND;
  case MJ_ENOMEM: return MOEJIT_ENOMEM;
  default: return MOEJIT_EINTERNAL;
  }
}

/* Record err as this thread's last error and return st (err is cleared). */
static moejit_status fail_err(moejit_status st, mj_err *err) {
  last_err.code = err->code;
  snprintf(last_err.msg, sizeof last_err.msg, "%s", err->msg[0] ? err->msg : mj_code_desc(err->code));
  mj_err_clear(err);
  return st;
}

static moejit_status failf(moejit_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static moejit_status failf(moejit_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_err.msg, sizeof last_err.msg, fmt, ap);
  va_end(ap);
  last_err.code = st == MOEJIT_ENOMEM ? MJ_ENOMEM : st == MOEJIT_EINTERNAL ? MJ_EINTERNAL : MJ_EUSAGE;
  return st;
}

/* ---- versions, memory, defaults --------------------------------------------------------- */
int moejit_api_version(void) { return MOEJIT_API_VERSION; }
const char *moejit_version(void) { return PACKAGE_VERSION; }
void moejit_free(void *p) { free(p); }

void moejit_sampling_init(moejit_sampling *s) {
  sample_params d = sample_defaults();
  *s = (moejit_sampling){.temperature = d.temperature, .top_k = d.top_k, .top_p = d.top_p, .min_p = d.min_p,
                         .repeat_penalty = d.repeat_penalty, .repeat_last_n = d.repeat_last_n, .seed = -1,
                         .presence_penalty = d.presence_penalty, .frequency_penalty = d.frequency_penalty};
}

void moejit_open_opts_init(moejit_open_opts *o) {
  memset(o, 0, sizeof *o);
  o->backend = MOEJIT_BACKEND_AUTO;
  moejit_sampling_init(&o->default_sampling);
  o->default_sampling.seed = 0;
}

void moejit_request_init(moejit_request *r) { memset(r, 0, sizeof *r); }

const char *moejit_finish_name(moejit_finish f) {
  static const char *const names[] = {"", "stop", "length", "cancelled", "error"};
  return (unsigned)f < MJ_ARRAY_LEN(names) ? names[f] : "";
}

/* ---- the handle ------------------------------------------------------------------------ */
/* A taken or queued event of a polled request; its strings are its own. */
typedef struct api_ev {
  struct api_ev *next;
  moejit_event ev;
  const moejit *handle; /* parked: the handle it was taken from */
} api_ev;

typedef enum { REQ_WAITING, REQ_RUNNING, REQ_DONE } req_state;

typedef struct api_req {
  uint64_t id;
  struct api_req *hnext; /* the next of its chain in the handle's table */
  struct api_req *wnext; /* the wait queue, or a list of requests to end */
  req_state state;
  bool cancel;   /* asked; the engine acts at the next step boundary */
  bool released; /* polled, but nobody will take its events */
  int waking;    /* polled: 1 in the engine's wake list, 2 in the waker's pend list (under lock) */
  bool signalling; /* in the batch the waker signals outside the lock: not to be freed yet (under lock) */
  bool dead;       /* let go by its owner while signalling: the waker frees it (under lock) */
  bool linked;   /* in the handle's table (find sees it) */
  /* what was asked */
  tok_ids prompt;
  sample_params sp;
  int64_t max_tokens;
  char **stop;      /* each its stop_len[i] bytes, which may hold NUL */
  size_t *stop_len;
  size_t n_stop, stop_max;
  bool ignore_eos;
  bool hold;     /* polled, its events held until the last (moejit_request.hold_events) */
  moejit_event_fn fn;
  void *user;
  /* the engine thread's */
  moejit_logprob top[MOEJIT_MAX_TOP_LOGPROBS]; /* the current event's top_logprobs */
  int slot;
  size_t fed;       /* prompt tokens run so far (prompt.n: decoding) */
  uint64_t adm;     /* admission order (the prompts' parts go oldest first) */
  int32_t next_tok; /* the token the next decode row feeds */
  int64_t n_gen;
  tok_stream ts;
  mj_buf pend; /* decoded text not yet returned */
  double t_submit, t_admit, t_first;
  /* polled: events not yet taken (under the lock), and its poller's wait */
  api_ev *qhead, *qtail;
  pthread_cond_t cv;
} api_req;

struct moejit {
  /* fixed once loaded */
  moejit_open_opts o;
  int32_t graph[GPU_MAX_GRAPHS];
  model *m;
  tok_tokenizer *tok;
  chat_format cf;
  bool have_chat;
  mj_err chat_err; /* why the chat format is missing */
  sess_backend backend;
  char *path, *name;
  int32_t eos[MOEJIT_MAX_EOS];
  int n_eos;
  int64_t ctx;
  int slots, max_queue;
  sample_params dflt;
  api_start_opts x;
  pthread_mutex_t tok_lock;
  /* the engine */
  session *S;
  pthread_t thread;
  bool started, ready;
  int start_rc;
  mj_err start_err, eng_err; /* the session's creation; the first failure after it */
  api_req **owner;           /* [slots]: the request live in each slot (engine thread only) */
  bool mix;                  /* prompts fed in parts beside the decode rows (engine thread only) */
  int max_rows, rows_cap;    /* the session's rows an engine step; a step's rows at most */
  uint64_t admitted;         /* admissions so far (api_req.adm) */
  double gap_from;           /* the end of the last decode step, 0 after a prompt or idle (engine thread only) */
  api_req **wake;            /* [slots]: polled requests given a token since the last wake_pollers */
  int nwake;                 /* (engine thread only; see deliver) */
  pthread_t waker;           /* wakes a step's pollers while the engine runs the next step */
  bool waker_on;
  /* under lock */
  pthread_mutex_t lock;
  pthread_cond_t work;       /* the engine waits for work; api_start for the engine to be ready */
  pthread_cond_t closing_cv; /* close waits for the engine to run dry and for pollers to leave */
  pthread_condattr_t cattr;  /* CLOCK_MONOTONIC, for every request's cv */
  api_req **tab;             /* the requests known, by id: chains, tab_size (a power of two) of them */
  size_t tab_size, n_known;
  api_req *whead, *wtail;
  int nwait, nrun, pollers;
  uint64_t idle_wakeups; /* api_idle_wakeups */
  uint64_t next_id;
  bool paused, closing, cancel_all;
  bool followed;   /* a follower's engine has ended (api_follow_wait) */
  bool ranks_lost; /* rank 0 could not reach a follower: nothing is admitted again */
  pthread_cond_t waker_cv;   /* the waker waits for pend, or waker_stop */
  api_req **pend;            /* [slots]: the pollers the waker is to wake */
  int npend;
  api_req **batch;           /* [slots]: the waker's: the pend it took, signalled outside the lock */
  bool waker_stop;
  moejit_stats st;
};

static api_req *req_new(moejit *a) {
  api_req *q = mj_xcalloc(1, sizeof *q);
  pthread_cond_init(&q->cv, &a->cattr);
  return q;
}

static void req_free(api_req *q) {
  if (!q) return;
  tok_ids_free(&q->prompt);
  for (size_t i = 0; i < q->n_stop; i++) free(q->stop[i]);
  free(q->stop), free(q->stop_len);
  mj_buf_free(&q->pend);
  for (api_ev *e = q->qhead, *n; e; e = n) n = e->next, free(e);
  pthread_cond_destroy(&q->cv);
  free(q);
}

/* q's owner lets go of it (under the lock): true when the caller is to
 * free it; false while the waker is signalling it outside the lock, which
 * then frees it. */
static bool req_let_go(api_req *q) {
  if (!q->signalling) return true;
  q->dead = true;
  return false;
}

/* The table of known requests (under the lock).  Ids are handed out in
 * sequence, so their low bits alone spread them evenly over the chains;
 * the table doubles when the requests outnumber its chains. */
#define TAB_MIN 64

static api_req **chain_of(moejit *a, uint64_t id) { return &a->tab[id & (a->tab_size - 1)]; }

static api_req *find(moejit *a, uint64_t id) {
  for (api_req *q = *chain_of(a, id); q; q = q->hnext)
    if (q->id == id) return q;
  return NULL;
}

static void link_req(moejit *a, api_req *q) {
  if (a->n_known >= a->tab_size) {
    api_req **old = a->tab;
    size_t n = a->tab_size;
    a->tab_size *= 2;
    a->tab = mj_xcalloc(a->tab_size, sizeof *a->tab);
    for (size_t i = 0; i < n; i++)
      for (api_req *r = old[i], *next; r; r = next) {
        next = r->hnext;
        api_req **c = chain_of(a, r->id);
        r->hnext = *c, *c = r;
      }
    free(old);
  }
  api_req **c = chain_of(a, q->id);
  q->hnext = *c, *c = q;
  q->linked = true;
  a->n_known++;
}

static void unlink_req(moejit *a, api_req *q) {
  if (!q->linked) return;
  q->linked = false;
  api_req **p = chain_of(a, q->id);
  while (*p != q) p = &(*p)->hnext;
  *p = q->hnext;
  q->hnext = NULL;
  a->n_known--;
}

/* ---- parked events -------------------------------------------------------------------- */
/* A thread's parked events: a list under the thread's own key, one event a
 * handle at most (a thread that polls two engines keeps one of each), so
 * only its own thread ever touches it.  The key's destructor frees the list
 * when the thread exits.  An event holds no pointer into its handle: one
 * left by a thread whose handle another thread closed waits harmlessly for
 * that thread's exit.
 *
 * n_parked counts the events parked in the whole process, for the tests
 * (api_parked_events: threads that exit leave none behind).  A thread's
 * count can not be read once the thread is gone, so the count is shared;
 * but it moves only when a thread gains or loses its event of a handle (a
 * first event, a poll that times out, release, close, the thread's exit),
 * not when a poll replaces one parked event by the next, as it does for
 * every token of a stream. */
static pthread_key_t park_key;
static pthread_once_t park_once = PTHREAD_ONCE_INIT;
static int park_key_err;        /* pthread_key_create's error, checked at open */
static atomic_size_t n_parked;  /* in the whole process (api_parked_events) */

static void park_free(void *list) {
  size_t n = 0;
  for (api_ev *e = list, *next; e; e = next) next = e->next, free(e), n++;
  atomic_fetch_sub(&n_parked, n);
}

static void park_key_init(void) { park_key_err = pthread_key_create(&park_key, park_free); }

size_t api_parked_events(void) { return atomic_load(&n_parked); }

/* The event this thread took from a before, out of its list (NULL: none);
 * park_put frees it. */
static api_ev *park_take(const moejit *a) {
  api_ev *head = pthread_getspecific(park_key), **p = &head;
  while (*p && (*p)->handle != a) p = &(*p)->next;
  api_ev *e = *p;
  if (!e) return NULL;
  *p = e->next;
  pthread_setspecific(park_key, head); /* a value already set: cannot fail */
  return e;
}

/* Keep e (NULL: nothing), just taken from a, until this thread's next call
 * on a, in place of old (park_take's, its text valid until now). */
static void park_put(const moejit *a, api_ev *old, api_ev *e) {
  free(old);
  if (e) {
    e->handle = a;
    e->next = pthread_getspecific(park_key);
    /* It fails only when glibc cannot allocate a key block, which moejit, as
     * for any small host allocation, treats as fatal. */
    MJ_ASSERT(pthread_setspecific(park_key, e) == 0);
  }
  if (!old != !e) {
    if (e) atomic_fetch_add(&n_parked, 1);
    else atomic_fetch_sub(&n_parked, 1);
  }
}

/* Free the event this thread took from a before. */
static void unpark(const moejit *a) { park_put(a, park_take(a), NULL); }

/* ---- the built-in model --------------------------------------------------------------- */
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

/* The built-in model's folder (mkmodel's `medium` preset with NVFP4
 * experts, seed 1: the smallest widths the GPU kernels take, 142 MB),
 * written on first use.  The folder name carries the preset and seed so a
 * future change of the built-in model gets a new folder rather than a
 * stale one. */
int api_default_model(char *dir, size_t n, bool quiet, mj_err *err) {
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

/* ---- opening --------------------------------------------------------------------------- */
static int check_sampling(const moejit_sampling *s, const char *who, mj_err *err) {
  if (!(s->temperature >= 0 && s->temperature < INFINITY) || !(s->top_p > 0 && s->top_p <= 1) ||
      !(s->min_p >= 0 && s->min_p < 1) || !(s->repeat_penalty > 0 && s->repeat_penalty < INFINITY) || s->top_k < 0)
    return mj_fail(err, MJ_EUSAGE,
                   "%s: temperature %g, top_p %g, min_p %g, repeat_penalty %g, top_k %d: want temperature >= 0, "
                   "top_p in (0, 1], min_p in [0, 1), repeat_penalty > 0, both finite, top_k >= 0",
                   who, s->temperature, s->top_p, s->min_p, s->repeat_penalty, s->top_k);
  if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2) || !(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
    return mj_fail(err, MJ_EUSAGE, "%s: presence_penalty %g, frequency_penalty %g: each must be in [-2, 2]", who,
                   s->presence_penalty, s->frequency_penalty);
  return 0;
}

static sample_params params_of(const moejit_sampling *s, uint64_t seed) {
  sample_params p = sample_defaults();
  p.temperature = s->temperature, p.top_k = s->top_k, p.top_p = s->top_p, p.min_p = s->min_p;
  p.repeat_penalty = s->repeat_penalty, p.repeat_last_n = s->repeat_last_n, p.seed = seed;
  p.presence_penalty = s->presence_penalty, p.frequency_penalty = s->frequency_penalty;
  return p;
}

#define PREFILL_MAX 65536 /* moejit_open_opts.prefill_chunk, at most */
static int check_open_opts(const moejit_open_opts *o, mj_err *err) {
  if ((unsigned)o->backend > MOEJIT_BACKEND_CUDA)
    return mj_fail(err, MJ_EUSAGE, "moejit_open: backend %d is not auto, cpu or cuda", (int)o->backend);
  if (o->context_length < 0 || o->max_parallel < 0 || o->max_parallel > 1024 || o->max_queue < 0 || o->threads < 0)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit_open: context_length %d, max_parallel %d, max_queue %d, threads %d: each must be >= 0 "
                   "(max_parallel at most 1024)",
                   o->context_length, o->max_parallel, o->max_queue, o->threads);
  if (o->prefill_chunk > PREFILL_MAX)
    return mj_fail(err, MJ_EUSAGE, "moejit_open: prefill_chunk %d: at most %d tokens a step (< 0: each prompt whole)",
                   o->prefill_chunk, PREFILL_MAX);
  if (o->n_graph_batch_sizes < 0 || o->n_graph_batch_sizes > GPU_MAX_GRAPHS ||
      (o->n_graph_batch_sizes > 0 && !o->graph_batch_sizes))
    return mj_fail(err, MJ_EUSAGE, "moejit_open: %d graph batch sizes (0 to %d, with the array)", o->n_graph_batch_sizes,
                   GPU_MAX_GRAPHS);
  for (int i = 0; i < o->n_graph_batch_sizes; i++) {
    int32_t v = o->graph_batch_sizes[i];
    if (v < 1 || v > 1024 || (i && v <= o->graph_batch_sizes[i - 1]))
      return mj_fail(err, MJ_EUSAGE, "moejit_open: graph batch sizes must ascend within 1..1024 (size %d is %d)", i, v);
  }
  return check_sampling(&o->default_sampling, "moejit_open: default_sampling", err);
}

/* What moejit_open and api_load share; *st is the public status of a
 * failure (a model file's fault, or the backend's). */
static int load(const char *dir, const moejit_open_opts *o, moejit **out, moejit_status *st, mj_err *err) {
  *out = NULL;
  *st = MOEJIT_EINVAL;
  moejit_open_opts dflt;
  if (!o) moejit_open_opts_init(&dflt), o = &dflt;
  int rc = check_open_opts(o, err);
  if (rc) return rc;
  pthread_once(&park_once, park_key_init);
  if (park_key_err)
    return mj_fail(err, MJ_EINTERNAL, "moejit: cannot create the key of polled events: %s", strerror(park_key_err));
  if (o->kernel_cache_dir && *o->kernel_cache_dir) setenv("MOEJIT_CACHE_DIR", o->kernel_cache_dir, 1);
  char defdir[4096];
  *st = MOEJIT_EMODEL;
  if (!dir) {
    if ((rc = api_default_model(defdir, sizeof defdir, o->quiet, err))) return rc;
    dir = defdir;
  }
  moejit *a = mj_xcalloc(1, sizeof *a);
  a->o = *o;
  if (o->n_graph_batch_sizes) memcpy(a->graph, o->graph_batch_sizes, (size_t)o->n_graph_batch_sizes * sizeof *a->graph);
  a->o.graph_batch_sizes = o->n_graph_batch_sizes ? a->graph : NULL;
  a->o.kernel_cache_dir = NULL;
  pthread_mutex_init(&a->lock, NULL);
  pthread_mutex_init(&a->tok_lock, NULL);
  pthread_condattr_init(&a->cattr); /* timed waits on the monotonic clock, for every cv */
  pthread_condattr_setclock(&a->cattr, CLOCK_MONOTONIC);
  pthread_cond_init(&a->work, &a->cattr);
  pthread_cond_init(&a->closing_cv, &a->cattr);
  pthread_cond_init(&a->waker_cv, &a->cattr);
  a->tab_size = TAB_MIN;
  a->tab = mj_xcalloc(a->tab_size, sizeof *a->tab);
  a->path = mj_xstrdup(dir);
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  const char *base = dir + n;
  while (base > dir && base[-1] != '/') base--;
  a->name = mj_xcalloc(1, (size_t)(dir + n - base) + 1);
  memcpy(a->name, base, (size_t)(dir + n - base));
  *out = a;

  if ((rc = model_load(dir, &a->m, err))) return rc;
  char tpath[4200];
  snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
  if ((rc = tok_load(tpath, &a->tok, err))) return rc;
  a->have_chat = chat_format_init(&a->cf, a->tok, &a->chat_err) == 0;
  const model_config *c = &a->m->cfg;
  for (int i = 0; i < c->n_eos && a->n_eos < MOEJIT_MAX_EOS; i++) a->eos[a->n_eos++] = (int32_t)c->eos_token_id[i];
  for (int i = 0; a->have_chat && i < a->cf.neos && a->n_eos < MOEJIT_MAX_EOS; i++) {
    bool seen = false;
    for (int k = 0; k < a->n_eos; k++) seen |= a->eos[k] == a->cf.eos[i];
    if (!seen) a->eos[a->n_eos++] = a->cf.eos[i];
  }
  uint64_t seed = o->default_sampling.seed >= 0 ? (uint64_t)o->default_sampling.seed : mj_now_ns();
  a->dflt = params_of(&o->default_sampling, seed);

  /* The backend: a GPU asked for must exist and take the model now, not at
   * the first step. */
  *st = MOEJIT_ENOBACKEND;
  static const char *const names[] = {"auto", "cpu", "cuda"};
  if ((rc = sess_pick_backend("moejit_open", names[o->backend], a->m, o->quiet, &a->backend, err))) return rc;
  if (a->backend == SESS_CUDA && ((rc = gpu_model_supports(a->m, err)) || (rc = cu_init(err)))) return rc;
  return 0;
}

int api_load(const char *dir, const moejit_open_opts *o, moejit **out, mj_err *err) {
  moejit_status st;
  int rc = load(dir, o, out, &st, err);
  if (rc) api_close(*out, 0, NULL), *out = NULL;
  return rc;
}

static void *engine_main(void *arg);

/* One rank of a sharded engine whose ranks each run their own copy of the
 * requests (moejit generate --tp/--ep: every rank is handed the same
 * prompts) and so must each pick the same seeds.  A server's ranks do not:
 * the followers take rank 0's sampling, seed included, with each admission
 * (ctl.h). */
static bool self_seeded_rank(const api_start_opts *x) { return (x->tp > 1 || x->ep > 1) && !x->ctl; }

int api_start(moejit *a, const api_start_opts *x, mj_err *err) {
  if (a->started) return mj_fail(err, MJ_EINTERNAL, "moejit: the engine has started already");
  /* Such a rank draws the same ids as the others (each embeds them next)
   * only from a seed they share: the default sampling's, from which the
   * seedless requests' seeds come too (seedless_seed). */
  if (self_seeded_rank(x) && a->o.default_sampling.seed < 0)
    return mj_fail(err, MJ_EUSAGE,
                   "moejit: a sharded engine (tp %d, ep %d) needs default_sampling.seed >= 0: a seed from the clock "
                   "differs between the ranks, which must draw the same tokens",
                   x->tp, x->ep);
  a->x = *x;
  const model_config *c = &a->m->cfg;
  int64_t mp = c->max_position_embeddings > 0 ? c->max_position_embeddings : 4096;
  a->ctx = x->context_length > 0 ? x->context_length : a->o.context_length > 0 ? a->o.context_length : mp < 4096 ? mp : 4096;
  a->slots = x->max_parallel > 0 ? x->max_parallel : a->o.max_parallel > 0 ? a->o.max_parallel : 4;
  a->max_queue = x->max_queue > 0 ? x->max_queue : a->o.max_queue > 0 ? a->o.max_queue : 256;
  a->paused = x->paused;
  a->owner = mj_xcalloc((size_t)a->slots, sizeof *a->owner);
  a->wake = mj_xcalloc((size_t)a->slots, sizeof *a->wake);
  a->pend = mj_xcalloc((size_t)a->slots, sizeof *a->pend);
  a->batch = mj_xcalloc((size_t)a->slots, sizeof *a->batch);
  /* pthread_create returns its error; errno is not set. */
  int pe = pthread_create(&a->waker, NULL, waker_main, a);
  if (pe) return mj_fail(err, MJ_EINTERNAL, "moejit: cannot start the engine's waker thread: %s", strerror(pe));
  a->waker_on = true;
  pe = pthread_create(&a->thread, NULL, engine_main, a);
  if (pe) {
    waker_stop(a);
    return mj_fail(err, MJ_EINTERNAL, "moejit: cannot start the engine thread: %s", strerror(pe));
  }
  pthread_mutex_lock(&a->lock);
  while (!a->ready) pthread_cond_wait(&a->work, &a->lock);
  int rc = a->start_rc;
  pthread_mutex_unlock(&a->lock);
  if (rc) {
    pthread_join(a->thread, NULL);
    waker_stop(a);
    mj_fail(err, a->start_err.code, "%s", a->start_err.msg);
    mj_err_set_detail(err, a->start_err.detail);
    mj_err_clear(&a->start_err);
    return rc;
  }
  a->started = true;
  return 0;
}

void api_resume(moejit *a) {
  pthread_mutex_lock(&a->lock);
  a->paused = false;
  pthread_cond_signal(&a->work);
  pthread_mutex_unlock(&a->lock);
}

moejit_status moejit_open(const char *model_dir, const moejit_open_opts *opts, moejit **out) {
  if (!out) return failf(MOEJIT_EINVAL, "moejit_open: out is NULL");
  mj_err err = {0};
  moejit_status st;
  moejit *a = NULL;
  int rc = load(model_dir, opts, &a, &st, &err);
  if (!rc) {
    api_start_opts x = {0};
    st = MOEJIT_ENOBACKEND;
    rc = api_start(a, &x, &err);
  }
  if (rc) {
    api_close(a, 0, NULL);
    *out = NULL;
    return fail_err(status_of((mj_code)rc, st), &err);
  }
  *out = a;
  return MOEJIT_OK;
}

moejit_status moejit_get_info(const moejit *a, moejit_info *out) {
  if (!a || !out) return failf(MOEJIT_EINVAL, "moejit_get_info: NULL argument");
  const model_config *c = &a->m->cfg;
  memset(out, 0, sizeof *out);
  out->name = a->name, out->path = a->path, out->backend = sess_backend_name(a->backend);
  out->vocab_size = (int32_t)c->vocab_size;
  out->context_length = (int32_t)a->ctx;
  out->model_context_length = (int32_t)c->max_position_embeddings;
  out->max_parallel = a->slots, out->max_queue = a->max_queue;
  memcpy(out->eos_ids, a->eos, sizeof a->eos);
  out->n_eos = a->n_eos;
  out->has_chat_template = a->have_chat;
  return MOEJIT_OK;
}

/* ---- text and tokens ------------------------------------------------------------------- */
static int encode(moejit *a, const char *text, size_t len, bool add_special, tok_ids *out, mj_err *err) {
  pthread_mutex_lock(&a->tok_lock);
  int rc = tok_encode(a->tok, text, len, add_special, out, err);
  pthread_mutex_unlock(&a->tok_lock);
  return rc;
}

/* Hand ids to the caller as a malloc'd array. */
static void give_ids(tok_ids *t, int32_t **ids, size_t *n) {
  *n = t->n;
  *ids = t->v ? t->v : mj_xmalloc(sizeof **ids);
  memset(t, 0, sizeof *t);
}

moejit_status moejit_tokenize(moejit *a, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n) {
  if (!a || !text || !ids || !n) return failf(MOEJIT_EINVAL, "moejit_tokenize: NULL argument");
  if (len == (size_t)-1) len = strlen(text);
  tok_ids t = {0};
  mj_err err = {0};
  if (encode(a, text, len, add_special, &t, &err)) return tok_ids_free(&t), fail_err(MOEJIT_EINVAL, &err);
  give_ids(&t, ids, n);
  return MOEJIT_OK;
}

moejit_status moejit_detokenize(moejit *a, const int32_t *ids, size_t n, bool skip_special, char **text, size_t *len) {
  if (!a || (!ids && n) || !text) return failf(MOEJIT_EINVAL, "moejit_detokenize: NULL argument");
  int32_t V = tok_vocab_size(a->tok);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V)
      return failf(MOEJIT_EINVAL, "moejit_detokenize: id %d (number %zu) is outside the vocabulary (0..%d)", ids[i], i,
                   V - 1);
  mj_buf b = {0};
  tok_decode(a->tok, ids, n, skip_special, &b);
  mj_buf_putc(&b, 0);
  if (len) *len = b.len - 1;
  *text = mj_buf_steal(&b);
  return MOEJIT_OK;
}

static int role_of(const char *r, chat_role *out) {
  static const char *const names[] = {"system", "user", "assistant", "observation"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(r, names[i])) return *out = (chat_role)i, 0;
  if (!strcmp(r, "tool")) return *out = CHAT_OBSERVATION, 0;
  return -1;
}

static int chat_ids(moejit *a, const moejit_message *msgs, size_t n, bool gen, bool thinking, tok_ids *out, mj_err *err) {
  if (!a->have_chat) return mj_fail(err, MJ_EINPUT, "%s", a->chat_err.msg);
  if (!msgs && n) return mj_fail(err, MJ_EUSAGE, "chat: messages is NULL");
  chat_msg *cm = mj_xcalloc(n ? n : 1, sizeof *cm);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!msgs[i].role || !msgs[i].content) rc = mj_fail(err, MJ_EUSAGE, "chat: message %zu has a NULL role or content", i);
    else if (role_of(msgs[i].role, &cm[i].role))
      rc = mj_fail(err, MJ_EUSAGE, "chat: message %zu has role '%s' (system, user, assistant, observation or tool)", i,
                   msgs[i].role);
    else cm[i].text = msgs[i].content, cm[i].len = msgs[i].content_len ? msgs[i].content_len : strlen(msgs[i].content);
  }
  if (!rc) {
    pthread_mutex_lock(&a->tok_lock);
    rc = chat_encode(a->tok, &a->cf, cm, n, gen, thinking, out, err);
    pthread_mutex_unlock(&a->tok_lock);
  }
  free(cm);
  return rc;
}

moejit_status moejit_chat_template(moejit *a, const moejit_message *msgs, size_t n, bool add_generation_prompt,
                                   bool thinking, int32_t **ids, size_t *n_ids) {
  if (!a || !ids || !n_ids) return failf(MOEJIT_EINVAL, "moejit_chat_template: NULL argument");
  tok_ids t = {0};
  mj_err err = {0};
  if (chat_ids(a, msgs, n, add_generation_prompt, thinking, &t, &err))
    return tok_ids_free(&t), fail_err(MOEJIT_EINVAL, &err);
  give_ids(&t, ids, n_ids);
  return MOEJIT_OK;
}

/* ---- submitting ------------------------------------------------------------------------- */
/* The length of r's stop string i: stop_lens[i] when given and not 0, else
 * up to its NUL (callers older than stop_lens leave it NULL). */
static size_t stop_len_of(const moejit_request *r, size_t i) {
  return r->stop_lens && r->stop_lens[i] ? r->stop_lens[i] : strlen(r->stop[i]);
}

/* Everything about r that can be checked without the lock, into a new
 * request. */
static int make_req(moejit *a, const moejit_request *r, api_req **out, mj_err *err) {
  *out = NULL;
  int given = (r->prompt != NULL) + (r->prompt_ids != NULL) + (r->messages != NULL);
  if (given != 1)
    return mj_fail(err, MJ_EUSAGE, "moejit_submit: give exactly one of prompt, prompt_ids and messages (%d given)", given);
  if (r->max_tokens < 0) return mj_fail(err, MJ_EUSAGE, "moejit_submit: max_tokens is %d (0 or more)", r->max_tokens);
  const moejit_sampling *s = r->sampling;
  int rc = s ? check_sampling(s, "moejit_submit", err) : 0;
  if (rc) return rc;
  if (r->n_stop && !r->stop) return mj_fail(err, MJ_EUSAGE, "moejit_submit: %zu stop strings but stop is NULL", r->n_stop);
  for (size_t i = 0; i < r->n_stop; i++)
    if (!r->stop[i] || !stop_len_of(r, i)) return mj_fail(err, MJ_EUSAGE, "moejit_submit: stop string %zu is empty", i);
  if (r->top_logprobs < 0 || r->top_logprobs > MOEJIT_MAX_TOP_LOGPROBS || (r->top_logprobs && !r->logprobs))
    return mj_fail(err, MJ_EUSAGE, "moejit_submit: top_logprobs is %d (0 to %d, and only with logprobs)", r->top_logprobs,
                   MOEJIT_MAX_TOP_LOGPROBS);
  if (r->hold_events && r->on_event)
    return mj_fail(err, MJ_EUSAGE, "moejit_submit: hold_events is for a polled request, and on_event is set");
  api_req *q = req_new(a);
  *out = q;
  if (r->prompt) rc = encode(a, r->prompt, r->prompt_len ? r->prompt_len : strlen(r->prompt), true, &q->prompt, err);
  else if (r->messages) rc = chat_ids(a, r->messages, r->n_messages, true, r->thinking, &q->prompt, err);
  else
    for (size_t i = 0; i < r->n_prompt_ids; i++) tok_ids_push(&q->prompt, r->prompt_ids[i]);
  if (rc) return rc;
  int64_t np = (int64_t)q->prompt.n, V = a->m->cfg.vocab_size;
  if (np == 0) return mj_fail(err, MJ_EUSAGE, "moejit_submit: the prompt is empty");
  for (int64_t i = 0; i < np; i++)
    if (q->prompt.v[i] < 0 || q->prompt.v[i] >= V)
      return mj_fail(err, MJ_EUSAGE, "moejit_submit: prompt token %lld is %d, outside the vocabulary (0..%lld)", (long long)i,
                     q->prompt.v[i], (long long)V - 1);
  if (np + (r->max_tokens ? r->max_tokens : 1) > a->ctx)
    return mj_fail(err, MJ_EUSAGE, "moejit_submit: prompt (%lld tokens) + max_tokens %d exceeds the context (%lld)",
                   (long long)np, r->max_tokens, (long long)a->ctx);
  q->max_tokens = r->max_tokens ? r->max_tokens : a->ctx - np;
  q->sp = s ? params_of(s, s->seed >= 0 ? (uint64_t)s->seed : 0) : a->dflt;
  /* the session reports them, and draws such a request on the host */
  q->sp.logprobs = r->logprobs, q->sp.top_logprobs = r->top_logprobs;
  q->n_stop = r->n_stop;
  q->stop = mj_xcalloc(r->n_stop ? r->n_stop : 1, sizeof *q->stop);
  q->stop_len = mj_xcalloc(r->n_stop ? r->n_stop : 1, sizeof *q->stop_len);
  for (size_t i = 0; i < r->n_stop; i++) {
    size_t l = stop_len_of(r, i);
    q->stop[i] = mj_xmalloc(l);
    memcpy(q->stop[i], r->stop[i], l);
    q->stop_len[i] = l;
    q->stop_max = l > q->stop_max ? l : q->stop_max;
  }
  q->ignore_eos = r->ignore_eos;
  q->fn = r->on_event, q->user = r->user;
  q->hold = r->hold_events;
  q->slot = -1;
  return 0;
}

/* The seed of request id, submitted with a seed below 0: one from the
 * clock, its id mixed in so two submitted in the same tick differ.  But the
 * ranks of a self-seeded sharded engine must draw alike, and their clocks
 * differ: there the seed comes from the default sampling's (the ranks share
 * it: api_start refuses one from the clock) and the id, which agrees
 * between ranks as every rank submits the same requests in the same order. */
static uint64_t seedless_seed(const moejit *a, uint64_t id) {
  return (self_seeded_rank(&a->x) ? a->dflt.seed : mj_now_ns()) ^ (id * 0x9E3779B97F4A7C15ull);
}

moejit_status moejit_submit(moejit *a, const moejit_request *r, uint64_t *id) {
  if (!a || !r || !id) return failf(MOEJIT_EINVAL, "moejit_submit: NULL argument");
  if (!a->started) return failf(MOEJIT_EINVAL, "moejit_submit: the engine has not started");
  if (a->x.follow) return failf(MOEJIT_EINVAL, "moejit_submit: a follower rank takes no requests (rank 0's engine drives it)");
  mj_err err = {0};
  api_req *q;
  if (make_req(a, r, &q, &err)) return req_free(q), fail_err(MOEJIT_EINVAL, &err);
  pthread_mutex_lock(&a->lock);
  moejit_status st = MOEJIT_OK;
  if (a->closing) st = failf(MOEJIT_ECLOSED, "moejit_submit: the engine is closing");
  else if (a->ranks_lost)
    st = failf(MOEJIT_EBACKEND, "moejit_submit: a follower rank of this sharded engine is gone; the job must be restarted");
  else if (a->nwait >= a->max_queue)
    st = failf(MOEJIT_EQUEUE_FULL, "moejit_submit: %d requests wait already (max_queue)", a->nwait);
  if (st) {
    pthread_mutex_unlock(&a->lock);
    req_free(q);
    return st;
  }
  q->id = ++a->next_id;
  if (r->sampling && r->sampling->seed < 0) q->sp.seed = seedless_seed(a, q->id);
  q->t_submit = mj_now_ms();
  link_req(a, q);
  if (a->wtail) a->wtail->wnext = q;
  else a->whead = q;
  a->wtail = q;
  a->nwait++;
  a->st.requests_submitted++;
  pthread_cond_signal(&a->work);
  pthread_mutex_unlock(&a->lock);
  *id = q->id;
  return MOEJIT_OK;
}

moejit_status moejit_cancel(moejit *a, uint64_t id) {
  if (!a) return failf(MOEJIT_EINVAL, "moejit_cancel: NULL handle");
  pthread_mutex_lock(&a->lock);
  api_req *q = find(a, id);
  if (q && q->state != REQ_DONE) {
    q->cancel = true;
    pthread_cond_signal(&a->work);
  }
  pthread_mutex_unlock(&a->lock);
  return q ? MOEJIT_OK : failf(MOEJIT_ENOTFOUND, "moejit_cancel: no request %llu", (unsigned long long)id);
}

/* ---- a sharded server's ranks (ctl.h) ---------------------------------------------------- */
/* Rank 0: the followers are told what this engine does next, in order. */
static int lead(moejit *a, ctl_kind kind, int32_t slot, int32_t n, const sample_params *sp, const int32_t *tok,
                const int32_t *slots, mj_err *err) {
  if (!a->x.ctl || a->x.follow) return 0;
  ctl_msg m = {.kind = kind, .slot = slot, .n = n, .tok = tok, .slots = slots};
  if (sp) m.sp = *sp;
  int rc = ctl_send(a->x.ctl, &m, err);
  if (rc) { /* a rank gone: no step can run again (moejit_submit refuses) */
    pthread_mutex_lock(&a->lock);
    a->ranks_lost = true;
    pthread_mutex_unlock(&a->lock);
  }
  return rc;
}

/* ---- events ---------------------------------------------------------------------------- */
/* q out of the engine's wake list or the waker's pend list (under lock). */
static void unwake(moejit *a, api_req *q) {
  api_req **l = q->waking == 1 ? a->wake : a->pend;
  int *n = q->waking == 1 ? &a->nwake : &a->npend;
  for (int i = 0; i < *n; i++)
    if (l[i] == q) {
      l[i] = l[--*n];
      break;
    }
  q->waking = 0;
}

/* Hand ev to q's callback or queue.  The last event ends q: its slot (if
 * any) is freed, the counters move, and q is forgotten (a callback's after
 * the call, a polled one when its last event is taken). */
static void deliver(moejit *a, api_req *q, moejit_event *ev) {
  bool last = ev->finish != MOEJIT_FINISH_NONE;
  if (last && q->slot >= 0) {
    sess_retire(a->S, q->slot);
    mj_err le = {0}; /* a channel that broke fails the next admission or step */
    lead(a, CTL_RETIRE, q->slot, 0, NULL, NULL, NULL, &le);
    mj_err_clear(&le);
    a->owner[q->slot] = NULL;
    q->slot = -1;
  }
  pthread_mutex_lock(&a->lock);
  if (last) {
    if (q->state == REQ_RUNNING) a->nrun--;
    q->state = REQ_DONE;
    a->st.requests_finished++;
    a->st.requests_cancelled += ev->finish == MOEJIT_FINISH_CANCELLED;
    a->st.requests_failed += ev->finish == MOEJIT_FINISH_ERROR;
    if (q->fn || q->released) unlink_req(a, q);
    if (a->closing) pthread_cond_broadcast(&a->closing_cv); /* a draining close watches */
  }
  if (!q->fn) {
    /* A last event takes q out of the wake-up lists first: its poller, or
     * req_free below, frees q, and the waker must not signal it after. */
    if (last && q->waking) unwake(a, q);
    if (q->released) {
      bool gone = last && req_let_go(q);
      pthread_mutex_unlock(&a->lock);
      if (gone) req_free(q);
      return;
    }
    /* One block: the event, its top_logprobs, its text and error. */
    size_t tl = ev->text_len, el = strlen(ev->error), nl = (size_t)ev->n_top_logprobs * sizeof *ev->top_logprobs;
    api_ev *e = mj_xcalloc(1, sizeof *e + nl + tl + 1 + el + 1);
    moejit_logprob *lp = (moejit_logprob *)(e + 1);
    char *t = (char *)lp + nl;
    if (nl) memcpy(lp, ev->top_logprobs, nl);
    memcpy(t, ev->text, tl);
    memcpy(t + tl + 1, ev->error, el);
    e->ev = *ev;
    e->ev.text = t, e->ev.error = t + tl + 1, e->ev.top_logprobs = nl ? lp : NULL;
    if (q->qtail) q->qtail->next = e;
    else q->qhead = e;
    q->qtail = e;
    /* Its poller, no other.  A last event wakes it at once; a token's
     * wake-up waits until the next step is queued (on_queued), or until
     * the engine goes idle (wake_pollers), and is then the waker thread's:
     * signalled here, under the lock, each of a step's pollers would wake
     * only to block on the lock the engine takes for the next row's event.
     * One already listed needs no second entry: its wake-up will find
     * every event queued by then. */
    if (last) pthread_cond_signal(&q->cv);
    else if (!q->waking && !q->hold) a->wake[a->nwake++] = q, q->waking = 1;
    pthread_mutex_unlock(&a->lock);
    return;
  }
  pthread_mutex_unlock(&a->lock);
  q->fn(ev, q->user);
  if (last) req_free(q);
}

/* The pollers of the tokens handed out since the last call (under the
 * lock), handed to the waker thread, so the engine goes on to the next
 * step while they wake
 * (bench/results/2026-12-04-serve.md: 32 streams went from 74% to 80% of
 * generate's tokens/s).  A last event takes its request out of both lists
 * under the lock (unwake), and one the waker has taken is freed by the
 * waker (req_let_go), so the waker never signals a freed request. */
static bool hand_to_waker(moejit *a) {
  if (!a->nwake) return false;
  for (int i = 0; i < a->nwake; i++) a->pend[a->npend++] = a->wake[i], a->wake[i]->waking = 2;
  a->nwake = 0;
  return true;
}

static void wake_pollers(moejit *a) {
  if (hand_to_waker(a)) pthread_cond_signal(&a->waker_cv);
}

/* The session's on_queued hook: the next step's work is on the device, so
 * the pollers of the tokens handed out before it go to the waker now, while
 * the device runs, not in the engine's time between steps.  There the
 * signal to the waker (a system call, made under the lock) was most of
 * that time: 8 of 9 us a step serving one stream on the null GPU at the
 * H200's pace (bench/results/2026-12-05-serve-nullgpu.md).  The signal
 * goes outside the lock (npend was set under it, and the waker tests it
 * under the lock before it sleeps). */
static void on_queued(void *ctx) {
  moejit *a = ctx;
  pthread_mutex_lock(&a->lock);
  bool any = hand_to_waker(a);
  pthread_mutex_unlock(&a->lock);
  if (any) pthread_cond_signal(&a->waker_cv);
}

/* The waker takes the pend list as its batch and signals it outside the
 * lock: each signal is a system call, and a step's worth of them under
 * the lock kept the engine from starting its next step for as long.  A
 * request of the batch is marked signalling, so an owner letting go of it
 * meanwhile (its poller taking the last event, a release) leaves it to the
 * waker to free (req_let_go). */
static void *waker_main(void *arg) {
  moejit *a = arg;
  pthread_setname_np(pthread_self(), "moejit-waker"); /* for top -H, perf and gdb */
  pthread_mutex_lock(&a->lock);
  for (;;) {
    while (!a->npend && !a->waker_stop) pthread_cond_wait(&a->waker_cv, &a->lock);
    if (!a->npend) break;
    int n = a->npend;
    for (int i = 0; i < n; i++) a->batch[i] = a->pend[i], a->batch[i]->waking = 0, a->batch[i]->signalling = true;
    a->npend = 0;
    pthread_mutex_unlock(&a->lock);
    for (int i = 0; i < n; i++) pthread_cond_signal(&a->batch[i]->cv);
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < n; i++) {
      api_req *q = a->batch[i];
      q->signalling = false;
      if (q->dead) req_free(q);
    }
  }
  pthread_mutex_unlock(&a->lock);
  return NULL;
}

static void waker_stop(moejit *a) {
  if (!a->waker_on) return;
  pthread_mutex_lock(&a->lock);
  a->waker_stop = true;
  pthread_cond_signal(&a->waker_cv);
  pthread_mutex_unlock(&a->lock);
  pthread_join(a->waker, NULL);
  a->waker_on = false;
}

_Static_assert(SAMPLE_MAX_LOGPROBS == MOEJIT_MAX_TOP_LOGPROBS, "the session's top list is the event's");

/* An event of q: tok (-1: none), text, and the finish.  A token of a
 * request with logprobs carries the session's log probabilities of its
 * draw (q's slot is still its own here: deliver retires it). */
static void emit(moejit *a, api_req *q, int32_t tok, const char *text, size_t len, moejit_finish fin, int stop_index,
                 moejit_status st, const char *msg) {
  double now = mj_now_ms();
  moejit_event ev = {.id = q->id, .token = tok, .text = text ? text : "", .text_len = len, .finish = fin,
                     .stop_index = stop_index, .prompt_tokens = (int32_t)q->prompt.n,
                     .completion_tokens = (int32_t)q->n_gen, .status = st, .error = msg ? msg : ""};
  const sample_logprob *top;
  int nt;
  if (tok >= 0 && q->sp.logprobs && q->slot >= 0 && sess_logprobs(a->S, q->slot, &ev.logprob, &top, &nt)) {
    for (int i = 0; i < nt; i++) q->top[i] = (moejit_logprob){top[i].id, top[i].logprob};
    ev.has_logprob = true, ev.top_logprobs = nt ? q->top : NULL, ev.n_top_logprobs = nt;
  }
  if (fin != MOEJIT_FINISH_NONE) {
    double admit = q->t_admit > 0 ? q->t_admit : now, first = q->t_first > 0 ? q->t_first : now;
    ev.queue_ms = admit - q->t_submit;
    ev.prompt_ms = q->t_first > 0 ? first - admit : q->t_admit > 0 ? now - admit : 0;
    ev.decode_ms = q->t_first > 0 ? now - first : 0;
  }
  deliver(a, q, &ev);
}

static void end_cancelled(moejit *a, api_req *q) {
  emit(a, q, -1, "", 0, MOEJIT_FINISH_CANCELLED, -1, MOEJIT_ECANCELLED, NULL);
}

/* q's step failed: it ends with the error, which the engine keeps (the
 * first one) for moejit_close. */
static void end_failed(moejit *a, api_req *q, const mj_err *e) {
  pthread_mutex_lock(&a->lock);
  if (a->eng_err.code == MJ_OK) {
    mj_fail(&a->eng_err, e->code, "%s", e->msg);
    mj_err_set_detail(&a->eng_err, e->detail);
  }
  pthread_mutex_unlock(&a->lock);
  emit(a, q, -1, "", 0, MOEJIT_FINISH_ERROR, -1, status_of(e->code, MOEJIT_EINTERNAL), e->msg);
}

/* The earliest stop string in q->pend: its offset, and its index in *which;
 * -1 when none is there. */
static long find_stop(const api_req *q, int *which) {
  long best = -1;
  for (size_t i = 0; i < q->n_stop; i++) {
    const char *p = memmem(q->pend.data ? q->pend.data : "", q->pend.len, q->stop[i], q->stop_len[i]);
    if (p && (best < 0 || p - q->pend.data < best)) best = p - q->pend.data, *which = (int)i;
  }
  return best;
}

/* Bytes at the end of q->pend that a stop string could begin with (held
 * back until the next token says), starting at a character boundary. */
static size_t hold_back(const api_req *q) {
  size_t len = q->pend.len;
  for (size_t k = len < q->stop_max ? len : q->stop_max; k > 0; k--) {
    const char *s = q->pend.data + len - k;
    if (((unsigned char)*s & 0xC0) == 0x80) continue; /* inside a character */
    for (size_t i = 0; i < q->n_stop; i++)
      if (q->stop_len[i] > k && !memcmp(q->stop[i], s, k)) return k;
  }
  return 0;
}

static bool is_eos(const moejit *a, int32_t id) {
  for (int i = 0; i < a->n_eos; i++)
    if (a->eos[i] == id) return true;
  return false;
}

/* Take the token q drew: its text, a stop string, the end of q. */
static void take(moejit *a, api_req *q, int32_t id) {
  moejit_finish fin = MOEJIT_FINISH_NONE;
  int32_t tok = id;
  if (!q->ignore_eos && is_eos(a, id)) {
    fin = MOEJIT_FINISH_STOP, tok = -1;
    tok_stream_finish(&q->ts, &q->pend);
  } else {
    q->n_gen++;
    q->next_tok = id;
    tok_decode_stream(&q->ts, id, &q->pend);
    if (q->n_gen >= q->max_tokens) {
      fin = MOEJIT_FINISH_LENGTH;
      tok_stream_finish(&q->ts, &q->pend);
    }
  }
  int which = -1;
  long at = find_stop(q, &which);
  size_t n = at >= 0 ? (size_t)at : fin != MOEJIT_FINISH_NONE ? q->pend.len : q->pend.len - hold_back(q);
  if (at >= 0) fin = MOEJIT_FINISH_STOP;
  /* The event's text is pend's first n bytes, NUL-terminated in place for
   * the event's life (the byte it covers is put back after). */
  mj_buf_putc(&q->pend, 0);
  q->pend.len--;
  char saved = q->pend.data[n];
  q->pend.data[n] = 0;
  char *text = q->pend.data;
  if (fin != MOEJIT_FINISH_NONE) {
    /* the last event: pend goes with q */
    emit(a, q, tok, text, n, fin, fin == MOEJIT_FINISH_STOP ? which : -1, MOEJIT_OK, NULL);
    return;
  }
  emit(a, q, tok, text, n, fin, -1, MOEJIT_OK, NULL);
  q->pend.data[n] = saved;
  memmove(q->pend.data, q->pend.data + n, q->pend.len - n);
  q->pend.len -= n;
}

/* ---- the engine thread ------------------------------------------------------------------- */
static const double step_bounds[] = MOEJIT_STEP_BUCKETS_MS;

/* The counters of a step that ran (under the lock): prompt tokens n_prompt
 * (in a step of its own, or parts beside decode rows: a step with any
 * counts as a prompt step), of which `drawn` ended a prompt and drew its
 * first token, and n_dec decode rows in ms (a step with any counts as a
 * decode step, its time in the histogram: what the decoding sequences
 * waited). */
static void count_step(moejit *a, int64_t n_prompt, int drawn, int n_dec, double ms, bool ok) {
  if (n_prompt > 0) {
    a->st.prompt_steps++;
    a->st.prompt_tokens += (uint64_t)n_prompt;
    if (ok) a->st.generated_tokens += (uint64_t)drawn;
  }
  if (n_dec > 0) {
    a->st.decode_steps++;
    a->st.decode_rows += (uint64_t)n_dec;
    a->st.decode_step_ms_sum += ms;
    for (int b = 0; b < MOEJIT_STEP_BUCKETS; b++)
      a->st.decode_step_le[b] += b == MOEJIT_STEP_BUCKETS - 1 || ms <= step_bounds[b];
    if (ok) a->st.generated_tokens += (uint64_t)n_dec;
  }
}

/* Admit q (taken off the wait queue) into a free slot; its prompt is fed
 * by the steps (engine_step) or, unmixed, at once (run_prompt).  false
 * when it ended (no slot could be had). */
static bool admit(moejit *a, api_req *q) {
  mj_err e = {0};
  q->t_admit = mj_now_ms();
  if (sess_admit(a->S, &q->sp, &q->slot, &e)) {
    end_failed(a, q, &e);
    mj_err_clear(&e);
    return false;
  }
  a->owner[q->slot] = q;
  tok_stream_init(&q->ts, a->tok, true);
  q->fed = 0;
  q->adm = a->admitted++;
  return true;
}

/* Admit q and run its whole prompt as a step of its own (a sharded
 * engine: its followers admit and run the prompt from one message). */
static void run_prompt(moejit *a, api_req *q) {
  if (!admit(a, q)) return;
  mj_err e = {0};
  size_t n = q->prompt.n;
  int32_t *slot = mj_xmalloc(n * sizeof *slot), *ids = mj_xmalloc(n * sizeof *ids);
  for (size_t i = 0; i < n; i++) slot[i] = q->slot;
  int rc = lead(a, CTL_ADMIT, q->slot, (int32_t)n, &q->sp, q->prompt.v, NULL, &e);
  if (!rc) rc = sess_step(a->S, q->prompt.v, slot, (int)n, ids, NULL, &e);
  int32_t id = rc ? -1 : ids[n - 1]; /* a failed step wrote no ids */
  free(slot), free(ids);
  q->fed = n;
  pthread_mutex_lock(&a->lock);
  count_step(a, (int64_t)n, 1, 0, 0, !rc);
  pthread_mutex_unlock(&a->lock);
  if (rc) {
    end_failed(a, q, &e);
    mj_err_clear(&e);
    return;
  }
  q->t_first = mj_now_ms();
  take(a, q, id);
}

/* Prompt tokens a step takes beside nd decode rows: prefill_chunk when
 * set; else, on the GPU, the rows left below the session's rows an engine
 * step (the largest captured batch size, at least 64) and at least half of
 * them, so a step runs as one engine step, or two while many sequences
 * decode; on the CPU (one slot's rows at a time) PREFILL_CPU, or with no
 * sequence decoding a whole prompt (one forward call: the weights read
 * once), the context's worth. */
#define PREFILL_CPU 32
static int prefill_budget(const moejit *a, int nd) {
  if (a->o.prefill_chunk > 0) return a->o.prefill_chunk;
  if (a->backend != SESS_CUDA) return nd ? PREFILL_CPU : (int)a->ctx;
  int left = a->max_rows - nd, half = (a->max_rows + 1) / 2;
  return left > half ? left : half;
}

/* One step: a row of every decoding sequence, in slot order, then the
 * next parts of the prompts being fed, oldest admission first, up to
 * prefill_budget tokens; a prompt whose part does not end it is held
 * (draws nothing).  Returns the milliseconds spent handing out its tokens
 * (events_ms_sum, which the caller adds under the lock it takes next). */
static double engine_step(moejit *a, int32_t *tk, int32_t *sl, int32_t *ids, api_req **who) {
  int n = 0;
  for (int i = 0; i < a->slots; i++)
    if (a->owner[i] && a->owner[i]->fed == a->owner[i]->prompt.n)
      who[n] = a->owner[i], tk[n] = a->owner[i]->next_tok, sl[n] = i, n++;
  const int nd = n;
  int budget = prefill_budget(a, nd), drawn = 0;
  if (budget > a->rows_cap - nd) budget = a->rows_cap - nd; /* (never, by rows_cap's sizing) */
  int64_t n_prompt = 0;
  while (budget > 0) { /* the oldest prompt still being fed */
    api_req *q = NULL;
    for (int i = 0; i < a->slots; i++) {
      api_req *o = a->owner[i];
      if (o && o->fed < o->prompt.n && (!q || o->adm < q->adm)) q = o;
    }
    if (!q) break;
    size_t left = q->prompt.n - q->fed, k = left < (size_t)budget ? left : (size_t)budget;
    for (size_t j = 0; j < k; j++) who[n] = q, tk[n] = q->prompt.v[q->fed + j], sl[n] = q->slot, n++;
    q->fed += k; /* (a failed step ends q: fed no longer matters) */
    sess_hold(a->S, q->slot, k < left);
    drawn += k == left;
    n_prompt += (int64_t)k;
    budget -= (int)k;
    if (k < left) break; /* the budget is spent */
  }
  if (!n) return 0;
  mj_err e = {0};
  double t0 = mj_now_ms(), gap = a->gap_from > 0 && nd > 0 ? t0 - a->gap_from : -1;
  int rc = lead(a, CTL_STEP, -1, n, NULL, tk, sl, &e); /* a sharded engine: decode rows only */
  if (!rc) rc = sess_step(a->S, tk, sl, n, ids, NULL, &e);
  double t1 = mj_now_ms(), ms = t1 - t0;
  a->gap_from = nd > 0 ? t1 : 0;
  pthread_mutex_lock(&a->lock);
  if (gap >= 0) a->st.decode_gap_ms_sum += gap, a->st.decode_gaps++;
  count_step(a, n_prompt, drawn, nd, ms, !rc);
  pthread_mutex_unlock(&a->lock);
  double now = drawn ? mj_now_ms() : 0;
  for (int i = 0; i < n; i++) {
    api_req *q = who[i];
    if (i >= nd && i + 1 < n && who[i + 1] == q) continue; /* a prompt's part: its last row alone */
    if (rc) end_failed(a, q, &e);
    else if (i < nd) take(a, q, ids[i]);
    else if (q->fed == q->prompt.n) q->t_first = now, take(a, q, ids[i]); /* the part that ended its prompt */
  }
  mj_err_clear(&e);
  return mj_now_ms() - t1;
}

/* Under the lock: take the cancelled requests, waiting or live, off the
 * queue and the slots, into a list (by wnext) to end outside the lock. */
static api_req *take_cancelled(moejit *a) {
  api_req *list = NULL, **tail = &list;
  for (api_req **p = &a->whead, *prev = NULL; *p;) {
    api_req *q = *p;
    if (q->cancel || a->cancel_all) {
      *p = q->wnext;
      if (a->wtail == q) a->wtail = prev;
      a->nwait--;
      q->wnext = NULL, *tail = q, tail = &q->wnext;
    } else {
      prev = q, p = &q->wnext;
    }
  }
  for (int i = 0; i < a->slots; i++) {
    api_req *q = a->owner[i];
    if (q && (q->cancel || a->cancel_all)) q->wnext = NULL, *tail = q, tail = &q->wnext;
  }
  return list;
}

static void engine_loop(moejit *a) {
  sess_info si;
  sess_get_info(a->S, &si);
  a->max_rows = si.max_rows > 0 ? si.max_rows : 1;
  a->mix = a->o.prefill_chunk >= 0 && !a->x.ctl; /* a sharded engine's followers take whole prompts */
  /* prefill_budget's most: the chunk, or the rule's largest (the GPU's
   * rows, PREFILL_CPU, a context's worth) */
  int most = a->o.prefill_chunk;
  if (most <= 0) {
    most = a->max_rows > PREFILL_CPU ? a->max_rows : PREFILL_CPU;
    if (most < (int)a->ctx) most = (int)a->ctx;
  }
  a->rows_cap = a->slots + most;
  size_t cap = (size_t)a->rows_cap;
  int32_t *tk = mj_xmalloc(cap * sizeof *tk), *sl = mj_xmalloc(cap * sizeof *sl), *ids = mj_xmalloc(cap * sizeof *ids);
  api_req **who = mj_xmalloc(cap * sizeof *who);
  pthread_mutex_lock(&a->lock);
  for (;;) {
    api_req *end = take_cancelled(a);
    if (end) {
      pthread_mutex_unlock(&a->lock);
      for (api_req *q = end, *next; q; q = next) next = q->wnext, end_cancelled(a, q);
      pthread_mutex_lock(&a->lock);
    }
    /* A free slot takes the next waiting request; one at a time, each
     * followed by the cancel check (one that ends at once frees its slot
     * again). */
    if ((!a->paused || a->closing) && a->whead && a->nrun < a->slots) {
      api_req *q = a->whead;
      if (!(a->whead = q->wnext)) a->wtail = NULL;
      q->wnext = NULL;
      a->nwait--, a->nrun++;
      q->state = REQ_RUNNING;
      pthread_mutex_unlock(&a->lock);
      if (a->mix) {
        admit(a, q); /* its prompt goes in parts with the next steps */
      } else {
        a->gap_from = 0; /* the next decode step's gap would hold this prompt */
        run_prompt(a, q);
      }
      pthread_mutex_lock(&a->lock);
      continue; /* its first token's poller: as a decode step's, below */
    }
    if (a->nrun > 0) {
      pthread_mutex_unlock(&a->lock);
      double ev_ms = engine_step(a, tk, sl, ids, who);
      pthread_mutex_lock(&a->lock);
      a->st.events_ms_sum += ev_ms;
      /* This step's pollers wait for the next step to be queued (on_queued),
       * or for the lines below when no step follows. */
      continue;
    }
    wake_pollers(a); /* no step follows at once: the tokens of the last one go out now */
    a->gap_from = 0; /* nothing to step: what follows is idle time, not overhead */
    if (a->closing && !a->whead) break;
    bool cancelled = false;
    for (api_req *q = a->whead; q; q = q->wnext) cancelled |= q->cancel;
    if (!cancelled && (a->paused || !a->whead) && !a->closing) pthread_cond_wait(&a->work, &a->lock);
  }
  pthread_mutex_unlock(&a->lock);
  free(tk), free(sl), free(ids), free(who);
}

/* A follower rank's engine (ctl.h): rank 0's admissions, steps and
 * retirements replayed in order on this rank's session, every token rank
 * 0 feeds a slot checked against the one this rank drew for it. */
static void follow_loop(moejit *a) {
  int32_t *drawn = mj_xmalloc((size_t)a->slots * sizeof *drawn), *ids = NULL, *slotv = NULL;
  for (int i = 0; i < a->slots; i++) drawn[i] = -1; /* no draw yet: rank 0 feeds no such slot */
  size_t cap = 0;
  mj_err e = {0};
  ctl_msg m;
  int rc;
  while (!(rc = ctl_recv(a->x.ctl, &m, &e)) && m.kind != CTL_END) {
    if ((size_t)m.n > cap) {
      cap = (size_t)m.n;
      free(ids), free(slotv);
      ids = mj_xmalloc(cap * sizeof *ids), slotv = mj_xmalloc(cap * sizeof *slotv);
    }
    bool step = m.kind == CTL_STEP;
    if (m.kind == CTL_RETIRE || m.kind == CTL_ADMIT) {
      if (m.slot < 0 || m.slot >= a->slots)
        rc = mj_fail(&e, MJ_EINTERNAL, "rank 0 names slot %d of %d", m.slot, a->slots);
    } else {
      for (int i = 0; i < m.n && !rc; i++) {
        int s = m.slots[i];
        if (s < 0 || s >= a->slots) rc = mj_fail(&e, MJ_EINTERNAL, "rank 0 names slot %d of %d", s, a->slots);
        else if (m.tok[i] != drawn[s])
          rc = mj_fail(&e, MJ_EINTERNAL,
                       "rank %d drew token %d for slot %d but rank 0 feeds it %d: the ranks' logits have parted",
                       a->x.rank, drawn[s], s, m.tok[i]);
      }
    }
    if (rc) break;
    double t0 = mj_now_ms();
    if (m.kind == CTL_RETIRE) {
      sess_retire(a->S, m.slot);
      drawn[m.slot] = -1; /* no token is fed to a free slot */
      continue;
    }
    if (m.kind == CTL_ADMIT) {
      int slot = -1;
      if (m.n < 1) rc = mj_fail(&e, MJ_EINTERNAL, "rank 0 admitted a sequence with no prompt");
      else if (!(rc = sess_admit(a->S, &m.sp, &slot, &e)) && slot != m.slot)
        rc = mj_fail(&e, MJ_EINTERNAL, "rank %d admitted a sequence into slot %d, rank 0 into slot %d: the ranks' sessions have parted",
                     a->x.rank, slot, m.slot);
      for (int i = 0; i < m.n; i++) slotv[i] = m.slot;
      if (!rc) rc = sess_step(a->S, m.tok, slotv, m.n, ids, NULL, &e);
      if (!rc) drawn[m.slot] = ids[m.n - 1];
    } else {
      if (!(rc = sess_step(a->S, m.tok, m.slots, m.n, ids, NULL, &e)))
        for (int i = 0; i < m.n; i++) drawn[m.slots[i]] = ids[i];
    }
    if (rc) break;
    double ms = mj_now_ms() - t0;
    pthread_mutex_lock(&a->lock);
    step ? count_step(a, 0, 0, m.n, ms, true) : count_step(a, m.n, 1, 0, 0, true);
    pthread_mutex_unlock(&a->lock);
  }
  if (rc) {
    pthread_mutex_lock(&a->lock);
    if (a->eng_err.code == MJ_OK) mj_fail(&a->eng_err, e.code, "%s", e.msg);
    pthread_mutex_unlock(&a->lock);
  }
  mj_err_clear(&e);
  free(drawn), free(ids), free(slotv);
}

static int open_session(moejit *a, mj_err *err) {
  if (a->backend == SESS_CUDA) {
    int rc = cu_bind_thread(err);
    if (rc) return rc;
  }
  sess_opts so;
  sess_opts_default(&so);
  so.backend = a->backend;
  so.slots = a->slots;
  so.max_ctx = a->ctx;
  so.threads = a->o.threads > 0 ? a->o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  so.gpu.use_graphs = !a->o.no_graphs;
  for (int i = 0; i < a->o.n_graph_batch_sizes; i++) so.gpu.graph_batches[i] = a->graph[i];
  so.gpu.n_graph_batches = a->o.n_graph_batch_sizes;
  so.gpu.quiet = a->o.quiet;
  /* the device draws with the default filters and seed */
  const sample_params *d = &a->dflt;
  so.gpu.sampling = sample_filters(d->temperature, d->top_k, d->top_p, d->min_p, d->seed);
  so.trace_path = a->x.trace_path;
  so.model_name = a->x.model_name ? a->x.model_name : a->path;
  so.gpu.tp = a->x.tp, so.gpu.ep = a->x.ep, so.gpu.rank = a->x.rank, so.gpu.coll = a->x.coll;
  so.no_logprobs = a->x.follow; /* rank 0 alone emits events: a follower's would cost O(vocab) a token for nothing */
  if (!a->x.follow) so.on_queued = on_queued, so.on_queued_ctx = a; /* a follower has no pollers */
  return sess_create(a->m, &so, &a->S, err);
}

static void *engine_main(void *arg) {
  moejit *a = arg;
  pthread_setname_np(pthread_self(), "moejit-engine");
  mj_err e = {0};
  int rc = open_session(a, &e);
  pthread_mutex_lock(&a->lock);
  a->start_rc = rc;
  a->start_err = e;
  a->ready = true;
  pthread_cond_broadcast(&a->work);
  pthread_mutex_unlock(&a->lock);
  if (rc) return NULL;
  if (a->x.follow) {
    follow_loop(a);
  } else {
    engine_loop(a);
    mj_err le = {0};
    if (lead(a, CTL_END, -1, 0, NULL, NULL, NULL, &le)) mj_err_clear(&le); /* followers gone already: nothing to end */
  }
  mj_err ce = {0};
  int cr = sess_close(a->S, &ce);
  pthread_mutex_lock(&a->lock); /* api_follow_wait reads eng_err */
  if (cr && a->eng_err.code == MJ_OK) a->eng_err = ce;
  else mj_err_clear(&ce);
  a->S = NULL;
  a->followed = a->x.follow; /* a follower's engine has ended, its session closed */
  pthread_cond_broadcast(&a->closing_cv);
  pthread_mutex_unlock(&a->lock);
  return NULL;
}

int api_follow_wait(moejit *a, mj_err *err) {
  if (!a->started || !a->x.follow) return mj_fail(err, MJ_EINTERNAL, "api_follow_wait: not a started follower");
  pthread_mutex_lock(&a->lock);
  while (!a->followed) pthread_cond_wait(&a->closing_cv, &a->lock);
  int rc = a->eng_err.code;
  if (rc) mj_fail(err, a->eng_err.code, "%s", a->eng_err.msg);
  pthread_mutex_unlock(&a->lock);
  return rc;
}

/* ---- polling ------------------------------------------------------------------------------ */
uint64_t api_idle_wakeups(moejit *a) {
  pthread_mutex_lock(&a->lock);
  uint64_t n = a->idle_wakeups;
  pthread_mutex_unlock(&a->lock);
  return n;
}

moejit_status moejit_poll(moejit *a, uint64_t id, moejit_event *ev, int timeout_ms) {
  if (!a || !ev) return failf(MOEJIT_EINVAL, "moejit_poll: NULL argument");
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (timeout_ms > 0) {
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  }
  moejit_status st = MOEJIT_OK;
  api_ev *old = park_take(a), *e = NULL;
  pthread_mutex_lock(&a->lock);
  a->pollers++;
  api_req *q = find(a, id);
  if (!q) st = failf(MOEJIT_ENOTFOUND, "moejit_poll: no request %llu", (unsigned long long)id);
  else if (q->fn) st = failf(MOEJIT_EINVAL, "moejit_poll: request %llu has a callback", (unsigned long long)id);
  /* A held request's events are ready once its last is queued (REQ_DONE). */
#define READY(q) ((q)->qhead && (!(q)->hold || (q)->state == REQ_DONE))
  while (!st && !READY(q)) {
    if (timeout_ms == 0 ||
        (timeout_ms > 0 ? pthread_cond_timedwait(&q->cv, &a->lock, &until) : pthread_cond_wait(&q->cv, &a->lock)) ==
            ETIMEDOUT) {
      if (!READY(q))
        st = failf(MOEJIT_ETIMEDOUT, q->hold ? "moejit_poll: request %llu (its events held) did not end within %d ms"
                                             : "moejit_poll: no event of request %llu within %d ms",
                   (unsigned long long)id, timeout_ms);
    } else if (!READY(q)) {
      a->idle_wakeups++;
    }
  }
#undef READY
  if (!st) {
    e = q->qhead;
    if (!(q->qhead = e->next)) q->qtail = NULL;
    *ev = e->ev;
    if (ev->finish != MOEJIT_FINISH_NONE && (unlink_req(a, q), req_let_go(q))) req_free(q);
  }
  a->pollers--;
  if (a->closing) pthread_cond_broadcast(&a->closing_cv);
  pthread_mutex_unlock(&a->lock);
  park_put(a, old, e);
  return st;
}

moejit_status moejit_release(moejit *a, uint64_t id) {
  if (!a) return failf(MOEJIT_EINVAL, "moejit_release: NULL handle");
  unpark(a);
  pthread_mutex_lock(&a->lock);
  api_req *q = find(a, id);
  moejit_status st = MOEJIT_OK;
  if (!q) st = failf(MOEJIT_ENOTFOUND, "moejit_release: no request %llu", (unsigned long long)id);
  else if (q->fn) st = failf(MOEJIT_EINVAL, "moejit_release: request %llu has a callback", (unsigned long long)id);
  else if (q->state == REQ_DONE) {
    if ((unlink_req(a, q), req_let_go(q))) req_free(q);
  } else {
    q->released = q->cancel = true;
    for (api_ev *e = q->qhead, *n; e; e = n) n = e->next, free(e);
    q->qhead = q->qtail = NULL;
    pthread_cond_signal(&a->work);
    unlink_req(a, q); /* forgotten now; the engine frees it at its last event */
  }
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- counters ------------------------------------------------------------------------------ */
moejit_status moejit_get_stats(moejit *a, moejit_stats *out) {
  if (!a || !out) return failf(MOEJIT_EINVAL, "moejit_get_stats: NULL argument");
  pthread_mutex_lock(&a->lock);
  *out = a->st;
  out->queue_depth = (uint32_t)a->nwait;
  out->running = (uint32_t)a->nrun;
  out->broken = a->ranks_lost;
  pthread_mutex_unlock(&a->lock);
  cache_stats cs;
  jit_stats(&cs);
  out->kernel_cache_hits = cs.v[CACHE_STAT_mem_hits] + cs.v[CACHE_STAT_disk_hits];
  out->kernel_cache_misses = cs.v[CACHE_STAT_misses];
  out->kernel_compiles = cs.v[CACHE_STAT_compiles];
  return MOEJIT_OK;
}

/* ---- closing ------------------------------------------------------------------------------- */
int api_close(moejit *a, int drain_ms, mj_err *err) {
  if (!a) return 0;
  if (a->started) {
    pthread_mutex_lock(&a->lock);
    a->closing = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
    /* Drain: wait for the engine to run dry, up to drain_ms, then cancel
     * what is left (the engine ends each at its next step boundary). */
    if (drain_ms != 0) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_sec += drain_ms / 1000;
      until.tv_nsec += (long)(drain_ms % 1000) * 1000000L;
      if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
      pthread_mutex_lock(&a->lock);
      while ((a->nrun > 0 || a->whead) &&
             (drain_ms < 0 ? pthread_cond_wait(&a->closing_cv, &a->lock)
                           : pthread_cond_timedwait(&a->closing_cv, &a->lock, &until)) !=
                 ETIMEDOUT) {
      }
      pthread_mutex_unlock(&a->lock);
    }
    pthread_mutex_lock(&a->lock);
    a->cancel_all = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->thread, NULL);
    waker_stop(a); /* no request is freed while it may signal one */
    /* pollers woken by the last events leave before anything is freed */
    pthread_mutex_lock(&a->lock);
    while (a->pollers > 0) pthread_cond_wait(&a->closing_cv, &a->lock);
    pthread_mutex_unlock(&a->lock);
  }
  int rc = a->eng_err.code;
  if (rc && err) {
    mj_fail(err, a->eng_err.code, "%s", a->eng_err.msg);
    mj_err_set_detail(err, a->eng_err.detail);
  }
  mj_err_clear(&a->eng_err);
  mj_err_clear(&a->start_err);
  mj_err_clear(&a->chat_err);
  for (size_t i = 0; i < a->tab_size; i++)
    for (api_req *q = a->tab[i], *n; q; q = n) n = q->hnext, req_free(q);
  free(a->tab);
  /* The events other threads parked from a go at their next poll or exit;
   * they hold no pointer into a. */
  unpark(a);
  sess_destroy(a->S); /* only when the engine never ran */
  if (a->tok) tok_destroy(a->tok);
  if (a->m) model_free(a->m);
  free(a->owner), free(a->wake), free(a->pend), free(a->batch), free(a->path), free(a->name);
  pthread_mutex_destroy(&a->lock);
  pthread_mutex_destroy(&a->tok_lock);
  pthread_cond_destroy(&a->work);
  pthread_cond_destroy(&a->closing_cv);
  pthread_cond_destroy(&a->waker_cv);
  pthread_condattr_destroy(&a->cattr);
  free(a);
  return rc;
}

moejit_status moejit_close(moejit *a, int drain_ms) {
  if (!a) return MOEJIT_OK;
  if (a->started && pthread_equal(pthread_self(), a->thread))
    return failf(MOEJIT_EINVAL, "moejit_close: called from a callback (the engine thread)");
  mj_err err = {0};
  int rc = api_close(a, drain_ms, &err);
  return rc ? fail_err(status_of((mj_code)rc, MOEJIT_EINTERNAL), &err) : MOEJIT_OK;
}
