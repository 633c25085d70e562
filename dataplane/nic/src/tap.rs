//! The pcap tap: a port wrapper that mirrors the frames it receives and/or
//! sends into a capture (a classic pcap file, nanosecond timestamps from
//! the `now` the pipeline passes). Several taps may share one capture, so
//! that both ends of a testbed land in one file; the capture stops
//! recording after a frame limit and counts what it left out.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use transport::wire::MacAddr;

use crate::faults::Direction;
use crate::pcap::{PcapFileError, Writer};
use crate::port::{Frame, FramePort};

/// Closes a shared capture (when there is one): the frames it recorded
/// and those it left out past its limit, or its first write error.
pub fn close(capture: Option<SharedCapture>) -> Result<Option<(u64, u64)>, PcapFileError> {
    let Some(c) = capture else {
        return Ok(None);
    };
    let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
    let written = c.finish()?;
    Ok(Some((written, c.skipped)))
}

/// A pcap file being written, shared by the taps that feed it.
pub struct Capture {
    writer: Option<Writer>,
    limit: u64,
    written: u64,
    /// Frames not recorded because the limit was reached.
    pub skipped: u64,
    error: Option<PcapFileError>,
}

/// A capture shared between taps (and threads).
pub type SharedCapture = Arc<Mutex<Capture>>;

impl Capture {
    /// A capture into `path` (its directory is created) that records at
    /// most `limit` frames.
    pub fn create(path: &Path, limit: u64) -> Result<SharedCapture, PcapFileError> {
        Self::open(path, limit, Writer::create)
    }

    /// [`Capture::create`] whose frames are in the file as soon as they are
    /// recorded (for a file read while it grows; two system calls a frame).
    pub fn create_direct(path: &Path, limit: u64) -> Result<SharedCapture, PcapFileError> {
        Self::open(path, limit, Writer::create_direct)
    }

    fn open(
        path: &Path,
        limit: u64,
        writer: fn(&Path) -> Result<Writer, PcapFileError>,
    ) -> Result<SharedCapture, PcapFileError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| PcapFileError::Io {
                path: dir.to_owned(),
                source,
            })?;
        }
        Ok(Arc::new(Mutex::new(Capture {
            writer: Some(writer(path)?),
            limit,
            written: 0,
            skipped: 0,
            error: None,
        })))
    }

    pub(crate) fn record(&mut self, now: u64, frame: &[u8]) {
        if self.written >= self.limit {
            self.skipped += 1;
            return;
        }
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        match w.write(Duration::from_nanos(now), frame) {
            Ok(()) => self.written += 1,
            Err(e) => {
                // Keep the first error for `finish`; stop writing.
                self.error = Some(e);
                self.writer = None;
            }
        }
    }

    /// Frames recorded so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes and closes the file; the first write error, if any.
    pub fn finish(&mut self) -> Result<u64, PcapFileError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if let Some(w) = self.writer.take() {
            w.finish()?;
        }
        Ok(self.written)
    }
}

/// A port whose frames are mirrored into a capture.
pub struct Tap<P> {
    inner: P,
    /// None: frames pass unrecorded.
    capture: Option<SharedCapture>,
    direction: Direction,
    /// Frames at the front of the last burst that the port refused, and
    /// that were recorded already.
    tx_recorded: usize,
}

impl<P: FramePort> Tap<P> {
    /// Mirrors the frames `inner` handles in `direction` into `capture`
    /// (with no capture, frames pass unrecorded).
    pub fn new(inner: P, capture: Option<SharedCapture>, direction: Direction) -> Self {
        Tap {
            inner,
            capture,
            direction,
            tx_recorded: 0,
        }
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    fn record(&self, now: u64, frames: &[P::Frame]) {
        let Some(capture) = self.capture.as_ref().filter(|_| !frames.is_empty()) else {
            return;
        };
        // A poisoned lock means another tap's thread panicked; its capture
        // is still a valid file up to there, so keep recording.
        let mut c = capture.lock().unwrap_or_else(|p| p.into_inner());
        let mut whole = Vec::new();
        for f in frames {
            match f.rest() {
                None => c.record(now, f.as_ref()),
                // A frame in pieces is recorded as the bytes on the wire.
                Some((payload, tail)) => {
                    whole.clear();
                    whole.extend_from_slice(f.as_ref());
                    whole.extend_from_slice(payload);
                    whole.extend_from_slice(tail);
                    c.record(now, &whole);
                }
            }
        }
    }
}

impl<P: FramePort> FramePort for Tap<P> {
    type Frame = P::Frame;

    #[inline]
    fn rx_burst(&mut self, now: u64, out: &mut Vec<P::Frame>, max: usize) -> usize {
        let start = out.len();
        let n = self.inner.rx_burst(now, out, max);
        if self.direction != Direction::Tx && self.capture.is_some() {
            self.record(now, &out[start..]);
        }
        n
    }

    #[inline]
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<P::Frame>) -> usize {
        if self.direction == Direction::Rx || self.capture.is_none() {
            return self.inner.tx_burst(now, frames);
        }
        // Frames are recorded when first offered (once the port takes them
        // they are gone); those it refuses stay at the front of `frames`
        // and are not recorded again when offered next.
        let seen = self.tx_recorded.min(frames.len());
        self.record(now, &frames[seen..]);
        let sent = self.inner.tx_burst(now, frames);
        self.tx_recorded = frames.len();
        sent
    }

    fn alloc(&mut self) -> Option<P::Frame> {
        self.inner.alloc()
    }

    fn recycle(&mut self, frames: &mut Vec<P::Frame>) {
        self.inner.recycle(frames)
    }

    fn buffers_held(&self) -> usize {
        self.inner.buffers_held()
    }

    fn tx_ready(&self, now: u64) -> usize {
        self.inner.tx_ready(now)
    }

    fn next_event(&self) -> Option<u64> {
        self.inner.next_event()
    }

    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }

    fn mtu(&self) -> u32 {
        self.inner.mtu()
    }

    fn link_up(&self) -> bool {
        self.inner.link_up()
    }
}
