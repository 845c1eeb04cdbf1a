//! Which backend serves a communicator's device memory: NCCL when it is loadable
//! and every rank has its own GPU, the built-in backend otherwise (several ranks
//! on one GPU, which NCCL refuses, or no NCCL). Every rank decides from the same
//! allgathered facts, so all ranks agree without another round.

use super::{Backend, Options};
use crate::backend::nccl;
use crate::env;
use crate::error::{Error, Result};
use crate::mem::cuda;

/// What one rank tells the others at set-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// CUDA device of the rank's current context at init, -1 for none (a host rank).
    pub device: i32,
    pub cuda: bool,
    pub nccl: bool,
    /// Host identity and the GPU's PCI bus id: equal pairs mean a shared GPU.
    pub host: u64,
    pub bus: String,
}

impl RankInfo {
    /// This rank's facts; `device` None means "the current context's device".
    pub fn local(host: u64, device: Option<i32>) -> RankInfo {
        let cuda_ok = cuda::active();
        let device = if cuda_ok { device.or_else(cuda::current_device).unwrap_or(-1) } else { -1 };
        let bus = if device >= 0 { cuda::bus_id(device).unwrap_or_default() } else { String::new() };
        let nccl = cuda_ok && device >= 0 && nccl::loadable().is_ok();
        RankInfo { device, cuda: cuda_ok, nccl, host, bus }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.bus.len());
        b.extend_from_slice(&self.device.to_le_bytes());
        b.push(self.cuda as u8);
        b.push(self.nccl as u8);
        b.extend_from_slice(&self.host.to_le_bytes());
        b.extend_from_slice(self.bus.as_bytes());
        b
    }

    /// Whether an encoded description says the rank has CUDA, without decoding it.
    pub fn has_cuda(b: &[u8]) -> bool {
        b.get(4).is_some_and(|&c| c != 0)
    }

    pub fn decode(b: &[u8]) -> Result<RankInfo> {
        if b.len() < 14 {
            return Err(Error::remote(format!("a peer sent a device description of {} bytes", b.len())));
        }
        Ok(RankInfo {
            device: i32::from_le_bytes(b[0..4].try_into().unwrap()),
            cuda: b[4] != 0,
            nccl: b[5] != 0,
            host: u64::from_le_bytes(b[6..14].try_into().unwrap()),
            bus: String::from_utf8_lossy(&b[14..]).into_owned(),
        })
    }
}

/// The backend asked for: the config's backend field when it is not AUTO, else
/// `FERROCCL_BACKEND`, else auto.
pub fn requested(opts: &Options) -> Result<Backend> {
    if opts.backend != Backend::Auto {
        return Ok(opts.backend);
    }
    let words = [("auto", Backend::Auto), ("host", Backend::Host), ("nccl", Backend::Nccl)];
    Ok(env::BACKEND.word(&words)?.unwrap_or(Backend::Auto))
}

/// True when NCCL serves the communicator's device memory. Deterministic in its
/// inputs, so every rank reaches the same verdict (or the same error).
pub fn use_nccl(req: Backend, all: &[RankInfo], me: usize) -> Result<bool> {
    let shared = shared_gpu(all);
    match req {
        Backend::Host => Ok(false),
        Backend::Auto => Ok(shared.is_none() && all.iter().all(|i| i.nccl && i.device >= 0)),
        Backend::Nccl => {
            let no_cuda: Vec<usize> = (0..all.len()).filter(|&r| !all[r].cuda).collect();
            if !no_cuda.is_empty() {
                let why =
                    if all[me].cuda { String::new() } else { cuda::driver().err().map(|e| e.msg).unwrap_or_default() };
                return Err(Error::unavailable(format!(
                    "the NCCL backend was requested (config backend or {}) but CUDA is not available on rank(s) {no_cuda:?}{}{why}",
                    env::BACKEND.name,
                    if why.is_empty() { "" } else { "; here: " }
                )));
            }
            if let Some(r) = (0..all.len()).find(|&r| all[r].device < 0) {
                return Err(Error::invalid_usage(format!(
                    "the NCCL backend was requested but rank {r} has no current CUDA device; select one (cudaSetDevice) before creating the communicator"
                )));
            }
            if let Some((a, b)) = shared {
                return Err(Error::invalid_usage(format!(
                    "the NCCL backend was requested but ranks {a} and {b} share GPU {}; NCCL needs one GPU per rank (use FCCL_BACKEND_AUTO for the built-in backend)",
                    all[a].bus
                )));
            }
            if let Some(r) = (0..all.len()).find(|&r| !all[r].nccl) {
                let why =
                    if r == me { nccl::loadable().err().map(|e| e.msg).unwrap_or_default() } else { String::new() };
                return Err(Error::unavailable(format!(
                    "the NCCL backend was requested but rank {r} cannot load NCCL{}{why}",
                    if why.is_empty() { "" } else { ": " }
                )));
            }
            Ok(true)
        }
    }
}

/// Why neither NCCL nor the GPU-to-GPU path of ranks on one GPU serves this
/// communicator's device memory, which is then staged through host memory: (reason,
/// what to do), for the first device call's WARN. None where staging was asked for
/// (FERROCCL_BACKEND=host, FERROCCL_CUDA_IPC=0 on one GPU). Called when neither serves.
pub fn staging_reason(req: Backend, all: &[RankInfo], ipc_on: bool) -> Option<(String, &'static str)> {
    if req == Backend::Host || all.len() < 2 || (one_gpu(all) && !ipc_on) {
        return None;
    }
    if let Some(r) = all.iter().position(|i| i.device < 0) {
        return Some((
            format!("rank {r} has no current CUDA device"),
            "make a device current (cudaSetDevice) on every rank before creating the communicator",
        ));
    }
    if one_gpu(all) {
        return Some((
            "the ranks share one GPU but its GPU-to-GPU path could not be set up (FERROCCL_DEBUG=INFO says why)".into(),
            "check the free space and permissions of /dev/shm",
        ));
    }
    if let Some((a, b)) = shared_gpu(all) {
        return Some((
            format!("ranks {a} and {b} share GPU {} while other ranks do not: NCCL needs one GPU per rank, and the GPU-to-GPU path of a shared GPU needs every rank on it", all[a].bus),
            "give every rank its own GPU (CUDA_VISIBLE_DEVICES, cudaSetDevice(local rank)), or put every rank on one GPU",
        ));
    }
    if let Some(r) = all.iter().position(|i| !i.nccl) {
        return Some((
            format!("every rank has its own GPU, and rank {r} cannot load NCCL (libnccl.so.2)"),
            "install NCCL (pip install nvidia-nccl-cu13, or the libnccl2 package) or point FERROCCL_NCCL_LIBRARY at libnccl.so.2",
        ));
    }
    None
}

/// True when every rank (at least two) has a device and all share one GPU of one host.
pub fn one_gpu(all: &[RankInfo]) -> bool {
    all.len() > 1 && all.iter().all(|i| i.device >= 0 && i.host == all[0].host && i.bus == all[0].bus)
}

/// Two ranks on one GPU of one host, if any.
fn shared_gpu(all: &[RankInfo]) -> Option<(usize, usize)> {
    for a in 0..all.len() {
        for b in a + 1..all.len() {
            if all[a].device >= 0 && all[b].device >= 0 && all[a].host == all[b].host && all[a].bus == all[b].bus {
                return Some((a, b));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;

    fn gpu(host: u64, bus: &str, nccl: bool) -> RankInfo {
        RankInfo { device: 0, cuda: true, nccl, host, bus: bus.into() }
    }
    fn hostrank() -> RankInfo {
        RankInfo { device: -1, cuda: false, nccl: false, host: 1, bus: String::new() }
    }

    #[test]
    fn info_round_trips() {
        let i = gpu(7, "0000:3b:00.0", true);
        assert_eq!(RankInfo::decode(&i.encode()).unwrap(), i);
        assert!(RankInfo::decode(&[1, 2]).is_err());
        assert!(RankInfo::has_cuda(&i.encode()) && !RankInfo::has_cuda(&hostrank().encode()));
    }

    #[test]
    fn auto_picks_nccl_only_with_one_gpu_per_rank() {
        let own = [gpu(1, "a", true), gpu(1, "b", true)];
        assert!(use_nccl(Backend::Auto, &own, 0).unwrap());
        let shared = [gpu(1, "a", true), gpu(1, "a", true)];
        assert!(!use_nccl(Backend::Auto, &shared, 0).unwrap());
        // Same bus id on different hosts is not sharing.
        assert!(use_nccl(Backend::Auto, &[gpu(1, "a", true), gpu(2, "a", true)], 0).unwrap());
        assert!(!use_nccl(Backend::Auto, &[gpu(1, "a", true), gpu(1, "b", false)], 0).unwrap());
        assert!(!use_nccl(Backend::Auto, &[hostrank(), hostrank()], 0).unwrap());
        assert!(!use_nccl(Backend::Host, &own, 0).unwrap());
        assert!(one_gpu(&shared) && !one_gpu(&own) && !one_gpu(&shared[..1]));
        assert!(!one_gpu(&[hostrank(), hostrank()]));
    }

    #[test]
    fn requested_nccl_fails_the_same_way_everywhere() {
        let e = use_nccl(Backend::Nccl, &[hostrank()], 0).unwrap_err();
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.msg.contains("CUDA is not available on rank(s) [0]"), "{}", e.msg);
        let e = use_nccl(Backend::Nccl, &[gpu(1, "a", true), gpu(1, "a", true)], 1).unwrap_err();
        assert_eq!(e.code, Code::InvalidUsage);
        assert!(e.msg.contains("ranks 0 and 1 share GPU a"), "{}", e.msg);
        let e = use_nccl(Backend::Nccl, &[gpu(1, "a", true), gpu(1, "b", false)], 0).unwrap_err();
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.msg.contains("rank 1 cannot load NCCL"), "{}", e.msg);
    }
}
