//! WRITE + READ ping between two processes on the loopback testbed.
//!
//! Start the daemon, then a server and a client (any order):
//!
//! ```text
//! dataplane --config configs/loopback.toml --serve &
//! cargo run -p verbs --example ping -- --device rnic1 --listen 127.0.0.1:18515 &
//! cargo run -p verbs --example ping -- --device rnic0 --connect 127.0.0.1:18515
//! ```
//!
//! The client WRITEs a pattern into the server's region, the server checks
//! it, the client READs it back into its own region and checks it, for
//! each size; both print one line per size.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use verbs::oob::Session;
use verbs::{poll_one, Device, LocalBuf, MrAccess, WcStatus};

#[derive(Parser)]
#[command(about = "RDMA WRITE + READ ping between two processes through the daemon")]
struct Cli {
    /// The daemon's control socket.
    #[arg(long, default_value = "/tmp/rnic/loopback.sock")]
    socket: PathBuf,
    /// Device to open (rnic0 or rnic1 on the loopback testbed).
    #[arg(long)]
    device: String,
    /// Be the server: wait for the client on this TCP address.
    #[arg(long, conflicts_with = "connect")]
    listen: Option<String>,
    /// Be the client: connect to the server's TCP address.
    #[arg(long)]
    connect: Option<String>,
    /// Message sizes in bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1,64,4096,65536,1048576"
    )]
    sizes: Vec<u32>,
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let max = cli.sizes.iter().copied().max().unwrap_or(0).max(1) as u64;
    let dev = Device::open_with(&cli.socket, &cli.device, 8 * max + (16 << 20))?;
    let pd = dev.alloc_pd()?;
    let mut mr = pd.alloc_mr(
        2 * max,
        MrAccess {
            local_write: true,
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        },
    )?;
    let cq = dev.create_cq(256)?;
    let prepared = pd.qp_builder(&cq).build()?;
    let mut mine = prepared.endpoint();
    mine.mr = Some(mr.remote());
    let mut session = match (&cli.listen, &cli.connect) {
        (Some(addr), None) => Session::accept(&TcpListener::bind(addr)?)?,
        (None, Some(addr)) => Session::connect(addr.as_str(), Duration::from_secs(30))?,
        _ => return Err("give --listen ADDR (server) or --connect ADDR (client)".into()),
    };
    let peer = session.exchange(&mine)?;
    let qp = prepared.connect(&peer)?;
    println!(
        "{}: local QPN {:#x} PSN {:#x} VA {:#x} R_Key {:#x} | remote QPN {:#x} PSN {:#x} IP {}",
        dev.info().name,
        mine.qpn,
        mine.psn,
        mr.va,
        mr.rkey,
        peer.qpn,
        peer.psn,
        peer.ip
    );
    let remote = peer.mr.ok_or("the peer sent no memory region")?;
    for (i, &len) in cli.sizes.iter().enumerate() {
        let seed = i as u8;
        let n = len as usize;
        if cli.listen.is_some() {
            // Server: the client WRITEs into our first half.
            session.sync("ready")?;
            let said = session.sync("checking")?;
            let ok = mr.as_slice()[..n] == pattern(n, seed)[..];
            session.sync(if ok { "ok" } else { "bad" })?;
            if !ok {
                return Err(format!("WRITE of {len} B ({said}): bytes differ").into());
            }
            println!("server: WRITE of {len} B landed, bytes verified");
            continue;
        }
        mr.as_mut_slice()[..n].copy_from_slice(&pattern(n, seed));
        session.sync("ready")?;
        let t0 = Instant::now();
        qp.post_write(LocalBuf::of(&mr, 0, len), &remote, 0, 1, true)?;
        let c = poll_one(&cq, Duration::from_secs(30))?.ok_or("WRITE timed out")?;
        let write_us = t0.elapsed().as_secs_f64() * 1e6;
        if c.status != WcStatus::Success {
            return Err(format!("WRITE of {len} B completed with {:?}", c.status).into());
        }
        session.sync("written")?;
        if session.sync("check?")? != "ok" {
            return Err(format!("server saw wrong bytes after a WRITE of {len} B").into());
        }
        let t0 = Instant::now();
        qp.post_read(LocalBuf::of(&mr, max, len), &remote, 0, 2, true)?;
        let c = poll_one(&cq, Duration::from_secs(30))?.ok_or("READ timed out")?;
        let read_us = t0.elapsed().as_secs_f64() * 1e6;
        if c.status != WcStatus::Success {
            return Err(format!("READ of {len} B completed with {:?}", c.status).into());
        }
        let m = max as usize;
        if mr.as_slice()[m..m + n] != pattern(n, seed)[..] {
            return Err(format!("READ of {len} B: bytes differ").into());
        }
        println!(
            "client: {len} B WRITE {write_us:.1} us, READ {read_us:.1} us, bytes verified both ways"
        );
    }
    session.sync("bye")?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ping: {e}");
            ExitCode::FAILURE
        }
    }
}
