//! Sharing an application's own memory with the daemon, in place:
//! `ibv_reg_mr(pd, buf, len)` moves the pages under `buf` into memfds
//! (copying their bytes, then mapping the memfd over the same addresses
//! with `MAP_FIXED`), and the daemon maps the same memfds. From then on
//! the application's pointer and the NIC's DMA reach the same pages: a
//! remote WRITE shows in `buf` with no copy and no call.
//!
//! What can move: the process's private memory (malloc's heap and its
//! mmap'd chunks, memalign, `mmap(MAP_PRIVATE|MAP_ANONYMOUS)`, anonymous
//! hugetlb mappings, and private writable file mappings such as a
//! program's static data). Everything else (read-only, shared, the
//! stack) is refused with an error that names the mapping.
//! Pages already moved by an earlier registration are reused, checked
//! against `/proc/self/maps` so that a buffer freed and replaced at the
//! same address is never mistaken for the old one.
//!
//! Limits (README): the copy and the remap are not atomic against other
//! threads writing the same pages during `ibv_reg_mr`; after the last
//! region over some pages is deregistered, normal pages go back to
//! private anonymous memory (hugetlb pages stay in their memfd). A child
//! of `fork` gets private copies of moved pages (not the parent's shared
//! ones), unless `ibv_fork_init` keeps them out of children altogether.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;

/// Pages of the application moved into one memfd.
struct Piece {
    end: usize,
    fd: Arc<OwnedFd>,
    /// The memfd's name as `/proc/self/maps` shows it.
    name: String,
    huge: bool,
    /// Registered regions over these pages.
    refs: u32,
}

/// Moved pages by start address.
static PIECES: Mutex<BTreeMap<usize, Piece>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A buffer's pages, ready to send: `(memfd, offset, len)` back to back
/// from the first page; the buffer starts `start` bytes in.
pub struct Shared {
    pub pieces: Vec<(Arc<OwnedFd>, u64, u64)>,
    pub start: u64,
    /// The pieces this registration holds (for [`release`]).
    pub keys: Vec<usize>,
}

/// Why memory could not be shared: errno and an explanation.
pub type Refusal = (i32, String);

/// One line of /proc/self/maps.
struct Vma {
    start: usize,
    end: usize,
    perms: String,
    path: String,
}

fn maps() -> Result<Vec<Vma>, Refusal> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| (libc::EIO, format!("read /proc/self/maps: {e}")))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(6, ' ');
            let (range, perms, _offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            let path = f.next().unwrap_or("").trim().to_string();
            let (a, b) = range.split_once('-')?;
            Some(Vma {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                perms: perms.to_string(),
                path,
            })
        })
        .collect())
}

/// Whether a mapping's path is the memfd named `name` ("/memfd:NAME
/// (deleted)").
fn is_piece(path: &str, name: &str) -> bool {
    path.strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
}

/// How a mapping may be shared.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Anon,
    AnonHuge,
    Ours,
}

/// Memory that cannot be shared with the NIC: what it is, and the
/// mapping as /proc/self/maps shows it.
#[derive(Debug, thiserror::Error)]
#[error("{what} ({start:#x}-{end:#x} {perms} {path})")]
struct NotShareable {
    what: &'static str,
    start: usize,
    end: usize,
    perms: String,
    path: String,
}

fn kind(v: &Vma) -> Result<Kind, NotShareable> {
    let private_rw = v.perms.starts_with("rw") && v.perms.ends_with('p');
    if v.path.starts_with("/memfd:rnic-mr-") && v.perms.starts_with("rw") && v.perms.ends_with('s')
    {
        return Ok(Kind::Ours);
    }
    if private_rw && (v.path.is_empty() || v.path == "[heap]") {
        return Ok(Kind::Anon);
    }
    // A private writable file mapping (a program's or library's data
    // section, where rdma_client keeps its buffers, or any MAP_PRIVATE
    // file mapping): its pages are the process's own copies, never
    // written back, so they move like anonymous ones.
    if private_rw && v.path.starts_with('/') && !v.path.starts_with("/memfd:") {
        return Ok(Kind::Anon);
    }
    if private_rw && v.path.starts_with("/anon_hugepage") {
        return Ok(Kind::AnonHuge);
    }
    let what = match (v.path.as_str(), v.perms.as_str()) {
        ("[stack]", _) => "the stack",
        (_, p) if !p.starts_with("rw") => "not writable",
        (_, p) if p.ends_with('s') => "shared memory",
        _ => "file-backed",
    };
    Err(NotShareable {
        what,
        start: v.start,
        end: v.end,
        perms: v.perms.clone(),
        path: v.path.clone(),
    })
}

/// Moves `[addr, addr + len)` into memfds (or finds it moved) and takes a
/// reference on each piece.
pub fn share(addr: usize, len: usize) -> Result<Shared, Refusal> {
    let end = addr
        .checked_add(len)
        .filter(|_| len > 0 && addr != 0)
        .ok_or((libc::EINVAL, format!("buffer {addr:#x} of {len} bytes")))?;
    watch_forks();
    let mut pieces = PIECES.lock().unwrap_or_else(|p| p.into_inner());
    let vmas = maps()?;
    // Forget pieces whose pages are no longer ours (freed and reused).
    pieces.retain(|&s, p| {
        vmas.iter()
            .any(|v| v.start <= s && p.end <= v.end && is_piece(&v.path, &p.name))
    });
    // The mappings under the buffer, their kinds, and the page size.
    let mut huge = false;
    let mut at = addr;
    for v in vmas.iter().filter(|v| v.end > addr && v.start < end) {
        if v.start > at {
            return Err((
                libc::EFAULT,
                format!("{at:#x}-{:#x} is not mapped", v.start),
            ));
        }
        match kind(v) {
            Ok(Kind::AnonHuge) => huge = true,
            Ok(Kind::Ours) => {
                huge |= pieces
                    .values()
                    .any(|p| p.huge && is_piece(&v.path, &p.name))
            }
            Ok(Kind::Anon) => {}
            Err(why) => {
                return Err((
                    libc::EINVAL,
                    format!("the buffer is in memory that cannot be shared with the NIC: {why}"),
                ))
            }
        }
        at = v.end;
    }
    if at < end {
        return Err((libc::EFAULT, format!("{at:#x}-{end:#x} is not mapped")));
    }
    let unit = if huge { HUGE } else { PAGE };
    let (a0, a1) = (addr / unit * unit, end.div_ceil(unit) * unit);
    // Walk [a0, a1): reuse moved pieces, move the gaps between them.
    let mut out = Shared {
        pieces: Vec::new(),
        start: (addr - a0) as u64,
        keys: Vec::new(),
    };
    let mut cur = a0;
    while cur < a1 {
        let hit = pieces
            .range(..=cur)
            .next_back()
            .filter(|(_, p)| p.end > cur)
            .map(|(&s, _)| s);
        match hit {
            Some(s) => {
                let p = &pieces[&s];
                let stop = p.end.min(a1);
                out.pieces
                    .push((p.fd.clone(), (cur - s) as u64, (stop - cur) as u64));
                out.keys.push(s);
                cur = stop;
            }
            None => {
                let next = pieces.range(cur..).next().map_or(a1, |(&s, _)| s.min(a1));
                let (fd, name) = match move_pages(cur, next - cur, huge) {
                    Ok(x) => x,
                    Err(e) => {
                        // References are taken only at the end: give back
                        // just the pages this call moved.
                        forget_unheld(&mut pieces);
                        return Err(e);
                    }
                };
                let fd = Arc::new(fd);
                out.pieces.push((fd.clone(), 0, (next - cur) as u64));
                out.keys.push(cur);
                pieces.insert(
                    cur,
                    Piece {
                        end: next,
                        fd,
                        name,
                        huge,
                        refs: 0,
                    },
                );
                cur = next;
            }
        }
    }
    for k in &out.keys {
        if let Some(p) = pieces.get_mut(k) {
            p.refs += 1;
        }
    }
    Ok(out)
}

fn sys(what: &str) -> impl FnOnce(nix::errno::Errno) -> Refusal + '_ {
    move |e| (e as i32, format!("{what}: {e}"))
}

/// Copies `[at, at + len)` into a new memfd and maps it over the same
/// addresses.
fn move_pages(at: usize, len: usize, huge: bool) -> Result<(OwnedFd, String), Refusal> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
    use std::num::NonZeroUsize;
    let name = format!(
        "rnic-mr-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let cname = CString::new(name.clone()).expect("no NUL");
    let mut flags = MemFdCreateFlag::MFD_CLOEXEC;
    if huge {
        flags |= MemFdCreateFlag::MFD_HUGETLB;
    }
    let fd = memfd_create(&cname, flags).map_err(sys("memfd_create"))?;
    nix::unistd::ftruncate(&fd, len as i64).map_err(sys("ftruncate"))?;
    let n = NonZeroUsize::new(len).expect("pieces are not empty");
    // SAFETY: a fresh shared mapping of our new memfd at an address the
    // kernel chooses; unmapped below before anything else can see it.
    let tmp = unsafe {
        mmap(
            None,
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd.as_fd(),
            0,
        )
    }
    .map_err(sys("mmap memfd"))?;
    // SAFETY: [at, at + len) is mapped readable private anonymous memory
    // of this process (checked against /proc/self/maps by the caller,
    // under the lock); `tmp` is our fresh mapping of the same length;
    // they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(at as *const u8, tmp.as_ptr().cast::<u8>(), len);
        let _ = munmap(tmp, len);
    }
    // SAFETY: MAP_FIXED replaces exactly the application's pages we just
    // copied with the memfd holding the same bytes; the range is the
    // caller's own buffer (rounded to pages), which the verbs contract
    // hands to the library for the registration.
    unsafe {
        mmap(
            Some(NonZeroUsize::new(at).expect("non-null")),
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
            fd.as_fd(),
            0,
        )
    }
    .map_err(sys("mmap over the buffer"))?;
    if crate::strings::FORK_INIT.load(Ordering::Relaxed) {
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTFORK) };
    }
    Ok((fd, format!("/memfd:{name}")))
}

fn drop_refs(pieces: &mut BTreeMap<usize, Piece>, keys: &[usize]) {
    for k in keys {
        if let Some(p) = pieces.get_mut(k) {
            p.refs = p.refs.saturating_sub(1);
        }
    }
    forget_unheld(pieces);
}

/// Pieces no region holds go back to private memory and out of the table.
fn forget_unheld(pieces: &mut BTreeMap<usize, Piece>) {
    let free: Vec<usize> = pieces
        .iter()
        .filter(|(_, p)| p.refs == 0)
        .map(|(&s, _)| s)
        .collect();
    for s in free {
        if let Some(p) = pieces.remove(&s) {
            if !p.huge {
                restore(s, p.end - s, &p.name);
            }
        }
    }
}

/// Gives pages no region holds any more back to private anonymous
/// memory with their bytes, if they are still our memfd's.
fn restore(at: usize, len: usize, name: &str) {
    let ours = maps().is_ok_and(|vs| {
        vs.iter()
            .any(|v| v.start <= at && at + len <= v.end && is_piece(&v.path, name))
    });
    if ours {
        privatize(at, len, false);
    }
}

/// Replaces the mapping over `[at, at + len)` by private anonymous pages
/// (hugetlb ones with `huge`) holding the same bytes, in one step. Makes
/// no allocation (it runs in a child of fork too); false when the kernel
/// gives no pages, and the mapping then stays.
fn privatize(at: usize, len: usize, huge: bool) -> bool {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if huge { libc::MAP_HUGETLB } else { 0 };
    // SAFETY: a fresh private anonymous mapping the kernel places.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: [at, at + len) is a readable mapping of ours (the caller's
    // check), `tmp` our fresh mapping of `len` bytes; mremap moves the new
    // pages with their bytes over the range, replacing the old mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(at as *const u8, tmp.cast::<u8>(), len);
        let r = libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            at as *mut libc::c_void,
        );
        if r == libc::MAP_FAILED {
            libc::munmap(tmp, len);
            return false;
        }
    }
    true
}

/// The socket pair of the fork in progress: the child says on it when it
/// has its private copies, and the parent waits for that (-1: no
/// handshake, nothing was moved).
static FORK_PIPE: [std::sync::atomic::AtomicI32; 2] = [
    std::sync::atomic::AtomicI32::new(-1),
    std::sync::atomic::AtomicI32::new(-1),
];

/// The fork's socket pair (read end, write end), leaving none behind.
fn take_fork_pair() -> (i32, i32) {
    (
        FORK_PIPE[0].swap(-1, Ordering::Relaxed),
        FORK_PIPE[1].swap(-1, Ordering::Relaxed),
    )
}

/// Before `fork`, in the parent: with pages moved, a socket pair for the
/// child to say it has copied them.
extern "C" fn before_fork() {
    if crate::strings::FORK_INIT.load(Ordering::Relaxed) || !has_pieces() {
        return;
    }
    let mut fds = [-1; 2];
    // A socket pair rather than a pipe: the child's note is sent with
    // MSG_NOSIGNAL, so a parent gone early never kills it with SIGPIPE.
    // SAFETY: socketpair writes two fds into the array we own.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } == 0
    {
        FORK_PIPE[0].store(fds[0], Ordering::Relaxed);
        FORK_PIPE[1].store(fds[1], Ordering::Relaxed);
    }
}

/// After `fork`, in the parent: wait until the child has its copies.
/// The moved pages are shared with the child until it copies them, so
/// what this thread writes there meanwhile (malloc's heap around a small
/// buffer) would land in the child's heap too, half-made. The child's
/// exit ends the wait as well (its end closes).
extern "C" fn parent_after_fork() {
    let (r, w) = take_fork_pair();
    if r < 0 {
        return;
    }
    // SAFETY: our own socket pair's fds, closed once here (the child
    // closes its copies itself).
    unsafe {
        libc::close(w);
        let mut b = 0u8;
        while libc::read(r, (&mut b as *mut u8).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::close(r);
    }
}

/// In a child of `fork`: the moved pages are shared mappings of memfds, so
/// the child would share them (and malloc's heap around a small buffer)
/// with its parent. Each becomes a private copy, which is what fork gives
/// all other memory; the parent's registrations are untouched, and the
/// parent waits (in [`parent_after_fork`]) until the copies are made.
/// Pages under `ibv_fork_init`'s MADV_DONTFORK are not in the child at all.
extern "C" fn privatize_in_child() {
    let (r, w) = take_fork_pair();
    if !crate::strings::FORK_INIT.load(Ordering::Relaxed) {
        // Locked only if another thread of the parent was registering at
        // the fork; that thread does not exist here, so the table stays
        // as it is.
        if let Ok(pieces) = PIECES.try_lock() {
            for (&s, p) in pieces.iter() {
                privatize(s, p.end - s, p.huge);
            }
        }
    }
    if r >= 0 {
        // SAFETY: the child's copies of the parent's socket pair.
        unsafe {
            libc::close(r);
            let _ = libc::send(w, [1u8].as_ptr().cast(), 1, libc::MSG_NOSIGNAL);
            libc::close(w);
        }
    }
}

/// Whether any pages are moved (without waiting for the table's lock:
/// a registration in progress counts as moved).
fn has_pieces() -> bool {
    PIECES.try_lock().map_or(true, |p| !p.is_empty())
}

/// Installs the fork handlers once, before the first pages move.
fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers handlers that make no allocation and take no
        // lock they could wait on (try_lock only).
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(parent_after_fork),
                Some(privatize_in_child),
            )
        };
    });
}

/// Drops a registration's references; pages no region holds go back to
/// private memory.
pub fn release(keys: &[usize]) {
    let mut pieces = PIECES.lock().unwrap_or_else(|p| p.into_inner());
    drop_refs(&mut pieces, keys);
}
