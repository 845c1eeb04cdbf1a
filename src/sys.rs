//! What the operating system says about this process: the CPUs it may run on, and
//! whether another process still lives; and the memory mappings every allocator
//! of ours makes the same way. Used by the launcher, the connecting of ranks and the
//! transport's waits.

/// How many CPUs this process may use (its affinity mask and CPU quota).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPUs this process's affinity mask allows, in order (empty if it cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// True once `pid` has ended or is ending: it does not exist, is a zombie, or is
/// exiting (PF_EXITING: a killed process closes its descriptors before it becomes a
/// zombie, so its peers can hear of its end first). False when it cannot be told.
pub fn process_gone(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // After the parenthesised command name: state, ppid, pgrp, session, tty, tpgid, flags.
    let f: Vec<&str> = stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let zombie = matches!(f.first(), Some(&"Z") | Some(&"X"));
    let exiting = f.get(6).and_then(|v| v.parse::<u64>().ok()).is_some_and(|fl| fl & PF_EXITING != 0);
    zombie || exiting
}

/// False once `pid` has exited, including while it waits to be reaped (a zombie
/// still answers kill(pid, 0) but will never write to shared memory again).
pub fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => {
            !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

/// A fresh private anonymous read-write mapping of `len` bytes (zero-filled, its
/// pages made on first touch); `what` names it in the error.
pub fn map_private(len: usize, what: &str) -> crate::error::Result<*mut u8> {
    // SAFETY: a new mapping at an address of the kernel's choice; no existing memory changes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::error::Error::os(format!("mmap of {len} bytes for {what}")));
    }
    Ok(p.cast())
}

/// Maps the first `len` bytes of the file `fd` (shared memory) read-write and shared,
/// its pages made on first touch; `what` names it in the error.
pub fn map_shared(fd: std::os::fd::RawFd, len: usize, what: &str) -> crate::error::Result<*mut u8> {
    // SAFETY: a new mapping at an address of the kernel's choice; a bad fd or a file
    // shorter than `len` is the kernel's error (or SIGBUS on touch past its end, which
    // callers rule out by sizing the file first).
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(crate::error::Error::os(format!("mmap of {what} ({len} bytes)")));
    }
    Ok(p.cast())
}

/// Unmaps `len` bytes at `p`, a mapping [`map_private`] or [`map_shared`] made.
///
/// # Safety
/// Nothing uses the range afterwards, and it is unmapped once.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(p.cast(), len) };
}
