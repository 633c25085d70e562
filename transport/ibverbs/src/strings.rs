//! The pure helpers of libibverbs: names of enums (`ibv_*_str`), static
//! rate conversions, and fork support.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sys::*;

macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ibv_node_type) -> *const c_char {
    match t {
        IBV_NODE_CA => cstr!("InfiniBand channel adapter"),
        IBV_NODE_SWITCH => cstr!("InfiniBand switch"),
        IBV_NODE_ROUTER => cstr!("InfiniBand router"),
        IBV_NODE_RNIC => cstr!("iWARP NIC"),
        IBV_NODE_USNIC => cstr!("usNIC"),
        IBV_NODE_USNIC_UDP => cstr!("usNIC UDP"),
        IBV_NODE_UNSPECIFIED => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ibv_port_state) -> *const c_char {
    match s {
        IBV_PORT_NOP => cstr!("PORT_NOP"),
        IBV_PORT_DOWN => cstr!("PORT_DOWN"),
        IBV_PORT_INIT => cstr!("PORT_INIT"),
        IBV_PORT_ARMED => cstr!("PORT_ARMED"),
        IBV_PORT_ACTIVE => cstr!("PORT_ACTIVE"),
        IBV_PORT_ACTIVE_DEFER => cstr!("PORT_ACTIVE_DEFER"),
        _ => cstr!("invalid state"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ibv_event_type) -> *const c_char {
    match e {
        IBV_EVENT_CQ_ERR => cstr!("CQ error"),
        IBV_EVENT_QP_FATAL => cstr!("local work queue catastrophic error"),
        IBV_EVENT_QP_REQ_ERR => cstr!("invalid request local work queue error"),
        IBV_EVENT_QP_ACCESS_ERR => cstr!("local access violation work queue error"),
        IBV_EVENT_COMM_EST => cstr!("communication established"),
        IBV_EVENT_SQ_DRAINED => cstr!("send queue drained"),
        IBV_EVENT_PATH_MIG => cstr!("path migrated"),
        IBV_EVENT_PATH_MIG_ERR => cstr!("path migration request error"),
        IBV_EVENT_DEVICE_FATAL => cstr!("local catastrophic error"),
        IBV_EVENT_PORT_ACTIVE => cstr!("port active"),
        IBV_EVENT_PORT_ERR => cstr!("port error"),
        IBV_EVENT_LID_CHANGE => cstr!("LID change"),
        IBV_EVENT_PKEY_CHANGE => cstr!("P_Key change"),
        IBV_EVENT_SM_CHANGE => cstr!("SM change"),
        IBV_EVENT_SRQ_ERR => cstr!("SRQ catastrophic error"),
        IBV_EVENT_SRQ_LIMIT_REACHED => cstr!("SRQ limit reached"),
        IBV_EVENT_QP_LAST_WQE_REACHED => cstr!("last WQE reached"),
        IBV_EVENT_CLIENT_REREGISTER => cstr!("client reregistration"),
        IBV_EVENT_GID_CHANGE => cstr!("GID table change"),
        IBV_EVENT_WQ_FATAL => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(s: ibv_wc_status) -> *const c_char {
    match s {
        IBV_WC_SUCCESS => cstr!("success"),
        IBV_WC_LOC_LEN_ERR => cstr!("local length error"),
        IBV_WC_LOC_QP_OP_ERR => cstr!("local QP operation error"),
        IBV_WC_LOC_EEC_OP_ERR => cstr!("local EE context operation error"),
        IBV_WC_LOC_PROT_ERR => cstr!("local protection error"),
        IBV_WC_WR_FLUSH_ERR => cstr!("Work Request Flushed Error"),
        IBV_WC_MW_BIND_ERR => cstr!("memory management operation error"),
        IBV_WC_BAD_RESP_ERR => cstr!("bad response error"),
        IBV_WC_LOC_ACCESS_ERR => cstr!("local access error"),
        IBV_WC_REM_INV_REQ_ERR => cstr!("remote invalid request error"),
        IBV_WC_REM_ACCESS_ERR => cstr!("remote access error"),
        IBV_WC_REM_OP_ERR => cstr!("remote operation error"),
        IBV_WC_RETRY_EXC_ERR => cstr!("transport retry counter exceeded"),
        IBV_WC_RNR_RETRY_EXC_ERR => cstr!("RNR retry counter exceeded"),
        IBV_WC_LOC_RDD_VIOL_ERR => cstr!("local RDD violation error"),
        IBV_WC_REM_INV_RD_REQ_ERR => cstr!("remote invalid RD request"),
        IBV_WC_REM_ABORT_ERR => cstr!("aborted error"),
        IBV_WC_INV_EECN_ERR => cstr!("invalid EE context number"),
        IBV_WC_INV_EEC_STATE_ERR => cstr!("invalid EE context state"),
        IBV_WC_FATAL_ERR => cstr!("fatal error"),
        IBV_WC_RESP_TIMEOUT_ERR => cstr!("response timeout error"),
        IBV_WC_GENERAL_ERR => cstr!("general error"),
        IBV_WC_TM_ERR => cstr!("TM error"),
        IBV_WC_TM_RNDV_INCOMPLETE => cstr!("TM software rendezvous"),
        _ => cstr!("unknown"),
    }
}

/// Static rates: the enum, its multiple of 2.5 Gb/s (None: not a
/// multiple) and its rate in Mb/s.
const RATES: &[(ibv_rate, Option<c_int>, c_int)] = &[
    (IBV_RATE_2_5_GBPS, Some(1), 2500),
    (IBV_RATE_5_GBPS, Some(2), 5000),
    (IBV_RATE_10_GBPS, Some(4), 10000),
    (IBV_RATE_20_GBPS, Some(8), 20000),
    (IBV_RATE_30_GBPS, Some(12), 30000),
    (IBV_RATE_40_GBPS, Some(16), 40000),
    (IBV_RATE_60_GBPS, Some(24), 60000),
    (IBV_RATE_80_GBPS, Some(32), 80000),
    (IBV_RATE_120_GBPS, Some(48), 120000),
    (IBV_RATE_14_GBPS, None, 14062),
    (IBV_RATE_56_GBPS, None, 56250),
    (IBV_RATE_112_GBPS, None, 112500),
    (IBV_RATE_168_GBPS, None, 168750),
    (IBV_RATE_25_GBPS, None, 25781),
    (IBV_RATE_100_GBPS, None, 103125),
    (IBV_RATE_200_GBPS, None, 206250),
    (IBV_RATE_300_GBPS, None, 309375),
    (IBV_RATE_28_GBPS, Some(11), 28125),
    (IBV_RATE_50_GBPS, Some(20), 53125),
    (IBV_RATE_400_GBPS, Some(160), 425000),
    (IBV_RATE_600_GBPS, Some(240), 637500),
    (IBV_RATE_800_GBPS, Some(320), 850000),
    (IBV_RATE_1200_GBPS, Some(480), 1275000),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate)
        .and_then(|r| r.1)
        .unwrap_or(-1)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == Some(mult))
        .map_or(IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// Set by `ibv_fork_init`: registered memory is then kept out of forked
/// children (MADV_DONTFORK), as libibverbs does.
pub static FORK_INIT: AtomicBool = AtomicBool::new(false);

#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    FORK_INIT.store(true, Ordering::Relaxed);
    0
}

#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    if FORK_INIT.load(Ordering::Relaxed) {
        IBV_FORK_ENABLED
    } else {
        IBV_FORK_DISABLED
    }
}

fn madvise_range(base: *mut c_void, size: usize, advice: c_int) -> c_int {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = base as usize & !(page - 1);
    let Some(end) = (base as usize).checked_add(size) else {
        return libc::EINVAL;
    };
    let end = end.div_ceil(page) * page;
    // SAFETY: madvise only changes how the kernel treats the range on
    // fork; it fails cleanly (ENOMEM) on unmapped addresses.
    if unsafe { libc::madvise(start as *mut c_void, end - start, advice) } != 0 {
        return std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
    }
    0
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    madvise_range(base, size, libc::MADV_DONTFORK)
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    madvise_range(base, size, libc::MADV_DOFORK)
}
