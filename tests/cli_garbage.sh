#!/bin/sh
# cli_garbage.sh: every subcommand (the MJ_COMMANDS table of src/cli.h),
# given garbage arguments, answers with status 1 and exactly one line on
# stderr ("moejit: ..."): never a crash, an abort, a stack trace, a
# sanitizer report or a silent success.  Garbage: an unknown long and short
# option, a stray argument, and every long option of the command's --help
# given an empty value (no option takes one), and every option given
# "nan" or an out-of-range integer after valid arguments.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
n=0
$MOEJIT mkmodel --preset tiny --out "$tmp/m" -q || { echo "FAIL mkmodel"; exit 1; }
"$builddir/tests/test_replay" --write-trace "$tmp/t.jsonl" || { echo "FAIL writing a trace"; exit 1; }
mkdir "$tmp/cache" "$tmp/work"
cd "$tmp/work" || exit 1 # a mistaken success must not write into the tree

# Valid arguments for each command, so that an option's value is what fails.
base() {
  case $1 in
  compile) echo "$srcdir/tests/fuzz/dsl/rowsum.k --emit ptx -o /dev/null" ;;
  tokenize) echo "--tokenizer $srcdir/tests/data/glm-tiny-tokenizer.json" ;;
  generate) echo "-m $tmp/m -p hi -n 2 -q" ;;
  info) echo "-m $tmp/m" ;;
  mkmodel) echo "--out $tmp/mk --force -q" ;;
  forward) echo "-m $tmp/m --tokens 1,2 --steps 1" ;;
  cache) echo "stats --dir $tmp/cache" ;;
  bench) echo "gemv" ;;
  trace) echo "synth -o $tmp/trace.jsonl" ;;
  replay) echo "$tmp/t.jsonl --dry-run" ;;
  esac
}

# check CMD ARGS...: status 1 and one line starting "moejit: ".
check() {
  n=$((n + 1))
  "$MOEJIT" "$@" < /dev/null > "$tmp/out" 2> "$tmp/err"
  status=$?
  lines=$(wc -l < "$tmp/err")
  if [ "$status" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q '^moejit: ' "$tmp/err"; then
    echo "FAIL moejit $*: status $status, $lines lines on stderr:"
    head -n 5 "$tmp/err" | sed 's/^/    /'
    fail=1
  fi
}

commands=$(sed -n 's/^  X(\([a-z]*\),.*/\1/p' "$srcdir/src/cli.h")
[ -n "$commands" ] || { echo "FAIL: no commands found in src/cli.h"; exit 1; }
for c in $commands; do
  check "$c" --frobnicate
  check "$c" -Z
  check "$c" --frobnicate=1 x
  case $c in
  help) check help @@garbage@@ ;;
  compile) check compile "$srcdir/tests/fuzz/dsl/rowsum.k" "$srcdir/tests/fuzz/dsl/gemv.k" ;;
  tokenize) ;; # every positional argument is text
  *) check "$c" $(base "$c") @@garbage@@ ;;
  esac
  [ "$c" = help ] && continue
  for o in $("$MOEJIT" "$c" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
    [ "$o" = --help ] && continue
    # shellcheck disable=SC2046
    check "$c" $(base "$c") "$o="
    case $o in
    --json | --chat | --no-think | --nvfp4 | --force | --absorbed | --ids | --pieces | --pieces* ) ;;
    --model | --tokenizer | --out | --dir | --output | --prompt | --system | --preset | --arch | --emit | \
    --backend | --indexer-types | --tokens | --max | --configs | --config | --logits | --choices | --trace) ;;
    # serve: any key is a key, any name a served model name, and a host name is looked up (no DNS in tests)
    --api-key | --served-model-name | --host) ;;
    *)
      check "$c" $(base "$c") "$o=nan"
      check "$c" $(base "$c") "$o=-99999999999999999999"
      ;;
    esac
  done
done
# Values that parse but are out of range.
check generate $(base generate) --threads=-1
check generate $(base generate) --ctx=-5
check generate $(base generate) --temp=inf
check forward $(base forward) --threads=0
check mkmodel $(base mkmodel) --experts=-1
check mkmodel $(base mkmodel) --experts=99999999999
check mkmodel $(base mkmodel) --vocab=99999999999
check mkmodel $(base mkmodel) --shared-experts=99999999999
check mkmodel $(base mkmodel) --layers=-1
check mkmodel $(base mkmodel) --merges=-1
check mkmodel $(base mkmodel) --threads=99999999999
check forward -m "$tmp/m" --tokens 1,99999
grep -q -- "--tokens: id 99999 is outside the vocabulary" "$tmp/err" || { echo "FAIL forward --tokens 99999 names the argument: $(cat "$tmp/err")"; fail=1; }
check cache stats --dir=
[ -z "$(ls "$tmp/work")" ] || { echo "FAIL: garbage arguments wrote $(ls "$tmp/work")"; fail=1; }
echo "$n garbage command lines checked"
exit $fail
