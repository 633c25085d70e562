//! Multicast joins (`rdma_join_multicast`, `_ex`, `rdma_leave_multicast`):
//! the daemon contract has no multicast request, so each fails with
//! ENOSYS (EINVAL for a NULL id, as rdma-core would fault instead).

use std::ffi::{c_int, c_void};

use crate::sys::*;
use crate::util::{guard, ret};

fn unsupported(id: *mut rdma_cm_id) -> c_int {
    ret(Err(if id.is_null() {
        libc::EINVAL
    } else {
        libc::ENOSYS
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    _addr: *mut sockaddr,
    _context: *mut c_void,
) -> c_int {
    guard(-1, || unsupported(id))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    _mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    _context: *mut c_void,
) -> c_int {
    guard(-1, || unsupported(id))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, _addr: *mut sockaddr) -> c_int {
    guard(-1, || unsupported(id))
}
