#!/bin/bash
# kvmem bench step --only coldin with fp8 pages, small, on the cpu backend
# (the tiny random model; a few MB of pages under $tmp):
#  - --kv-dtype fp8 writes an fp8 workspace, reads it cold into an fp8 view
#    and prints its page-in and its ceiling in tokens/s, exit 0;
#  - --kv-dtype both runs bf16 and fp8 over the same tokens in one run and
#    prints "fp8 / bf16 tokens/s = X", said "slower" below 1, "faster"
#    above; the scratch workspaces are gone after it (no --keep);
#  - --kv-dtype both --only step,decode runs the phases over bf16, then over
#    fp8 on a second backend, and prints the warm step's bf16 time / fp8
#    time and decode's fp8 / bf16 tokens/s with the issue's targets, and
#    each arm's step floor (the question over an empty view) among its peers;
#  - --policy random enters the same blocks in both dtypes (like for like);
#  - --kv-dtype fp8 --only stageout prefills through a session over an fp8
#    workspace and says so, with its ratio to the plain forward;
#  - --kv-dtype both --only remat places the same tokens' bf16 and fp8 pages
#    and prints each one's tokens/s and their ratio;
#  - bad combinations are usage errors (exit 2) naming the command and why:
#    both with stageout or with no dtype phase, fp8 with remat, an unknown
#    dtype.
. "$(dirname "$0")/lib.sh"
cli_setup bench-step-coldin
tps="= [1-9][0-9]* tokens/s"
bs() { timeout 300 "$KVMEM" bench step --backend cpu --model "$M" --dir "$tmp/scratch" "$@"; }

out=$(bs --only coldin --coldin 2M --kv-dtype fp8 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "fp8 coldin exited $rc: $(echo "$out" | tail -3)"
else
	echo "$out" | grep -q "pages fp8 of 8704 bytes" ||
		bad "fp8: the header does not say fp8 pages"
	echo "$out" | grep -qE "^  fp8: median page-in [0-9.]+ GB/s $tps; \
best median sequential read [0-9.]+ GB/s $tps" || bad "fp8: no page-in and ceiling: $out"
	echo "$out" | grep -qE "pager alone .* $tps" || bad "fp8: no pager-alone figure"
	[ "$(echo "$out" | grep -c "^  pass [123], fp8 :")" -eq 3 ] || bad "fp8: not three passes"
	echo "$out" | grep -q "fp8 / bf16" && bad "fp8 alone printed a ratio against bf16"
fi

out=$(bs --only ceilings,coldin --coldin 2M --kv-dtype both 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "--kv-dtype both exited $rc: $(echo "$out" | tail -3)"
else
	for dt in bf16 fp8; do
		[ "$(echo "$out" | grep -c "^  pass [123], $dt *:")" -eq 3 ] ||
			bad "both: not three $dt passes"
		echo "$out" | grep -qE "^  $dt: median page-in .* $tps" ||
			bad "both: no $dt summary"
	done
	# The same tokens in both: 2M of bf16 pages (16 KiB a page, 4 layers).
	echo "$out" | grep -q "^cold page-in, NVMe -> view slots: 1024 tokens (32 blocks x 4 " ||
		bad "both: not 1024 tokens: $(echo "$out" | grep '^cold')"
	line=$(echo "$out" | grep "^  fp8 / bf16 tokens/s = ")
	[ -n "$line" ] || bad "both: no fp8 / bf16 ratio: $out"
	r=$(sed -n 's/^  fp8 \/ bf16 tokens\/s = \([0-9.]*\), .*/\1/p' <<<"$line")
	case "$r" in
	"" | 0.00) bad "both: ratio '$r' in: $line" ;;
	0.*) grep -q "x slower (target >= 1.9: missed)" <<<"$line" ||
		bad "both: below 1 not slower: $line" ;;
	1.00) grep -qE "1\.0x (slower|faster) \(target >= 1\.9: missed\)" <<<"$line" ||
		bad "both: at 1.00 neither 1.0x slower nor faster: $line" ;;	# rounded either way
	*) grep -q "x faster (target >= 1.9: " <<<"$line" ||
		bad "both: above 1 not faster: $line" ;;
	esac
	grep -q "the pages' strides on disk give 1.33" <<<"$line" || bad "both: stride ratio: $line"
	[ -e "$tmp/scratch" ] && bad "both: the scratch is left: $(ls -R "$tmp/scratch")"
fi

refuse() {
	local want=$1
	shift
	bs "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ $rc -eq 2 ] || bad "'$*' exited $rc, not 2: $(cat "$tmp/err")"
	grep -q "kvmem bench step: .*$want" "$tmp/err" || bad "'$*': not '$want': $(cat "$tmp/err")"
}
# step and decode: bf16, then fp8 on a second backend, then the ratios
out=$(bs --only step,decode --kv-dtype both --tokens 4096 --view 1024 --steps 2 --decode 8 \
	--tiers warm 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "--kv-dtype both, step and decode, exited $rc: $(echo "$out" | tail -3)"
else
	[ "$(echo "$out" | grep -c "^agent step: workspace 4096 tokens")" -eq 2 ] ||
		bad "both: not two step phases: $(echo "$out" | grep '^agent step')"
	echo "$out" | grep -q "^agent step: .* of fp8 pages" || bad "both: no fp8 workspace"
	[ "$(echo "$out" | grep -c "^decode in a 1024-token view over 4096 tokens: [1-9]")" -eq 2 ] ||
		bad "both: not two decodes"
	echo "$out" | grep -qE "^fp8 against bf16, the same run: warm step [0-9.]+ / [0-9.]+ ms, \
bf16 time / fp8 time [0-9]+\.[0-9]{2} \(target >= 1\.6\); decode in the 1024-token view \
[0-9.]+ / [0-9.]+ tokens/s, fp8 / bf16 [0-9]+\.[0-9]{2} \(target" ||
		bad "both: no fp8 against bf16 line: $(echo "$out" | tail -3)"
	[ "$(echo "$out" | grep -cE "^peers: .* the step's floor \(the question's 32 tokens and \
one more over an empty view: no KV read\) [0-9]+\.[0-9] ms$")" -eq 2 ] ||
		bad "both: not two step floors: $(echo "$out" | grep '^peers')"
	echo "$out" | grep -qE "^the warm steps' parts, like for like .*: the question's prefill \
[0-9.]+ / [0-9.]+ ms, bf16 / fp8 [0-9]+\.[0-9]{2}; first token [0-9.]+ / [0-9.]+ ms, bf16 / fp8 \
[0-9]+\.[0-9]{2}; selection and rematerialisation [0-9.]+ / [0-9.]+ us a block entered" ||
		bad "both: no like-for-like parts: $(echo "$out" | tail -4)"
	[ -e "$tmp/scratch" ] && bad "both, step: the scratch is left"
fi

# --policy random: the selection does not read the KV, so both dtypes enter
# the same blocks at each step (meank's differ: fp8 K moves its query)
out=$(bs --only step --kv-dtype both --tokens 4096 --view 1024 --steps 3 --tiers warm \
	--policy random 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "--policy random exited $rc: $(echo "$out" | tail -3)"
else
	[ "$(echo "$out" | grep -c "^agent step: .*, question 32 tokens, random$")" -eq 2 ] ||
		bad "random: the header does not name the policy twice"
	entered=$(echo "$out" | grep -oE "^    step [0-9] \([a-z -]+\): .* [0-9]+ blocks entered" |
		grep -oE "[0-9]+ blocks entered" | tr '\n' ' ')
	n=$(echo "$entered" | grep -o "[0-9]* blocks" | wc -l)
	half=$(echo "$entered" | grep -o "[0-9]* blocks" | head -3 | tr '\n' ' ')
	rest=$(echo "$entered" | grep -o "[0-9]* blocks" | tail -3 | tr '\n' ' ')
	[ "$n" -eq 6 ] && [ "$half" = "$rest" ] ||
		bad "random: bf16 and fp8 did not enter the same blocks: $entered"
fi
refuse "--policy: no policy 'nope'" --only step --policy nope

# --kv-dtype both --only remat: the same tokens' bf16 and fp8 pages placed,
# each at its tokens/s, and their ratio (the cpu backend has no pool: one way)
out=$(bs --only remat --remat 2k --kv-dtype both 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "--kv-dtype both --only remat exited $rc: $(echo "$out" | tail -3)"
else
	echo "$out" | grep -q "^rematerialisation, fp8 against bf16: 1984 tokens x 4 layers" ||
		bad "remat both: no header naming the tokens: $(echo "$out" | head -5)"
	b=$(echo "$out" | grep -oE "^  bf16 place +[0-9.]+ GB/s +[0-9]+K tokens/s" | grep -oE "[0-9]+K" | tr -d K)
	f=$(echo "$out" | grep -oE "^  fp8  place +[0-9.]+ GB/s +[0-9]+K tokens/s" | grep -oE "[0-9]+K" | tr -d K)
	r=$(echo "$out" | grep -oE "^  fp8 / bf16 tokens/s, place: [0-9.]+" | grep -oE "[0-9.]+$")
	if [ -z "$b" ] || [ -z "$f" ] || [ -z "$r" ] || [ "$b" -eq 0 ]; then
		bad "remat both: no rate for each dtype and their ratio: $out"
	else
		# the ratio printed is the rates' (each rounded to 1K tokens/s)
		awk -v b="$b" -v f="$f" -v r="$r" 'BEGIN { exit !(r > f / (b + 1) - 0.02 &&
			r < (f + 1) / b + 0.02) }' || bad "remat both: ratio $r is not $f K / $b K"
	fi
	echo "$out" | grep -q "the pages' bytes allow 1.88" ||
		bad "remat both: no byte ratio of the pages (8704 / 16384 bytes)"
fi

refuse "kv-dtype both runs the phases remat, coldin, step, decode and fits" --kv-dtype both
refuse "kv-dtype both runs the phases remat, coldin, step, decode and fits" --kv-dtype both \
	--only coldin,stageout
refuse "kv-dtype both runs the phases remat, coldin, step, decode and fits" --kv-dtype both \
	--only ceilings
refuse "kv-dtype fp8 runs the phases coldin, step, decode, fits and stageout" --kv-dtype fp8 \
	--only remat

# --kv-dtype fp8 --only stageout: a prefill through a session over an fp8
# workspace against the plain forward (the bf16 one's figures, in fp8)
out=$(bs --only stageout --prefill 512 --chunk 256 --kv-dtype fp8 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	bad "fp8 stageout exited $rc: $(echo "$out" | tail -3)"
else
	echo "$out" | grep -qE "^stage-out under prefill: 512 tokens in chunks of 256 \([0-9.]+ GB of \
fp8 pages" || bad "fp8 stageout: the header does not say fp8 pages: $(echo "$out" | head -3)"
	echo "$out" | grep -qE "^  plain / session over the workspace: [0-9.]+" ||
		bad "fp8 stageout: no ratio to the plain forward"
fi
refuse "(bf16, fp8 or both)" --kv-dtype fp16 --only coldin
cli_done bench-step-coldin
