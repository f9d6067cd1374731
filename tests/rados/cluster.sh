#!/bin/bash
# A throwaway Ceph cluster for the RADOS tests: one monitor and one OSD
# (BlueStore on a sparse file, so a killed and restarted OSD keeps what it
# acknowledged), cephx on, no manager, on a free loopback port, everything
# under one directory. Small on purpose: the build machine has 2 cores.
#
#   cluster.sh start DIR      make and start it; prints "cluster up in N s"
#   cluster.sh stop DIR       stop every daemon (the directory stays)
#   cluster.sh destroy DIR    stop, then remove DIR
#   cluster.sh osd-kill DIR   kill -9 the OSD        osd-start DIR: start it again
#   cluster.sh mon-kill DIR   kill -9 the monitor    mon-start DIR: start it again
#   cluster.sh wait DIR       wait until the pool takes a write again
#
# What it leaves in DIR for the tests:
#   ceph.conf                 the cluster (client.admin's keyring named in it)
#   kvmem-a.keyring, kvmem-b.keyring   two clients with a server's caps:
#                             mon 'profile rbd', osd 'allow rwx pool=kvmem'
#   wrong.keyring             client.kvmem-a with a key the cluster never saw
#   pool: kvmem (size 1)
#
# Exit 77 when Ceph is not installed (tools/deps.sh installs ceph-mon,
# ceph-osd and librados-dev), so the tests that need it say "skipped".
set -u
cmd=${1:-}
D=${2:-}
[ -n "$cmd" ] && [ -n "$D" ] || { echo "usage: cluster.sh start|stop|destroy|osd-kill|osd-start|mon-kill|mon-start|wait DIR" >&2; exit 2; }

need() {
	for b in ceph-mon ceph-osd ceph ceph-authtool monmaptool rados uuidgen; do
		command -v "$b" >/dev/null 2>&1 || {
			echo "cluster.sh: $b is not installed (apt-get install ceph-mon ceph-osd; tools/deps.sh does): skipping" >&2
			exit 77
		}
	done
}

C() { timeout 60 ceph -c "$D/ceph.conf" "$@"; }

pid_of() { cat "$D/run/$1.pid" 2>/dev/null; }

kill_daemon() { # name signal
	local p
	p=$(pid_of "$1")
	[ -n "$p" ] || return 0
	kill "-$2" "$p" 2>/dev/null
	for _ in $(seq 100); do
		kill -0 "$p" 2>/dev/null || { rm -f "$D/run/$1.pid"; return 0; }
		sleep 0.1
	done
	kill -9 "$p" 2>/dev/null
	rm -f "$D/run/$1.pid"
}

mon_start() { ceph-mon -c "$D/ceph.conf" -i a; }
osd_start() { ceph-osd -c "$D/ceph.conf" -i 0 --keyring "$D/osd.0/keyring" 2>>"$D/log/osd.start"; }

# A write goes through only when the OSD is up and the PGs are active.
wait_writable() {
	local t0=$SECONDS
	while [ $((SECONDS - t0)) -lt 120 ]; do
		timeout 20 rados -c "$D/ceph.conf" -p kvmem put probe "$D/ceph.conf" 2>/dev/null && return 0
		sleep 0.5
	done
	echo "cluster.sh: the pool takes no write after 120 s (logs in $D/log)" >&2
	return 1
}

free_port() {
	python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
EOF
}

start() {
	local t0=$SECONDS fsid port uuid id
	need
	mkdir -p "$D/mon.a" "$D/osd.0" "$D/run" "$D/log" || exit 1
	fsid=$(uuidgen)
	port=$(free_port)
	cat >"$D/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
mon initial members = a
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $D/admin.keyring
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
ms bind msgr1 = false
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 1
osd crush chooseleaf type = 0
# A client gives up on a cluster that went away after 10 s, not never.
rados osd op timeout = 10
rados mon op timeout = 10
client mount timeout = 10
[mon]
mon data = $D/mon.\$id
[osd]
osd data = $D/osd.\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = ${KVMEM_CEPH_OSD_BYTES:-8589934592}
bluestore block db create = false
bluestore block wal create = false
# No deferred writes: Ceph 16 can lose them to a crash (tracker 68060),
# and kill -9 of this OSD is a test case. Writes of whole 4 KiB chunks
# (what kvmem's store sends) then go straight to their new place.
bluestore prefer deferred size hdd = 0
bluestore prefer deferred size ssd = 0
osd memory target = 939524096
bluestore cache autotune = false
bluestore cache size = 134217728
osd op num shards = 1
osd op num threads per shard = 2
EOF
	ceph-authtool --create-keyring "$D/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null &&
	ceph-authtool --create-keyring "$D/admin.keyring" --gen-key -n client.admin \
		--cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null &&
	ceph-authtool "$D/mon.keyring" --import-keyring "$D/admin.keyring" >/dev/null &&
	monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" "$D/monmap" >/dev/null &&
	ceph-mon -c "$D/ceph.conf" --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.keyring" &&
	mon_start || { echo "cluster.sh: the monitor did not start (logs in $D/log)" >&2; exit 1; }
	uuid=$(uuidgen)
	id=$(C osd new "$uuid") || { echo "cluster.sh: no answer from the monitor" >&2; exit 1; }
	ceph-authtool --create-keyring "$D/osd.$id/keyring" --gen-key -n "osd.$id" >/dev/null
	C auth add "osd.$id" osd 'allow *' mon 'allow profile osd' -i "$D/osd.$id/keyring" 2>/dev/null &&
	ceph-osd -c "$D/ceph.conf" -i "$id" --mkfs --osd-uuid "$uuid" --keyring "$D/osd.$id/keyring" \
		>>"$D/log/osd.mkfs" 2>&1 &&
	osd_start || { echo "cluster.sh: the OSD did not start (logs in $D/log)" >&2; exit 1; }
	C osd pool create kvmem 8 8 >/dev/null 2>&1 &&
	C osd pool set kvmem size 1 --yes-i-really-mean-it >/dev/null 2>&1 &&
	C osd pool application enable kvmem kvmem >/dev/null 2>&1 || {
		echo "cluster.sh: cannot make the pool" >&2; exit 1; }
	for c in kvmem-a kvmem-b; do
		C auth get-or-create "client.$c" mon 'profile rbd' osd 'allow rwx pool=kvmem' \
			>"$D/$c.keyring" 2>/dev/null || { echo "cluster.sh: cannot make client.$c" >&2; exit 1; }
	done
	ceph-authtool --create-keyring "$D/wrong.keyring" --gen-key -n client.kvmem-a >/dev/null
	wait_writable || exit 1
	echo "cluster up in $((SECONDS - t0)) s ($D)"
}

case $cmd in
start) start ;;
stop) kill_daemon osd.0 TERM; kill_daemon mon.a TERM ;;
destroy) kill_daemon osd.0 TERM; kill_daemon mon.a TERM; rm -rf "$D" ;;
osd-kill) kill_daemon osd.0 KILL ;;
osd-start) osd_start ;;
mon-kill) kill_daemon mon.a KILL ;;
mon-start) mon_start ;;
wait) wait_writable ;;
*) echo "cluster.sh: unknown command '$cmd'" >&2; exit 2 ;;
esac
