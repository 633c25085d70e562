//! Builds the C shim and generates the bindings against the system's
//! libdpdk, found with pkg-config.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config(arg: &str) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args([arg, "libdpdk"])
        .output()
        .unwrap_or_else(|e| panic!("dpdk-sys: cannot run pkg-config ({e}); install pkg-config"));
    if !out.status.success() {
        panic!(
            "dpdk-sys: pkg-config cannot find libdpdk: {}\n\
             Install DPDK 22.11 (Debian 12: apt-get install -y dpdk dpdk-dev libdpdk-dev), \
             or run ./x test, which installs it.",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.h");
    println!("cargo:rerun-if-changed=shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // "-include rte_config.h" is two words; keep the pair together.
    let cflags = pkg_config("--cflags");

    let mut shim = cc::Build::new();
    shim.file("shim.c").include(".").warnings(true).opt_level(3);
    for f in &cflags {
        shim.flag(f);
    }
    shim.compile("rnic_dpdk_shim");

    // The net_ring PMD's rte_eth_from_rings is called directly (the EAL
    // also loads the PMD as a plugin; the loader sees it is the same file).
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");
    for f in pkg_config("--libs") {
        if let Some(lib) = f.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        } else if let Some(dir) = f.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        }
    }

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&cflags)
        .clang_arg("-I.")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .layout_tests(true)
        .generate_comments(false)
        .derive_default(true)
        .prepend_enum_name(false)
        // The shim.
        .allowlist_function("rnic_.*")
        .allowlist_var("rnic_.*")
        // EAL.
        .allowlist_function("rte_eal_init")
        .allowlist_function("rte_eal_cleanup")
        .allowlist_function("rte_thread_register")
        .allowlist_function("rte_thread_unregister")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_lcore_count")
        .allowlist_function("rte_get_next_lcore")
        .allowlist_function("rte_eal_remote_launch")
        .allowlist_function("rte_eal_wait_lcore")
        .allowlist_function("rte_eal_mp_wait_lcore")
        .allowlist_function("rte_get_tsc_hz")
        .allowlist_function("rte_delay_us_block")
        // Mempools and mbufs.
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_pktmbuf_free_bulk")
        .allowlist_function("rte_mempool_free")
        .allowlist_function("rte_mempool_avail_count")
        .allowlist_function("rte_mempool_in_use_count")
        // Ports.
        .allowlist_function("rte_eth_dev_count_avail")
        .allowlist_function("rte_eth_dev_get_port_by_name")
        .allowlist_function("rte_eth_dev_get_name_by_port")
        .allowlist_function("rte_eth_dev_info_get")
        .allowlist_function("rte_eth_dev_configure")
        .allowlist_function("rte_eth_rx_queue_setup")
        .allowlist_function("rte_eth_tx_queue_setup")
        .allowlist_function("rte_eth_dev_start")
        .allowlist_function("rte_eth_dev_stop")
        .allowlist_function("rte_eth_dev_close")
        .allowlist_function("rte_eth_dev_socket_id")
        .allowlist_function("rte_eth_dev_set_mtu")
        .allowlist_function("rte_eth_dev_get_mtu")
        .allowlist_function("rte_eth_macaddr_get")
        .allowlist_function("rte_eth_promiscuous_enable")
        .allowlist_function("rte_eth_stats_get")
        .allowlist_function("rte_eth_stats_reset")
        .allowlist_function("rte_eth_link_get_nowait")
        .allowlist_function("rte_eth_dev_rx_intr_ctl_q_get_fd")
        // Rings, and net_ring ports made from them (the loopback testbed).
        .allowlist_function("rte_ring_create")
        .allowlist_function("rte_ring_free")
        .allowlist_function("rte_eth_from_rings")
        .allowlist_var("RING_F_SP_ENQ")
        .allowlist_var("RING_F_SC_DEQ")
        .allowlist_type("rte_mbuf")
        .allowlist_type("rte_mbuf_ext_shared_info")
        .allowlist_type("rte_mempool")
        .allowlist_type("rte_eth_conf")
        .allowlist_type("rte_eth_dev_info")
        .allowlist_type("rte_eth_rxconf")
        .allowlist_type("rte_eth_txconf")
        .allowlist_type("rte_eth_stats")
        .allowlist_type("rte_eth_link")
        .allowlist_type("rte_ether_addr")
        // Plain numeric macros bindgen can evaluate.
        .allowlist_var("RTE_PKTMBUF_HEADROOM")
        .allowlist_var("RTE_MBUF_DEFAULT_DATAROOM")
        .allowlist_var("RTE_MAX_LCORE")
        .allowlist_var("RTE_MAX_ETHPORTS")
        .generate()
        .expect("dpdk-sys: bindgen failed on wrapper.h");

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    bindings
        .write_to_file(&out)
        .expect("dpdk-sys: cannot write bindings");
}
