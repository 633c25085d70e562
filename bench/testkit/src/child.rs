//! A child process run with a time limit: its output is drained by
//! threads (a full pipe cannot block it), its stdout can be awaited line by
//! line, and past the limit it is killed and reported as such.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a test's child process may run before it is killed and the
/// test fails (a hung program must not hang the suite).
pub const LIMIT: Duration = Duration::from_secs(300);

/// A child whose stdout and stderr are being collected.
pub struct Running {
    child: Child,
    what: String,
    /// Collects stdout and passes each line on to `lines`.
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    lines: Receiver<String>,
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

/// Waits for `child` to exit, at most `limit`; kills it past that and
/// returns None.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            // Past the limit, or it cannot be waited for.
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

impl Running {
    /// Starts `cmd` with its stdout and stderr piped, and no stdin.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Running> {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().map(|o| {
            std::thread::spawn(move || {
                let mut all = String::new();
                let mut r = BufReader::new(o);
                let mut line = Vec::new();
                while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                    let l = String::from_utf8_lossy(&line).into_owned();
                    all.push_str(&l);
                    let _ = tx.send(l);
                    line.clear();
                }
                all
            })
        });
        let err = child.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = e.read_to_end(&mut v);
                String::from_utf8_lossy(&v).into_owned()
            })
        });
        Ok(Running {
            child,
            what,
            out,
            err,
            lines,
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The next line of its stdout that starts with `prefix` (lines before
    /// it are skipped, and kept in the output), waiting at most `limit`;
    /// None when its stdout closed or the time ran out first.
    pub fn line_starting(&mut self, prefix: &str, limit: Duration) -> Option<String> {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Some(l.trim_end().to_string()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits for the child to exit, at most `limit`; kills it past that.
    /// A killed child's own children may still hold its pipes, so its
    /// output is then not waited for.
    pub fn finish(&mut self, limit: Duration) -> Finished {
        let status = wait_within(&mut self.child, limit);
        let text = |h: Option<JoinHandle<String>>| match (status, h) {
            (Some(_), Some(h)) => h.join().unwrap_or_default(),
            _ => String::new(),
        };
        let (stdout, stderr) = (text(self.out.take()), text(self.err.take()));
        Finished {
            what: self.what.clone(),
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
            self.kill();
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

/// `Command::output` with a time limit, for tests that read an `Output`.
pub trait OutputWithin {
    /// Runs the command to its end and returns its `Output` (its output
    /// read as text, lossy UTF-8); panics,
    /// naming the command, when it is still running after `limit` (it is
    /// killed) or cannot be started.
    fn output_within(&mut self, limit: Duration) -> Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> Output {
        let f = output_within(self, limit).unwrap_or_else(|e| panic!("{self:?}: {e}"));
        let Some(status) = f.status else {
            panic!("{}: still running after {limit:?}, killed", f.what);
        };
        Output {
            status,
            stdout: f.stdout.into_bytes(),
            stderr: f.stderr.into_bytes(),
        }
    }
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

    #[test]
    fn a_line_is_awaited_and_kept_in_the_output() {
        let mut r = Running::spawn(
            Command::new("sh").args(["-c", "echo one; echo ready: 7; read x; echo after"]),
        )
        .unwrap();
        assert_eq!(
            r.line_starting("ready:", Duration::from_secs(30))
                .as_deref(),
            Some("ready: 7")
        );
        // Its stdin is empty: `read` ends, and so does it.
        let f = r.finish(Duration::from_secs(30));
        assert_eq!(f.stdout, "one\nready: 7\nafter\n");
        // A line that never comes: None once its stdout closed.
        let mut r = Running::spawn(&mut Command::new("true")).unwrap();
        assert_eq!(r.line_starting("x", Duration::from_secs(30)), None);
    }
}
