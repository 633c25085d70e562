/*
 * rnicdv.h - what verbs lacks on the rnic software NIC, the way vendors
 * add mlx5dv-style calls beside <infiniband/verbs.h>: per-QP congestion
 * control and its live state.
 *
 * The calls are in the rnic libibverbs.so.1 (version node RNICDV_1.0), not
 * in Debian's: link against ours, e.g.
 *   cc app.c -Itransport/ibverbs/include -Ltarget/release/ibverbs \
 *      -l:libibverbs.so.1 -o app
 * and run with target/release/ibverbs first on LD_LIBRARY_PATH.
 *
 * Both return 0 or an errno value (EINVAL names a bad argument; the
 * library prints why with RNIC_VERBS_DEBUG=1).
 */
#ifndef RNICDV_H
#define RNICDV_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A QP's congestion control and what it does now. */
struct rnicdv_qp_cc {
	/* "hpcc" (HPCC++ with in-band telemetry), "hpcc-probe" (one
	 * telemetry probe per RTT), "hpcc-rx" (receiver-driven), "dcqcn" or
	 * "none" (line rate), NUL-terminated. */
	char cc[16];
	uint64_t window_bytes; /* bytes in flight allowed (0: no window) */
	uint64_t rate_bps;     /* pacing rate, bits per second */
	uint64_t tx_packets;
	uint64_t rx_packets;
	uint64_t retransmits;
	uint64_t timeouts;
};

/* Gives `qp` its own congestion control, one of the names above, instead
 * of the device's (`dataplane --config`, [service] cc). Only in RESET or
 * INIT; both QPs of a connection must run the same one. */
int rnicdv_set_qp_cc(struct ibv_qp *qp, const char *cc);

/* Gives `qp` the 128-bit key (16 bytes) that authenticates its congestion
 * feedback (HPCC++ draft-00 s9): its peer's ACKs, probe answers and
 * notifications carry a MAC under it, INT responses a token. The peer's
 * QP must be given the same key. NULL takes an explicit key back: the QP
 * then gets the one the daemon derives from its feedback_domain_key, if
 * any. Only in RESET or INIT. (RNICDV_1.1) */
int rnicdv_set_qp_feedback_key(struct ibv_qp *qp, const uint8_t *key);

/* The QP's congestion control, window, rate and packet counters. */
int rnicdv_query_qp_cc(struct ibv_qp *qp, struct rnicdv_qp_cc *out);

#ifdef __cplusplus
}
#endif

#endif
