//! The RoCEv2 invariant CRC (ICRC) over an IPv4 packet, with the variant
//! fields and this project's TLM block masked to ones.
//!
//! CRC-32/IEEE (as zlib.crc32) over
//! `FF x 8 | IPv4 header (TOS, TTL, checksum = FF) | UDP header (checksum = FF)
//! | BTH (byte 4 = FF) | TLM (all FF) | ext headers | payload | pad`;
//! the four wire bytes are the CRC in little-endian order.
//!
//! Two ways to get it: hash a masked copy ([`compute`], [`compute_split`]),
//! or hash the packet where it lies in its frame and fold the masked bytes
//! into the CRC's initial state ([`compute_in_frame`]: no copy, one pass
//! over the bytes). The frames a connected QP exchanges most take the
//! second way (the fixed-offset parse, the template's plain frames, the
//! general emit); a TLM block, IPv4 options, a frame in pieces (zero-copy)
//! and the layered parse take the first.

use std::cell::{Cell, RefCell};
use std::sync::LazyLock;

use super::{bth, udp, Layer, WireError};

/// ICRC length on the wire.
pub const ICRC_LEN: usize = 4;

const ONES: [u8; 256] = [0xFF; 256];
const MAX_IP_HEADER: usize = 60;

/// The CRC-32 state after the eight 0xFF bytes every ICRC starts with
/// (the LRH stand-in), so that no call hashes them again.
const AFTER_ONES_8: u32 = 0x2144_DF1C;

/// Hashers made once: `crc32fast::Hasher::new` asks the CPU which
/// kernel to use on every call (~36 instructions, four times per small
/// WRITE and its ACK); a clone does not.
static FRESH: LazyLock<crc32fast::Hasher> = LazyLock::new(crc32fast::Hasher::new);
static AFTER_ONES: LazyLock<crc32fast::Hasher> =
    LazyLock::new(|| crc32fast::Hasher::new_with_initial(AFTER_ONES_8));

/// Computes the ICRC of `ip_packet`: the IPv4 packet from its first header
/// byte up to, not including, the ICRC. `tlm_len` is the length of the TLM
/// block right after BTH (0 when there is none).
pub fn compute(ip_packet: &[u8], tlm_len: usize) -> Result<u32, WireError> {
    let ihl = usize::from(ip_packet.first().copied().unwrap_or(0) & 0x0f) * 4;
    let udp_at = ihl;
    let bth_at = udp_at + udp::HEADER_LEN;
    let tlm_at = bth_at + bth::HEADER_LEN;
    let rest_at = tlm_at + tlm_len;
    if ihl < 20 || ip_packet.len() < rest_at || tlm_len > ONES.len() {
        return Err(WireError::Truncated(Layer::Icrc));
    }
    if ip_packet.len() <= SMALL - ONES_8 {
        return Ok(compute_small(ip_packet, udp_at, bth_at, tlm_at, tlm_len));
    }
    Ok(compute_pieces(
        ip_packet,
        [&[], &[]],
        udp_at,
        bth_at,
        tlm_len,
    ))
}

/// [`compute`] of the IPv4 packet at `frame[ip_at..end]`, hashed where it
/// lies when it can be: no masked copy is made. The eight bytes before the
/// IP header (the Ethernet header's tail) stand in for the eight ones and
/// the variant fields keep their values; both are accounted for in the
/// CRC's initial state instead (a CRC is linear, so changing byte `p` of
/// the input by `d` changes the result as changing the initial state by
/// `d` run `p` bytes backwards through the CRC does). Taken for packets
/// of at least 40 bytes (IPv4, UDP and BTH headers) with a 20-byte IP
/// header and no TLM block; any other packet is computed as [`compute`]
/// does.
pub fn compute_in_frame(
    frame: &[u8],
    ip_at: usize,
    end: usize,
    tlm_len: usize,
) -> Result<u32, WireError> {
    let ip = frame
        .get(ip_at..end)
        .ok_or(WireError::Truncated(Layer::Icrc))?;
    // The eight bytes before the IP header, then at least its 20-byte
    // IPv4 header (no options), UDP and BTH.
    let input = match ip_at.checked_sub(ONES_8) {
        Some(at) if tlm_len == 0 && ip.first() == Some(&0x45) => &frame[at..end],
        _ => return compute(ip, tlm_len),
    };
    let Some(head) = input.first_chunk::<IN_PLACE_HEAD>() else {
        return compute(ip, tlm_len);
    };
    let raw_init = UNMASK.initial_state(head);
    // crc32fast keeps the register inverted. A hasher with a chosen
    // initial state asks the CPU which kernel to use (~36 instructions),
    // which a clone of a made one would not; no other way to set the
    // state is offered.
    let mut h = crc32fast::Hasher::new_with_initial(!raw_init);
    h.update(input);
    Ok(h.finalize())
}

/// The shortest IP packet [`compute_in_frame`] hashes in place: its
/// IPv4, UDP and BTH headers, which hold the bytes whose masking it folds
/// in. It is also the shortest [`compute`] takes, so every packet without
/// IPv4 options or a TLM block is hashed in place.
const IN_PLACE_MIN: usize = 20 + udp::HEADER_LEN + bth::HEADER_LEN;

/// The bytes of an in-place input [`Unmask`] reads: the eight before the
/// IP header and the shortest packet.
const IN_PLACE_HEAD: usize = ONES_8 + IN_PLACE_MIN;

/// CRC-32's polynomial, bit-reflected.
const POLY: u32 = 0xEDB8_8320;

/// Where, in an in-place ICRC input (the eight bytes before the IP header,
/// then a 20-byte IPv4 header, UDP, BTH), a byte must read as 0xFF: the
/// eight stand-ins for the ones, TOS, TTL, the header checksum, the UDP
/// checksum and BTH byte 4.
const UNMASKED_AT: [usize; 15] = [
    0,
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    ONES_8 + 1,
    ONES_8 + 8,
    ONES_8 + 10,
    ONES_8 + 11,
    ONES_8 + 20 + 6,
    ONES_8 + 20 + 7,
    ONES_8 + 28 + 4,
];

/// For each position of [`UNMASKED_AT`], the change of the raw CRC
/// register's initial state that has the effect of changing that input
/// byte by `d` (the table's index): `d` placed in the register's low byte
/// and run backwards through as many byte steps as the position.
struct Unmask {
    at: [[u32; 256]; UNMASKED_AT.len()],
}

static UNMASK: LazyLock<Unmask> = LazyLock::new(Unmask::new);

impl Unmask {
    fn new() -> Unmask {
        // The byte step's table; its entries' top bytes are all distinct,
        // which makes the step invertible.
        let mut step = [0u32; 256];
        for (i, e) in step.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *e = c;
        }
        let mut by_top = [0u8; 256];
        for (i, e) in step.iter().enumerate() {
            by_top[(e >> 24) as usize] = i as u8;
        }
        // One byte step backwards: the state before `(s >> 8) ^ step[s & 0xFF]`.
        let back = |y: u32| {
            let i = by_top[(y >> 24) as usize];
            ((y ^ step[usize::from(i)]) << 8) | u32::from(i)
        };
        let mut u = Unmask {
            at: [[0; 256]; UNMASKED_AT.len()],
        };
        let mut cur: [u32; 256] = std::array::from_fn(|d| d as u32);
        let mut pos = 0;
        for (k, &p) in UNMASKED_AT.iter().enumerate() {
            while pos < p {
                cur.iter_mut().for_each(|s| *s = back(*s));
                pos += 1;
            }
            u.at[k] = cur;
        }
        u
    }

    /// The raw register's initial state that makes `input` (its first
    /// bytes laid out as [`UNMASKED_AT`] says) hash as if those bytes
    /// were all 0xFF, from the standard initial state. The eight leading
    /// bytes are the same frame after frame on a path (an untagged
    /// frame's source MAC and EtherType; a tagged one's MAC tail and
    /// 802.1Q tag): their share is kept for a few (a frame and its ACK
    /// come from two MACs), in a slot chosen by a hash of all eight.
    #[inline]
    fn initial_state(&self, input: &[u8; IN_PLACE_HEAD]) -> u32 {
        let (lead, rest) = self.at.split_at(ONES_8);
        // Constant indices into an array: checked when compiled.
        let lead_bytes = [
            input[0], input[1], input[2], input[3], input[4], input[5], input[6], input[7],
        ];
        let key = u64::from_le_bytes(lead_bytes);
        // Fibonacci hashing: the top bits of the key times 2^64 / phi,
        // which every bit of the key moves.
        let slot = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - LEAD_SLOT_BITS)) as usize;
        let mut s = LEADS.with(|kept| match kept[slot].get() {
            Some((k, share)) if k == key => share,
            _ => {
                let mut share = u32::MAX;
                for (t, b) in lead.iter().zip(lead_bytes) {
                    share ^= t[usize::from(b ^ 0xFF)];
                }
                kept[slot].set(Some((key, share)));
                share
            }
        });
        for (t, &p) in rest.iter().zip(&UNMASKED_AT[ONES_8..]) {
            s ^= t[usize::from(input[p] ^ 0xFF)];
        }
        s
    }
}

/// How many leading eight-byte shares [`Unmask::initial_state`] keeps:
/// `1 << LEAD_SLOT_BITS`.
const LEAD_SLOT_BITS: u32 = 2;
const LEADS_KEPT: usize = 1 << LEAD_SLOT_BITS;

thread_local! {
    /// Eight bytes seen before an IP header hashed in place and their
    /// share of the initial state ([`Unmask::initial_state`]), each in the
    /// slot its hash chooses.
    static LEADS: [Cell<Option<(u64, u32)>>; LEADS_KEPT] = const {
        [const { Cell::new(None) }; LEADS_KEPT]
    };
}

/// [`compute`] of a packet whose payload lies apart from its headers (a
/// frame sent from, or received into, separate buffers): `headers` is the
/// IPv4 packet from its first byte up to the payload, followed by
/// `payload` and then `pad` (the pad bytes as they are on the wire).
pub fn compute_split(
    headers: &[u8],
    tlm_len: usize,
    payload: &[u8],
    pad: &[u8],
) -> Result<u32, WireError> {
    let ihl = usize::from(headers.first().copied().unwrap_or(0) & 0x0f) * 4;
    let bth_at = ihl + udp::HEADER_LEN;
    if ihl < 20 || headers.len() < bth_at + bth::HEADER_LEN + tlm_len || tlm_len > ONES.len() {
        return Err(WireError::Truncated(Layer::Icrc));
    }
    Ok(compute_pieces(
        headers,
        [payload, pad],
        ihl,
        bth_at,
        tlm_len,
    ))
}

/// The ICRC of `headers` (whose layout is checked) followed by `after`:
/// the headers up to the TLM block copied to mask the variant fields
/// (only the bytes used are written), then the TLM block as ones, then
/// the rest as it is.
fn compute_pieces(
    headers: &[u8],
    after: [&[u8]; 2],
    udp_at: usize,
    bth_at: usize,
    tlm_len: usize,
) -> u32 {
    let tlm_at = bth_at + bth::HEADER_LEN;
    let mut pre = [0u8; MAX_IP_HEADER + udp::HEADER_LEN + bth::HEADER_LEN];
    let pre = &mut pre[..tlm_at];
    pre.copy_from_slice(&headers[..tlm_at]);
    mask_variant_fields(pre, udp_at, bth_at);
    let mut h = AFTER_ONES.clone();
    h.update(pre);
    h.update(&ONES[..tlm_len]);
    h.update(&headers[tlm_at + tlm_len..]);
    for a in after {
        h.update(a);
    }
    h.finalize()
}

/// Sets the variant fields of a copy of the headers (IPv4 from its
/// first byte, UDP at `udp_at`, BTH at `bth_at`) to ones.
#[inline(always)]
fn mask_variant_fields(b: &mut [u8], udp_at: usize, bth_at: usize) {
    b[1] = 0xFF; // TOS
    b[8] = 0xFF; // TTL
    b[10] = 0xFF; // header checksum
    b[11] = 0xFF;
    b[udp_at + 6] = 0xFF; // UDP checksum
    b[udp_at + 7] = 0xFF;
    b[bth_at + 4] = 0xFF; // FECN, BECN, T, reserved
}

/// The eight 0xFF bytes every ICRC input starts with.
const ONES_8: usize = 8;

/// Packets up to this many bytes (with the eight ones) are masked in one
/// copy and hashed in one call: a small frame costs one pass, and from
/// 128 bytes on (a 64 B WRITE) crc32fast takes its carry-less multiply
/// path instead of the table one.
const SMALL: usize = 256;

thread_local! {
    /// The masked copy of a small packet is built here: its first eight
    /// bytes are the ones every ICRC input starts with and are never
    /// written, and a packet's bytes overwrite only what they cover, so
    /// no call fills the buffer first.
    static SMALL_INPUT: RefCell<[u8; SMALL]> = const { RefCell::new([0xFF; SMALL]) };
}

/// [`compute`] of a packet of at most `SMALL - 8` bytes, whose layout is
/// checked already: one copy with the variant fields masked, hashed in
/// one call.
fn compute_small(
    ip_packet: &[u8],
    udp_at: usize,
    bth_at: usize,
    tlm_at: usize,
    tlm_len: usize,
) -> u32 {
    SMALL_INPUT.with_borrow_mut(|buf| {
        let n = ONES_8 + ip_packet.len();
        let b = &mut buf[ONES_8..n];
        b.copy_from_slice(ip_packet);
        mask_variant_fields(b, udp_at, bth_at);
        if tlm_len > 0 {
            // Not a call into memset for the usual none.
            b[tlm_at..tlm_at + tlm_len].fill(0xFF);
        }
        let mut h = FRESH.clone();
        h.update(&buf[..n]);
        h.finalize()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CNP captured from a ConnectX-4 Lx NIC, wire.md's test vector.
    const CX4_CNP: [u8; 74] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08,
        0x00, // eth
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01, // ipv4
        0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // udp
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, // bth
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // cnp body
        0x82, 0xfd, 0x00, 0x2a, // icrc
    ];

    #[test]
    fn the_stored_state_is_that_of_eight_ones() {
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xFF; 8]);
        // finalize() of a crc32fast state is the state itself.
        assert_eq!(h.finalize(), AFTER_ONES_8);
    }

    #[test]
    fn connectx4_cnp_test_vector() {
        let ip = &CX4_CNP[14..CX4_CNP.len() - 4];
        let crc = compute(ip, 0).unwrap();
        assert_eq!(crc, 0x2a00_fd82);
        assert_eq!(crc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    }

    #[test]
    fn variant_fields_do_not_change_the_crc() {
        let mut f = CX4_CNP;
        f[15] = 0x03; // TOS (ECN CE)
        f[22] = 1; // TTL
        f[24] = 0; // IP checksum
        f[40] = 0x12; // UDP checksum
        f[46] = 0xA0; // FECN + T bit
        assert_eq!(compute(&f[14..f.len() - 4], 0).unwrap(), 0x2a00_fd82);
    }

    #[test]
    fn invariant_fields_change_the_crc() {
        for at in [14 + 4, 14 + 12, 34, 42, 42 + 5, 42 + 11, 60] {
            let mut f = CX4_CNP;
            f[at] ^= 0x01;
            assert_ne!(
                compute(&f[14..f.len() - 4], 0).unwrap(),
                0x2a00_fd82,
                "byte {at}"
            );
        }
    }

    #[test]
    fn tlm_bytes_are_masked() {
        let f = &CX4_CNP[14..CX4_CNP.len() - 4];
        let a = compute(f, 4).unwrap();
        let mut g = f.to_vec();
        g[20 + 8 + 12] ^= 0x55; // inside the 4 bytes treated as TLM
        assert_eq!(compute(&g, 4).unwrap(), a);
    }

    /// Hashed where it lies, a packet gives the CRC of its masked copy,
    /// whatever the eight bytes before it and the variant fields hold.
    #[test]
    fn in_frame_path_agrees_with_the_masked_copy() {
        let mut frame: Vec<u8> = (0..1600u32).map(|i| (i * 13 + 5) as u8).collect();
        frame[14] = 0x45;
        assert!(compute_in_frame(&frame, 14, 14 + 39, 0).is_err());
        for len in [40, 44, 56, 119, 120, 121, 128, 300, 1400] {
            let want = compute(&frame[14..14 + len], 0).unwrap();
            assert_eq!(
                compute_in_frame(&frame, 14, 14 + len, 0).unwrap(),
                want,
                "len {len}"
            );
            let mut g = frame.clone();
            for at in [
                6,
                9,
                13,
                14 + 1,
                14 + 8,
                14 + 10,
                14 + 11,
                14 + 26,
                14 + 27,
                14 + 32,
            ] {
                g[at] ^= 0x5A;
            }
            assert_eq!(
                compute_in_frame(&g, 14, 14 + len, 0).unwrap(),
                want,
                "len {len}"
            );
            let mut h = frame.clone();
            h[14 + 33] ^= 1; // BTH byte 5 is invariant
            assert_ne!(
                compute_in_frame(&h, 14, 14 + len, 0).unwrap(),
                want,
                "len {len}"
            );
        }
        // With a TLM block, IP options or too few bytes before the IP
        // header, the masked copy is made.
        assert_eq!(
            compute_in_frame(&frame, 14, 14 + 300, 4).unwrap(),
            compute(&frame[14..14 + 300], 4).unwrap()
        );
        assert_eq!(
            compute_in_frame(&frame[8..], 6, 6 + 300, 0).unwrap(),
            compute(&frame[14..14 + 300], 0).unwrap()
        );
        assert!(compute_in_frame(&frame, 14, 1601, 0).is_err());
    }

    /// The one-pass path of small packets and the three-piece path of
    /// large ones compute the same CRC, with and without a TLM block.
    #[test]
    fn small_and_large_paths_agree() {
        let mut ip: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
        ip[0] = 0x45;
        for tlm_len in [0, 4, 36] {
            for len in [44, 120, 127, 128, 300, SMALL - ONES_8 - 1, SMALL - ONES_8] {
                if len < 40 + tlm_len {
                    continue; // shorter than its headers
                }
                let small = compute(&ip[..len], tlm_len).unwrap();
                let mut masked = vec![0xFF; ONES_8];
                masked.extend_from_slice(&ip[..len]);
                let m = &mut masked[ONES_8..];
                for at in [1, 8, 10, 11, 20 + 6, 20 + 7, 28 + 4] {
                    m[at] = 0xFF;
                }
                m[40..40 + tlm_len].fill(0xFF);
                assert_eq!(small, crc32fast::hash(&masked), "len {len} tlm {tlm_len}");
            }
        }
        // Past the threshold the pieces give what one masked copy gives.
        let len = 1400;
        let mut masked = vec![0xFF; ONES_8];
        masked.extend_from_slice(&ip[..len]);
        for at in [1, 8, 10, 11, 26, 27, 32] {
            masked[ONES_8 + at] = 0xFF;
        }
        assert_eq!(compute(&ip[..len], 0).unwrap(), crc32fast::hash(&masked));
    }

    /// Headers, payload and pad apart give the ICRC of the same bytes in
    /// one buffer, wherever the payload starts, with and without a TLM block.
    #[test]
    fn split_pieces_give_the_crc_of_the_whole() {
        let mut ip: Vec<u8> = (0..600u32).map(|i| (i * 13 + 5) as u8).collect();
        ip[0] = 0x45;
        for tlm_len in [0, 4, 36] {
            for head in [40 + tlm_len, 56 + tlm_len, 72 + tlm_len] {
                for (payload, pad) in [(0, 0), (1, 3), (64, 0), (255, 1), (500, 0)] {
                    let end = head + payload + pad;
                    if end > ip.len() {
                        continue;
                    }
                    let whole = compute(&ip[..end], tlm_len).unwrap();
                    let split = compute_split(
                        &ip[..head],
                        tlm_len,
                        &ip[head..head + payload],
                        &ip[head + payload..end],
                    )
                    .unwrap();
                    assert_eq!(split, whole, "head {head} payload {payload} tlm {tlm_len}");
                }
            }
        }
        assert!(compute_split(&ip[..39], 0, &[], &[]).is_err());
        assert!(compute_split(&ip[..44], 8, &ip[44..60], &[]).is_err());
    }

    #[test]
    fn short_input_is_an_error_not_a_panic() {
        assert!(compute(&[], 0).is_err());
        assert!(compute(&CX4_CNP[14..30], 0).is_err());
        assert!(compute(&CX4_CNP[14..74], 300).is_err());
    }
}
