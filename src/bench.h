/* bench.h: the subcommands of `moejit bench` that live in files of their
 * own (src/bench.c dispatches: gemv is there, moe in bench_moe.c, decode in
 * bench_decode.c).  Command layer: linked into the program only.  Their
 * timing comes from timing.h.
 */
#ifndef MOEJIT_BENCH_H
#define MOEJIT_BENCH_H

#include "util.h"

int bench_moe(int argc, char **argv, mj_err *err);
int bench_decode(int argc, char **argv, mj_err *err);

#endif
