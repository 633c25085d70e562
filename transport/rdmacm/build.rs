//! Generates the rdma_cm and verbs structs from the system's
//! `<rdma/rdma_cma.h>` and `<rdma/rdma_verbs.h>` (so the layouts are the
//! ones applications compile in) and links the cdylib as
//! `librdmacm.so.1`, with librdmacm's symbol versions, against
//! `libibverbs.so.1`.

use std::env;
use std::path::{Path, PathBuf};

/// A `global_asm!` of `.symver` directives putting each symbol of the
/// version script in its node (`name@@NODE`, the default version). The
/// script alone defines the nodes, but rustc's own export list binds every
/// symbol to the base version; the directives must sit in the object that
/// defines the symbols (the crate is one codegen unit, see the workspace
/// profile).
fn symver(map: &Path) -> String {
    let text = std::fs::read_to_string(map).expect("read librdmacm.map");
    let mut lines = Vec::new();
    let mut node = None;
    for raw in text.lines() {
        let l = raw.trim();
        if let Some(name) = l.strip_suffix(" {") {
            node = Some(name.to_string());
        } else if l.starts_with('}') {
            node = None;
        } else if let (Some(n), Some(sym)) = (&node, l.strip_suffix(';')) {
            if !sym.contains(':') && !sym.contains('*') {
                lines.push(format!("\".symver {sym}, {sym}@@{n}\","));
            }
        }
    }
    format!("std::arch::global_asm!(\n{}\n);\n", lines.join("\n"))
}

/// The libibverbs functions librdmacm calls: the exported ones only (many
/// of verbs.h's `ibv_*` are static inline or macros).
const VERBS_CALLS: &[&str] = &[
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_query_device",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_create_qp",
    "ibv_destroy_qp",
    "ibv_modify_qp",
    "ibv_create_srq",
    "ibv_destroy_srq",
    "ibv_attach_mcast",
    "ibv_detach_mcast",
];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=librdmacm.map");
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        dir.join("librdmacm.map").display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-link-lib=ibverbs");
    for h in ["rdma/rdma_cma.h", "rdma/rdma_verbs.h", "infiniband/verbs.h"] {
        if !Path::new("/usr/include").join(h).exists() {
            panic!(
                "rdmacm: /usr/include/{h} is missing; install it \
                 (Debian 12: apt-get install -y librdmacm-dev libibverbs-dev)."
            );
        }
    }
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .layout_tests(true)
        .generate_comments(false)
        .derive_default(true)
        .prepend_enum_name(false)
        .allowlist_type("rdma_.*")
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_context")
        .allowlist_var("RDMA_.*")
        .allowlist_var("RAI_.*")
        .allowlist_var("IBV_.*");
    for f in VERBS_CALLS {
        b = b.allowlist_function(f);
    }
    let bindings = b.generate().expect("bindgen over <rdma/rdma_cma.h>");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("symver.rs"), symver(&dir.join("librdmacm.map")))
        .expect("write symver.rs");
    bindings
        .write_to_file(out.join("rdmacm.rs"))
        .expect("write the bindings");
}
