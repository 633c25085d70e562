//! The control thread: a mio event loop on the daemon's Unix socket. It
//! accepts applications, reads framed requests, hands them to the
//! dataplane lcore that serves them over a crossbeam channel (the
//! `Router` decides which), and writes the replies (with their file
//! descriptors) that come back. It never touches the engines,
//! so the dataplane thread's loop makes no system call for the control
//! path; a reply wakes this thread through a mio `Waker`.
//!
//! A connection that sends a malformed frame, or stops reading its
//! replies, is closed; closing is how the dataplane learns that an
//! application is gone (exited or killed).

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind as IoKind;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, Sender};
use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::router::Router;
use super::sleep::LcoreWake;
use shm::fds::Wait;
use shm::proto::{self, ErrorKind, ErrorReply, ReplyMsg, Request, RequestMsg};

/// An application connection.
pub type ConnId = u64;

/// What the control thread tells the dataplane thread.
#[derive(Debug)]
pub enum ToDataplane {
    Request {
        conn: ConnId,
        id: u64,
        req: Request,
        /// Descriptors that came with the request (`Request::fd_count`).
        fds: Vec<OwnedFd>,
    },
    /// The application closed its socket (or died).
    Closed { conn: ConnId },
}

/// The control thread's end of an lcore's requests: each message sent
/// nudges the lcore, which may be asleep.
pub struct ToLcore {
    tx: Sender<ToDataplane>,
    wake: Arc<LcoreWake>,
}

impl ToLcore {
    pub fn new(tx: Sender<ToDataplane>, wake: Arc<LcoreWake>) -> ToLcore {
        ToLcore { tx, wake }
    }

    /// Queues `m` and wakes the lcore; fails when the lcore is gone.
    pub fn send(&self, m: ToDataplane) -> Result<(), ToDataplane> {
        self.tx.send(m).map_err(|e| e.into_inner())?;
        self.wake.nudge();
        Ok(())
    }
}

/// A reply for a connection, with descriptors to pass.
pub struct ToControl {
    pub conn: ConnId,
    pub msg: ReplyMsg,
    pub fds: Vec<OwnedFd>,
}

/// Requests a connection may have outstanding before the thread stops
/// reading from it.
const MAX_OUTSTANDING: usize = 64;
/// Unsent reply bytes after which a connection is closed.
const MAX_UNSENT: usize = 4 << 20;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

struct Conn {
    stream: UnixStream,
    inbuf: Vec<u8>,
    /// Descriptors received and not yet claimed by a request, in order.
    infds: VecDeque<OwnedFd>,
    /// Replies not yet (fully) written: bytes, offset, descriptors (sent
    /// with the first byte).
    out: VecDeque<(Vec<u8>, usize, Vec<OwnedFd>)>,
    outstanding: usize,
}

/// The running control thread.
pub struct Control {
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// A dataplane lcore's end of the control thread: the requests routed to
/// it, and the way back for its replies.
pub struct ShardLink {
    pub requests: Receiver<ToDataplane>,
    replies: Sender<ToControl>,
    waker: Arc<Waker>,
}

impl ShardLink {
    /// Queues a reply and wakes the control thread.
    pub fn reply(&self, r: ToControl) {
        if self.replies.send(r).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

impl Control {
    /// Binds `path` (replacing a stale socket file nobody listens on) and
    /// starts the thread, with a link for each of the lcores that
    /// `devices` (every device in the daemon's order, with the lcore that
    /// serves it) names. The thread runs on `cpus` when given (see
    /// [`super::control_cpus`]).
    pub fn spawn(
        path: &Path,
        devices: Vec<(String, usize)>,
        wakes: Vec<Arc<LcoreWake>>,
        cpus: Option<nix::sched::CpuSet>,
    ) -> std::io::Result<(Control, Vec<ShardLink>)> {
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    IoKind::AddrInUse,
                    format!("another daemon serves {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut listener = UnixListener::bind(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (rep_tx, rep_rx) = unbounded();
        let (senders, links): (Vec<_>, Vec<_>) = wakes
            .into_iter()
            .map(|wake| {
                let (tx, rx) = unbounded();
                let link = ShardLink {
                    requests: rx,
                    replies: rep_tx.clone(),
                    waker: waker.clone(),
                };
                (ToLcore { tx, wake }, link)
            })
            .unzip();
        let router = Router::new(senders, devices);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rnic-control".into())
            .spawn(move || {
                if let Some(set) = cpus {
                    let this = nix::unistd::Pid::from_raw(0);
                    if let Err(e) = nix::sched::sched_setaffinity(this, &set) {
                        eprintln!("dataplane: the control thread stays on the lcore's CPUs: {e}");
                    }
                }
                run(poll, listener, router, rep_rx, stop2)
            })?;
        let control = Control {
            waker,
            stop,
            thread: Some(thread),
            path: path.to_path_buf(),
        };
        Ok((control, links))
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn run(
    mut poll: Poll,
    listener: UnixListener,
    mut router: Router,
    replies: Receiver<ToControl>,
    stop: Arc<AtomicBool>,
) {
    let mut conns: HashMap<ConnId, Conn> = HashMap::new();
    let mut next: ConnId = 2;
    let mut events = Events::with_capacity(256);
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = poll.poll(&mut events, Some(std::time::Duration::from_millis(200))) {
            if e.kind() == IoKind::Interrupted {
                continue;
            }
            eprintln!("dataplane: control socket poll failed: {e}");
            return;
        }
        let mut touched: Vec<ConnId> = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let id = next;
                            next += 1;
                            if poll
                                .registry()
                                .register(
                                    &mut stream,
                                    Token(id as usize),
                                    Interest::READABLE | Interest::WRITABLE,
                                )
                                .is_ok()
                            {
                                conns.insert(
                                    id,
                                    Conn {
                                        stream,
                                        inbuf: Vec::new(),
                                        infds: VecDeque::new(),
                                        out: VecDeque::new(),
                                        outstanding: 0,
                                    },
                                );
                                touched.push(id);
                            }
                        }
                        Err(e) if e.kind() == IoKind::WouldBlock => break,
                        Err(e) if e.kind() == IoKind::Interrupted => continue,
                        Err(_) => break,
                    }
                },
                WAKER => {}
                Token(t) => touched.push(t as ConnId),
            }
        }
        while let Ok(r) = replies.try_recv() {
            let Some(r) = router.reply(r) else {
                continue;
            };
            if let Some(c) = conns.get_mut(&r.conn) {
                c.outstanding = c.outstanding.saturating_sub(1);
                c.out.push_back((proto::frame(&r.msg), 0, r.fds));
                touched.push(r.conn);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for id in touched {
            let alive = match conns.get_mut(&id) {
                Some(c) => service(c, id, &mut router),
                None => continue,
            };
            if !alive {
                if let Some(mut c) = conns.remove(&id) {
                    let _ = poll.registry().deregister(&mut c.stream);
                }
                router.closed(id);
            }
        }
    }
}

/// Writes what can be written and reads what can be read; false when the
/// connection is finished.
fn service(c: &mut Conn, id: ConnId, router: &mut Router) -> bool {
    if !flush(c) {
        return false;
    }
    loop {
        // Decode whole frames already buffered.
        while c.outstanding < MAX_OUTSTANDING {
            match proto::unframe::<RequestMsg>(&mut c.inbuf) {
                Ok(Some(m)) if m.v != shm::VERSION => {
                    let e = ErrorReply::new(
                        ErrorKind::Version,
                        format!(
                            "the client speaks application/daemon contract version {}, this daemon {}: use the libibverbs and verbs built with this daemon",
                            m.v,
                            shm::VERSION
                        ),
                    );
                    c.out.push_back((
                        proto::frame(&ReplyMsg {
                            v: shm::VERSION,
                            id: m.id,
                            result: Err(e),
                        }),
                        0,
                        Vec::new(),
                    ));
                }
                Ok(Some(m)) => {
                    c.outstanding += 1;
                    // A request's descriptors came with its first byte, so
                    // they are here by the time it is whole.
                    let want = m.req.fd_count().min(c.infds.len());
                    let fds = c.infds.drain(..want).collect();
                    if router.route(id, m.id, m.req, fds).is_err() {
                        return false;
                    }
                }
                Ok(None) => break,
                Err(reason) => {
                    // The stream is out of step: say why, then close.
                    let e = ErrorReply::new(ErrorKind::Malformed, reason.to_string());
                    let bytes = proto::frame(&ReplyMsg {
                        v: shm::VERSION,
                        id: 0,
                        result: Err(e),
                    });
                    let _ = proto::send_with_fds(c.stream.as_fd(), &bytes, &[]);
                    return false;
                }
            }
        }
        if !flush(c) {
            return false;
        }
        if c.outstanding >= MAX_OUTSTANDING || c.inbuf.len() > proto::MAX_MESSAGE + 4 {
            // Read more once replies have gone out.
            return true;
        }
        let mut chunk = [0u8; 8192];
        match shm::fds::recv_with_fds(c.stream.as_fd(), &mut chunk, &mut c.infds, Wait::No) {
            Ok(0) => return false,
            Ok(n) => c.inbuf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == IoKind::WouldBlock => return true,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(_) => return false,
        }
        if c.infds.len() > 4 * proto::MAX_FDS {
            // Descriptors no request claims: the client is out of step.
            return false;
        }
    }
}

/// Writes queued replies; false when the peer is gone or does not read.
fn flush(c: &mut Conn) -> bool {
    while let Some((bytes, off, fds)) = c.out.front_mut() {
        let borrowed: Vec<_> = if *off == 0 {
            fds.iter().map(|f| f.as_fd()).collect()
        } else {
            Vec::new()
        };
        match proto::send_with_fds(c.stream.as_fd(), &bytes[*off..], &borrowed) {
            Ok(n) => {
                *off += n;
                if *off == bytes.len() {
                    c.out.pop_front();
                } else {
                    fds.clear();
                }
            }
            Err(e) if e.kind() == IoKind::WouldBlock => break,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    let unsent: usize = c.out.iter().map(|(b, o, _)| b.len() - o).sum();
    unsent <= MAX_UNSENT
}
