// oracle.mjs: the reference side of tests/tokenizer.sh.
//
// Usage: node oracle.mjs TOKENIZER.json FILE...
// For every line of every FILE (split on \n bytes, then decoded from UTF-8
// with U+FFFD for invalid bytes, which is how a string reaches the Hugging
// Face tokenizers), and then for each whole FILE as one text, prints one
// record: the token ids separated by spaces, a TAB, and the decoded text of
// those ids as a JSON string.  Encoding adds the post-processor's special
// tokens (add_special_tokens true); decoding keeps special tokens and does
// no clean-up of spaces, which is what tokenizer.json itself specifies.
// The implementation is @huggingface/tokenizers (tokenizers.js), pinned in
// package-lock.json.
import fs from "fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, ...files] = process.argv.slice(2);
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
// tokenizers.js translates the \\s of Split patterns to Unicode White_Space,
// as the Rust library means it, but runs ByteLevel's built-in GPT-2 pattern
// with JavaScript's \\s (which adds U+FEFF and lacks U+0085).  Correct that
// one pattern so the oracle agrees with the Rust library.
function fixByteLevel(p) {
  if (!p) return;
  if (p.constructor?.name === "ByteLevel" && p.pattern instanceof RegExp) {
    const src = p.pattern.source.replaceAll("\\s", "\\p{White_Space}").replaceAll("\\S", "\\P{White_Space}");
    p.pattern = new RegExp(src, p.pattern.flags);
  }
  for (const q of p.tokenizers ?? []) fixByteLevel(q);
}
fixByteLevel(tokenizer.pre_tokenizer);
const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const out = [];
function record(text) {
  const ids = tokenizer.encode(text, { add_special_tokens: true }).ids;
  const decoded = ids.length
    ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
    : "";
  out.push(ids.join(" ") + "\t" + JSON.stringify(decoded));
}
for (const f of files) {
  const data = fs.readFileSync(f);
  let start = 0;
  for (let i = 0; i < data.length; i++) {
    if (data[i] === 0x0a) {
      record(utf8.decode(data.subarray(start, i)));
      start = i + 1;
    }
  }
  if (start < data.length) record(utf8.decode(data.subarray(start)));
  record(utf8.decode(data));
}
process.stdout.write(out.join("\n") + "\n");
