//! Every symbol of Debian's libibverbs.so.1 that this NIC does not
//! provide: each fails with errno `EOPNOTSUPP` in the way its verbs.h
//! declaration reports errors (NULL, the error number, or -1), and never
//! touches its arguments. The README lists them.
//!
//! On x86-64 (System V) a caller's arguments are in registers the callee
//! may ignore, so one argument-less definition serves any C prototype;
//! only the return type matters.
//!
//! The `IBVERBS_PRIVATE_34` symbols are the provider interface (libmlx5
//! and libefa, which perftest loads, call `verbs_register_driver_34` from
//! their constructors): providers register and are never used, because
//! the devices here are the daemon's.

use std::ffi::{c_int, c_void};

use crate::util::set_errno;

const E: c_int = libc::EOPNOTSUPP;

macro_rules! returns_null {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(E);
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! returns_errno {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(E);
            E
        }
    )*};
}

macro_rules! returns_minus_one {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(E);
            -1
        }
    )*};
}

/// Void calls that cannot report failure: they do nothing (what they
/// would act on, a kernel struct or an imported object, cannot exist
/// here).
macro_rules! does_nothing {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {
            set_errno(E);
        }
    )*};
}

returns_null!(
    ibv_get_sysfs_path,
    ibv_import_device,
    ibv_import_mr,
    ibv_import_pd,
    ibv_import_dm,
    ibv_reg_dmabuf_mr,
    ibv_qp_to_qp_ex,
    _verbs_init_and_alloc_context,
    verbs_open_device,
);

returns_errno!(
    ibv_resize_cq,
    ibv_resolve_eth_l2_from_gid,
    ibv_query_ece,
    ibv_set_ece,
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

returns_minus_one!(
    ibv_read_sysfs_file,
    ibv_read_ibdev_sysfs_file,
    // IBV_REREG_MR_ERR_INPUT.
    ibv_rereg_mr,
);

does_nothing!(
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_ah_attr_from_kern,
    ibv_unimport_mr,
    ibv_unimport_pd,
    ibv_unimport_dm,
    __verbs_log,
    verbs_init_cq,
    verbs_set_ops,
    verbs_uninit_context,
);

/// `ioctl` attribute counting of the provider interface; nothing here
/// builds ioctl commands.
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs() -> u32 {
    set_errno(E);
    0
}

/// A provider registering itself (libmlx5, libefa from their
/// constructors): accepted and ignored.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// Read by providers only.
#[no_mangle]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// Whether QP data lands in order: 0 is "no guarantee", which is always
/// true to say.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}
