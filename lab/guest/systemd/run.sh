#!/bin/sh
# erdma-lab.service's command on the systemd node kind: the lab script of the kernel command line
# (lab.script=REL, lab.args=A,B,C), from the 9p share, its output to the console and to
# /mnt/host/out/<name>.log, its exit status to /mnt/host/out/<name>.rc, as lab/guest/init runs it
# on the other kinds.
arg() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" /proc/cmdline; }
SCRIPT=$(arg lab.script)
ARGS=$(arg lab.args | tr ',' ' ')
[ -n "$SCRIPT" ] || { echo "lab: no lab.script on the kernel command line"; exit 0; }
mkdir -p /mnt/host/out
name=$(basename "$SCRIPT" .sh)
echo "lab: running $SCRIPT $ARGS under systemd at uptime $(cut -d' ' -f1 /proc/uptime)s"
# shellcheck disable=SC2086
( cd /mnt/host && sh "/mnt/host/$SCRIPT" $ARGS; echo $? > "/mnt/host/out/$name.rc" ) 2>&1 \
  | tee "/mnt/host/out/$name.log"
echo "lab: $SCRIPT exited rc=$(cat "/mnt/host/out/$name.rc" 2>/dev/null) at uptime $(cut -d' ' -f1 /proc/uptime)s"
sync
