//! The on-disk cache of compiled device kernels: NVRTC's CUBIN for a program, an
//! architecture and an NVRTC version, kept between processes so that only the first
//! process on a machine pays for the compilation (every rank compiles otherwise).
//! FERROCCL_KERNEL_CACHE names the directory (0 or off: no cache); by default it is
//! $XDG_CACHE_HOME/ferroccl/kernels, else ~/.cache/ferroccl/kernels. A file that is
//! missing, unreadable or refused by the driver is compiled again and replaced; a
//! cache that cannot be written costs only the compilation.

use crate::env;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The cache directory, or None when FERROCCL_KERNEL_CACHE turns it off or no home is known.
pub fn dir() -> Option<PathBuf> {
    dir_from(
        env::KERNEL_CACHE.get().as_deref(),
        std::env::var_os("XDG_CACHE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

fn dir_from(set: Option<&str>, xdg: Option<&std::ffi::OsStr>, home: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    match set.map(str::trim) {
        Some("0") | Some("off") | Some("false") | Some("no") => None,
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => {
            let base = match (xdg.filter(|x| !x.is_empty()), home.filter(|h| !h.is_empty())) {
                (Some(x), _) => PathBuf::from(x),
                (None, Some(h)) => Path::new(h).join(".cache"),
                (None, None) => return None,
            };
            Some(base.join("ferroccl").join("kernels"))
        }
    }
}

/// The file name of a program's image: a digest of everything the image depends on.
pub fn file_name(source: &str, name: &str, arch: &str, options: &[&str], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    for part in [source, name, arch, &options.join(" "), &format!("{}.{}", nvrtc.0, nvrtc.1)] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{name}-{arch}-{hex}.cubin")
}

/// The cached image at `path`, if there is one.
pub fn read(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok().filter(|b| !b.is_empty())
}

/// Stores `image` at `path` whole or not at all (a temporary file renamed into place,
/// so concurrent ranks never read half a file). Errors are returned for the caller to
/// log: the cache is an optimisation.
pub fn write(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().map(|f| f.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, image)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_directory_follows_the_variable_then_xdg_then_home() {
        let (x, h) = (Some(OsStr::new("/x")), Some(OsStr::new("/h")));
        assert_eq!(dir_from(Some("/c"), x, h), Some(PathBuf::from("/c")));
        assert_eq!(dir_from(Some(" off "), x, h), None);
        assert_eq!(dir_from(Some("0"), x, h), None);
        assert_eq!(dir_from(Some(""), x, h), Some(PathBuf::from("/x/ferroccl/kernels")));
        assert_eq!(dir_from(None, None, h), Some(PathBuf::from("/h/.cache/ferroccl/kernels")));
        assert_eq!(dir_from(None, Some(OsStr::new("")), h), Some(PathBuf::from("/h/.cache/ferroccl/kernels")));
        assert_eq!(dir_from(None, None, None), None);
    }

    #[test]
    fn the_name_changes_with_anything_the_image_depends_on() {
        let base = file_name("src", "p", "sm_90", &["-a"], (13, 0));
        assert!(base.starts_with("p-sm_90-") && base.ends_with(".cubin"), "{base}");
        assert_eq!(base, file_name("src", "p", "sm_90", &["-a"], (13, 0)));
        for other in [
            file_name("src2", "p", "sm_90", &["-a"], (13, 0)),
            file_name("src", "p", "sm_100", &["-a"], (13, 0)),
            file_name("src", "p", "sm_90", &["-b"], (13, 0)),
            file_name("src", "p", "sm_90", &["-a"], (13, 1)),
            // Lengths are hashed too: moving a byte between parts changes the name.
            file_name("srcp", "", "sm_90", &["-a"], (13, 0)),
        ] {
            assert_ne!(base.split('-').next_back(), other.split('-').next_back(), "{other}");
        }
    }

    #[test]
    fn a_write_is_whole_and_replaces() {
        let d = std::env::temp_dir().join(format!("ferroccl-kcache-{}", std::process::id()));
        let p = d.join("sub").join("k.cubin");
        write(&p, b"one").unwrap();
        write(&p, b"two!").unwrap();
        assert_eq!(read(&p).as_deref(), Some(&b"two!"[..]));
        let left: Vec<_> = std::fs::read_dir(d.join("sub")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read(&p), None, "an empty file is no image");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
