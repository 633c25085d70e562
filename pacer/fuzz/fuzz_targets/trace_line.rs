//! Fuzz the trace-line parser: no input may panic, and whatever parses must
//! print back to a line that parses to the same event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pacer::trace::parse_line;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Some(e)) = parse_line(line) {
        assert_eq!(parse_line(&e.to_string()), Ok(Some(e)));
    }
});
