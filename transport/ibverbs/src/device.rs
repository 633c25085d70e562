//! Device discovery: `ibv_get_device_list` asks the daemon (its socket is
//! `$RNIC_SOCKET` or the default) which devices it serves and hands out
//! one `struct ibv_device` per device. Device structs live as long as the
//! process (applications keep pointers to them past
//! `ibv_free_device_list`), one per name and socket.

use std::ffi::{c_char, c_int};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use verbs::DeviceInfo;

use crate::sys::*;
use crate::util::{copy_cstr, guard, set_errno, warn};

/// A device: the C struct first, so a `*mut ibv_device` is a `*mut Dev`.
#[repr(C)]
pub struct Dev {
    pub ibv: ibv_device,
    pub info: DeviceInfo,
    pub socket: PathBuf,
    pub index: c_int,
}

static DEVICES: Mutex<Vec<&'static Dev>> = Mutex::new(Vec::new());

/// Whether the "no daemon" line was printed already.
static WARNED: AtomicBool = AtomicBool::new(false);

impl Dev {
    /// The device behind a pointer the application got from us.
    ///
    /// # Safety
    /// `p` is NULL or a device pointer from `ibv_get_device_list`.
    pub unsafe fn from_ptr<'a>(p: *const ibv_device) -> Option<&'a Dev> {
        // SAFETY: by the contract, a non-NULL `p` points at the `ibv`
        // field (offset 0) of a leaked, never freed `Dev`.
        unsafe { p.cast::<Dev>().as_ref() }
    }

    /// The node GUID: the EUI-64 of the port's MAC (as rxe derives it),
    /// in network byte order.
    pub fn guid_bytes(&self) -> [u8; 8] {
        eui64(self.info.mac)
    }
}

/// The modified EUI-64 of a MAC address.
pub fn eui64(m: [u8; 6]) -> [u8; 8] {
    transport::wire::MacAddr(m).eui64()
}

/// The device for `info` on `socket`, made once and kept.
fn intern(info: DeviceInfo, socket: &PathBuf, index: c_int) -> &'static Dev {
    let mut all = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = all
        .iter()
        .find(|d| d.info == info && &d.socket == socket && d.index == index)
    {
        return d;
    }
    let mut ibv = ibv_device {
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        ..Default::default()
    };
    copy_cstr(&mut ibv.name, &info.name);
    copy_cstr(&mut ibv.dev_name, &format!("rnic-{}", info.name));
    let d: &'static Dev = Box::leak(Box::new(Dev {
        ibv,
        info,
        socket: socket.clone(),
        index,
    }));
    all.push(d);
    d
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let socket = verbs::socket_path();
        let list = match verbs::list_devices(&socket) {
            Ok(l) => l,
            Err(e) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    warn(&format!(
                        "no devices: no rnic daemon answers on {} ({e}); start one \
                         (dataplane --config FILE --serve) or point {} at its socket",
                        socket.display(),
                        verbs::SOCKET_ENV
                    ));
                }
                Vec::new()
            }
        };
        let devs: Vec<&'static Dev> = list
            .into_iter()
            .enumerate()
            .map(|(i, info)| intern(info, &socket, i as c_int))
            .collect();
        // SAFETY: calloc of n + 1 pointer slots (zeroed: the terminating
        // NULL); freed by ibv_free_device_list with free().
        let arr = unsafe {
            libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_device>())
                as *mut *mut ibv_device
        };
        if arr.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: i < n, inside the allocation.
            unsafe { *arr.add(i) = &d.ibv as *const ibv_device as *mut ibv_device };
        }
        if !num.is_null() {
            // SAFETY: the caller passes NULL or a valid int.
            unsafe { *num = devs.len() as c_int };
        }
        arr
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL).
    unsafe { libc::free(list.cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    // SAFETY: a device pointer of ours or NULL.
    match unsafe { Dev::from_ptr(device) } {
        Some(d) => d.ibv.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    // SAFETY: a device pointer of ours or NULL.
    match unsafe { Dev::from_ptr(device) } {
        Some(d) => u64::from_ne_bytes(d.guid_bytes()),
        None => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    // SAFETY: a device pointer of ours or NULL.
    match unsafe { Dev::from_ptr(device) } {
        Some(d) => d.index,
        None => -1,
    }
}
