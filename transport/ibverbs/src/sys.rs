//! The structs, enums and constants of the system's `<infiniband/verbs.h>`
//! (bindgen; layout tests check them against the header).
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    // bindgen's output: its unsafe blocks are the FFI layouts' own.
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
