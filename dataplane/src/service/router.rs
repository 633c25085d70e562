//! Which dataplane lcore (shard) a control request goes to, and the one
//! reply made of every shard's answer to a request they all see.
//!
//! Each shard serves a disjoint set of devices and the applications that
//! opened them, so nothing on the data path is shared between lcores. An
//! application belongs to the shard of the device it opened: its
//! `OpenDevice` goes to that shard (by the device's name) and everything
//! after it on the same connection follows. Requests about the whole
//! daemon (`ListDevices`, `Stats`, `Trace`, `TraceStamps`) go to every
//! shard; their answers are merged into one reply (devices in the daemon's
//! order, counters summed, trace pages side by side). The router runs in
//! the control thread; with one shard it is a pass-through.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use shm::proto::{ErrorKind, ErrorReply, Reply, ReplyMsg, Request};

use super::control::{ConnId, ToControl, ToDataplane, ToLcore};
use crate::stats::Snapshot;

/// A request every shard answers, and how the answers become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Everyone {
    Devices,
    Stats,
    Trace,
    TraceStamps { from: u64 },
}

impl Everyone {
    fn of(req: &Request) -> Option<Everyone> {
        match *req {
            Request::ListDevices => Some(Everyone::Devices),
            Request::Stats => Some(Everyone::Stats),
            Request::Trace { .. } => Some(Everyone::Trace),
            Request::TraceStamps { from } => Some(Everyone::TraceStamps { from }),
            _ => None,
        }
    }
}

/// Answers gathered so far for one request sent to every shard.
struct Gathering {
    what: Everyone,
    answers: Vec<Result<Reply, ErrorReply>>,
}

/// The shards' request channels and who serves what.
pub struct Router {
    shards: Vec<ToLcore>,
    /// Device names in the daemon's order, and the shard serving each (a
    /// device sharded over several lcores is named once for each).
    devices: Vec<(String, usize)>,
    /// The shard of each connection that opened a device, and the entry
    /// of `devices` it opened.
    owner: HashMap<ConnId, (usize, usize)>,
    gathering: HashMap<(ConnId, u64), Gathering>,
}

/// Every shard's channel is gone (the dataplane stopped).
#[derive(Debug)]
pub struct Stopped;

impl Router {
    /// Routes to `shards` (one channel each); `devices` names every
    /// device in the daemon's order with the index of its shard.
    pub fn new(shards: Vec<ToLcore>, devices: Vec<(String, usize)>) -> Router {
        Router {
            shards,
            devices,
            owner: HashMap::new(),
            gathering: HashMap::new(),
        }
    }

    /// Sends a request to the shard that serves it (or to all of them).
    pub fn route(
        &mut self,
        conn: ConnId,
        id: u64,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Stopped> {
        if let Some(what) = Everyone::of(&req) {
            self.gathering.insert(
                (conn, id),
                Gathering {
                    what,
                    answers: Vec::with_capacity(self.shards.len()),
                },
            );
            let mut sent = false;
            for s in &self.shards {
                let m = ToDataplane::Request {
                    conn,
                    id,
                    req: req.clone(),
                    fds: Vec::new(),
                };
                sent |= s.send(m).is_ok();
            }
            return if sent { Ok(()) } else { Err(Stopped) };
        }
        let shard = match (&req, self.owner.get(&conn)) {
            (_, Some(&(s, _))) => s,
            (Request::OpenDevice { device, .. }, None) => {
                // A device whose QPs are sharded over several lcores: the
                // lcore serving the fewest applications of that device
                // (so that the applications on the two ends of a
                // connection between two of the daemon's devices meet on
                // the same lcore, their QPs' frames arriving on their own
                // shards' queues).
                let serving = |e: usize| self.owner.values().filter(|o| o.1 == e).count();
                let entry = (0..self.devices.len())
                    .filter(|&e| self.devices[e].0 == *device)
                    .min_by_key(|&e| (serving(e), self.devices[e].1));
                match entry {
                    Some(e) => {
                        let s = self.devices[e].1;
                        self.owner.insert(conn, (s, e));
                        s
                    }
                    // No such device: any shard says so.
                    None => 0,
                }
            }
            (Request::CmOpen { device }, None) => {
                // An rdma_cm session: the lcore of the device's first QP
                // shard, whose QP1 (and CM) takes the device's MADs.
                match (0..self.devices.len()).find(|&e| self.devices[e].0 == *device) {
                    Some(e) => {
                        let s = self.devices[e].1;
                        self.owner.insert(conn, (s, e));
                        s
                    }
                    None => 0,
                }
            }
            // Not open (or an event channel, which any shard names): any
            // shard says so.
            (_, None) => 0,
        };
        let m = ToDataplane::Request { conn, id, req, fds };
        self.shards[shard].send(m).map_err(|_| Stopped)
    }

    /// The connection closed: its shard releases what it held.
    pub fn closed(&mut self, conn: ConnId) {
        self.gathering.retain(|(c, _), _| *c != conn);
        if let Some((s, _)) = self.owner.remove(&conn) {
            let _ = self.shards[s].send(ToDataplane::Closed { conn });
        }
    }

    /// A shard's reply; what goes to the application, if anything yet (a
    /// request every shard answers waits for the last answer).
    pub fn reply(&mut self, r: ToControl) -> Option<ToControl> {
        let key = (r.conn, r.msg.id);
        let Some(g) = self.gathering.get_mut(&key) else {
            return Some(r);
        };
        g.answers.push(r.msg.result);
        if g.answers.len() < self.shards.len() {
            return None;
        }
        let g = self.gathering.remove(&key)?;
        Some(ToControl {
            conn: r.conn,
            msg: ReplyMsg {
                v: shm::VERSION,
                id: r.msg.id,
                result: self.merge(g),
            },
            fds: Vec::new(),
        })
    }

    /// One answer of all the shards' (the first error, if any).
    fn merge(&self, g: Gathering) -> Result<Reply, ErrorReply> {
        let answers = g.answers.into_iter().collect::<Result<Vec<Reply>, _>>()?;
        let bad = |r: &Reply| {
            ErrorReply::new(
                ErrorKind::Malformed,
                format!("a shard answered {:?} with {r:?}", g.what),
            )
        };
        match g.what {
            Everyone::Devices => {
                let mut all = Vec::new();
                for r in answers {
                    match r {
                        Reply::Devices(list) => all.extend(list),
                        r => return Err(bad(&r)),
                    }
                }
                let order = |name: &str| self.devices.iter().position(|(n, _)| n == name);
                all.sort_by_key(|d| order(&d.name));
                Ok(Reply::Devices(all))
            }
            Everyone::Stats => {
                let mut parts = Vec::new();
                for r in answers {
                    match r {
                        Reply::Stats { json } => {
                            parts.push(serde_json::from_str::<Snapshot>(&json).map_err(|e| {
                                ErrorReply::new(ErrorKind::Malformed, e.to_string())
                            })?)
                        }
                        r => return Err(bad(&r)),
                    }
                }
                let json = Snapshot::merge(parts)
                    .listed_json()
                    .map_err(|e| ErrorReply::new(ErrorKind::Malformed, e.to_string()))?;
                Ok(Reply::Stats { json })
            }
            Everyone::Trace => match answers.into_iter().find(|r| !matches!(r, Reply::Done)) {
                None => Ok(Reply::Done),
                Some(r) => Err(bad(&r)),
            },
            Everyone::TraceStamps { from } => {
                let (mut hz, mut total, mut dropped, mut next) = (0, 0, 0, from);
                let mut all = Vec::new();
                for r in answers {
                    match r {
                        Reply::TraceStamps {
                            tsc_hz,
                            total: t,
                            dropped: d,
                            stamps,
                            next: n,
                        } => {
                            hz = hz.max(tsc_hz);
                            total = total.max(t);
                            dropped += d;
                            next = next.max(n);
                            all.extend(stamps);
                        }
                        r => return Err(bad(&r)),
                    }
                }
                Ok(Reply::TraceStamps {
                    tsc_hz: hz,
                    total,
                    dropped,
                    stamps: all,
                    next,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{unbounded, Receiver};

    fn router(n: usize) -> (Router, Vec<Receiver<ToDataplane>>) {
        let (tx, rx) = channels(n);
        let devices = (0..n).map(|s| (format!("rnic{s}"), s)).collect();
        (Router::new(tx, devices), rx)
    }

    /// A channel to each of `n` lcores, each with its wake-up.
    fn channels(n: usize) -> (Vec<ToLcore>, Vec<Receiver<ToDataplane>>) {
        (0..n)
            .map(|_| {
                let (tx, rx) = unbounded();
                let wake = std::sync::Arc::new(crate::service::sleep::LcoreWake::new().unwrap());
                (ToLcore::new(tx, wake), rx)
            })
            .unzip()
    }

    fn open(device: &str) -> Request {
        Request::OpenDevice {
            device: device.into(),
            shm_bytes: 0,
        }
    }

    fn got(rx: &Receiver<ToDataplane>) -> Option<(ConnId, u64)> {
        match rx.try_recv().ok()? {
            ToDataplane::Request { conn, id, .. } => Some((conn, id)),
            ToDataplane::Closed { conn } => Some((conn, u64::MAX)),
        }
    }

    fn answer(conn: ConnId, id: u64, result: Result<Reply, ErrorReply>) -> ToControl {
        ToControl {
            conn,
            msg: ReplyMsg {
                v: shm::VERSION,
                id,
                result,
            },
            fds: Vec::new(),
        }
    }

    #[test]
    fn an_application_stays_on_the_shard_of_the_device_it_opened() {
        let (mut r, rx) = router(2);
        r.route(7, 1, open("rnic1"), Vec::new()).unwrap();
        r.route(7, 2, Request::AllocPd, Vec::new()).unwrap();
        assert_eq!(got(&rx[0]), None);
        assert_eq!(got(&rx[1]), Some((7, 1)));
        assert_eq!(got(&rx[1]), Some((7, 2)));
        r.closed(7);
        assert_eq!(got(&rx[1]), Some((7, u64::MAX)), "its shard releases it");
        assert_eq!(got(&rx[0]), None);
    }

    #[test]
    fn a_device_sharded_over_lcores_is_opened_where_it_serves_fewest() {
        let (tx, rx) = channels(2);
        let devices = ["rnic0", "rnic0", "rnic1", "rnic1"]
            .iter()
            .zip([0, 1, 0, 1])
            .map(|(n, s)| (n.to_string(), s))
            .collect();
        let mut r = Router::new(tx, devices);
        // The two ends of a pair meet on lcore 0; a second pair on 1.
        for conn in 1..=4 {
            let dev = if conn % 2 == 1 { "rnic1" } else { "rnic0" };
            r.route(conn, 1, open(dev), Vec::new()).unwrap();
        }
        assert_eq!((got(&rx[0]), got(&rx[0])), (Some((1, 1)), Some((2, 1))));
        assert_eq!((got(&rx[1]), got(&rx[1])), (Some((3, 1)), Some((4, 1))));
        r.closed(3);
        assert_eq!(got(&rx[1]), Some((3, u64::MAX)));
        r.route(5, 1, open("rnic1"), Vec::new()).unwrap();
        assert_eq!(
            got(&rx[1]),
            Some((5, 1)),
            "rnic1 serves none on lcore 1 now"
        );
        r.route(6, 1, open("rnic1"), Vec::new()).unwrap();
        assert_eq!(got(&rx[0]), Some((6, 1)), "a tie goes to the lowest lcore");
    }

    #[test]
    fn requests_before_an_open_or_for_no_device_go_to_one_shard_that_refuses_them() {
        let (mut r, rx) = router(2);
        r.route(3, 1, Request::AllocPd, Vec::new()).unwrap();
        r.route(3, 2, open("mlx5_0"), Vec::new()).unwrap();
        assert_eq!((got(&rx[0]), got(&rx[0])), (Some((3, 1)), Some((3, 2))));
        assert_eq!(got(&rx[1]), None);
        r.closed(3);
        assert_eq!(got(&rx[0]), None, "nothing opened, nothing to release");
    }

    #[test]
    fn a_device_list_waits_for_every_shard_and_keeps_the_daemons_order() {
        let (mut r, rx) = router(2);
        r.route(5, 9, Request::ListDevices, Vec::new()).unwrap();
        assert_eq!((got(&rx[0]), got(&rx[1])), (Some((5, 9)), Some((5, 9))));
        let dev = |name: &str| shm::proto::DeviceInfo {
            name: name.into(),
            ip: std::net::Ipv4Addr::new(10, 0, 0, 1),
            mac: [2, 0, 0, 0, 0, 1],
            max_mtu: 4096,
            shm_bytes: 0,
            hugepages: false,
            backend: "net_ring".into(),
            zero_copy_tx_min: Some(1024),
            cc: "none".into(),
            caps: Default::default(),
            line_gbps: 100,
            doorbells: None,
        };
        let one = r.reply(answer(5, 9, Ok(Reply::Devices(vec![dev("rnic1")]))));
        assert!(one.is_none(), "one shard of two answered");
        let all = r
            .reply(answer(5, 9, Ok(Reply::Devices(vec![dev("rnic0")]))))
            .expect("both answered");
        let Ok(Reply::Devices(list)) = all.msg.result else {
            panic!("a device list")
        };
        let names: Vec<_> = list.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["rnic0", "rnic1"]);
        let other = answer(5, 10, Ok(Reply::Done));
        assert!(r.reply(other).is_some(), "other replies pass through");
    }

    #[test]
    fn a_trace_page_from_every_shard_is_one_page_and_the_next_cursor_is_the_furthest() {
        let (mut r, _rx) = router(2);
        r.route(1, 4, Request::TraceStamps { from: 10 }, Vec::new())
            .unwrap();
        let page = |stamps: Vec<u64>, total| {
            Ok(Reply::TraceStamps {
                tsc_hz: 1000,
                total,
                dropped: 1,
                next: 10 + stamps.len() as u64 / 2,
                stamps,
            })
        };
        assert!(r.reply(answer(1, 4, page(vec![1, 2], 11))).is_none());
        let m = r
            .reply(answer(1, 4, page(vec![3, 4, 5, 6], 30)))
            .expect("merged");
        let Ok(Reply::TraceStamps {
            total,
            dropped,
            stamps,
            next,
            ..
        }) = m.msg.result
        else {
            panic!("a trace page")
        };
        assert_eq!((total, dropped, next), (30, 2, 12));
        assert_eq!(stamps, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_shards_error_is_the_answer() {
        let (mut r, _rx) = router(2);
        r.route(1, 4, Request::Trace { capacity: 5 }, Vec::new())
            .unwrap();
        let e = ErrorReply::new(ErrorKind::InvalidArgument, "too many");
        assert!(r.reply(answer(1, 4, Err(e.clone()))).is_none());
        let m = r.reply(answer(1, 4, Ok(Reply::Done))).unwrap();
        assert_eq!(m.msg.result.unwrap_err().message, e.message);
    }
}
