//! The daemon `--loopback` needs: when nothing serves the socket yet, start
//! `dataplane --config CONFIG --serve --socket SOCKET` and stop it
//! (SIGTERM) when the benchmark ends.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::args::PerfArgs;

/// A daemon this benchmark started.
pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        // SIGTERM lets it release its ports and socket; kill if it hangs.
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dataplane_binary(a: &PerfArgs) -> Result<PathBuf, String> {
    if let Some(p) = &a.dataplane {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = me.with_file_name("dataplane");
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "no dataplane binary at {} (build it: cargo build --release -p dataplane, or give --dataplane PATH)",
            p.display()
        ))
    }
}

/// Starts a daemon unless one already serves `a.socket`.
pub fn ensure(a: &PerfArgs) -> Result<Option<Daemon>, String> {
    if UnixStream::connect(&a.socket).is_ok() {
        return Ok(None);
    }
    let bin = dataplane_binary(a)?;
    println!(
        " starting {} --config {} --serve --socket {}",
        bin.display(),
        a.config.display(),
        a.socket.display()
    );
    let mut child = Command::new(&bin)
        .arg("--config")
        .arg(&a.config)
        .arg("--serve")
        .arg("--socket")
        .arg(&a.socket)
        .arg("--file-prefix")
        .arg(format!("bench-daemon-{}", std::process::id()))
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let t0 = Instant::now();
    while UnixStream::connect(&a.socket).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("the daemon exited ({st}) before it listened"));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err(format!(
                "the daemon did not listen on {} in 60 s",
                a.socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Some(Daemon(child)))
}
