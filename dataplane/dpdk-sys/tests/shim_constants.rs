//! Each constant the Rust side mirrors must equal the header's value as
//! compiled into the C shim (a wrong flag is silent until packets go bad).

use dpdk_sys::*;

macro_rules! same {
    ($rust:expr, $header:ident) => {
        // SAFETY: the shim's constants are immutable C globals.
        let header = unsafe { $header };
        assert_eq!(
            $rust,
            header,
            "{} differs from the header",
            stringify!($rust)
        );
    };
}

#[test]
fn mirrored_constants_match_the_headers() {
    same!(consts::PKTMBUF_HEADROOM, rnic_PKTMBUF_HEADROOM);
    same!(consts::MBUF_DEFAULT_BUF_SIZE, rnic_MBUF_DEFAULT_BUF_SIZE);
    same!(consts::LCORE_ID_ANY, rnic_LCORE_ID_ANY);
    same!(consts::SOCKET_ID_ANY, rnic_SOCKET_ID_ANY);
    same!(
        consts::ETH_TX_OFFLOAD_IPV4_CKSUM,
        rnic_ETH_TX_OFFLOAD_IPV4_CKSUM
    );
    same!(
        consts::ETH_TX_OFFLOAD_UDP_CKSUM,
        rnic_ETH_TX_OFFLOAD_UDP_CKSUM
    );
    same!(
        consts::ETH_TX_OFFLOAD_MULTI_SEGS,
        rnic_ETH_TX_OFFLOAD_MULTI_SEGS
    );
    same!(
        consts::ETH_RX_OFFLOAD_IPV4_CKSUM,
        rnic_ETH_RX_OFFLOAD_IPV4_CKSUM
    );
    same!(consts::MBUF_F_TX_IPV4, rnic_MBUF_F_TX_IPV4);
    same!(consts::MBUF_F_TX_IP_CKSUM, rnic_MBUF_F_TX_IP_CKSUM);
    same!(
        consts::MBUF_F_RX_IP_CKSUM_MASK,
        rnic_MBUF_F_RX_IP_CKSUM_MASK
    );
    same!(consts::MBUF_F_RX_IP_CKSUM_BAD, rnic_MBUF_F_RX_IP_CKSUM_BAD);
    same!(
        consts::MBUF_F_RX_IP_CKSUM_GOOD,
        rnic_MBUF_F_RX_IP_CKSUM_GOOD
    );
    same!(consts::ETH_MQ_RX_RSS, rnic_ETH_MQ_RX_RSS);
    same!(consts::ETH_RSS_UDP, rnic_ETH_RSS_UDP);
}

#[test]
fn bindgen_macros_match_the_shim() {
    same!(RTE_PKTMBUF_HEADROOM, rnic_PKTMBUF_HEADROOM);
    same!(RTE_MAX_LCORE, rnic_MAX_LCORE);
    same!(RTE_MAX_ETHPORTS, rnic_MAX_ETHPORTS);
    same!(
        RTE_MBUF_DEFAULT_DATAROOM + RTE_PKTMBUF_HEADROOM,
        rnic_MBUF_DEFAULT_BUF_SIZE
    );
}
