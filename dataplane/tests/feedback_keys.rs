//! Authenticated feedback through the daemon (HPCC++ draft-00 s9,
//! docs/wire.md "Authenticated feedback"): a key reaches a QP either from
//! the daemon's `feedback_domain_key` (applications that know nothing of
//! keys, unmodified verbs binaries included) or from the application
//! (`QpBuilder::feedback_key`, rnicdv's `rnicdv_set_qp_feedback_key`); the
//! ACKs then carry a MAC the sender verifies, and two ends with different
//! keys refuse each other's feedback.

mod daemon_util;

use std::time::Duration;

use shm::proto::{Modify, Request};
use verbs::{poll_one, Device, LocalBuf, MrAccess, WcStatus};

const DOMAIN_KEY: &str = "000102030405060708090a0b0c0d0e0f";

const ALL: MrAccess = MrAccess {
    local_write: true,
    remote_write: true,
    remote_read: true,
    remote_atomic: false,
};

/// What a sender saw of its feedback over a run of WRITEs rnic0 -> rnic1:
/// (keyed, forged, replayed, without a MAC) of the sender's QP, and the
/// same of the receiver's.
type Seen = ((bool, u64, u64, u64), (bool, u64, u64, u64));

/// Connects a QP of rnic0 (key `a`) to one of rnic1 (key `b`), WRITEs
/// 32 x 64 KiB and reads what each QP says of its feedback.
fn write_with_keys(socket: &std::path::Path, a: Option<[u8; 16]>, b: Option<[u8; 16]>) -> Seen {
    let d0 = Device::open(socket, "rnic0").unwrap();
    let d1 = Device::open(socket, "rnic1").unwrap();
    let (pd0, pd1) = (d0.alloc_pd().unwrap(), d1.alloc_pd().unwrap());
    let (cq0, cq1) = (d0.create_cq(64).unwrap(), d1.create_cq(64).unwrap());
    let (mr0, mr1) = (
        pd0.alloc_mr(1 << 16, ALL).unwrap(),
        pd1.alloc_mr(1 << 16, ALL).unwrap(),
    );
    let build = |pd: &verbs::Pd, cq, key: Option<[u8; 16]>| {
        let b = pd.qp_builder(cq);
        match key {
            Some(k) => b.feedback_key(k),
            None => b,
        }
        .build()
        .unwrap()
    };
    let (p0, p1) = (build(&pd0, &cq0, a), build(&pd1, &cq1, b));
    let (mut e0, mut e1) = (p0.endpoint(), p1.endpoint());
    e0.mr = Some(mr0.remote());
    e1.mr = Some(mr1.remote());
    let q0 = p0.connect(&e1).unwrap();
    let q1 = p1.connect(&e0).unwrap();
    let remote = e1.mr.unwrap();
    for i in 0..32 {
        q0.post_write(LocalBuf::of(&mr0, 0, 1 << 16), &remote, 0, i, true)
            .unwrap();
        let c = poll_one(&cq0, Duration::from_secs(60))
            .unwrap()
            .expect("a completion within 60 s");
        assert_eq!(c.status, WcStatus::Success);
    }
    let seen = |q: &verbs::Qp| {
        let i = q.query().unwrap();
        (
            i.feedback_auth,
            i.feedback_forged,
            i.feedback_replayed,
            i.feedback_unkeyed,
        )
    };
    (seen(&q0), seen(&q1))
}

#[test]
fn a_domain_key_authenticates_every_connection_between_telemetry_peers() {
    let d = daemon_util::start_daemon_with(
        "fb-domain",
        "",
        &format!("cc = \"hpcc\"\nfeedback_domain_key = \"{DOMAIN_KEY}\""),
    );
    // Both ends derive the same key: everything verifies.
    let (tx, rx) = write_with_keys(&d.socket, None, None);
    assert_eq!((tx, rx), ((true, 0, 0, 0), (true, 0, 0, 0)));
    // A key the application sets wins: one end's own key against the
    // other's derived one, and the sender refuses every echoed stack.
    let (tx, _) = write_with_keys(&d.socket, Some([9; 16]), None);
    assert!(
        tx.0 && tx.1 > 0,
        "the sender refused its peer's MACs: {tx:?}"
    );
    // A QP towards a peer outside the telemetry domain gets no key.
    let dev = Device::open(&d.socket, "rnic0").unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let qp = pd
        .qp_builder(&cq)
        .build()
        .unwrap()
        .connect(&verbs::Endpoint {
            qpn: 0x11,
            psn: 0,
            ip: "10.9.9.9".parse().unwrap(),
            mr: None,
        })
        .unwrap();
    assert!(!qp.query().unwrap().feedback_auth);
}

#[test]
fn keys_set_by_the_application_authenticate_without_a_domain_key() {
    let d = daemon_util::start_daemon_with("fb-app", "", "cc = \"hpcc\"");
    let (tx, rx) = write_with_keys(&d.socket, Some([5; 16]), Some([5; 16]));
    assert_eq!((tx, rx), ((true, 0, 0, 0), (true, 0, 0, 0)));
    // No key anywhere: not authenticated.
    let (tx, _) = write_with_keys(&d.socket, None, None);
    assert_eq!(tx, (false, 0, 0, 0));
    // Only the sender keyed: its peer's ACKs carry no MAC, and each is
    // refused and counted as such (not as forged).
    let (tx, rx) = write_with_keys(&d.socket, Some([5; 16]), None);
    assert!(tx.0 && tx.1 == 0 && tx.3 > 0, "{tx:?}");
    assert!(!rx.0);
    // A key only after the QP connected is refused, naming the state.
    let dev = Device::open(&d.socket, "rnic0").unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let p = pd.qp_builder(&cq).build().unwrap();
    let mut e = p.endpoint();
    e.mr = None;
    let qp = p.connect(&e).unwrap();
    let r = dev.call(Request::SetQpFeedbackKey {
        qpn: qp.qpn(),
        key: Some([1; 16]),
    });
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains("RESET or INIT") && msg.contains("RTS"),
        "{msg}"
    );
    // RESET forgets the application's key: connected again, the QP is
    // not keyed.
    let p = pd.qp_builder(&cq).feedback_key([2; 16]).build().unwrap();
    let e = p.endpoint();
    let qp = p.connect(&e).unwrap();
    assert!(qp.query().unwrap().feedback_auth);
    for modify in [
        Modify::Reset,
        Modify::Init {
            remote_write: true,
            remote_read: true,
            remote_atomic: false,
            qkey: None,
        },
        Modify::Rtr {
            mtu: 1024,
            dest_qpn: e.qpn,
            dest_ip: e.ip,
            rq_psn: e.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            traffic_class: None,
        },
    ] {
        let qpn = qp.qpn();
        dev.call(Request::ModifyQp { qpn, modify }).unwrap();
    }
    assert!(!qp.query().unwrap().feedback_auth);
}

#[test]
fn a_bad_domain_key_is_refused_naming_the_key_but_not_showing_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/loopback.toml"
    ))
    .unwrap();
    let secret = "00112233445566778899aabbccddeeXX";
    let text = text.replace(
        "[service]\n",
        &format!("[service]\nfeedback_domain_key = \"{secret}\"\n"),
    );
    assert!(
        text.contains(secret),
        "the loopback config has a [service] section"
    );
    std::fs::write(&cfg, text).unwrap();
    let out = testkit::output_within(
        std::process::Command::new(env!("CARGO_BIN_EXE_dataplane"))
            .args(["--config"])
            .arg(&cfg)
            .arg("--check"),
        daemon_util::RUN_LIMIT,
    )
    .unwrap();
    let err = &out.stderr;
    assert!(out.status.is_some_and(|s| !s.success()), "{out:?}");
    assert!(err.contains("service.feedback_domain_key"), "{err}");
    assert!(err.contains("hex digits"), "{err}");
    assert!(!err.contains(secret), "the key is not printed: {err}");
}
