#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| retcd_fuzz::gateway_json(data));
