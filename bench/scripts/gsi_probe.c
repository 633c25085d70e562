/*
 * gsi_probe.c - asks a RoCE port's QP1 (its General Services Interface)
 * what it answers, from a UD QP of plain <infiniband/verbs.h>, so that it
 * runs over our libibverbs and over rdma-core's on rxe alike:
 *
 *   1. CM Get(ClassPortInfo)         Linux answers GetResp, status 0x000C
 *   2. PerfMgmt Get(PortCounters)    Linux answers GetResp, status 0x000C
 *   3. SubnMgt Get(PortInfo)         Linux drops it (no answer)
 *   4. CM Send, unknown attribute    Linux drops it (no answer)
 *   5. CM REQ for a service nobody   Linux's CM answers REJ (invalid
 *      listens on                    service ID) to the sender's QP1,
 *                                    not to this QP: no answer here
 *
 * Each answer must echo the request (TID, attribute, modifier, data) but
 * for the method and status, come from QP 1 with the GSI Q_Key. Prints
 * one line per probe and "gsi_probe: all 5 answered as Linux answers";
 * exits 1 at the first difference. (The REJ of probe 5 is counted by the
 * sending device's own CM: `dataplane stats` on our side.)
 *
 *   gsi_probe [-d DEVICE] [-g GID_INDEX] [-w WAIT_MS] TARGET_IPV4
 *   gsi_probe [-d DEVICE] [-g GID_INDEX] [-w WAIT_MS] -t TARGET_IPV4 [HOST]
 *
 * With -t, a trailing HOST (the address a test harness gives every
 * client for its TCP exchange, which this program has none of) is
 * ignored.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAD_LEN 256
#define GRH_LEN 40
#define GSI_QKEY 0x80010000u

static void die(const char *what, int err)
{
	fprintf(stderr, "gsi_probe: %s: %s\n", what, strerror(err));
	exit(1);
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

struct probe {
	const char *name;
	uint8_t class, version, method;
	uint16_t attr;
	int answered; /* 1: GetResp 0x000C expected; 0: no answer */
	int req;      /* the data is a CM REQ as Linux's rdma_cm builds one */
};

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, v >> 16); put16(p + 2, v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

int main(int argc, char **argv)
{
	const char *dev = NULL, *t = NULL;
	int gid_index = 1, wait_ms = 1000, opt;
	while ((opt = getopt(argc, argv, "d:g:w:t:h")) != -1) {
		switch (opt) {
		case 't': t = optarg; break;
		case 'd': dev = optarg; break;
		case 'g': gid_index = atoi(optarg); break;
		case 'w': wait_ms = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: gsi_probe [-d DEVICE] [-g GID_INDEX] [-w WAIT_MS] TARGET_IPV4 | -t TARGET_IPV4 [HOST]\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	struct in_addr target;
	if (!t && optind == argc - 1)
		t = argv[optind];
	else if (t && optind < argc - 1)
		t = NULL;
	if (!t || inet_pton(AF_INET, t, &target) != 1) {
		fprintf(stderr, "gsi_probe: give the target's IPv4 address (see -h)\n");
		return 2;
	}
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no RDMA device", ENODEV);
	struct ibv_device *d = list[0];
	for (int i = 0; dev && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), dev) == 0)
			d = list[i];
	if (dev && strcmp(ibv_get_device_name(d), dev) != 0) {
		fprintf(stderr, "gsi_probe: no device %s\n", dev);
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(d);
	if (!ctx)
		die("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	uint8_t *buf = calloc(2, GRH_LEN + MAD_LEN);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 2 * (GRH_LEN + MAD_LEN), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	if (!pd || !mr || !cq)
		die("pd, mr or cq", errno);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp UD", errno);
	/* QP1 answers with the GSI Q_Key: this QP must take it. */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = GSI_QKEY };
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)))
		die("INIT", errno);
	a.qp_state = IBV_QPS_RTR;
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE)))
		die("RTR", errno);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)))
		die("RTS", errno);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	aa.grh.dgid.raw[10] = 0xff;
	aa.grh.dgid.raw[11] = 0xff;
	memcpy(&aa.grh.dgid.raw[12], &target, 4);
	aa.grh.sgid_index = (uint8_t)gid_index;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("ibv_create_ah", errno);

	const struct probe probes[] = {
		{ "CM Get(ClassPortInfo)", 0x07, 2, 0x01, 0x0001, 1, 0 },
		{ "PerfMgmt Get(PortCounters)", 0x04, 1, 0x01, 0x0012, 1, 0 },
		{ "SubnMgt Get(PortInfo)", 0x01, 1, 0x01, 0x0015, 0, 0 },
		{ "CM Send(attribute 0x00ff)", 0x07, 2, 0x03, 0x00ff, 0, 0 },
		{ "CM REQ for port 65001 (nobody listens)", 0x07, 2, 0x03, 0x0010, 0, 1 },
	};
	union ibv_gid own;
	if (ibv_query_gid(ctx, 1, gid_index, &own))
		die("ibv_query_gid", errno);
	uint8_t *rx = buf, *tx = buf + GRH_LEN + MAD_LEN;
	for (unsigned p = 0; p < sizeof probes / sizeof probes[0]; p++) {
		const struct probe *pr = &probes[p];
		struct ibv_sge rs = { (uintptr_t)rx, GRH_LEN + MAD_LEN, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *bad_r;
		memset(rx, 0, GRH_LEN + MAD_LEN);
		if ((errno = ibv_post_recv(qp, &rw, &bad_r)))
			die("ibv_post_recv", errno);
		memset(tx, 0, MAD_LEN);
		tx[0] = 1;
		tx[1] = pr->class;
		tx[2] = pr->version;
		tx[3] = pr->method;
		put32(tx + 8, 0x0badcafe);
		put32(tx + 12, 0x1000 + p);
		put16(tx + 16, pr->attr);
		put32(tx + 20, 0x55aa00 + p);
		for (int i = 24; i < MAD_LEN; i++)
			tx[i] = (uint8_t)(i * 7 + p);
		if (pr->req) {
			/* IBA table 106 (offsets into the MAD): an RC REQ to
			 * RDMA_PS_TCP port 65001 from this QP, as rdma_cm fills it. */
			uint8_t *r = tx + 24;
			memset(r, 0, MAD_LEN - 24);
			put32(r + 0, 0x0c0ffee0);              /* LocalCommID */
			put32(r + 8, 0);                       /* ServiceID */
			put32(r + 12, 0x01060000u | 65001);
			memcpy(r + 16, "\x02\x00\x00\xff\xfe\x00\x00\x01", 8); /* CA GUID */
			put32(r + 32, qp->qp_num << 8 | 1);    /* QPN, responder resources */
			r[39] = 1;                             /* initiator depth */
			r[43] = 20 << 3 | 1;                   /* response timeout, RC, flow control */
			put32(r + 44, 0x123456u << 8 | 20 << 3 | 7); /* PSN, timeout, retries */
			put16(r + 48, 0xffff);                 /* P_Key */
			r[50] = 3 << 4 | 7;                    /* MTU 1024, RNR retries */
			r[51] = 15 << 4;                       /* max CM retries */
			put16(r + 52, 0xffff);                 /* LIDs */
			put16(r + 54, 0xffff);
			memcpy(r + 56, own.raw, 16);           /* local and remote GIDs */
			memcpy(r + 72, aa.grh.dgid.raw, 16);
			r[93] = 64;                            /* hop limit */
			r[95] = 19 << 3;                       /* local ACK timeout */
			/* rdma_cm's header: version 0, IPv4, source port, addresses. */
			r[141] = 0x40;
			put16(r + 142, 40000);
			memcpy(r + 140 + 16, own.raw + 12, 4);
			memcpy(r + 140 + 32, aa.grh.dgid.raw + 12, 4);
		}
		struct ibv_sge ss = { (uintptr_t)tx, MAD_LEN, mr->lkey };
		struct ibv_send_wr sw = {
			.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad_s;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = 1;
		sw.wr.ud.remote_qkey = GSI_QKEY;
		if ((errno = ibv_post_send(qp, &sw, &bad_s)))
			die("ibv_post_send", errno);
		struct ibv_wc wc;
		int got = 0, sent = 0;
		uint64_t end = now_ms() + (uint64_t)wait_ms;
		while (now_ms() < end && !got) {
			int k = ibv_poll_cq(cq, 1, &wc);
			if (k < 0)
				die("ibv_poll_cq", EIO);
			if (k == 0) {
				usleep(100);
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "gsi_probe: %s: completion %s\n", pr->name, ibv_wc_status_str(wc.status));
				return 1;
			}
			if (wc.wr_id == 2)
				sent = 1;
			else
				got = 1;
		}
		if (!sent) {
			fprintf(stderr, "gsi_probe: %s: the send never completed\n", pr->name);
			return 1;
		}
		if (!got) {
			if (pr->answered) {
				fprintf(stderr, "gsi_probe: %s: no answer within %d ms (Linux answers GetResp 0x000C)\n", pr->name, wait_ms);
				return 1;
			}
			printf("gsi_probe: %s: no answer within %d ms, as Linux%s\n", pr->name, wait_ms,
			       pr->req ? " (its REJ goes to this device's QP1)" : "");
			/* The receive WQE stays posted; the next probe posts another. */
			continue;
		}
		const uint8_t *m = rx + GRH_LEN;
		uint8_t want[MAD_LEN];
		memcpy(want, tx, MAD_LEN);
		want[3] = 0x81;
		put16(want + 4, 0x000c);
		if (!pr->answered) {
			fprintf(stderr, "gsi_probe: %s: answered (method 0x%02x status 0x%04x); Linux drops it\n",
				pr->name, m[3], get16(m + 4));
			return 1;
		}
		if (!(wc.wc_flags & IBV_WC_GRH) || wc.src_qp != 1 || wc.byte_len != GRH_LEN + MAD_LEN) {
			fprintf(stderr, "gsi_probe: %s: answer from QP %u, %u bytes, GRH %s\n", pr->name,
				wc.src_qp, wc.byte_len, (wc.wc_flags & IBV_WC_GRH) ? "yes" : "no");
			return 1;
		}
		if (memcmp(m, want, MAD_LEN) != 0) {
			int at = 0;
			while (m[at] == want[at])
				at++;
			fprintf(stderr, "gsi_probe: %s: the answer differs at byte %d: 0x%02x, want 0x%02x\n",
				pr->name, at, m[at], want[at]);
			return 1;
		}
		printf("gsi_probe: %s: GetResp status 0x%04x from QP 1, the rest echoed, as Linux\n",
		       pr->name, get16(m + 4));
	}
	printf("gsi_probe: all 5 answered as Linux answers\n");
	return 0;
}
