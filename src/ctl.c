/* ctl.c: the leader's schedule to the follower ranks over Unix sockets
 * (ctl.h says why).  Blocking sends and receives of whole messages; the
 * header carries a magic word and the sampling struct's size, so a
 * follower of another build refuses the first message instead of reading
 * garbage. */
#include "ctl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CTL_MAGIC 0x4d4a4354u /* "MJCT" */

struct ctl {
  int *fd; /* the leader: one a follower; a follower: its one */
  int nfd;
  int32_t *buf; /* a follower's received arrays */
  size_t cap;
};

/* On the wire: this header, then n int32 (ADMIT) or 2n (STEP). */
typedef struct wire {
  uint32_t magic, sp_size;
  int32_t kind, slot, n, pad;
  sample_params sp;
} wire;

static ctl *ctl_new(int nfd) {
  ctl *c = mj_xcalloc(1, sizeof *c);
  c->fd = mj_xcalloc((size_t)(nfd > 0 ? nfd : 1), sizeof *c->fd);
  c->nfd = nfd;
  for (int i = 0; i < nfd; i++) c->fd[i] = -1;
  return c;
}

void ctl_close(ctl *c) {
  if (!c) return;
  for (int i = 0; i < c->nfd; i++)
    if (c->fd[i] >= 0) close(c->fd[i]);
  free(c->fd), free(c->buf), free(c);
}

static int addr_of(const char *path, struct sockaddr_un *a, mj_err *err) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a->sun_path)
    return mj_fail(err, MJ_EIO, "%s: the ranks' control socket path is longer than %zu bytes (set TMPDIR to a shorter folder)",
                   path, sizeof a->sun_path - 1);
  memcpy(a->sun_path, path, strlen(path) + 1);
  return 0;
}

int ctl_leader(const char *path, int followers, int timeout_ms, ctl **out, mj_err *err) {
  *out = NULL;
  struct sockaddr_un a;
  int r = addr_of(path, &a, err);
  if (r) return r;
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) return mj_fail(err, MJ_EIO, "%s: cannot make the ranks' control socket: %s", path, strerror(errno));
  unlink(path);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, followers)) {
    int e = errno;
    close(ls);
    return mj_fail(err, MJ_EIO, "%s: cannot listen for the follower ranks: %s", path, strerror(e));
  }
  ctl *c = ctl_new(followers);
  double until = mj_now_ms() + timeout_ms;
  int got = 0;
  while (got < followers) {
    int left = (int)(until - mj_now_ms());
    struct pollfd p = {.fd = ls, .events = POLLIN};
    int pr = left > 0 ? poll(&p, 1, left) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      r = mj_fail(err, MJ_EIO, "%s: %d of %d follower ranks connected within %d s", path, got, followers, timeout_ms / 1000);
      break;
    }
    int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      r = mj_fail(err, MJ_EIO, "%s: cannot accept a follower rank: %s", path, strerror(errno));
      break;
    }
    /* Only a process of this user is a follower: the schedule carries
     * every prompt, and the folder may be one others can reach (mpirun). */
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) || cr.uid != getuid()) {
      fprintf(stderr, "moejit: %s: refused a connection from another user (uid %d)\n", path, (int)cr.uid);
      close(fd);
      continue;
    }
    c->fd[got++] = fd;
  }
  close(ls);
  unlink(path); /* every follower is in (or none will be): the name has served */
  if (r) {
    ctl_close(c);
    return r;
  }
  *out = c;
  return 0;
}

int ctl_follower(const char *path, int timeout_ms, ctl **out, mj_err *err) {
  *out = NULL;
  struct sockaddr_un a;
  int r = addr_of(path, &a, err);
  if (r) return r;
  double until = mj_now_ms() + timeout_ms;
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return mj_fail(err, MJ_EIO, "%s: cannot make a socket: %s", path, strerror(errno));
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
      ctl *c = ctl_new(1);
      c->fd[0] = fd;
      *out = c;
      return 0;
    }
    int e = errno;
    close(fd);
    /* Not there yet, or not listening yet: rank 0 may still be starting. */
    if ((e != ENOENT && e != ECONNREFUSED && e != EINTR) || mj_now_ms() >= until)
      return mj_fail(err, MJ_EIO, "%s: cannot reach rank 0's control socket: %s", path, strerror(e));
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int ctl_pair(ctl **leader, ctl **follower, mj_err *err) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
    return mj_fail(err, MJ_EIO, "cannot make a socket pair: %s", strerror(errno));
  *leader = ctl_new(1), *follower = ctl_new(1);
  (*leader)->fd[0] = sv[0], (*follower)->fd[0] = sv[1];
  return 0;
}

static int send_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

int ctl_send(ctl *c, const ctl_msg *m, mj_err *err) {
  wire w;
  memset(&w, 0, sizeof w); /* no byte of the header unwritten on the wire */
  w.magic = CTL_MAGIC, w.sp_size = sizeof(sample_params), w.kind = m->kind, w.slot = m->slot, w.n = m->n, w.sp = m->sp;
  size_t nb = (size_t)(m->n > 0 ? m->n : 0) * sizeof(int32_t);
  for (int i = 0; i < c->nfd; i++) {
    bool ok = !send_all(c->fd[i], &w, sizeof w);
    if (ok && nb && (m->kind == CTL_ADMIT || m->kind == CTL_STEP)) ok = !send_all(c->fd[i], m->tok, nb);
    if (ok && nb && m->kind == CTL_STEP) ok = !send_all(c->fd[i], m->slots, nb);
    if (!ok) return mj_fail(err, MJ_EIO, "a follower rank is gone (its control socket: %s)", strerror(errno));
  }
  return 0;
}

/* 1 read, 0 at a clean end before any byte, -1 on an error or a torn read. */
static int recv_all(int fd, void *p, size_t n) {
  char *b = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, b + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && got == 0) return 0;
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 1;
}

int ctl_recv(ctl *c, ctl_msg *m, mj_err *err) {
  wire w;
  int r = recv_all(c->fd[0], &w, sizeof w);
  if (r == 0) return mj_fail(err, MJ_EIO, "rank 0 closed the control socket without its end message (it stopped)");
  if (r < 0) return mj_fail(err, MJ_EIO, "rank 0's control socket broke mid-message");
  if (w.magic != CTL_MAGIC || w.sp_size != sizeof(sample_params))
    return mj_fail(err, MJ_EIO, "rank 0 sent what is not a control message of this build (magic %08x)", w.magic);
  if (w.kind < CTL_ADMIT || w.kind > CTL_END || w.n < 0 || w.n > CTL_MAX_N)
    return mj_fail(err, MJ_EIO, "rank 0 sent a control message of kind %d and %d tokens", w.kind, w.n);
  *m = (ctl_msg){.kind = (ctl_kind)w.kind, .slot = w.slot, .n = w.n, .sp = w.sp};
  size_t words = w.kind == CTL_ADMIT ? (size_t)w.n : w.kind == CTL_STEP ? 2 * (size_t)w.n : 0;
  if (words > c->cap) {
    free(c->buf);
    c->buf = mj_xmalloc(words * sizeof *c->buf);
    c->cap = words;
  }
  if (words && recv_all(c->fd[0], c->buf, words * sizeof *c->buf) != 1)
    return mj_fail(err, MJ_EIO, "rank 0's control socket broke mid-message");
  m->tok = c->buf;
  m->slots = w.kind == CTL_STEP ? c->buf + w.n : NULL;
  return 0;
}
