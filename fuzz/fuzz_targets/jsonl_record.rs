//! The JSONL record reader: any bytes in as an input file, through the line reader (with a
//! small line bound, so the too-long path is reached) and the record parser. Never a panic;
//! every non-blank physical line comes out exactly once, in order.
#![no_main]

use forkscore_pipeline::batch::reader::read_lines_bounded;
use forkscore_pipeline::input_bounds::parse_bounded;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (tx, rx) = crossbeam_channel::unbounded();
    let lines = read_lines_bounded(data, 3, 1, 64, &tx).expect("reading a slice never fails");
    drop(tx);
    let mut last = 0u64;
    for raw in rx.iter().flatten() {
        assert!(raw.line > last && raw.line <= lines);
        last = raw.line;
        assert!(raw.bytes.len() <= 64);
        for shared in [false, true] {
            match parse_bounded(&raw, shared) {
                Ok(r) => assert_eq!(r.line, raw.line),
                Err(f) => assert_eq!(f.line, raw.line),
            }
        }
    }
});
