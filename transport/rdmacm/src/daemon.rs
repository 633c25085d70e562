//! Talking to the daemon: the framing of `shm::proto` over blocking Unix
//! sockets, the rdma_cm **session** of one device (`Request::CmOpen`: one
//! connection per device and process, request/reply serialised by a
//! mutex), and the errno each daemon error means to an rdma_cm caller.
//!
//! Event channels are connections too, but only their first request and
//! reply pass here; after that the daemon only pushes events on them
//! (`crate::channel`).

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use shm::proto::{self, ErrorKind, Reply, ReplyMsg, Request, RequestMsg};

/// The errno an rdma_cm caller gets for a daemon's refusal.
pub fn errno_of_kind(k: ErrorKind) -> i32 {
    match k {
        ErrorKind::InvalidArgument => libc::EINVAL,
        ErrorKind::NoSuchDevice => libc::ENODEV,
        ErrorKind::AddrInUse => libc::EADDRINUSE,
        ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
        ErrorKind::NoSpace => libc::ENOMEM,
        ErrorKind::Busy => libc::EBUSY,
        _ => libc::EIO,
    }
}

/// Why a request failed, as an errno (the daemon's refusal, or EIO when
/// the connection broke).
#[derive(Debug)]
pub struct CallError {
    pub errno: i32,
    pub why: String,
    /// The connection is unusable (the daemon died or answered out of
    /// step).
    pub broken: bool,
}

/// A connection to the daemon and the request numbers on it.
pub struct Conn {
    pub sock: UnixStream,
    buf: Vec<u8>,
    next: u64,
}

impl Conn {
    /// Connects to the daemon's socket (`$RNIC_SOCKET` or the default).
    pub fn connect() -> Result<Conn, CallError> {
        let path = verbs::socket_path();
        let sock = UnixStream::connect(&path).map_err(|e| CallError {
            errno: libc::ENODEV,
            why: format!("connect {}: {e}", path.display()),
            broken: true,
        })?;
        Ok(Conn {
            sock,
            buf: Vec::new(),
            next: 1,
        })
    }

    /// Sends `req` and reads its reply.
    pub fn call(&mut self, req: Request) -> Result<Reply, CallError> {
        let id = self.next;
        self.next += 1;
        let broken = |e: std::io::Error| CallError {
            errno: libc::EIO,
            why: format!("daemon connection: {e}"),
            broken: true,
        };
        let bytes = proto::frame(&RequestMsg {
            v: shm::VERSION,
            id,
            req,
        });
        send_all(&self.sock, &bytes).map_err(broken)?;
        let mut fds = Vec::new();
        let r: ReplyMsg =
            proto::recv_message(&mut self.sock, &mut self.buf, &mut fds).map_err(broken)?;
        if r.v != shm::VERSION || r.id != id {
            return Err(CallError {
                errno: libc::EPROTO,
                why: format!(
                    "reply v{} id {} to request v{} id {id} (daemon and library differ)",
                    r.v,
                    r.id,
                    shm::VERSION
                ),
                broken: true,
            });
        }
        r.result.map_err(|e| CallError {
            errno: errno_of_kind(e.kind),
            why: e.to_string(),
            broken: false,
        })
    }

    /// The leftover bytes read past the last reply (events that followed
    /// an event channel's first reply).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Sends all of `bytes` with MSG_NOSIGNAL: a daemon that died is EPIPE
/// for the caller, not a SIGPIPE that kills the application.
fn send_all(sock: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match shm::fds::send_with_fds(sock.as_fd(), bytes, &[]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One device's rdma_cm session: the ids of this process on it.
pub struct Session {
    /// The daemon's number of the session (`CmEventMsg::session`).
    pub number: u64,
    conn: Mutex<Conn>,
    /// Set once the connection broke: the device's next user opens a
    /// new session.
    broken: AtomicBool,
}

impl Session {
    /// Opens a session on `device`.
    pub fn open(device: &str) -> Result<Session, CallError> {
        let mut conn = Conn::connect()?;
        match conn.call(Request::CmOpen {
            device: device.to_string(),
        })? {
            Reply::CmOpened { session, .. } => Ok(Session {
                number: session,
                conn: Mutex::new(conn),
                broken: Default::default(),
            }),
            r => Err(CallError {
                errno: libc::EPROTO,
                why: format!("CmOpen answered {r:?}"),
                broken: true,
            }),
        }
    }

    /// Sends a request on the session and reads its reply.
    pub fn call(&self, req: Request) -> Result<Reply, CallError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let r = c.call(req);
        if let Err(e) = &r {
            if e.broken {
                self.broken.store(true, Ordering::Relaxed);
            }
        }
        r
    }

    /// Sends a request whose reply is `Done` or a port (anything but an
    /// error is success).
    pub fn call_ok(&self, req: Request) -> Result<Reply, i32> {
        self.call(req).map_err(|e| {
            if crate::util::debug() {
                crate::util::warn(&e.why);
            }
            e.errno
        })
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_refusals_map_to_the_errnos_rdma_cm_callers_know() {
        assert_eq!(errno_of_kind(ErrorKind::InvalidArgument), libc::EINVAL);
        assert_eq!(errno_of_kind(ErrorKind::NoSuchDevice), libc::ENODEV);
        assert_eq!(errno_of_kind(ErrorKind::AddrInUse), libc::EADDRINUSE);
        assert_eq!(
            errno_of_kind(ErrorKind::AddrNotAvailable),
            libc::EADDRNOTAVAIL
        );
        assert_eq!(errno_of_kind(ErrorKind::NoSpace), libc::ENOMEM);
        assert_eq!(errno_of_kind(ErrorKind::Busy), libc::EBUSY);
        assert_eq!(errno_of_kind(ErrorKind::Malformed), libc::EIO);
        assert_eq!(errno_of_kind(ErrorKind::NoSuchQp), libc::EIO);
    }

    #[test]
    fn a_dead_daemon_is_epipe_not_sigpipe() {
        // SIGPIPE blocked in this thread: a send without MSG_NOSIGNAL
        // would leave it pending here (blocked signals are not
        // discarded even while ignored, as the test harness has it).
        // SAFETY: sigset operations on our own sets; this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let (a, b) = UnixStream::pair().unwrap();
            drop(b);
            let mut c = Conn {
                sock: a,
                buf: Vec::new(),
                next: 1,
            };
            let e = c.call(Request::CmDestroyId { id: 5 }).unwrap_err();
            assert!(e.broken);
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            let raised = libc::sigismember(&pending, libc::SIGPIPE) == 1;
            if raised {
                let zero = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            assert!(!raised, "the send raised SIGPIPE");
        }
    }

    #[test]
    fn a_session_call_reads_the_reply_with_its_id() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let m: RequestMsg = proto::read_message(&mut b).unwrap();
            assert_eq!(m.req, Request::CmDestroyId { id: 5 }, "the request as sent");
            proto::send_message(
                &mut b,
                &ReplyMsg {
                    v: shm::VERSION,
                    id: m.id,
                    result: Err(shm::proto::ErrorReply::new(ErrorKind::AddrInUse, "taken")),
                },
            )
            .unwrap();
        });
        let mut c = Conn {
            sock: a,
            buf: Vec::new(),
            next: 1,
        };
        let e = c.call(Request::CmDestroyId { id: 5 }).unwrap_err();
        assert_eq!(e.errno, libc::EADDRINUSE);
        assert!(!e.broken);
        t.join().unwrap();
    }
}
