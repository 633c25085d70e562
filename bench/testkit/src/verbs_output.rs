//! The failure words of unmodified verbs tools: rdma-core's examples
//! (`ibv_rc_pingpong`, `ibv_srq_pingpong`, ...), perftest, and our own
//! data checker (`rc_verify`). These tools can print a failure and still
//! exit 0: `ibv_rc_pingpong -c` and `ibv_srq_pingpong -c` check the first
//! byte of each page on the server only, print `invalid data in page N`
//! and return 0; so every place that runs them reads their output too.

/// Phrases that mark a line as a failure report.
const FAILURE_WORDS: [&str; 12] = [
    "invalid data",
    "mismatch",
    "Failed",
    "failed",
    "Couldn't",
    "Could not",
    "Completion with error",
    "Error",
    "error",
    "Unable to",
    "Invalid",
    "Aborted",
];

/// Lines with a failure word that the tools print as warnings while going
/// on (perftest falls back to P_Key index 0; rdma-core's pingpong goes on
/// without prefetching).
const WARNINGS: [&str; 2] = ["Unable to validata PKey Index", "Continue anyway"];

/// The lines of `output` that report a failure. A kernel log line
/// (`[   12.345678] ...`, from a VM's console) is not the tool's.
pub fn failures(output: &str) -> Vec<&str> {
    output
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !is_kernel_log(l))
        .filter(|l| FAILURE_WORDS.iter().any(|w| l.contains(w)))
        .filter(|l| !WARNINGS.iter().any(|w| l.contains(w)))
        .collect()
}

fn is_kernel_log(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with('[')
        && t[1..]
            .split_once(']')
            .is_some_and(|(stamp, _)| stamp.trim().parse::<f64>().is_ok())
}

/// Panics, naming `what` and quoting its failure lines, unless `output`
/// has none.
pub fn require_clean(what: &str, output: &str) {
    let bad = failures(output);
    assert!(
        bad.is_empty(),
        "{what} reported a failure (exit status aside): {bad:?}\n{output}"
    );
}

/// The QPN and first PSN an rdma-core example (`ibv_rc_pingpong`, ...)
/// printed as its `local address:`.
pub fn local_qp(output: &str) -> Option<(u32, u32)> {
    let line = output.lines().find(|l| l.contains("local address:"))?;
    let hex = |key: &str| {
        let v = line.split(key).nth(1)?.split(',').next()?.trim();
        u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    };
    Some((hex("QPN ")?, hex("PSN ")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's output of `ibv_rc_pingpong -c` whose data arrived
    /// corrupted: rdma-core prints this and exits 0.
    const CORRUPTED_PAGE: &str =
        "  local address:  LID 0x0000, QPN 0x000011, PSN 0x2a3b4c, GID ::ffff:10.0.0.2
  remote address: LID 0x0000, QPN 0x000012, PSN 0x5d6e7f, GID ::ffff:10.0.0.1
8192000 bytes in 0.01 seconds = 6553.60 Mbit/sec
1000 iters in 0.01 seconds = 10.00 usec/iter
invalid data in page 3
";

    #[test]
    fn a_pingpong_that_printed_invalid_data_is_a_failure() {
        assert_eq!(failures(CORRUPTED_PAGE), ["invalid data in page 3"]);
        let e = std::panic::catch_unwind(|| require_clean("ibv_rc_pingpong -c", CORRUPTED_PAGE))
            .unwrap_err();
        assert!(e
            .downcast_ref::<String>()
            .unwrap()
            .contains("invalid data in page 3"));
    }

    #[test]
    fn a_clean_run_has_no_failure_lines() {
        let ok = CORRUPTED_PAGE.replace("invalid data in page 3\n", "");
        assert!(failures(&ok).is_empty());
        require_clean("ibv_rc_pingpong -c", &ok);
        let perftest = " Requested mtu is higher than active mtu \n Changing to active mtu - 3\n Unable to validata PKey Index, changing to 0\n #bytes #iterations    t_min[usec]\n 2       1000          1.23\n";
        assert!(failures(perftest).is_empty());
    }

    #[test]
    fn the_tools_failure_reports_are_failures() {
        for line in [
            "Failed status transport retry counter exceeded (12) for wr_id 2",
            "parse WC failed 1",
            "Couldn't post send",
            " Completion with error at client",
            " Failed status 12: wr_id 0 syndrom 0x81",
            "Unable to init the socket connection",
            "rc_verify: mismatch at byte 17 of iteration 3 (READ): got 0x00, want 0x5a",
        ] {
            assert_eq!(failures(line), [line], "{line}");
        }
    }

    #[test]
    fn a_pingpong_s_local_qp_is_read_from_its_output() {
        assert_eq!(local_qp(CORRUPTED_PAGE), Some((0x11, 0x2a3b4c)));
        assert_eq!(local_qp("no address here"), None);
    }

    #[test]
    fn a_kernel_log_line_on_a_vm_console_is_not_the_tools() {
        assert!(failures("[   12.345678] virtio_net virtio0: error\r\n").is_empty());
        assert_eq!(failures("[x] Failed"), ["[x] Failed"]);
    }
}
