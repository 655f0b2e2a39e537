# Sourced by the lab's /init on a node kind with the systemd cgroup driver (lab.cgroup_driver=
# systemd, lab/nodes.conf): after /init's early set-up (API file systems, cgroup2, the 9p share),
# systemd 252 becomes PID 1, as on a node where containerd runs with SystemdCgroup = true: runc
# asks it over D-Bus for each container's scope and the kubelet's pod slices. Its default target,
# erdma-lab.target, runs erdma-lab.service: the lab script (lab.script, lab.args) as /init runs
# it, then the power-off. Nothing else is started (no journald, udev or getty): what the runtime
# needs of systemd is the manager and its cgroup tree.
# The initramfs must not hold /etc/initrd-release: systemd would run as an initrd's manager and
# try to switch root.
SYSTEMD=/usr/lib/systemd/systemd
if [ ! -x "$SYSTEMD" ]; then
  echo "lab: lab.cgroup_driver=systemd but the image has no $SYSTEMD (lab/lib/node-layer.sh systemd builds its layer); powering off"
  poweroff -f; sleep 10
fi
cat > /etc/os-release <<'OSREL'
PRETTY_NAME="erdma lab node (Debian GNU/Linux 12 user space)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION_CODENAME=bookworm
ID=debian
OSREL
hostname > /etc/hostname
# a fixed machine ID: the node keeps no state between boots
echo 5e2a6b1c0d9f4e8a9b7c6d5e4f3a2b1c > /etc/machine-id
mkdir -p /etc/systemd/system
cp /mnt/host/guest/systemd/erdma-lab.target /mnt/host/guest/systemd/erdma-lab.service /etc/systemd/system/
ln -sf erdma-lab.target /etc/systemd/system/default.target
echo "lab: systemd becomes PID 1 at uptime $(cut -d' ' -f1 /proc/uptime)s"
exec "$SYSTEMD" --log-level=notice --log-target=console --show-status=error
