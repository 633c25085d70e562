//! Classic pcap files (Ethernet link type) in and out, through the
//! `pcap-file` crate, with errors that name the file and what is wrong:
//! the dataplane's tap writes them, `bench decode` reads them.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter, RawPcapPacket};
use pcap_file::{DataLink, Endianness, TsResolution};

/// Why a pcap file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PcapFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: pcapng is not supported; convert it with `editcap -F pcap IN OUT`")]
    PcapNg(PathBuf),
    #[error("{path}: not a pcap file ({why})")]
    NotPcap { path: PathBuf, why: String },
    #[error("{path}: link type {link:?} is not Ethernet")]
    NotEthernet { path: PathBuf, link: DataLink },
    #[error("{path}: record {record} is unreadable ({why}); the file is truncated or corrupt")]
    BadRecord {
        path: PathBuf,
        record: u64,
        why: String,
    },
    #[error("{path}: cannot write: {why}")]
    Write { path: PathBuf, why: String },
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub timestamp: Duration,
    /// Length of the frame on the wire (may exceed `data.len()` when the
    /// capture was cut at the snap length).
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Reads an Ethernet pcap record by record.
pub struct Reader {
    path: PathBuf,
    inner: PcapReader<File>,
    next: u64,
}

impl Reader {
    /// Opens `path` and checks its header.
    pub fn open(path: &Path) -> Result<Self, PcapFileError> {
        let io = |source| PcapFileError::Io {
            path: path.to_owned(),
            source,
        };
        let mut magic = [0u8; 4];
        let mut f = File::open(path).map_err(io)?;
        let n = f.read(&mut magic).map_err(io)?;
        if n == 4 && magic == [0x0a, 0x0d, 0x0d, 0x0a] {
            return Err(PcapFileError::PcapNg(path.to_owned()));
        }
        let f = File::open(path).map_err(io)?;
        let inner = PcapReader::new(f).map_err(|e| PcapFileError::NotPcap {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        let link = inner.header().datalink;
        if link != DataLink::ETHERNET {
            return Err(PcapFileError::NotEthernet {
                path: path.to_owned(),
                link,
            });
        }
        Ok(Reader {
            path: path.to_owned(),
            inner,
            next: 1,
        })
    }

    /// The next record, `None` at the end of the file.
    pub fn next_record(&mut self) -> Option<Result<Record, PcapFileError>> {
        let nanos = self.inner.header().ts_resolution == TsResolution::NanoSecond;
        let r = self.inner.next_raw_packet()?;
        let record = self.next;
        self.next += 1;
        Some(
            r.map(|raw: RawPcapPacket| Record {
                timestamp: Duration::from_secs(u64::from(raw.ts_sec))
                    + if nanos {
                        Duration::from_nanos(u64::from(raw.ts_frac))
                    } else {
                        Duration::from_micros(u64::from(raw.ts_frac))
                    },
                orig_len: raw.orig_len,
                data: raw.data.into_owned(),
            })
            .map_err(|e| PcapFileError::BadRecord {
                path: self.path.clone(),
                record,
                why: e.to_string(),
            }),
        )
    }
}

/// Writes frames to a classic pcap file (Ethernet, nanosecond timestamps,
/// little-endian).
pub struct Writer {
    path: PathBuf,
    inner: PcapWriter<BufWriter<File>>,
}

impl Writer {
    /// A buffered writer (the frames reach the file in blocks, and all of
    /// them at [`Writer::finish`]).
    pub fn create(path: &Path) -> Result<Self, PcapFileError> {
        Self::open(path, true)
    }

    /// An unbuffered writer: every frame is in the file when `write`
    /// returns (two system calls per frame).
    pub fn create_direct(path: &Path) -> Result<Self, PcapFileError> {
        Self::open(path, false)
    }

    fn open(path: &Path, buffered: bool) -> Result<Self, PcapFileError> {
        let f = File::create(path).map_err(|source| PcapFileError::Io {
            path: path.to_owned(),
            source,
        })?;
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            snaplen: 65535,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        // A buffer of no bytes passes every write straight to the file.
        let sink = BufWriter::with_capacity(if buffered { 8192 } else { 0 }, f);
        let inner = PcapWriter::with_header(sink, header).map_err(|e| PcapFileError::Write {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        Ok(Writer {
            path: path.to_owned(),
            inner,
        })
    }

    pub fn write(&mut self, timestamp: Duration, frame: &[u8]) -> Result<(), PcapFileError> {
        let p = PcapPacket::new(timestamp, frame.len() as u32, frame);
        self.inner
            .write_packet(&p)
            .map(|_| ())
            .map_err(|e| PcapFileError::Write {
                path: self.path.clone(),
                why: e.to_string(),
            })
    }

    /// Flushes and closes the file.
    pub fn finish(self) -> Result<(), PcapFileError> {
        let path = self.path;
        self.inner
            .into_writer()
            .flush()
            .map_err(|source| PcapFileError::Io { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.pcap");
        let mut w = Writer::create(&path).unwrap();
        w.write(Duration::from_nanos(1_500), &[1, 2, 3]).unwrap();
        w.write(Duration::from_secs(2), &[4; 70]).unwrap();
        w.finish().unwrap();
        let mut r = Reader::open(&path).unwrap();
        let a = r.next_record().unwrap().unwrap();
        assert_eq!(
            (a.timestamp, a.orig_len, &a.data[..]),
            (Duration::from_nanos(1_500), 3, &[1u8, 2, 3][..])
        );
        let b = r.next_record().unwrap().unwrap();
        assert_eq!(b.data, vec![4; 70]);
        assert!(r.next_record().is_none());
    }

    #[test]
    fn a_direct_writer_s_frames_are_readable_before_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.pcap");
        let mut w = Writer::create_direct(&path).unwrap();
        w.write(Duration::from_nanos(7), &[9; 60]).unwrap();
        let mut r = Reader::open(&path).unwrap();
        assert_eq!(r.next_record().unwrap().unwrap().data, vec![9; 60]);
        assert!(r.next_record().is_none());
        w.finish().unwrap();
    }

    #[test]
    fn refuses_other_formats_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pcapng");
        std::fs::write(&path, [0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0]).unwrap();
        assert!(matches!(Reader::open(&path), Err(PcapFileError::PcapNg(_))));
        std::fs::write(&path, b"hello, this is not a pcap file").unwrap();
        let e = Reader::open(&path).err().unwrap();
        assert!(e.to_string().contains("not a pcap file"), "{e}");
        let e = Reader::open(&dir.path().join("missing.pcap"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("missing.pcap"), "{e}");
    }

    #[test]
    fn a_truncated_record_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.pcap");
        let mut w = Writer::create(&path).unwrap();
        w.write(Duration::ZERO, &[9; 100]).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let mut r = Reader::open(&path).unwrap();
        let e = r.next_record().unwrap().unwrap_err();
        assert!(e.to_string().contains("record 1"), "{e}");
    }
}
