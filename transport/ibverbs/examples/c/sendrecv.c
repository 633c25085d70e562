/*
 * sendrecv.c - SEND/RECV ping-pong between two processes over verbs. The
 * parent (rnic1) and a forked child (rnic0) each open their device, swap
 * endpoints over pipes, connect and post a receive WR. The child SENDs a
 * message with its round number as immediate data; the parent checks
 * bytes, length and immediate, and SENDs it back; the child checks the
 * reply. The parent waits on a completion channel, the child polls.
 *
 *   cc transport/ibverbs/examples/c/sendrecv.c -libverbs -o sendrecv
 *   LD_LIBRARY_PATH=target/release/ibverbs ./sendrecv
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define MAX 4096
static const uint32_t sizes[] = { 0, 1, 64, 1024, 1025, 4096 };
#define ROUNDS (sizeof(sizes) / sizeof(sizes[0]))

static void swap_endpoints(int wr, int rd, const struct endpoint *mine,
			   struct endpoint *peer)
{
	if (write(wr, mine, sizeof(*mine)) != (ssize_t)sizeof(*mine) ||
	    read(rd, peer, sizeof(*peer)) != (ssize_t)sizeof(*peer))
		die("endpoint exchange", errno);
}

static void post_recv(struct side *s, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = MAX,
			       .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 },
			   *bad;
	int err = ibv_post_recv(s->qp, &wr, &bad);
	if (err)
		die("ibv_post_recv", err);
}

static void post_send(struct side *s, struct ibv_mr *mr, uint32_t len,
		      uint32_t imm)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr, .length = len,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = imm,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(imm),
	}, *bad;
	int err = ibv_post_send(s->qp, &wr, &bad);
	if (err)
		die("ibv_post_send", err);
}

/* Completions until the receive one, which must carry `len` and `imm`. */
static void expect_recv(struct side *s, struct ibv_comp_channel *ch,
			uint32_t len, uint32_t imm)
{
	for (;;) {
		struct ibv_wc wc;
		if (ch) {
			/* Sleep until the CQ has something. */
			struct ibv_cq *cq;
			void *cq_ctx;
			int n = ibv_poll_cq(s->cq, 1, &wc);
			if (n == 0) {
				if (ibv_get_cq_event(ch, &cq, &cq_ctx))
					die("ibv_get_cq_event", errno);
				ibv_ack_cq_events(cq, 1);
				if (ibv_req_notify_cq(cq, 0))
					die("ibv_req_notify_cq", errno);
				continue;
			}
			if (n < 0)
				die("ibv_poll_cq", EIO);
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "%s: %s\n", me,
					ibv_wc_status_str(wc.status));
				exit(1);
			}
		} else {
			wc = wait_one(s, "ping-pong");
		}
		if (wc.opcode != IBV_WC_RECV)
			continue;
		if (wc.byte_len != len || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
		    ntohl(wc.imm_data) != imm) {
			fprintf(stderr, "%s: round %u: %u bytes, imm %u\n", me,
				imm, wc.byte_len, ntohl(wc.imm_data));
			exit(1);
		}
		return;
	}
}

static void fill(unsigned char *p, uint32_t len, uint32_t round)
{
	for (uint32_t i = 0; i < len; i++)
		p[i] = (unsigned char)(i * 13 + round);
}

static int check(const unsigned char *p, uint32_t len, uint32_t round)
{
	for (uint32_t i = 0; i < len; i++)
		if (p[i] != (unsigned char)(i * 13 + round))
			return 0;
	return 1;
}

int main(void)
{
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die("pipe", errno);
	pid_t pid = fork();
	if (pid < 0)
		die("fork", errno);
	int child = pid == 0;
	me = child ? "sendrecv client" : "sendrecv server";
	struct side s;
	open_side(&s, child ? "rnic0" : "rnic1", 16);
	struct ibv_comp_channel *ch = NULL;
	if (!child) {
		/* The server sleeps on its CQ's completion channel. */
		if (!(ch = ibv_create_comp_channel(s.ctx)))
			die("ibv_create_comp_channel", errno);
		ibv_destroy_qp(s.qp);
		ibv_destroy_cq(s.cq);
		if (!(s.cq = ibv_create_cq(s.ctx, 32, NULL, ch, 0)))
			die("ibv_create_cq", errno);
		s.qp = rc_qp(s.pd, s.cq, 16);
		if (ibv_req_notify_cq(s.cq, 0))
			die("ibv_req_notify_cq", errno);
	}
	struct ibv_mr *rx = buffer(&s, MAX, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *tx = buffer(&s, MAX, IBV_ACCESS_LOCAL_WRITE);
	struct endpoint mine = endpoint_of(&s, NULL), peer;
	if (child)
		swap_endpoints(up[1], down[0], &mine, &peer);
	else
		swap_endpoints(down[1], up[0], &mine, &peer);
	connect_qp(&s, &peer, 0);
	/* Receives are posted once the QP is out of RESET, and both sides
	 * have one before the first SEND. */
	post_recv(&s, rx, 0);
	char go = 1;
	if (child ? read(down[0], &go, 1) != 1 : write(down[1], &go, 1) != 1)
		die("sync", errno);

	for (uint32_t r = 0; r < ROUNDS; r++) {
		uint32_t len = sizes[r];
		if (child) {
			fill(tx->addr, len, r);
			post_send(&s, tx, len, r);
			expect_recv(&s, NULL, len, r);
			if (!check(rx->addr, len, r)) {
				fprintf(stderr, "%s: reply %u: bytes differ\n", me, r);
				exit(1);
			}
			post_recv(&s, rx, r + 1);
			printf("client: %u B SEND/RECV round trip, imm %u\n", len, r);
		} else {
			expect_recv(&s, ch, len, r);
			if (!check(rx->addr, len, r)) {
				fprintf(stderr, "%s: round %u: bytes differ\n", me, r);
				exit(1);
			}
			memcpy(tx->addr, rx->addr, len);
			post_recv(&s, rx, r + 1);
			post_send(&s, tx, len, r);
		}
	}
	/* Whatever completions are left. */
	struct ibv_wc wc;
	while (ibv_poll_cq(s.cq, 1, &wc) > 0)
		;
	fflush(stdout);
	if (child) {
		free_buffer(rx);
		free_buffer(tx);
		close_side(&s);
		return 0;
	}
	int status;
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0) {
		fprintf(stderr, "%s: the client failed\n", me);
		return 1;
	}
	free_buffer(rx);
	free_buffer(tx);
	if (ibv_destroy_qp(s.qp) || ibv_destroy_cq(s.cq) ||
	    ibv_destroy_comp_channel(ch) || ibv_dealloc_pd(s.pd) ||
	    ibv_close_device(s.ctx))
		die("teardown", errno);
	printf("ok: SEND/RECV ping-pong between two processes, %zu sizes 0..%d B\n",
	       ROUNDS, MAX);
	return 0;
}
