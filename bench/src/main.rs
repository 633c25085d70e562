//! `bench`: the project's command-line tools. See `bench --help`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use bench::decode::Summary;
use bench::pcap::{Reader, Writer};
use bench::perf::Test;
use bench::replay::{replay, ReplayArgs};
use bench::samples;
use bench::sim::{self as sim_mod, SimArgs};
use bench::torture::{self as torture_mod, TortureArgs};

#[derive(Parser)]
#[command(
    name = "bench",
    version,
    about = "Tools and benchmarks for the software RDMA NIC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode a classic pcap (Ethernet link type) and print one line per
    /// frame: op, qpn, psn, icrc and the RETH/AETH/telemetry fields, then a
    /// summary line `frames=N roce=N icrc_bad=N other=N errors=N`.
    Decode {
        /// The pcap file to read (pcapng is not supported: convert it with
        /// `editcap -F pcap`).
        file: PathBuf,
    },
    /// The codec demo: emit one frame of every opcode of wire.md (standard
    /// RoCEv2 and telemetry), plus a corrupted and a non-RoCE frame, write
    /// them to a pcap and decode it.
    Demo {
        /// Where to write the pcap.
        #[arg(long, default_value = "out/demo.pcap")]
        pcap: PathBuf,
    },
    /// Replay a telemetry trace through the sender-based HPCC++ controller
    /// and print, as CSV, U, W, Wc, rate and incStage after every event.
    HpccReplay(ReplayArgs),
    /// Two RC engines over a seeded faulty wire in virtual time: random
    /// WRITEs and READs, every byte verified. The last line is
    /// `ops=N ok=N failed=F dup_applied=D corrupted_accepted=C hung=H`; the
    /// exit code is 0 only when the run passed.
    Torture(TortureArgs),
    /// Run a network scenario in the virtual-time simulator (real RC engine
    /// and controllers, software INT switches) under one or every
    /// congestion controller, and print queue, utilization, fairness,
    /// drops and FCT slowdowns in one table.
    Sim(SimArgs),
    /// Draw FCT slowdown against flow size (the HPCC paper's Fig. 11a) from
    /// `bench sim --json` files: p95 and p50 per 5% count group, one line
    /// per controller and file, log-log, as SVG.
    FctPlot {
        /// `bench sim --json` files; each file's runs are labelled with
        /// the controller and the file's name.
        #[arg(required = true)]
        json: Vec<PathBuf>,
        /// Where to write the SVG.
        #[arg(long, default_value = "out/fct.svg")]
        out: PathBuf,
        /// Title of the figure.
        #[arg(long, default_value = "FCT slowdown by flow size")]
        title: String,
        /// A reference point to mark, LABEL:SIZE:SLOWDOWN (e.g. the
        /// paper's reading `paper-hpcc:3000:1.6`); repeat for more.
        #[arg(long)]
        mark: Vec<String>,
    },
    /// The interop run's verdict on one test and direction: both exit
    /// statuses, both outputs read for the tools' own failure words (a
    /// pingpong's `invalid data in page N` fails a run that exited 0), and
    /// the pingpong's end race on a lossy link accepted only with the lost
    /// ACK in our fault injector's record. Prints `ok`, `ok (why)` or
    /// `FAIL why`; exits 0 on a pass, 1 on a failure, 2 on bad input.
    Judge(bench::judge::JudgeArgs),
    /// RDMA WRITE latency (ping-pong, half the round trip) through the
    /// verbs API against a running daemon, like perftest's ib_write_lat.
    WriteLat(bench::perf::PerfArgs),
    /// RDMA READ latency (full round trip), like ib_read_lat.
    ReadLat(bench::perf::PerfArgs),
    /// RDMA WRITE bandwidth and message rate, like ib_write_bw.
    WriteBw(bench::perf::PerfArgs),
    /// RDMA READ bandwidth and message rate, like ib_read_bw.
    ReadBw(bench::perf::PerfArgs),
}

fn perf(test: Test, a: &bench::perf::PerfArgs) -> ExitCode {
    match bench::perf::run(test, a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench {}: {e}", test.name());
            ExitCode::FAILURE
        }
    }
}

fn decode(path: &Path) -> ExitCode {
    let mut reader = match Reader::open(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench decode: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut summary = Summary::default();
    let mut n = 0;
    while let Some(rec) = reader.next_record() {
        n += 1;
        match rec {
            Ok(rec) => println!("{}", summary.decode(n, &rec)),
            Err(e) => {
                println!("{summary}");
                eprintln!("bench decode: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{summary}");
    ExitCode::SUCCESS
}

fn demo(path: &Path) -> ExitCode {
    let mut frames: Vec<Vec<u8>> = samples::standard()
        .iter()
        .chain(samples::telemetry().iter())
        .map(|s| s.frame())
        .collect();
    // A corrupted copy of the first WRITE (its ICRC no longer matches) and a
    // DNS-port UDP frame, to show how decode reports them.
    let mut bad = frames[6].clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    frames.push(bad);
    let mut dns = frames[3].clone();
    dns[36..38].copy_from_slice(&53u16.to_be_bytes());
    frames.push(dns);

    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("bench demo: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let written = Writer::create(path).and_then(|mut w| {
        for (i, f) in frames.iter().enumerate() {
            w.write(Duration::from_micros(i as u64), f)?;
        }
        w.finish()
    });
    if let Err(e) = written {
        eprintln!("bench demo: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "bench demo: wrote {} frames to {} (every opcode of wire.md, one corrupted, one not RoCEv2)",
        frames.len(),
        path.display()
    );
    println!(
        "bench demo: decoding it with `bench decode {}`:",
        path.display()
    );
    let code = decode(path);
    println!(
        "bench demo: tshark reads the same file: tshark -r {} -V -d udp.port==4791,infiniband",
        path.display()
    );
    println!(
        "bench demo: with our telemetry dissector (./x wireshark installs it): tshark -X lua_script:wireshark/rnic.lua -r {} -V",
        path.display()
    );
    code
}

fn hpcc_replay(args: &ReplayArgs) -> ExitCode {
    let params = match args.params() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench hpcc-replay: {e}");
            return ExitCode::from(2);
        }
    };
    let input: Box<dyn std::io::BufRead> = if args.file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(&args.file) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("bench hpcc-replay: {}: {e}", args.file.display());
                return ExitCode::from(2);
            }
        }
    };
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    match replay(params, input, out, std::io::stderr().lock()) {
        Ok(s) if s.bad_lines > 0 => {
            eprintln!(
                "bench hpcc-replay: {} events replayed, {} bad lines skipped",
                s.events, s.bad_lines
            );
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench hpcc-replay: {}: {e}", args.file.display());
            ExitCode::from(2)
        }
    }
}

fn torture(args: &TortureArgs) -> ExitCode {
    println!(
        "torture: seed={} ops={} mix={} loss={} dup={} reorder={} corrupt={} max_msg={} mtu={} qps={} start_psn={} late_recv={} unsignaled={}",
        args.seed,
        args.ops,
        args.mix.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        args.loss,
        args.dup,
        args.reorder,
        args.corrupt,
        args.max_msg,
        args.mtu,
        args.qps,
        args.start_psn,
        args.late_recv,
        args.unsignaled
    );
    match torture_mod::run(args, |line| eprintln!("torture: {line}")) {
        Ok((r, s)) => {
            println!(
                "wire: frames={} lost={} duplicated={} reordered={} corrupted={} icrc_drops={} retransmitted={} timeouts={} virtual_ms={:.3}",
                s.frames, s.lost, s.duplicated, s.reordered, s.corrupted, s.icrc_drops,
                s.retransmitted, s.timeouts, s.virtual_ns as f64 / 1e6
            );
            if let Some(k) = args.kill_peer_after {
                println!(
                    "peer stopped answering after {k} operations: {} ended with RETRY_EXC_ERR, {} with WR_FLUSH_ERR, {} refused at post (QP in ERR), {} other failures",
                    s.retry_exc, s.flushed, s.refused, s.other_failures
                );
            }
            println!("{r}");
            if torture_mod::passed(args, &r, &s) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("bench torture: {e}");
            ExitCode::from(2)
        }
    }
}

fn sim(args: &SimArgs) -> ExitCode {
    let runs = match sim_mod::run(args, |line| eprintln!("sim: {line}")) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench sim: {e}");
            return ExitCode::from(2);
        }
    };
    let scenario = args
        .config
        .as_ref()
        .map_or(args.scenario.clone(), |p| p.display().to_string());
    println!("scenario={scenario} seed={}", args.seed);
    print!("{}", sim_mod::table(&runs));
    if args.fct_groups {
        print!("{}", sim_mod::group_table(&runs));
    }
    if args.port_stats {
        print!("{}", sim_mod::port_table(&runs));
    }
    if let Some(path) = &args.json {
        let results: Vec<_> = runs.iter().map(|r| &r.result).collect();
        let text = match serde_json::to_string_pretty(&results) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("bench sim: cannot encode JSON: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("bench sim: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        let results: Vec<_> = runs.iter().map(|r| &r.result).collect();
        if let Err(e) = std::fs::write(path, bench::plot::svg(&results)) {
            eprintln!("bench sim: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if let Some(v) = &args.trace_flow {
        for r in &runs {
            let file = if runs.len() > 1 {
                format!("{}.{}", v[1], r.result.cc)
            } else {
                v[1].clone()
            };
            let mut text = format!(
                "# flow {} of scenario {} under {}, seed {}: ack_seq snd_nxt nhop [hops]\n",
                v[0], scenario, r.result.cc, args.seed
            );
            for line in &r.trace {
                text.push_str(line);
                text.push('\n');
            }
            if let Err(e) = std::fs::write(&file, text) {
                eprintln!("bench sim: {file}: {e}");
                return ExitCode::FAILURE;
            }
            println!("wrote {} telemetry events to {file}", r.trace.len());
        }
    }
    ExitCode::SUCCESS
}

fn fct_plot(files: &[PathBuf], out: &Path, title: &str, marks: &[String]) -> ExitCode {
    let mut series = Vec::new();
    for f in files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("bench fct-plot: {}: {e}", f.display());
                return ExitCode::FAILURE;
            }
        };
        let name = f
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        match bench::fct_plot::series_of(&text, &format!(" ({name})")) {
            Ok(s) => series.extend(s),
            Err(e) => {
                eprintln!("bench fct-plot: {}: {e}", f.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let mut points = Vec::new();
    for m in marks {
        let parts: Vec<&str> = m.split(':').collect();
        let parsed = match parts.as_slice() {
            [l, s, v] => s
                .parse::<u64>()
                .ok()
                .zip(v.parse::<f64>().ok())
                .map(|(s, v)| (l.to_string(), s, v)),
            _ => None,
        };
        match parsed {
            Some(p) => points.push(p),
            None => {
                eprintln!("bench fct-plot: --mark {m:?}: expected LABEL:SIZE:SLOWDOWN, e.g. paper-hpcc:3000:1.6");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("bench fct-plot: {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = std::fs::write(out, bench::fct_plot::svg(title, &series, &points)) {
        eprintln!("bench fct-plot: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {} ({} lines)", out.display(), series.len());
    ExitCode::SUCCESS
}

fn judge(args: &bench::judge::JudgeArgs) -> ExitCode {
    match args.load() {
        Ok(run) => {
            let v = run.judge();
            println!("{v}");
            match v {
                bench::judge::Verdict::Fail(_) => ExitCode::FAILURE,
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("bench judge: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Decode { file } => decode(&file),
        Command::Demo { pcap } => demo(&pcap),
        Command::HpccReplay(args) => hpcc_replay(&args),
        Command::Torture(args) => torture(&args),
        Command::Judge(args) => judge(&args),
        Command::Sim(args) => sim(&args),
        Command::FctPlot {
            json,
            out,
            title,
            mark,
        } => fct_plot(&json, &out, &title, &mark),
        Command::WriteLat(a) => perf(Test::WriteLat, &a),
        Command::ReadLat(a) => perf(Test::ReadLat, &a),
        Command::WriteBw(a) => perf(Test::WriteBw, &a),
        Command::ReadBw(a) => perf(Test::ReadBw, &a),
    }
}
