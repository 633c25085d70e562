/*
 * rc_verify.c - an RC data check that reads every byte, between two
 * processes on any two verbs devices (ours over our libibverbs, rxe over
 * rdma-core's): rdma-core's pingpong examples check one byte per page on
 * the server only, and perftest checks none.
 *
 * Each iteration i of N, with the QPs connected over TCP as perftest does:
 *   1. the client SENDs S bytes of pattern (i, SEND) into the server's
 *      receive WQE; the server checks the length and every byte;
 *   2. the server RDMA WRITEs S bytes of pattern (i, WRITE) with immediate
 *      i into the client's buffer; the client checks the immediate, the
 *      length and every byte;
 *   3. the server fills its buffer with pattern (i, READ); the client
 *      RDMA READs it and checks every byte;
 *   4. the client FETCH_ADDs i + 1 to the server's counter and checks the
 *      value it fetched (the sum of the earlier adds).
 * At the end the server checks its counter, both sides close over TCP
 * (no side destroys its QP while the other still waits for an ACK) and
 * print one line:
 *   rc_verify: N iterations of S B (SEND, WRITE_WITH_IMM, READ, FETCH_ADD): every byte checked
 * A wrong byte prints
 *   rc_verify: mismatch at byte J of iteration I (OP): got 0xXX, want 0xYY
 * and exits 1; so does a failed completion or none within 60 s.
 *
 *   rc_verify [-d DEVICE] [-g GID_INDEX] [-p PORT] [-s SIZE] [-n ITERS]
 *             [-m MTU] [SERVER]
 *
 *   cc -O2 -Wall -Werror bench/scripts/rc_verify.c -libverbs -o rc_verify
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ACCESS                                                                 \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |                    \
	 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
#define COMPLETION_LIMIT_S 60

enum op { OP_SEND = 1, OP_WRITE, OP_READ };
static const char *op_name[] = { "", "SEND", "WRITE_WITH_IMM", "READ" };

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("rc_verify: ", stdout);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	exit(1);
}

static void usage(void)
{
	printf("usage: rc_verify [-d DEVICE] [-g GID_INDEX] [-p PORT] [-s SIZE] "
	       "[-n ITERS] [-m MTU] [SERVER]\n"
	       "  -d  the verbs device (default: the first)\n"
	       "  -g  the local GID index (default 1, RoCE v2 over IPv4)\n"
	       "  -p  the TCP port of the QP exchange (default 18515)\n"
	       "  -s  bytes per message, 1 .. 1 GiB (default 4096)\n"
	       "  -n  iterations (default 10)\n"
	       "  -m  path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)\n"
	       "  SERVER  run as the client of the server at this address\n");
}

/* Byte j of the message of iteration i and operation op: a hash of all
 * three, so that a byte from another message, operation or offset
 * (a misplaced packet) is caught. */
static uint8_t pattern(uint32_t i, enum op op, size_t j)
{
	uint32_t x = (uint32_t)j * 2654435761u ^ (i * 40503u + (uint32_t)op * 977u + 1u);
	x ^= x >> 15;
	x *= 0x2c1b3c6du;
	x ^= x >> 12;
	return (uint8_t)x;
}

/* Built with -DRC_VERIFY_WRONG_BYTE=X, the sender XORs the middle byte of
 * every message with X: the test that shows a wrong byte is caught. */
#ifndef RC_VERIFY_WRONG_BYTE
#define RC_VERIFY_WRONG_BYTE 0
#endif

static void fill(uint8_t *b, size_t n, uint32_t i, enum op op)
{
	for (size_t j = 0; j < n; j++)
		b[j] = pattern(i, op, j);
	b[n / 2] ^= RC_VERIFY_WRONG_BYTE;
}

static void check(const uint8_t *b, size_t n, uint32_t i, enum op op)
{
	for (size_t j = 0; j < n; j++)
		if (b[j] != pattern(i, op, j))
			fail("mismatch at byte %zu of iteration %u (%s): got 0x%02x, want 0x%02x",
			     j, i, op_name[op], b[j], pattern(i, op, j));
}

/* What a peer needs to reach this side. */
struct dest {
	uint32_t qpn, psn, rkey;
	uint64_t addr;
	union ibv_gid gid;
};

struct ctx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	/* Sends and receives complete on CQs of their own: a receive may
	 * complete before the ACK of an earlier send arrives. */
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	/* One registration: [send | recv | target | read_dst | counter | fetched] */
	uint8_t *buf, *send, *recv, *target, *read_dst;
	uint64_t *counter, *fetched;
	size_t size;
	int sock;
};

/* Writes and reads whole lines on the TCP socket. */
static void say(struct ctx *c, const char *msg)
{
	size_t n = strlen(msg);
	if (write(c->sock, msg, n) != (ssize_t)n)
		fail("TCP write failed: %s", strerror(errno));
}

static void hear(struct ctx *c, const char *want)
{
	char got[128];
	size_t n = strlen(want), k = 0;
	while (k < n) {
		ssize_t r = read(c->sock, got + k, n - k);
		if (r <= 0)
			fail("TCP read failed while waiting for \"%.*s\"", (int)n - 1, want);
		k += (size_t)r;
	}
	if (memcmp(got, want, n) != 0)
		fail("the peer said \"%.*s\", not \"%.*s\"", (int)n - 1, got, (int)n - 1, want);
}

static void exchange(struct ctx *c, const struct dest *mine, struct dest *theirs)
{
	char msg[128], gid[33];
	for (int k = 0; k < 16; k++)
		sprintf(gid + 2 * k, "%02x", mine->gid.raw[k]);
	int n = snprintf(msg, sizeof msg, "%06x:%06x:%08x:%016llx:%s\n", mine->qpn, mine->psn,
			 mine->rkey, (unsigned long long)mine->addr, gid);
	if (write(c->sock, msg, (size_t)n) != n)
		fail("TCP write failed: %s", strerror(errno));
	int k = 0;
	while (k < n) {
		ssize_t r = read(c->sock, msg + k, (size_t)(n - k));
		if (r <= 0)
			fail("TCP read of the peer's address failed");
		k += (int)r;
	}
	unsigned long long addr;
	if (sscanf(msg, "%x:%x:%x:%llx:%32s", &theirs->qpn, &theirs->psn, &theirs->rkey, &addr,
		   gid) != 5)
		fail("the peer's address is unreadable: %.*s", n, msg);
	theirs->addr = addr;
	for (int b = 0; b < 16; b++) {
		unsigned v;
		sscanf(gid + 2 * b, "%2x", &v);
		theirs->gid.raw[b] = (uint8_t)v;
	}
}

static int connect_tcp(const char *server, int port)
{
	char p[16];
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	snprintf(p, sizeof p, "%d", port);
	if (getaddrinfo(server, p, &hints, &res))
		fail("cannot resolve %s", server);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, res->ai_addr, res->ai_addrlen))
		fail("Couldn't connect to %s:%d", server, port);
	freeaddrinfo(res);
	return s;
}

static int accept_tcp(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
		fail("Couldn't listen to port %d", port);
	int s = accept(l, NULL, NULL);
	if (s < 0)
		fail("accept() failed");
	close(l);
	return s;
}

/* Waits for one completion of `want` opcode (success, or exit). */
static struct ibv_wc await(struct ibv_cq *cq, enum ibv_wc_opcode want, const char *what)
{
	struct ibv_wc wc;
	time_t until = time(NULL) + COMPLETION_LIMIT_S;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("poll CQ failed %d", n);
		if (n == 1)
			break;
		if (time(NULL) > until)
			fail("no completion of the %s within %d s", what, COMPLETION_LIMIT_S);
	}
	if (wc.status != IBV_WC_SUCCESS)
		fail("Failed status %s (%d) of the %s", ibv_wc_status_str(wc.status), wc.status, what);
	if (wc.opcode != want)
		fail("the %s completed as opcode %d, not %d", what, wc.opcode, want);
	return wc;
}

static void post_recv(struct ctx *c, uint8_t *at)
{
	struct ibv_sge sge = { (uintptr_t)at, (uint32_t)c->size, c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->qp, &wr, &bad))
		fail("Couldn't post receive");
}

static void post_send(struct ctx *c, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad;
	wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(c->qp, wr, &bad))
		fail("Couldn't post the %s", what);
}

static enum ibv_mtu mtu_of(int m)
{
	switch (m) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	fail("Invalid MTU %d (256, 512, 1024, 2048 or 4096)", m);
	return IBV_MTU_1024;
}

static void connect_qp(struct ctx *c, const struct dest *me, const struct dest *peer, int gidx,
		       enum ibv_mtu mtu)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = ACCESS };
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS))
		fail("Failed to modify QP to INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = peer->psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = (uint8_t)gidx;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("Failed to modify QP to RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = me->psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					    IBV_QP_MAX_QP_RD_ATOMIC))
		fail("Failed to modify QP to RTS");
}

static void open_ctx(struct ctx *c, const char *dev, size_t size)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n), *d = NULL;
	if (!list || n == 0)
		fail("Failed to get IB devices list (no device)");
	for (int k = 0; k < n && !d; k++)
		if (!dev || !strcmp(ibv_get_device_name(list[k]), dev))
			d = list[k];
	if (!d)
		fail("Couldn't find device %s", dev);
	if (!(c->ctx = ibv_open_device(d)))
		fail("Couldn't get context for %s", ibv_get_device_name(d));
	ibv_free_device_list(list);
	c->size = size;
	/* The two 8-byte words after the four buffers, 8-byte aligned. */
	size_t whole = 4 * size + 24;
	if (posix_memalign((void **)&c->buf, 4096, whole))
		fail("Couldn't allocate %zu B", whole);
	memset(c->buf, 0, whole);
	c->send = c->buf;
	c->recv = c->buf + size;
	c->target = c->buf + 2 * size;
	c->read_dst = c->buf + 3 * size;
	/* 8-byte aligned: size may be odd. */
	uintptr_t at = ((uintptr_t)(c->buf + 4 * size) + 7) & ~(uintptr_t)7;
	c->counter = (uint64_t *)at;
	c->fetched = c->counter + 1;
	if (!(c->pd = ibv_alloc_pd(c->ctx)))
		fail("Couldn't allocate PD");
	if (!(c->mr = ibv_reg_mr(c->pd, c->buf, whole, ACCESS)))
		fail("Couldn't register MR");
	if (!(c->scq = ibv_create_cq(c->ctx, 8, NULL, NULL, 0)) ||
	    !(c->rcq = ibv_create_cq(c->ctx, 8, NULL, NULL, 0)))
		fail("Couldn't create CQ");
	struct ibv_qp_init_attr qa = {
		.send_cq = c->scq, .recv_cq = c->rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	if (!(c->qp = ibv_create_qp(c->pd, &qa)))
		fail("Couldn't create QP");
}

int main(int argc, char **argv)
{
	const char *dev = NULL, *server = NULL;
	int gidx = 1, port = 18515, mtu = 1024, opt;
	long long size = 4096, iters = 10;
	while ((opt = getopt(argc, argv, "d:g:p:s:n:m:h")) != -1) {
		switch (opt) {
		case 'd': dev = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 's': size = atoll(optarg); break;
		case 'n': iters = atoll(optarg); break;
		case 'm': mtu = atoi(optarg); break;
		case 'h': usage(); return 0;
		default: usage(); return 2;
		}
	}
	if (optind < argc)
		server = argv[optind];
	if (size < 1 || size > (1ll << 30))
		fail("Invalid size %lld (1 .. 1073741824)", size);
	if (iters < 1 || iters > 1000000)
		fail("Invalid iteration count %lld (1 .. 1000000)", iters);
	if (gidx < 0 || gidx > 255)
		fail("Invalid GID index %d", gidx);
	enum ibv_mtu path_mtu = mtu_of(mtu);
	srand48(getpid() * time(NULL));

	struct ctx c = { 0 };
	open_ctx(&c, dev, (size_t)size);
	struct dest me = { .qpn = c.qp->qp_num, .psn = (uint32_t)lrand48() & 0xffffff,
			   .rkey = c.mr->rkey, .addr = (uintptr_t)c.buf }, peer;
	if (ibv_query_gid(c.ctx, 1, gidx, &me.gid))
		fail("Couldn't read GID index %d", gidx);
	c.sock = server ? connect_tcp(server, port) : accept_tcp(port);
	exchange(&c, &me, &peer);
	connect_qp(&c, &me, &peer, gidx, path_mtu);
	/* The peer's regions, at the same offsets as ours. */
	uint64_t p_target = peer.addr + 2 * c.size, p_counter = peer.addr + ((uint8_t *)c.counter - c.buf);

	uint64_t sum = 0;
	for (uint32_t i = 0; i < (uint32_t)iters; i++) {
		/* 1. SEND, client to server. */
		post_recv(&c, c.recv);
		if (server) {
			hear(&c, "ready\n");
			fill(c.send, c.size, i, OP_SEND);
			struct ibv_sge sge = { (uintptr_t)c.send, (uint32_t)c.size, c.mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
						  .opcode = IBV_WR_SEND };
			post_send(&c, &wr, "SEND");
			await(c.scq, IBV_WC_SEND, "SEND");
			/* 2. the server's WRITE with immediate lands in our
			 * target and consumes the receive WQE posted above. */
			struct ibv_wc wc = await(c.rcq, IBV_WC_RECV_RDMA_WITH_IMM, "WRITE_WITH_IMM");
			if (!(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != i)
				fail("mismatch: the WRITE_WITH_IMM of iteration %u carried immediate %u", i,
				     ntohl(wc.imm_data));
			if (wc.byte_len != c.size)
				fail("mismatch: the WRITE_WITH_IMM of iteration %u wrote %u B, not %zu", i,
				     wc.byte_len, c.size);
			check(c.target, c.size, i, OP_WRITE);
			/* 3. READ the server's target. */
			hear(&c, "readable\n");
			memset(c.read_dst, 0, c.size);
			sge = (struct ibv_sge){ (uintptr_t)c.read_dst, (uint32_t)c.size, c.mr->lkey };
			wr = (struct ibv_send_wr){ .wr_id = 3, .sg_list = &sge, .num_sge = 1,
						   .opcode = IBV_WR_RDMA_READ };
			wr.wr.rdma.remote_addr = p_target;
			wr.wr.rdma.rkey = peer.rkey;
			post_send(&c, &wr, "READ");
			await(c.scq, IBV_WC_RDMA_READ, "READ");
			check(c.read_dst, c.size, i, OP_READ);
			/* 4. FETCH_ADD i + 1 to the server's counter. */
			*c.fetched = ~0ull;
			sge = (struct ibv_sge){ (uintptr_t)c.fetched, 8, c.mr->lkey };
			wr = (struct ibv_send_wr){ .wr_id = 4, .sg_list = &sge, .num_sge = 1,
						   .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD };
			wr.wr.atomic.remote_addr = p_counter;
			wr.wr.atomic.rkey = peer.rkey;
			wr.wr.atomic.compare_add = i + 1;
			post_send(&c, &wr, "FETCH_ADD");
			await(c.scq, IBV_WC_FETCH_ADD, "FETCH_ADD");
			if (*c.fetched != sum)
				fail("mismatch: FETCH_ADD of iteration %u fetched %llu, want %llu", i,
				     (unsigned long long)*c.fetched, (unsigned long long)sum);
			sum += i + 1;
			say(&c, "next\n");
		} else {
			say(&c, "ready\n");
			struct ibv_wc wc = await(c.rcq, IBV_WC_RECV, "SEND");
			if (wc.byte_len != c.size)
				fail("mismatch: the SEND of iteration %u carried %u B, not %zu", i,
				     wc.byte_len, c.size);
			check(c.recv, c.size, i, OP_SEND);
			fill(c.send, c.size, i, OP_WRITE);
			struct ibv_sge sge = { (uintptr_t)c.send, (uint32_t)c.size, c.mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
						  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
						  .imm_data = htonl(i) };
			wr.wr.rdma.remote_addr = p_target;
			wr.wr.rdma.rkey = peer.rkey;
			post_send(&c, &wr, "WRITE_WITH_IMM");
			await(c.scq, IBV_WC_RDMA_WRITE, "WRITE_WITH_IMM");
			fill(c.target, c.size, i, OP_READ);
			say(&c, "readable\n");
			hear(&c, "next\n");
			sum += i + 1;
		}
	}
	if (!server && *c.counter != sum)
		fail("mismatch: the counter is %llu after the FETCH_ADDs, want %llu",
		     (unsigned long long)*c.counter, (unsigned long long)sum);
	/* Both done before either tears its QP down. */
	say(&c, "done\n");
	hear(&c, "done\n");
	close(c.sock);
	if (ibv_destroy_qp(c.qp) || ibv_destroy_cq(c.scq) || ibv_destroy_cq(c.rcq) ||
	    ibv_dereg_mr(c.mr) ||
	    ibv_dealloc_pd(c.pd) || ibv_close_device(c.ctx))
		fail("Couldn't tear down the verbs objects");
	free(c.buf);
	printf("rc_verify: %lld iterations of %lld B (SEND, WRITE_WITH_IMM, READ, FETCH_ADD): "
	       "every byte checked\n",
	       iters, size);
	return 0;
}
