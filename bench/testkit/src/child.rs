//! A child process run with a time limit: its output is drained by
//! threads (a full pipe cannot block it), and past the limit it is killed
//! and reported as such.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child whose stdout and stderr are being collected.
pub struct Running {
    child: Child,
    what: String,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

/// How a child ended.
#[derive(Debug)]
pub struct Finished {
    /// What ran (the command, for messages).
    pub what: String,
    /// None: still running at the limit, and killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

fn drain(r: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    let mut r = r?;
    Some(std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    }))
}

impl Running {
    /// Starts `cmd` with its stdout and stderr piped.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Running> {
        let what = format!("{cmd:?}");
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        Ok(Running {
            child,
            what,
            out,
            err,
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for the child to exit, at most `limit`; kills it past that.
    /// A killed child's own children may still hold its pipes, so its
    /// output is then not waited for (what arrived in time is not kept).
    pub fn finish(mut self, limit: Duration) -> Finished {
        let start = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if start.elapsed() < limit => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                // Past the limit, or it cannot be waited for.
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        let text = |h: Option<JoinHandle<String>>| match (status, h) {
            (Some(_), Some(h)) => h.join().unwrap_or_default(),
            _ => String::new(),
        };
        let (stdout, stderr) = (text(self.out.take()), text(self.err.take()));
        Finished {
            what: std::mem::take(&mut self.what),
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Running {
    /// A child not finished (its test failed first) is killed.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Finished {
    /// Whether it exited by itself with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Its stdout, then its stderr.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Panics, naming the command and showing its output, unless it
    /// exited by itself with status 0.
    pub fn assert_success(&self) -> &Self {
        match self.status {
            None => panic!("{}: still running at its time limit, killed", self.what),
            Some(s) if !s.success() => panic!("{}: {s}\n{}", self.what, self.text()),
            Some(_) => self,
        }
    }
}

/// Runs `cmd` to its end, at most `limit` (killed past that).
pub fn output_within(cmd: &mut Command, limit: Duration) -> std::io::Result<Finished> {
    Ok(Running::spawn(cmd)?.finish(limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ends_in_time_gives_its_output_and_status() {
        let f = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(f.status.and_then(|s| s.code()), Some(3));
        assert_eq!((f.stdout.as_str(), f.stderr.as_str()), ("out\n", "err\n"));
        assert!(!f.success());
    }

    #[test]
    fn a_child_past_its_limit_is_killed_and_said_so() {
        let f = output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap();
        assert!(f.status.is_none() && !f.success());
        let e = std::panic::catch_unwind(|| {
            f.assert_success();
        })
        .unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("killed"), "{msg}");
    }
}
