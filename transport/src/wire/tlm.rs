//! The telemetry (TLM) block of this project: a 4-byte header and `maxhop`
//! 16-byte hop records allocated by the sender and filled in place by
//! switches.
//!
//! ```text
//! header:  ver:2 flags:6 | nhop:4 maxhop:4 | path_id u16
//! hop:     ts_ns u32 | tx_bytes u32 | qlen u32 | rate u16 | switch_id u8 | port_id u8
//! ```
//!
//! With flag bit 1 (COMPACT) the sender asks for 8-byte hop records, as
//! the HPCC authors' simulator carries them (42 bytes of telemetry for 5
//! hops instead of 84), one big-endian u64 per hop:
//!
//! ```text
//! ts_ns mod 2^24 (24) | tx_bytes / 128 mod 2^20 (20) | qlen / 128, saturating (16) | rate code (4)
//! ```
//!
//! With flag bit 2 (SUBSCRIBE) a data packet asks the switches on its way
//! for an INT response (draft-00 s6.3): a congested egress port sends the
//! stack, with its own record added, straight back to the sender
//! (`wire::int_response`, opcode 0xC3).
//!
//! With flag bit 4 (SOJOURN) the sender asks the switches for the
//! packet's sojourn time instead of the queue length (HPCC++ 2023 s9.3):
//! the qlen field holds the egress minus the ingress timestamp of this
//! packet at that hop, in nanoseconds (saturating), or in units of
//! [`COMPACT_SOJOURN_UNIT_NS`] in a compact record (saturating at about
//! 1 ms).
//!
//! With flag bit 5 (AUTH) an echoed stack ends with an 8-byte MAC after
//! its hop slots: a truncated keyed MAC (SipHash-2-4 with the QP's feedback
//! key, `rc::auth`) over the feedback, so that the sender acts only on
//! telemetry its peer reflected.
//!
//! The rate code indexes [`COMPACT_RATES`] (the largest rate not above the
//! port's; 0 when the port is slower than all of them: no sample). A
//! compact hop has no switch or port id (`path_id` still changes with the
//! path). Decoded, its timestamp wraps mod 2^24 ns and its byte count mod
//! 2^27 ([`COMPACT_TS_MASK`], [`COMPACT_BYTES_MASK`]): consumers take
//! deltas under those masks.

use super::bytes::{check_len, get_u16, get_u32, set_u16, set_u32};
use super::{Layer, WireError};

/// TLM header length.
pub const HEADER_LEN: usize = 4;
/// Hop record length.
pub const HOP_LEN: usize = 16;
/// Most hop slots a block can allocate.
pub const MAX_HOPS: usize = 15;
/// Compact hop record length.
pub const COMPACT_HOP_LEN: usize = 8;
/// Flag bit 0: the stack was reflected by a receiver.
pub const FLAG_ECHO: u8 = 0x01;
/// Flag bit 1: hop records are compact (8 bytes).
pub const FLAG_COMPACT: u8 = 0x02;
/// Flag bit 2: the sender subscribes this packet to INT responses.
pub const FLAG_SUBSCRIBE: u8 = 0x04;
/// Flag bit 3, in an echoed stack: `path_id` holds N, the receiver's count
/// of concurrent flows through its last hop (HPCC++ draft-00 s6.2), not
/// the path id.
pub const FLAG_NFLOWS: u8 = 0x08;
/// Flag bit 4: each hop's qlen field holds the packet's sojourn time at
/// that hop (ns), not the queue's bytes.
pub const FLAG_SOJOURN: u8 = 0x10;
/// Flag bit 5: the block ends with an 8-byte MAC ([`MAC_LEN`]).
pub const FLAG_AUTH: u8 = 0x20;
/// Bytes of the MAC that follows the hop slots under AUTH.
pub const MAC_LEN: usize = 8;
/// The rate every relative record names (HPCC++ 2023 s9.1, see
/// [`HopRecord::relative`]): 1.6 Tb/s in units of 100 Mb/s, a multiple of
/// every rate a compact record can name.
pub const RELATIVE_RATE: u16 = 16000;
/// A relative record's tx_bytes is rounded down to this many (virtual)
/// bytes, so that its deltas are not all multiples of the scale factor
/// (which would give the port's capacity away).
pub const RELATIVE_BYTE_QUANTUM: u32 = 1024;
/// Nanoseconds per unit of a compact hop's qlen field under SOJOURN.
pub const COMPACT_SOJOURN_UNIT_NS: u32 = 16;
/// Port rates a compact hop can name, in units of 100 Mb/s, by code.
pub const COMPACT_RATES: [u16; 16] = [
    0, 1, 2, 10, 20, 25, 50, 100, 250, 400, 500, 1000, 2000, 4000, 8000, 16000,
];
/// Bytes per unit of a compact hop's tx_bytes and qlen.
pub const COMPACT_BYTE_UNIT: u32 = 128;
/// A compact hop's timestamp wraps mod 2^24 ns.
pub const COMPACT_TS_MASK: u32 = (1 << 24) - 1;
/// A compact hop's tx_bytes wraps mod 2^27 (2^20 units of 128 bytes).
pub const COMPACT_BYTES_MASK: u32 = (1 << 27) - 1;

/// Bytes a TLM block with `maxhop` 16-byte slots occupies.
pub const fn block_len(maxhop: u8) -> usize {
    HEADER_LEN + HOP_LEN * maxhop as usize
}

/// Bytes a TLM block with `maxhop` slots occupies, compact or not.
pub const fn block_len_of(maxhop: u8, compact: bool) -> usize {
    HEADER_LEN + hop_len(compact) * maxhop as usize
}

/// Bytes of a block with these slots, compact or not, with a MAC or not.
pub const fn block_len_with(maxhop: u8, compact: bool, auth: bool) -> usize {
    block_len_of(maxhop, compact) + if auth { MAC_LEN } else { 0 }
}

/// Unit of a compact record's qlen field: 128 bytes, or 16 ns of sojourn.
const fn qlen_unit(sojourn: bool) -> u32 {
    if sojourn {
        COMPACT_SOJOURN_UNIT_NS
    } else {
        COMPACT_BYTE_UNIT
    }
}

const fn hop_len(compact: bool) -> usize {
    if compact {
        COMPACT_HOP_LEN
    } else {
        HOP_LEN
    }
}

/// One switch egress snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HopRecord {
    /// Egress timestamp in nanoseconds, wrapping mod 2^32.
    pub ts_ns: u32,
    /// Bytes sent by the egress port before this packet, wrapping mod 2^32.
    pub tx_bytes: u32,
    /// Egress queue bytes after this dequeue, saturating; in a stack
    /// with [`FLAG_SOJOURN`], this packet's sojourn time at the hop (ns).
    pub qlen: u32,
    /// Link capacity in units of 100 Mb/s.
    pub rate: u16,
    pub switch_id: u8,
    pub port_id: u8,
}

impl HopRecord {
    fn read(b: &[u8]) -> Self {
        HopRecord {
            ts_ns: get_u32(b, 0),
            tx_bytes: get_u32(b, 4),
            qlen: get_u32(b, 8),
            rate: get_u16(b, 12),
            switch_id: b[14],
            port_id: b[15],
        }
    }

    fn write(&self, b: &mut [u8]) {
        set_u32(b, 0, self.ts_ns);
        set_u32(b, 4, self.tx_bytes);
        set_u32(b, 8, self.qlen);
        set_u16(b, 12, self.rate);
        b[14] = self.switch_id;
        b[15] = self.port_id;
    }

    /// The compact record: fields truncated to their widths (see the
    /// module doc), the rate rounded down to a code, qlen in `qunit`s.
    fn write_compact(&self, b: &mut [u8], qunit: u32) {
        let code = COMPACT_RATES
            .iter()
            .rposition(|&r| r <= self.rate)
            .unwrap_or(0) as u64;
        let units = |v: u32| u64::from(v / COMPACT_BYTE_UNIT);
        let v = (u64::from(self.ts_ns & COMPACT_TS_MASK) << 40)
            | ((units(self.tx_bytes) & 0xF_FFFF) << 20)
            | (u64::from(self.qlen / qunit).min(0xFFFF) << 4)
            | code;
        b[..COMPACT_HOP_LEN].copy_from_slice(&v.to_be_bytes());
    }

    fn read_compact(b: &[u8], qunit: u32) -> Self {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..COMPACT_HOP_LEN]);
        let v = u64::from_be_bytes(a);
        HopRecord {
            ts_ns: (v >> 40) as u32,
            tx_bytes: ((v >> 20) & 0xF_FFFF) as u32 * COMPACT_BYTE_UNIT,
            qlen: ((v >> 4) & 0xFFFF) as u32 * qunit,
            rate: COMPACT_RATES[(v & 0xF) as usize],
            switch_id: 0,
            port_id: 0,
        }
    }

    /// The queue this record reports, in bytes: qlen, or, in a stack with
    /// [`FLAG_SOJOURN`], the bytes the port sends in the packet's sojourn
    /// time (sojourn x B), which puts the delay the packet met into
    /// HPCC's qlen / (B T) term (saturating).
    pub fn queue_bytes(&self, sojourn: bool) -> u32 {
        if !sojourn {
            return self.qlen;
        }
        // B in bytes per ns is rate / 80 (rate in units of 100 Mb/s).
        (u64::from(self.qlen) * u64::from(self.rate) / 80).min(u64::from(u32::MAX)) as u32
    }

    /// Link capacity in bits per second.
    pub fn rate_bps(&self) -> u64 {
        u64::from(self.rate) * 100_000_000
    }

    /// The rate of every relative record's virtual port, bits per second.
    pub const fn relative_rate_bps() -> u64 {
        RELATIVE_RATE as u64 * 100_000_000
    }

    /// The record with only the port's load relative to its capacity left
    /// (HPCC++ 2023 s9.1: "only convey the relative ratio ... without
    /// revealing the actual network load"): the port becomes a virtual
    /// one of [`RELATIVE_RATE`], its byte counter and queue are scaled by
    /// k = RELATIVE_RATE / rate (rounded; at least 1), the counter rounded
    /// down to [`RELATIVE_BYTE_QUANTUM`], the switch and port ids zeroed.
    /// The timestamp and a sojourn time stay. Deltas of the scaled counter
    /// over the same timestamps give tx rate / B, and the scaled queue
    /// gives qlen / B, so HPCC's U is what it was (to the rounding), while
    /// B, the bytes sent and the bytes queued are gone. A record of rate 0
    /// (no sample) keeps only its timestamp.
    ///
    /// `compact` and `sojourn` are the stack's flags: the counter wraps as
    /// the stack's records wrap and the queue saturates as they do, so
    /// that a relative record survives a compact encoding unchanged and
    /// `relative` of a relative record is itself.
    pub fn relative(&self, compact: bool, sojourn: bool) -> HopRecord {
        if self.rate == 0 {
            return HopRecord {
                ts_ns: self.ts_ns,
                ..HopRecord::default()
            };
        }
        let rate = u32::from(self.rate);
        let k = ((u32::from(RELATIVE_RATE) + rate / 2) / rate).max(1);
        let mut tx = self.tx_bytes.wrapping_mul(k) & !(RELATIVE_BYTE_QUANTUM - 1);
        let mut qlen = if sojourn {
            self.qlen
        } else {
            self.qlen.saturating_mul(k)
        };
        if compact {
            tx &= COMPACT_BYTES_MASK;
            let unit = qlen_unit(sojourn);
            qlen = (qlen / unit).min(0xFFFF) * unit;
        }
        HopRecord {
            ts_ns: self.ts_ns,
            tx_bytes: tx,
            qlen,
            rate: RELATIVE_RATE,
            switch_id: 0,
            port_id: 0,
        }
    }
}

/// Zero-copy view of a TLM block. `new_checked` guarantees that all
/// `maxhop` slots lie within the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Tlm<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Tlm<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        check_len(b, HEADER_LEN, Layer::Tlm)?;
        check_len(
            b,
            block_len_with(b[1] & 0x0f, b[0] & FLAG_COMPACT != 0, b[0] & FLAG_AUTH != 0),
            Layer::Tlm,
        )?;
        Ok(Tlm { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[0] >> 6
    }

    pub fn flags(&self) -> u8 {
        self.b()[0] & 0x3f
    }

    pub fn echo(&self) -> bool {
        self.flags() & FLAG_ECHO != 0
    }

    /// Are the hop records compact (8 bytes)?
    pub fn compact(&self) -> bool {
        self.flags() & FLAG_COMPACT != 0
    }

    /// Does the sender want INT responses for this packet?
    pub fn subscribe(&self) -> bool {
        self.flags() & FLAG_SUBSCRIBE != 0
    }

    /// Does `path_id` hold the receiver's flow count N?
    pub fn nflows(&self) -> bool {
        self.flags() & FLAG_NFLOWS != 0
    }

    /// Do the hops' qlen fields hold sojourn times?
    pub fn sojourn(&self) -> bool {
        self.flags() & FLAG_SOJOURN != 0
    }

    fn hop_len(&self) -> usize {
        hop_len(self.compact())
    }

    /// Slots filled.
    pub fn nhop(&self) -> u8 {
        self.b()[1] >> 4
    }

    /// Slots allocated.
    pub fn maxhop(&self) -> u8 {
        self.b()[1] & 0x0f
    }

    pub fn path_id(&self) -> u16 {
        get_u16(self.b(), 2)
    }

    /// Length of the block (header and every allocated slot).
    pub fn block_len(&self) -> usize {
        block_len_with(self.maxhop(), self.compact(), self.auth())
    }

    /// Does the block end with a MAC?
    pub fn auth(&self) -> bool {
        self.flags() & FLAG_AUTH != 0
    }

    /// The MAC after the hop slots, under AUTH.
    pub fn mac(&self) -> Option<u64> {
        let at = block_len_of(self.maxhop(), self.compact());
        self.auth().then(|| {
            let mut m = [0u8; MAC_LEN];
            m.copy_from_slice(&self.b()[at..at + MAC_LEN]);
            u64::from_be_bytes(m)
        })
    }

    /// Hop record in slot `i`, if the slot is allocated.
    pub fn hop(&self, i: usize) -> Option<HopRecord> {
        if i >= usize::from(self.maxhop()) {
            return None;
        }
        let at = &self.b()[HEADER_LEN + i * self.hop_len()..];
        Some(if self.compact() {
            HopRecord::read_compact(at, qlen_unit(self.sojourn()))
        } else {
            HopRecord::read(at)
        })
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Tlm<T> {
    /// Pushes a switch's record into the next free slot and folds its
    /// switch_id into path_id. Returns false, leaving the block alone, when
    /// every slot is full (nhop == maxhop) or the block is malformed.
    pub fn push_hop(&mut self, hop: &HopRecord) -> bool {
        let (nhop, maxhop) = (self.nhop(), self.maxhop());
        if nhop >= maxhop {
            return false;
        }
        let (compact, len) = (self.compact(), self.hop_len());
        let qunit = qlen_unit(self.sojourn());
        let at = HEADER_LEN + usize::from(nhop) * len;
        let path = self.path_id() ^ u16::from(hop.switch_id);
        let b = self.buffer.as_mut();
        if compact {
            hop.write_compact(&mut b[at..at + len], qunit);
        } else {
            hop.write(&mut b[at..at + len]);
        }
        b[1] = ((nhop + 1) << 4) | maxhop;
        set_u16(b, 2, path);
        true
    }

    /// The block's bytes, to rewrite it whole (its length is fixed).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Rewrites every filled record as [`HopRecord::relative`] (a domain's
    /// boundary switch, wire.md "Relative telemetry"); the path id, the
    /// flags and a MAC stay. Returns the records rewritten.
    pub fn make_relative(&mut self) -> usize {
        let (nhop, compact, sojourn) = (usize::from(self.nhop()), self.compact(), self.sojourn());
        let len = self.hop_len();
        for i in 0..nhop {
            let Some(h) = self.hop(i) else { return i };
            let r = h.relative(compact, sojourn);
            let at = HEADER_LEN + i * len;
            let b = &mut self.buffer.as_mut()[at..at + len];
            if compact {
                r.write_compact(b, qlen_unit(sojourn));
            } else {
                r.write(b);
            }
        }
        nhop
    }

    /// Sets or clears the ECHO flag.
    pub fn set_echo(&mut self, echo: bool) {
        let b = &mut self.buffer.as_mut()[0];
        *b = (*b & !FLAG_ECHO) | if echo { FLAG_ECHO } else { 0 };
    }
}

/// A TLM block. Slots `nhop..maxhop` are empty and emitted as zeros;
/// `hops[nhop..]` is ignored when emitting and zero after parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TlmRepr {
    pub echo: bool,
    /// 8-byte hop records (see the module doc).
    pub compact: bool,
    /// INT responses wanted (see the module doc).
    pub subscribe: bool,
    /// `path_id` holds N, the receiver's flow count ([`FLAG_NFLOWS`]).
    pub nflows: bool,
    /// Hops carry sojourn times in qlen ([`FLAG_SOJOURN`]).
    pub sojourn: bool,
    /// The MAC after the slots ([`FLAG_AUTH`]).
    pub mac: Option<u64>,
    pub nhop: u8,
    pub maxhop: u8,
    pub path_id: u16,
    pub hops: [HopRecord; MAX_HOPS],
}

impl TlmRepr {
    /// An empty block with `maxhop` slots (clamped to 1..=15), as a sender
    /// allocates it.
    pub fn empty(maxhop: u8) -> Self {
        TlmRepr {
            echo: false,
            compact: false,
            subscribe: false,
            nflows: false,
            sojourn: false,
            mac: None,
            nhop: 0,
            maxhop: maxhop.clamp(1, MAX_HOPS as u8),
            path_id: 0,
            hops: [HopRecord::default(); MAX_HOPS],
        }
    }

    /// An empty block of `maxhop` compact slots.
    pub fn empty_compact(maxhop: u8) -> Self {
        TlmRepr {
            compact: true,
            ..Self::empty(maxhop)
        }
    }

    /// The filled hop records.
    pub fn filled(&self) -> &[HopRecord] {
        &self.hops[..usize::from(self.nhop.min(self.maxhop)).min(MAX_HOPS)]
    }

    /// The stack with every filled record relative
    /// ([`HopRecord::relative`]).
    pub fn relative(&self) -> TlmRepr {
        let mut t = *self;
        for h in &mut t.hops[..usize::from(self.nhop.min(self.maxhop)).min(MAX_HOPS)] {
            *h = h.relative(self.compact, self.sojourn);
        }
        t
    }

    /// Bytes the block occupies.
    pub fn block_len(&self) -> usize {
        block_len_with(self.maxhop, self.compact, self.mac.is_some())
    }

    /// Are the hop counts valid (1 <= maxhop <= 15, nhop <= maxhop)?
    pub fn is_valid(&self) -> bool {
        (1..=MAX_HOPS as u8).contains(&self.maxhop) && self.nhop <= self.maxhop
    }

    /// Reads a checked block: refuses version != 0, maxhop == 0 and
    /// nhop > maxhop.
    pub fn parse<T: AsRef<[u8]>>(t: &Tlm<T>) -> Result<Self, WireError> {
        Self::check(t)?;
        let (nhop, maxhop) = (t.nhop(), t.maxhop());
        let mut hops = [HopRecord::default(); MAX_HOPS];
        for (i, h) in hops.iter_mut().enumerate().take(usize::from(nhop)) {
            *h = t.hop(i).unwrap_or_default();
        }
        Ok(TlmRepr {
            echo: t.echo(),
            compact: t.compact(),
            subscribe: t.subscribe(),
            nflows: t.nflows(),
            sojourn: t.sojourn(),
            mac: t.mac(),
            nhop,
            maxhop,
            path_id: t.path_id(),
            hops,
        })
    }

    /// The errors [`TlmRepr::parse`] would return, without building the
    /// block: version 0, 1..=15 slots, no more hops filled than slots.
    pub fn check<T: AsRef<[u8]>>(t: &Tlm<T>) -> Result<(), WireError> {
        if t.version() != 0 {
            return Err(WireError::BadTlmVersion(t.version()));
        }
        let (nhop, maxhop) = (t.nhop(), t.maxhop());
        if maxhop == 0 || nhop > maxhop {
            return Err(WireError::BadTlmHops { nhop, maxhop });
        }
        Ok(())
    }

    /// Writes the block into `buf`, which holds at least `block_len()`
    /// bytes; the caller has checked `is_valid()`.
    pub fn emit(&self, buf: &mut [u8]) {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        buf[0] = flag(self.echo, FLAG_ECHO)
            | flag(self.compact, FLAG_COMPACT)
            | flag(self.subscribe, FLAG_SUBSCRIBE)
            | flag(self.nflows, FLAG_NFLOWS)
            | flag(self.sojourn, FLAG_SOJOURN)
            | flag(self.mac.is_some(), FLAG_AUTH);
        buf[1] = (self.nhop << 4) | (self.maxhop & 0x0f);
        set_u16(buf, 2, self.path_id);
        let len = hop_len(self.compact);
        let (filled, slots) = (usize::from(self.nhop), usize::from(self.maxhop));
        for i in 0..filled.min(slots) {
            let slot = &mut buf[HEADER_LEN + i * len..HEADER_LEN + (i + 1) * len];
            if self.compact {
                self.hops[i].write_compact(slot, qlen_unit(self.sojourn));
            } else {
                self.hops[i].write(slot);
            }
        }
        // The empty slots in one fill, not one per slot.
        buf[HEADER_LEN + filled.min(slots) * len..HEADER_LEN + slots * len].fill(0);
        if let Some(m) = self.mac {
            let at = block_len_of(self.maxhop, self.compact);
            buf[at..at + MAC_LEN].copy_from_slice(&m.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_record_keeps_the_load_and_hides_the_port() {
        // A 25G port (k = 64) that sends at line rate over 10 us, its
        // counter wrapping, 50 KB queued.
        let a = HopRecord {
            ts_ns: 1_000,
            tx_bytes: u32::MAX - 10_000,
            qlen: 0,
            rate: 250,
            switch_id: 7,
            port_id: 3,
        };
        let b = HopRecord {
            ts_ns: 11_000,
            tx_bytes: a.tx_bytes.wrapping_add(31_250),
            qlen: 50_000,
            ..a
        };
        // tx rate / B, and the queue's drain time in ns.
        let u_tx = |x: &HopRecord, y: &HopRecord| {
            f64::from(y.tx_bytes.wrapping_sub(x.tx_bytes)) * 8.0
                / f64::from(y.ts_ns - x.ts_ns)
                / (f64::from(y.rate) / 10.0)
        };
        let drain_ns = |y: &HopRecord| f64::from(y.qlen) * 8.0 / (f64::from(y.rate) / 10.0);
        let (ra, rb) = (a.relative(false, false), b.relative(false, false));
        assert!((u_tx(&a, &b) - 1.0).abs() < 1e-9);
        let quantum = f64::from(RELATIVE_BYTE_QUANTUM) * 8.0 / 10_000.0 / 1600.0;
        assert!(
            (u_tx(&ra, &rb) - 1.0).abs() <= quantum,
            "{}",
            u_tx(&ra, &rb)
        );
        assert_eq!(drain_ns(&rb), drain_ns(&b));
        assert_eq!((rb.rate, rb.switch_id, rb.port_id), (RELATIVE_RATE, 0, 0));
        assert_eq!(rb.ts_ns, b.ts_ns);
        // A sojourn time is already relative; no sample stays no sample.
        assert_eq!(b.relative(false, true).qlen, 50_000);
        let none = HopRecord { rate: 0, ..b }.relative(false, false);
        assert_eq!(
            none,
            HopRecord {
                ts_ns: b.ts_ns,
                ..HopRecord::default()
            }
        );
    }

    fn hop(sw: u8) -> HopRecord {
        HopRecord {
            ts_ns: 1000 * u32::from(sw),
            tx_bytes: 0xffff_fff0,
            qlen: 3000,
            rate: 1000,
            switch_id: sw,
            port_id: 2,
        }
    }

    #[test]
    fn switches_fill_slots_in_place_until_full() {
        let mut b = vec![0u8; block_len(2)];
        TlmRepr::empty(2).emit(&mut b);
        let mut t = Tlm::new_checked(&mut b[..]).unwrap();
        assert!(t.push_hop(&hop(5)));
        assert!(t.push_hop(&hop(9)));
        assert!(!t.push_hop(&hop(11)), "a full stack is left alone");
        assert_eq!((t.nhop(), t.maxhop(), t.path_id()), (2, 2, 5 ^ 9));
        let r = TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.filled(), &[hop(5), hop(9)]);
    }

    #[test]
    fn hop_record_layout() {
        let mut b = vec![0u8; block_len(1)];
        let mut r = TlmRepr::empty(1);
        r.nhop = 1;
        r.echo = true;
        r.path_id = 0x0102;
        r.hops[0] = HopRecord {
            ts_ns: 0x01020304,
            tx_bytes: 0x05060708,
            qlen: 0x090a0b0c,
            rate: 0x0d0e,
            switch_id: 0x0f,
            port_id: 0x10,
        };
        r.emit(&mut b);
        assert_eq!(
            b,
            [0x01, 0x11, 0x01, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(r.hops[0].rate_bps(), 0x0d0e * 100_000_000);
    }

    #[test]
    fn a_compact_block_has_8_byte_hops_truncated_to_their_widths() {
        let h = HopRecord {
            ts_ns: 0x0123_4567,
            tx_bytes: 0x0987_6543,
            qlen: 100_000,
            rate: 1000,
            switch_id: 7,
            port_id: 3,
        };
        assert_eq!(
            block_len_of(5, true),
            4 + 40,
            "42 B in ns-3; 44 with our header"
        );
        let mut b = vec![0u8; block_len_of(5, true)];
        TlmRepr::empty_compact(5).emit(&mut b);
        let mut t = Tlm::new_checked(&mut b[..]).unwrap();
        assert!(t.compact() && t.block_len() == 44);
        assert!(t.push_hop(&h));
        let r = TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap();
        assert!(r.compact);
        assert_eq!(
            r.filled(),
            &[HopRecord {
                ts_ns: 0x0123_4567 & COMPACT_TS_MASK,
                tx_bytes: (0x0987_6543 / 128 % (1 << 20)) * 128,
                qlen: 100_000 / 128 * 128,
                rate: 1000,
                switch_id: 0,
                port_id: 0,
            }]
        );
        assert_eq!(t_path(&b), 7, "path_id still folds the switch id");
        // The record itself: one big-endian u64.
        let v = u64::from_be_bytes(b[4..12].try_into().unwrap());
        assert_eq!(v >> 40, 0x23_4567);
        assert_eq!(v & 0xF, 11, "100G is code 11");
        // Rates round down to a code; a queue past 8 MiB saturates.
        let mut b2 = vec![0u8; block_len_of(1, true)];
        let mut r2 = TlmRepr::empty_compact(1);
        r2.nhop = 1;
        r2.hops[0] = HopRecord {
            rate: 999,
            qlen: u32::MAX,
            ..h
        };
        r2.emit(&mut b2);
        let back = TlmRepr::parse(&Tlm::new_checked(&b2[..]).unwrap()).unwrap();
        assert_eq!(back.hops[0].rate, 500);
        assert_eq!(back.hops[0].qlen, 0xFFFF * 128);
        // Slower than every code: rate 0 (no sample).
        r2.hops[0].rate = 0;
        r2.emit(&mut b2);
        let back = TlmRepr::parse(&Tlm::new_checked(&b2[..]).unwrap()).unwrap();
        assert_eq!(back.hops[0].rate, 0);
        // A compact block too short for its slots is refused.
        assert!(Tlm::new_checked(&b2[..11]).is_err());
        // Echo keeps the compact flag.
        let mut t = Tlm::new_checked(&mut b2[..]).unwrap();
        t.set_echo(true);
        assert!(t.compact() && t.echo());
    }

    #[test]
    fn under_sojourn_a_compact_qlen_counts_16_ns_units_and_the_flag_survives_echo() {
        let h = HopRecord {
            qlen: 5_000,
            rate: 1000,
            ..HopRecord::default()
        };
        for (compact, want) in [(false, 5_000), (true, 5_000 / 16 * 16)] {
            let mut r = if compact {
                TlmRepr::empty_compact(2)
            } else {
                TlmRepr::empty(2)
            };
            r.sojourn = true;
            let mut b = vec![0u8; r.block_len()];
            r.emit(&mut b);
            assert_eq!(b[0] & FLAG_SOJOURN, FLAG_SOJOURN);
            let mut t = Tlm::new_checked(&mut b[..]).unwrap();
            assert!(t.sojourn());
            assert!(t.push_hop(&h));
            t.set_echo(true);
            let back = TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap();
            assert!(back.sojourn && back.echo);
            assert_eq!(back.hops[0].qlen, want);
        }
        // A compact sojourn saturates at 2^16 - 1 units (about 1 ms).
        let mut r = TlmRepr::empty_compact(1);
        r.sojourn = true;
        r.nhop = 1;
        r.hops[0] = HopRecord {
            qlen: u32::MAX,
            ..h
        };
        let mut b = vec![0u8; r.block_len()];
        r.emit(&mut b);
        let back = TlmRepr::parse(&Tlm::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(back.hops[0].qlen, 0xFFFF * COMPACT_SOJOURN_UNIT_NS);
        // 1 us at 100G is 12,500 bytes of queue; without SOJOURN qlen is bytes.
        let us = HopRecord {
            qlen: 1_000,
            rate: 1000,
            ..h
        };
        assert_eq!(
            (us.queue_bytes(true), us.queue_bytes(false)),
            (12_500, 1_000)
        );
    }

    #[test]
    fn an_auth_block_ends_with_its_mac_after_the_slots() {
        for compact in [false, true] {
            let mut r = if compact {
                TlmRepr::empty_compact(2)
            } else {
                TlmRepr::empty(2)
            };
            r.echo = true;
            r.mac = Some(0x0102_0304_0506_0708);
            assert_eq!(r.block_len(), block_len_of(2, compact) + MAC_LEN);
            let mut b = vec![0u8; r.block_len()];
            r.emit(&mut b);
            assert_eq!(b[0] & FLAG_AUTH, FLAG_AUTH);
            assert_eq!(&b[b.len() - 8..], &[1, 2, 3, 4, 5, 6, 7, 8]);
            let t = Tlm::new_checked(&b[..]).unwrap();
            assert_eq!(t.block_len(), b.len());
            assert_eq!(TlmRepr::parse(&t).unwrap(), r);
            // A block too short for its MAC is refused.
            assert!(Tlm::new_checked(&b[..b.len() - 1]).is_err());
        }
    }

    fn t_path(b: &[u8]) -> u16 {
        Tlm::new_checked(b).unwrap().path_id()
    }

    #[test]
    fn refuses_bad_headers() {
        let mut b = vec![0u8; block_len(3)];
        b[1] = 0x03;
        b[0] = 0x40;
        let t = Tlm::new_checked(&b[..]).unwrap();
        assert_eq!(TlmRepr::parse(&t), Err(WireError::BadTlmVersion(1)));
        b[0] = 0;
        b[1] = 0x43;
        let t = Tlm::new_checked(&b[..]).unwrap();
        assert_eq!(
            TlmRepr::parse(&t),
            Err(WireError::BadTlmHops { nhop: 4, maxhop: 3 })
        );
        b[1] = 0x00;
        let t = Tlm::new_checked(&b[..]).unwrap();
        assert_eq!(
            TlmRepr::parse(&t),
            Err(WireError::BadTlmHops { nhop: 0, maxhop: 0 })
        );
        b[1] = 0x04;
        assert_eq!(
            Tlm::new_checked(&b[..]).unwrap_err(),
            WireError::Truncated(Layer::Tlm)
        );
    }
}
