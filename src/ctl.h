/* ctl.h: the leader rank's schedule, sent to the follower ranks of a
 * sharded serving engine (`moejit serve --tp N --ep M`).
 *
 * A sharded step is a collective act: every rank must admit the same
 * sequence into the same slot, step the same rows in the same order and
 * retire the same slots, or their collectives pair the wrong tensors and
 * hang.  `moejit generate` gets that for free, since every rank is handed
 * the same prompts before its engine starts; a server's requests arrive on
 * rank 0 alone, at times nothing else could agree on.  So rank 0's engine
 * (the leader) decides, and sends each decision, in order, to the other
 * ranks (the followers), whose engines do nothing but replay them: admit a
 * sequence with its sampling and run its prompt, step these rows with these
 * tokens, retire this slot, end.  The tokens a follower is fed are the
 * leader's draws, so a follower's own draws can be checked against them:
 * a mismatch means the ranks' logits have parted, and the follower stops
 * with one line saying so rather than decode from another history.
 *
 * The channel is a Unix stream socket per follower (the leader listens on
 * a path in the launcher's private folder, beside the NCCL id), written
 * with plain blocking sends: a step's message is a few hundred bytes, far
 * below a socket's buffer, so the leader does not wait on a follower that
 * is busy with the same step (a prompt of more than about 50,000 tokens
 * may wait for the follower to come back to its receive; it always does).
 * Messages are a fixed 72-byte header (a magic word, the kind, the slot,
 * the count, the sampling) and the count's int32 arrays.  The leader
 * accepts only connections of its own user (SO_PEERCRED).  Prefix: ctl_.
 */
#ifndef MOEJIT_CTL_H
#define MOEJIT_CTL_H

#include <stdint.h>

#include "sample.h"
#include "util.h"

typedef struct ctl ctl;

typedef enum ctl_kind {
  CTL_ADMIT = 1, /* admit a sequence (sp) into slot and run its prompt (tok, n) */
  CTL_STEP,      /* one decode step: n rows of (tok, slots) */
  CTL_RETIRE,    /* free slot */
  CTL_END,       /* the leader is closing: the followers' engines end */
} ctl_kind;

typedef struct ctl_msg {
  ctl_kind kind;
  int32_t slot;     /* ADMIT: the slot the leader's session gave; RETIRE: the slot */
  int32_t n;        /* ADMIT: prompt tokens; STEP: rows */
  sample_params sp; /* ADMIT */
  const int32_t *tok;   /* ADMIT: the prompt; STEP: each row's token */
  const int32_t *slots; /* STEP: each row's slot */
} ctl_msg;

/* The socket's name in the launcher's private folder (serve_cmd.c; the
 * launcher removes a name a dead rank 0 left behind). */
#define CTL_SOCK_NAME "moejit-ctl.sock"

/* The most tokens a message may carry (a prompt of this many is refused by
 * the context long before). */
#define CTL_MAX_N (1 << 24)

/* The leader: listen on path (a Unix socket, made here; an old one is
 * replaced) and accept `followers` connections within timeout_ms.  MJ_EIO
 * naming the path and what failed (or how many came in time). */
int ctl_leader(const char *path, int followers, int timeout_ms, ctl **out, mj_err *err);
/* A follower: connect to path, retrying until the leader listens, within
 * timeout_ms. */
int ctl_follower(const char *path, int timeout_ms, ctl **out, mj_err *err);
/* Both ends in one process, joined by a socket pair (tests). */
int ctl_pair(ctl **leader, ctl **follower, mj_err *err);

/* Leader: m to every follower.  MJ_EIO when one is gone. */
int ctl_send(ctl *c, const ctl_msg *m, mj_err *err);
/* Follower: the next message into m (its arrays are c's until the next
 * receive).  MJ_EIO when the leader is gone (the message says whether it
 * closed cleanly mid-message or not at all) or sent what is not a message. */
int ctl_recv(ctl *c, ctl_msg *m, mj_err *err);
void ctl_close(ctl *c);

#endif
