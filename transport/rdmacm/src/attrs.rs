//! The QP attributes of each step of a connection (`rdma_init_qp_attr`,
//! and what the library itself hands `ibv_modify_qp`): pure functions of
//! what the id knows, so they are tested without a device.
//!
//! As the kernel's CM (`cm_init_qp_*_attr`) gives them:
//!
//! - INIT: port 1, P_Key index 0; RC/UC access flags (none before the
//!   connection is known, then REMOTE_WRITE, plus for RC REMOTE_READ and
//!   REMOTE_ATOMIC when the id answers READs); UD its Q_Key.
//! - RTR: the path MTU, the peer's QPN, the receive PSN, and a global AH
//!   to the peer's IPv4-mapped GID (hop limit 64, the traffic class of
//!   the connection, port 1); RC also the READ depth answered and RNR
//!   timer 0. UD: the state alone.
//! - RTS: the send PSN; RC also the ACK timeout (the path's, or
//!   RDMA_OPTION_ID_ACK_TIMEOUT's), retry and RNR retry counts (at most
//!   7) and the READ depth issued. UD: PSN 0.

use std::ffi::c_int;

use shm::cma::CmPath;

use crate::sys::*;
use crate::util::mapped_gid;

/// The GID index of the port's IPv4-mapped RoCEv2 GID in the drop-in
/// libibverbs' table (0 is the link-local one).
pub const SGID_INDEX: u8 = 1;

/// The RNR NAK timer the responder sends: the kernel's CM gives 0
/// (655.36 ms).
pub const MIN_RNR_TIMER: u8 = 0;

/// What the attributes of an id's QP derive from.
#[derive(Debug, Clone, Copy)]
pub struct QpView {
    /// RC, UC or UD.
    pub qp_type: ibv_qp_type,
    pub qkey: u32,
    /// max_dest_rd_atomic: READs/atomics this side answers.
    pub resp_res: u8,
    /// max_rd_atomic: READs/atomics this side has outstanding.
    pub init_depth: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub starting_psn: u32,
    /// RDMA_OPTION_ID_ACK_TIMEOUT, over the path's.
    pub ack_timeout: Option<u8>,
    /// The connection's path and the peer's QPN, once known.
    pub peer: Option<(CmPath, u32)>,
}

impl QpView {
    fn rc(&self) -> bool {
        self.qp_type == IBV_QPT_RC
    }
}

/// The address handle to the peer of a path: a global route to its
/// IPv4-mapped GID from our RoCEv2 GID, hop limit 64, the connection's
/// traffic class, port 1.
pub fn ah_attr(path: &CmPath) -> ibv_ah_attr {
    ibv_ah_attr {
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
    }
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
    if v.rc() && v.resp_res > 0 {
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
    let ud = v.qp_type == IBV_QPT_UD;
    let mask = match (state, ud) {
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
            // Linux's CM: a side receives from the PSN it announced
            // (its REQ's or REP's starting PSN) and sends from the one
            // its peer announced.
            a.rq_psn = v.starting_psn & 0xff_ffff;
            a.ah_attr = ah_attr(&path);
            let mut m =
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if v.rc() {
                a.max_dest_rd_atomic = v.resp_res;
                a.min_rnr_timer = MIN_RNR_TIMER;
                m |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            }
            m
        }
        (IBV_QPS_RTS, false) => {
            let (path, _) = v.peer.ok_or(libc::EINVAL)?;
            a.sq_psn = path.peer_psn & 0xff_ffff;
            let mut m = IBV_QP_STATE | IBV_QP_SQ_PSN;
            if v.rc() {
                a.timeout = v.ack_timeout.unwrap_or(path.ack_timeout);
                a.retry_cnt = v.retry_count.min(7);
                a.rnr_retry = v.rnr_retry.min(7);
                a.max_rd_atomic = v.init_depth;
                m |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
            }
            m
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
            qp_type: IBV_QPT_RC,
            qkey: 0,
            resp_res: 4,
            init_depth: 2,
            retry_count: 5,
            rnr_retry: 6,
            starting_psn: 0xabcdef,
            ack_timeout: None,
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
        assert_eq!((a.dest_qp_num, a.rq_psn), (0x99, 0xabcdef));
        assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (4, 0));
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
    fn rts_sends_from_the_peer_s_psn_with_the_path_timeout() {
        let (a, m) = qp_attr(&rc(true), IBV_QPS_RTS).unwrap();
        assert_eq!(a.sq_psn, 0x123456);
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
            qp_type: IBV_QPT_UD,
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
    fn retry_counts_past_7_are_clamped_not_masked() {
        let v = QpView {
            retry_count: 9,
            rnr_retry: 8,
            ..rc(true)
        };
        let (a, _) = qp_attr(&v, IBV_QPS_RTS).unwrap();
        assert_eq!((a.retry_cnt, a.rnr_retry), (7, 7));
    }

    #[test]
    fn the_ack_timeout_option_overrides_the_path_s() {
        let v = QpView {
            ack_timeout: Some(20),
            ..rc(true)
        };
        assert_eq!(qp_attr(&v, IBV_QPS_RTS).unwrap().0.timeout, 20);
        assert_eq!(qp_attr(&rc(true), IBV_QPS_RTS).unwrap().0.timeout, 14);
    }

    #[test]
    fn uc_gets_only_what_the_kernel_gives_uc() {
        let uc = QpView {
            qp_type: IBV_QPT_UC,
            ..rc(true)
        };
        let (a, m) = qp_attr(&uc, IBV_QPS_INIT).unwrap();
        assert_eq!(a.qp_access_flags, IBV_ACCESS_REMOTE_WRITE);
        assert_eq!(
            m as u32,
            IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT
        );
        let (a, m) = qp_attr(&uc, IBV_QPS_RTR).unwrap();
        assert_eq!(
            m as u32,
            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
        );
        assert_eq!((a.max_dest_rd_atomic, a.dest_qp_num), (0, 0x99));
        let (a, m) = qp_attr(&uc, IBV_QPS_RTS).unwrap();
        assert_eq!((a.timeout, a.retry_cnt), (0, 0));
        assert_eq!(m as u32, IBV_QP_STATE | IBV_QP_SQ_PSN);
    }

    #[test]
    fn mtus_round_down_to_a_verbs_mtu() {
        assert_eq!(mtu_enum(1500), IBV_MTU_1024);
        assert_eq!(mtu_enum(4096), IBV_MTU_4096);
        assert_eq!(mtu_enum(9000), IBV_MTU_4096);
        assert_eq!(mtu_enum(256), IBV_MTU_256);
    }
}
