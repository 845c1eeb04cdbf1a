//! What the operating system says about this process: the CPUs it may run on, and
//! whether another process still lives. Used by the launcher, the wire-up and the
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
