# Helpers the command tests share (sourced, not run: run.sh runs test_*.sh).
#   cli_setup NAME   $KVMEM checked (exit 77 without it), $tmp made and removed
#                    at exit, KVMEM_HOME inside it, $M a tiny random model
#   bad MSG          record a failure (the test exits 1 at cli_done)
#   tensor_offset FILE TENSOR PERCENT   byte offset of the element PERCENT of
#                    the way into TENSOR (4-byte aligned), from the header
#   poke FILE OFFSET HEXBYTES           overwrite bytes in place ("c0 7f")
#   flip_byte FILE OFFSET               invert one byte's bits (always a change)
# Seeds: KVMEM_TEST_SEED when set, else a fresh one, printed.
# KVMEM_TEST_KEEP=1 keeps $tmp for a look at a failure's logs.
set -u
KVMEM=${KVMEM:-build/kvmem}
fail=0

cli_setup() {
	[ -x "$KVMEM" ] || { echo "no kvmem binary at $KVMEM"; exit 77; }
	tmp=$(mktemp -d "/tmp/kvmem-$1.XXXXXX")
	# KVMEM_TEST_KEEP=1 keeps the scratch folder (a failure's logs).
	if [ -n "${KVMEM_TEST_KEEP:-}" ]; then
		echo "$1: keeping $tmp"
	else
		trap 'rm -rf "$tmp"' EXIT
	fi
	export KVMEM_HOME="$tmp/home"
	export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
	seed=${KVMEM_TEST_SEED:-$(od -An -tu4 -N4 /dev/urandom | tr -d ' ')}
	echo "$1: seed $seed (replay with KVMEM_TEST_SEED=$seed)"
	M="$tmp/model"
	"$KVMEM" generate --preset tiny --seed "$seed" --out "$M" >/dev/null ||
		{ echo "kvmem generate failed"; exit 1; }
}

bad() { echo "FAIL: $*"; fail=1; }

cli_done() {
	[ $fail -eq 0 ] && echo "$1: all checks passed"
	exit $fail
}

tensor_offset() {
	local f=$1 name=$2 pct=$3 hlen ent b e
	hlen=$(od -An -tu8 -N8 "$f" | tr -d ' ')
	ent=$(head -c $((8 + hlen)) "$f" | tail -c "$hlen" | grep -o "\"$name\":{[^}]*}")
	b=$(sed 's/.*"data_offsets":\[\([0-9]*\),[0-9]*\].*/\1/' <<<"$ent")
	e=$(sed 's/.*"data_offsets":\[[0-9]*,\([0-9]*\)\].*/\1/' <<<"$ent")
	echo $((8 + hlen + b + (e - b) * pct / 100 / 4 * 4))
}

poke() {
	local f=$1 off=$2 bytes="" x
	shift 2
	for x in "$@"; do bytes="$bytes\\x$x"; done
	printf "$bytes" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
}

# Corrupt one byte of FILE at OFFSET by inverting its bits: writing a fixed
# value leaves the byte as it was when it already held that value (a seed's
# page with 0xff there passed a "corrupt" check unchanged).
flip_byte() {
	local b
	b=$(od -An -tu1 -j"$2" -N1 "$1" | tr -d ' ')
	[ -n "$b" ] || { echo "flip_byte: $1 has no byte at $2" >&2; return 1; }
	poke "$1" "$2" "$(printf '%02x' $((b ^ 255)))"
}
