/*
 * solicited.c - a completion channel armed for solicited events only
 * (ibv_req_notify_cq with solicited_only = 1). One process, two devices:
 * rnic0 SENDs to rnic1, whose CQ has a channel. A SEND without
 * IBV_SEND_SOLICITED completes on the receiver without an event; one with
 * it (the Solicited Event bit on its last packet) wakes the waiter; armed
 * for every completion, an unsolicited SEND wakes it too.
 *
 *   cc transport/ibverbs/examples/c/solicited.c -libverbs -o solicited
 *   LD_LIBRARY_PATH=target/release/ibverbs ./solicited
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include "common.h"

static void post_recv(struct side *s, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = 64,
			       .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 },
			   *bad;
	int err = ibv_post_recv(s->qp, &wr, &bad);
	if (err)
		die("ibv_post_recv", err);
}

static void send_imm(struct side *s, struct ibv_mr *mr, uint32_t imm, int flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = 64,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = imm,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED | flags,
		.imm_data = htonl(imm),
	}, *bad;
	int err = ibv_post_send(s->qp, &wr, &bad);
	if (err)
		die("ibv_post_send", err);
	wait_one(s, "SEND");
}

/* Whether the channel has an event now (it is non-blocking). */
static int event_ready(struct ibv_comp_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	return poll(&p, 1, 0) == 1;
}

/* Takes the channel's event (blocking until one comes). */
static void take_event(struct ibv_comp_channel *ch, struct ibv_cq *want)
{
	int flags = fcntl(ch->fd, F_GETFL);
	if (fcntl(ch->fd, F_SETFL, flags & ~O_NONBLOCK))
		die("fcntl", errno);
	struct ibv_cq *cq;
	void *cq_ctx;
	if (ibv_get_cq_event(ch, &cq, &cq_ctx))
		die("ibv_get_cq_event", errno);
	if (cq != want) {
		fprintf(stderr, "%s: an event for another CQ\n", me);
		exit(1);
	}
	ibv_ack_cq_events(cq, 1);
	if (fcntl(ch->fd, F_SETFL, flags))
		die("fcntl", errno);
}

int main(void)
{
	me = "solicited";
	struct side tx, rx;
	open_side(&tx, "rnic0", 8);
	rx.ctx = open_device("rnic1");
	if (!(rx.pd = ibv_alloc_pd(rx.ctx)))
		die("ibv_alloc_pd", errno);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(rx.ctx);
	if (!ch)
		die("ibv_create_comp_channel", errno);
	if (fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK))
		die("fcntl", errno);
	if (!(rx.cq = ibv_create_cq(rx.ctx, 16, NULL, ch, 0)))
		die("ibv_create_cq", errno);
	rx.qp = rc_qp(rx.pd, rx.cq, 8);
	struct ibv_mr *tmr = buffer(&tx, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *rmr = buffer(&rx, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct endpoint et = endpoint_of(&tx, NULL), er = endpoint_of(&rx, NULL);
	connect_qp(&tx, &er, 0);
	connect_qp(&rx, &et, 0);
	for (int i = 0; i < 3; i++)
		post_recv(&rx, rmr, i);

	/* Armed for solicited events: an unsolicited SEND completes quietly. */
	if (ibv_req_notify_cq(rx.cq, 1))
		die("ibv_req_notify_cq", errno);
	send_imm(&tx, tmr, 1, 0);
	struct ibv_wc wc = wait_one(&rx, "RECV 1");
	if (ntohl(wc.imm_data) != 1 || event_ready(ch)) {
		fprintf(stderr, "%s: an event for an unsolicited SEND\n", me);
		exit(1);
	}
	/* The solicited one wakes the waiter; the arming was kept. */
	send_imm(&tx, tmr, 2, IBV_SEND_SOLICITED);
	take_event(ch, rx.cq);
	wc = wait_one(&rx, "RECV 2");
	if (ntohl(wc.imm_data) != 2) {
		fprintf(stderr, "%s: RECV 2 carried %u\n", me, ntohl(wc.imm_data));
		exit(1);
	}
	/* Armed for every completion: an unsolicited SEND wakes it too. */
	if (ibv_req_notify_cq(rx.cq, 0))
		die("ibv_req_notify_cq", errno);
	send_imm(&tx, tmr, 3, 0);
	take_event(ch, rx.cq);
	wait_one(&rx, "RECV 3");
	printf("ok: solicited-only arming woke for the solicited SEND only\n");

	free_buffer(tmr);
	free_buffer(rmr);
	close_side(&tx);
	close_side(&rx);
	if (ibv_destroy_comp_channel(ch))
		die("ibv_destroy_comp_channel", errno);
	return 0;
}
