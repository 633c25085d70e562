//! The telemetry trace format that `bench hpcc-replay` reads and the
//! simulator writes: one event per line,
//!
//! ```text
//! ack_seq snd_nxt nhop [ts_ns tx_bytes qlen rate_100mbps switch_id port_id] x nhop
//! ```
//!
//! decimal fields separated by whitespace (hop fields as in wire.md's hop
//! record); `#` starts a comment, blank lines are ignored. PSNs are 24-bit.

use core::fmt;

use crate::psn::PSN_MASK;
use crate::telemetry::{Hop, HopStack, MAX_HOPS};

/// One telemetry event of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// The PSN the event acknowledges (ack.seq of NewAck).
    pub ack_seq: u32,
    /// The flow's snd_nxt when the event arrived.
    pub snd_nxt: u32,
    pub hops: HopStack,
}

/// Why a trace line was refused; `field` counts from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("expected at least 3 fields (ack_seq snd_nxt nhop), found {0}")]
    TooFewFields(usize),
    #[error("field {field} ({name}) is not a decimal number that fits")]
    BadNumber { field: usize, name: &'static str },
    #[error("field {field} ({name}) is {value}, above the maximum {max}")]
    OutOfRange {
        field: usize,
        name: &'static str,
        value: u64,
        max: u64,
    },
    #[error("nhop {nhop} announces {want} fields, the line has {got}")]
    FieldCount {
        nhop: usize,
        want: usize,
        got: usize,
    },
}

const HOP_FIELDS: [(&str, u64); 6] = [
    ("ts_ns", u32::MAX as u64),
    ("tx_bytes", u32::MAX as u64),
    ("qlen", u32::MAX as u64),
    ("rate_100mbps", u16::MAX as u64),
    ("switch_id", u8::MAX as u64),
    ("port_id", u8::MAX as u64),
];

fn number(s: &str, field: usize, name: &'static str, max: u64) -> Result<u64, TraceError> {
    let v: u64 = s
        .parse()
        .map_err(|_| TraceError::BadNumber { field, name })?;
    if v > max {
        return Err(TraceError::OutOfRange {
            field,
            name,
            value: v,
            max,
        });
    }
    Ok(v)
}

/// Parses one line: `Ok(None)` for blank and comment lines.
pub fn parse_line(line: &str) -> Result<Option<TraceEvent>, TraceError> {
    let line = line.split('#').next().unwrap_or("");
    let mut fields = line.split_whitespace();
    let Some(first) = fields.next() else {
        return Ok(None);
    };
    let rest: [Option<&str>; 2] = [fields.next(), fields.next()];
    let (Some(second), Some(third)) = (rest[0], rest[1]) else {
        return Err(TraceError::TooFewFields(1 + rest.iter().flatten().count()));
    };
    let psn_max = u64::from(PSN_MASK);
    let ack_seq = number(first, 1, "ack_seq", psn_max)? as u32;
    let snd_nxt = number(second, 2, "snd_nxt", psn_max)? as u32;
    let nhop = number(third, 3, "nhop", MAX_HOPS as u64)? as usize;
    let want = 3 + 6 * nhop;
    let mut hops = HopStack::new();
    let mut v = [0u64; 6];
    let mut got = 3;
    for (i, f) in fields.enumerate() {
        got += 1;
        if got > want {
            continue;
        }
        let (name, max) = HOP_FIELDS[i % 6];
        v[i % 6] = number(f, got, name, max)?;
        if i % 6 == 5 {
            hops.push(Hop {
                ts_ns: v[0] as u32,
                tx_bytes: v[1] as u32,
                qlen: v[2] as u32,
                rate_100mbps: v[3] as u16,
                switch_id: v[4] as u8,
                port_id: v[5] as u8,
            });
        }
    }
    if got != want {
        return Err(TraceError::FieldCount { nhop, want, got });
    }
    Ok(Some(TraceEvent {
        ack_seq,
        snd_nxt,
        hops,
    }))
}

impl fmt::Display for TraceEvent {
    /// Writes the event as one trace line (without newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.ack_seq, self.snd_nxt, self.hops.len())?;
        for h in self.hops.as_slice() {
            write!(
                f,
                " {} {} {} {} {} {}",
                h.ts_ns, h.tx_bytes, h.qlen, h.rate_100mbps, h.switch_id, h.port_id
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_comments_and_blank_lines() {
        assert_eq!(parse_line(""), Ok(None));
        assert_eq!(parse_line("   # only a comment"), Ok(None));
        let e = parse_line("5 9 1  1000 2000 300 1000 7 2  # one hop")
            .unwrap()
            .unwrap();
        assert_eq!((e.ack_seq, e.snd_nxt, e.hops.len()), (5, 9, 1));
        assert_eq!(
            e.hops.as_slice()[0],
            Hop {
                ts_ns: 1000,
                tx_bytes: 2000,
                qlen: 300,
                rate_100mbps: 1000,
                switch_id: 7,
                port_id: 2
            }
        );
        assert_eq!(e.to_string(), "5 9 1 1000 2000 300 1000 7 2");
        let z = parse_line("1 2 0").unwrap().unwrap();
        assert!(z.hops.is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(parse_line("1 2"), Err(TraceError::TooFewFields(2)));
        assert_eq!(
            parse_line("1 x 0"),
            Err(TraceError::BadNumber {
                field: 2,
                name: "snd_nxt"
            })
        );
        assert_eq!(
            parse_line("16777216 0 0").unwrap_err().to_string(),
            "field 1 (ack_seq) is 16777216, above the maximum 16777215"
        );
        assert_eq!(
            parse_line("1 2 16"),
            Err(TraceError::OutOfRange {
                field: 3,
                name: "nhop",
                value: 16,
                max: 15
            })
        );
        assert_eq!(
            parse_line("1 2 1 1 2 3 4 5"),
            Err(TraceError::FieldCount {
                nhop: 1,
                want: 9,
                got: 8
            })
        );
        assert_eq!(
            parse_line("1 2 1 1 2 3 4 5 6 7"),
            Err(TraceError::FieldCount {
                nhop: 1,
                want: 9,
                got: 10
            })
        );
        assert_eq!(
            parse_line("1 2 1 1 2 3 70000 5 6"),
            Err(TraceError::OutOfRange {
                field: 7,
                name: "rate_100mbps",
                value: 70000,
                max: 65535
            })
        );
        assert!(parse_line("-1 2 0").is_err());
    }
}
