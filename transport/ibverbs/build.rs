//! Generates the verbs structs from the system's `<infiniband/verbs.h>`
//! (so the layouts are the ones applications compile in) and links the
//! cdylib as `libibverbs.so.1` with libibverbs' symbol versions.

use std::env;
use std::path::PathBuf;

/// A `global_asm!` of `.symver` directives that puts each symbol of the
/// version script in its node (`name@@NODE`, the default version; the crate is one codegen unit, see the workspace profile, so the directives and the definitions are in one object). The
/// script alone defines the nodes, but rustc's own export list binds every
/// symbol to the base version.
fn symver(map: &std::path::Path) -> String {
    let text = std::fs::read_to_string(map).expect("read libibverbs.map");
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

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=libibverbs.map");
    let dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        dir.join("libibverbs.map").display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        panic!(
            "ibverbs: /usr/include/infiniband/verbs.h is missing; install it \
             (Debian 12: apt-get install -y libibverbs-dev), or run ./x build, which installs it."
        );
    }
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .layout_tests(true)
        .generate_comments(false)
        .derive_default(true)
        .prepend_enum_name(false)
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_.*")
        .allowlist_type("_ibv_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("VERBS_.*")
        .generate()
        .expect("bindgen over <infiniband/verbs.h>");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("symver.rs"), symver(&dir.join("libibverbs.map")))
        .expect("write symver.rs");
    bindings
        .write_to_file(out.join("verbs.rs"))
        .expect("write the bindings");
}
