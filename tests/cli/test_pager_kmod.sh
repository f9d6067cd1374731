#!/bin/bash
# kvmem run --pager kmod|uring on the build machine, where no kernel module
# is loaded (the session over the module itself runs in the VM: make
# vmtest, tests/vm/session.sh):
#  - --pager kmod is refused clearly (exit 1: "the kernel module is not
#    loaded", naming /dev/kvmem) before the workspace directory is made;
#  - --pager with another name is a usage error (exit 2) naming both;
#  - --pager uring is the default: the same steps as without the option;
#  - --pager without --workspace: a note that it changes nothing.
#  - kvmem bench pager --pager kmod is refused the same way (exit 1) before
#    it makes its directory; --pager nvme and --pager kmod with --store are
#    usage errors (exit 2).
# Skipped (77) where /dev/kvmem exists: the refusal cannot be seen there.
. "$(dirname "$0")/lib.sh"
cli_setup pager-kmod
[ -e /dev/kvmem ] && { echo "/dev/kvmem exists here: skipping"; exit 77; }
printf '{"append_random": 70, "seed": 1}\n{"decode": 3}\n' >"$tmp/s"
run() { "$KVMEM" run --model "$M" --script "$tmp/s" --budget 32 --json "$@"; }

out=$(run --workspace "$tmp/k" --pager kmod 2>&1)
rc=$?
[ $rc -eq 1 ] || bad "--pager kmod without the module: exit $rc, not 1"
grep -q "/dev/kvmem: no such device: the kernel module is not loaded" <<<"$out" ||
	bad "--pager kmod: no clear refusal: $out"
[ -e "$tmp/k" ] && bad "--pager kmod made the workspace directory before refusing"

out=$(run --workspace "$tmp/x" --pager nvme 2>&1)
rc=$?
[ $rc -eq 2 ] || bad "--pager nvme: exit $rc, not 2"
grep -q "uring.*kmod.*'nvme'" <<<"$out" || bad "--pager nvme: $out"
[ -e "$tmp/x" ] && bad "--pager nvme made the workspace directory"

a=$(run --workspace "$tmp/a" 2>/dev/null | sed 's/,"ms":[0-9.]*//') || bad "default pager run failed"
b=$(run --workspace "$tmp/b" --pager uring 2>/dev/null | sed 's/,"ms":[0-9.]*//') ||
	bad "--pager uring run failed"
grep -q '"tokens":\[[0-9]' <<<"$a" || bad "default pager run: no decoded tokens"
[ "$a" = "$b" ] || bad "--pager uring differs from the default"

out=$(run --pager uring 2>&1 >/dev/null)
grep -q "note: --pager sets a workspace's pager; without --workspace it changes nothing" \
	<<<"$out" || bad "--pager without --workspace: no note: $out"
mkdir -p "$tmp/bench"
out=$("$KVMEM" bench pager --dir "$tmp/bench" --size 16M --pager kmod 2>&1)
rc=$?
[ $rc -eq 1 ] || bad "bench pager --pager kmod without the module: exit $rc, not 1"
grep -q "/dev/kvmem: no such device: the kernel module is not loaded" <<<"$out" ||
	bad "bench pager --pager kmod: no clear refusal: $out"
[ -z "$(ls "$tmp/bench")" ] || bad "bench pager --pager kmod made a directory before refusing"
out=$("$KVMEM" bench pager --dir "$tmp/bench" --pager nvme 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "uring or kmod, not 'nvme'" <<<"$out" ||
	bad "bench pager --pager nvme: exit $rc: $out"
out=$("$KVMEM" bench pager --store rados://p --pager kmod 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q "kmod reads a workspace directory, not --store" <<<"$out" ||
	bad "bench pager --pager kmod --store: exit $rc: $out"
cli_done test_pager_kmod
