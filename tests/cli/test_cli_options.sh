#!/bin/bash
# Issue 10 item 6: one option idiom. Every subcommand answers --help (and
# -h) on stdout with exit 0, a usage line and an examples section; an
# unknown option, a missing value and a value given to a flag are refused
# with exit 2 and the same wording everywhere; operands and options mix.
. "$(dirname "$0")/lib.sh"
cli_setup options

cmds=("demo" "generate" "info" "run" "bench" "bench select" "bench pager" "bench recall"
	"bench engine" "synth" "synth corpus" "synth sample" "synth vocab" "verify" "stat")
for c in "${cmds[@]}"; do
	for h in --help -h; do
		out=$("$KVMEM" $c $h 2>"$tmp/err")
		rc=$?
		[ $rc -eq 0 ] || bad "kvmem $c $h: exit $rc"
		[ -s "$tmp/err" ] && bad "kvmem $c $h wrote to stderr: $(cat "$tmp/err")"
		grep -q "^usage: kvmem" <<<"$out" || bad "kvmem $c $h: no usage line"
		grep -q "^examples:" <<<"$out" || bad "kvmem $c $h: no examples section"
	done
done
"$KVMEM" --help | grep -q "^examples:" || bad "kvmem --help: no examples section"

# The same three errors, worded the same, for every subcommand that parses options.
for c in "demo" "generate" "info" "run" "bench select" "bench pager" "bench recall" \
	"bench engine" "synth corpus" "synth sample" "synth vocab" "verify" "stat"; do
	out=$("$KVMEM" $c --no-such-option 2>&1)
	[ $? -eq 2 ] || bad "kvmem $c --no-such-option: not exit 2"
	grep -qx "kvmem $c: unknown option '--no-such-option' (kvmem $c --help)" <<<"$out" ||
		bad "kvmem $c: unknown option message: $out"
	out=$("$KVMEM" $c --help=1 2>&1)
	[ $? -eq 2 ] && grep -qx "kvmem $c: --help takes no value" <<<"$out" ||
		bad "kvmem $c --help=1: $out"
done
for c in "demo --seed" "generate --preset" "info --model" "run --model" "bench select --policy" \
	"bench pager --dir" "bench recall --model" "synth corpus --out" "synth sample --kind"; do
	out=$("$KVMEM" $c 2>&1)
	[ $? -eq 2 ] && grep -q "^kvmem ${c% *}: ${c##* } needs a value" <<<"$out" ||
		bad "kvmem $c (no value): $out"
done

# --opt=value and --opt value are the same; operands may come first.
a=$("$KVMEM" info --json "$M")
b=$("$KVMEM" info "$M" --json)
c=$("$KVMEM" info --json --model="$M")
[ "$a" = "$b" ] && [ "$a" = "$c" ] || bad "info: option order or --model=DIR changed the output"
cli_done "option idiom"
