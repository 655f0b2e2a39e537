#!/bin/sh
# Lab guest script for the two-VM SMC-R data path (Debian 6.12, rxe over one virtio NIC each).
# Each VM stands for a node; the agent's BPF policy is applied to the VM's own (main) network
# namespace with the lab-only --allow-host-netns. Usage: smcr2vm-guest.sh server|client
# Would fail if: rxe, the UEID, the node pnet entry or the BPF policy could not be set up, the
# unmodified TCP client's first connection was not in mode SMCR (SMC-R between the VMs broken),
# or it stayed on SMC after the policy was released.
. /mnt/host/guest/lib.sh
ROLE=$1; SCEN=smcr2vm-$ROLE
SHORT=5; MIB=32; PORT=7000; SERVER=192.168.80.1
for m in virtio_net rdma_rxe ib_uverbs smc smc_diag; do
  modprobe $m || { skip "$SCEN" "kernel $(uname -r) has no $m"; exit 0; }
done
if [ "$ROLE" = server ]; then ME=$SERVER; else ME=192.168.80.2; fi
NIC=$(ls /sys/class/net | grep -v '^lo$' | head -1)
ip link set "$NIC" name eth0 2>/dev/null; ip link set eth0 up; ip addr add "$ME/24" dev eth0
ck "rxe0 on eth0" rdma link add rxe0 type rxe netdev eth0
ck "UEID (SMC-Rv2 needs one shared by both peers)" smcr-init ueid add ERDMA-LAB-EID
mkdir -p /run/erdma-bpffs; mount -t bpf bpf /run/erdma-bpffs; PIN=/run/erdma-bpffs/erdma-smc
ck "node pnet: LABPNET -> rxe0/1 (the agent's host step)" smcr-init ib-pnet LABPNET rxe0 1
ck "BPF policy loaded" smcr-init policy load --bpf-pin-dir "$PIN"
ck "SMC-R for this node's main namespace (lab-only --allow-host-netns)" \
  smcr-init --netns /proc/self/ns/net --allow-host-netns --smcr-keep-ipv6 --pnet LABPNET --bpf-pin-dir "$PIN" -o json
cp /tmp/ck.out "$OUT/$SCEN-init.json"
grep -q '"mechanism": "bpf_policy"' "$OUT/$SCEN-init.json" && good "mechanism bpf_policy" || bad "mechanism (see $SCEN-init.json)"
if [ "$ROLE" = server ]; then
  ck "tcpbench server: $((2 * (SHORT + 1))) connections" tcpbench server $PORT $((2 * (SHORT + 1)))
  sed 's/^/    /' /tmp/ck.out
else
  ck "SMC phase: unmodified TCP client" sh -c "tcpbench client $SERVER:$PORT $SHORT $MIB > $OUT/smcr2vm-smc.json"
  jq -e '.first_connection_mode == "SMCR"' "$OUT/smcr2vm-smc.json" >/dev/null \
    && good "first connection in mode SMCR on $(jq -r '.first_connection.link.ibdev' "$OUT/smcr2vm-smc.json")" \
    || bad "first connection not SMCR: $(cat "$OUT/smcr2vm-smc.json")"
  ck "policy released for this namespace" smcr-init policy release --bpf-pin-dir "$PIN" --netns /proc/self/ns/net
  ck "TCP phase: same client" sh -c "tcpbench client $SERVER:$PORT $SHORT $MIB > $OUT/smcr2vm-tcp.json"
  jq -e '.first_connection_mode | startswith("TCP")' "$OUT/smcr2vm-tcp.json" >/dev/null \
    && good "without the policy: TCP" || bad "without the policy: $(cat "$OUT/smcr2vm-tcp.json")"
  for f in smc tcp; do echo "REPORT $f $(cat "$OUT/smcr2vm-$f.json" | jq -c '{mode: .first_connection_mode, connect_us, bulk_mib_s}')"; done
fi
finish
