/*
 * write_read.c - RDMA WRITE and READ over verbs: one process opens both
 * devices of the loopback testbed (rnic0 and rnic1), gives each QP HPCC++
 * with in-band telemetry (rnicdv.h, the NIC's extension to verbs),
 * connects them, WRITEs a pattern from a malloc'd buffer on rnic0 into
 * one on rnic1, READs it back, checks both and prints the QP's congestion
 * control state.
 *
 *   ./x build
 *   target/release/dataplane --config configs/loopback.toml --serve &
 *   cc -Itransport/ibverbs/include transport/ibverbs/examples/c/write_read.c \
 *      -Ltarget/release/ibverbs -l:libibverbs.so.1 -o write_read
 *   LD_LIBRARY_PATH=target/release/ibverbs ./write_read
 */
#define _GNU_SOURCE
#include <rnicdv.h>

#include "common.h"

#define SIZE 65536
#define ACCESS                                                                 \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ)

int main(void)
{
	me = "write_read";
	struct side a, b;
	open_side(&a, "rnic0", 16);
	open_side(&b, "rnic1", 16);
	/* Per-QP congestion control, chosen before the QPs connect. */
	int err;
	if ((err = rnicdv_set_qp_cc(a.qp, "hpcc")) ||
	    (err = rnicdv_set_qp_cc(b.qp, "hpcc")))
		die("rnicdv_set_qp_cc", err);
	if (rnicdv_set_qp_cc(a.qp, "tcp") != EINVAL)
		die("an unknown congestion control was accepted", EINVAL);
	/* Authenticated congestion feedback: both QPs hold the same key, so
	 * the ACKs' echoed telemetry carries a MAC rnic0 checks. */
	static const uint8_t key[16] = { 0x72, 0x6e, 0x69, 0x63, 1, 2, 3, 4,
					 5, 6, 7, 8, 9, 10, 11, 12 };
	if ((err = rnicdv_set_qp_feedback_key(a.qp, key)) ||
	    (err = rnicdv_set_qp_feedback_key(b.qp, key)))
		die("rnicdv_set_qp_feedback_key", err);
	struct ibv_mr *ma = buffer(&a, 2 * SIZE, ACCESS);
	struct ibv_mr *mb = buffer(&b, SIZE, ACCESS);
	struct endpoint ea = endpoint_of(&a, ma), eb = endpoint_of(&b, mb);
	connect_qp(&a, &eb, ACCESS);
	connect_qp(&b, &ea, ACCESS);
	if (rnicdv_set_qp_feedback_key(a.qp, key) != EINVAL)
		die("a feedback key was accepted after the QP connected", EINVAL);

	unsigned char *src = ma->addr, *dst = mb->addr;
	for (int i = 0; i < SIZE; i++)
		src[i] = (unsigned char)(i * 7 + 3);
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = SIZE,
			       .lkey = ma->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = eb.va, .rkey = eb.rkey },
	}, *bad;
	if ((err = ibv_post_send(a.qp, &wr, &bad)))
		die("post WRITE", err);
	wait_one(&a, "WRITE");
	/* The WRITE landed in rnic1's own malloc'd buffer, in place. */
	if (memcmp(src, dst, SIZE) != 0) {
		fprintf(stderr, "%s: WRITE: bytes differ\n", me);
		return 1;
	}

	wr.wr_id = 2;
	wr.opcode = IBV_WR_RDMA_READ;
	sge.addr = (uintptr_t)src + SIZE;
	if ((err = ibv_post_send(a.qp, &wr, &bad)))
		die("post READ", err);
	wait_one(&a, "READ");
	if (memcmp(src, src + SIZE, SIZE) != 0) {
		fprintf(stderr, "%s: READ: bytes differ\n", me);
		return 1;
	}

	/* A bad opcode is refused at post, with the WR named. */
	wr.opcode = 99;
	if (ibv_post_send(a.qp, &wr, &bad) != EINVAL || bad != &wr) {
		fprintf(stderr, "%s: opcode 99 was accepted\n", me);
		return 1;
	}
	printf("refused as expected: opcode 99 -> EINVAL\n");

	struct rnicdv_qp_cc cc;
	if ((err = rnicdv_query_qp_cc(a.qp, &cc)))
		die("rnicdv_query_qp_cc", err);
	printf("rnic0 QP %#x: cc %s, window %llu B, rate %.1f Gb/s, %llu packets sent\n",
	       a.qp->qp_num, cc.cc, (unsigned long long)cc.window_bytes,
	       cc.rate_bps / 1e9, (unsigned long long)cc.tx_packets);
	if (strcmp(cc.cc, "hpcc") != 0 || cc.tx_packets == 0) {
		fprintf(stderr, "%s: the QP does not run what it was given\n", me);
		return 1;
	}

	free_buffer(ma);
	free_buffer(mb);
	close_side(&a);
	close_side(&b);
	printf("ok: %d B WRITE rnic0 -> rnic1 and READ back, bytes verified\n", SIZE);
	return 0;
}
