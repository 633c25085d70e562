#!/usr/bin/env bash
# Interop with Linux Soft-RoCE (rxe): our NIC (the daemon, a DPDK af_packet
# port on a tap) and rxe in a QEMU VM (virtme-ng, pure emulation, the host's
# own root filesystem) run the same unmodified perftest against each other,
# each test with the server in the VM and the client on our NIC, then the
# other way round. See ../../shared/spec/interop.md for the recipe.
#
#   interop/run.sh [TEST ...] [-- PERFTEST FLAGS]     (as root; ./x interop)
#
# TEST: ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw
# ib_read_bw ib_send_bw ibv_rc_pingpong (default: all). One line per test
# and direction: "interop TEST rxe->ours ok" or "... FAIL <why>", the
# programs' output above it; exit 0 only when all passed. Everything it
# sets up (netns, tap, daemon, VM) goes away on exit, also on failure or
# Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

say() { printf '==> %s\n' "$*"; }
die() { printf 'interop: %s\n' "$*" >&2; exit 1; }

tests=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) tests+=("$1"); shift ;;
  esac
done
all=(ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw ib_read_bw ib_send_bw ibv_rc_pingpong)
[ ${#tests[@]} -eq 0 ] && tests=("${all[@]}")
for t in "${tests[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || die "unknown test $t (one of: ${all[*]})"
done

[ "$(id -u)" -eq 0 ] || die "needs root (network namespace, tap device, VM)"
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
pkgs=(qemu-system-x86 linux-image-amd64 busybox-static rdma-core python3-venv ibverbs-utils perftest iproute2)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
fi
[ -n "$kernel" ] || die "no kernel in /boot (apt-get install linux-image-amd64)"
venv=$root/target/interop/venv
if [ ! -x "$venv/bin/vng" ]; then
  say "installing virtme-ng into $venv (PyPI)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q virtme-ng
fi
export PATH=$venv/bin:$PATH
if [ ! -x target/release/dataplane ] || [ ! -e target/release/ibverbs/libibverbs.so.1 ]; then
  say "building (release)"
  ./x build >/dev/null
fi

ns=rnic-interop-$$
tap=rnictap0
work=$(mktemp -d /tmp/rnic-interop.XXXXXX)
daemon_pid=
cleanup() {
  set +e
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "network namespace $ns, tap $tap (10.77.0.1 the namespace's kernel, for perftest's TCP exchange)"
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" ip tuntap add dev $tap mode tap
ip netns exec "$ns" ip addr add 10.77.0.1/24 dev $tap
ip netns exec "$ns" ip link set $tap up

cat > "$work/cfg.toml" <<CFG
[eal]
args = ["--no-huge", "--no-pci", "--no-telemetry", "-m", "256", "--log-level=lib.eal:warning", "--vdev=net_af_packet0,iface=$tap"]
[loopback]
mem_bytes = 4096
mtu = 1024
sizes = []
[service]
socket = "$work/rnic.sock"
max_shm_bytes = 1073741824
hugepages = false
[[service.devices]]
name = "roce0"
port = 0
ip = "10.77.0.3"
mac = "02:77:00:00:00:03"
CFG
say "our NIC: device roce0, 10.77.0.3 on $tap (af_packet)"
ip netns exec "$ns" target/release/dataplane --config "$work/cfg.toml" --serve \
  --file-prefix "interop-$$" > "$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$work/rnic.sock" ] && break; sleep 0.1; done
[ -S "$work/rnic.sock" ] || { cat "$work/daemon.log"; die "the daemon did not start"; }

# Each test's arguments on each side (perftest: GID index 1, few
# iterations: rxe under emulation takes a 4 ms tick per round trip).
args_of() { # TEST DEVICE
  case "$1" in
    ibv_rc_pingpong) echo "-d $2 -g 1 -c -n 20 -s 4096" ;;
    ib_*_lat) echo "-d $2 -x 1 -n 50 ${extra[*]:-}" ;;
    *) echo "-d $2 -x 1 -n 200 ${extra[*]:-}" ;;
  esac
}

# The plan: for each test, rxe serves and we are the client, then we serve.
plan=$work/plan
: > "$plan"
for t in "${tests[@]}"; do
  echo "server $t $(args_of "$t" rxe0)" >> "$plan"
  echo "client $t $(args_of "$t" rxe0)" >> "$plan"
done

say "booting the VM (pure emulation; rxe0 on 10.77.0.2)"
ip netns exec "$ns" vng -r "$kernel" --disable-kvm --memory 1G --cpus 1 \
  --qemu-opts="-netdev tap,id=n1,ifname=$tap,script=no,downscript=no -device virtio-net-pci,netdev=n1,mac=52:54:00:77:00:02" \
  --exec "$root/interop/guest.sh $plan" > "$work/vm.log" 2>&1 &
vm=$!

# Waits for a line of the VM's console (up to $2 s).
wait_vm() {
  local t0=$SECONDS
  until grep -q "$1" "$work/vm.log"; do
    kill -0 $vm 2>/dev/null || return 1
    [ $((SECONDS - t0)) -lt "$2" ] || return 1
    sleep 0.5
  done
}
wait_vm GUEST-READY 240 || { tail -30 "$work/vm.log"; die "the VM did not bring rxe0 up"; }
seen=$(wc -l < "$work/vm.log")

ours() { # runs a verbs program in the namespace over our library
  ip netns exec "$ns" env LD_LIBRARY_PATH="$root/target/release/ibverbs" RNIC_SOCKET="$work/rnic.sock" "$@"
}

failed=0
n=0
seen=0
# What the VM printed since the last call (its side's output of a step).
guest_output() {
  local total
  total=$(wc -l < "$work/vm.log")
  sed -n "$((seen + 1)),${total}p" "$work/vm.log" | sed 's/^/  [rxe] /'
  seen=$total
}
report() { # TEST DIRECTION HOST_RC GUEST_RC OUTPUT
  if [ "$3" -eq 0 ] && [ "$4" = 0 ]; then
    echo "interop $1 $2 ok"
  else
    echo "interop $1 $2 FAIL ours rc=$3, rxe rc=$4: $(grep -m1 -i 'error\|fail\|couldn' "$5" || echo 'see above')"
    failed=$((failed + 1))
  fi
}
for t in "${tests[@]}"; do
  # rxe serves, our NIC is the client (retrying until the server listens).
  n=$((n + 1))
  rc=1
  for _ in $(seq 60); do
    # shellcheck disable=SC2046
    ours timeout 300 $t $(args_of "$t" roce0) 10.77.0.2 > "$work/host.out" 2>&1 && { rc=0; break; }
    rc=$?
    grep -q "Couldn't connect\|Unable to init the socket\|Connection refused" "$work/host.out" || break
    sleep 1
  done
  wait_vm "GUEST-STEP $n " 300 || true
  guest_output
  sed 's/^/  [ours] /' "$work/host.out"
  grc=$(grep -o "GUEST-STEP $n rc=[0-9]*" "$work/vm.log" | cut -d= -f2)
  report "$t" "ours->rxe" "$rc" "${grc:-none}" "$work/host.out"
  # Our NIC serves, rxe is the client.
  n=$((n + 1))
  # shellcheck disable=SC2046
  ours timeout 300 $t $(args_of "$t" roce0) > "$work/host.out" 2>&1 && rc=0 || rc=$?
  wait_vm "GUEST-STEP $n " 300 || true
  guest_output
  sed 's/^/  [ours] /' "$work/host.out"
  grc=$(grep -o "GUEST-STEP $n rc=[0-9]*" "$work/vm.log" | cut -d= -f2)
  report "$t" "rxe->ours" "$rc" "${grc:-none}" "$work/host.out"
done
wait_vm GUEST-DONE 60 || true
say "rxe's counters in the VM"
sed -n '/GUEST-STATS/,/GUEST-DONE/p' "$work/vm.log" | grep -v GUEST
say "our counters"
target/release/dataplane stats --socket "$work/rnic.sock" || true
wait $vm 2>/dev/null || true
if [ $failed -gt 0 ]; then
  echo "interop: $failed of $((2 * ${#tests[@]})) failed"
  exit 1
fi
echo "interop: all $((2 * ${#tests[@]})) passed"
