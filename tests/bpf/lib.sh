#!/bin/bash
# Shared by tests/cli/test_bpf_*.sh: set-up, a session with known page
# traffic, running a BPF tool around it, reading counters and JSON lines.
#
# The tools attach to a private copy of the kvmem binary (uprobes follow
# the file), so nothing else running kvmem on the machine is counted.
# Skips (77) only when not root, when the kernel refuses BPF, or when the
# tools could not be built because clang or bpftool is missing.
set -u
KVMEM=${KVMEM:-build/kvmem}
BPF=${KVMEM_BPF:-$(dirname "$KVMEM")/bpf}
fail=0
bad() { echo "FAIL: $*"; fail=1; }

bpf_setup() {
	[ -x "$KVMEM" ] || { echo "no kvmem binary at $KVMEM"; exit 77; }
	[ "$(id -u)" -eq 0 ] || { echo "skip: the BPF tools need root (CAP_BPF, CAP_PERFMON)"; exit 77; }
	[ -r /sys/kernel/btf/vmlinux ] || { echo "skip: the kernel has no BTF (/sys/kernel/btf/vmlinux)"; exit 77; }
	if [ ! -x "$BPF/kvmemtop" ]; then
		if command -v clang >/dev/null && { command -v bpftool >/dev/null || [ -x /usr/sbin/bpftool ]; }; then
			echo "FAIL: clang and bpftool are here but $BPF/kvmemtop was not built (make bpf)"
			exit 1
		fi
		echo "skip: clang or bpftool missing, the BPF tools were not built (tools/deps.sh installs them)"
		exit 77
	fi
	local bt
	bt=$(command -v bpftool || echo /usr/sbin/bpftool)
	"$bt" prog list >/dev/null 2>&1 || { echo "skip: the kernel refuses bpf() here"; exit 77; }
	tmp=$(mktemp -d /var/tmp/kvmem-bpf-test.XXXXXX)
	chmod 755 "$tmp"
	trap 'bpf_cleanup' EXIT
	cp "$KVMEM" "$tmp/kvmem"
	KV="$tmp/kvmem"
	export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
	"$KV" generate --preset tiny --out "$tmp/model" >/dev/null 2>&1 ||
		{ echo "kvmem generate does not work: skipping"; exit 77; }
	# A session that reads pages back through a 128 KiB pool: hits, misses,
	# NVMe reads, prefetches, evictions, stage-outs, steps and commits.
	cat >"$tmp/script" <<'EOS'
{"append_random": 20, "seed": 1, "pin": true}
{"append_random": 150, "seed": 2}
{"decode": 10}
{"append_random": 198, "seed": 3}
{"decode": 12}
{"append_random": 77, "seed": 4}
{"decode": 20}
{"append_random": 129, "seed": 5}
{"decode": 15}
EOS
	head -5 "$tmp/script" >"$tmp/script_short"
}

tool_pid=""
bpf_cleanup() {
	[ -n "$tool_pid" ] && kill -INT "$tool_pid" 2>/dev/null && wait "$tool_pid" 2>/dev/null
	rm -rf "$tmp"
}

# session DIR [SCRIPT]: the scripted session on workspace DIR (fresh), its
# host pool HOST_CAP (default 128k).
session() {
	rm -rf "$1"
	"$KV" run --model "$tmp/model" --chunk 48 --host-cap "${HOST_CAP:-128k}" --budget 64 --block 16 \
		--policy quest --script "${2:-$tmp/script}" --workspace "$1" >"$1.out" 2>&1 ||
		bad "session on $1: $(tail -2 "$1.out")"
}

# tool_start OUT TOOL ARGS...: run a tool in the background, output in OUT
# (stdout) and OUT.err, and wait until it says it is tracing.
tool_start() {
	local out=$1 i
	shift
	rm -f "$out" "$out.err"	# a stale "Tracing" line must not count
	"$@" >"$out" 2>"$out.err" &
	tool_pid=$!
	for i in $(seq 100); do
		grep -q "^Tracing" "$out" "$out.err" 2>/dev/null && return 0
		kill -0 "$tool_pid" 2>/dev/null || break
		sleep 0.2
	done
	bad "$* did not start: $(cat "$out.err")"
	kill -INT "$tool_pid" 2>/dev/null
	tool_pid=""
	return 1
}

# tool_stop: Ctrl-C, then the tool's exit status must be 0.
tool_stop() {
	local rc
	kill -INT "$tool_pid"
	wait "$tool_pid"
	rc=$?
	tool_pid=""
	[ $rc -eq 0 ] || bad "the tool exited with $rc"
	return $rc
}

# stat DIR NAME: a counter of `kvmem stat DIR`.
stat() { "$KV" stat "$1" | awk -v k="$2" '$1 == k { print $2 }'; }

# jsum FILE KEY [FILTER]: the sum of "KEY":N over the JSON lines of FILE
# (those matching FILTER, a grep pattern, when given). printf: mawk prints a
# sum past 2^31 as 3.35896e+09.
jsum() {
	grep -- "${3:-.}" "$1" | grep -o "\"$2\":[0-9]*" | cut -d: -f2 | awk '{ s += $1 } END { printf "%.0f\n", s }'
}

# same WHAT GOT WANT
same() { [ "$2" = "$3" ] || bad "$1: the tool says $2, kvmem stat says $3"; }
