//! The devices, found once per process on the first call that needs them
//! (`Request::ListDevices` for each device's name, address and MTU; the
//! `struct ibv_device` of the same name from `ibv_get_device_list`), and
//! what the library keeps per device for the process's life as rdma-core
//! does: the verbs context (opened on first use, never closed), the
//! device's READ/atomic depths, one PD shared by the ids that create QPs
//! without one (refcounted), and the rdma_cm session. Also which device
//! an address resolves from, and `rdma_get_devices` / `rdma_free_devices`.

use std::ffi::{c_int, CStr};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use crate::daemon::Session;
use crate::sys::*;
use crate::util::{fail, guard, set_errno, warn};

/// A verbs context and the device limits rdma_cm needs from it.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    pub ctx: *mut ibv_context,
    /// `max_qp_rd_atom`: READs/atomics the device answers per QP.
    pub max_resp: u8,
    /// `max_qp_init_rd_atom`: READs/atomics a QP may have outstanding.
    pub max_init: u8,
}

/// One device of the daemon.
pub struct Device {
    pub name: String,
    pub ip: Ipv4Addr,
    pub max_mtu: u32,
    ibdev: usize,
    opened: Mutex<Option<Opened>>,
    /// The shared PD and how many ids hold it.
    pd: Mutex<(usize, u32)>,
    session: Mutex<Option<Arc<Session>>>,
}

// SAFETY: the raw pointers (kept as addresses) are libibverbs objects
// that live for the process and that libibverbs lets any thread use; the
// mutable parts sit behind mutexes.
unsafe impl Sync for Opened {}
// SAFETY: as above.
unsafe impl Send for Opened {}

impl Device {
    /// A device of the daemon (`ibdev`: its `struct ibv_device`, 0 for
    /// none), nothing opened yet.
    fn new(name: String, ip: Ipv4Addr, max_mtu: u32, ibdev: usize) -> Device {
        Device {
            name,
            ip,
            max_mtu,
            ibdev,
            opened: Mutex::new(None),
            pd: Mutex::new((0, 0)),
            session: Mutex::new(None),
        }
    }

    /// The verbs context, opened on first use.
    pub fn open(&self) -> Result<Opened, i32> {
        let mut o = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = *o {
            return Ok(v);
        }
        if self.ibdev == 0 {
            // A device without a verbs device (the tests' daemon's).
            return Ok(Opened {
                ctx: std::ptr::null_mut(),
                max_resp: 16,
                max_init: 16,
            });
        }
        // SAFETY: a device pointer from ibv_get_device_list, whose list we
        // never free.
        let ctx = unsafe { ibv_open_device(self.ibdev as *mut ibv_device) };
        if ctx.is_null() {
            return fail(libc::ENODEV, || {
                format!("ibv_open_device({}) failed", self.name)
            });
        }
        let mut attr = ibv_device_attr::default();
        // SAFETY: a context just opened and our struct.
        let r = unsafe { ibv_query_device(ctx, &mut attr) };
        let (max_resp, max_init) = if r == 0 {
            (
                attr.max_qp_rd_atom.clamp(0, 255) as u8,
                attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            )
        } else {
            (16, 16)
        };
        let v = Opened {
            ctx,
            max_resp,
            max_init,
        };
        *o = Some(v);
        Ok(v)
    }

    /// Takes a reference on the device's shared PD (allocated on the
    /// first).
    pub fn hold_pd(&self) -> Result<*mut ibv_pd, i32> {
        let ctx = self.open()?.ctx;
        let mut pd = self.pd.lock().unwrap_or_else(|p| p.into_inner());
        if pd.0 == 0 && !ctx.is_null() {
            // SAFETY: an open context of ours.
            let p = unsafe { ibv_alloc_pd(ctx) };
            if p.is_null() {
                return fail(crate::util::errno_or(libc::ENOMEM), || {
                    format!("ibv_alloc_pd({}) failed", self.name)
                });
            }
            pd.0 = p as usize;
        }
        pd.1 += 1;
        Ok(pd.0 as *mut ibv_pd)
    }

    /// Gives back a reference on the shared PD; the last frees it.
    pub fn release_pd(&self) {
        let mut pd = self.pd.lock().unwrap_or_else(|p| p.into_inner());
        if pd.1 == 0 {
            return;
        }
        pd.1 -= 1;
        if pd.1 == 0 && pd.0 != 0 {
            // SAFETY: the PD we allocated; nobody holds it any more (a QP
            // still on it makes the call fail, and we forget it anyway).
            unsafe { ibv_dealloc_pd(pd.0 as *mut ibv_pd) };
            pd.0 = 0;
        }
    }

    /// The device's rdma_cm session, opened on first use (again after
    /// the previous one broke).
    pub fn session(&self) -> Result<Arc<Session>, i32> {
        let mut s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cur) = s.as_ref() {
            if !cur.is_broken() {
                return Ok(cur.clone());
            }
        }
        match Session::open(&self.name) {
            Ok(new) => {
                let new = Arc::new(new);
                *s = Some(new.clone());
                Ok(new)
            }
            Err(e) => fail(e.errno, || {
                format!("rdma_cm session on {}: {}", self.name, e.why)
            }),
        }
    }

    /// The session with the daemon's number `n`, if it is this device's.
    fn session_numbered(&self, n: u64) -> Option<Arc<Session>> {
        let s = self.session.lock().unwrap_or_else(|p| p.into_inner());
        s.as_ref().filter(|s| s.number == n).cloned()
    }
}

/// The process's devices, in the daemon's order.
pub struct Devices {
    pub list: Vec<Device>,
}

impl Devices {
    pub fn by_ip(&self, ip: Ipv4Addr) -> Option<&Device> {
        self.list.iter().find(|d| d.ip == ip)
    }

    /// The device to reach `dst` from, when the application named no
    /// source ([`choose_for_dst`]).
    pub fn for_dst(&self, dst: Ipv4Addr) -> &Device {
        let ips: Vec<Ipv4Addr> = self.list.iter().map(|d| d.ip).collect();
        &self.list[choose_for_dst(&ips, dst)]
    }

    /// The device and session an event names by its session number.
    pub fn by_session(&self, n: u64) -> Option<(&Device, Arc<Session>)> {
        self.list
            .iter()
            .find_map(|d| d.session_numbered(n).map(|s| (d, s)))
    }
}

/// Which of the devices (their addresses, in order; not empty) reaches
/// `dst`: the only one; else the first in dst's /24 that is not dst
/// itself (the loopback testbed's other port); else the one owning dst;
/// else the first.
pub fn choose_for_dst(ips: &[Ipv4Addr], dst: Ipv4Addr) -> usize {
    if ips.len() <= 1 {
        return 0;
    }
    let net = |ip: Ipv4Addr| u32::from(ip) >> 8;
    if let Some(i) = ips.iter().position(|&ip| ip != dst && net(ip) == net(dst)) {
        return i;
    }
    ips.iter().position(|&ip| ip == dst).unwrap_or(0)
}

static DEVICES: Mutex<Option<&'static Devices>> = Mutex::new(None);

/// Makes the process's devices these, without verbs devices (for tests
/// against a scripted daemon).
#[cfg(test)]
pub fn install_without_verbs(devs: &[(&str, Ipv4Addr)]) {
    let list = devs
        .iter()
        .map(|&(name, ip)| Device::new(name.to_string(), ip, 1024, 0))
        .collect();
    *DEVICES.lock().unwrap_or_else(|p| p.into_inner()) =
        Some(Box::leak(Box::new(Devices { list })));
}

/// The devices, found on the first call (ENODEV while no daemon answers
/// or it serves none; tried again on the next call).
pub fn get() -> Result<&'static Devices, i32> {
    let mut g = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = *g {
        return Ok(d);
    }
    let socket = verbs::socket_path();
    let infos = match verbs::list_devices(&socket) {
        Ok(l) if !l.is_empty() => l,
        Ok(_) => return fail(libc::ENODEV, || "the daemon serves no device".into()),
        Err(e) => {
            return fail(libc::ENODEV, || {
                format!(
                    "no rnic daemon answers on {} ({e}); start one or set {}",
                    socket.display(),
                    verbs::SOCKET_ENV
                )
            })
        }
    };
    let mut n: c_int = 0;
    // SAFETY: libibverbs' own call; the list is kept for the process's
    // life (device pointers must stay valid while contexts exist).
    let arr = unsafe { ibv_get_device_list(&mut n) };
    let mut ibdevs = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: i < n entries of the array libibverbs returned.
        let d = unsafe { *arr.add(i) };
        // SAFETY: a device of the list; its name is a C string.
        let name = unsafe { ibv_get_device_name(d) };
        if !name.is_null() {
            // SAFETY: non-NULL C string owned by the device.
            let s = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            ibdevs.push((s, d as usize));
        }
    }
    let mut list = Vec::new();
    for info in infos {
        match ibdevs.iter().find(|(s, _)| *s == info.name) {
            Some(&(_, ibdev)) => list.push(Device::new(info.name, info.ip, info.max_mtu, ibdev)),
            None => warn(&format!(
                "libibverbs has no device {}: is rnic's libibverbs.so.1 first on LD_LIBRARY_PATH?",
                info.name
            )),
        }
    }
    if list.is_empty() {
        return Err(libc::ENODEV);
    }
    let d: &'static Devices = Box::leak(Box::new(Devices { list }));
    *g = Some(d);
    Ok(d)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        // No daemon (or no device): NULL with ENODEV, as rdma-core's
        // without devices; else the contexts that open (maybe none).
        let opened: Vec<*mut ibv_context> = match get() {
            Ok(d) => d
                .list
                .iter()
                .filter_map(|dev| dev.open().ok().map(|o| o.ctx))
                .collect(),
            Err(e) => {
                set_errno(e);
                if !num_devices.is_null() {
                    // SAFETY: the caller's int.
                    unsafe { *num_devices = 0 };
                }
                return std::ptr::null_mut();
            }
        };
        // SAFETY: calloc of n + 1 pointer slots (the last stays NULL);
        // rdma_free_devices frees it with free().
        let p = unsafe { libc::calloc(opened.len() + 1, std::mem::size_of::<usize>()) };
        let arr = p.cast::<*mut ibv_context>();
        if arr.is_null() {
            set_errno(libc::ENOMEM);
        }
        if !arr.is_null() {
            for (i, c) in opened.iter().enumerate() {
                // SAFETY: i < n, inside the allocation.
                unsafe { *arr.add(i) = *c };
            }
        }
        if !num_devices.is_null() {
            let n = if arr.is_null() { 0 } else { opened.len() };
            // SAFETY: the caller's int.
            unsafe { *num_devices = n as c_int };
        }
        arr
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: `list` came from rdma_get_devices's calloc (or is NULL); the
    // contexts stay open, as rdma-core keeps them.
    unsafe { libc::free(list.cast()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(v: &[[u8; 4]]) -> Vec<Ipv4Addr> {
        v.iter().map(|&o| Ipv4Addr::from(o)).collect()
    }

    #[test]
    fn the_only_device_reaches_everything() {
        let one = ips(&[[10, 0, 0, 1]]);
        assert_eq!(choose_for_dst(&one, Ipv4Addr::new(10, 0, 0, 1)), 0);
        assert_eq!(choose_for_dst(&one, Ipv4Addr::new(192, 168, 1, 1)), 0);
    }

    #[test]
    fn a_peer_in_the_same_slash_24_is_reached_from_the_other_port() {
        let two = ips(&[[10, 0, 0, 1], [10, 0, 0, 2]]);
        assert_eq!(choose_for_dst(&two, Ipv4Addr::new(10, 0, 0, 2)), 0);
        assert_eq!(choose_for_dst(&two, Ipv4Addr::new(10, 0, 0, 1)), 1);
        assert_eq!(choose_for_dst(&two, Ipv4Addr::new(10, 0, 0, 9)), 0);
    }

    #[test]
    fn otherwise_the_owner_then_the_first() {
        let two = ips(&[[10, 0, 0, 1], [10, 0, 1, 1]]);
        assert_eq!(choose_for_dst(&two, Ipv4Addr::new(10, 0, 1, 1)), 1);
        assert_eq!(choose_for_dst(&two, Ipv4Addr::new(127, 0, 0, 1)), 0);
    }
}
