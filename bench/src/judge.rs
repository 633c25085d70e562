//! `bench judge`: the interop run's verdict on one test and direction,
//! from what both programs printed, their exit statuses and, on a lossy
//! link, the frames our fault injector lost.
//!
//! A run passes when both programs exited 0 and neither printed a failure
//! (`testkit::failures`: rdma-core's pingpong prints `invalid data in page
//! N` and still exits 0).
//!
//! One failure is no fault of either NIC: `ibv_rc_pingpong` has no closing
//! handshake, so on a lossy link the ACK of the final SEND can be lost
//! after the peer, all its iterations done, destroyed its QP; the sender's
//! retries go unanswered and that one WR ends in RETRY_EXC_ERR, as on any
//! RC NIC. That end race passes only when:
//! - the link is the lossy phase's and the program `ibv_rc_pingpong`;
//! - one side exited 0 with all its iterations and no failure line;
//! - the other failed its final SEND (wr_id 2) with retries exceeded, and
//!   printed nothing else but rdma-core's "parse WC failed";
//! - our fault injector's record of what it lost holds an ACK to the
//!   failing side's QP for the last PSN of its final SEND, going the way
//!   that side receives (lost on our RX when our side failed, on our TX
//!   when rxe's did): the ACK was sent and our own lossy link took it.

use std::fmt;
use std::path::PathBuf;

use transport::wire::bth::PSN_MASK;
use transport::wire::{MacAddr, Opcode, Packet, Syndrome};

/// One test and direction of an interop run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The program (`ib_write_lat`, `ibv_rc_pingpong`, `rc_verify`, ...).
    pub program: String,
    /// Its arguments (the same on both sides but for the device).
    pub args: String,
    /// The interop phase (`mtu1024`, `lossy`, ...).
    pub phase: String,
    /// Our side's exit status; None: it did not end.
    pub ours_rc: Option<i32>,
    /// rxe's side's exit status; None: the VM reported none.
    pub rxe_rc: Option<i32>,
    pub ours_output: String,
    pub rxe_output: String,
    /// Our device's MAC (which way a lost frame went).
    pub our_mac: MacAddr,
    /// The frames our fault injector lost, both ways (None: not recorded).
    pub lost: Option<Vec<Vec<u8>>>,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// The pingpong's end race, with the lost ACK that proves it.
    EndRace(String),
    Fail(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Pass => write!(f, "ok"),
            Verdict::EndRace(why) => write!(f, "ok ({why})"),
            Verdict::Fail(why) => write!(f, "FAIL {why}"),
        }
    }
}

/// Which side of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Ours,
    Rxe,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Rxe => "rxe",
        }
    }
}

/// The value of flag `flag` (`-s`) in `args`.
fn flag(args: &str, flag: &str) -> Option<u64> {
    let mut it = args.split_whitespace();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next()?.parse().ok();
        }
    }
    None
}

impl Run {
    fn rc(&self, s: Side) -> Option<i32> {
        match s {
            Side::Ours => self.ours_rc,
            Side::Rxe => self.rxe_rc,
        }
    }

    fn output(&self, s: Side) -> &str {
        match s {
            Side::Ours => &self.ours_output,
            Side::Rxe => &self.rxe_output,
        }
    }

    /// The verdict on this run.
    pub fn judge(&self) -> Verdict {
        let failures = |s: Side| testkit::failures(self.output(s));
        let ok = |s: Side| self.rc(s) == Some(0) && failures(s).is_empty();
        if ok(Side::Ours) && ok(Side::Rxe) {
            return Verdict::Pass;
        }
        let plain = Verdict::Fail(self.why());
        if self.program != "ibv_rc_pingpong" || self.phase != "lossy" {
            return plain;
        }
        let (good, bad) = match (ok(Side::Ours), ok(Side::Rxe)) {
            (true, false) => (Side::Ours, Side::Rxe),
            (false, true) => (Side::Rxe, Side::Ours),
            _ => return plain,
        };
        let iters = flag(&self.args, "-n").unwrap_or(1000);
        let finished = self
            .output(good)
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{iters} iters in ")));
        let bad_lines = failures(bad);
        let only_final_send = matches!(self.rc(bad), Some(rc) if rc != 0)
            && bad_lines
                .iter()
                .any(|l| l.trim_end().ends_with("for wr_id 2"))
            && bad_lines.iter().all(|l| {
                l.trim_end()
                    .ends_with("transport retry counter exceeded (12) for wr_id 2")
                    || l.starts_with("parse WC failed")
            });
        if !finished || !only_final_send {
            return plain;
        }
        match self.lost_final_ack(bad, iters) {
            Ok(why) => Verdict::EndRace(why),
            Err(why) => Verdict::Fail(format!(
                "{}: {} failed only its final SEND (retries exceeded), but {why}",
                self.why(),
                bad.name()
            )),
        }
    }

    /// The reason for a plain failure: the exit statuses and the first
    /// failure line.
    fn why(&self) -> String {
        let rc = |r: Option<i32>| r.map_or("none".to_string(), |r| r.to_string());
        let first = [Side::Ours, Side::Rxe]
            .into_iter()
            .find_map(|s| {
                testkit::failures(self.output(s))
                    .first()
                    .map(|l| format!("{}: {}", s.name(), l.trim()))
            })
            .unwrap_or_else(|| "see above".into());
        format!(
            "ours rc={}, rxe rc={}: {first}",
            rc(self.ours_rc),
            rc(self.rxe_rc)
        )
    }

    /// Finds, among the lost frames, the ACK of the failing side's final
    /// SEND; says what it found or why none counts.
    fn lost_final_ack(&self, bad: Side, iters: u64) -> Result<String, String> {
        let lost = self
            .lost
            .as_ref()
            .ok_or("no record of the frames our fault injector lost was given")?;
        let (qpn, first_psn) = testkit::verbs_output::local_qp(self.output(bad))
            .ok_or("its output names no local QPN and PSN")?;
        let size = flag(&self.args, "-s").unwrap_or(4096).max(1);
        let mtu = flag(&self.args, "-m").unwrap_or(1024).max(256);
        let packets = size.div_ceil(mtu);
        let last_psn = (u64::from(first_psn) + iters * packets - 1) as u32 & PSN_MASK;
        // Towards the failing side: from rxe (lost on our RX) when ours
        // failed, from us (lost on our TX) when rxe's did.
        let way = |src: MacAddr| (src == self.our_mac) == (bad == Side::Rxe);
        let acks = lost
            .iter()
            .filter_map(|f| Packet::parse(f).ok())
            .filter(|p| {
                p.repr.bth.opcode == Opcode::Acknowledge
                    && p.repr.bth.dest_qp == qpn
                    && p.repr.aeth.is_some_and(|a| {
                        matches!(Syndrome::from_u8(a.syndrome), Syndrome::Ack { .. })
                    })
            })
            .collect::<Vec<_>>();
        match acks
            .iter()
            .find(|p| p.repr.bth.psn == last_psn && way(p.repr.eth.src))
        {
            Some(_) => Ok(format!(
                "the final SEND's ACK (QPN {qpn:#x}, PSN {last_psn:#x}) was lost by our fault injector after the peer, all {iters} iterations done, had closed its QP; {}'s retries then went unanswered",
                bad.name()
            )),
            None => Err(format!(
                "our fault injector lost no ACK to QPN {qpn:#x} for PSN {last_psn:#x} (the final SEND's last packet; {} lost ACKs to that QP, {} lost frames in all)",
                acks.len(),
                lost.len()
            )),
        }
    }
}

/// `bench judge`'s arguments: one test and direction of an interop run.
#[derive(Debug, clap::Args)]
pub struct JudgeArgs {
    /// The program both sides ran (ibv_rc_pingpong, ib_write_bw, ...).
    #[arg(long)]
    pub program: String,
    /// Its arguments (-s, -n and -m are read from them).
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    pub args: String,
    /// The interop phase (mtu1024, mtu4096, lossy, vlan, shards).
    #[arg(long)]
    pub phase: String,
    /// Our side's exit status ("none": it reported none).
    #[arg(long)]
    pub ours_rc: String,
    /// rxe's side's exit status ("none": the VM reported none).
    #[arg(long)]
    pub rxe_rc: String,
    /// A file with everything our side's program printed.
    #[arg(long)]
    pub ours_output: PathBuf,
    /// A file with everything rxe's side's program printed.
    #[arg(long)]
    pub rxe_output: PathBuf,
    /// Our device's MAC address.
    #[arg(long)]
    pub our_mac: MacAddr,
    /// The pcap of the frames our fault injector lost
    /// (`[loopback.faults] lost_pcap`).
    #[arg(long)]
    pub lost_pcap: Option<PathBuf>,
}

/// Why `bench judge` could not read its inputs.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pcap(#[from] crate::pcap::PcapFileError),
    #[error("--{flag} {value:?} is not an exit status (a number, or none)")]
    BadStatus { flag: &'static str, value: String },
}

impl JudgeArgs {
    /// The run these arguments describe, its files read.
    pub fn load(&self) -> Result<Run, JudgeError> {
        let read = |path: &PathBuf| {
            std::fs::read(path)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|source| JudgeError::Read {
                    path: path.clone(),
                    source,
                })
        };
        let status = |flag: &'static str, value: &str| match value {
            "none" => Ok(None),
            v => v.parse().map(Some).map_err(|_| JudgeError::BadStatus {
                flag,
                value: v.to_string(),
            }),
        };
        let lost = match &self.lost_pcap {
            Some(path) => {
                let mut r = crate::pcap::Reader::open(path)?;
                let mut frames = Vec::new();
                while let Some(rec) = r.next_record() {
                    frames.push(rec?.data);
                }
                Some(frames)
            }
            None => None,
        };
        Ok(Run {
            program: self.program.clone(),
            args: self.args.clone(),
            phase: self.phase.clone(),
            ours_rc: status("ours-rc", &self.ours_rc)?,
            rxe_rc: status("rxe-rc", &self.rxe_rc)?,
            ours_output: read(&self.ours_output)?,
            rxe_output: read(&self.rxe_output)?,
            our_mac: self.our_mac,
            lost,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transport::wire::{AethRepr, PacketRepr};

    const OUR_MAC: MacAddr = MacAddr([2, 0x77, 0, 0, 0, 3]);
    const RXE_MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x77, 0, 2]);

    /// What `ibv_rc_pingpong -c -s 65536 -n 50 -m 1024` prints on a side
    /// with QPN `qpn` and first PSN `psn` that finished.
    fn finished(qpn: u32, psn: u32) -> String {
        format!(
            "  local address:  LID 0x0000, QPN {qpn:#08x}, PSN {psn:#08x}, GID ::ffff:10.77.0.3\n  remote address: LID 0x0000, QPN 0x000099, PSN 0x111111, GID ::ffff:10.77.0.2\n6553600 bytes in 0.50 seconds = 104.86 Mbit/sec\n50 iters in 0.50 seconds = 10000.00 usec/iter\n"
        )
    }

    /// The same side when its final SEND's ACK never came.
    fn retries_exceeded(qpn: u32, psn: u32) -> String {
        format!(
            "  local address:  LID 0x0000, QPN {qpn:#08x}, PSN {psn:#08x}, GID ::ffff:10.77.0.3\nFailed status transport retry counter exceeded (12) for wr_id 2\nparse WC failed 1\n"
        )
    }

    fn ack(src: MacAddr, qpn: u32, psn: u32) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::Acknowledge, qpn, psn);
        r.eth.src = src;
        r.aeth = Some(AethRepr {
            syndrome: 0x1f,
            msn: 50,
        });
        let mut b = vec![0u8; r.frame_len(0)];
        r.emit(&[], &mut b).unwrap();
        b
    }

    fn run(program: &str, phase: &str, ours: (i32, String), rxe: (i32, String)) -> Run {
        Run {
            program: program.into(),
            args: "-d roce0 -g 1 -c -m 1024 -s 65536 -n 50".into(),
            phase: phase.into(),
            ours_rc: Some(ours.0),
            rxe_rc: Some(rxe.0),
            ours_output: ours.1,
            rxe_output: rxe.1,
            our_mac: OUR_MAC,
            lost: Some(Vec::new()),
        }
    }

    #[test]
    fn both_exit_0_with_clean_output_passes() {
        let r = run(
            "ibv_rc_pingpong",
            "mtu1024",
            (0, finished(0x11, 0x100)),
            (0, finished(0x99, 0x200)),
        );
        assert_eq!(r.judge(), Verdict::Pass);
    }

    #[test]
    fn a_corrupted_pingpong_page_is_a_failure_though_both_exit_0() {
        let corrupted = finished(0x99, 0x200) + "invalid data in page 3\n";
        for (ours, rxe) in [
            (finished(0x11, 0x100), corrupted.clone()),
            (corrupted.clone(), finished(0x11, 0x100)),
        ] {
            let v = run("ibv_rc_pingpong", "mtu1024", (0, ours), (0, rxe)).judge();
            match v {
                Verdict::Fail(why) => assert!(why.contains("invalid data in page 3"), "{why}"),
                v => panic!("{v:?}"),
            }
        }
        // In the lossy phase too: the end race needs a clean finisher.
        let v = run(
            "ibv_rc_pingpong",
            "lossy",
            (1, retries_exceeded(0x11, 0x100)),
            (0, corrupted),
        )
        .judge();
        assert!(matches!(v, Verdict::Fail(_)), "{v:?}");
    }

    #[test]
    fn a_nonzero_exit_is_a_failure() {
        let v = run(
            "ib_write_bw",
            "mtu1024",
            (0, String::new()),
            (1, " Completion with error at client\n".into()),
        )
        .judge();
        assert_eq!(
            v,
            Verdict::Fail("ours rc=0, rxe rc=1: rxe: Completion with error at client".into())
        );
    }

    /// 50 SENDs of 64 packets from PSN 0x100: the last is 0x100 + 3199.
    const LAST_PSN: u32 = 0x100 + 50 * 64 - 1;

    #[test]
    fn the_end_race_passes_with_our_injector_having_lost_the_final_ack() {
        // Our side failed: rxe's ACK to our QP was lost on our RX.
        let mut r = run(
            "ibv_rc_pingpong",
            "lossy",
            (1, retries_exceeded(0x11, 0x100)),
            (0, finished(0x99, 0x200)),
        );
        r.lost = Some(vec![
            ack(RXE_MAC, 0x11, LAST_PSN - 64),
            ack(RXE_MAC, 0x11, LAST_PSN),
        ]);
        assert!(matches!(r.judge(), Verdict::EndRace(_)), "{:?}", r.judge());
        // rxe's side failed: our ACK to its QP was lost on our TX.
        let mut r = run(
            "ibv_rc_pingpong",
            "lossy",
            (0, finished(0x11, 0x100)),
            (1, retries_exceeded(0x99, 0x100)),
        );
        r.lost = Some(vec![ack(OUR_MAC, 0x99, LAST_PSN)]);
        assert!(matches!(r.judge(), Verdict::EndRace(_)), "{:?}", r.judge());
    }

    #[test]
    fn the_end_race_without_the_lost_ack_is_a_failure() {
        let base = run(
            "ibv_rc_pingpong",
            "lossy",
            (1, retries_exceeded(0x11, 0x100)),
            (0, finished(0x99, 0x200)),
        );
        for (lost, says) in [
            (None, "no record"),
            (Some(vec![]), "lost no ACK to QPN 0x11 for PSN"),
            // An earlier ACK, not the final SEND's.
            (Some(vec![ack(RXE_MAC, 0x11, LAST_PSN - 64)]), "1 lost ACKs"),
            // The right ACK, but going the wrong way (ours, never received).
            (Some(vec![ack(OUR_MAC, 0x11, LAST_PSN)]), "lost no ACK"),
            // To another QP.
            (Some(vec![ack(RXE_MAC, 0x12, LAST_PSN)]), "lost no ACK"),
        ] {
            let r = Run {
                lost,
                ..base.clone()
            };
            match r.judge() {
                Verdict::Fail(why) => assert!(why.contains(says), "{why}"),
                v => panic!("{v:?}"),
            }
        }
        // Outside the lossy phase, or another failure: plain failures.
        let r = Run {
            phase: "mtu1024".into(),
            lost: Some(vec![ack(RXE_MAC, 0x11, LAST_PSN)]),
            ..base.clone()
        };
        assert!(matches!(r.judge(), Verdict::Fail(_)));
        let r = Run {
            ours_output: base.ours_output.replace("wr_id 2", "wr_id 1"),
            lost: Some(vec![ack(RXE_MAC, 0x11, LAST_PSN)]),
            ..base.clone()
        };
        assert!(matches!(r.judge(), Verdict::Fail(_)));
    }
}
