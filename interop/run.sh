#!/usr/bin/env bash
# Interop with Linux Soft-RoCE (rxe): our NIC (the daemon, a DPDK af_packet
# port on a tap) and rxe in a QEMU VM (virtme-ng, pure emulation, the host's
# own root filesystem) run the same unmodified perftest against each other,
# each test with the server in the VM and the client on our NIC, then the
# other way round. See docs/spec/interop.md for the recipe, docs/interop.md
# for how this script runs it.
#
#   interop/run.sh [--quick | --bench] [--phases P,...] [--keep DIR] [TEST ...] [-- PERFTEST FLAGS]
#
# TEST: ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw
# ib_read_bw ib_send_bw ibv_rc_pingpong rc_verify, and on UD and UC QPs
# ibv_ud_pingpong ibv_uc_pingpong (data checked, -c) ib_send_lat_ud
# ib_send_bw_ud ib_write_lat_uc ib_send_bw_uc (perftest's -c UD / -c UC)
# gsi_probe (bench/scripts/gsi_probe.c: each side asks the other's QP1
# five MADs and requires Linux's answers, the fifth a CM REQ whose REJ
# our CM counts; MTU 1024 phase only)
# rping ucmatose udaddy (rdma_cm: interop/cm_app.sh runs each side; ours
# over our librdmacm and the daemon's CM, rxe's over the VM's kernel CM;
# MTU 1024 phase; rping and ucmatose also in cmloss, where our port loses
# 30% of the connection-setup MADs each way (REQ, REP, RTU, REJ, MRA,
# SIDR; not the DREQ/DREP of teardown, whose retries a program that
# destroys its id at once cancels, as Linux's CM does) and no other frame,
# so both CMs' retries carry the handshakes (not udaddy: Linux's CM
# forgets a SIDR_REQ once answered, so after a lost SIDR_REP the retried
# request reaches the server program as a new one, which udaddy, done
# accepting, never answers). Not perftest's -R: its client gives the server's second
# listener 1 s, which rxe under emulation does not meet)
# (default: all).
# rc_verify (bench/scripts/rc_verify.c, built by ./x build against
# rdma-core's libibverbs, so it runs on rxe too) checks every byte of a
# SEND, a WRITE with immediate, a READ and a FETCH_ADD per iteration; the
# pingpong checks one byte per page, on the server only.
# Phases: mtu1024 and mtu4096 (path MTU, loss-free), lossy (MTU 1024, our
# port losing 1% and reordering 0.1% of the frames it sends and receives),
# vlan (MTU 1024, RoCE over 802.1Q VLAN 100: ours with priority 3 on
# 10.77.100.3, rxe0 from the GID of the VM's VLAN interface 10.77.100.2;
# the pcap must show every frame we send tagged VLAN 100, priority 3),
# shards (MTU 1024, our device's QPs sharded over two engines, qp_shards =
# 2, on two queue pairs of the af_packet port, whose kernel fanout spreads
# received frames over them by flow hash; an application of ours holds
# shard 0, so the tests' QPs are shard 1's and every frame that reaches
# shard 0's queue is passed on; ARP frames reach every shard);
# cmloss (MTU 1024, 30% of the connection-setup MADs lost each way; rping
# and ucmatose only); default all six. Sizes: 1 B and perftest's -a (2 B .. 8 MiB), the
# pingpong 1 B and 1 MiB with its data checked (-c), rc_verify 1 B and
# 1 MiB; in vlan and shards 1 B and 64 KiB. UD and UC: the pingpongs
# 1 B and 2 KiB (UD, within the port MTU) or 64 KiB (UC); perftest's UD
# tests up to the MTU. Lossy, only what tolerates a lost datagram or UC
# message: the pingpongs and perftest's latency tests wait forever for
# one, so the lossy phase runs ib_send_bw_ud and ib_send_bw_uc for a
# fixed time (-D 3; the server counts what arrived).
# --quick: the short set `./x test` runs (a few sizes, every RC test in
# both directions at MTU 1024 and ibv_ud_pingpong and ibv_uc_pingpong;
# ib_write_bw and the pingpong again lossy, in vlan and in shards, and
# ib_read_lat in shards).
# With PERFTEST FLAGS: those flags instead of the sizes, phase mtu1024.
# --keep DIR: keep the pcaps, the daemon's and the VM's logs there.
# --bench: the benchmark instead: ib_write_lat (64 B) and ib_write_bw
# (64 KiB) between rxe and our NIC both ways and between two rxe QPs in
# the VM (rxe's loopback), interleaved over 3 rounds, medians at the end.
#
# One line per test and direction, the verdict of `bench judge` (both exit
# statuses, and both outputs read for the tools' failure words: the
# pingpong prints "invalid data in page N" and exits 0; the pingpong's end
# race on the lossy link passes only with the lost ACK in the record of
# what our fault injector lost): "interop TEST rxe->ours ok" or "...
# FAIL <why>", both programs' output above it; after each phase the pcap
# our port's tap recorded, checked by `bench decode`, by tshark and by an
# independent ICRC computation, and both stacks' counters. Exit 0 only when
# all passed. Everything it sets up (netns, tap, daemon, VM) goes away on
# exit, also on failure or Ctrl-C.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file
# while a run goes on cannot change that run.
{
cd "$(dirname "$0")/.."
root=$PWD

# Each step says what it does and when (seconds since the script started).
say() { printf '==> [%ds] %s\n' "$SECONDS" "$*"; }
die() { printf 'interop: %s\n' "$*" >&2; exit 1; }
# What this machine cannot do (no root, no tap, no QEMU or kernel to
# install): with --quick (./x test) the run is skipped, exit 77; otherwise
# it fails. Anything else that goes wrong (the VM does not boot in time,
# rxe cannot be set up, the guest's script fails) is a failure, always.
unable() {
  [ "$quick" = 1 ] || die "$*"
  printf 'interop: skipped: %s\n' "$*"
  exit 77
}

tests=()
extra=()
quick=0
bench=0
phases=
keep=
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,57p' "$0"; exit 0 ;;
    --bench) bench=1; shift ;;
    --keep) keep=${2:-}; shift 2 || die "--keep needs a directory" ;;
    --quick) quick=1; shift ;;
    --phases) phases=${2:-}; shift 2 || die "--phases needs a list (mtu1024,mtu4096,lossy,vlan,shards,cmloss)" ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) tests+=("$1"); shift ;;
  esac
done
all=(ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat ib_write_bw ib_read_bw ib_send_bw ibv_rc_pingpong rc_verify
  ibv_ud_pingpong ibv_uc_pingpong ib_send_lat_ud ib_send_bw_ud ib_write_lat_uc ib_send_bw_uc gsi_probe
  rping ucmatose udaddy)
if [ $bench = 1 ]; then
  [ ${#tests[@]} -eq 0 ] && tests=(ib_write_lat ib_write_bw)
  phases=bench
fi
[ ${#tests[@]} -eq 0 ] && tests=("${all[@]}")
for t in "${tests[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || die "unknown test $t (one of: ${all[*]})"
done
if [ -z "$phases" ]; then
  if [ ${#extra[@]} -gt 0 ]; then phases=mtu1024
  elif [ $quick = 1 ]; then phases=mtu1024,lossy,vlan,shards
  else phases=mtu1024,mtu4096,lossy,vlan,shards,cmloss
  fi
fi
IFS=, read -r -a phase_list <<< "$phases"
for p in "${phase_list[@]}"; do
  case "$p" in mtu1024|mtu4096|lossy|vlan|shards|cmloss|bench) ;; *) die "unknown phase $p (mtu1024, mtu4096, lossy, vlan, shards, cmloss)" ;; esac
done

[ "$(id -u)" -eq 0 ] || unable "needs root (network namespace, tap device, VM)"
[ -e /dev/net/tun ] || unable "no /dev/net/tun: cannot make the tap device"
command -v apt-get > /dev/null || command -v qemu-system-x86_64 > /dev/null \
  || unable "no apt-get to install QEMU and a kernel"
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
pkgs=(qemu-system-x86 linux-image-amd64 busybox-static rdma-core python3-venv ibverbs-utils perftest rdmacm-utils iproute2 tshark)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null \
    || unable "apt-get install ${need[*]} failed"
  kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
fi
[ -n "$kernel" ] || unable "no kernel in /boot (apt-get install linux-image-amd64)"
venv=$root/target/interop/venv
if [ ! -x "$venv/bin/vng" ]; then
  say "installing virtme-ng into $venv (PyPI)"
  { python3 -m venv "$venv" && "$venv/bin/pip" install -q virtme-ng; } \
    || { rm -rf "$venv"; unable "could not install virtme-ng from PyPI"; }
fi
export PATH=$venv/bin:$PATH
say "building (release; up to date in seconds after ./x build)"
./x build > target/interop-build.log 2>&1 || { tail -20 target/interop-build.log; die "the build failed"; }

ns=rnic-interop-$$
tap=rnictap0
work=$(mktemp -d /tmp/rnic-interop.XXXXXX)
daemon_pid=
vm=
holder_pid=
stop_daemon() {
  if [ -n "$holder_pid" ]; then
    kill "$holder_pid" 2>/dev/null || true
    wait "$holder_pid" 2>/dev/null || true
    holder_pid=
  fi
  [ -n "$daemon_pid" ] || return 0
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=
}
cleanup() {
  set +e
  stop_daemon
  [ -n "$vm" ] && kill "$vm" 2>/dev/null
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null
  sleep 0.2
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  if [ -n "$keep" ]; then
    mkdir -p "$keep" && cp "$work"/*.pcap "$work"/*.log "$keep"/ 2>/dev/null
    echo "interop: pcaps and logs kept in $keep"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "network namespace $ns, tap $tap (10.77.0.1 the namespace's kernel, for perftest's TCP exchange)"
ip netns add "$ns" || unable "cannot make a network namespace"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" ip tuntap add dev $tap mode tap || unable "cannot make a tap device"
ip netns exec "$ns" ip addr add 10.77.0.1/24 dev $tap
ip netns exec "$ns" ip link set $tap mtu 9000
ip netns exec "$ns" ip link set $tap up

# The daemon's mbufs hold a 4096-byte payload and its headers (4608 bytes);
# af_packet's ring frames must fit them (frame size - 52 + 20 <= 4608), and
# its PMD finds frame i at i * framesz, so a block holds whole frames only:
# 8 frames of 4608 bytes in a 36864-byte block.
start_daemon() { # PHASE
  local faults= address='ip = "10.77.0.3"' qpairs= shards=
  if [ "$1" = shards ]; then
    qpairs=,qpairs=2
    shards='qp_shards = 2'
  fi
  if [ "$1" = lossy ]; then
    # Every frame the faults lose is recorded: the judge reads it.
    faults=$'[loopback.faults]\nhost = 0\nloss = 0.01\nreorder = 0.001\nseed = 7\nlost_pcap = "'"$work/lost.pcap"'"'
  fi
  if [ "$1" = cmloss ]; then
    faults=$'[loopback.faults]\nhost = 0\nmad_loss = 0.3\nseed = 7\nlost_pcap = "'"$work/lost.pcap"'"'
  fi
  # perftest's TCP exchange stays untagged, between the namespace's kernel
  # (10.77.0.1) and the VM's NIC (10.77.0.2); RoCE goes over VLAN 100.
  [ "$1" = vlan ] && address=$'ip = "10.77.100.3"\nvlan = 100\npriority = 3'

  cat > "$work/cfg.toml" <<CFG
[eal]
args = ["--no-huge", "--no-pci", "--no-telemetry", "-m", "256", "--log-level=lib.eal:warning", "--vdev=net_af_packet0,iface=$tap,blocksz=36864,framesz=4608,framecnt=512$qpairs"]
[loopback]
mem_bytes = 4096
mtu = 4096
sizes = []
$faults
[service]
socket = "$work/rnic.sock"
max_shm_bytes = 1073741824
hugepages = false
tap = "$work/$1.pcap"
tap_frames = 4000000
$shards
[[service.devices]]
name = "roce0"
port = 0
$address
mac = "02:77:00:00:00:03"
CFG
  rm -f "$work/rnic.sock"
  ip netns exec "$ns" target/release/dataplane --config "$work/cfg.toml" --serve \
    --file-prefix "interop-$$" > "$work/daemon-$1.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do [ -S "$work/rnic.sock" ] && break; sleep 0.1; done
  [ -S "$work/rnic.sock" ] || { cat "$work/daemon-$1.log"; die "the daemon did not start"; }
  if [ "$1" = shards ]; then
    # An application of ours on shard 0 (a server waiting for a client
    # that never comes): the tests' applications open shard 1.
    # (Not through `ours`: a function in the background is a subshell, and
    # its PID would not be the program's.)
    ip netns exec "$ns" env LD_LIBRARY_PATH="$root/target/release/ibverbs" RNIC_SOCKET="$work/rnic.sock" \
      ibv_rc_pingpong -d roce0 -g 1 -p 18999 > "$work/holder.log" 2>&1 &
    holder_pid=$!
    for _ in $(seq 100); do
      ip netns exec "$ns" ss -ltn 2>/dev/null | grep ':18999 ' > /dev/null && break
      sleep 0.1
    done
    kill -0 "$holder_pid" 2>/dev/null \
      || { cat "$work/holder.log"; die "the application holding shard 0 did not start"; }
  fi
}

# The steps: PHASE TEST SIZE-ARGS, one line each. perftest: GID index 1;
# few iterations (rxe under emulation takes a 4 ms tick per round trip and
# moves some MB/s).
steps=$work/steps
: > "$steps"
rounds=1
[ $bench = 1 ] && rounds=3
for phase in "${phase_list[@]}"; do
  for round in $(seq $rounds); do
  for t in "${tests[@]}"; do
    if [ $bench = 1 ]; then
      case "$t" in
        *_lat) sizes=("-s 64 -n 500 ${extra[*]:-}") ;;
        *) sizes=("-s 65536 -n 500 ${extra[*]:-}") ;;
      esac
    elif [ ${#extra[@]} -gt 0 ]; then
      sizes=("${extra[*]}")
    elif [ $quick = 1 ]; then
      case "$phase:$t" in
        mtu1024:gsi_probe) sizes=("-w 2000") ;;
        *:gsi_probe) sizes=() ;;
        # One rdma_cm run each way.
        mtu1024:rping) sizes=("") ;;
        cmloss:*) sizes=() ;;
        *:rping|*:ucmatose|*:udaddy) sizes=() ;;
        mtu1024:ibv_ud_pingpong) sizes=("-s 2048 -n 5") ;;
        mtu1024:ibv_uc_pingpong) sizes=("-s 65536 -n 5") ;;
        *:ibv_u[cd]_pingpong|*_ud|*_uc) sizes=() ;;
        vlan:ib_write_bw) sizes=("-s 65536 -n 20") ;;
        vlan:ibv_rc_pingpong) sizes=("-s 1 -n 5") ;;
        vlan:rc_verify) sizes=("-s 65536 -n 3") ;;
        vlan:*) sizes=() ;;
        shards:ib_write_bw) sizes=("-s 65536 -n 20") ;;
        shards:ib_read_lat) sizes=("-s 4096 -n 20") ;;
        shards:ibv_rc_pingpong) sizes=("-s 1 -n 5" "-s 65536 -n 5") ;;
        shards:rc_verify) sizes=("-s 65536 -n 3") ;;
        shards:*) sizes=() ;;
        lossy:ib_write_bw) sizes=("-s 65536 -n 50") ;;
        lossy:ibv_rc_pingpong) sizes=("-s 65536 -n 50") ;;
        lossy:rc_verify) sizes=("-s 65536 -n 5") ;;
        lossy:*) sizes=() ;;
        *:ibv_rc_pingpong) sizes=("-s 1 -n 5" "-s 65536 -n 5") ;;
        *:rc_verify) sizes=("-s 65536 -n 3") ;;
        *:ib_atomic_lat) sizes=("-n 20") ;;
        *_lat) sizes=("-s 1 -n 20" "-s 4096 -n 20") ;;
        *) sizes=("-s 65536 -n 20") ;;
      esac
    else
      case "$phase:$t" in
        mtu1024:gsi_probe) sizes=("-w 2000") ;;
        *:gsi_probe) sizes=() ;;
        mtu1024:rping|mtu1024:ucmatose|mtu1024:udaddy) sizes=("") ;;
        cmloss:rping|cmloss:ucmatose) sizes=("") ;;
        *:rping|*:ucmatose|*:udaddy|cmloss:*) sizes=() ;;
        lossy:ib_send_bw_ud) sizes=("-s 1024 -D 3") ;;
        lossy:ib_send_bw_uc) sizes=("-s 65536 -D 3") ;;
        lossy:ibv_u[cd]_pingpong|lossy:*_ud|lossy:*_uc) sizes=() ;;
        *:ibv_ud_pingpong) sizes=("-s 1 -n 5" "-s 2048 -n 5") ;;
        *:ibv_uc_pingpong) sizes=("-s 1 -n 5" "-s 65536 -n 5") ;;
        vlan:*_ud|vlan:*_uc|shards:*_ud|shards:*_uc) sizes=("-s 1 -n 20") ;;
        *_ud) sizes=("-s 1 -n 20" "-a -n 5") ;;
        *_uc) sizes=("-s 1 -n 20" "-s 65536 -n 5") ;;
        vlan:ibv_rc_pingpong|vlan:rc_verify) sizes=("-s 1 -n 5" "-s 65536 -n 5") ;;
        vlan:ib_atomic_lat) sizes=("-n 20") ;;
        vlan:*) sizes=("-s 1 -n 20" "-s 65536 -n 5") ;;
        shards:ibv_rc_pingpong|shards:rc_verify) sizes=("-s 1 -n 5" "-s 65536 -n 5") ;;
        shards:ib_atomic_lat) sizes=("-n 20") ;;
        shards:*) sizes=("-s 1 -n 20" "-s 65536 -n 5") ;;
        *:ibv_rc_pingpong|*:rc_verify) sizes=("-s 1 -n 5" "-s 1048576 -n 5") ;;
        *:ib_atomic_lat) sizes=("-n 50") ;;
        *) sizes=("-s 1 -n 20" "-a -n 5") ;;
      esac
    fi
    for s in "${sizes[@]}"; do echo "$phase $t $s" >> "$steps"; done
  done
  done
done

# perftest times itself with the CPU's cycle counter, calibrated at start;
# on noisy or emulated cores that can fail (r^2 < 0.9), and without -F it
# then exits 1 in the middle of a run instead of printing its table.
args_of() { # TEST DEVICE PHASE SIZE-ARGS [GID-INDEX]
  local mtu=1024 gid=${5:-1}
  [ "$3" = mtu4096 ] && mtu=4096
  case "$1" in
    ibv_rc_pingpong|ibv_uc_pingpong) echo "-d $2 -g $gid -c -m $mtu $4" ;;
    # UD: datagrams up to the port's MTU (no -m).
    ibv_ud_pingpong) echo "-d $2 -g $gid -c $4" ;;
    rc_verify) echo "-d $2 -g $gid -m $mtu $4" ;;
    # Each side probes the other's QP1 (rxe0 ours at 10.77.0.3, roce0
    # rxe's at 10.77.0.2); a client's trailing host is ignored.
    gsi_probe) if [ "$2" = rxe0 ]; then echo "-d $2 -g $gid -t 10.77.0.3 $4"; else echo "-d $2 -g $gid -t 10.77.0.2 $4"; fi ;;
    # interop/cm_app.sh TEST PEER DEVICE (a client gets one more word).
    rping|ucmatose|udaddy)
      if [ "$2" = rxe0 ]; then echo "$1 10.77.0.3 $2"; else echo "$1 10.77.0.2 $2"; fi ;;
    *_ud) echo "-d $2 -x $gid -m $mtu -F -c UD $4" ;;
    *_uc) echo "-d $2 -x $gid -m $mtu -F -c UC $4" ;;
    *) echo "-d $2 -x $gid -m $mtu -F $4" ;;
  esac
}
# The program a test runs: ours are built by ./x build (the VM sees the
# host's files).
prog_of() { # TEST
  case "$1" in
    rc_verify) echo "$root/target/release/rc_verify" ;;
    gsi_probe) echo "$root/target/release/gsi_probe" ;;
    rping|ucmatose|udaddy) echo "$root/interop/cm_app.sh" ;;
    *_ud|*_uc) echo "${1%_u[dc]}" ;;
    *) echo "$1" ;;
  esac
}

# The guest's plan: for each step, rxe serves and we are the client, then
# we serve.
plan=$work/plan
: > "$plan"
while read -r phase t s; do
  # The guest finds the index of rxe0's GID on its VLAN interface.
  ggid=1
  [ "$phase" = vlan ] && ggid=@vlan_gid@
  echo "server $(prog_of "$t") $(args_of "$t" rxe0 "$phase" "$s" $ggid)" >> "$plan"
  echo "client $(prog_of "$t") $(args_of "$t" rxe0 "$phase" "$s" $ggid)" >> "$plan"
  # The benchmark's floor: rxe against rxe (its loopback) in the VM.
  [ "$phase" = bench ] && echo "local $(prog_of "$t") $(args_of "$t" rxe0 "$phase" "$s")" >> "$plan"
done < "$steps"

say "booting the VM (pure emulation; rxe0 on 10.77.0.2, MTU 9000; and on VLAN 100, 10.77.100.2, when a phase needs it)"
ip netns exec "$ns" vng -r "$kernel" --disable-kvm --memory 1G --cpus 1 \
  --qemu-opts="-netdev tap,id=n1,ifname=$tap,script=no,downscript=no -device virtio-net-pci,netdev=n1,mac=52:54:00:77:00:02,host_mtu=9000" \
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
# From here on nothing is skipped: QEMU and a kernel are here, so a VM
# that does not come up, or an rxe it cannot make, is a failure.
if ! wait_vm GUEST-READY 300; then
  tail -30 "$work/vm.log"
  fatal=$(grep -m1 'GUEST-FATAL' "$work/vm.log" || true)
  if [ -n "$fatal" ]; then
    die "the guest could not set up rxe: ${fatal#*GUEST-FATAL } (the VM's log above)"
  elif kill -0 $vm 2>/dev/null; then
    die "the VM did not boot and bring rxe0 up within 300 s (the VM's log above)"
  else
    die "the VM exited before it brought rxe0 up (the VM's log above)"
  fi
fi

# What a client prints when its server does not listen yet (perftest and
# the pingpongs over TCP; rdma_cm's REJ for no listener, or SIDR's
# "unsupported" for UD).
not_yet="Couldn't connect\|Unable to init the socket\|Connection refused\|REJECTED\|bl blka 8\|UNREACHABLE, error: 1"
ours() { # runs a verbs program in the namespace over our library
  ip netns exec "$ns" env LD_LIBRARY_PATH="$root/target/release/ibverbs" RNIC_SOCKET="$work/rnic.sock" "$@"
}

failed=0
total=0
n=0
seen=0
# What the VM printed since the last call (its side's output of a step).
guest_output() {
  local lines
  lines=$(wc -l < "$work/vm.log")
  sed -n "$((seen + 1)),${lines}p" "$work/vm.log" > "$work/guest.out"
  sed 's/^/  [rxe] /' "$work/guest.out"
  seen=$lines
}
# The benchmark's figure in a perftest output: t_typical (us) of a latency
# test, BW average (MB/s) of a bandwidth test, from its results line.
figure() { # TEST FILE
  local col=5
  case "$1" in *_bw) col=4 ;; esac
  awk -v c=$col '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ {v = $c} END {print v}' "$2"
}
results=$work/results
: > "$results"
# The verdict on one test and direction, from `bench judge` (see its
# --help): both exit statuses, both outputs read for the programs' own
# failure words, and the pingpong's end race on the lossy link (its final
# SEND's ACK lost after the peer closed its QP) passed only when the frames
# our fault injector lost hold that ACK.
end_races=0
report() { # DIRECTION HOST_RC GUEST_RC OUR_OUTPUT GUEST_OUTPUT
  local lost=() verdict
  total=$((total + 1))
  [ "$p" = lossy ] && lost=(--lost-pcap "$work/lost.pcap")
  verdict=$(target/release/bench judge --program "$t" --phase "$p" \
    --args "$(args_of "$t" roce0 "$p" "$s")" --ours-rc "$2" --rxe-rc "$3" \
    --ours-output "$4" --rxe-output "$5" --our-mac 02:77:00:00:00:03 "${lost[@]}" 2>&1) || true
  echo "interop $name $1 $verdict"
  case "$verdict" in
    "ok ("*) end_races=$((end_races + 1)) ;;
    ok) ;;
    *) failed=$((failed + 1)) ;;
  esac
}
# Checks a phase's pcap three ways and prints what each found.
check_pcap() { # FILE
  local f=$1 dec ts
  [ -s "$f" ] || { echo "tap: no pcap written"; failed=$((failed + 1)); return; }
  dec=$(target/release/bench decode "$f" | tail -1)
  echo "bench decode: $dec"
  case "$dec" in *" icrc_bad=0 other="*" errors=0") ;; *) echo "interop pcap FAIL: bench decode found bad frames"; failed=$((failed + 1)) ;; esac
  # SEND payloads are application bytes: Wireshark's RPC-over-RDMA
  # heuristic would read them as its own headers and call them malformed.
  local tsh=(tshark -r "$f" -d udp.port==4791,infiniband --disable-protocol rpcordma)
  ts=$("${tsh[@]}" -T fields -e frame.protocols 2>/dev/null | sort | uniq -c | sed 's/^ */    /')
  echo "tshark (frames by protocol stack):"
  echo "$ts"
  local ib roce
  ib=$(echo "$ts" | awk '/:infiniband/ {n += $1} END {print n + 0}')
  roce=$(echo "$dec" | sed -n 's/.* roce=\([0-9]*\) .*/\1/p')
  if [ "$ib" != "$roce" ]; then
    echo "interop pcap FAIL: tshark reads $ib InfiniBand frames, bench decode $roce RoCEv2 frames"
    failed=$((failed + 1))
  fi
  # Its other payload heuristics (an EtherType, SMC, iSER, ... guessed in
  # the application's bytes) may fail on them too: those frames are not
  # counted against the RoCE headers.
  local bad='(_ws.malformed || _ws.expert.severity >= error) && !(frame.protocols matches "infiniband:[a-ce-z]")'
  if "${tsh[@]}" -Y "$bad" -T fields -e frame.number 2>/dev/null | grep -q .; then
    echo "interop pcap FAIL: tshark finds malformed frames:"
    "${tsh[@]}" -Y "$bad" 2>/dev/null | head -5
    failed=$((failed + 1))
  fi
  python3 "$root/interop/icrc_check.py" "$f" || { echo "interop pcap FAIL: ICRC"; failed=$((failed + 1)); }
}

# The vlan phase's pcap: every frame our device sent (RoCE and ARP, from
# its MAC) carries VLAN 100 with priority 3, and no RoCE frame either way
# is untagged.
check_vlan_pcap() { # FILE
  local f=$1 ours wrong untagged
  ours=$(tshark -r "$f" -Y 'eth.src == 02:77:00:00:00:03' -T fields -e frame.number 2>/dev/null | wc -l)
  wrong=$(tshark -r "$f" -Y 'eth.src == 02:77:00:00:00:03 && !(vlan.id == 100 && vlan.priority == 3)' -T fields -e frame.number 2>/dev/null | wc -l)
  untagged=$(tshark -r "$f" -d udp.port==4791,infiniband -Y 'infiniband && !vlan' -T fields -e frame.number 2>/dev/null | wc -l)
  echo "vlan: $ours frames from our device, $wrong of them not VLAN 100 priority 3; $untagged untagged RoCE frames"
  if [ "$ours" -eq 0 ] || [ "$wrong" -ne 0 ] || [ "$untagged" -ne 0 ]; then
    echo "interop pcap FAIL: frames outside VLAN 100 priority 3"
    failed=$((failed + 1))
  fi
}

# The shards phase's counters: the tests' QPs were shard 1's (it received
# RoCE frames), and what the port passed between the shards.
check_shards() { # STATS-FILE
  local rx steer
  rx=$(sed -n 's/^host 0\.1 all QPs.* rx_pkts \([0-9]*\) .*/\1/p' "$1")
  steer=$(grep '^host 0[. ].*steering' "$1" | sed 's/ ARP.*//' || true)
  echo "shards: shard 1's QPs received ${rx:-no} frames; $steer" | tr '\n' ' '
  echo
  if [ "${rx:-0}" -eq 0 ]; then
    echo "interop shards FAIL: no RoCE frame reached shard 1's QPs"
    failed=$((failed + 1))
  fi
}

# gsi_probe's fifth probe is a CM REQ, each way, for a port nobody listens
# on: our CM must have rejected rxe's (invalid service ID, to rxe's QP1)
# and taken the REJ rxe's CM sent to our QP1 as one (not dropped it as
# malformed).
check_cm() { # STATS-FILE
  local line sent rcvd nolisten malformed
  line=$(grep '^host 0 CM:' "$1" || true)
  echo "cm: ${line:-no CM line in our counters}"
  sent=$(echo "$line" | sed -n 's/.*REJ sent \([0-9]*\) received.*/\1/p')
  rcvd=$(echo "$line" | sed -n 's/.*REJ sent [0-9]* received \([0-9]*\):.*/\1/p')
  nolisten=$(echo "$line" | sed -n 's/.*no listener \([0-9]*\);.*/\1/p')
  malformed=$(echo "$line" | sed -n 's/.*dropped: malformed \([0-9]*\),.*/\1/p')
  # Each gsi_probe run sends one REQ; rxe's probe 4 (an unknown CM
  # attribute) is the only MAD our CM may drop as malformed.
  # (rdma_cm tests in the phase add REJs of requests that came before
  # their server listened.)
  if [ "${sent:-0}" -lt 1 ] || [ "${rcvd:-0}" -lt 1 ] || [ "${nolisten:-0}" != "${sent:-0}" ] \
     || [ "${malformed:-1}" -gt "${sent:-0}" ] || [ "${malformed:-0}" -lt 1 ]; then
    echo "interop cm FAIL: gsi_probe's CM REQs were not rejected both ways (REJ sent ${sent:-?}, received ${rcvd:-?}, no listener ${nolisten:-?}, malformed ${malformed:-?})"
    failed=$((failed + 1))
  fi
}

# A phase with rdma_cm tests: our CM's and rdma_cm's lines, which must
# show the events our sessions had; in cmloss, MADs lost both ways (the
# lost pcap), our CM's retransmissions, and rxe's (duplicates here).
check_rdma_cm() { # PHASE STATS-FILE
  local cm line events retx dups lost
  cm=$(grep '^host 0 CM:' "$2" || true)
  line=$(grep '^host 0 rdma_cm:' "$2" || true)
  # (check_cm printed the CM line of a phase with gsi_probe.)
  grep -q "^$1 gsi_probe" "$steps" || echo "cm: ${cm:-no CM line in our counters}"
  echo "cm: ${line:-no rdma_cm line in our counters}"
  events=$(echo "$line" | sed -n 's/.*; events \([0-9]*\) .*/\1/p')
  retx=$(echo "$cm" | sed -n 's/.*(retransmitted \([0-9]*\)).*/\1/p')
  dups=$(echo "$cm" | sed -n 's/.*, duplicates \([0-9]*\);.*/\1/p')
  if [ "${events:-0}" -lt 1 ]; then
    echo "interop cm FAIL: no rdma_cm events in our counters"
    failed=$((failed + 1))
  fi
  if [ "$1" = cmloss ]; then
    lost=$(tshark -r "$work/lost.pcap" -d udp.port==4791,infiniband -Y 'infiniband.bth.destqp == 1' -T fields -e frame.number 2>/dev/null | wc -l)
    echo "cm: MADs the link lost $lost; our CM retransmitted ${retx:-?}, took ${dups:-?} duplicates"
    if [ "$lost" -lt 1 ] || [ "${retx:-0}" -lt 1 ]; then
      echo "interop cm FAIL: no MAD lost, or none retried by our CM"
      failed=$((failed + 1))
    fi
  fi
}

# Ends a phase: our counters, the daemon stopped (which closes the pcap),
# the pcap checked.
end_phase() { # PHASE
  say "phase $1: our counters"
  ip netns exec "$ns" target/release/dataplane stats --socket "$work/rnic.sock" > "$work/stats.out" 2>&1 || true
  cat "$work/stats.out"
  stop_daemon
  [ "$1" = shards ] && check_shards "$work/stats.out"
  if [ "$1" = mtu1024 ] && grep -q '^mtu1024 gsi_probe' "$steps"; then
    check_cm "$work/stats.out"
  fi
  if grep -q "^$1 \(rping\|ucmatose\|udaddy\)" "$steps"; then
    check_rdma_cm "$1" "$work/stats.out"
  fi
  say "phase $1: our port's pcap"
  # How many frames it holds, and how many the tap_frames limit left out.
  grep '^tap:' "$work/daemon-$1.log" || true
  check_pcap "$work/$1.pcap"
  [ "$1" = vlan ] && check_vlan_pcap "$work/$1.pcap"
  return 0
}
phase=
while read -r p t s <&3; do
  if [ "$p" != "$phase" ]; then
    [ -n "$phase" ] && end_phase "$phase"
    phase=$p
    say "phase $phase: starting our daemon"
    start_daemon "$phase"
  fi
  name="$t [$phase${s:+ $s}]"
  # rxe serves, our NIC is the client (retrying until the server listens).
  n=$((n + 1))
  rc=1
  for _ in $(seq 60); do
    # shellcheck disable=SC2046
    ours timeout 600 $(prog_of "$t") $(args_of "$t" roce0 "$p" "$s") 10.77.0.2 > "$work/host.out" 2>&1 && { rc=0; break; }
    rc=$?
    grep -q "$not_yet" "$work/host.out" || break
    sleep 1
  done
  wait_vm "GUEST-STEP $n " 600 || true
  guest_output
  sed 's/^/  [ours] /' "$work/host.out"
  grc=$(grep -o "GUEST-STEP $n rc=[0-9]*" "$work/vm.log" | cut -d= -f2)
  report "ours->rxe" "$rc" "${grc:-none}" "$work/host.out" "$work/guest.out"
  [ "$p" = bench ] && echo "$t ours->rxe $(figure "$t" "$work/host.out")" >> "$results"
  # Our NIC serves, rxe is the client.
  n=$((n + 1))
  # shellcheck disable=SC2046
  ours timeout 600 $(prog_of "$t") $(args_of "$t" roce0 "$p" "$s") > "$work/host.out" 2>&1 && rc=0 || rc=$?
  wait_vm "GUEST-STEP $n " 600 || true
  guest_output
  sed 's/^/  [ours] /' "$work/host.out"
  grc=$(grep -o "GUEST-STEP $n rc=[0-9]*" "$work/vm.log" | cut -d= -f2)
  report "rxe->ours" "$rc" "${grc:-none}" "$work/host.out" "$work/guest.out"
  if [ "$p" = bench ]; then
    # The server's side (ours here) prints the same table as the client.
    echo "$t rxe->ours $(figure "$t" "$work/host.out")" >> "$results"
    n=$((n + 1))
    wait_vm "GUEST-STEP $n " 600 || true
    guest_output
    grc=$(grep -o "GUEST-STEP $n rc=[0-9]*" "$work/vm.log" | cut -d= -f2)
    report "rxe<->rxe" 0 "${grc:-none}" "$work/guest.out" "$work/guest.out"
    echo "$t rxe<->rxe $(figure "$t" "$work/guest.out")" >> "$results"
  fi
done 3< "$steps"
end_phase "$phase"
wait_vm GUEST-DONE 60 || true
say "rxe's counters in the VM (all phases)"
sed -n '/GUEST-STATS/,/GUEST-DONE/p' "$work/vm.log" | grep -v GUEST
wait $vm 2>/dev/null || true
vm=
if [ $bench = 1 ]; then
  say "benchmark: median of 3 interleaved rounds (t_typical us for _lat, BW average MB/s for _bw; rxe<->rxe: both QPs on rxe0 in the VM)"
  for t in "${tests[@]}"; do
    for d in "ours->rxe" "rxe->ours" "rxe<->rxe"; do
      vals=$(awk -v t="$t" -v d="$d" '$1 == t && $2 == d && $3 != "" {print $3}' "$results" | sort -g | tr '\n' ' ')
      med=$(echo "$vals" | awk '{n = split($0, a, " "); print (n ? a[int((n + 1) / 2)] : "none")}')
      printf '  %-14s %-10s median %-10s (rounds: %s)\n' "$t" "$d" "$med" "$vals"
    done
  done
fi
if [ $failed -gt 0 ]; then
  echo "interop: $failed failed (of $total runs and the pcap checks)"
  exit 1
fi
echo "interop: all $total passed$( [ $end_races = 0 ] || echo " ($end_races of them with the final SEND's ACK lost by our fault injector after the peer closed, above)")"
exit 0
}
