/*
 * Error paths of a verbs application, written against <infiniband/verbs.h>
 * and linked with -libverbs only: whatever libibverbs.so.1 the loader finds
 * serves it (the test puts the rnic one first on LD_LIBRARY_PATH).
 *
 *   verbs_errors errors   every error path below, then exit 0
 *   verbs_errors fatal    connect, say "ready", wait for the daemon to be
 *                         killed: the device must report IBV_EVENT_DEVICE_FATAL
 *                         and every later call must fail, never hang
 *
 * Two contexts (rnic0 and rnic1) of one process, one RC QP each, connected
 * through GID index 1 (RoCE v2, IPv4-mapped). Each case checks a verbs
 * return value, a completion status or an asynchronous event, and prints
 * "ok: ..." or exits 1 naming what it got.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN 4096

static void die(const char *what, int err)
{
	fprintf(stderr, "FAIL: %s (%d: %s)\n", what, err, strerror(err));
	exit(1);
}

#define CHECK(cond, what)                                                      \
	do {                                                                   \
		if (!(cond))                                                   \
			die(what, errno);                                      \
	} while (0)

#define EXPECT(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL: " __VA_ARGS__);                 \
			fprintf(stderr, "\n");                                 \
			exit(1);                                               \
		}                                                              \
	} while (0)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static struct ibv_context *open_dev(const char *name)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list, "ibv_get_device_list");
	for (int i = 0; i < n; i++) {
		if (!strcmp(ibv_get_device_name(list[i]), name)) {
			struct ibv_context *c = ibv_open_device(list[i]);
			CHECK(c, "ibv_open_device");
			ibv_free_device_list(list);
			return c;
		}
	}
	die("no such device", ENODEV);
	return NULL;
}

static void setup(struct side *s, const char *dev)
{
	s->ctx = open_dev(dev);
	CHECK(s->pd = ibv_alloc_pd(s->ctx), "ibv_alloc_pd");
	CHECK(s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0), "ibv_create_cq");
	CHECK(!posix_memalign((void **)&s->buf, 4096, 4 * LEN), "posix_memalign");
	memset(s->buf, 0, 4 * LEN);
	s->mr = ibv_reg_mr(s->pd, s->buf, 4 * LEN,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr, "ibv_reg_mr");
	CHECK(!ibv_query_gid(s->ctx, 1, 1, &s->gid), "ibv_query_gid");
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	CHECK(s->qp = ibv_create_qp(s->pd, &ia), "ibv_create_qp");
}

static int to_init(struct side *s, int mask_off)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		   IBV_QP_ACCESS_FLAGS;
	return ibv_modify_qp(s->qp, &a, mask & ~mask_off);
}

static int to_rtr(struct side *s, struct side *peer, int mask_off)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qp->qp_num,
		.rq_psn = 0,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = 1,
				      .hop_limit = 64 },
			     .port_num = 1 },
	};
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
		   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	return ibv_modify_qp(s->qp, &a, mask & ~mask_off);
}

static int to_rts(struct side *s)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 10,
		.retry_cnt = 3,
		.rnr_retry = 3,
		.sq_psn = 0,
		.max_rd_atomic = 1,
	};
	return ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int reset(struct side *s)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE);
}

static enum ibv_qp_state state_of(struct side *s)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(!ibv_query_qp(s->qp, &a, IBV_QP_STATE, &ia), "ibv_query_qp");
	return a.qp_state;
}

/* Both QPs from whatever state back to RTS, through RESET. */
static void connect_pair(struct side *a, struct side *b)
{
	struct side *s[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		CHECK(!reset(s[i]), "modify to RESET");
		EXPECT(state_of(s[i]) == IBV_QPS_RESET, "QP not in RESET");
		CHECK(!to_init(s[i], 0), "modify to INIT");
	}
	for (int i = 0; i < 2; i++)
		CHECK(!to_rtr(s[i], s[1 - i], 0), "modify to RTR");
	for (int i = 0; i < 2; i++)
		CHECK(!to_rts(s[i]), "modify to RTS");
}

static int post_write(struct side *s, uint32_t lkey, uint64_t raddr,
		      uint32_t rkey, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = 64,
			       .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad = NULL;
	int rc = ibv_post_send(s->qp, &wr, &bad);
	if (rc && bad != &wr)
		die("a refused post_send must name the WR in bad_wr", EINVAL);
	return rc;
}

/* The next completion of `s`, polling. */
static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	for (long i = 0;; i++) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		EXPECT(n >= 0, "ibv_poll_cq returned %d", n);
		if (n == 1)
			return wc;
		if (i % 1024 == 1023)
			usleep(10);
	}
}

/* The next asynchronous event of `ctx` within 20 s. */
static struct ibv_async_event wait_event(struct ibv_context *ctx)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	int n = poll(&p, 1, 20000);
	EXPECT(n == 1, "no asynchronous event within 20 s");
	struct ibv_async_event ev;
	CHECK(!ibv_get_async_event(ctx, &ev), "ibv_get_async_event");
	ibv_ack_async_event(&ev);
	return ev;
}

static void expect_status(struct side *s, enum ibv_wc_status want,
			  const char *what)
{
	struct ibv_wc wc = wait_wc(s);
	EXPECT(wc.status == want, "%s: status %s, expected %s", what,
	       ibv_wc_status_str(wc.status), ibv_wc_status_str(want));
	printf("ok: %s -> %s\n", what, ibv_wc_status_str(wc.status));
}

static void errors(struct side *a, struct side *b)
{
	uint64_t rbuf = (uintptr_t)b->buf;

	/* A WR on a QP in RESET is refused at once. */
	int rc = post_write(a, a->mr->lkey, rbuf, b->mr->rkey, 1);
	EXPECT(rc == EINVAL, "post_send in RESET returned %d", rc);
	printf("ok: post_send on a QP in RESET -> EINVAL, bad_wr set\n");

	/* Modify with a wrong mask: a required attribute missing, an
	 * attribute the transition does not allow. */
	rc = to_init(a, IBV_QP_PORT);
	EXPECT(rc == EINVAL, "RESET->INIT without IBV_QP_PORT returned %d", rc);
	struct ibv_qp_attr bad = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				   .sq_psn = 1 };
	rc = ibv_modify_qp(a->qp, &bad,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS | IBV_QP_SQ_PSN);
	EXPECT(rc == EINVAL, "RESET->INIT with IBV_QP_SQ_PSN returned %d", rc);
	CHECK(!to_init(a, 0), "modify to INIT");
	rc = to_rtr(a, b, IBV_QP_DEST_QPN);
	EXPECT(rc == EINVAL, "INIT->RTR without IBV_QP_DEST_QPN returned %d",
	       rc);
	struct ibv_qp_attr jump = { .qp_state = IBV_QPS_RTS };
	rc = ibv_modify_qp(a->qp, &jump, IBV_QP_STATE);
	EXPECT(rc == EINVAL, "INIT->RTS returned %d", rc);
	EXPECT(state_of(a) == IBV_QPS_INIT, "a refused modify moved the QP");
	printf("ok: modify with a missing or extra attribute, or to a state "
	       "out of reach -> EINVAL, QP unchanged\n");

	/* A good WRITE lands in the peer's own buffer. */
	connect_pair(a, b);
	memset(a->buf, 0x5a, 64);
	CHECK(!post_write(a, a->mr->lkey, rbuf, b->mr->rkey, 2), "post_send");
	expect_status(a, IBV_WC_SUCCESS, "WRITE with good keys");
	EXPECT(b->buf[0] == 0x5a && b->buf[63] == 0x5a,
	       "the WRITE did not land in the peer's buffer");

	/* Bad lkey: a local protection error, the QP goes to ERR. */
	CHECK(!post_write(a, a->mr->lkey ^ 0x1234, rbuf, b->mr->rkey, 3),
	      "post_send");
	expect_status(a, IBV_WC_LOC_PROT_ERR, "WRITE with a bad lkey");
	EXPECT(state_of(a) == IBV_QPS_ERR, "bad lkey: QP not in ERR");

	/* Bad rkey: the peer refuses (REM_ACCESS_ERR) and its QP reports
	 * the access error as an asynchronous event. */
	connect_pair(a, b);
	CHECK(!post_write(a, a->mr->lkey, rbuf, b->mr->rkey ^ 0x1234, 4),
	      "post_send");
	expect_status(a, IBV_WC_REM_ACCESS_ERR, "WRITE with a bad rkey");
	struct ibv_async_event ev = wait_event(b->ctx);
	EXPECT(ev.event_type == IBV_EVENT_QP_ACCESS_ERR &&
		       ev.element.qp == b->qp,
	       "responder event %s", ibv_event_type_str(ev.event_type));
	printf("ok: responder QP -> %s\n", ibv_event_type_str(ev.event_type));

	/* A region registered without REMOTE_WRITE. */
	char *ro = aligned_alloc(4096, LEN);
	CHECK(ro, "aligned_alloc");
	struct ibv_mr *ro_mr = ibv_reg_mr(b->pd, ro, LEN,
					  IBV_ACCESS_LOCAL_WRITE |
						  IBV_ACCESS_REMOTE_READ);
	CHECK(ro_mr, "ibv_reg_mr without REMOTE_WRITE");
	connect_pair(a, b);
	CHECK(!post_write(a, a->mr->lkey, (uintptr_t)ro, ro_mr->rkey, 5),
	      "post_send");
	expect_status(a, IBV_WC_REM_ACCESS_ERR,
		      "WRITE to a region without REMOTE_WRITE");
	(void)wait_event(b->ctx);

	/* REMOTE_WRITE without LOCAL_WRITE is refused by ibv_reg_mr. */
	errno = 0;
	struct ibv_mr *no = ibv_reg_mr(b->pd, ro, LEN, IBV_ACCESS_REMOTE_WRITE);
	EXPECT(!no && errno == EINVAL,
	       "REMOTE_WRITE without LOCAL_WRITE: mr %p errno %d", (void *)no,
	       errno);
	printf("ok: ibv_reg_mr(REMOTE_WRITE without LOCAL_WRITE) -> EINVAL\n");

	/* Destroyed MRs: the peer's rkey and our own lkey stop working. */
	uint32_t dead_rkey = ro_mr->rkey;
	CHECK(!ibv_dereg_mr(ro_mr), "ibv_dereg_mr");
	connect_pair(a, b);
	CHECK(!post_write(a, a->mr->lkey, (uintptr_t)ro, dead_rkey, 6),
	      "post_send");
	expect_status(a, IBV_WC_REM_ACCESS_ERR,
		      "WRITE with the rkey of a deregistered MR");
	(void)wait_event(b->ctx);
	char *mine = aligned_alloc(4096, LEN);
	CHECK(mine, "aligned_alloc");
	struct ibv_mr *m = ibv_reg_mr(a->pd, mine, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m, "ibv_reg_mr");
	uint32_t dead_lkey = m->lkey;
	CHECK(!ibv_dereg_mr(m), "ibv_dereg_mr");
	connect_pair(a, b);
	CHECK(!post_write(a, dead_lkey, rbuf, b->mr->rkey, 7), "post_send");
	expect_status(a, IBV_WC_LOC_PROT_ERR,
		      "WRITE from the lkey of a deregistered MR");

	/* SQD: the send queue drains, the QP says so, posts wait. */
	connect_pair(a, b);
	struct ibv_qp_attr sqd = { .qp_state = IBV_QPS_SQD,
				   .en_sqd_async_notify = 1 };
	CHECK(!ibv_modify_qp(a->qp, &sqd,
			     IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY),
	      "modify to SQD");
	ev = wait_event(a->ctx);
	EXPECT(ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == a->qp,
	       "SQD event %s", ibv_event_type_str(ev.event_type));
	EXPECT(state_of(a) == IBV_QPS_SQD, "QP not in SQD");
	memset(a->buf, 0x77, 64);
	CHECK(!post_write(a, a->mr->lkey, rbuf, b->mr->rkey, 8),
	      "post_send in SQD");
	struct ibv_qp_attr back = { .qp_state = IBV_QPS_RTS };
	CHECK(!ibv_modify_qp(a->qp, &back, IBV_QP_STATE), "SQD -> RTS");
	expect_status(a, IBV_WC_SUCCESS, "WRITE posted in SQD, after SQD->RTS");
	EXPECT(b->buf[0] == 0x77, "the WRITE posted in SQD did not land");
	printf("ok: RTS->SQD drains and says %s; SQD->RTS sends what waited\n",
	       ibv_event_type_str(IBV_EVENT_SQ_DRAINED));

	/* RTS->RTS with new retry settings; RTR->RTR does not exist. */
	struct ibv_qp_attr rr = { .qp_state = IBV_QPS_RTS, .min_rnr_timer = 5 };
	CHECK(!ibv_modify_qp(a->qp, &rr, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER),
	      "RTS -> RTS");
	printf("ok: RTS->RTS changes the RNR timer\n");

	/* Multicast: only UD QPs attach, only to an IPv4-mapped multicast
	 * GID; detaching what is not attached fails; attaching twice is no
	 * error (as in rxe). */
	union ibv_gid grp = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239,
				       [13] = 9, [14] = 9, [15] = 9 } };
	union ibv_gid uni = grp, v6 = { .raw = { 0xff, 0x12, [15] = 1 } };
	uni.raw[12] = 10;
	EXPECT(ibv_attach_mcast(a->qp, &grp, 0) == EINVAL,
	       "an RC QP attached to a multicast group");
	struct ibv_qp_init_attr ua = { .send_cq = a->cq, .recv_cq = a->cq,
				       .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 4,
						.max_recv_wr = 4,
						.max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *ud;
	CHECK(ud = ibv_create_qp(a->pd, &ua), "ibv_create_qp UD");
	EXPECT(ibv_attach_mcast(ud, &uni, 0) == EINVAL,
	       "attached to a unicast GID");
	EXPECT(ibv_attach_mcast(ud, &v6, 0) == EINVAL,
	       "attached to an IPv6 multicast GID on an IPv4 port");
	EXPECT(ibv_detach_mcast(ud, &grp, 0) == EINVAL,
	       "detached from a group it was not attached to");
	CHECK(!ibv_attach_mcast(ud, &grp, 0), "ibv_attach_mcast");
	CHECK(!ibv_attach_mcast(ud, &grp, 0), "ibv_attach_mcast again");
	CHECK(!ibv_detach_mcast(ud, &grp, 0), "ibv_detach_mcast");
	EXPECT(ibv_detach_mcast(ud, &grp, 0) == EINVAL, "detached twice");
	CHECK(!ibv_destroy_qp(ud), "ibv_destroy_qp UD");
	printf("ok: multicast attach/detach: UD QPs and IPv4 groups only\n");
	free(ro);
	free(mine);
}

static void fatal(struct side *a, struct side *b)
{
	connect_pair(a, b);
	printf("ready\n");
	fflush(stdout);
	/* Blocks until the daemon is gone. */
	struct ibv_async_event ev;
	CHECK(!ibv_get_async_event(a->ctx, &ev), "ibv_get_async_event");
	ibv_ack_async_event(&ev);
	EXPECT(ev.event_type == IBV_EVENT_DEVICE_FATAL, "event %s",
	       ibv_event_type_str(ev.event_type));
	printf("ok: daemon killed -> %s\n", ibv_event_type_str(ev.event_type));
	int rc = post_write(a, a->mr->lkey, (uintptr_t)b->buf, b->mr->rkey, 9);
	EXPECT(rc != 0, "post_send on a dead device returned 0");
	struct ibv_wc wc;
	int n = ibv_poll_cq(a->cq, 1, &wc);
	EXPECT(n <= 0, "poll_cq on a dead device returned %d", n);
	errno = 0;
	EXPECT(!ibv_reg_mr(a->pd, a->buf, LEN, IBV_ACCESS_LOCAL_WRITE),
	       "ibv_reg_mr on a dead device succeeded");
	struct ibv_port_attr pa;
	EXPECT(ibv_query_port(a->ctx, 1, &pa) != 0,
	       "ibv_query_port on a dead device succeeded");
	EXPECT(ibv_get_async_event(a->ctx, &ev) == -1,
	       "a second event after DEVICE_FATAL");
	printf("ok: after the daemon died: post_send %d, poll_cq %d, reg_mr "
	       "NULL, query_port fails, no more events\n",
	       rc, n);
	/* Tearing down a dead device frees what the process holds. */
	ibv_destroy_qp(a->qp);
	ibv_destroy_cq(a->cq);
	ibv_close_device(a->ctx);
}

int main(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "errors") && strcmp(argv[1], "fatal"))) {
		fprintf(stderr, "usage: %s errors|fatal\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct side a, b;
	setup(&a, "rnic0");
	setup(&b, "rnic1");
	if (!strcmp(argv[1], "errors"))
		errors(&a, &b);
	else
		fatal(&a, &b);
	printf("ok: %s done\n", argv[1]);
	return 0;
}
