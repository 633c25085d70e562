//! Out-of-band exchange over TCP, as perftest does: the server listens,
//! the client connects, each sends its [`Endpoint`] as one line of JSON
//! and reads the other's; afterwards both sides can trade short lines
//! ([`Session::sync`]) as barriers ("written", "verified", ...). Used by the
//! examples and the benchmarks; any other channel works as well.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::device::Endpoint;

/// A connection to the peer.
pub struct Session {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Session {
    fn new(stream: TcpStream) -> std::io::Result<Session> {
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        stream.set_nodelay(true)?;
        Ok(Session {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// Waits for one client on `listener`.
    pub fn accept(listener: &TcpListener) -> std::io::Result<Session> {
        Session::new(listener.accept()?.0)
    }

    /// Connects to a server, retrying for up to `wait` while it is not
    /// yet listening.
    pub fn connect(addr: impl ToSocketAddrs, wait: Duration) -> std::io::Result<Session> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match TcpStream::connect(&addr) {
                Ok(s) => return Session::new(s),
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `line` and returns the peer's line (both sides call it).
    pub fn sync(&mut self, line: &str) -> std::io::Result<String> {
        if line.contains('\n') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a sync line cannot contain a newline",
            ));
        }
        self.writer.write_all(format!("{line}\n").as_bytes())?;
        let mut peer = String::new();
        if self.reader.read_line(&mut peer)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer closed the exchange",
            ));
        }
        Ok(peer.trim_end().to_string())
    }

    /// Swaps endpoints with the peer.
    pub fn exchange(&mut self, mine: &Endpoint) -> std::io::Result<Endpoint> {
        let peer = self.sync(&serde_json::to_string(mine).expect("endpoints serialize"))?;
        serde_json::from_str(&peer).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("peer's endpoint {peer:?}: {e}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::RemoteMr;

    #[test]
    fn both_sides_get_the_others_endpoint_then_sync() {
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
        let t = std::thread::spawn(move || {
            let mut s = Session::accept(&l).unwrap();
            let got = s.exchange(&a).unwrap();
            assert_eq!(s.sync("server").unwrap(), "client");
            got
        });
        let mut s = Session::connect(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(s.exchange(&b).unwrap(), a);
        assert_eq!(s.sync("client").unwrap(), "server");
        assert_eq!(t.join().unwrap(), b);
        assert!(s.sync("two\nlines").is_err());
    }
}
