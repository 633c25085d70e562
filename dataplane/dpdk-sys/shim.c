/* See shim.h. Each function forwards to the DPDK inline of the same name. */
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
