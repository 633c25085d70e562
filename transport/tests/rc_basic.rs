//! The RC engine end to end between two engines, without faults: WRITE and
//! READ of every size class land byte for byte and complete in order.

mod rc_util;

use rc_util::{Dir, Pair, Setup};
use transport::rc::{WcOpcode, WcStatus, WrOp};
use transport::wire::Opcode;

#[test]
fn writes_of_every_size_class_land_byte_for_byte() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 4096, 100_000, 1 << 20];
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_a(off, len as usize, i as u8);
        let wr = p.wr(i as u64, WrOp::Write, off, off, len);
        p.post(wr);
        off += u64::from(len) + 64;
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(cqes.len(), sizes.len());
    let mut off = 0u64;
    for (i, (&len, c)) in sizes.iter().zip(&cqes).enumerate() {
        assert_eq!(c.wr_id, i as u64, "completions in post order");
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        assert_eq!(c.byte_len, len);
        assert_eq!(
            p.a_bytes(off, len as usize),
            p.b_bytes(off, len as usize),
            "write {i}"
        );
        off += u64::from(len) + 64;
    }
}

#[test]
fn reads_of_every_size_class_land_byte_for_byte() {
    let mut p = Pair::new(Setup::default());
    let sizes = [0u32, 1, 1023, 1024, 1025, 8192, 300_000];
    let mut off = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        p.fill_b(off, len as usize, 0x40 + i as u8);
        let wr = p.wr(i as u64, WrOp::Read, off, off, len);
        p.post(wr);
        off += u64::from(len) + 64;
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(cqes.len(), sizes.len());
    let mut off = 0u64;
    for (i, (&len, c)) in sizes.iter().zip(&cqes).enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (i as u64, WcStatus::Success, WcOpcode::RdmaRead)
        );
        assert_eq!(
            p.a_bytes(off, len as usize),
            p.b_bytes(off, len as usize),
            "read {i}"
        );
        off += u64::from(len) + 64;
    }
}

#[test]
fn segmentation_uses_first_middle_last_and_only() {
    let mut p = Pair::new(Setup::default());
    let wr = p.wr(1, WrOp::Write, 0, 0, 3000);
    p.post(wr);
    let wr = p.wr(2, WrOp::WriteImm(7), 0, 0, 10);
    p.post(wr);
    let rwr = p.recv_wr(9, 0, 0);
    p.post_recv_b(rwr);
    p.run(1_000_000_000);
    let ops: Vec<Opcode> = p.ops(Dir::AtoB);
    assert_eq!(
        ops,
        [
            Opcode::RdmaWriteFirst,
            Opcode::RdmaWriteMiddle,
            Opcode::RdmaWriteLast,
            Opcode::RdmaWriteOnlyWithImmediate
        ]
    );
}

#[test]
fn interleaved_reads_and_writes_all_complete() {
    let mut p = Pair::new(Setup::default());
    for i in 0..40u64 {
        let len = [0u32, 5, 1024, 3000, 70_000][(i % 5) as usize];
        let off = i * 80_000;
        let op = if i % 3 == 0 { WrOp::Read } else { WrOp::Write };
        p.fill_a(off, len as usize, i as u8);
        p.fill_b(off, len as usize, 0x80 | i as u8);
        let wr = p.wr(i, op, off, off, len);
        p.post(wr);
    }
    p.run(1_000_000_000);
    let cqes = p.completions_a();
    assert_eq!(
        cqes.len(),
        40,
        "{:?}",
        p.a.nic.engine_mut().qp_counters(p.a.qpn)
    );
    for (i, c) in cqes.iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success));
        let len = [0usize, 5, 1024, 3000, 70_000][i % 5];
        let off = i as u64 * 80_000;
        assert_eq!(p.a_bytes(off, len), p.b_bytes(off, len), "op {i}");
    }
}

#[test]
fn engine_defaults_are_valid_for_slow_and_fast_links() {
    for rate in [1_000_000u64, 1_000_000_000, 400_000_000_000] {
        let c = transport::rc::EngineConfig::new(rc_util::MAC_A, rc_util::IP_A, rate);
        assert!(c.hpcc.validate().is_ok(), "{rate}");
        assert!(c.hpcc.w_init >= c.hpcc.w_min);
    }
}
