#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| retcd_fuzz::etcd_wal_segment(data));
