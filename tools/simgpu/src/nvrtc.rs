//! The simulated NVRTC: compiling a program checks that its kernels are `extern "C"` and
//! builds it with the host's C++ compiler against the simulator's CUDA prelude (`jit`); the
//! "PTX" it hands out names the compiled object and each kernel's parameters.

use crate::jit;
use crate::module::OBJECT_LINE;
use std::collections::HashMap;
use std::ffi::CString;

pub const DEFAULT_NAME: &str = "default_program";

/// Architectures `nvrtcGetSupportedArchs` reports (CUDA 13.0).
pub const ARCHS: [i32; 11] = [75, 80, 86, 87, 88, 89, 90, 100, 103, 120, 121];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    InvalidInput,
    InvalidOption,
    Compilation,
    NoNameExpressionsAfterCompilation,
    NoLoweredNamesBeforeCompilation,
    NameExpressionNotValid,
}

#[derive(Default)]
pub struct Program {
    pub src: String,
    pub name: String,
    pub ptx: Option<CString>,
    /// Whether the last compilation was for a real architecture (`sm_*`): only then
    /// does NVRTC have a CUBIN (its size is 0 for a virtual `compute_*` one).
    pub real_arch: bool,
    pub log: CString,
    pub exprs: Vec<String>,
    pub lowered: HashMap<String, CString>,
}

/// A kernel declaration found in the source.
#[derive(Debug, PartialEq, Eq)]
pub struct Decl {
    pub name: String,
    pub line: usize,
    pub extern_c: bool,
    pub void: bool,
}

/// The source with comments blanked out (newlines kept, so offsets and lines stay).
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                out.extend_from_slice(b"  ");
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
                let n = 2.min(b.len() - i);
                out.extend(std::iter::repeat_n(b' ', n));
                i += n;
            }
            q @ (b'"' | b'\'') => {
                out.push(q);
                i += 1;
                while i < b.len() && b[i] != q && b[i] != b'\n' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b[i]);
                        i += 1;
                    }
                    out.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    out.push(b[i]);
                    i += 1;
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Positions of the identifier `word` (whole words only).
fn find_word(s: &str, word: &str) -> Vec<usize> {
    let b = s.as_bytes();
    s.match_indices(word)
        .map(|(i, _)| i)
        .filter(|&i| (i == 0 || !is_ident(b[i - 1])) && b.get(i + word.len()).is_none_or(|&c| !is_ident(c)))
        .collect()
}

/// Byte ranges of `extern "C" { ... }` blocks.
fn extern_c_blocks(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    for i in find_word(s, "extern") {
        let rest = s[i + 6..].trim_start();
        let Some(rest) = rest.strip_prefix("\"C\"") else { continue };
        let rest_trim = rest.trim_start();
        if !rest_trim.starts_with('{') {
            continue;
        }
        let open = s.len() - rest_trim.len();
        let mut depth = 0usize;
        for (j, &c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, j));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every `__global__` function declared in `src`.
pub fn kernel_decls(src: &str) -> Vec<Decl> {
    let s = strip_comments(src);
    let b = s.as_bytes();
    let blocks = extern_c_blocks(&s);
    let mut out = Vec::new();
    for at in find_word(&s, "__global__") {
        // The declaration's prefix: back to the previous statement or block boundary.
        let start = s[..at].rfind([';', '}', '{', '#']).map_or(0, |p| p + 1);
        let prefix = &s[start..at];
        let extern_c = prefix.contains("extern \"C\"") || blocks.iter().any(|&(o, c)| at > o && at < c);
        // After it: [void] [__launch_bounds__(...)] NAME (
        let mut rest = &s[at + "__global__".len()..];
        let mut void = prefix.split_whitespace().any(|w| w == "void");
        let mut name = String::new();
        loop {
            rest = rest.trim_start();
            let len = rest.bytes().take_while(|&c| is_ident(c)).count();
            if len == 0 {
                break;
            }
            let word = &rest[..len];
            rest = &rest[len..];
            if word == "__launch_bounds__" {
                let close = rest.find(')').map_or(rest.len(), |p| p + 1);
                rest = &rest[close..];
                continue;
            }
            if rest.trim_start().starts_with('(') {
                name = word.to_string();
                break;
            }
            void |= word == "void";
        }
        let line = b[..at].iter().filter(|&&c| c == b'\n').count() + 1;
        if !name.is_empty() {
            out.push(Decl { name, line, extern_c, void });
        }
    }
    out
}

/// Checks the options as NVRTC parses them: each starts with `-`; the architecture option
/// needs `=VALUE` (any value is accepted).
pub fn check_options(opts: &[String]) -> Result<(), String> {
    for o in opts {
        if !o.starts_with('-') || o.len() < 2 {
            return Err(format!("invalid option {o:?}"));
        }
        let key = o.split('=').next().unwrap_or("");
        if matches!(key, "-arch" | "--gpu-architecture") && o.split_once('=').is_none_or(|(_, v)| v.is_empty()) {
            return Err(format!("option {o:?} needs a value: {key}=<arch>"));
        }
    }
    Ok(())
}

/// The architecture the options ask for (the last one given), NVRTC's default
/// (`compute_75`, virtual) when none is.
pub fn arch_of(opts: &[String]) -> &str {
    opts.iter()
        .rev()
        .find_map(|o| o.strip_prefix("--gpu-architecture=").or_else(|| o.strip_prefix("-arch=")))
        .unwrap_or("compute_75")
}

/// Preprocessor options NVRTC takes, as the host compiler's (`-DX=1`, `-UX`, `-Idir`);
/// the others (architecture, precision, ...) do not apply to the host compiler.
fn host_options(opts: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for o in opts {
        for (long, short) in [("--define-macro=", "-D"), ("--undefine-macro=", "-U"), ("--include-path=", "-I")] {
            if let Some(v) = o.strip_prefix(long).or_else(|| o.strip_prefix(short)) {
                out.push(format!("{short}{v}"));
            }
        }
    }
    out
}

/// The PTX-like text for the kernels of `object`.
fn ptx(program: &str, object: &std::path::Path, kernels: &[jit::Entry]) -> String {
    let mut s = format!(
        "//\n// Generated by the simulated NVRTC of ferroccl (tools/simgpu, docs/sim-gpu.md).\n\
         // Not real PTX: only the simulated driver executes it, through the object below.\n// Program: {program}\n\
         {OBJECT_LINE}{}\n//\n\n.version 8.0\n.target sm_90\n.address_size 64\n",
        object.display()
    );
    for k in kernels {
        let n = &k.name;
        s.push_str(&format!("\n\t// .globl\t{n}\n.visible .entry {n}(\n"));
        for (i, p) in k.params.iter().enumerate() {
            let sep = if i + 1 < k.params.len() { "," } else { "" };
            let decl = match p.size {
                4 => format!("\t.param .u32 {n}_param_{i}{sep}\n"),
                8 => format!("\t.param .u64 {n}_param_{i}{sep}\n"),
                sz => format!("\t.param .align {} .b8 {n}_param_{i}[{sz}]{sep}\n", p.align),
            };
            s.push_str(&decl);
        }
        s.push_str(")\n{\n\tret;\n}\n");
    }
    s
}

impl Program {
    /// `nvrtcCompileProgram`.
    pub fn compile(&mut self, opts: &[String]) -> Result<(), Fail> {
        if let Err(m) = check_options(opts) {
            self.log = CString::new(format!("nvrtc: error: {m}\n")).unwrap_or_default();
            return Err(Fail::InvalidOption);
        }
        let decls = kernel_decls(&self.src);
        let mut errors = Vec::new();
        for d in &decls {
            let at = format!("{}({}): error:", self.name, d.line);
            if !d.void {
                errors.push(format!("{at} a __global__ function must have a void return type"));
            } else if !d.extern_c {
                errors.push(format!(
                    "{at} kernel \"{}\" is not extern \"C\": the simulated NVRTC (ferroccl simgpu) runs \
                     extern \"C\" kernels only (docs/sim-gpu.md)",
                    d.name
                ));
            }
        }
        let names: Vec<String> = decls.iter().map(|d| d.name.clone()).collect();
        let mut lowered = HashMap::new();
        for e in &self.exprs {
            let n = e.trim().trim_start_matches('&').trim();
            if names.iter().any(|k| k == n) {
                lowered.insert(e.clone(), CString::new(n).unwrap_or_default());
            } else {
                errors.push(format!("{}: error: name expression {e:?} does not name a kernel", self.name));
            }
        }
        let fail = |p: &mut Program, log: String| {
            p.log = CString::new(log.replace('\0', " ")).unwrap_or_default();
            p.ptx = None;
            Err(Fail::Compilation)
        };
        if !errors.is_empty() {
            let log = format!(
                "{}\n{} errors detected in the compilation of \"{}\".\n",
                errors.join("\n"),
                errors.len(),
                self.name
            );
            return fail(self, log);
        }
        let compiled = match jit::compile(&self.src, &self.name, &names, &host_options(opts)) {
            Ok(c) => c,
            Err(log) => return fail(self, log),
        };
        let mut kernels = Vec::new();
        for n in &names {
            match compiled.object.entry(n) {
                Some(e) => kernels.push(e),
                None => {
                    return fail(self, format!("{}: error: kernel \"{n}\" is not in the compiled object\n", self.name))
                }
            }
        }
        self.lowered = lowered;
        self.real_arch = arch_of(opts).starts_with("sm_");
        self.log = CString::new(compiled.log.replace('\0', " ")).unwrap_or_default();
        self.ptx = Some(CString::new(ptx(&self.name, &compiled.object.path, &kernels)).unwrap_or_default());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_found_with_their_linkage() {
        let src = r#"
typedef float T;
// extern "C" __global__ void commented_out(int x) {}
extern "C" __global__ void fccl_reduce_f32_sum(T* out, struct Ins ins, int n, unsigned long long count) {}
__global__ void mangled(int) {}
extern "C" {
  __global__ void __launch_bounds__(256) in_block(int) {}
}
extern "C" __global__ int not_void() { return 0; }
"#;
        let d = kernel_decls(src);
        let names: Vec<(&str, bool, bool)> = d.iter().map(|d| (d.name.as_str(), d.extern_c, d.void)).collect();
        assert_eq!(
            names,
            vec![
                ("fccl_reduce_f32_sum", true, true),
                ("mangled", false, true),
                ("in_block", true, true),
                ("not_void", true, false)
            ]
        );
        assert_eq!(d[0].line, 4);
    }

    #[test]
    fn compile_accepts_known_kernels_only() {
        let mut p = Program {
            src: "extern \"C\" __global__ void fccl_reduce_i8_max(char* o) {}".into(),
            name: "a.cu".into(),
            ..Default::default()
        };
        p.exprs.push("&fccl_reduce_i8_max".into());
        assert_eq!(p.compile(&["--gpu-architecture=compute_90".into()]), Ok(()));
        let ptx = p.ptx.as_ref().unwrap().to_str().unwrap().to_string();
        assert!(ptx.contains(".visible .entry fccl_reduce_i8_max(") && ptx.contains(".target sm_90"), "{ptx}");
        assert_eq!(p.lowered["&fccl_reduce_i8_max"].to_str().unwrap(), "fccl_reduce_i8_max");
        // As NVRTC: a CUBIN only for a real architecture (the last one given).
        assert!(!p.real_arch);
        assert_eq!(p.compile(&["-arch=compute_90".into(), "--gpu-architecture=sm_90".into()]), Ok(()));
        assert!(p.real_arch);
        assert_eq!(p.compile(&[]), Ok(()));
        assert!(!p.real_arch, "NVRTC's default architecture is virtual");
        assert_eq!(p.compile(&["-arch".into()]), Err(Fail::InvalidOption));
        assert_eq!(p.compile(&["arch=sm_90".into()]), Err(Fail::InvalidOption));
        assert_eq!(p.compile(&["-arch=sm_999".into(), "-default-device".into()]), Ok(()));
        let mut q = Program { src: "__global__ void my_kernel() {}".into(), name: "b.cu".into(), ..Default::default() };
        assert_eq!(q.compile(&[]), Err(Fail::Compilation));
        let log = q.log.to_str().unwrap();
        assert!(log.contains("my_kernel") && log.contains("docs/sim-gpu.md") && log.contains("b.cu(1)"), "{log}");
        // The source is compiled: an error is the compiler's, at the program's own line.
        q.src = "extern \"C\" __global__ void my_kernel(int* p) {\n  *p = undeclared;\n}".into();
        assert_eq!(q.compile(&[]), Err(Fail::Compilation));
        let log = q.log.to_str().unwrap();
        assert!(log.contains("b.cu:2") && log.contains("undeclared"), "{log}");
        q.src = "extern \"C\" __global__ void my_kernel(int* p) { __shared__ int s[4]; s[0] = 1; }".into();
        assert_eq!(q.compile(&[]), Err(Fail::Compilation));
        assert!(q.log.to_str().unwrap().contains("__shared__ memory is not supported"), "{:?}", q.log);
        q.src = "extern \"C\" __global__ void my_kernel(int* p) { *p = X; }".into();
        assert_eq!(q.compile(&["-DX=3".into(), "--gpu-architecture=compute_90".into()]), Ok(()));
        assert_eq!(
            host_options(&["-DA".into(), "--define-macro=B=2".into(), "-default-device".into(), "-Ifoo".into()]),
            ["-DA", "-DB=2", "-Ifoo"]
        );
    }
}
