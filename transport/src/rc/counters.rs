//! Counters of one QP and of one engine.

use crate::wire::ErrorKind;

/// Per-QP counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCounters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Requester packets sent again after go-back-N.
    pub retransmitted: u64,
    /// NAKs sent, by code (0x60..=0x63; index = code & 3).
    pub naks_sent: [u64; 4],
    /// NAKs received, by code.
    pub naks_received: [u64; 4],
    pub rnr_naks_received: u64,
    /// RNR NAKs sent: a SEND or WRITE with immediate found no receive WQE.
    pub rnr_naks_sent: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// Duplicate requests seen by the responder.
    pub duplicates: u64,
    /// Requests dropped by the responder as out of order.
    pub out_of_order: u64,
    /// Frames addressed to this QP dropped for a bad ICRC (the QPN itself
    /// is unprotected then, so the engine-wide count is the reliable one).
    pub icrc_drops: u64,
    /// Responses and ACKs the requester ignored (stale, out of range,
    /// malformed).
    pub ignored_responses: u64,
    pub read_replays: u64,
    pub probes_sent: u64,
    pub probe_responses: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
    pub notifies_sent: u64,
    pub notifies_received: u64,
    /// INT responses from congested switches that reached the controller.
    pub int_responses: u64,
    /// INT responses for a PSN not in flight (late or forged): ignored.
    pub int_responses_stale: u64,
    /// ACKs whose receiver reported N (receiver-measured N), taken.
    pub flow_reports: u64,
    /// Path choice: probes sent on other paths, their answers, moves made.
    pub path_probes: u64,
    pub path_probe_responses: u64,
    pub path_moves: u64,
    /// Authenticated feedback (ACK telemetry, probe answers, notifications,
    /// INT responses) refused on a keyed connection: for a missing or
    /// wrong MAC or token, and for not being newer than the last of its
    /// kind taken (a replay).
    pub feedback_forged: u64,
    pub feedback_replayed: u64,
    /// Feedback with no MAC or token at all on a keyed connection: its
    /// peer holds no key (check both ends' keys); refused too.
    pub feedback_unkeyed: u64,
    /// UC: packets dropped with the rest of their message (a loss before
    /// them, a broken rule, no receive WQE).
    pub uc_dropped: u64,
    /// UD: datagrams dropped for a Q_Key not the QP's.
    pub qkey_violations: u64,
    /// UD: datagrams dropped for want of a receive WQE (UD has no RNR).
    pub datagrams_no_wqe: u64,
    /// UD: datagrams dropped for a payload longer than the path MTU.
    pub datagrams_too_long: u64,
    /// UD: datagrams not sent because their address handle was
    /// destroyed after the post (the WR completes; the datagram is lost).
    pub datagrams_unaddressed: u64,
    /// UD towards destinations that speak our telemetry (`ud_cc`):
    /// datagrams sent with a sample (a TLM block), samples given up
    /// without an echo, echoes taken, echoes refused (no sample of their
    /// PSN out to their sender: late, duplicated or forged).
    pub ud_samples: u64,
    pub ud_samples_lost: u64,
    pub ud_echoes_taken: u64,
    pub ud_echoes_stale: u64,
    /// UD receiver: echoes of samples sent, and dropped for a full queue.
    pub ud_echoes_sent: u64,
    pub ud_echoes_dropped: u64,
    pub last_probe_rtt_ns: u64,
}

impl QpCounters {
    /// Adds `other` to these counters (NIC-wide totals); the last probe
    /// RTT is the latest one seen.
    pub fn accumulate(&mut self, other: &QpCounters) {
        let QpCounters {
            tx_packets,
            tx_bytes,
            rx_packets,
            rx_bytes,
            retransmitted,
            naks_sent,
            naks_received,
            rnr_naks_received,
            rnr_naks_sent,
            timeouts,
            duplicates,
            out_of_order,
            icrc_drops,
            ignored_responses,
            read_replays,
            probes_sent,
            probe_responses,
            cnps_sent,
            cnps_received,
            notifies_sent,
            notifies_received,
            int_responses,
            int_responses_stale,
            flow_reports,
            path_probes,
            path_probe_responses,
            path_moves,
            feedback_forged,
            feedback_replayed,
            feedback_unkeyed,
            uc_dropped,
            qkey_violations,
            datagrams_no_wqe,
            datagrams_too_long,
            datagrams_unaddressed,
            ud_samples,
            ud_samples_lost,
            ud_echoes_taken,
            ud_echoes_stale,
            ud_echoes_sent,
            ud_echoes_dropped,
            last_probe_rtt_ns,
        } = *other;
        self.tx_packets += tx_packets;
        self.tx_bytes += tx_bytes;
        self.rx_packets += rx_packets;
        self.rx_bytes += rx_bytes;
        self.retransmitted += retransmitted;
        for i in 0..4 {
            self.naks_sent[i] += naks_sent[i];
            self.naks_received[i] += naks_received[i];
        }
        self.rnr_naks_received += rnr_naks_received;
        self.rnr_naks_sent += rnr_naks_sent;
        self.timeouts += timeouts;
        self.duplicates += duplicates;
        self.out_of_order += out_of_order;
        self.icrc_drops += icrc_drops;
        self.ignored_responses += ignored_responses;
        self.read_replays += read_replays;
        self.probes_sent += probes_sent;
        self.probe_responses += probe_responses;
        self.cnps_sent += cnps_sent;
        self.cnps_received += cnps_received;
        self.notifies_sent += notifies_sent;
        self.notifies_received += notifies_received;
        self.int_responses += int_responses;
        self.int_responses_stale += int_responses_stale;
        self.flow_reports += flow_reports;
        self.path_probes += path_probes;
        self.path_probe_responses += path_probe_responses;
        self.path_moves += path_moves;
        self.feedback_forged += feedback_forged;
        self.feedback_replayed += feedback_replayed;
        self.feedback_unkeyed += feedback_unkeyed;
        self.uc_dropped += uc_dropped;
        self.qkey_violations += qkey_violations;
        self.datagrams_no_wqe += datagrams_no_wqe;
        self.datagrams_too_long += datagrams_too_long;
        self.datagrams_unaddressed += datagrams_unaddressed;
        self.ud_samples += ud_samples;
        self.ud_samples_lost += ud_samples_lost;
        self.ud_echoes_taken += ud_echoes_taken;
        self.ud_echoes_stale += ud_echoes_stale;
        self.ud_echoes_sent += ud_echoes_sent;
        self.ud_echoes_dropped += ud_echoes_dropped;
        if last_probe_rtt_ns != 0 {
            self.last_probe_rtt_ns = last_probe_rtt_ns;
        }
    }
}

/// Engine-wide counters: drops before a QP is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineCounters {
    pub rx_frames: u64,
    /// Frames refused by the wire codec, by [`ErrorKind`] index (ICRC drops
    /// are `bad_icrc`).
    pub wire_drops: [u64; ErrorKind::ALL.len()],
    /// Valid frames for a QP that does not exist.
    pub unknown_qp: u64,
    /// Frames for a QP in a state that takes no packets (RESET, INIT, ERR).
    pub wrong_state: u64,
    /// Frames of another transport service than their QP's (a UC or UD
    /// packet to an RC QP, ...).
    pub wrong_service: u64,
    /// Datagrams to a multicast group no QP of this engine is attached
    /// to.
    pub mcast_unjoined: u64,
    /// INT responses naming no QP connected to (their source, DestQP), or
    /// arriving at an engine whose data packets do not subscribe.
    pub int_response_unknown: u64,
    pub tx_frames: u64,
    /// The counters of every QP destroyed or reset so far, summed (the
    /// live QPs' are added by `Engine::qp_totals`).
    pub closed_qps: QpCounters,
}

impl EngineCounters {
    /// Frames dropped with a bad ICRC.
    pub fn icrc_drops(&self) -> u64 {
        self.wire_drops[ErrorKind::BadIcrc.index()]
    }
}
