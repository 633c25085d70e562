#!/bin/sh
# Runs inside the interop VM (virtme-ng, the host's root filesystem read
# only): brings up the NIC with 10.77.0.2, makes rxe0 on it (and, when the
# plan asks for @vlan_gid@, a VLAN 100 interface with 10.77.100.2: rxe0 gets
# a GID for it, whose index replaces @vlan_gid@), then runs the
# guest side of each step of the plan file ($1), one line each:
#   server|client|local PROGRAM ARGS...
# (local: server and client both on this VM's rxe0, over rxe's loopback)
# A client retries until the host's server listens. Each step ends with a
# line "GUEST-STEP <n> rc=<rc>" on the console, which the host reads.
# The whole script is one block, read before it runs.
{
PLAN=$1
IF=$(ls /sys/class/net | grep -v '^lo$' | head -1)
ip link set lo up
ip addr add 10.77.0.2/24 dev "$IF"
ip link set "$IF" mtu 9000 2>/dev/null
ip link set "$IF" up
modprobe rdma_rxe || { echo "GUEST-FATAL no rdma_rxe module"; exit 1; }
# The kernel's connection manager (ib_cm, rdma_cm and their user-space
# interface): it answers CM MADs on rxe's QP1, and rdma_cm programs use it.
modprobe rdma_ucm || { echo "GUEST-FATAL no rdma_ucm module (the kernel's connection manager)"; exit 1; }
rdma link add rxe0 type rxe netdev "$IF" || { echo "GUEST-FATAL rdma link add"; exit 1; }
VGID=none
if grep -q '@vlan_gid@' "$PLAN"; then
  # rxe refuses a VLAN device as its netdev; it serves the VLANs on top of
  # its own: the VLAN interface's address becomes one more GID of rxe0,
  # and frames sent from that GID go out tagged.
  # When this fails, the VLAN steps fail (perftest refuses GID "none"),
  # not the others.
  ip link add link "$IF" name "$IF.100" type vlan id 100 2>&1 \
    && ip addr add 10.77.100.2/24 dev "$IF.100" 2>&1 \
    && ip link set "$IF.100" up 2>&1 \
    || echo "GUEST-WARNING no VLAN interface $IF.100: the vlan steps will fail"
  port=/sys/class/infiniband/rxe0/ports/1
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    i=0
    while [ $i -lt 32 ] && [ "$VGID" = none ]; do
      [ "$(cat $port/gids/$i 2>/dev/null)" = 0000:0000:0000:0000:0000:ffff:0a4d:6402 ] \
        && [ "$(cat $port/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && VGID=$i
      i=$((i + 1))
    done
    [ "$VGID" != none ] && break
    sleep 1
  done
  if [ "$VGID" = none ]; then
    echo "GUEST-WARNING rxe0 has no RoCE v2 GID for 10.77.100.2: the vlan steps will fail"
  else
    echo "rxe0 GID $VGID: ::ffff:10.77.100.2 on $(cat $port/gid_attrs/ndevs/$VGID), $(cat $port/gid_attrs/types/$VGID)"
  fi
fi
# rxe's own reasons for refusing a QP attribute go to the kernel log.
mount -t debugfs none /sys/kernel/debug 2>/dev/null
# (rxe_qp.c only: the other files log every packet.)
echo 'file rxe_qp.c +p' > /sys/kernel/debug/dynamic_debug/control 2>/dev/null
dmesg -c > /dev/null 2>&1
echo "GUEST-READY"
n=0
while read -r role prog args; do
  [ -z "$role" ] && continue
  args=$(echo "$args" | sed "s/@vlan_gid@/$VGID/g")
  n=$((n + 1))
  if [ "$role" = local ]; then
    # shellcheck disable=SC2086
    timeout 300 $prog $args > /tmp/server.out 2>&1 &
    server=$!
    sleep 1
    # shellcheck disable=SC2086
    timeout 300 $prog $args 10.77.0.2
    rc=$?
    wait $server || rc=$?
  elif [ "$role" = client ]; then
    # The host's server may not listen yet: perftest and rc_pingpong exit
    # at once when the connection is refused, rdma_cm programs when their
    # REQ is rejected (no listener).
    tries=0
    while :; do
      # shellcheck disable=SC2086
      timeout 300 $prog $args 10.77.0.1 > /tmp/step.out 2>&1
      rc=$?
      tries=$((tries + 1))
      if [ $rc -ne 0 ] && grep -q "Couldn't connect\|Unable to init the socket\|Connection refused\|REJECTED\|bl blka 8\|UNREACHABLE, error: 1" /tmp/step.out && [ $tries -lt 60 ]; then
        sleep 1
        continue
      fi
      break
    done
    cat /tmp/step.out
  else
    # shellcheck disable=SC2086
    timeout 300 $prog $args
    rc=$?
  fi
  if [ $rc -ne 0 ]; then
    echo "rxe's kernel log and neighbours after the failure:"
    dmesg | tail -20
    ip neigh show
  fi
  dmesg -c > /dev/null 2>&1
  echo "GUEST-STEP $n rc=$rc"
done < "$PLAN"
echo "GUEST-STATS"
rdma statistic show link rxe0/1
echo "GUEST-DONE"
}
