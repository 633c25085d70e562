//! What each received CM message does to the connections, as Linux's
//! `cm_req_handler`, `cm_rep_handler`, `cm_rtu_handler`, `cm_rej_handler`,
//! `cm_mra_handler`, `cm_dreq_handler` and `cm_drep_handler` do it
//! (docs/cm-linux.md).

use super::conn::{exp_to_ns, Conn, State};
use super::{ack_timeout, Cm, CmEvent, CommId, Peer};
use crate::wire::cm::{self, CmMsg, Drep, Dreq, Mra, Rej, Rep, Req, Rtu, SidrRep, SidrReq};

pub(super) fn handle(cm: &mut Cm, now: u64, tid: u64, from: Peer, msg: CmMsg) {
    match msg {
        CmMsg::Req(r) => on_req(cm, now, tid, from, r),
        CmMsg::Rep(r) => on_rep(cm, tid, from, r),
        CmMsg::Rtu(r) => on_rtu(cm, &r),
        CmMsg::Rej(r) => on_rej(cm, now, r),
        CmMsg::Mra(m) => on_mra(cm, now, &m),
        CmMsg::Dreq(d) => on_dreq(cm, tid, from, &d),
        CmMsg::Drep(d) => on_drep(cm, now, &d),
        CmMsg::SidrReq(r) => on_sidr_req(cm, tid, from, r),
        CmMsg::SidrRep(r) => on_sidr_rep(cm, r),
    }
}

/// A REJ for a message of the peer's that matches no connection (the
/// TID echoed, the peer's comm ID as the remote one).
fn reject_unknown(
    cm: &mut Cm,
    tid: u64,
    to: Peer,
    local: CommId,
    remote: CommId,
    rejected: u8,
    reason: u16,
) {
    let rej = Rej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: rejected,
        ari_length: 0,
        reason,
        ari: [0; cm::REJ_ARI],
        private_data: [0; cm::REJ_PRIVATE],
    };
    cm.counters.rejects_sent += 1;
    cm.send(to, CmMsg::Rej(Box::new(rej)).emit(tid));
}

fn on_req(cm: &mut Cm, now: u64, tid: u64, from: Peer, r: Box<Req>) {
    // A REQ for another host (flooded to this port) is not ours to
    // answer.
    if r.primary.remote_gid != super::gid_of(cm.cfg.ip) {
        cm.counters.unmatched += 1;
        return;
    }
    let guid = r.local_ca_guid;
    // A REQ we hold already: dropped (Linux never sends the REP again for
    // it; only its own retries do).
    if cm.by_remote_id.contains_key(&(r.local_comm_id, guid)) {
        cm.counters.duplicates += 1;
        return;
    }
    // From a QP that still has a connection here: stale.
    if let Some(&old) = cm.by_remote_qpn.get(&(r.local_qpn, guid)) {
        cm.counters.stale += 1;
        reject_unknown(
            cm,
            tid,
            from,
            0,
            r.local_comm_id,
            cm::msg::REQ,
            cm::rej::STALE_CONN,
        );
        if cm
            .conns
            .get(&old)
            .is_some_and(|c| c.state == State::Established)
        {
            // Its consumer hears of it when the DREP comes (or the DREQ
            // times out), as from Linux.
            cm.send_dreq(now, old);
        }
        return;
    }
    let Some(&listener) = cm.listeners.get(&r.service_id) else {
        cm.counters.no_listener += 1;
        // Linux puts REQ bytes 4-7 (the vendor ID) in LocalCommID.
        let local = r.vendor_id;
        reject_unknown(
            cm,
            tid,
            from,
            local,
            r.local_comm_id,
            cm::msg::REQ,
            cm::rej::INVALID_SERVICE_ID,
        );
        return;
    };
    let id = cm.new_id();
    // The path's ACK timeout as the peer computed it; our REP's timeout
    // is the peer's CM response time, retried its times.
    cm.conns.insert(
        id,
        Conn {
            remote_id: r.local_comm_id,
            remote_guid: guid,
            remote_qpn: r.local_qpn,
            listener: Some(listener),
            ack_timeout: r.primary.local_ack_timeout,
            timeout_ns: exp_to_ns(r.local_cm_response_timeout),
            max_retries: r.max_cm_retries,
            ..Conn::new(id, State::ReqRcvd, from, tid, r.service_id)
        },
    );
    cm.by_remote_id.insert((r.local_comm_id, guid), id);
    cm.by_remote_qpn.insert((r.local_qpn, guid), id);
    cm.events.push_back(CmEvent::ConnectRequest {
        listener,
        id,
        req: r,
        from,
    });
}

fn on_rep(cm: &mut Cm, tid: u64, from: Peer, r: Box<Rep>) {
    let guid = r.local_ca_guid;
    let id = r.remote_comm_id;
    let waiting = cm
        .conns
        .get(&id)
        .is_some_and(|c| c.state == State::ReqSent && c.remote_id == 0);
    if !waiting {
        // A duplicate REP: an established connection sends its RTU again.
        let again = cm
            .conns
            .get(&id)
            .filter(|c| c.remote_id == r.local_comm_id && c.remote_guid == guid)
            .map(|c| (c.state, c.remote_id, c.peer, c.tid));
        match again {
            Some((State::Established, remote, to, tid)) => {
                cm.counters.duplicates += 1;
                let rtu = Rtu {
                    local_comm_id: id,
                    remote_comm_id: remote,
                    private_data: [0; cm::RTU_PRIVATE],
                };
                cm.send(to, CmMsg::Rtu(Box::new(rtu)).emit(tid));
            }
            Some(_) => cm.counters.duplicates += 1,
            None => cm.counters.unmatched += 1,
        }
        return;
    }
    if cm.by_remote_id.contains_key(&(r.local_comm_id, guid)) {
        // Another connection's peer ID: a duplicate, as Linux takes it.
        cm.counters.duplicates += 1;
        return;
    }
    if cm.by_remote_qpn.contains_key(&(r.local_qpn, guid)) {
        cm.counters.stale += 1;
        reject_unknown(
            cm,
            tid,
            from,
            id,
            r.local_comm_id,
            cm::msg::REP,
            cm::rej::STALE_CONN,
        );
        return;
    }
    let Some(c) = cm.conns.get_mut(&id) else {
        return;
    };
    c.state = State::RepRcvd;
    c.remote_id = r.local_comm_id;
    c.remote_guid = guid;
    c.remote_qpn = r.local_qpn;
    c.pending = None;
    c.ack_timeout = ack_timeout(r.target_ack_delay, c.ack_timeout.saturating_sub(1));
    cm.by_remote_id.insert((r.local_comm_id, guid), id);
    cm.by_remote_qpn.insert((r.local_qpn, guid), id);
    cm.events.push_back(CmEvent::RepReceived { id, rep: r });
}

fn on_rtu(cm: &mut Cm, r: &Rtu) {
    let id = r.remote_comm_id;
    match cm.conns.get_mut(&id) {
        Some(c) if c.state == State::RepSent && c.remote_id == r.local_comm_id => {
            c.state = State::Established;
            c.pending = None;
            cm.events.push_back(CmEvent::Established { id });
        }
        Some(_) => cm.counters.duplicates += 1,
        None => cm.counters.unmatched += 1,
    }
}

fn on_rej(cm: &mut Cm, now: u64, r: Box<Rej>) {
    cm.counters.rejects_received += 1;
    // A peer that gave up waiting for our REP does not know our comm ID:
    // its REJ TIMEOUT names itself by its comm ID and CA GUID (the ARI).
    let by_ari = (r.reason == cm::rej::TIMEOUT && r.ari_length >= 8).then(|| {
        let mut g = [0u8; 8];
        g.copy_from_slice(&r.ari[..8]);
        (r.local_comm_id, u64::from_be_bytes(g))
    });
    let id = match by_ari.and_then(|k| cm.by_remote_id.get(&k)) {
        Some(&id) => id,
        None => r.remote_comm_id,
    };
    let ok = cm.conns.get(&id).is_some_and(|c| {
        let ids = match r.message_rejected {
            // The REQ's rejecter may not have named itself.
            cm::msg::REQ => c.state == State::ReqSent,
            _ => c.remote_id == r.local_comm_id,
        };
        ids && matches!(
            c.state,
            State::ReqSent
                | State::ReqRcvd
                | State::RepSent
                | State::RepRcvd
                | State::Established
                | State::DreqSent
        )
    });
    if !ok {
        cm.counters.unmatched += 1;
        return;
    }
    let reason = r.reason;
    // A connection that had its peer's QP (a REP sent or received, or
    // connected) keeps the QPN out of use in TIMEWAIT; so does a stale
    // one.
    let connected = cm.conns.get(&id).is_some_and(|c| {
        matches!(
            c.state,
            State::RepSent | State::RepRcvd | State::Established | State::DreqSent
        )
    });
    if reason == cm::rej::STALE_CONN || connected {
        cm.enter_timewait(now, id);
    } else {
        cm.forget(id);
    }
    cm.events
        .push_back(CmEvent::Rejected { id, reason, rej: r });
}

fn on_mra(cm: &mut Cm, now: u64, m: &Mra) {
    let Some(c) = cm.conns.get_mut(&m.remote_comm_id) else {
        cm.counters.unmatched += 1;
        return;
    };
    let for_it = match m.message_mraed {
        cm::msg::REQ => c.state == State::ReqSent,
        cm::msg::REP => c.state == State::RepSent && c.remote_id == m.local_comm_id,
        _ => false,
    };
    let Some(p) = c.pending.as_mut().filter(|_| for_it) else {
        cm.counters.unmatched += 1;
        return;
    };
    if p.mra_taken {
        cm.counters.duplicates += 1;
        return;
    }
    p.mra_taken = true;
    // The peer needs this long more: every wait from now on.
    p.timeout_ns = exp_to_ns(m.service_timeout) + exp_to_ns(c.ack_timeout);
    p.deadline = now.saturating_add(p.timeout_ns);
}

fn on_dreq(cm: &mut Cm, tid: u64, from: Peer, d: &Dreq) {
    let id = d.remote_comm_id;
    let Some(c) = cm
        .conns
        .get_mut(&id)
        .filter(|c| c.remote_id == d.local_comm_id)
    else {
        // Nothing of ours: the DREP it asks for, so that it stops.
        cm.counters.unmatched += 1;
        let drep = Drep {
            local_comm_id: d.remote_comm_id,
            remote_comm_id: d.local_comm_id,
            private_data: [0; cm::DREP_PRIVATE],
        };
        cm.send(from, CmMsg::Drep(Box::new(drep)).emit(tid));
        return;
    };
    if d.remote_qpn != c.local_qpn {
        cm.counters.unmatched += 1;
        return;
    }
    match c.state {
        State::RepSent | State::Established | State::DreqSent => {
            c.state = State::DreqRcvd;
            c.dreq_tid = tid;
            c.pending = None;
            cm.events.push_back(CmEvent::Disconnected {
                id,
                timed_out: false,
            });
        }
        State::TimeWait => {
            // Our DREP was lost: again.
            c.dreq_tid = tid;
            let drep = Drep {
                local_comm_id: id,
                remote_comm_id: c.remote_id,
                private_data: [0; cm::DREP_PRIVATE],
            };
            let to = c.peer;
            cm.counters.duplicates += 1;
            cm.send(to, CmMsg::Drep(Box::new(drep)).emit(tid));
        }
        _ => cm.counters.duplicates += 1,
    }
}

fn on_drep(cm: &mut Cm, now: u64, d: &Drep) {
    let id = d.remote_comm_id;
    let state = cm
        .conns
        .get(&id)
        .filter(|c| c.remote_id == d.local_comm_id)
        .map(|c| c.state);
    match state {
        Some(State::DreqSent) => {
            cm.enter_timewait(now, id);
            cm.events.push_back(CmEvent::Disconnected {
                id,
                timed_out: false,
            });
        }
        Some(State::DreqRcvd) => cm.enter_timewait(now, id),
        Some(_) => cm.counters.duplicates += 1,
        None => cm.counters.unmatched += 1,
    }
}

fn on_sidr_req(cm: &mut Cm, tid: u64, from: Peer, r: Box<SidrReq>) {
    // Asked again while the consumer still decides: dropped.
    let pending = cm.conns.values().any(|c| {
        c.state == State::SidrReqRcvd && c.remote_id == r.request_id && c.peer.ip == from.ip
    });
    if pending {
        cm.counters.duplicates += 1;
        return;
    }
    let Some(&listener) = cm.listeners.get(&r.service_id) else {
        cm.counters.no_listener += 1;
        let rep = SidrRep {
            request_id: r.request_id,
            status: cm::sidr::UNSUPPORTED,
            info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: r.service_id,
            qkey: 0,
            info: [0; cm::SIDR_REP_INFO],
            private_data: [0; cm::SIDR_REP_PRIVATE],
        };
        cm.send(from, CmMsg::SidrRep(Box::new(rep)).emit(tid));
        return;
    };
    let id = cm.new_id();
    cm.conns.insert(
        id,
        Conn {
            remote_id: r.request_id,
            listener: Some(listener),
            ..Conn::new(id, State::SidrReqRcvd, from, tid, r.service_id)
        },
    );
    cm.events.push_back(CmEvent::SidrRequest {
        listener,
        id,
        req: r,
        from,
    });
}

fn on_sidr_rep(cm: &mut Cm, r: Box<SidrRep>) {
    let id = r.request_id;
    if !cm
        .conns
        .get(&id)
        .is_some_and(|c| c.state == State::SidrReqSent)
    {
        cm.counters.unmatched += 1;
        return;
    }
    cm.forget(id);
    cm.events.push_back(CmEvent::SidrReply { id, rep: r });
}
