#!/bin/sh
# The Debian 6.1 kernel ABI the module is built for and the VM boots, e.g.
# 6.1.0-57-amd64: the newest installed linux-headers-6.1.*-amd64 (tools/deps.sh
# installs linux-headers-amd64, which pulls the current one). KVMEM_KVER wins.
if [ -n "${KVMEM_KVER:-}" ]; then echo "$KVMEM_KVER"; exit 0; fi
ls -d /usr/src/linux-headers-6.1.*-amd64 2>/dev/null | sed 's|.*/linux-headers-||' |
	sort -V | tail -n 1
