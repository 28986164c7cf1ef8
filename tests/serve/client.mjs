// client.mjs BASE_URL API_KEY MODEL PROMPT MAX_TOKENS SEED: moejit serve as
// the official OpenAI client (the `openai` npm package, pinned in
// package-lock.json) sees it, for tests/serve.sh.  The same request goes
// four ways: a completion and a chat, each whole and streamed (the chat
// stream with stream_options.include_usage); one JSON object goes to stdout
// with each way's text, finish reason and completion token count, which the
// shell compares with `moejit generate` and with each other.  Then the four
// ways again with log probabilities (completions' logprobs 2 and 1, chat's
// top_logprobs 3 and 5), each recorded as {kind, text, parts: the choice's
// logprobs objects, tokens} for probe.py logprobs; then n 2.  The sampling
// is fixed here and in serve.sh: temperature 0.8, top_p 0.9, top_k 40
// (moejit's field beside OpenAI's), min_p 0.05.
import OpenAI from "openai";

const [base, apiKey, model, prompt, maxTokens, seed] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const sampling = { temperature: 0.8, top_p: 0.9, top_k: 40, min_p: 0.05, max_tokens: Number(maxTokens), seed: Number(seed) };
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
out.model = (await client.models.retrieve(model)).id;

const c = await client.completions.create({ model, prompt, ...sampling });
out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, tokens: c.usage.completion_tokens, object: c.object };

let text = "", finish = null, chunks = 0;
for await (const ch of await client.completions.create({ model, prompt, stream: true, ...sampling })) {
  chunks++;
  text += ch.choices[0].text;
  finish = ch.choices[0].finish_reason ?? finish;
}
out.completion_stream = { text, finish, chunks };

const messages = [{ role: "user", content: prompt }];
const r = await client.chat.completions.create({ model, messages, ...sampling });
out.chat = { text: r.choices[0].message.content, role: r.choices[0].message.role, finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };

text = "", finish = null, chunks = 0;
let usage = null;
const stream = await client.chat.completions.create({ model, messages, stream: true, stream_options: { include_usage: true }, ...sampling });
for await (const ch of stream) {
  if (ch.usage) usage = ch.usage;
  if (!ch.choices.length) continue;
  chunks++;
  text += ch.choices[0].delta.content ?? "";
  finish = ch.choices[0].finish_reason ?? finish;
}
out.chat_stream = { text, finish, chunks, tokens: usage ? usage.completion_tokens : null };

// Log probabilities, whole and streamed.
const lc = await client.completions.create({ model, prompt, logprobs: 2, ...sampling });
out.lp_completion = { kind: "completion", text: lc.choices[0].text, parts: [lc.choices[0].logprobs], tokens: lc.usage.completion_tokens };
let parts = [];
text = "";
for await (const ch of await client.completions.create({ model, prompt, stream: true, logprobs: 1, ...sampling })) {
  text += ch.choices[0].text;
  if (ch.choices[0].logprobs) parts.push(ch.choices[0].logprobs);
}
out.lp_completion_stream = { kind: "completion", text, parts, tokens: null };
const lr = await client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 3, ...sampling });
out.lp_chat = { kind: "chat", text: lr.choices[0].message.content, parts: [lr.choices[0].logprobs], tokens: lr.usage.completion_tokens };
parts = [];
text = "";
for await (const ch of await client.chat.completions.create({ model, messages, stream: true, logprobs: true, top_logprobs: 5, ...sampling })) {
  text += ch.choices[0].delta.content ?? "";
  if (ch.choices[0].logprobs) parts.push(ch.choices[0].logprobs);
}
out.lp_chat_stream = { kind: "chat", text, parts, tokens: null };

// n 2 with a seed: choice j is drawn with seed + j (whole and streamed, the
// stream's chunks gathered by index).
const n2 = await client.completions.create({ model, prompt, n: 2, ...sampling });
out.n2 = { texts: n2.choices.map((x) => x.text), index: n2.choices.map((x) => x.index), tokens: n2.usage.completion_tokens };
const n2s = ["", ""];
for await (const ch of await client.chat.completions.create({ model, messages, n: 2, stream: true, ...sampling })) {
  for (const x of ch.choices) n2s[x.index] += x.delta.content ?? "";
}
out.n2_chat_stream = { texts: n2s };

// A wrong request comes back as the client's typed error with the status.
try {
  await client.completions.create({ model, prompt, max_tokens: -1 });
  out.bad = "accepted";
} catch (e) {
  out.bad = { status: e.status, param: e.param ?? (e.error && e.error.param) };
}
try {
  await client.chat.completions.create({ model, messages, presence_penalty: 3 });
  out.bad_penalty = "accepted";
} catch (e) {
  out.bad_penalty = { status: e.status, param: e.param ?? (e.error && e.error.param) };
}
console.log(JSON.stringify(out));
