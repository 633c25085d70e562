//! EAL smoke test: initialise DPDK without hugepages or PCI on a net_ring
//! port (whose RX and TX share one ring, so it loops back), send a burst to
//! ourselves, receive it, check every byte and that the shim's mbuf helpers
//! agree with the mbuf fields, and give every mbuf back.
//!
//! The EAL can be initialised once per process, so this is one test with
//! its own `main` (harness = false).

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr;

use dpdk_sys::*;

const BURST: usize = 32;
const POOL_SIZE: u32 = 1023;

fn fail(what: &str) -> ! {
    // SAFETY: rnic_errno reads the per-lcore rte_errno; rte_strerror returns
    // a pointer to a static or thread-local NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(rte_strerror(rnic_errno())) };
    panic!("{what} failed: {}", msg.to_string_lossy());
}

fn frame(i: usize) -> Vec<u8> {
    (0..60 + i).map(|b| (b * 7 + i) as u8).collect()
}

fn main() {
    let prefix = format!("--file-prefix=dpdk-sys-smoke-{}", std::process::id());
    let args: Vec<CString> = [
        "eal_smoke",
        "--no-huge",
        "--no-pci",
        "--no-telemetry",
        "-m",
        "64",
        "--vdev=net_ring0",
        prefix.as_str(),
        "--log-level=lib.eal:warning",
    ]
    .iter()
    .map(|s| CString::new(*s).unwrap())
    .collect();
    let mut argv: Vec<*mut c_char> = args.iter().map(|s| s.as_ptr() as *mut c_char).collect();

    // SAFETY: argv points at NUL-terminated strings that outlive the EAL; the
    // EAL may permute the pointer array, which we own and never reuse.
    let n = unsafe { rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if n < 0 {
        fail("rte_eal_init");
    }

    // SAFETY: all calls below happen on the main lcore after a successful
    // rte_eal_init; every pointer passed is either from DPDK or a live local.
    unsafe {
        assert_eq!(rte_eth_dev_count_avail(), 1, "net_ring0 is the only port");
        let port: u16 = 0;
        let socket = rte_eth_dev_socket_id(port);
        let pool_name = CString::new("smoke_pool").unwrap();
        let pool = rte_pktmbuf_pool_create(
            pool_name.as_ptr(),
            POOL_SIZE,
            32,
            0,
            consts::MBUF_DEFAULT_BUF_SIZE as u16,
            socket,
        );
        if pool.is_null() {
            fail("rte_pktmbuf_pool_create");
        }

        let conf = rte_eth_conf::default();
        if rte_eth_dev_configure(port, 1, 1, &conf) != 0 {
            fail("rte_eth_dev_configure");
        }
        if rte_eth_rx_queue_setup(port, 0, 256, socket as u32, ptr::null(), pool) != 0 {
            fail("rte_eth_rx_queue_setup");
        }
        if rte_eth_tx_queue_setup(port, 0, 256, socket as u32, ptr::null()) != 0 {
            fail("rte_eth_tx_queue_setup");
        }
        if rte_eth_dev_start(port) != 0 {
            fail("rte_eth_dev_start");
        }
        assert_eq!(rnic_lcore_id(), 0, "the main lcore runs main()");
        assert!(rte_get_tsc_hz() > 0);
        let t0 = rnic_rdtsc();

        let mut tx: [*mut rte_mbuf; BURST] = [ptr::null_mut(); BURST];
        if rnic_pktmbuf_alloc_bulk(pool, tx.as_mut_ptr(), BURST as u32) != 0 {
            fail("rnic_pktmbuf_alloc_bulk");
        }
        for (i, &m) in tx.iter().enumerate() {
            let f = frame(i);
            let room = rnic_pktmbuf_tailroom(m);
            let dst = rnic_pktmbuf_append(m, f.len() as u16);
            assert!(!dst.is_null(), "append within the tailroom");
            // mtod is buf_addr + data_off, and append grew the data by len.
            let start = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
            assert_eq!(rnic_pktmbuf_mtod(m) as *mut u8, start);
            assert_eq!(dst as *mut u8, start);
            assert_eq!(rnic_pktmbuf_headroom(m), (*m).data_off);
            assert_eq!(usize::from(rnic_pktmbuf_data_len(m)), f.len());
            assert_eq!(usize::from((*m).data_len), f.len());
            assert_eq!(rnic_pktmbuf_pkt_len(m) as usize, f.len());
            assert_eq!(
                usize::from(rnic_pktmbuf_tailroom(m)),
                usize::from(room) - f.len()
            );
            ptr::copy_nonoverlapping(f.as_ptr(), dst as *mut u8, f.len());
        }
        // One extra mbuf: appended past its room fails, trimmed back works.
        let extra = rnic_pktmbuf_alloc(pool);
        assert!(!extra.is_null());
        assert!(rnic_pktmbuf_append(extra, rnic_pktmbuf_tailroom(extra) + 1).is_null());
        assert!(!rnic_pktmbuf_append(extra, 10).is_null());
        assert_eq!(rnic_pktmbuf_trim(extra, 4), 0);
        assert_eq!(rnic_pktmbuf_data_len(extra), 6);
        rnic_pktmbuf_free(extra);

        let sent = usize::from(rnic_tx_burst(port, 0, tx.as_mut_ptr(), BURST as u16));
        if sent < BURST {
            rte_pktmbuf_free_bulk(tx.as_mut_ptr().add(sent), (BURST - sent) as u32);
        }
        assert_eq!(sent, BURST, "the ring takes a whole burst");

        let mut rx: [*mut rte_mbuf; BURST] = [ptr::null_mut(); BURST];
        let mut got = 0;
        for _ in 0..1000 {
            got += usize::from(rnic_rx_burst(
                port,
                0,
                rx.as_mut_ptr().add(got),
                (BURST - got) as u16,
            ));
            if got == BURST {
                break;
            }
        }
        assert_eq!(got, BURST, "every frame sent comes back");
        for (i, &m) in rx.iter().enumerate() {
            let f = frame(i);
            let len = usize::from(rnic_pktmbuf_data_len(m));
            let data = std::slice::from_raw_parts(rnic_pktmbuf_mtod(m) as *const u8, len);
            assert_eq!(data, &f[..], "frame {i} arrives unchanged and in order");
        }
        rte_pktmbuf_free_bulk(rx.as_mut_ptr(), BURST as u32);
        assert!(rnic_rdtsc() > t0, "the TSC moves");

        let mut stats = rte_eth_stats::default();
        assert_eq!(rte_eth_stats_get(port, &mut stats), 0);
        assert_eq!(stats.opackets, BURST as u64);
        assert_eq!(stats.ipackets, BURST as u64);

        assert_eq!(rte_mempool_in_use_count(pool), 0, "no mbuf leaked");
        assert_eq!(rte_mempool_avail_count(pool), POOL_SIZE);

        assert_eq!(rte_eth_dev_stop(port), 0);
        assert_eq!(rte_eth_dev_close(port), 0);
        rte_mempool_free(pool);
        assert_eq!(rte_eal_cleanup(), 0);
    }
    println!("eal_smoke: sent and received {BURST} frames over net_ring0, no mbuf leaked");
}
