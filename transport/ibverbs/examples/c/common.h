/*
 * common.h - what the examples share: opening a device by name, one RC QP
 * with its CQ, the endpoint two QPs swap (QP number, RoCE v2 GID, buffer
 * address and rkey), the INIT -> RTR -> RTS walk, and waiting for one
 * completion. Plain <infiniband/verbs.h>: any libibverbs serves them.
 */
#ifndef EXAMPLES_COMMON_H
#define EXAMPLES_COMMON_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *me = "example";

static inline void die(const char *what, int err)
{
	fprintf(stderr, "%s: %s: %s\n", me, what, strerror(err));
	exit(1);
}

/* What a QP's peer needs to connect to it and reach its buffer. */
struct endpoint {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t va;
	union ibv_gid gid;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static inline struct ibv_context *open_device(const char *name)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list", errno);
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			struct ibv_context *c = ibv_open_device(list[i]);
			if (!c)
				die(name, errno);
			ibv_free_device_list(list);
			return c;
		}
	}
	fprintf(stderr, "%s: no device %s (is the daemon running?)\n", me, name);
	exit(1);
}

/* An RC QP of `depth` WRs each way, both queues completing on `cq`. */
static inline struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq,
				   int depth)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp", errno);
	return qp;
}

/* A context, PD, CQ and RC QP of `depth` WRs each way on device `name`. */
static inline void open_side(struct side *s, const char *name, int depth)
{
	s->ctx = open_device(name);
	if (!(s->pd = ibv_alloc_pd(s->ctx)))
		die("ibv_alloc_pd", errno);
	if (!(s->cq = ibv_create_cq(s->ctx, 2 * depth, NULL, NULL, 0)))
		die("ibv_create_cq", errno);
	s->qp = rc_qp(s->pd, s->cq, depth);
}

/* This QP's endpoint, with `mr` (or none) as the buffer peers reach. */
static inline struct endpoint endpoint_of(struct side *s, struct ibv_mr *mr)
{
	struct endpoint e = { .qpn = s->qp->qp_num };
	if (mr) {
		e.rkey = mr->rkey;
		e.va = (uintptr_t)mr->addr;
	}
	/* GID index 1: the IPv4-mapped RoCE v2 GID. */
	int err = ibv_query_gid(s->ctx, 1, 1, &e.gid);
	if (err)
		die("ibv_query_gid", err);
	return e;
}

/* RESET -> INIT -> RTR -> RTS towards `peer`; `access` is what the peer
 * may do to this QP. */
static inline void connect_qp(struct side *s, const struct endpoint *peer, int access)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = access,
	};
	int err = ibv_modify_qp(s->qp, &a,
				IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					IBV_QP_ACCESS_FLAGS);
	if (err)
		die("modify to INIT", err);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	err = ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
	if (err)
		die("modify to RTR", err);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	err = ibv_modify_qp(s->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC);
	if (err)
		die("modify to RTS", err);
}

/* The next completion of `s`; it must have succeeded. */
static inline struct ibv_wc wait_one(struct side *s, const char *what)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0)
		sched_yield(); /* a small machine shares its cores */
	if (n < 0)
		die("ibv_poll_cq", EIO);
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "%s: %s completed with %s\n", me, what,
			ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

static inline void close_side(struct side *s)
{
	if (ibv_destroy_qp(s->qp) || ibv_destroy_cq(s->cq) ||
	    ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
		die("teardown", errno);
}

/* A page-aligned, zeroed buffer registered on `s` with `access`. */
static inline struct ibv_mr *buffer(struct side *s, size_t len, int access)
{
	void *p;
	if (posix_memalign(&p, 4096, len))
		die("posix_memalign", ENOMEM);
	memset(p, 0, len);
	struct ibv_mr *mr = ibv_reg_mr(s->pd, p, len, access);
	if (!mr)
		die("ibv_reg_mr", errno);
	return mr;
}

static inline void free_buffer(struct ibv_mr *mr)
{
	void *p = mr->addr;
	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr", errno);
	free(p);
}

#endif
