#!/bin/sh
# tokenize_cli.sh: `moejit tokenize` output formats, and its errors: one
# line naming the file or flag, exit status 1.
set -u
fixture=${srcdir:-.}/tests/data/glm-tiny-tokenizer.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0

# expect NAME WANTED_STATUS WANTED_OUTPUT_SUBSTRING -- COMMAND...
expect() {
  name=$1 want_status=$2 want=$3
  shift 4
  "$@" > "$tmp/out" 2>&1
  status=$?
  lines=$(wc -l < "$tmp/out")
  if [ "$status" -ne "$want_status" ] || ! grep -qF -- "$want" "$tmp/out" ||
     { [ "$want_status" -ne 0 ] && [ "$lines" -ne 1 ]; }; then
    echo "FAIL $name: status $status (want $want_status), output:"
    sed 's/^/  | /' "$tmp/out"
    echo "  wanted: $want"
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}

expect ids 0 "258" -- "$MOEJIT" tokenize --tokenizer "$fixture" "the the"
printf '257\n259\n111\n' > "$tmp/want"
"$MOEJIT" tokenize --tokenizer "$fixture" hello > "$tmp/got"
if cmp -s "$tmp/want" "$tmp/got"; then passes=$((passes + 1)); else echo "FAIL ids per line"; fails=$((fails + 1)); fi
expect pieces 0 "Ġthe" -- "$MOEJIT" tokenize --tokenizer "$fixture" --pieces " the"
expect json 0 '{"ids":[257,259,111]}' -- "$MOEJIT" tokenize --tokenizer "$fixture" --json hello
expect json-pieces 0 '"pieces":["he","ll","o"]' -- "$MOEJIT" tokenize --tokenizer "$fixture" --json --pieces hello
expect chat 0 '{"ids":[154822,154824,154827,104,105,154828,154841]}' -- \
  "$MOEJIT" tokenize --tokenizer "$fixture" --chat --json hi
expect chat-no-think 0 '154828,154842]' -- "$MOEJIT" tokenize --tokenizer "$fixture" --chat --no-think --json hi
mkdir "$tmp/model" && cp "$fixture" "$tmp/model/tokenizer.json"
expect model-dir 0 '{"ids":[257,259,111]}' -- "$MOEJIT" tokenize -m "$tmp/model" --json hello
printf 'hello' > "$tmp/in.txt"
expect stdin 0 '{"ids":[257,259,111]}' -- sh -c "\"$MOEJIT\" tokenize --tokenizer \"$fixture\" --json - < \"$tmp/in.txt\""

expect missing-file 1 "$tmp/nope.json: cannot open" -- "$MOEJIT" tokenize --tokenizer "$tmp/nope.json" hi
expect missing-dir 1 "$tmp/none/tokenizer.json: cannot open" -- "$MOEJIT" tokenize -m "$tmp/none" hi
printf '{"model": {\n' > "$tmp/bad.json"
expect malformed 1 "$tmp/bad.json:2:1: bad JSON" -- "$MOEJIT" tokenize --tokenizer "$tmp/bad.json" hi
printf '{"model": {"type": "Unigram", "vocab": []}}\n' > "$tmp/uni.json"
expect unsupported 1 'model type "Unigram" is not supported' -- "$MOEJIT" tokenize --tokenizer "$tmp/uni.json" hi
expect bad-flag 1 "unknown option '--bogus'" -- "$MOEJIT" tokenize --bogus --tokenizer "$fixture" hi
expect no-tokenizer 1 "give exactly one of -m DIR and --tokenizer" -- "$MOEJIT" tokenize hi
expect both 1 "give exactly one of -m DIR and --tokenizer" -- "$MOEJIT" tokenize -m "$tmp" --tokenizer "$fixture" hi
expect no-text 1 "give one TEXT argument" -- "$MOEJIT" tokenize --tokenizer "$fixture"
expect ids-pieces 1 "--ids and --pieces exclude each other" -- "$MOEJIT" tokenize --tokenizer "$fixture" --ids --pieces hi
expect no-value 1 "--tokenizer needs a value" -- "$MOEJIT" tokenize --tokenizer

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
