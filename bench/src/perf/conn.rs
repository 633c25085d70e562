//! The two ends of a benchmark: devices, one region each (the first half
//! receives the peer's WRITEs and is what the peer READs, the second half
//! is the source of our WRITEs and the target of our READs), one CQ, `-q`
//! QPs, and the endpoints swapped out of band. With `--loopback` both ends
//! live in this process; otherwise this process is one end and the other
//! is reached over TCP.

use std::net::TcpListener;
use std::time::Duration;

use shm::abi;
use verbs::oob::Session;
use verbs::{Cq, Device, Endpoint, LocalBuf, Mr, MrAccess, Pd, Qp, RemoteMr};

use super::args::{PerfArgs, Test};

/// One end.
pub struct Side {
    // Drop order: QPs, region and CQ before the PD and the device.
    pub qps: Vec<Qp>,
    pub mr: Mr,
    pub cq: Cq,
    _pd: Pd,
    pub dev: Device,
    /// This end's endpoints, one per QP.
    pub endpoints: Vec<Endpoint>,
    /// The peer's region.
    pub remote: RemoteMr,
    /// Bytes in each half of the region.
    pub half: u64,
    /// Slots of each QP's send ring.
    pub sq_depth: u32,
}

impl Side {
    /// The send half's buffer of `len` bytes.
    pub fn send_buf(&self, len: u32) -> LocalBuf {
        LocalBuf::of(&self.mr, self.half, len)
    }
}

/// Both ends, or this end and the session to the other.
pub struct Conn {
    /// The measuring end (client), when this process is it.
    pub client: Option<Side>,
    /// The passive end (server), when this process is it.
    pub server: Option<Side>,
    /// The peer's endpoints as this process's main end sees them.
    pub remote_endpoints: Vec<Endpoint>,
    pub session: Option<Session>,
    pub backend: String,
    /// The least payload the device sends from where it lies (none: it
    /// copies every payload).
    pub zero_copy_tx_min: Option<u32>,
    pub cc: String,
    pub mtu: u32,
    pub device: String,
    /// The main end's shared segment: bytes, and whether hugepages back it.
    pub shm: (u64, bool),
}

const ALL: MrAccess = MrAccess {
    local_write: true,
    remote_write: true,
    remote_read: true,
    remote_atomic: true,
};

struct Prepared {
    dev: Device,
    pd: Pd,
    mr: Mr,
    cq: Cq,
    qps: Vec<verbs::PreparedQp>,
    half: u64,
    /// The QPs' path MTU.
    mtu: u32,
    sq_depth: u32,
}

fn prepare(a: &PerfArgs, device: &str, half: u64) -> Result<Prepared, String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: verbs::VerbsError| format!("{device}: {what}: {err}")
    };
    // -t bounds the WRs in flight over all QPs: each QP gets the whole
    // depth as perftest gives it, unless there are so many QPs that their
    // rings would not fit; then the smallest rings (a QP whose ring is
    // full waits its turn).
    let (depth, recv_depth) = if a.qps <= 64 {
        (a.tx_depth.next_power_of_two().max(16), 128)
    } else {
        (8, 8)
    };
    // The daemon places each ring on pages of its own.
    let pages = |bytes: usize| (bytes as u64).div_ceil(4096) * 4096;
    let rings = u64::from(a.qps)
        * (pages(abi::RingLayout::bytes(
            depth,
            std::mem::size_of::<abi::Wqe>(),
        )) + pages(abi::RingLayout::bytes(
            recv_depth,
            std::mem::size_of::<abi::RecvWqe>(),
        )));
    let bytes = 2 * half + rings + (16 << 20);
    let dev = Device::open_with(&a.socket, device, bytes).map_err(e("open"))?;
    let pd = dev.alloc_pd().map_err(e("PD"))?;
    let mr = pd.alloc_mr(2 * half, ALL).map_err(e("region"))?;
    let cq = dev
        .create_cq((depth * a.qps).next_power_of_two().clamp(64, 16384))
        .map_err(e("CQ"))?;
    let mtu = a.mtu.unwrap_or(dev.info().max_mtu);
    let mut qps = Vec::new();
    for _ in 0..a.qps {
        qps.push(
            pd.qp_builder(&cq)
                .depth(depth)
                .recv_depth(recv_depth)
                .mtu(mtu)
                .max_rd_atomic(a.outs)
                .build()
                .map_err(e("QP"))?,
        );
    }
    Ok(Prepared {
        dev,
        pd,
        mr,
        cq,
        qps,
        half,
        mtu,
        sq_depth: depth,
    })
}

impl Prepared {
    fn endpoints(&self) -> Vec<Endpoint> {
        self.qps
            .iter()
            .map(|q| {
                let mut ep = q.endpoint();
                ep.mr = Some(self.mr.remote());
                ep
            })
            .collect()
    }

    fn connect(self, peer: &[Endpoint]) -> Result<Side, String> {
        let endpoints = self.endpoints();
        let remote = peer
            .first()
            .and_then(|p| p.mr)
            .ok_or("the peer sent no region")?;
        let mut qps = Vec::new();
        for (q, p) in self.qps.into_iter().zip(peer) {
            qps.push(q.connect(p).map_err(|e| format!("connect QP: {e}"))?);
        }
        Ok(Side {
            qps,
            mr: self.mr,
            cq: self.cq,
            _pd: self.pd,
            dev: self.dev,
            endpoints,
            remote,
            half: self.half,
            sq_depth: self.sq_depth,
        })
    }
}

fn exchange(s: &mut Session, mine: &[Endpoint]) -> Result<Vec<Endpoint>, String> {
    mine.iter()
        .map(|ep| {
            s.exchange(ep)
                .map_err(|e| format!("endpoint exchange: {e}"))
        })
        .collect()
}

impl Conn {
    pub fn establish(test: Test, a: &PerfArgs) -> Result<Conn, String> {
        let half = u64::from(*a.sizes(test).iter().max().expect("a size")).max(64);
        if a.loopback {
            let c = prepare(a, a.device.as_deref().unwrap_or("rnic0"), half)?;
            let s = prepare(a, "rnic1", half)?;
            let (ce, se) = (c.endpoints(), s.endpoints());
            let info = c.dev.info().clone();
            let mtu = c.mtu;
            return Ok(Conn {
                client: Some(c.connect(&se)?),
                server: Some(s.connect(&ce)?),
                remote_endpoints: se,
                session: None,
                backend: info.backend,
                zero_copy_tx_min: info.zero_copy_tx_min,
                cc: info.cc,
                mtu,
                shm: (info.shm_bytes, info.hugepages),
                device: info.name,
            });
        }
        let client = a.server.is_some();
        let default = if client { "rnic0" } else { "rnic1" };
        let p = prepare(a, a.device.as_deref().unwrap_or(default), half)?;
        let info = p.dev.info().clone();
        let mtu = p.mtu;
        let mut session = match &a.server {
            Some(host) => Session::connect((host.as_str(), a.port), Duration::from_secs(60))
                .map_err(|e| format!("connect to {host}:{}: {e}", a.port))?,
            None => {
                let l = TcpListener::bind(("0.0.0.0", a.port))
                    .map_err(|e| format!("listen on TCP port {}: {e}", a.port))?;
                println!(" waiting for a client on TCP port {}", a.port);
                Session::accept(&l).map_err(|e| format!("accept: {e}"))?
            }
        };
        let theirs = exchange(&mut session, &p.endpoints())?;
        if theirs.len() != a.qps as usize {
            return Err(format!(
                "the peer has {} QPs, this side -q {}",
                theirs.len(),
                a.qps
            ));
        }
        let side = p.connect(&theirs)?;
        Ok(Conn {
            client: Some(side),
            server: None,
            remote_endpoints: theirs,
            session: Some(session),
            backend: info.backend,
            zero_copy_tx_min: info.zero_copy_tx_min,
            cc: info.cc,
            mtu,
            shm: (info.shm_bytes, info.hugepages),
            device: info.name,
        }
        .place(client))
    }

    /// Moves a lone side to the right slot.
    fn place(mut self, client: bool) -> Conn {
        if !client {
            self.server = self.client.take();
        }
        self
    }

    /// Both ends are in this process.
    pub fn is_local(&self) -> bool {
        self.client.is_some() && self.server.is_some()
    }

    /// The end whose endpoints this process shows as "local".
    pub fn main_side(&self) -> &Side {
        self.client
            .as_ref()
            .or(self.server.as_ref())
            .expect("one side at least")
    }

    /// Barrier with the peer process (no-op when both ends are here).
    pub fn sync(&mut self, line: &str) -> Result<String, String> {
        match self.session.as_mut() {
            Some(s) => s.sync(line).map_err(|e| format!("sync {line:?}: {e}")),
            None => Ok(line.to_string()),
        }
    }

    /// Starts one size: agrees on it with the peer process, and turns
    /// `-D` into a deadline (with unbounded iterations) or keeps `iters`.
    pub fn begin_size(
        &mut self,
        a: &PerfArgs,
        size: u32,
        iters: u64,
        started: std::time::Instant,
    ) -> Result<(Option<std::time::Instant>, u64), String> {
        let deadline = a.duration.map(|d| started + Duration::from_secs_f64(d));
        if self.session.is_some() {
            let mine = format!("size {size}");
            let theirs = self.sync(&mine)?;
            if theirs != mine {
                return Err(format!(
                    "this side runs {mine:?}, the peer {theirs:?}: give both the same -s/-a"
                ));
            }
        }
        Ok((deadline, if deadline.is_some() { u64::MAX } else { iters }))
    }

    /// Tells the peer the run is over.
    pub fn finish(&mut self) -> Result<(), String> {
        self.sync("done").map(|_| ())
    }
}
