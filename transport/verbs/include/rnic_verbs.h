/*
 * rnic_verbs.h - the C API of the software RDMA NIC (libverbs.so).
 *
 * ibverbs-like: open a device of the dataplane daemon, allocate a
 * protection domain, memory regions (in shared memory), completion queues
 * and RC QPs, connect a QP to the peer's endpoint (exchanged out of band),
 * post RDMA WRITE / READ, SEND (into the peer's receive WQEs), atomics,
 * and poll completions. Posting and polling touch only shared memory.
 * Immediate data is in network order, as in ibverbs (htonl to post,
 * ntohl to read).
 *
 * Functions returning a pointer return NULL on error, functions returning
 * int return 0 (or a count) or -1; rnic_last_error() says why (per thread).
 * Pointers passed in must be NULL (an error) or handles this library
 * returned and not yet destroyed.
 */
#ifndef RNIC_VERBS_H
#define RNIC_VERBS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rnic_context;
struct rnic_pd;
struct rnic_mr;
struct rnic_cq;
struct rnic_qp;

enum {
	RNIC_ACCESS_LOCAL_WRITE = 1,
	RNIC_ACCESS_REMOTE_WRITE = 2,
	RNIC_ACCESS_REMOTE_READ = 4,
	RNIC_ACCESS_REMOTE_ATOMIC = 8,
};

enum rnic_wr_opcode {
	RNIC_WR_RDMA_WRITE = 1,
	RNIC_WR_RDMA_WRITE_WITH_IMM = 2,
	RNIC_WR_RDMA_READ = 3,
	RNIC_WR_SEND = 4,
	RNIC_WR_SEND_WITH_IMM = 5,
	RNIC_WR_ATOMIC_CMP_AND_SWP = 6,  /* local buffer: 8 bytes */
	RNIC_WR_ATOMIC_FETCH_AND_ADD = 7, /* local buffer: 8 bytes */
};

/* The ibv_wc_status values. */
enum rnic_wc_status {
	RNIC_WC_SUCCESS = 0,
	RNIC_WC_LOC_LEN_ERR = 1,
	RNIC_WC_LOC_QP_OP_ERR = 2,
	RNIC_WC_LOC_PROT_ERR = 4,
	RNIC_WC_WR_FLUSH_ERR = 5,
	RNIC_WC_REM_INV_REQ_ERR = 9,
	RNIC_WC_REM_ACCESS_ERR = 10,
	RNIC_WC_REM_OP_ERR = 11,
	RNIC_WC_RETRY_EXC_ERR = 12,
	RNIC_WC_RNR_RETRY_EXC_ERR = 13,
};

enum rnic_wc_opcode {
	RNIC_WC_SEND = 0,
	RNIC_WC_RDMA_WRITE = 1,
	RNIC_WC_RDMA_READ = 2,
	RNIC_WC_COMP_SWAP = 3,
	RNIC_WC_FETCH_ADD = 4,
	RNIC_WC_RECV = 128,
	RNIC_WC_RECV_RDMA_WITH_IMM = 129,
};

enum {
	RNIC_WC_WITH_IMM = 1, /* wc_flags: imm_data is valid */
};

/* What a peer needs: QP number, first PSN, IPv4 address (10.0.0.1 is
 * 0x0a000001) and, optionally, one memory region. */
struct rnic_endpoint {
	uint32_t qpn;
	uint32_t psn;
	uint32_t ip;
	uint32_t rkey;
	uint64_t va;
	uint64_t len;
};

enum {
	RNIC_MAX_SGE = 13,     /* scatter/gather entries per send WR */
	RNIC_MAX_RECV_SGE = 7, /* scatter/gather entries per receive WR */
	RNIC_MAX_INLINE = 128, /* bytes of inline data per send WR */
};

struct rnic_sge {
	uint64_t addr;        /* device address: rnic_mr_va() + offset */
	uint32_t length;
	uint32_t lkey;
};

struct rnic_send_wr {
	uint64_t wr_id;
	int opcode;     /* enum rnic_wr_opcode */
	int signaled;   /* non-zero: a completion on success too */
	uint32_t lkey;
	uint32_t length;
	uint64_t local_addr;  /* device address: rnic_mr_va() + offset */
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm_data;
	uint64_t compare_add; /* FETCH_ADD: the addend; CMP_SWAP: compared with */
	uint64_t swap;        /* CMP_SWAP: written when the compare matches */
	int fence;            /* non-zero: wait for earlier READs and atomics */
	int num_sge;          /* > 0: sg_list replaces lkey/local_addr/length */
	const struct rnic_sge *sg_list;
	const void *inline_data; /* non-NULL: SEND/WRITE these length bytes inline */
};

/* Where an incoming SEND lands (length 0: none, for WRITE with imm). */
struct rnic_recv_wr {
	uint64_t wr_id;
	uint32_t lkey;
	uint32_t length;
	uint64_t addr;        /* device address: rnic_mr_va() + offset */
	int num_sge;          /* > 0: sg_list replaces lkey/length/addr */
	const struct rnic_sge *sg_list;
};

struct rnic_wc {
	uint64_t wr_id;
	uint32_t qp_num;
	uint32_t byte_len;
	int status;     /* enum rnic_wc_status */
	int opcode;     /* enum rnic_wc_opcode */
	int wc_flags;   /* RNIC_WC_WITH_IMM */
	uint32_t imm_data;
};

const char *rnic_last_error(void);
const char *rnic_wc_status_str(int status);

/* shm_bytes 0: 64 MiB. */
struct rnic_context *rnic_open_device(const char *socket, const char *name, uint64_t shm_bytes);
int rnic_close_device(struct rnic_context *ctx);

struct rnic_pd *rnic_alloc_pd(struct rnic_context *ctx);
int rnic_dealloc_pd(struct rnic_pd *pd);

/* Allocates len bytes of shared memory and registers them. */
struct rnic_mr *rnic_reg_mr(struct rnic_pd *pd, uint64_t len, int access);
int rnic_dereg_mr(struct rnic_mr *mr);
void *rnic_mr_addr(struct rnic_mr *mr);       /* the bytes, in this process */
uint64_t rnic_mr_va(const struct rnic_mr *mr); /* the device address */
uint32_t rnic_mr_lkey(const struct rnic_mr *mr);
uint32_t rnic_mr_rkey(const struct rnic_mr *mr);

struct rnic_cq *rnic_create_cq(struct rnic_context *ctx, uint32_t depth);
int rnic_destroy_cq(struct rnic_cq *cq);
int rnic_poll_cq(const struct rnic_cq *cq, int n, struct rnic_wc *wc);
/* 1: a completion is ready, 0: timeout, -1: error. */
int rnic_wait_cq(const struct rnic_cq *cq, uint32_t timeout_ms);

/* depth: send and receive queue entries (a power of two). */
struct rnic_qp *rnic_create_qp(struct rnic_pd *pd, struct rnic_cq *cq, uint32_t depth);
int rnic_destroy_qp(struct rnic_qp *qp);
/* mr may be NULL. */
int rnic_qp_endpoint(const struct rnic_qp *qp, const struct rnic_mr *mr, struct rnic_endpoint *out);
int rnic_connect_qp(struct rnic_qp *qp, const struct rnic_endpoint *remote);
/* n work requests behind one doorbell, all or none. */
int rnic_post_send(const struct rnic_qp *qp, const struct rnic_send_wr *wrs, int n);
/* n receive work requests behind one doorbell, all or none; the QP may be
 * connected or not yet (post receives before the peer sends). */
int rnic_post_recv(const struct rnic_qp *qp, const struct rnic_recv_wr *wrs, int n);

#ifdef __cplusplus
}
#endif

#endif /* RNIC_VERBS_H */
