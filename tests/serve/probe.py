"""probe.py: the clients of tests/serve.sh that curl cannot be, on raw sockets,
and the readers of what the clients got.

    probe.py truncated PORT            a body shorter than its Content-Length, then close
    probe.py slow PORT                 one byte a second; says when the server closed
    probe.py keepalive PORT SECONDS    GET /health, silent SECONDS on the same connection, GET again
    probe.py slow_next PORT            GET /health, then the next request one byte a second
    probe.py disconnect PORT KEY [N [STREAM]]  a stream of N choices (default 1) read for one event, then
                                       closed; STREAM 0: a whole request, closed after 0.5 s
    probe.py sse FILE                  a saved SSE body: {"text", "finish", "chunks", "done", "usage", "error",
                                       "choices" (each index's text, finish, chunks), "indices"}
    probe.py logprobs FILE N GREEDY    a response's log probabilities well-formed (below); exit 1 when not
    probe.py field FILE PATH           a JSON file's value at a.b.0.c (JSON-encoded)
    probe.py metric PORT NAME          a /metrics sample's value
    probe.py rss PID                   VmRSS in KiB
"""
import json
import socket
import sys
import time
import urllib.request


def connect(port):
    return socket.create_connection(("127.0.0.1", int(port)), timeout=30)


def truncated(port):
    s = connect(port)
    body = b'{"prompt":"x",'
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n" + body)
    time.sleep(0.2)
    s.close()
    print("sent %d of 100 bytes, closed" % len(body))


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def answer(s):
    """One response (its body by Content-Length): the status line, or None when the server closed first."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return None
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
        while len(body) < n:
            chunk = s.recv(4096)
            if not chunk:
                return None
            body += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None
    return head.split(b"\r\n")[0].decode()


def keepalive(port, seconds):
    s = connect(port)
    s.sendall(HEALTH)
    if answer(s) is None:
        print("closed before the first answer")
        return
    t0 = time.time()
    s.settimeout(float(seconds))
    try:
        got = s.recv(1)
        print("closed by the server after %.0f s silent" % (time.time() - t0) if not got else "unasked bytes: %r" % got)
        return
    except socket.timeout:
        pass
    except ConnectionResetError:
        print("closed by the server after %.0f s silent" % (time.time() - t0))
        return
    s.settimeout(30)
    try:
        s.sendall(HEALTH)
    except (ConnectionResetError, BrokenPipeError):
        pass
    st = answer(s)
    print("answered again after %s s silent: %s" % (seconds, st) if st else "closed at the second request after %s s silent" % seconds)


def trickle(s, t0):
    """The slow client: a request one byte a second; says when the server closed (seconds since t0)."""
    s.settimeout(1.0)
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + b"x" * 20
    for i, b in enumerate(req):
        try:
            s.send(bytes([b]))
            got = s.recv(4096)
            if not got:
                print("closed after %.0f s, %d bytes sent" % (time.time() - t0, i + 1))
                return
            print("answered after %.0f s: %r" % (time.time() - t0, got[:40]))
            return
        except socket.timeout:
            pass
        except (ConnectionResetError, BrokenPipeError):
            print("closed after %.0f s, %d bytes sent" % (time.time() - t0, i + 1))
            return
    print("open after %.0f s: all %d bytes sent" % (time.time() - t0, len(req)))


def slow(port):
    s = connect(port)
    trickle(s, time.time())


def slow_next(port):
    s = connect(port)
    s.sendall(HEALTH)
    if answer(s) is None:
        print("closed before the first answer")
        return
    trickle(s, time.time())


def disconnect(port, key, n="1", stream="1"):
    """A long request of n choices, dropped after its first event (streamed) or after 0.5 s (whole)."""
    s = connect(port)
    body = json.dumps({"prompt": "a long answer", "max_tokens": 2000, "stream": stream == "1", "seed": 1,
                       "ignore_eos": True, "n": int(n)}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    if stream != "1":
        time.sleep(0.5)
        s.close()
        print("sent a whole request of %s choices, closed after 0.5 s" % n)
        return
    while b"data: " not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    print("read %d bytes (%s), closed" % (len(got), got.split(b"\r\n")[0].decode()))


def sse(path):
    text, finish, chunks, done, usage, error = "", None, 0, False, None, None
    by = {}  # index: {"text", "finish", "chunks", "first_role"}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            d = json.loads(data)
            if "error" in d:
                error = d["error"]
                continue
            if d.get("usage"):
                usage = d["usage"]
            for c in d["choices"]:
                chunks += 1
                piece = c["delta"].get("content", "") if "delta" in c else c["text"]
                text += piece
                finish = c["finish_reason"] or finish
                one = by.setdefault(c["index"], {"text": "", "finish": None, "chunks": 0,
                                                 "first_role": "delta" in c and "role" in c["delta"]})
                one["text"] += piece
                one["chunks"] += 1
                if one["finish"] is not None:
                    one["after_finish"] = True  # a chunk after the choice's last: wrong
                one["finish"] = c["finish_reason"]
    print(json.dumps({"text": text, "finish": finish, "chunks": chunks, "done": done, "usage": usage, "error": error,
                      "choices": [by[i] for i in sorted(by)], "indices": sorted(by)}))


def collect(path):
    """A whole response, an SSE body, or the openai client's record ({"kind", "text", "parts", "tokens"}),
    as that record: parts are the choice's logprobs objects, one per chunk (or the one of a response)."""
    raw = open(path, encoding="utf-8").read()
    if raw.startswith("data: "):
        kind, text, parts = None, "", []
        for line in raw.splitlines():
            if not line.startswith("data: ") or line[6:] == "[DONE]":
                continue
            d = json.loads(line[6:])
            for c in d["choices"]:
                kind = "chat" if "delta" in c else "completion"
                text += c["delta"].get("content", "") if kind == "chat" else c["text"]
                if c["logprobs"] is not None:
                    parts.append(c["logprobs"])
        return {"kind": kind, "text": text, "parts": parts, "tokens": None}
    d = json.loads(raw)
    if "choices" not in d:
        return d
    c = d["choices"][0]
    kind = "chat" if "message" in c else "completion"
    return {"kind": kind, "text": c["message"]["content"] if kind == "chat" else c["text"], "parts": [c["logprobs"]],
            "tokens": d["usage"]["completion_tokens"]}


def logprobs(path, n, greedy):
    """Each token's log probability a number in [-9999, 0], its top list of N (chat: sorted, with bytes that are
    the token's UTF-8; completions: an object of at most N + 1, text_offset counting characters), one entry a
    token, the tokens joined the text; GREEDY 1: the token is the most likely."""
    r, n, greedy = collect(path), int(n), greedy == "1"
    toks, problems = [], []

    def lp_ok(v, what):
        if not isinstance(v, (int, float)) or not -9999 <= v <= 0:
            problems.append("%s: logprob %r" % (what, v))

    for p in r["parts"]:
        if r["kind"] == "chat":
            if set(p) != {"content", "refusal"} or p["refusal"] is not None:
                problems.append("chat logprobs keys %r" % sorted(p))
            for e in p["content"]:
                toks.append(e["token"])
                lp_ok(e["logprob"], e["token"])
                if e["bytes"] != list(e["token"].encode()):
                    problems.append("bytes %r of %r" % (e["bytes"], e["token"]))
                top = e["top_logprobs"]
                if len(top) != n or any(t["bytes"] != list(t["token"].encode()) for t in top):
                    problems.append("top_logprobs %r" % top)
                for t in top:
                    lp_ok(t["logprob"], "top " + t["token"])
                if [t["logprob"] for t in top] != sorted((t["logprob"] for t in top), reverse=True):
                    problems.append("top_logprobs not in order: %r" % top)
                if greedy and top and top[0]["logprob"] != e["logprob"]:
                    problems.append("greedy %r is not the most likely of %r" % (e, top))
        else:
            cols = [p[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")]
            if len(set(map(len, cols))) != 1:
                problems.append("columns of unequal lengths: %r" % p)
            for tok, lp, top, off in zip(*cols):
                if off != sum(len(t) for t in toks):
                    problems.append("text_offset %d of %r" % (off, tok))
                toks.append(tok)
                lp_ok(lp, tok)
                if not 1 <= len(top) <= n + 1 or (tok in top and top[tok] < lp and not greedy):
                    problems.append("top_logprobs %r of %r" % (top, tok))
                for k, v in top.items():
                    lp_ok(v, "top " + k)
                if greedy and max(top.values()) != lp:
                    problems.append("greedy %r (%r) is not the most likely of %r" % (tok, lp, top))
    if r["tokens"] is not None and len(toks) != r["tokens"]:
        problems.append("%d entries for %d tokens" % (len(toks), r["tokens"]))
    if "".join(toks) != r["text"]:
        problems.append("the tokens %r do not join to the text %r" % (toks, r["text"]))
    if not toks:
        problems.append("no tokens")
    if problems:
        print("; ".join(problems[:5]))
        sys.exit(1)
    lps = [v for p in r["parts"] for v in ([e["logprob"] for e in p["content"]] if r["kind"] == "chat" else p["token_logprobs"])]
    print("%s: %d tokens, %d parts, logprobs %.3g..%.3g" % (r["kind"], len(toks), len(r["parts"]), min(lps), max(lps)))


def field(path, at):
    with open(path, encoding="utf-8") as f:
        v = json.load(f)
    for k in at.split("."):
        v = v[int(k)] if isinstance(v, list) else v[k]
    print(json.dumps(v))


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.split(" ")[0] == name:
                print(line.split(" ")[1])
                return
    print("absent")


def rss(pid):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                print(line.split()[1])


{"truncated": truncated, "slow": slow, "keepalive": keepalive, "slow_next": slow_next, "disconnect": disconnect,
 "sse": sse, "logprobs": logprobs, "field": field, "metric": metric, "rss": rss}[sys.argv[1]](*sys.argv[2:])
