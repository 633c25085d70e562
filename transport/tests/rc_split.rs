//! Frames sent from where their payload lies (`poll_transmit_split`) and
//! received in pieces (`handle_packet_split`): the same bytes on the wire
//! and the same outcome as frames built and received whole; READ
//! responses always whole.

mod rc_util;

use rc_util::*;
use transport::mr::Memory;
use transport::rc::{Apart, Cqe, PathMtu, TxFrame, WcStatus, WrOp};

/// What a run left: every frame on the wire (A to B, then B to A, each in
/// order), the frames that went split, the bytes that landed and the
/// completions.
struct Outcome {
    a_to_b: Vec<Vec<u8>>,
    b_to_a: Vec<Vec<u8>>,
    /// Frames sent split by A (WRITE packets) and by B (READ responses).
    split: [usize; 2],
    at_b: Vec<u8>,
    at_a: Vec<u8>,
    cqes: Vec<Cqe>,
}

const WRITE_LEN: u32 = 10_003; // ten packets at MTU 1024, the last padded
const READ_LEN: u32 = 5_001;

/// A WRITE from A to B and a READ by A from B, the engines driven
/// directly: each frame an engine builds goes to the other, whole or in
/// pieces, with payloads of at least `split_min` bytes sent from the
/// sender's memory.
fn run(split_min: usize) -> Outcome {
    let mut p = Pair::new(Setup {
        mtu: PathMtu::Mtu1024,
        ..Setup::default()
    });
    p.fill_a(0, WRITE_LEN as usize, 3);
    p.fill_b(1 << 20, READ_LEN as usize, 9);
    let w = p.wr(1, WrOp::Write, 0, 0, WRITE_LEN);
    p.post(w);
    let r = p.wr(2, WrOp::Read, 1 << 19, 1 << 20, READ_LEN);
    p.post(r);
    let mut out = Outcome {
        a_to_b: Vec::new(),
        b_to_a: Vec::new(),
        split: [0; 2],
        at_b: Vec::new(),
        at_a: Vec::new(),
        cqes: Vec::new(),
    };
    let mut buf = vec![0u8; 9000];
    let mut now = 0;
    for _ in 0..200 {
        now += 1_000;
        for from_a in [true, false] {
            let (tx, rx) = if from_a {
                (&mut p.a, &mut p.b)
            } else {
                (&mut p.b, &mut p.a)
            };
            tx.engine_mut().handle_timeout(now);
            while let Some(f) = tx
                .engine_mut()
                .poll_transmit_split(now, &mut buf, split_min)
            {
                let wire = match f {
                    TxFrame::Whole(n) => {
                        rx.engine_mut().handle_packet(now, &buf[..n]);
                        buf[..n].to_vec()
                    }
                    TxFrame::Split { head, apart } => {
                        let Apart {
                            payload,
                            payload_len,
                            tail,
                        } = apart;
                        out.split[usize::from(!from_a)] += 1;
                        let bytes = tx
                            .engine()
                            .mem()
                            .bytes(payload, payload_len as usize)
                            .expect("the payload lies in the sender's memory");
                        rx.engine_mut().handle_packet_split(
                            now,
                            &buf[..head],
                            bytes,
                            tail.as_slice(),
                        );
                        [&buf[..head], bytes, tail.as_slice()].concat()
                    }
                };
                assert_eq!(wire.len(), f.wire_len());
                if from_a {
                    out.a_to_b.push(wire);
                } else {
                    out.b_to_a.push(wire);
                }
            }
        }
    }
    out.at_b = p.b_bytes(0, WRITE_LEN as usize);
    out.at_a = p.a_bytes(1 << 19, READ_LEN as usize);
    out.cqes = p.completions_a();
    out
}

#[test]
fn frames_sent_from_memory_and_received_in_pieces_are_the_frames_built_whole() {
    let whole = run(usize::MAX);
    let split = run(256);
    assert_eq!(whole.split, [0, 0]);
    // The ten WRITE packets carry 256 bytes or more each and go split;
    // the five READ responses do too, but go whole: the region a READ
    // reads may change under it, and a payload read after its ICRC would
    // then fail the ICRC.
    assert_eq!(split.split, [10, 0]);
    assert_eq!(split.a_to_b, whole.a_to_b, "A's frames");
    assert_eq!(split.b_to_a, whole.b_to_a, "B's frames");
    assert_eq!(split.at_b, whole.at_b);
    assert_eq!(split.at_a, whole.at_a);
    assert_eq!(split.cqes, whole.cqes);
    // And the operations did what they say.
    let mut p = Pair::new(Setup::default());
    p.fill_a(0, WRITE_LEN as usize, 3);
    p.fill_b(1 << 20, READ_LEN as usize, 9);
    assert_eq!(split.at_b, p.a_bytes(0, WRITE_LEN as usize));
    assert_eq!(split.at_a, p.b_bytes(1 << 20, READ_LEN as usize));
    let ids: Vec<_> = split.cqes.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(ids, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

/// A frame in pieces that is not one the fixed-offset parse reads, or is
/// corrupted, is judged as the same bytes in one buffer are: a bad ICRC
/// is dropped and counted, and the data does not land.
#[test]
fn a_corrupted_frame_in_pieces_is_dropped_as_the_whole_one_is() {
    let mut p = Pair::new(Setup::default());
    p.fill_a(0, 2048, 5);
    let w = p.wr(1, WrOp::Write, 0, 0, 2048);
    p.post(w);
    let mut buf = vec![0u8; 9000];
    let Some(TxFrame::Split {
        head,
        apart: Apart {
            payload,
            payload_len,
            tail,
        },
    }) = p.a.engine_mut().poll_transmit_split(1_000, &mut buf, 256)
    else {
        panic!("a 1024-byte payload goes split");
    };
    let mut bytes =
        p.a.engine()
            .mem()
            .bytes(payload, payload_len as usize)
            .unwrap()
            .to_vec();
    bytes[100] ^= 1;
    let before = *p.b.engine().counters();
    p.b.engine_mut()
        .handle_packet_split(1_000, &buf[..head], &bytes, tail.as_slice());
    let after = p.b.engine().counters();
    assert_eq!(after.rx_frames, before.rx_frames + 1);
    assert_eq!(after.icrc_drops(), before.icrc_drops() + 1);
    assert_eq!(p.b_bytes(0, 1024), vec![0; 1024]);
    // The same frame intact lands.
    bytes[100] ^= 1;
    p.b.engine_mut()
        .handle_packet_split(1_000, &buf[..head], &bytes, tail.as_slice());
    assert_eq!(p.b_bytes(0, 1024), p.a_bytes(0, 1024));
}
