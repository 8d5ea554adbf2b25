//! forkscore benchmark harness (see benches/benches/modes.rs).
