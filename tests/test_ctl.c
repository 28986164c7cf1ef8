/* test_ctl.c: the leader rank's control channel (src/ctl.{h,c}) on the
 * CPU: rank 0 listening on a Unix socket and two followers connecting
 * (one before it listens, one after), every message kind delivered whole
 * to both, a follower refusing what is not a message of this build, rank
 * 0 gone mid-message or before any, too few followers in time, and a
 * socket path too long.  test_api's test_follow runs whole engines over
 * the channel. */
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl.h"
#include "t.h"
#include "t_fs.h"

static char path[512];

typedef struct fol {
  ctl *c;
  int rc;
  char msg[1024];
  ctl_msg got[4];
  int32_t tok[4][8], slots[4][8];
} fol;

/* A follower thread: connect, then take four messages (copying their
 * arrays, which are the channel's until the next receive). */
static void *follower(void *arg) {
  fol *f = arg;
  mj_err err = {0};
  f->rc = ctl_follower(path, 5000, &f->c, &err);
  for (int i = 0; i < 4 && !f->rc; i++) {
    f->rc = ctl_recv(f->c, &f->got[i], &err);
    if (f->rc) break;
    for (int k = 0; k < f->got[i].n && k < 8; k++) {
      f->tok[i][k] = f->got[i].tok[k];
      if (f->got[i].slots) f->slots[i][k] = f->got[i].slots[k];
    }
  }
  snprintf(f->msg, sizeof f->msg, "%s", err.msg);
  mj_err_clear(&err);
  return NULL;
}

static void test_listen_and_send(void) {
  fol f[2] = {0};
  pthread_t th[2];
  pthread_create(&th[0], NULL, follower, &f[0]); /* before rank 0 listens: it retries */
  usleep(50 * 1000);
  ctl *lead = NULL;
  mj_err err = {0};
  pthread_create(&th[1], NULL, follower, &f[1]);
  T_EQ_INT(ctl_leader(path, 2, 5000, &lead, &err), 0);
  T_CHECK(access(path, F_OK) != 0); /* the name goes once every follower is in */
  int32_t prompt[3] = {7, 8, 9}, tk[2] = {11, 12}, sl[2] = {3, 0};
  sample_params sp = sample_filters(0.7f, 40, 0.95f, 0.05f, 1234);
  ctl_msg m[4] = {{.kind = CTL_ADMIT, .slot = 3, .n = 3, .sp = sp, .tok = prompt},
                  {.kind = CTL_STEP, .slot = -1, .n = 2, .tok = tk, .slots = sl},
                  {.kind = CTL_RETIRE, .slot = 3},
                  {.kind = CTL_END, .slot = -1}};
  for (int i = 0; i < 4; i++) T_EQ_INT(ctl_send(lead, &m[i], &err), 0);
  for (int k = 0; k < 2; k++) {
    pthread_join(th[k], NULL);
    T_EQ_INT(f[k].rc, 0);
    T_EQ_INT(f[k].got[0].kind, CTL_ADMIT);
    T_EQ_INT(f[k].got[0].slot, 3);
    T_EQ_INT(f[k].got[0].n, 3);
    T_CHECK(!memcmp(&f[k].got[0].sp, &sp, sizeof sp));
    T_CHECK(!memcmp(f[k].tok[0], prompt, sizeof prompt));
    T_EQ_INT(f[k].got[1].kind, CTL_STEP);
    T_EQ_INT(f[k].got[1].n, 2);
    T_CHECK(!memcmp(f[k].tok[1], tk, sizeof tk) && !memcmp(f[k].slots[1], sl, sizeof sl));
    T_EQ_INT(f[k].got[2].kind, CTL_RETIRE);
    T_EQ_INT(f[k].got[2].slot, 3);
    T_EQ_INT(f[k].got[3].kind, CTL_END);
  }
  /* A follower gone: rank 0's next send says so. */
  ctl_close(f[0].c);
  int rc = 0;
  for (int i = 0; i < 100 && !rc; i++) rc = ctl_send(lead, &m[1], &err); /* until the peer's close is seen */
  T_EQ_INT(rc, MJ_EIO);
  T_CHECK(strstr(err.msg, "a follower rank is gone") == err.msg);
  mj_err_clear(&err);
  ctl_close(f[1].c);
  ctl_close(lead);
}

static void test_bad(void) {
  mj_err err = {0};
  ctl *lead = NULL, *f = NULL;
  /* rank 0 gone before any message, and mid-message */
  T_EQ_INT(ctl_pair(&lead, &f, &err), 0);
  ctl_close(lead);
  ctl_msg m;
  T_EQ_INT(ctl_recv(f, &m, &err), MJ_EIO);
  T_EQ_STR(err.msg, "rank 0 closed the control socket without its end message (it stopped)");
  mj_err_clear(&err);
  ctl_close(f);
  /* Not a message of this build, and a torn one: a leader of our own
   * (a plain listening socket) writes them. */
  for (int torn = 0; torn < 2; torn++) {
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    T_CHECK(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    unlink(path);
    T_CHECK(ls >= 0 && !bind(ls, (struct sockaddr *)&a, sizeof a) && !listen(ls, 1));
    T_EQ_INT(ctl_follower(path, 1000, &f, &err), 0);
    int fd = accept(ls, NULL, NULL);
    char junk[sizeof(sample_params) + 64]; /* more than a header */
    memset(junk, 'x', sizeof junk);
    /* torn: the first 10 bytes of a header, then the end */
    T_EQ_INT(write(fd, junk, torn ? 10 : sizeof junk), torn ? 10L : (long)sizeof junk);
    close(fd), close(ls), unlink(path);
    T_EQ_INT(ctl_recv(f, &m, &err), MJ_EIO);
    if (torn) T_EQ_STR(err.msg, "rank 0's control socket broke mid-message");
    else T_EQ_STR(err.msg, "rank 0 sent what is not a control message of this build (magic 78787878)");
    mj_err_clear(&err);
    ctl_close(f);
  }
  /* too long a path; nobody comes in time */
  char longp[300];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  T_EQ_INT(ctl_leader(longp, 1, 100, &lead, &err), MJ_EIO);
  T_CHECK(strstr(err.msg, "control socket path is longer than") != NULL);
  mj_err_clear(&err);
  T_EQ_INT(ctl_leader(path, 1, 200, &lead, &err), MJ_EIO);
  T_CHECK(strstr(err.msg, "0 of 1 follower ranks connected within 0 s") != NULL);
  mj_err_clear(&err);
  T_EQ_INT(ctl_follower(path, 100, &f, &err), MJ_EIO);
  T_CHECK(strstr(err.msg, "cannot reach rank 0's control socket") != NULL);
  mj_err_clear(&err);
}

int main(void) {
  if (t_scratch_init("ctl")) return 1;
  snprintf(path, sizeof path, "%s/ctl.sock", t_root);
  T_RUN(test_listen_and_send);
  T_RUN(test_bad);
  return t_scratch_done(t_status());
}
