//! Out-of-band endpoint exchange over TCP, as perftest does: the server
//! listens, the client connects, each sends its [`Endpoint`] as one line
//! of JSON and reads the other's. Used by the examples and the
//! benchmarks; any other channel works as well.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::device::Endpoint;

fn exchange(stream: TcpStream, mine: &Endpoint) -> std::io::Result<Endpoint> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = stream.try_clone()?;
    let mut line = serde_json::to_string(mine).expect("endpoints serialize");
    line.push('\n');
    w.write_all(line.as_bytes())?;
    let mut peer = String::new();
    BufReader::new(stream).read_line(&mut peer)?;
    serde_json::from_str(peer.trim()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("peer's endpoint {:?}: {e}", peer.trim()),
        )
    })
}

/// Waits for one client on `listener` and swaps endpoints with it.
pub fn serve(listener: &TcpListener, mine: &Endpoint) -> std::io::Result<Endpoint> {
    let (s, _) = listener.accept()?;
    exchange(s, mine)
}

/// Connects to a server (retrying for up to `wait` while it is not yet
/// listening) and swaps endpoints with it.
pub fn connect(
    addr: impl ToSocketAddrs,
    mine: &Endpoint,
    wait: Duration,
) -> std::io::Result<Endpoint> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match TcpStream::connect(&addr) {
            Ok(s) => return exchange(s, mine),
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::RemoteMr;

    #[test]
    fn both_sides_get_the_others_endpoint() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let a = Endpoint {
            qpn: 0x11,
            psn: 5,
            ip: "10.0.0.1".parse().unwrap(),
            mr: Some(RemoteMr {
                va: 1 << 40,
                rkey: 0x8000_0001,
                len: 4096,
            }),
        };
        let b = Endpoint {
            qpn: 0x12,
            psn: 9,
            ip: "10.0.0.2".parse().unwrap(),
            mr: None,
        };
        let t = std::thread::spawn(move || serve(&l, &a).unwrap());
        let got_a = connect(addr, &b, Duration::from_secs(5)).unwrap();
        assert_eq!(got_a, a);
        assert_eq!(t.join().unwrap(), b);
    }
}
