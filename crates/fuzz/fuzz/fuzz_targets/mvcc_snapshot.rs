#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| retcd_fuzz::mvcc_snapshot(data));
