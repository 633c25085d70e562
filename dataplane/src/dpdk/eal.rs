//! EAL initialisation (once per process) and the TSC clock.

use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, Ordering};

use super::DpdkError;

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// The initialised EAL. Dropping it runs `rte_eal_cleanup`; every mempool,
/// mbuf and port must be dropped first (they borrow nothing from it, so the
/// owner keeps the order: ports, then mbufs, then pools, then the EAL).
#[derive(Debug)]
pub struct Eal {
    _private: (),
}

impl Eal {
    /// Initialises the EAL with `args` (without the program name). Fails if
    /// the EAL was already initialised in this process.
    pub fn init(args: &[String]) -> Result<Eal, DpdkError> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(DpdkError {
                what: "rte_eal_init".into(),
                reason: "the EAL can be initialised once per process".into(),
            });
        }
        let mut owned = vec![CString::new("rnic").expect("no NUL")];
        for a in args {
            owned.push(CString::new(a.as_str()).map_err(|_| DpdkError {
                what: "rte_eal_init".into(),
                reason: format!("argument {a:?} contains a NUL byte"),
            })?);
        }
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr() as *mut c_char).collect();
        // SAFETY: argv holds pointers to NUL-terminated strings owned by
        // `owned`, which outlives the call; the EAL may permute the pointer
        // array (ours, never reused) and keeps no pointer into it after
        // returning except to strings it copies.
        let n = unsafe { dpdk_sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if n < 0 {
            INITIALISED.store(false, Ordering::SeqCst);
            return Err(DpdkError::last("rte_eal_init", 0));
        }
        std::mem::forget(owned); // the EAL may keep pointers to its arguments
        Ok(Eal { _private: () })
    }

    /// Number of ethdev ports.
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialised (we hold `Eal`).
        unsafe { dpdk_sys::rte_eth_dev_count_avail() }
    }

    /// The calling thread's lcore id.
    pub fn lcore_id(&self) -> u32 {
        // SAFETY: reads a per-thread variable set by the EAL.
        unsafe { dpdk_sys::rnic_lcore_id() }
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: the EAL was initialised by `init`; the owner dropped every
        // DPDK object before the EAL (documented contract).
        unsafe {
            dpdk_sys::rte_eal_cleanup();
        }
    }
}

/// Nanoseconds from the TSC, calibrated by the EAL at start.
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    start: u64,
    hz: u64,
    /// Nanoseconds per tick, in 32.32 fixed point (see [`ns_of_ticks`]).
    ns_per_tick: u64,
}

impl TscClock {
    /// A clock whose zero is now.
    pub fn new(_eal: &Eal) -> Self {
        // SAFETY: the EAL is initialised; both read the TSC / its rate.
        let (start, hz) = unsafe { (dpdk_sys::rnic_rdtsc(), dpdk_sys::rte_get_tsc_hz()) };
        let hz = hz.max(1);
        TscClock {
            start,
            hz,
            ns_per_tick: ns_per_tick(hz),
        }
    }

    /// TSC ticks per second.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// Nanoseconds since the clock was made (read once per pass: a
    /// multiply and a shift, no division).
    pub fn now_ns(&self) -> u64 {
        // SAFETY: reads the TSC.
        let t = unsafe { dpdk_sys::rnic_rdtsc() };
        ns_of_ticks(t.wrapping_sub(self.start), self.ns_per_tick)
    }
}

/// 1e9 / `hz` in 32.32 fixed point (fits 64 bits for any `hz` >= 1).
fn ns_per_tick(hz: u64) -> u64 {
    ((1_000_000_000u128 << 32) / u128::from(hz.max(1))) as u64
}

/// `ticks` in nanoseconds at `ns_per_tick` (from [`ns_per_tick`]): at
/// most the exact quotient, and short of it by less than hz / 1e9 parts
/// in 2^32 of it, plus one.
fn ns_of_ticks(ticks: u64, ns_per_tick: u64) -> u64 {
    ((u128::from(ticks) * u128::from(ns_per_tick)) >> 32) as u64
}

/// The CPU's time-stamp counter (the same count in every process of the
/// machine: traces of the daemon and an application line up). Needs no
/// EAL; [`TscClock::hz`] converts it.
pub fn rdtsc() -> u64 {
    // SAFETY: reads the TSC; no memory is touched.
    unsafe { dpdk_sys::rnic_rdtsc() }
}

/// The calling thread registered as a DPDK lcore (so that it gets an lcore
/// id and per-lcore mempool caches); unregistered on drop. The pipelined
/// layout's RX and TX pipe threads hold one each.
#[derive(Debug)]
pub struct LcoreGuard {
    pub lcore_id: u32,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl LcoreGuard {
    /// Registers the calling thread. The pool is the proof that the EAL is
    /// initialised (pools exist only after `Eal::init`).
    pub fn register(_pool: &super::Mempool) -> Result<LcoreGuard, DpdkError> {
        // SAFETY: the EAL is initialised (a pool exists); registering a
        // non-EAL thread is allowed in a primary process.
        let rc = unsafe { dpdk_sys::rte_thread_register() };
        if rc != 0 {
            return Err(DpdkError::last("rte_thread_register", 0));
        }
        // SAFETY: reads a per-thread variable the EAL just set.
        let lcore_id = unsafe { dpdk_sys::rnic_lcore_id() };
        Ok(LcoreGuard {
            lcore_id,
            _not_send: std::marker::PhantomData,
        })
    }
}

/// Asks the kernel for an EEVDF slice of `ns` for the calling thread (an
/// lcore that sleeps and is woken while applications spin on its CPU:
/// with a short slice its deadline comes first and it preempts them when
/// woken, instead of waiting out their slice, milliseconds).
pub fn request_thread_slice(ns: u64) -> std::io::Result<()> {
    // SAFETY: the shim's system call reads only its own stack struct.
    match unsafe { dpdk_sys::rnic_thread_slice(ns) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Moves the calling thread to SCHED_FIFO at `priority` (1 to 99), or
/// with 0 back to SCHED_OTHER: a woken real-time lcore runs at once,
/// ahead of every application thread spinning on its CPU.
pub fn request_thread_fifo(priority: i32) -> std::io::Result<()> {
    // SAFETY: the shim's system call reads only its own stack struct.
    match unsafe { dpdk_sys::rnic_thread_fifo(priority) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

impl Drop for LcoreGuard {
    fn drop(&mut self) {
        // SAFETY: this thread registered itself in `register` (the guard
        // is not Send, so this runs on the same thread).
        unsafe { dpdk_sys::rte_thread_unregister() }
    }
}

#[cfg(test)]
mod clock_tests {
    use super::{ns_of_ticks, ns_per_tick};

    #[test]
    fn fixed_point_nanoseconds_match_the_exact_quotient() {
        for hz in [1u64, 1_000_000, 2_445_000_000, 3_000_000_000, 4_194_304_000] {
            let k = ns_per_tick(hz);
            for ticks in [0u64, 1, 999, hz, 3600 * hz, 365 * 86_400 * hz] {
                let exact = (u128::from(ticks) * 1_000_000_000 / u128::from(hz)) as u64;
                let got = ns_of_ticks(ticks, k);
                let slack =
                    (u128::from(exact) * u128::from(hz) / (1_000_000_000u128 << 32)) as u64 + 1;
                assert!(
                    got <= exact && exact - got <= slack,
                    "{ticks} ticks at {hz} Hz: {got} ns, exact {exact}"
                );
            }
        }
    }
}
