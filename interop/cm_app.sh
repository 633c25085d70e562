#!/bin/sh
# One side of an interop rdma_cm test (run by interop/run.sh on our NIC, and
# in the VM by interop/guest.sh on rxe, whose kernel CM it then uses):
#
#   interop/cm_app.sh TEST PEER DEVICE [HOST]
#
# Without HOST it is the server (listening on every address); with one (the
# host the harness appends for a client, unused) the client of PEER, the
# other side's RoCE address. TEST: rping (RC, 10 pings of 64 B, both sides
# verify the data and print each ping), ucmatose (RC, 2 connections of 10
# messages), udaddy (UD over SIDR, 2 connections of 10 messages).
test=$1
peer=$2
dev=$3
if [ $# -ge 4 ]; then role=client; else role=server; fi
case "$test:$role" in
  rping:server) exec rping -s -a 0.0.0.0 -p 7174 -C 10 -S 64 -V -v ;;
  rping:client) exec rping -c -a "$peer" -p 7174 -C 10 -S 64 -V -v ;;
  ucmatose:server) exec ucmatose -p 7471 -c 2 -C 10 ;;
  ucmatose:client) exec ucmatose -s "$peer" -p 7471 -c 2 -C 10 ;;
  udaddy:server) exec udaddy -c 2 -C 10 ;;
  udaddy:client) exec udaddy -s "$peer" -c 2 -C 10 ;;
  *) echo "cm_app.sh: unknown test $test"; exit 2 ;;
esac
