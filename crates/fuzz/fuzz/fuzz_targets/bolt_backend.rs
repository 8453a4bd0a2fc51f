#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| retcd_fuzz::bolt_backend(data));
