//! Every dataplane configuration shipped in configs/ reads and checks
//! (including the real-NIC example, which cannot run here), and a bad one
//! is refused with the file and the reason.

use std::process::Command;

fn check(path: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dataplane"))
        .arg("--check")
        .arg("--config")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn shipped_configurations_check() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let (ok, err) = check(&p);
            assert!(ok, "{}: {err}", p.display());
            n += 1;
        }
    }
    assert!(n >= 5, "found {n} configurations");
}

#[test]
fn a_bad_configuration_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[eal]\nargs = []\n[loopback]\nmem_bytez = 1\n").unwrap();
    let (ok, err) = check(&p);
    assert!(!ok);
    assert!(
        err.contains("bad.toml") && err.contains("mem_bytez"),
        "{err}"
    );
}
