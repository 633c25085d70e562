//! The frame-port trait: what the NIC pipeline needs from whatever moves
//! its frames (a DPDK queue pair, the simulator's link, an in-memory link,
//! or a wrapper around any of them such as the fault injector and the
//! pcap tap).
//!
//! A port owns its frame buffers ([`FramePort::Frame`]: an mbuf, a
//! `Vec<u8>`); a frame handed to `tx_burst` belongs to the port once taken,
//! and frames it does not take stay with the caller, so nothing leaks when
//! a ring is full. Time is passed in (`now`, nanoseconds): virtual-time
//! ports use it, wall-time ports ignore it.

use transport::wire::MacAddr;

/// An owned frame buffer. Its bytes are `as_ref()`, or, for a frame held
/// in pieces (sent from where its payload lies), `as_ref()` (every
/// header) followed by [`Frame::rest`].
pub trait Frame: AsRef<[u8]> + AsMut<[u8]> {
    /// The payload and the tail (pad and ICRC) of a frame held in three
    /// pieces, after the headers `as_ref()` holds; `None` for a frame in
    /// one buffer (the default).
    fn rest(&self) -> Option<(&[u8], &[u8])> {
        None
    }

    /// Makes a frame held in pieces one buffer, for whoever reads or
    /// changes its bytes as one (a fault, a capture); false, the frame
    /// unchanged, when its buffer cannot hold it whole. A frame in one
    /// buffer is one already (the default).
    fn linearize(&mut self) -> bool {
        true
    }

    /// Bytes an empty frame of this buffer can hold without growing: the
    /// pipeline builds a frame in place when it fits (an mbuf), else in a
    /// scratch buffer that [`Frame::set`] copies (a `Vec` sized to the
    /// frame).
    fn capacity(&self) -> usize;

    /// Makes the frame exactly `bytes`; false (frame unchanged) when they
    /// do not fit.
    fn set(&mut self, bytes: &[u8]) -> bool;

    /// Lets `build` write a frame into at least `max` bytes of room and
    /// makes the frame as long as `build` says. With nothing built (`None`)
    /// the frame stays empty, ready for reuse. Fails, building nothing,
    /// when the buffer holds fewer than `max` bytes.
    fn build(
        &mut self,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, TooSmall>;
}

/// A frame buffer smaller than the frame to build in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a frame buffer of {room} bytes cannot hold a frame of up to {need} bytes")]
pub struct TooSmall {
    pub room: usize,
    pub need: usize,
}

impl Frame for Vec<u8> {
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }

    fn set(&mut self, bytes: &[u8]) -> bool {
        self.clear();
        self.extend_from_slice(bytes);
        true
    }

    fn build(
        &mut self,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, TooSmall> {
        self.clear();
        self.resize(max, 0);
        let n = build(&mut self[..]).map(|n| n.min(max));
        self.truncate(n.unwrap_or(0));
        Ok(n)
    }
}

/// Copies `bytes` into a fresh frame of `port` (for duplicates and
/// injected frames); `None` when the port has no buffer or it is too small.
pub fn copy_frame<P: FramePort + ?Sized>(port: &mut P, bytes: &[u8]) -> Option<P::Frame> {
    let mut f = port.alloc()?;
    f.set(bytes).then_some(f)
}

/// Something that receives and transmits Ethernet frames.
pub trait FramePort {
    type Frame: Frame;

    /// Moves up to `max` received frames into `out`; returns how many.
    fn rx_burst(&mut self, now: u64, out: &mut Vec<Self::Frame>, max: usize) -> usize;

    /// Transmits frames from the front of `frames`; those the port does not
    /// take stay in `frames`, in order. Returns how many it took.
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<Self::Frame>) -> usize;

    /// An empty frame buffer, or `None` when the port has none left.
    fn alloc(&mut self) -> Option<Self::Frame>;

    /// Takes back the frames the pipeline is done with (received and
    /// handled), leaving `frames` empty. By default they are dropped one
    /// by one; a port whose buffers come from a pool may return them in
    /// one call.
    fn recycle(&mut self, frames: &mut Vec<Self::Frame>) {
        frames.clear();
    }

    /// Buffers the port holds for frames it has not been asked for yet
    /// (fresh ones fetched in bulk); counted as the pipeline's.
    fn buffers_held(&self) -> usize {
        0
    }

    /// How many frames `tx_burst` would take at `now` (a link that
    /// serializes one frame at a time takes one when it is free). Frames
    /// are built only when they can leave.
    fn tx_ready(&self, _now: u64) -> usize {
        usize::MAX
    }

    /// The next time the port will have a frame to deliver or room to
    /// send, when it knows it (virtual-time ports); `None` for ports that
    /// must be polled (DPDK) or that have nothing scheduled.
    fn next_event(&self) -> Option<u64> {
        None
    }

    fn mac(&self) -> MacAddr;

    /// Largest IP packet the port carries, bytes.
    fn mtu(&self) -> u32;

    fn link_up(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vec_frame_is_as_long_as_what_was_built() {
        let mut f: Vec<u8> = Vec::new();
        assert_eq!(
            f.build(100, |b| {
                b[..3].copy_from_slice(&[1, 2, 3]);
                Some(3)
            }),
            Ok(Some(3))
        );
        assert_eq!(f, vec![1, 2, 3]);
        assert_eq!(f.build(100, |_| None), Ok(None));
        assert!(f.is_empty());
    }
}
