/*
 * sendrecv.c - SEND/RECV ping-pong between two processes through the C
 * API. The parent (rnic1) and a forked child (rnic0) each open their
 * device, post a receive WQE, swap endpoints over pipes and connect. The
 * child SENDs a message with its round number as immediate data; the
 * parent checks bytes, length and immediate, and SENDs it back; the child
 * checks the reply.
 *
 *   dataplane --config configs/loopback.toml --serve &
 *   cc -Itransport/verbs/include transport/verbs/examples/c/sendrecv.c \
 *      -Ltarget/release -lverbs -Wl,-rpath,$PWD/target/release -o sendrecv
 *   ./sendrecv /tmp/rnic/loopback.sock
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rnic_verbs.h"

#define MAX 4096
static const uint32_t sizes[] = {0, 1, 64, 1024, 1025, 4096};
#define ROUNDS (sizeof(sizes) / sizeof(sizes[0]))

static const char *me = "sendrecv";

static void die(const char *what)
{
	fprintf(stderr, "%s: %s: %s\n", me, what, rnic_last_error());
	exit(1);
}

struct side {
	struct rnic_context *ctx;
	struct rnic_pd *pd;
	struct rnic_mr *mr;
	struct rnic_cq *cq;
	struct rnic_qp *qp;
	unsigned char *buf;
};

/* Waits for one completion; it must succeed with this opcode. */
static struct rnic_wc expect(struct side *s, int opcode, const char *what)
{
	struct rnic_wc wc;
	int n;
	while ((n = rnic_poll_cq(s->cq, 1, &wc)) == 0)
		if (rnic_wait_cq(s->cq, 10000) == 0) {
			fprintf(stderr, "%s: %s: no completion in 10 s\n", me, what);
			exit(1);
		}
	if (n < 0)
		die("poll_cq");
	if (wc.status != RNIC_WC_SUCCESS || wc.opcode != opcode) {
		fprintf(stderr, "%s: %s completed with %s, opcode %d\n", me, what,
			rnic_wc_status_str(wc.status), wc.opcode);
		exit(1);
	}
	return wc;
}

/* The receive buffer: the second half of the region. */
static void post_recv(struct side *s, uint64_t id)
{
	struct rnic_recv_wr r = {
		.wr_id = id,
		.lkey = rnic_mr_lkey(s->mr),
		.length = MAX,
		.addr = rnic_mr_va(s->mr) + MAX,
	};
	if (rnic_post_recv(s->qp, &r, 1))
		die("post_recv");
}

static void send_msg(struct side *s, uint32_t len, int with_imm, uint32_t imm, uint64_t id)
{
	struct rnic_send_wr wr = {
		.wr_id = id,
		.opcode = with_imm ? RNIC_WR_SEND_WITH_IMM : RNIC_WR_SEND,
		.signaled = 1,
		.lkey = rnic_mr_lkey(s->mr),
		.length = len,
		.local_addr = rnic_mr_va(s->mr),
		.imm_data = htonl(imm),
	};
	if (rnic_post_send(s->qp, &wr, 1))
		die("post SEND");
}

static unsigned char pattern(uint32_t k, uint32_t round)
{
	return (unsigned char)(k * 7 + round);
}

/* Opens the device, posts the first receive, swaps endpoints, connects. */
static void setup(struct side *s, const char *socket, const char *dev, int wr, int rd)
{
	struct rnic_endpoint mine, peer;
	if (!(s->ctx = rnic_open_device(socket, dev, 0)))
		die(dev);
	if (!(s->pd = rnic_alloc_pd(s->ctx)))
		die("alloc_pd");
	if (!(s->mr = rnic_reg_mr(s->pd, 2 * MAX, RNIC_ACCESS_LOCAL_WRITE)))
		die("reg_mr");
	if (!(s->cq = rnic_create_cq(s->ctx, 64)))
		die("create_cq");
	if (!(s->qp = rnic_create_qp(s->pd, s->cq, 64)))
		die("create_qp");
	s->buf = rnic_mr_addr(s->mr);
	post_recv(s, 0);
	if (rnic_qp_endpoint(s->qp, NULL, &mine))
		die("qp_endpoint");
	if (write(wr, &mine, sizeof mine) != sizeof mine || read(rd, &peer, sizeof peer) != sizeof peer) {
		fprintf(stderr, "%s: endpoint exchange failed\n", me);
		exit(1);
	}
	if (rnic_connect_qp(s->qp, &peer))
		die("connect_qp");
	/* Both connected before the first SEND. */
	char c = 'c';
	if (write(wr, &c, 1) != 1 || read(rd, &c, 1) != 1)
		exit(1);
}

static int client(const char *socket, int wr, int rd)
{
	struct side s;
	uint32_t r, k;
	me = "sendrecv client";
	setup(&s, socket, "rnic0", wr, rd);
	for (r = 0; r < ROUNDS; r++) {
		for (k = 0; k < sizes[r]; k++)
			s.buf[k] = pattern(k, r);
		send_msg(&s, sizes[r], 1, r, r);
		int got_send = 0, got_recv = 0;
		while (!got_send || !got_recv) {
			struct rnic_wc wc;
			int n = rnic_poll_cq(s.cq, 1, &wc);
			if (n < 0)
				die("poll_cq");
			if (n == 0) {
				if (rnic_wait_cq(s.cq, 10000) == 0) {
					fprintf(stderr, "%s: round %u: no completion\n", me, r);
					return 1;
				}
				continue;
			}
			if (wc.status != RNIC_WC_SUCCESS) {
				fprintf(stderr, "%s: round %u: %s\n", me, r, rnic_wc_status_str(wc.status));
				return 1;
			}
			if (wc.opcode == RNIC_WC_RECV) {
				if (wc.byte_len != sizes[r] || (wc.wc_flags & RNIC_WC_WITH_IMM)) {
					fprintf(stderr, "%s: round %u: reply of %u B\n", me, r, wc.byte_len);
					return 1;
				}
				got_recv = 1;
			} else {
				got_send = 1;
			}
		}
		for (k = 0; k < sizes[r]; k++)
			if (s.buf[MAX + k] != pattern(k, r)) {
				fprintf(stderr, "%s: round %u: reply differs at %u\n", me, r, k);
				return 1;
			}
		post_recv(&s, r + 1);
		printf("client: %u B SEND/RECV round trip, bytes and immediate verified\n", sizes[r]);
	}
	return 0;
}

static int server(const char *socket, int wr, int rd)
{
	struct side s;
	uint32_t r, k;
	me = "sendrecv server";
	setup(&s, socket, "rnic1", wr, rd);
	for (r = 0; r < ROUNDS; r++) {
		struct rnic_wc wc = expect(&s, RNIC_WC_RECV, "RECV");
		if (wc.byte_len != sizes[r] || !(wc.wc_flags & RNIC_WC_WITH_IMM) || ntohl(wc.imm_data) != r) {
			fprintf(stderr, "%s: round %u: %u B, imm %u\n", me, r, wc.byte_len, ntohl(wc.imm_data));
			return 1;
		}
		for (k = 0; k < sizes[r]; k++)
			if (s.buf[MAX + k] != pattern(k, r)) {
				fprintf(stderr, "%s: round %u: message differs at %u\n", me, r, k);
				return 1;
			}
		post_recv(&s, r + 1);
		memcpy(s.buf, s.buf + MAX, sizes[r]);
		send_msg(&s, sizes[r], 0, 0, r);
		expect(&s, RNIC_WC_SEND, "SEND");
	}
	printf("server: %zu rounds received with their immediates and sent back\n", ROUNDS);
	return 0;
}

int main(int argc, char **argv)
{
	const char *socket = argc > 1 ? argv[1] : "/tmp/rnic/loopback.sock";
	int to_child[2], to_parent[2], status;
	if (pipe(to_child) || pipe(to_parent))
		return 1;
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		int rc = client(socket, to_parent[1], to_child[0]);
		fflush(stdout);
		_exit(rc);
	}
	int rc = server(socket, to_child[1], to_parent[0]);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "sendrecv: the client failed\n");
		return 1;
	}
	if (rc == 0)
		printf("ok: SEND/RECV ping-pong between two processes\n");
	return rc;
}
