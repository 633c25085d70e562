/* See shim.h. Each function forwards to the DPDK inline of the same name,
 * but rnic_thread_slice, a system call the Rust side may not make. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include "shim.h"

uint16_t rnic_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                       uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t rnic_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                       uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *rnic_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int rnic_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void rnic_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void *rnic_pktmbuf_mtod(struct rte_mbuf *m)
{
	return rte_pktmbuf_mtod(m, void *);
}

char *rnic_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

int rnic_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

uint16_t rnic_pktmbuf_data_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_data_len(m);
}

uint32_t rnic_pktmbuf_pkt_len(const struct rte_mbuf *m)
{
	return rte_pktmbuf_pkt_len(m);
}

uint16_t rnic_pktmbuf_headroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_headroom(m);
}

uint16_t rnic_pktmbuf_tailroom(const struct rte_mbuf *m)
{
	return rte_pktmbuf_tailroom(m);
}

void rnic_ext_shinfo_init(struct rte_mbuf_ext_shared_info *shinfo,
                          void (*free_cb)(void *addr, void *opaque), void *opaque)
{
	shinfo->free_cb = free_cb;
	shinfo->fcb_opaque = opaque;
	rte_mbuf_ext_refcnt_set(shinfo, 1);
}

uint16_t rnic_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo, int16_t value)
{
	return rte_mbuf_ext_refcnt_update(shinfo, value);
}

/* No IOVA: only software PMDs, which read the data by its virtual
 * address, are given external buffers. */
void rnic_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr, uint16_t buf_len,
                                struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, RTE_BAD_IOVA, buf_len, shinfo);
}

uint16_t rnic_ext_refcnt_read(const struct rte_mbuf_ext_shared_info *shinfo)
{
	return rte_mbuf_ext_refcnt_read(shinfo);
}

struct rte_mbuf *rnic_pktmbuf_alloc_like(struct rte_mbuf *m)
{
	return rte_pktmbuf_alloc(m->pool);
}

int rnic_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail);
}

int rnic_pktmbuf_linearize(struct rte_mbuf *m)
{
	return rte_pktmbuf_linearize(m);
}

unsigned rnic_lcore_id(void)
{
	return rte_lcore_id();
}

uint64_t rnic_rdtsc(void)
{
	return rte_rdtsc();
}

int rnic_errno(void)
{
	return rte_errno;
}

const uint32_t rnic_PKTMBUF_HEADROOM = RTE_PKTMBUF_HEADROOM;
const uint32_t rnic_MBUF_DEFAULT_BUF_SIZE = RTE_MBUF_DEFAULT_BUF_SIZE;
const uint32_t rnic_MAX_LCORE = RTE_MAX_LCORE;
const uint32_t rnic_MAX_ETHPORTS = RTE_MAX_ETHPORTS;
const uint32_t rnic_LCORE_ID_ANY = LCORE_ID_ANY;
const int32_t rnic_SOCKET_ID_ANY = SOCKET_ID_ANY;
const uint64_t rnic_ETH_TX_OFFLOAD_IPV4_CKSUM = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
const uint64_t rnic_ETH_TX_OFFLOAD_UDP_CKSUM = RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
const uint64_t rnic_ETH_TX_OFFLOAD_MULTI_SEGS = RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
const uint64_t rnic_ETH_RX_OFFLOAD_IPV4_CKSUM = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM;
const uint64_t rnic_MBUF_F_TX_IPV4 = RTE_MBUF_F_TX_IPV4;
const uint64_t rnic_MBUF_F_TX_IP_CKSUM = RTE_MBUF_F_TX_IP_CKSUM;
const uint64_t rnic_MBUF_F_RX_IP_CKSUM_MASK = RTE_MBUF_F_RX_IP_CKSUM_MASK;
const uint64_t rnic_MBUF_F_RX_IP_CKSUM_BAD = RTE_MBUF_F_RX_IP_CKSUM_BAD;
const uint64_t rnic_MBUF_F_RX_IP_CKSUM_GOOD = RTE_MBUF_F_RX_IP_CKSUM_GOOD;
const uint32_t rnic_ETH_MQ_RX_RSS = RTE_ETH_MQ_RX_RSS;
const uint64_t rnic_ETH_RSS_UDP = RTE_ETH_RSS_UDP;

/* The calling thread's EEVDF slice (Linux 6.12 and later: sched_setattr
 * with SCHED_OTHER and a sched_runtime of 0.1 to 100 ms): a shorter slice
 * gives a woken thread an earlier deadline, so that it preempts a thread
 * spinning on its CPU at once instead of after that thread's slice.
 * Returns 0, or the errno (EINVAL on kernels without custom slices). */
int rnic_thread_slice(uint64_t ns)
{
	struct {
		uint32_t size;
		uint32_t sched_policy;
		uint64_t sched_flags;
		int32_t sched_nice;
		uint32_t sched_priority;
		uint64_t sched_runtime;
		uint64_t sched_deadline;
		uint64_t sched_period;
	} attr;
	memset(&attr, 0, sizeof(attr));
	attr.size = sizeof(attr);
	attr.sched_policy = 0; /* SCHED_OTHER */
	attr.sched_nice = getpriority(PRIO_PROCESS, 0);
	attr.sched_runtime = ns;
	if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0)
		return errno;
	return 0;
}

/* The calling thread's scheduling class: SCHED_FIFO at `priority` (1 to
 * 99), or with 0 SCHED_OTHER again. Returns 0, or the errno (EPERM
 * without CAP_SYS_NICE or an RLIMIT_RTPRIO that allows it). */
int rnic_thread_fifo(int priority)
{
	struct sched_param p = { .sched_priority = priority };
	if (sched_setscheduler(0, priority > 0 ? SCHED_FIFO : SCHED_OTHER, &p) != 0)
		return errno;
	return 0;
}
