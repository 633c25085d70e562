//! Probe-mode bookkeeping (draft 2023 sections 6.2.1 and 7.1): when to send
//! a TLM_REQUEST for a flow, and how a TLM_RESPONSE becomes a NewAck.
//!
//! While the flow has data in flight, one probe is outstanding at a time: a
//! new one goes out as soon as the previous response arrives, or when the
//! previous probe has gone unanswered for `timeout_ns` (a few T).

use crate::psn::PSN_MASK;

/// A probe to send: the PROBE block of TLM_REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRequest {
    pub probe_id: u32,
    /// The flow's snd_nxt when the probe leaves (24 bits).
    pub snd_psn: u32,
    pub sender_ts_ns: u64,
}

/// What a response gives the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeAck {
    /// ack.seq for NewAck: the probe's snd_psn.
    pub ack_seq: u32,
    /// Round-trip time of the probe.
    pub rtt_ns: u64,
}

/// Per-flow probe clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeClock {
    timeout_ns: u64,
    next_id: u32,
    /// (probe_id, sent at)
    outstanding: Option<(u32, u64)>,
    /// Probes sent and responses accepted, for counters.
    pub sent: u64,
    pub answered: u64,
    pub timed_out: u64,
}

impl ProbeClock {
    /// `timeout_ns`: how long a probe may go unanswered before the next one
    /// is sent (hpcc.md: "a few T"; 3 T is a good value).
    pub fn new(timeout_ns: u64) -> Self {
        ProbeClock {
            timeout_ns: timeout_ns.max(1),
            next_id: 1,
            outstanding: None,
            sent: 0,
            answered: 0,
            timed_out: 0,
        }
    }

    /// Whether to send a probe now. `in_flight` says whether the flow has
    /// unacknowledged data; `snd_nxt` is its next PSN.
    pub fn poll(&mut self, now: u64, in_flight: bool, snd_nxt: u32) -> Option<ProbeRequest> {
        if let Some((_, at)) = self.outstanding {
            if now < at.saturating_add(self.timeout_ns) {
                return None;
            }
            // Given up: with nothing in flight no probe replaces it, and
            // its deadline must not stay armed in the past.
            self.timed_out += 1;
            self.outstanding = None;
        }
        if !in_flight {
            return None;
        }
        let probe_id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.outstanding = Some((probe_id, now));
        self.sent += 1;
        Some(ProbeRequest {
            probe_id,
            snd_psn: snd_nxt & PSN_MASK,
            sender_ts_ns: now,
        })
    }

    /// When the outstanding probe times out (for the caller's timer).
    pub fn deadline(&self) -> Option<u64> {
        self.outstanding
            .map(|(_, at)| at.saturating_add(self.timeout_ns))
    }

    /// A TLM_RESPONSE arrived. Any response to a probe of this flow gives
    /// telemetry (a late one too); only the outstanding probe's response
    /// frees the way for the next probe. Responses with ids never issued
    /// are refused.
    pub fn on_response(
        &mut self,
        now: u64,
        probe_id: u32,
        snd_psn: u32,
        sender_ts_ns: u64,
    ) -> Option<ProbeAck> {
        let issued = self.next_id.wrapping_sub(probe_id);
        if probe_id == 0 || issued == 0 || issued > 1 << 16 {
            return None;
        }
        if self.outstanding.is_some_and(|(id, _)| id == probe_id) {
            self.outstanding = None;
        }
        self.answered += 1;
        Some(ProbeAck {
            ack_seq: snd_psn & PSN_MASK,
            rtt_ns: now.saturating_sub(sender_ts_ns),
        })
    }
}
