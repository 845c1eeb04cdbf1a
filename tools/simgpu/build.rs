//! Gives the cdylib the SONAME of the real driver, so that `dlopen("libcuda.so.1", RTLD_NOLOAD)`
//! finds it even when a program loaded it under another name (libnvrtc.so, a full path).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
