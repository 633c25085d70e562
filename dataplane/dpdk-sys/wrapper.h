/* Everything the bindings are generated from: the DPDK headers the
 * dataplane uses and the shim for DPDK's static inline functions. */
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_cycles.h>
#include <rte_ring.h>
#include <rte_eth_ring.h>

#include "shim.h"
