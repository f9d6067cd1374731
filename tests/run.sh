#!/bin/bash
# Run every test that needs no GPU and print one closing line:
#   N passed, N failed, N skipped
# Arguments: the build folders whose tests/ to run (build, build-asan).
# cmocka programs report each case; shell tests (tests/cli/test_*.sh) count
# as one case each, exit 77 meaning skipped. The shell tests run once, against
# the first build folder's kvmem binary.
set -u
cd "$(dirname "$0")/.."
pass=0 fail=0 skip=0 failed_names=""
TIMEOUT=${KVMEM_TEST_TIMEOUT:-1200}
# Spinning OpenMP threads slow everything down on a shared machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
logdir=$(mktemp -d /tmp/kvmem-test.XXXXXX)

count_cmocka() { # log file, program name, exit code
	local ok bad sk
	ok=$(grep -c '^\[       OK \]' "$1")
	# cmocka names each failed case twice (when it fails and in the list
	# after its summary): count the summary's number instead.
	bad=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) test(s), listed below.*/\1/p' "$1" |
		awk '{ n += $1 } END { print n + 0 }')
	sk=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) test(s), listed below.*/\1/p' "$1" |
		awk '{ n += $1 } END { print n + 0 }')
	# A crash or timeout before cmocka's summary is one failure more.
	if [ "$3" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
	pass=$((pass + ok)); fail=$((fail + bad)); skip=$((skip + sk))
	[ "$bad" -eq 0 ] || failed_names="$failed_names $2"
}

for b in "$@"; do
	for t in "$b"/tests/test_*; do
		[ -x "$t" ] || continue
		echo "== $t"
		log="$logdir/$(basename "$b")-$(basename "$t").log"
		KVMEM_BUILD="$b" timeout "$TIMEOUT" "$t" >"$log" 2>&1
		rc=$?
		cat "$log"
		count_cmocka "$log" "$t" "$rc"
	done
done

for s in tests/cli/test_*.sh; do
	[ -x "$s" ] || continue
	echo "== $s"
	KVMEM="$1/kvmem" timeout "$TIMEOUT" "$s"
	rc=$?
	case $rc in
	0) pass=$((pass + 1)); echo "ok: $s" ;;
	77) skip=$((skip + 1)); echo "skipped: $s" ;;
	*) fail=$((fail + 1)); failed_names="$failed_names $s"; echo "FAILED ($rc): $s" ;;
	esac
done

rm -rf "$logdir"
[ -z "$failed_names" ] || echo "failed:$failed_names"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
