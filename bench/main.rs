fn main() {
    eprintln!("ferroccl-bench: not built yet");
    std::process::exit(1)
}
