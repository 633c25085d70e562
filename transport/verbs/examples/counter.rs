//! A shared counter over FETCH_ADD: a server holds an 8-byte counter in a
//! region with remote-atomic access; clients in other processes add to it
//! with FETCH_ADD, concurrently.
//!
//! Start the daemon, then the server and the clients (any order):
//!
//! ```text
//! dataplane --config configs/loopback.toml --serve &
//! cargo run -p verbs --example counter -- --device rnic1 --listen 127.0.0.1:18517 --clients 2 &
//! cargo run -p verbs --example counter -- --device rnic0 --connect 127.0.0.1:18517 &
//! cargo run -p verbs --example counter -- --device rnic0 --connect 127.0.0.1:18517
//! ```
//!
//! Each client checks that the values its adds returned strictly increase
//! (every add saw the others' whole); the server checks that the counter
//! ends at the number of adds all clients made.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use verbs::oob::Session;
use verbs::{poll_one, Device, LocalBuf, MrAccess, WcOpcode, WcStatus};

#[derive(Parser)]
#[command(about = "A counter shared by several processes over RDMA FETCH_ADD")]
struct Cli {
    /// The daemon's control socket.
    #[arg(long, default_value = "/tmp/rnic/loopback.sock")]
    socket: PathBuf,
    /// Device to open (rnic0 or rnic1 on the loopback testbed).
    #[arg(long)]
    device: String,
    /// Be the server: hold the counter, wait for the clients here.
    #[arg(long, conflicts_with = "connect")]
    listen: Option<String>,
    /// Clients the server waits for.
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// Be a client: add to the server's counter.
    #[arg(long)]
    connect: Option<String>,
    /// FETCH_ADDs each client makes.
    #[arg(long, default_value_t = 1000)]
    adds: u64,
}

fn server(cli: &Cli, addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_with(&cli.socket, &cli.device, 16 << 20)?;
    let pd = dev.alloc_pd()?;
    let access = MrAccess {
        local_write: true,
        remote_atomic: true,
        ..MrAccess::default()
    };
    let mr = pd.alloc_mr(8, access)?;
    let cq = dev.create_cq(64)?;
    let listener = TcpListener::bind(addr)?;
    let mut peers = Vec::new();
    for _ in 0..cli.clients {
        let prepared = pd.qp_builder(&cq).access(access).build()?;
        let mut mine = prepared.endpoint();
        mine.mr = Some(mr.remote());
        let mut session = Session::accept(&listener)?;
        let peer = session.exchange(&mine)?;
        peers.push((prepared.connect(&peer)?, session));
    }
    // Every client is connected: let them all add at once.
    for (_, session) in &mut peers {
        session.sync("go")?;
    }
    let mut total = 0u64;
    for (_, session) in &mut peers {
        total += session.sync("done?")?.parse::<u64>()?;
    }
    let value = u64::from_ne_bytes(mr.as_slice()[..8].try_into()?);
    if value != total {
        return Err(format!("the counter holds {value}, the clients made {total} adds").into());
    }
    println!(
        "server: counter = {value} after {total} FETCH_ADDs from {} clients",
        cli.clients
    );
    Ok(())
}

fn client(cli: &Cli, addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_with(&cli.socket, &cli.device, 16 << 20)?;
    let pd = dev.alloc_pd()?;
    let access = MrAccess {
        local_write: true,
        ..MrAccess::default()
    };
    let mr = pd.alloc_mr(8, access)?;
    let cq = dev.create_cq(64)?;
    let prepared = pd.qp_builder(&cq).access(access).build()?;
    let mine = prepared.endpoint();
    let mut session = Session::connect(addr, Duration::from_secs(30))?;
    let peer = session.exchange(&mine)?;
    let qp = prepared.connect(&peer)?;
    let counter = peer.mr.ok_or("the server sent no counter region")?;
    session.sync("ready")?;
    let t0 = Instant::now();
    let mut last = None;
    for i in 0..cli.adds {
        qp.post_fetch_add(LocalBuf::of(&mr, 0, 8), &counter, 0, 1, i)?;
        let c =
            poll_one(&cq, Duration::from_secs(30))?.ok_or("FETCH_ADD: no completion in 30 s")?;
        if c.status != WcStatus::Success || c.opcode != WcOpcode::FetchAdd {
            return Err(format!("FETCH_ADD {i}: {:?} {:?}", c.opcode, c.status).into());
        }
        let v = u64::from_ne_bytes(mr.as_slice()[..8].try_into()?);
        if last.is_some_and(|l| v <= l) {
            return Err(format!("FETCH_ADD {i} returned {v} after {last:?}").into());
        }
        last = Some(v);
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / cli.adds.max(1) as f64;
    session.sync(&cli.adds.to_string())?;
    println!(
        "client: {} FETCH_ADDs, {us:.1} us each, last returned {}",
        cli.adds,
        last.map_or("nothing".into(), |v| v.to_string())
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match (&cli.listen, &cli.connect) {
        (Some(a), None) => server(&cli, a),
        (None, Some(a)) => client(&cli, a),
        _ => Err("give --listen ADDR (server) or --connect ADDR (client)".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("counter: {e}");
            ExitCode::FAILURE
        }
    }
}
