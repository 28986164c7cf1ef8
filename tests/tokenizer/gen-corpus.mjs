// gen-corpus.mjs: writes corpus.txt and invalid-utf8.txt, the texts that
// tests/tokenizer.sh encodes with moejit and with the JavaScript oracle.
//
// Usage: node tests/tokenizer/gen-corpus.mjs   (from the repository root)
// The output is committed; rerun only to change the corpus.  It is
// deterministic (a fixed-seed PRNG), so a rerun without edits rewrites the
// same files.  Each line of corpus.txt is one test case; some lines end in
// CR (the file has CRLF there) and the test also encodes the whole file as
// one text, which covers newlines, CRLF and whitespace runs across lines.
import fs from "fs";
import path from "path";

const here = path.dirname(new URL(import.meta.url).pathname);
let seed = 0x9e3779b9;
function rnd() {
  // xorshift32: small, deterministic across Node versions
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const prose = [
  // English, with contractions and case
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure they'll say it's fine, but we'd better check what you've done.",
  "DON'T SHOUT: THEY'RE LISTENING, AREN'T THEY? I'LL BE QUIET.",
  "She said \"hello\" and he replied 'goodbye' (twice) -- then left...",
  "Mr. O'Neil's cat isn't Ms. D'Arcy's; the dog's bowl is empty.",
  "e-mail: first.last+tag@example.com, web: https://example.org/path?q=1&r=2#frag",
  "Prices rose 3.5% to $1,234.56 (vs. €1.099,00 last year) on 2024-03-15.",
  // German, French, Spanish, Portuguese, Italian, Polish, Czech, Turkish, Vietnamese
  "Größenwahn und Übermut: Der Straßenbahnfahrer aß süße Äpfel.",
  "L'été dernier, où étiez-vous ? Ça m'étonne qu'il ne soit pas venu à Noël.",
  "¿Dónde está la biblioteca? ¡Qué día tan bonito! El niño comió piña.",
  "A instituição não tem condições de pagar as ações; coração e pão.",
  "Perché non è venuto? Più tardi andrò là con Niccolò.",
  "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
  "Příliš žluťoučký kůň úpěl ďábelské ódy.",
  "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul'da ılık bir gün.",
  "Tiếng Việt có nhiều dấu: người, được, những, trường hợp đặc biệt.",
  // Russian, Ukrainian, Greek
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Широкая электрификация южных губерний даст мощный толчок подъёму сельского хозяйства.",
  "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Τάχιστη αλώπηξ βαφής ψημένη γη.",
  "Η γλώσσα μου έδωσαν ελληνική· το σπίτι φτωχικό στις αμμουδιές του Ομήρου.",
  // Chinese (simplified and traditional), Japanese, Korean
  "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
  "人工智能正在改变世界，大语言模型的推理速度越来越快。",
  "機器學習與深度學習的區別是什麼？請詳細說明。",
  "私はガラスを食べられます。それは私を傷つけません。",
  "東京タワーの高さは333メートルです。カタカナとひらがな、漢字が混ざります。",
  "ｶﾀｶﾅ（半角）と全角ＡＢＣ１２３の混在テキスト。",
  "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
  "한국어 형태소 분석은 어렵습니다. 서울특별시 강남구 테헤란로 123.",
  // Arabic, Hebrew, Persian, Hindi, Bengali, Tamil, Thai, Georgian, Armenian, Amharic
  "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم!",
  "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ، وَالكِتَابَةُ بِالتَّشْكِيلِ مُمْتِعَةٌ.",
  "אני יכול לאכול זכוכית וזה לא מזיק לי. שָׁלוֹם עוֹלָם",
  "من می توانم بدون احساس درد شیشه بخورم. کتاب‌ها روی میز هستند.",
  "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती। नमस्ते दुनिया",
  "हिन्दी में संयुक्ताक्षर: क्ष, त्र, ज्ञ, श्र, द्ध, ह्म।",
  "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।",
  "நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
  "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ ภาษาไทยไม่มีช่องว่างระหว่างคำ",
  "მინას ვჭამ და არა მტკივა. Հայերեն գրավոր լեզու։",
  "ብርጭቆ መብላት እችላለሁ፣ አይጎዳኝም።",
  // Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors
  "👩‍👩‍👧‍👦 family, 👨🏽‍💻 coder, 🏳️‍🌈 flag, 🇯🇵🇺🇸🇩🇪 flags, 1️⃣ #️⃣ keycaps",
  "👍🏻👍🏼👍🏽👍🏾👍🏿 thumbs, ❤️ vs ❤ (VS16), ☺︎ text style, 🧑‍🤝‍🧑 people",
  "😀😃😄😁😆😅🤣😂🙂🙃🫠😉😊😇🥰😍🤩😘😗☺😚😙🥲😋",
  "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland (tag sequence), 🫶🏾 heart hands, 🧔‍♀️ woman with beard",
  // Combining marks and normalization forms
  "NFC: café naïve résumé Åström Ǆ ǅ ǆ ﬁ ﬂ ẞ",
  "NFD: cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030Astro\u0308m",
  "Stacked: a\u0323\u0302 vs a\u0302\u0323 and \u1EAD; q\u0307\u0323 vs q\u0323\u0307",
  "Hangul jamo NFD: \u1100\u1161\u11A8 \u1112\u1161\u11AB\u1100\u1173\u11AF and NFC: 각 한글",
  "Singletons: \u212B (angstrom) \u2126 (ohm) \u212A (kelvin) \u0340 \u0341 \u0343 \u0344",
  "Zalgo: Z\u0351\u036B\u0343\u036A\u0302\u036B\u033D\u034F\u0334\u0319\u0324\u031E\u0349\u035A\u032F\u031E\u0320\u034DA\u036B\u0357\u0334\u0362\u0335\u031C\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030E\u0305\u035B\u0341\u0334\u033B\u0348\u034D\u0354\u0339O\u0342\u030C\u030C\u0358\u0328\u0335\u0339\u033B\u031D\u0333!",
  "Devanagari nukta: \u0915\u093C \u0958 (excluded composition), Bengali \u09C7\u09BE vs \u09CB",
  "Combining only: \u0301\u0301\u0301 leading marks, then x\u20DD enclosed, e\u0338 slashed",
  // Unicode whitespace and format characters
  "nbsp:\u00A0|ideographic:\u3000|thin:\u2009|hair:\u200A|narrow:\u202F|em:\u2003|",
  "zwsp:\u200B|zwnj:\u200C|zwj:\u200D|bom:\uFEFF|nel:\u0085|mvs:\u180E|ls:\u2028|ps:\u2029|",
  "Controls: \u0001\u0002 bell\u0007 vt\u000B ff\u000C esc\u001B[31m red\u001B[0m del\u007F",
  "Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ √(x²) = |x|; ∑ᵢ₌₁ⁿ i = n(n+1)/2; ∫₀^∞ e^{-x} dx = 1",
  "Long s and kelvin: 'ſ 'S 'K 'k 'ſt; Turkish I: İ ı; ligature: ﬆ ﬅ",
  "Rare scripts: 𐌰𐌱𐌲 (Gothic) 𓀀𓁐 (hieroglyphs) ꦲꦏ꧀ꦱꦫ (Javanese) ᠮᠣᠩᠭᠣᠯ (Mongolian)",
];

const specials = [
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
  "</tool_call>", "<|vision_start|>", "<|fim_prefix|>", "<｜begin▁of▁sentence｜>",
  "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
  "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
  "<|begin_of_image|>", "<|im_start", "|im_end|>", "<|", "|>", "<｜", "｜>", "<think",
];

const code = [
  "#include <stdio.h>",
  "int main(int argc, char **argv) {",
  "    for (int i = 0; i < argc; i++) printf(\"%s\\n\", argv[i]);",
  "\treturn argc > 1 ? EXIT_SUCCESS : EXIT_FAILURE;",
  "}",
  "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
  "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
  "def fibonacci(n: int) -> list[int]:",
  "    \"\"\"Return the first n Fibonacci numbers.\"\"\"",
  "    a, b = 0, 1",
  "    return [a := a + b for _ in range(n)]  # walrus",
  "if __name__ == \"__main__\":",
  "        print(f\"{value!r:>10} {other:08.3f}\")",
  "class Foo(Bar, metaclass=ABCMeta):",
  "{\"model_type\": \"glm_moe_dsa\", \"hidden_size\": 6144, \"rope_theta\": 1e6, \"tie\": false}",
  "[{\"id\": 1, \"tags\": [\"a\", \"b\"], \"nested\": {\"x\": null, \"y\": [1.5e-3, -2]}}]",
  "  \"eos_token_id\": [154820, 154827, 154829],",
  "#!/bin/sh",
  "set -euo pipefail; for f in *.txt; do wc -l \"$f\" | awk '{print $1}'; done",
  "grep -rn 'TODO\\|FIXME' src/ | sed -e 's/:.*//' | sort -u | xargs -I{} echo {}",
  "export PATH=\"$HOME/.local/bin:$PATH\" && cd /tmp && ls -la > out.log 2>&1 &",
  "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.uid = u.id GROUP BY u.id;",
  "fn main() { let v: Vec<u8> = (0..=255).collect(); println!(\"{:?}\", &v[..4]); }",
  "const f = async (x) => { await fetch(`/api/${x}`); return x?.y ?? 0; };",
  "<div class=\"card\"><p>Hello &amp; welcome</p><!-- comment --></div>",
  "$$\\frac{\\partial L}{\\partial w} = \\sum_i (y_i - \\hat{y}_i) x_i$$",
  "    if (x != NULL && *x == '\\0') { /* empty */ }",
  "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;k&&l||!m",
  "0x1F 0b1010 0o777 1_000_000 3.14159e+10 .5 5. -0.0 +inf NaN",
];

const words = [
  "the", "model", "token", "expert", "GPU", "kernel", "cache", "décodage", "模型", "専門家",
  "전문가", "خبير", "विशेषज्ञ", "эксперт", "ειδικός", "ผู้เชี่ยวชาญ", "🚀", "✨", "x", "I'm",
  "don't", "you'll", "WE'VE", "it'd", "3", "42", "1000", "3.14", "-7", "<|im_start|>",
  "[gMASK]", "<think>", "naïve", "cafe\u0301", "e\u0301", "\t", "  ", "...", "!!!", "?!",
  "——", "“quoted”", "«guillemets»", "「括弧」", "(paren)", "[bracket]", "{brace}", "a_b", "CamelCase",
];

const lines = [];
for (const p of prose) lines.push(p);
for (const c of code) lines.push(c);
// Numbers of many lengths and forms.
for (let len = 1; len <= 40; len++) {
  let d = "";
  for (let i = 0; i < len; i++) d += String(i === 0 ? int(1, 9) : int(0, 9));
  lines.push(d);
  lines.push(`value ${d} units`);
  lines.push(`${d.slice(0, Math.ceil(len / 2))}.${d.slice(Math.ceil(len / 2)) || "0"}`);
  lines.push(`-${d},${d}`);
}
for (let i = 0; i < 60; i++) {
  const n = int(0, 2 ** 31);
  lines.push(`${n.toLocaleString("en-US")} ${n.toString(16)} ${(n / 7).toFixed(int(0, 9))} ${n}e${int(-20, 20)}`);
}
lines.push("٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ０１２３４５６７８９ ①②③ Ⅻ ½ ¾ ²³");
// Whitespace: runs of spaces and tabs, leading and trailing, lines of only
// whitespace, CR at the end (CRLF in the file).
for (const n of [1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 32, 64, 100, 257]) {
  lines.push(" ".repeat(n) + "indented " + n);
  lines.push("gap" + " ".repeat(n) + "gap");
  lines.push("trailing" + " ".repeat(n));
  lines.push(" ".repeat(n));
  lines.push("\t".repeat(Math.min(n, 20)) + "tabs" + "\t \t".repeat(Math.min(n, 5)));
}
for (let i = 0; i < 40; i++) lines.push(`crlf line ${i} ${pick(words)} ${pick(words)}\r`);
lines.push("\r");
lines.push("only\rcarriage\rreturns\r\r");
lines.push("mixed \r \t \u00A0 \u3000 whitespace \u2003 end");
// Special-token strings alone, glued, spaced, partial.
for (const s of specials) {
  lines.push(s);
  lines.push(`text${s}text`);
  lines.push(`  ${s}  spaced `);
  lines.push(`${s}${s}${pick(specials)}`);
  lines.push(`before ${s}\tafter ${pick(words)}`);
}
lines.push("[gMASK]<sop><|system|>You are a helpful assistant.<|user|>Hi!<|assistant|><think>");
lines.push("[gMASK]<sop><|user|>翻译成英文：你好<|assistant|></think>Hello");
lines.push("<|im_start|>system\\nYou are Qwen.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>");
lines.push("<｜begin▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>\\n</think>2<｜end▁of▁sentence｜>");
// Random mixtures reach the corpus size and mix scripts within a line.
while (lines.length < 2400) {
  const k = int(1, 14);
  let s = "";
  for (let i = 0; i < k; i++) {
    const r = rnd();
    if (r < 0.55) s += pick(words);
    else if (r < 0.7) s += pick(prose).slice(0, int(1, 40));
    else if (r < 0.8) s += String(int(0, 10 ** int(1, 9)));
    else if (r < 0.88) s += pick(code).slice(int(0, 10), int(10, 60));
    else if (r < 0.93) s += pick(specials);
    else s += String.fromCodePoint(pick([0x301, 0x308, 0x1F3FB, 0x200D, 0xFE0F, 0x3000, 0xA0, 0x2028, 0x85]));
    s += pick([" ", " ", " ", "", "  ", "\t", ", ", ". ", "\u00A0"]);
  }
  lines.push(s);
}
// A few very long lines: a long word, a long digit run, a long space run.
lines.push("a".repeat(3000));
lines.push("9".repeat(1000));
lines.push("x" + " ".repeat(5000) + "y");
lines.push("中".repeat(2000));
lines.push("🎉".repeat(500));
lines.push("=".repeat(300) + "-".repeat(300));

fs.writeFileSync(path.join(here, "corpus.txt"), lines.join("\n") + "\n");

// Invalid UTF-8, one case per line: stray continuation bytes, unfinished
// sequences, overlong forms, surrogates, bytes above U+10FFFF, NUL.
const bad = [
  [0x80], [0xBF, 0x41], [0xC3], [0xC3, 0x41], [0xE4, 0xB8], [0xE4, 0xB8, 0x41],
  [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF, 0x20, 0x61], [0xC0, 0xAF], [0xE0, 0x80, 0xAF],
  [0xF0, 0x80, 0x80, 0xAF], [0xF4, 0x90, 0x80, 0x80], [0xF5, 0xF6, 0xFF, 0xFE],
  [0xF0, 0x9F, 0x98], [0xF0, 0x9F, 0x98, 0x20, 0xF0, 0x9F, 0x98, 0x80],
  [0x68, 0x69, 0x00, 0x74, 0x68, 0x65, 0x72, 0x65], [0x3C, 0x7C, 0x69, 0x6D, 0xFF, 0x7C, 0x3E],
];
const parts = [];
for (const b of bad) {
  parts.push(Buffer.from("text "), Buffer.from(b), Buffer.from(" end\n"));
  parts.push(Buffer.from(b), Buffer.from("\n"));
}
parts.push(Buffer.from("caf"), Buffer.from([0xC3]), Buffer.from("\u0301 <|im_start|>"), Buffer.from([0x80]), Buffer.from("\n"));
fs.writeFileSync(path.join(here, "invalid-utf8.txt"), Buffer.concat(parts));
console.log(`corpus.txt: ${lines.length} lines; invalid-utf8.txt: ${bad.length * 2 + 1} lines`);
