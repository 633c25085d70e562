//! The QP attributes of each step of a connection (`rdma_init_qp_attr`,
//! and what the library itself hands `ibv_modify_qp`): pure functions of
//! what the id knows, so they are tested without a device.
//!
//! - INIT: port 1, P_Key index 0; RC/UC access flags (none before the
//!   connection is known, then REMOTE_WRITE, plus REMOTE_READ and
//!   REMOTE_ATOMIC when the id answers READs); UD its Q_Key.
//! - RTR: the path MTU, the peer's QPN and starting PSN, the READ depth
//!   answered, RNR timer 12, and a global AH to the peer's IPv4-mapped
//!   GID (hop limit 64, the traffic class of the connection, port 1).
//!   UD: the state alone.
//! - RTS: our starting PSN, the ACK timeout of the path, retry and RNR
//!   retry counts, the READ depth issued. UD: PSN 0.

use std::ffi::c_int;

use shm::cma::CmPath;

use crate::sys::*;
use crate::util::mapped_gid;

/// The GID index of the port's IPv4-mapped RoCEv2 GID in the drop-in
/// libibverbs' table (0 is the link-local one).
pub const SGID_INDEX: u8 = 1;

/// The RNR NAK timer the responder sends (0.64 ms).
pub const MIN_RNR_TIMER: u8 = 12;

/// What the attributes of an id's QP derive from.
#[derive(Debug, Clone, Copy)]
pub struct QpView {
    pub ud: bool,
    pub qkey: u32,
    /// max_dest_rd_atomic: READs/atomics this side answers.
    pub resp_res: u8,
    /// max_rd_atomic: READs/atomics this side has outstanding.
    pub init_depth: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub starting_psn: u32,
    /// The connection's path and the peer's QPN, once known.
    pub peer: Option<(CmPath, u32)>,
}

/// The verbs MTU of a byte count (256 .. 4096).
pub fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        0..=511 => IBV_MTU_256,
        512..=1023 => IBV_MTU_512,
        1024..=2047 => IBV_MTU_1024,
        2048..=4095 => IBV_MTU_2048,
        _ => IBV_MTU_4096,
    }
}

/// The access flags of INIT: none before the connection is known.
pub fn access(v: &QpView) -> u32 {
    if v.peer.is_none() {
        return 0;
    }
    let mut a = IBV_ACCESS_REMOTE_WRITE;
    if v.resp_res > 0 {
        a |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    }
    a
}

/// The attributes and mask to move a QP to `state` (EINVAL for a state
/// rdma_cm does not give, or RTR/RTS of a connected QP whose peer is not
/// known yet).
pub fn qp_attr(v: &QpView, state: ibv_qp_state) -> Result<(ibv_qp_attr, c_int), i32> {
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let mask = match (state, v.ud) {
        (IBV_QPS_INIT, true) => {
            a.port_num = 1;
            a.pkey_index = 0;
            a.qkey = v.qkey;
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
        }
        (IBV_QPS_INIT, false) => {
            a.port_num = 1;
            a.pkey_index = 0;
            a.qp_access_flags = access(v);
            IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT
        }
        (IBV_QPS_RTR, true) => IBV_QP_STATE,
        (IBV_QPS_RTS, true) => {
            a.sq_psn = 0;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        (IBV_QPS_RTR, false) => {
            let (path, qpn) = v.peer.ok_or(libc::EINVAL)?;
            a.path_mtu = mtu_enum(path.mtu);
            a.dest_qp_num = qpn;
            a.rq_psn = path.peer_psn & 0xff_ffff;
            a.max_dest_rd_atomic = v.resp_res;
            a.min_rnr_timer = MIN_RNR_TIMER;
            a.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid {
                        raw: mapped_gid(path.peer_ip),
                    },
                    flow_label: 0,
                    sgid_index: SGID_INDEX,
                    hop_limit: 64,
                    traffic_class: path.traffic_class,
                },
                is_global: 1,
                port_num: 1,
                ..Default::default()
            };
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        (IBV_QPS_RTS, false) => {
            let (path, _) = v.peer.ok_or(libc::EINVAL)?;
            a.sq_psn = v.starting_psn & 0xff_ffff;
            a.timeout = path.ack_timeout;
            a.retry_cnt = v.retry_count & 7;
            a.rnr_retry = v.rnr_retry & 7;
            a.max_rd_atomic = v.init_depth;
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask as c_int))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn path() -> CmPath {
        CmPath {
            local_ip: Ipv4Addr::new(10, 0, 0, 1),
            local_port: 40000,
            peer_ip: Ipv4Addr::new(10, 0, 0, 2),
            peer_port: 7174,
            peer_psn: 0x123456,
            mtu: 1024,
            ack_timeout: 14,
            traffic_class: 0x68,
            qkey: 0,
            telemetry: false,
        }
    }

    fn rc(peer: bool) -> QpView {
        QpView {
            ud: false,
            qkey: 0,
            resp_res: 4,
            init_depth: 2,
            retry_count: 5,
            rnr_retry: 6,
            starting_psn: 0xabcdef,
            peer: peer.then(|| (path(), 0x99)),
        }
    }

    #[test]
    fn init_before_the_connection_grants_no_remote_access() {
        let (a, m) = qp_attr(&rc(false), IBV_QPS_INIT).unwrap();
        assert_eq!(a.qp_access_flags, 0);
        assert_eq!((a.port_num, a.pkey_index), (1, 0));
        let want = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
        assert_eq!(m as u32, want);
    }

    #[test]
    fn init_once_connected_grants_write_and_read_only_with_responder_resources() {
        let (a, _) = qp_attr(&rc(true), IBV_QPS_INIT).unwrap();
        assert_eq!(
            a.qp_access_flags,
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
        );
        let none = QpView {
            resp_res: 0,
            ..rc(true)
        };
        let (a, _) = qp_attr(&none, IBV_QPS_INIT).unwrap();
        assert_eq!(a.qp_access_flags, IBV_ACCESS_REMOTE_WRITE);
    }

    #[test]
    fn rtr_addresses_the_peer_by_its_ipv4_mapped_gid() {
        let (a, m) = qp_attr(&rc(true), IBV_QPS_RTR).unwrap();
        assert_eq!(a.path_mtu, IBV_MTU_1024);
        assert_eq!((a.dest_qp_num, a.rq_psn), (0x99, 0x123456));
        assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (4, 12));
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.port_num, 1);
        // SAFETY: reading the GID union's bytes.
        let g = unsafe { a.ah_attr.grh.dgid.raw };
        assert_eq!(g, mapped_gid(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(a.ah_attr.grh.hop_limit, 64);
        assert_eq!(a.ah_attr.grh.traffic_class, 0x68);
        assert_eq!(m as u32 & IBV_QP_AV, IBV_QP_AV);
        assert_eq!(m as u32 & IBV_QP_MIN_RNR_TIMER, IBV_QP_MIN_RNR_TIMER);
    }

    #[test]
    fn rts_starts_at_our_psn_with_the_path_timeout() {
        let (a, m) = qp_attr(&rc(true), IBV_QPS_RTS).unwrap();
        assert_eq!(a.sq_psn, 0xabcdef);
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 5, 6));
        assert_eq!(a.max_rd_atomic, 2);
        assert_eq!(
            m as u32,
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        );
    }

    #[test]
    fn rtr_and_rts_need_the_peer() {
        let err = |v: &QpView, s| qp_attr(v, s).err();
        assert_eq!(err(&rc(false), IBV_QPS_RTR), Some(libc::EINVAL));
        assert_eq!(err(&rc(false), IBV_QPS_RTS), Some(libc::EINVAL));
        assert_eq!(err(&rc(true), IBV_QPS_SQD), Some(libc::EINVAL));
    }

    #[test]
    fn ud_goes_init_with_its_qkey_then_rtr_then_rts_at_psn_0() {
        let ud = QpView {
            ud: true,
            qkey: RDMA_UDP_QKEY,
            ..rc(false)
        };
        let (a, m) = qp_attr(&ud, IBV_QPS_INIT).unwrap();
        assert_eq!(a.qkey, 0x0123_4567);
        assert_eq!(
            m as u32,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
        );
        assert_eq!(qp_attr(&ud, IBV_QPS_RTR).unwrap().1 as u32, IBV_QP_STATE);
        let (a, m) = qp_attr(&ud, IBV_QPS_RTS).unwrap();
        assert_eq!((a.sq_psn, m as u32), (0, IBV_QP_STATE | IBV_QP_SQ_PSN));
    }

    #[test]
    fn mtus_round_down_to_a_verbs_mtu() {
        assert_eq!(mtu_enum(1500), IBV_MTU_1024);
        assert_eq!(mtu_enum(4096), IBV_MTU_4096);
        assert_eq!(mtu_enum(9000), IBV_MTU_4096);
        assert_eq!(mtu_enum(256), IBV_MTU_256);
    }
}
