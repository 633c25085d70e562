/*
 * write_lat_1thread.c - `bench write-lat --loopback` through libibverbs:
 * one thread drives both ends of a 64 B (or argv[1]) WRITE ping-pong
 * between a QP on rnic0 and one on rnic1, exactly as the bench's loopback
 * mode does through the Rust API (signaled WRITE, spin on the buffer's last
 * byte, drain the CQ), so that the two differ only by the library.
 * Prints perftest's latency row: #bytes #iterations t_min t_max t_typical
 * (the median half round trip, us).
 *
 *   cc -O2 -I../../transport/ibverbs/examples/c write_lat_1thread.c -libverbs
 */
#define _GNU_SOURCE
#include <time.h>

#include "common.h"

#define ACCESS                                                                 \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ)

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void drain(struct side *s)
{
	struct ibv_wc wc[16];
	int n = ibv_poll_cq(s->cq, 16, wc);
	for (int i = 0; i < n; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			die(ibv_wc_status_str(wc[i].status), EIO);
}

static void post(struct side *s, struct ibv_mr *mr, uint32_t size,
		 const struct endpoint *peer)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = size,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = peer->va + size, .rkey = peer->rkey },
	}, *bad;
	int err = ibv_post_send(s->qp, &wr, &bad);
	if (err)
		die("ibv_post_send", err);
}

static void spin(struct side *s, volatile uint8_t *at, uint8_t want)
{
	for (uint32_t k = 1; *at != want; k++)
		if (k % 1024 == 0)
			drain(s);
	drain(s);
}

int main(int argc, char **argv)
{
	me = "write_lat_1thread";
	uint32_t size = argc > 1 ? (uint32_t)atoi(argv[1]) : 64;
	int iters = argc > 2 ? atoi(argv[2]) : 1000;
	if (size == 0 || size > 65536 || iters < 1)
		die("usage: write_lat_1thread [SIZE 1..65536] [ITERS]", EINVAL);
	struct side c, s;
	open_side(&c, "rnic0", 64);
	open_side(&s, "rnic1", 64);
	/* First half: what a side sends; second half: where the peer writes. */
	struct ibv_mr *mc = buffer(&c, 2 * size, ACCESS);
	struct ibv_mr *ms = buffer(&s, 2 * size, ACCESS);
	struct endpoint ec = endpoint_of(&c, mc), es = endpoint_of(&s, ms);
	connect_qp(&c, &es, ACCESS);
	connect_qp(&s, &ec, ACCESS);
	uint8_t *bc = mc->addr, *bs = ms->addr;
	uint64_t *lat = calloc((size_t)iters, sizeof(uint64_t));
	if (!lat)
		die("calloc", ENOMEM);
	for (int i = 0; i < iters; i++) {
		uint8_t marker = (uint8_t)(i % 255 + 1);
		uint64_t t0 = now_ns();
		bc[size - 1] = marker;
		post(&c, mc, size, &es);
		spin(&s, bs + 2 * size - 1, marker);
		bs[size - 1] = marker;
		post(&s, ms, size, &ec);
		spin(&c, bc + 2 * size - 1, marker);
		lat[i] = (now_ns() - t0) / 2;
	}
	qsort(lat, (size_t)iters, sizeof(uint64_t), cmp);
	printf(" %u %d %.2f %.2f %.2f\n", size, iters, lat[0] / 1e3,
	       lat[iters - 1] / 1e3, lat[iters / 2] / 1e3);
	return 0;
}
