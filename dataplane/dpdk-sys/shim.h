/* C trampolines for DPDK functions and macros that are static inline (and
 * so have no symbol to link against), and the header values of the flags
 * the Rust side mirrors as constants. All names start with rnic_. */
#ifndef RNIC_DPDK_SHIM_H
#define RNIC_DPDK_SHIM_H

#include <stdint.h>

struct rte_mbuf;
struct rte_mempool;
struct rte_mbuf_ext_shared_info;

uint16_t rnic_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                       uint16_t nb_pkts);
uint16_t rnic_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                       uint16_t nb_pkts);
struct rte_mbuf *rnic_pktmbuf_alloc(struct rte_mempool *mp);
int rnic_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
void rnic_pktmbuf_free(struct rte_mbuf *m);
void *rnic_pktmbuf_mtod(struct rte_mbuf *m);
char *rnic_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int rnic_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
uint16_t rnic_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t rnic_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t rnic_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t rnic_pktmbuf_tailroom(const struct rte_mbuf *m);
/* External buffers (an mbuf whose data lies in memory DPDK does not own). */
void rnic_ext_shinfo_init(struct rte_mbuf_ext_shared_info *shinfo,
                          void (*free_cb)(void *addr, void *opaque), void *opaque);
uint16_t rnic_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo, int16_t value);
uint16_t rnic_ext_refcnt_read(const struct rte_mbuf_ext_shared_info *shinfo);
void rnic_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr, uint16_t buf_len,
                                struct rte_mbuf_ext_shared_info *shinfo);
struct rte_mbuf *rnic_pktmbuf_alloc_like(struct rte_mbuf *m);
int rnic_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
int rnic_pktmbuf_linearize(struct rte_mbuf *m);
unsigned rnic_lcore_id(void);
uint64_t rnic_rdtsc(void);
int rnic_errno(void);

/* Header values, for the test that checks the Rust constants. */
extern const uint32_t rnic_PKTMBUF_HEADROOM;
extern const uint32_t rnic_MBUF_DEFAULT_BUF_SIZE;
extern const uint32_t rnic_MAX_LCORE;
extern const uint32_t rnic_MAX_ETHPORTS;
extern const uint32_t rnic_LCORE_ID_ANY;
extern const int32_t rnic_SOCKET_ID_ANY;
extern const uint64_t rnic_ETH_TX_OFFLOAD_IPV4_CKSUM;
extern const uint64_t rnic_ETH_TX_OFFLOAD_UDP_CKSUM;
extern const uint64_t rnic_ETH_TX_OFFLOAD_MULTI_SEGS;
extern const uint64_t rnic_ETH_RX_OFFLOAD_IPV4_CKSUM;
extern const uint64_t rnic_MBUF_F_TX_IPV4;
extern const uint64_t rnic_MBUF_F_TX_IP_CKSUM;
extern const uint64_t rnic_MBUF_F_RX_IP_CKSUM_MASK;
extern const uint64_t rnic_MBUF_F_RX_IP_CKSUM_BAD;
extern const uint64_t rnic_MBUF_F_RX_IP_CKSUM_GOOD;
extern const uint32_t rnic_ETH_MQ_RX_RSS;
extern const uint64_t rnic_ETH_RSS_UDP;

int rnic_thread_slice(uint64_t ns);
int rnic_thread_fifo(int priority);

#endif
