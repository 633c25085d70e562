//! File descriptors beside control messages: the segment's memfd, a
//! region's memfds, a CQ's eventfd travel as `SCM_RIGHTS` with the first
//! byte of a message. One send and one receive, for the blocking client
//! and the non-blocking daemon alike.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Most file descriptors one message carries.
pub const MAX_FDS: usize = 16;

/// Most descriptors Linux passes with one message (`SCM_MAX_FD`): room
/// for all of them, so that none is ever cut off unseen (and left open).
const SCM_MAX_FD: usize = 253;

/// Sends `bytes` on a socket with `fds` attached to the first byte;
/// returns how many bytes went (the rest is the caller's to send).
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)
}

/// Whether a receive waits for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Block until something arrives (the application's side).
    Block,
    /// Return `WouldBlock` at once when nothing is there (the daemon's).
    No,
}

/// One read from a Unix stream socket into `buf`, adding the descriptors
/// that came with it to `fds`: the bytes read, 0 at the end of the stream.
/// More descriptors than [`MAX_FDS`] with one message is an error
/// (`InvalidData`; they are closed): the peer is out of step.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut impl Extend<OwnedFd>,
    wait: Wait,
) -> std::io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(buf)];
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if wait == Wait::No {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), flags)
        .map_err(std::io::Error::from)?;
    let mut got = Vec::new();
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these descriptors in this
            // process for this message; nothing else owns them.
            got.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    if got.len() > MAX_FDS {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "a message carried {} file descriptors (at most {MAX_FDS})",
                got.len()
            ),
        ));
    }
    fds.extend(got);
    Ok(msg.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_arrive_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, mut d) = UnixStream::pair().unwrap();
        assert_eq!(send_with_fds(a.as_fd(), b"hello", &[c.as_fd()]).unwrap(), 5);
        drop(c);
        let mut buf = [0u8; 16];
        let mut got: Vec<OwnedFd> = Vec::new();
        let n = recv_with_fds(b.as_fd(), &mut buf, &mut got, Wait::Block).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"hello"[..], 1));
        // The descriptor received is the other pair's end.
        std::io::Write::write_all(&mut d, b"x").unwrap();
        let mut f = UnixStream::from(got.pop().unwrap());
        let mut one = [0u8; 1];
        f.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x");
        // Nothing more: a non-blocking receive says so at once.
        let e = recv_with_fds(b.as_fd(), &mut buf, &mut got, Wait::No).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(
            recv_with_fds(b.as_fd(), &mut buf, &mut got, Wait::No).unwrap(),
            0
        );
    }

    #[test]
    fn too_many_descriptors_is_an_error_not_a_silent_loss() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..MAX_FDS + 1)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_with_fds(a.as_fd(), b"m", &fds).unwrap();
        let mut got: Vec<OwnedFd> = Vec::new();
        let e = recv_with_fds(b.as_fd(), &mut [0u8; 4], &mut got, Wait::Block).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(
            e.to_string().contains("17 file descriptors (at most 16)"),
            "{e}"
        );
    }
}
