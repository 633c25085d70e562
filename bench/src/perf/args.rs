//! The flags of the perftest-style benchmarks (perftest's letters where
//! they apply).

use std::path::PathBuf;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    WriteLat,
    ReadLat,
    WriteBw,
    ReadBw,
}

impl Test {
    pub fn is_latency(self) -> bool {
        matches!(self, Test::WriteLat | Test::ReadLat)
    }

    pub fn is_read(self) -> bool {
        matches!(self, Test::ReadLat | Test::ReadBw)
    }

    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write-lat",
            Test::ReadLat => "read-lat",
            Test::WriteBw => "write-bw",
            Test::ReadBw => "read-bw",
        }
    }
}

/// Largest message of `-a` (perftest's 2 B .. 8 MiB).
pub const MAX_ALL: u32 = 8 << 20;

#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    /// The server's address (client mode); without it, be the server and
    /// wait for a client on the TCP port -p.
    pub server: Option<String>,
    /// Message size in bytes [default: 2 for latency, 65536 for bandwidth].
    #[arg(short = 's', long = "size")]
    pub size: Option<u32>,
    /// Iterations per size [default: 1000 for latency, 5000 for bandwidth].
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Every size from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Run each size for this many seconds instead of -n iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// QPs, posted to round robin.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Send queue depth: WRs outstanding at once (bandwidth tests; latency
    /// tests keep one).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    pub tx_depth: u32,
    /// READs outstanding at once per QP (max_rd_atomic).
    #[arg(short = 'o', long = "outs", default_value_t = 16)]
    pub outs: u8,
    /// TCP port of the endpoint exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Device to open [default: rnic0 for the client, rnic1 for the
    /// server].
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096, at most the
    /// port's) [default: the largest the port carries, as perftest takes
    /// the port's active MTU].
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Also write the results as JSON to this file.
    #[arg(long = "out_json")]
    pub out_json: Option<PathBuf>,
    /// Print the latency histogram (hdrhistogram percentiles) after each
    /// size.
    #[arg(short = 'H', long = "report-histogram")]
    pub histogram: bool,
    /// Run both sides in this process against the loopback testbed (rnic0
    /// is the client, rnic1 the server) on one thread that drives both, so
    /// that the daemon's dataplane lcore and this thread use the two cores
    /// of a small machine. Starts a daemon when none serves the socket.
    #[arg(long)]
    pub loopback: bool,
    /// The daemon's control socket.
    #[arg(long, default_value = "/tmp/rnic/loopback.sock")]
    pub socket: PathBuf,
    /// Configuration of the daemon --loopback starts.
    #[arg(long, default_value = "configs/loopback.toml")]
    pub config: PathBuf,
    /// The dataplane binary --loopback starts [default: next to this one].
    #[arg(long)]
    pub dataplane: Option<PathBuf>,
    /// Ask for a completion only every this many WRs of a QP (and for its
    /// last), as perftest's -Q [default: 100 for bandwidth tests (at most
    /// -t / -q); 1 (every WR) for latency tests, whose round trips never
    /// wait for a completion; -D bandwidth runs signal every WR]
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// Messages of up to this many bytes are posted inline (copied into
    /// the WQE, IBV_SEND_INLINE) [default: for write-lat perftest's 220,
    /// capped at the device's 128; 0 otherwise]
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Sleep on the CQ's completion events (its eventfd) while no WR can
    /// be posted, instead of polling the CQ, as perftest's -e; bandwidth
    /// tests only. Leaves the CPU to a daemon lcore that shares it.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Where the daemon's lcore and this thread run when --loopback starts
    /// the daemon itself: `auto` gives the daemon's lcore the last CPU of
    /// this process's set and this thread the first (a poll-mode core of
    /// its own, as DPDK applications run; with one CPU both float), `none`
    /// lets both float where the scheduler puts them.
    #[arg(long, value_enum, default_value_t = Pin::Auto)]
    pub pin: Pin,
    /// Interleave ours with the baselines (raw DPDK over the same backend,
    /// kernel UDP over loopback) for --rounds rounds at the (last) size and
    /// print the median, min and max of the per-round ratios. Needs
    /// --loopback.
    #[arg(long)]
    pub compare: bool,
    /// After the sizes, run the (last) size again with the daemon's
    /// latency trace on and print where the time goes, stage by stage
    /// (median and p99 over every trip). Latency tests, one-packet
    /// messages, --loopback.
    #[arg(long)]
    pub breakdown: bool,
    /// Rounds of --compare (at least 10).
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
}

/// Most QPs a test connects (-q).
pub const MAX_QPS: u32 = 16384;

/// CPU placement of `--loopback`'s own daemon and of the benchmark thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pin {
    Auto,
    None,
}

impl PerfArgs {
    /// Refuses flag combinations that cannot run, naming the bad value.
    pub fn validate(&self, test: Test) -> Result<(), String> {
        if self.qps == 0 || self.qps > MAX_QPS {
            return Err(format!("-q {}: QPs must be 1..={MAX_QPS}", self.qps));
        }
        if self.events && test.is_latency() {
            return Err(
                "-e: sleeping on completion events is for bandwidth tests (write-bw, read-bw)"
                    .into(),
            );
        }
        if self.cq_mod == Some(0) {
            return Err("-Q 0: a completion every 0 WRs; give 1 (every WR) or more".into());
        }
        let max_inline = transport::rc::MAX_INLINE_DATA as u32;
        if let Some(i) = self.inline_size.filter(|&i| i > max_inline) {
            return Err(format!(
                "-I {i}: the device carries at most {max_inline} inline bytes"
            ));
        }
        if self.tx_depth == 0 || self.tx_depth > 4096 {
            return Err(format!("-t {}: TX depth must be 1..=4096", self.tx_depth));
        }
        if self.outs == 0 {
            return Err("-o 0: at least one READ must be allowed outstanding".into());
        }
        if let Some(m) = self
            .mtu
            .filter(|m| ![256, 512, 1024, 2048, 4096].contains(m))
        {
            return Err(format!("-m {m}: MTU must be 256, 512, 1024, 2048 or 4096"));
        }
        if self.iters == Some(0) {
            return Err("-n 0: at least one iteration".into());
        }
        if let Some(d) = self.duration {
            if !(d > 0.0 && d <= 3600.0) {
                return Err(format!("-D {d}: duration must be in (0, 3600] seconds"));
            }
        }
        if let Some(s) = self.size {
            if s > MAX_ALL {
                return Err(format!("-s {s}: at most {MAX_ALL} bytes"));
            }
            if test == Test::WriteLat && s == 0 {
                return Err(
                    "-s 0: write-lat needs at least 1 byte (the peer polls the last byte)".into(),
                );
            }
        }
        if self.duration.is_some() && test == Test::WriteLat && !self.loopback {
            return Err("-D with write-lat needs --loopback (the server counts iterations)".into());
        }
        if self.compare && !self.loopback {
            return Err("--compare needs --loopback".into());
        }
        if self.breakdown && !(self.loopback && test.is_latency()) {
            return Err(
                "--breakdown traces write-lat and read-lat with --loopback (both ends here)".into(),
            );
        }
        if self.compare && self.rounds < 10 {
            return Err(format!("--rounds {}: at least 10", self.rounds));
        }
        if self.loopback && self.server.is_some() {
            return Err("--loopback runs both sides here: give no server address".into());
        }
        Ok(())
    }

    pub fn sizes(&self, test: Test) -> Vec<u32> {
        if self.all {
            (1..=23).map(|k| 1u32 << k).collect()
        } else {
            vec![self
                .size
                .unwrap_or(if test.is_latency() { 2 } else { 65536 })]
        }
    }

    /// WRs of a QP per completion in bandwidth tests: `-Q`, or perftest's
    /// default 100, at most the QP's share of the TX depth.
    pub fn cq_mod(&self, test: Test) -> u32 {
        if test.is_latency() {
            return self.cq_mod.unwrap_or(1);
        }
        // The TX depth bounds the WRs in flight over all QPs: each QP must
        // reach its signaled WR within its share of it.
        let share = (self.tx_depth / self.qps.max(1)).max(1);
        self.cq_mod.unwrap_or(100).clamp(1, share)
    }

    /// The largest message posted inline: `-I`, or perftest's default for
    /// the test (220 bytes for write-lat, none otherwise), at most what a
    /// WQE carries.
    pub fn inline_size(&self, test: Test) -> u32 {
        let max = transport::rc::MAX_INLINE_DATA as u32;
        self.inline_size
            .unwrap_or(if test == Test::WriteLat { 220 } else { 0 })
            .min(max)
    }

    pub fn iterations(&self, test: Test) -> u64 {
        self.iters
            .unwrap_or(if test.is_latency() { 1000 } else { 5000 })
    }

    /// Whether this process is the client (it measures).
    pub fn is_client(&self) -> bool {
        self.loopback || self.server.is_some()
    }
}
