//! Kernels from CUDA C source: the simulated NVRTC compiles a program with the host's C++
//! compiler, against a prelude that gives it CUDA's built-ins ([`PRELUDE`]), into a shared
//! object; the simulated driver loads that object and runs a launch's every block and
//! thread on the executor thread ([`run`]). Objects are cached per source, in the process and
//! on disk (FERROCCL_SIM_KERNEL_CACHE), so each source is compiled once.

pub mod run;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// What kernel sources may use besides C++17 (docs/sim-gpu.md).
pub const PRELUDE: &str = include_str!("prelude.h");

/// Most parameters a kernel may have.
const MAX_PARAMS: usize = 256;

/// One kernel parameter, as the host compiler lays it out (the same as NVRTC for the
/// scalar, pointer and plain struct types kernels take).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub size: usize,
    pub align: usize,
    /// A pointer: checked to be device-accessible when the kernel runs.
    pub pointer: bool,
}

/// `int fccl_sim_run_<name>(void* const* params, const unsigned* dims, void** jmp)`: runs
/// every thread; 1 when a fault ended it (see [`run`]).
pub type RunFn = unsafe extern "C" fn(*const *mut c_void, *const u32, *mut *mut c_void) -> c_int;
type MetaFn = unsafe extern "C" fn(*mut u64, *mut u64, *mut c_int, c_int) -> c_int;

/// A kernel of a loaded object.
pub struct Entry {
    pub name: String,
    pub params: Vec<Param>,
    pub run: RunFn,
    /// Keeps the object loaded.
    pub object: Arc<Object>,
}

/// A compiled program, loaded (never unloaded: its functions may still be queued).
pub struct Object {
    pub path: PathBuf,
    handle: usize,
}

extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let e = unsafe { dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Object {
    fn sym(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: a handle from dlopen that is never closed; a NUL-terminated name.
        let p = unsafe { dlsym(self.handle as *mut c_void, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The kernel `name`, if the object has it.
    pub fn entry(self: &Arc<Object>, name: &str) -> Option<Entry> {
        let meta = self.sym(&format!("fccl_sim_meta_{name}"))?;
        let run = self.sym(&format!("fccl_sim_run_{name}"))?;
        // SAFETY: the symbols were generated with these signatures (runner_source).
        let (meta, run) = unsafe {
            (std::mem::transmute::<*mut c_void, MetaFn>(meta), std::mem::transmute::<*mut c_void, RunFn>(run))
        };
        let (mut sizes, mut aligns, mut ptrs) = (vec![0u64; MAX_PARAMS], vec![0u64; MAX_PARAMS], vec![0; MAX_PARAMS]);
        // SAFETY: arrays of MAX_PARAMS entries, as the function is told.
        let n = unsafe { meta(sizes.as_mut_ptr(), aligns.as_mut_ptr(), ptrs.as_mut_ptr(), MAX_PARAMS as c_int) };
        let n = usize::try_from(n).ok().filter(|&n| n <= MAX_PARAMS)?;
        let params = (0..n)
            .map(|i| Param { size: sizes[i] as usize, align: (aligns[i] as usize).max(1), pointer: ptrs[i] != 0 })
            .collect();
        Some(Entry { name: name.to_string(), params, run, object: self.clone() })
    }
}

/// Loaded objects by path.
fn loaded() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Arc<Object>>> {
    static L: OnceLock<Mutex<HashMap<PathBuf, Arc<Object>>>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(PoisonError::into_inner)
}

/// The object at `path`, loaded once per process.
pub fn load(path: &Path) -> Result<Arc<Object>, String> {
    let mut l = loaded();
    if let Some(o) = l.get(path) {
        return Ok(o.clone());
    }
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "a NUL in the path".to_string())?;
    // SAFETY: a NUL-terminated path; the object's initialisers are the compiler's own.
    let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
    if h.is_null() {
        return Err(format!("cannot load {}: {}", path.display(), dl_error()));
    }
    let o = Arc::new(Object { path: path.to_path_buf(), handle: h as usize });
    l.insert(path.to_path_buf(), o.clone());
    Ok(o)
}

/// The directory compiled objects are kept in: FERROCCL_SIM_KERNEL_CACHE (scripts/sim-gpu.sh
/// sets `target/simgpu/kernels`), else one in the temporary directory.
fn cache_dir() -> PathBuf {
    match std::env::var_os("FERROCCL_SIM_KERNEL_CACHE") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        // SAFETY: getuid has no preconditions.
        _ => std::env::temp_dir().join(format!("ferroccl-simgpu-kernels-{}", unsafe { libc::getuid() })),
    }
}

/// The host C++ compiler: FERROCCL_SIM_CXX, else `c++`.
fn compiler() -> String {
    std::env::var("FERROCCL_SIM_CXX").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "c++".into())
}

/// Flags for the host compiler: C++17 as NVRTC's default dialect, IEEE float arithmetic
/// without contraction (as the library asks of NVRTC), no symbol but the runners exported,
/// and two mappings per object (not five): a program's /proc/self/maps grows little with
/// the modules it loads, as with a real driver.
const CXXFLAGS: &[&str] = &[
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-shared",
    "-Wl,-z,noseparate-code",
    "-Wl,-z,norelro",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fvisibility=hidden",
    "-x",
    "c++",
];

/// 64-bit FNV-1a, for cache keys (stable across processes and builds).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// The exported runner and parameter description of each kernel, appended to the program.
fn runner_source(kernels: &[String]) -> String {
    let mut s = String::from(RUNNER);
    for k in kernels {
        s.push_str(&format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) int fccl_sim_meta_{k}(unsigned long long* s, \
             unsigned long long* a, int* p, int max) {{ return fccl_sim_rt::meta(&{k}, s, a, p, max); }}\n\
             extern \"C\" __attribute__((visibility(\"default\"))) int fccl_sim_run_{k}(void* const* p, \
             const unsigned* d, void** j) {{ return fccl_sim_rt::run(&{k}, p, d, j); }}\n"
        ));
    }
    s
}

/// Runs kernels for the simulator: describes their parameters (sizes, alignments, which
/// are pointers) and calls them once per thread of the grid, under a `sigsetjmp` that the
/// simulator's fault handler jumps back to (`run.rs`).
const RUNNER: &str = r#"
#line 1 "ferroccl-simgpu-runner"
#include <setjmp.h>
namespace fccl_sim_rt {
template <typename T> struct is_ptr { enum { v = 0 }; };
template <typename T> struct is_ptr<T*> { enum { v = 1 }; };
template <unsigned... I> struct seq {};
template <unsigned N, unsigned... I> struct make_seq : make_seq<N - 1, N - 1, I...> {};
template <unsigned... I> struct make_seq<0, I...> { typedef seq<I...> type; };
template <typename... A> int meta(void (*)(A...), unsigned long long* sizes, unsigned long long* aligns, int* ptrs, int max) {
  const unsigned long long s[] = {0ull, (unsigned long long)sizeof(A)...};
  const unsigned long long a[] = {0ull, (unsigned long long)alignof(A)...};
  const int p[] = {0, (int)is_ptr<A>::v...};
  int n = (int)sizeof...(A);
  for (int i = 0; i < n && i < max; i++) { sizes[i] = s[i + 1]; aligns[i] = a[i + 1]; ptrs[i] = p[i + 1]; }
  return n;
}
template <typename... A, unsigned... I> inline void call(void (*f)(A...), void* const* p, seq<I...>) {
  f(*static_cast<A*>(p[I])...);
}
template <typename... A> int run(void (*f)(A...), void* const* p, const unsigned* d, void** jmp) {
  sigjmp_buf env;
  if (sigsetjmp(env, 1)) { *jmp = 0; return 1; }
  *jmp = &env;
  gridDim.x = d[0]; gridDim.y = d[1]; gridDim.z = d[2];
  blockDim.x = d[3]; blockDim.y = d[4]; blockDim.z = d[5];
  for (unsigned bz = 0; bz < d[2]; bz++)
    for (unsigned by = 0; by < d[1]; by++)
      for (unsigned bx = 0; bx < d[0]; bx++) {
        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
        for (unsigned tz = 0; tz < d[5]; tz++)
          for (unsigned ty = 0; ty < d[4]; ty++)
            for (unsigned tx = 0; tx < d[3]; tx++) {
              threadIdx.x = tx; threadIdx.y = ty; threadIdx.z = tz;
              call(f, p, typename make_seq<sizeof...(A)>::type());
            }
      }
  *jmp = 0;
  return 0;
}
}
"#;

/// A compiled program: its object and the compiler's messages.
pub struct Compiled {
    pub object: Arc<Object>,
    pub log: String,
}

/// Compiles `src` (named `name` in messages) with the kernels `kernels` (extern "C"
/// `__global__` functions) and the preprocessor options `defines` (`-DX=1`, `-UX`, `-Idir`).
/// Err: the compiler's messages.
pub fn compile(src: &str, name: &str, kernels: &[String], defines: &[String]) -> Result<Compiled, String> {
    let cxx = compiler();
    // Line numbers in messages are the program's own.
    let file = name.replace(['"', '\\', '\n'], "_");
    let unit = format!("{PRELUDE}#line 1 \"{file}\"\n{src}\n{}", runner_source(kernels));
    let key = fnv(&[cxx.as_bytes(), CXXFLAGS.join(" ").as_bytes(), defines.join(" ").as_bytes(), unit.as_bytes()]);
    let dir = cache_dir();
    let path = dir.join(format!("{key:016x}.so"));
    if path.exists() {
        if let Ok(object) = load(&path) {
            return Ok(Compiled { object, log: String::new() });
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make the kernel cache {}: {e}", dir.display()))?;
    // Unique names, renamed into place: processes compiling the same source at once do not
    // see each other's half-written files.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = format!("{key:016x}.{}.{}", std::process::id(), SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let (cpp, so) = (dir.join(format!("{tmp}.cpp")), dir.join(format!("{tmp}.so")));
    std::fs::write(&cpp, &unit).map_err(|e| format!("cannot write {}: {e}", cpp.display()))?;
    let out = std::process::Command::new(&cxx)
        .args(CXXFLAGS)
        .args(defines)
        .arg(&cpp)
        .arg("-o")
        .arg(&so)
        .stdin(std::process::Stdio::null())
        .env("LC_ALL", "C")
        .output();
    let _ = std::fs::remove_file(&cpp);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Err(format!(
                "{name}: error: the simulated NVRTC compiles kernels with the host's C++ compiler, and `{cxx}` \
                 could not be run: {e} (set FERROCCL_SIM_CXX; docs/sim-gpu.md)"
            ))
        }
    };
    let log = String::from_utf8_lossy(&out.stderr).replace(&format!("{}", cpp.display()), name);
    if !out.status.success() {
        let _ = std::fs::remove_file(&so);
        return Err(log);
    }
    std::fs::rename(&so, &path).map_err(|e| format!("cannot keep {}: {e}", path.display()))?;
    let object = load(&path)?;
    Ok(Compiled { object, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_with_any_part() {
        assert_ne!(fnv(&[b"a", b"bc"]), fnv(&[b"ab", b"c"]));
        assert_eq!(fnv(&[b"x"]), fnv(&[b"x"]));
    }
}
