//! The daemon `--loopback` needs: when nothing serves the socket yet, start
//! `dataplane --config CONFIG --serve --socket SOCKET` and stop it
//! (SIGTERM) when the benchmark ends. With `--pin auto` and two CPUs or
//! more, its lcore gets the last CPU of this process's set and the
//! benchmark thread the first: each spins on a core of its own instead of
//! the scheduler moving them (runs were up to 1.8x slower when the two
//! met or migrated).

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::args::{PerfArgs, Pin};

/// A daemon this benchmark started, and the CPU its lcore was given.
pub struct Daemon(Child, Option<usize>);

impl Daemon {
    /// The CPU of the daemon's lcore, when `--pin` placed it.
    pub fn cpu(&self) -> Option<usize> {
        self.1
    }
}

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
    let cpus = match a.pin {
        Pin::Auto => core_affinity::get_core_ids().unwrap_or_default(),
        Pin::None => Vec::new(),
    };
    let placement = match (cpus.first(), cpus.last()) {
        (Some(app), Some(dp)) if cpus.len() >= 2 => Some((*app, *dp)),
        _ => None,
    };
    let pin_arg = placement
        .map(|(_, dp)| format!(" --cpus {}", dp.id))
        .unwrap_or_default();
    println!(
        " starting {} --config {} --serve --socket {}{pin_arg}",
        bin.display(),
        a.config.display(),
        a.socket.display()
    );
    let mut cmd = Command::new(&bin);
    if let Some((_, dp)) = placement {
        cmd.arg("--cpus").arg(dp.id.to_string());
    }
    let mut child = cmd
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
    if let Some((app, dp)) = placement {
        if core_affinity::set_for_current(app) {
            println!(
                " placement: the daemon's lcore on CPU {}, this thread on CPU {}",
                dp.id, app.id
            );
        } else {
            println!(" placement: the daemon's lcore on CPU {}; this thread could not be pinned, it floats", dp.id);
        }
    }
    Ok(Some(Daemon(child, placement.map(|(_, dp)| dp.id))))
}

/// What the daemon has spent so far: its busy nanoseconds, the WRs
/// posted to it and its passes (`busy_ns`, `wqes_posted`, `passes` of
/// its service counters, summed over its lcores).
#[derive(Clone, Copy, Debug)]
pub struct Busy {
    pub ns: u64,
    pub wrs: u64,
    pub passes: u64,
}

/// The daemon's [`Busy`] counters now; `None` when it does not answer.
pub fn busy(a: &PerfArgs) -> Option<Busy> {
    let s = dataplane::service::query_stats(&a.socket).ok()?.service?;
    Some(Busy {
        ns: s.busy_ns,
        wrs: s.wqes_posted,
        passes: s.passes,
    })
}

/// The line `busy` before and after a run of `secs` gives: the
/// dataplane's busy nanoseconds per posted WR, the share of the run it
/// was busy (over 100% with several lcores: their times add up), and
/// its passes per WR, idle ones included (the inverse, when above 1, is
/// about how many WRs a pass handles: each pass pays a fixed cost, an RX
/// poll of every port and a look at every watched ring).
pub fn busy_line(before: Busy, after: Busy, secs: f64) -> Option<String> {
    let ns = after.ns.checked_sub(before.ns)?;
    let msgs = after.wrs.checked_sub(before.wrs).filter(|&m| m > 0)?;
    let passes = after.passes.checked_sub(before.passes)?;
    Some(format!(
        " daemon: {:.0} ns busy per WR ({:.0}% of the run's {:.3} s), {:.2} passes per WR",
        ns as f64 / msgs as f64,
        100.0 * ns as f64 / 1e9 / secs.max(1e-9),
        secs,
        passes as f64 / msgs as f64
    ))
}
