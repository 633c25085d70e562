#!/bin/bash
# What the drop-in libibverbs adds to a 64 B WRITE ping-pong, measured
# interleaved in one run (the machine is noisy; compare ratios, not runs):
#
#   perftest  ib_write_lat -s 64, two processes, over target/release/ibverbs
#   bench2    bench write-lat -s 64, two processes, our Rust verbs API
#             (the same layout as perftest: two spinning processes and the
#             daemon's lcore)
#   loopback  bench write-lat --loopback -s 64, both ends on one thread
#   lib1      write_lat_1thread.c: the loopback mode's loop through
#             libibverbs (one thread, both ends), linked -libverbs and run
#             over ours: the library's own cost with the cores not
#             oversubscribed
#
# On a machine with fewer than four cores, perftest and bench2 run three
# spinning threads (two processes and the daemon's lcore) on too few cores,
# so their latency is scheduler time slices: compare perftest with bench2
# (same layout), and lib1 with loopback (same layout).
# Usage: bench/scripts/ibverbs_overhead.sh [ROUNDS] [ITERS]   (after ./x build)
# Prints each round's typical/median half-RTT (us) and the median of the
# per-round ratios perftest/bench2 and perftest/loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-10}
iters=${2:-2000}
rel=target/release
[ -x $rel/dataplane ] && [ -x $rel/bench ] && [ -e $rel/ibverbs/libibverbs.so.1 ] ||
  { echo "run ./x build first" >&2; exit 1; }
command -v ib_write_lat >/dev/null || { echo "apt-get install -y perftest" >&2; exit 1; }
dir=$(mktemp -d)
sock=$dir/rnic.sock
cat > "$dir/cfg.toml" <<CFG
[eal]
args = ["--no-huge", "--no-pci", "--no-telemetry", "-m", "256", "--log-level=lib.eal:warning"]
[loopback]
mem_bytes = 4096
mtu = 1024
sizes = []
[service]
socket = "$sock"
max_shm_bytes = 268435456
hugepages = false
CFG
$rel/dataplane --config "$dir/cfg.toml" --serve --file-prefix ibvovh-$$ > "$dir/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
port=19100
cc -O2 -Wall -Werror -Itransport/ibverbs/examples/c bench/scripts/write_lat_1thread.c -libverbs -o "$dir/lib1t"

# One perftest run; prints t_typical (the median) in us.
perftest() {
  port=$((port + 1))
  LD_LIBRARY_PATH=$rel/ibverbs RNIC_SOCKET=$sock ib_write_lat -d rnic1 -s 64 -n "$iters" -p $port > "$dir/srv" 2>&1 &
  local s=$!
  sleep 0.3
  LD_LIBRARY_PATH=$rel/ibverbs RNIC_SOCKET=$sock ib_write_lat -d rnic0 -s 64 -n "$iters" -p $port localhost > "$dir/cli" 2>&1
  wait $s
  awk '$1 == 64 { print $5 }' "$dir/cli"
}

# One two-process bench run; prints t_typical (the median) in us.
bench2() {
  port=$((port + 1))
  $rel/bench write-lat --socket "$sock" -s 64 -n "$iters" -p $port > "$dir/bsrv" 2>&1 &
  local s=$!
  sleep 0.3
  $rel/bench write-lat --socket "$sock" -s 64 -n "$iters" -p $port 127.0.0.1 > "$dir/bcli" 2>&1
  wait $s
  awk '$1 == 64 { print $5 }' "$dir/bcli"
}

# One loopback bench run (one thread drives both ends).
loopback() {
  $rel/bench write-lat --loopback --socket "$sock" -s 64 -n "$iters" > "$dir/lcli" 2>&1
  awk '$1 == 64 { print $5 }' "$dir/lcli"
}

# One single-thread run through the library.
lib1() {
  LD_LIBRARY_PATH=$rel/ibverbs RNIC_SOCKET=$sock "$dir/lib1t" 64 "$iters" | awk '$1 == 64 { print $5 }'
}

printf "%5s %12s %12s %12s %12s\n" round perftest_us bench2_us loopback_us lib1_us
r1=() r2=() r3=()
for r in $(seq "$rounds"); do
  p=$(perftest); b=$(bench2); l=$(loopback); o=$(lib1)
  printf "%5s %12s %12s %12s %12s\n" "$r" "$p" "$b" "$l" "$o"
  r1+=("$(echo "$p / $b" | bc -l)")
  r2+=("$(echo "$p / $l" | bc -l)")
  r3+=("$(echo "$o / $l" | bc -l)")
done
median() { printf "%s\n" "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
echo "median ratio perftest/bench2   (library vs our API, same layout): $(median "${r1[@]}")"
echo "median ratio perftest/loopback (vs one thread driving both ends):  $(median "${r2[@]}")"
echo "median ratio lib1/loopback     (library vs our API, one thread):     $(median "${r3[@]}")"
