#!/bin/bash
# kvmem bench step --only coldin with fp8 pages, small, on the cpu backend
# (the tiny random model; a few MB of pages under $tmp):
#  - --kv-dtype fp8 writes an fp8 workspace, reads it cold into an fp8 view
#    and prints its page-in and its ceiling in tokens/s, exit 0;
#  - --kv-dtype both runs bf16 and fp8 over the same tokens in one run and
#    prints "fp8 / bf16 tokens/s = X", said "slower" below 1, "faster"
#    above; the scratch workspaces are gone after it (no --keep);
#  - bad combinations are usage errors (exit 2) naming the command and why:
#    both with a phase other than coldin, fp8 with remat, an unknown dtype.
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
refuse "kv-dtype both runs the coldin phase only" --kv-dtype both
refuse "kv-dtype both runs the coldin phase only" --kv-dtype both --only coldin,step
refuse "kv-dtype both runs the coldin phase only" --kv-dtype both --only ceilings
refuse "kv-dtype fp8 runs the phases coldin, step, decode and fits" --kv-dtype fp8 --only remat
refuse "(bf16, fp8 or both)" --kv-dtype fp16 --only coldin
cli_done bench-step-coldin
