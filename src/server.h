/* server.h: the HTTP server of `moejit serve` (src/server.c): OpenAI's
 * completion and chat routes, models, health and Prometheus metrics over
 * libmicrohttpd, on one engine of the public C API (moejit.h).
 *
 * The server owns no model and no session: it parses requests (openai.h),
 * submits each to the engine, and relays the engine's events to the client,
 * whole or as server-sent events.  Every request's slot in the engine is the
 * engine's business (continuous batching of all clients); the server bounds
 * what clients can hold: connections, body bytes, the time a request may
 * take to arrive, the idle time of a connection.  docs/serve.md describes
 * the routes, errors and limits.  Linked into the program only (it needs
 * libmicrohttpd).  Prefix: srv_.
 */
#ifndef MOEJIT_SERVER_H
#define MOEJIT_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moejit.h"
#include "util.h"

typedef struct srv_opts {
  const char *host;        /* the address to listen on (default "127.0.0.1"; a name or an IPv4/IPv6 literal) */
  int port;                /* default 8000; 0: an ephemeral port (srv_port says which) */
  const char *const *api_keys; /* n_api_keys keys (copied): /v1/ routes want "Authorization: Bearer KEY" */
  int n_api_keys;              /* with any of them; 0 (default): no key asked */
  const char *model_name;  /* the model's id in /v1/models and responses */
  size_t max_body;         /* request body bytes (default 1 MiB); more is 413 */
  int max_connections;     /* open connections (default 128); more are refused at accept */
  int idle_timeout_s;      /* a connection silent this long is closed (default 60) */
  int request_timeout_s;   /* a request's headers and body must arrive within this (default 30) */
  int default_max_tokens;  /* /v1/completions without max_tokens (default 16, OpenAI's) */
} srv_opts;

void srv_opts_init(srv_opts *o);

typedef struct srv srv;

/* The longest API key taken, the most keys, the largest key file. */
#define SRV_MAX_KEY 512
#define SRV_MAX_KEYS 1024
#define SRV_MAX_KEY_FILE (1 << 20)

/* Is k an API key a bearer header can carry: 1 to SRV_MAX_KEY visible ASCII
 * characters (0x21-0x7e: no spaces, no control characters)? */
bool srv_key_valid(const char *k);

/* A served model name (`--served-model-name`, vLLM's flag): 1 to
 * SRV_MAX_MODEL_NAME visible ASCII characters, as an id in a path
 * (/v1/models/ID) and a request's "model" can carry it. */
#define SRV_MAX_MODEL_NAME 256
bool srv_model_name_valid(const char *name);

/* Check o (ranges, the keys; the host resolves) without listening, so a command can
 * refuse a bad flag before it loads a model.  MJ_EUSAGE naming the flag. */
int srv_check(const srv_opts *o, mj_err *err);

/* Listen and serve on engine (which the caller opened and closes after
 * srv_destroy).  MJ_EUSAGE for a bad option, MJ_EIO when the address
 * cannot be bound. */
int srv_start(moejit *engine, const srv_opts *o, srv **out, mj_err *err);
int srv_port(const srv *s);       /* the port bound (the real one for port 0) */

/* Shutdown, in steps: srv_drain makes every new request 503; srv_in_flight
 * counts requests the engine still runs for clients; srv_cancel_all cancels
 * them (each client gets its answer: an error, or the end of its stream);
 * srv_destroy closes every connection and frees the server. */
void srv_drain(srv *s);
int srv_in_flight(srv *s);
void srv_cancel_all(srv *s);
void srv_destroy(srv *s);

#endif
