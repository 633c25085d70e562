//! SEND/RECV ping-pong between two processes on the loopback testbed.
//!
//! Start the daemon, then a server and a client (any order):
//!
//! ```text
//! dataplane --config configs/loopback.toml --serve &
//! cargo run -p verbs --example sendrecv -- --device rnic1 --listen 127.0.0.1:18516 &
//! cargo run -p verbs --example sendrecv -- --device rnic0 --connect 127.0.0.1:18516
//! ```
//!
//! Each side posts receive WQEs before the QPs connect. The client SENDs a
//! message carrying its round number as immediate data; the server checks
//! the bytes, the immediate and the length in its receive completion and
//! SENDs the message back; the client checks the reply. One line per size
//! with the round-trip time.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use verbs::oob::Session;
use verbs::{
    poll_one, Completion, Cq, Device, LocalBuf, Mr, MrAccess, Qp, RecvRequest, WcOpcode, WcStatus,
};

#[derive(Parser)]
#[command(about = "SEND/RECV ping-pong between two processes through the daemon")]
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
    /// Message sizes in bytes, one round each.
    #[arg(long, value_delimiter = ',', default_value = "0,1,64,1024,1025,65536")]
    sizes: Vec<u32>,
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|k| (k as u8).wrapping_mul(7) ^ seed).collect()
}

/// Waits for the next completion, which must be a success of `opcode`.
fn expect(cq: &Cq, opcode: WcOpcode, what: &str) -> Result<Completion, String> {
    let c = poll_one(cq, Duration::from_secs(30))
        .map_err(|e| e.to_string())?
        .ok_or(format!("{what}: no completion in 30 s"))?;
    if c.status != WcStatus::Success || c.opcode != opcode {
        return Err(format!("{what}: completed {:?} {:?}", c.opcode, c.status));
    }
    Ok(c)
}

/// The receive buffer of a round: the second half of the region.
fn recv_buf(mr: &Mr, max: u64) -> LocalBuf {
    LocalBuf::of(mr, max, max as u32)
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let max = u64::from(cli.sizes.iter().copied().max().unwrap_or(0).max(1));
    let dev = Device::open_with(&cli.socket, &cli.device, 2 * max + (16 << 20))?;
    let pd = dev.alloc_pd()?;
    let access = MrAccess {
        local_write: true,
        ..MrAccess::default()
    };
    let mut mr = pd.alloc_mr(2 * max, access)?;
    let cq = dev.create_cq(64)?;
    let prepared = pd.qp_builder(&cq).access(access).build()?;
    // A receive WQE is posted before the peer can send (and after each
    // message is consumed), so the peer never meets an RNR NAK.
    prepared
        .qp()
        .post_recv(&[RecvRequest::new(0, recv_buf(&mr, max))])?;
    let mine = prepared.endpoint();
    let mut session = match (&cli.listen, &cli.connect) {
        (Some(addr), None) => Session::accept(&TcpListener::bind(addr)?)?,
        (None, Some(addr)) => Session::connect(addr.as_str(), Duration::from_secs(30))?,
        _ => return Err("give --listen ADDR (server) or --connect ADDR (client)".into()),
    };
    let peer = session.exchange(&mine)?;
    let qp: Qp = prepared.connect(&peer)?;
    session.sync("connected")?;
    let server = cli.listen.is_some();
    for (round, &len) in cli.sizes.iter().enumerate() {
        let n = len as usize;
        let want = pattern(n, round as u8);
        let m = max as usize;
        if server {
            let c = expect(&cq, WcOpcode::Recv, "RECV")?;
            if c.imm != Some(round as u32) || c.byte_len != len {
                return Err(
                    format!("round {round}: RECV of {} B imm {:?}", c.byte_len, c.imm).into(),
                );
            }
            if mr.as_slice()[m..m + n] != want[..] {
                return Err(format!("round {round}: the {len} B message differs").into());
            }
            qp.post_recv(&[RecvRequest::new(round as u64 + 1, recv_buf(&mr, max))])?;
            mr.as_mut_slice().copy_within(m..m + n, 0);
            qp.post_send(LocalBuf::of(&mr, 0, len), None, round as u64, true)?;
            expect(&cq, WcOpcode::Send, "SEND")?;
            println!("server: round {round}: {len} B received with imm {round}, sent back");
        } else {
            mr.as_mut_slice()[..n].copy_from_slice(&want);
            let t0 = Instant::now();
            qp.post_send(
                LocalBuf::of(&mr, 0, len),
                Some(round as u32),
                round as u64,
                true,
            )?;
            // The SEND's completion and the reply's may come in any order.
            let mut got = [false; 2];
            while !(got[0] && got[1]) {
                let c = poll_one(&cq, Duration::from_secs(30))?.ok_or("no completion in 30 s")?;
                if c.status != WcStatus::Success {
                    return Err(format!("round {round}: {:?} {:?}", c.opcode, c.status).into());
                }
                got[usize::from(c.opcode == WcOpcode::Recv)] = true;
                if c.opcode == WcOpcode::Recv && (c.byte_len != len || c.imm.is_some()) {
                    return Err(format!("round {round}: reply of {} B", c.byte_len).into());
                }
            }
            let rtt = t0.elapsed().as_secs_f64() * 1e6;
            if mr.as_slice()[m..m + n] != want[..] {
                return Err(format!("round {round}: the {len} B reply differs").into());
            }
            qp.post_recv(&[RecvRequest::new(round as u64 + 1, recv_buf(&mr, max))])?;
            println!(
                "client: {len} B SEND/RECV round trip {rtt:.1} us, bytes and immediate verified"
            );
        }
    }
    session.sync("bye")?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sendrecv: {e}");
            ExitCode::FAILURE
        }
    }
}
