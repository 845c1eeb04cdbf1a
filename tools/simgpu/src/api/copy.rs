//! Copies and memsets, bounds-checked at the call, ordered on streams, with the host
//! synchronisation CUDA documents ("API synchronization behavior"):
//! * synchronous copies run on the legacy stream and return when done, except device to
//!   device, which returns at once;
//! * asynchronous copies from pageable memory synchronise the stream and stage the source
//!   before returning; into pageable memory they return when done; pinned, registered and
//!   device memory are fully asynchronous (read and written when the stream gets there);
//! * memsets are asynchronous, the synchronous ones too unless the target is pinned.

use super::non_null;
use crate::ctx;
use crate::error::{bail, Result};
use crate::mem::alloc::Kind;
use crate::mem::Loc;
use crate::state::{api, lock, State};
use crate::stream::op::{Copy, OpKind, Side};
use crate::stream::{self};
use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUresult, CUstream, CUDA_MEMCPY2D};
use std::ffi::{c_uchar, c_uint, c_ushort, c_void};
use std::sync::Arc;

/// What a copy endpoint must be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    /// Host memory (pageable, pinned, registered or managed).
    Host,
    /// Device, managed or IPC-opened memory.
    Device,
    /// Anything (unified copies).
    Any,
}

/// A copy endpoint: where, how far its rows reach, and what it must be.
#[derive(Clone, Copy, Debug)]
struct Endpoint {
    addr: u64,
    pitch: usize,
    want: Want,
    what: &'static str,
}

struct End {
    side: Side,
    pageable: bool,
    device: bool,
}

fn end(st: &State, e: Endpoint, width: usize, height: usize) -> Result<End> {
    let span = (height - 1).checked_mul(e.pitch).and_then(|v| v.checked_add(width));
    let Some(span) = span else { bail!(CUDA_ERROR_INVALID_VALUE, "{height} rows of pitch {} overflow", e.pitch) };
    let what = e.what;
    Ok(match (st.mem.classify(e.addr, span, what)?, e.want) {
        (Loc::Dev(a, _), Want::Host) if a.kind != Kind::Managed => {
            bail!(CUDA_ERROR_INVALID_VALUE, "{what} {:#x} is device memory; host memory is expected here", e.addr)
        }
        (Loc::Dev(a, off), _) => End { device: true, side: Side::Dev(a, off), pageable: false },
        (Loc::Pinned(_) | Loc::Pageable(_), Want::Device) => bail!(
            CUDA_ERROR_INVALID_VALUE,
            "{what} {:#x} is not device memory (not inside any live allocation)",
            e.addr
        ),
        (Loc::Pinned(p), _) => End { side: Side::Host(p), pageable: false, device: false },
        (Loc::Pageable(p), _) => End { side: Side::Host(p), pageable: true, device: false },
    })
}

/// A private copy of pageable source rows (staging), packed with pitch `width`.
fn stage(src: u64, spitch: usize, width: usize, height: usize) -> Arc<Vec<u8>> {
    let mut v = vec![0u8; width * height];
    for r in 0..height {
        // SAFETY: host memory the caller passed as the copy's source, `width` bytes per row.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (src as usize + r * spitch) as *const u8,
                v.as_mut_ptr().add(r * width),
                width,
            )
        };
    }
    Arc::new(v)
}

/// One (possibly 2D) copy of `height` rows of `width` bytes on `hstream` (None: the
/// synchronous form, on the legacy stream).
fn copy(dst: Endpoint, src: Endpoint, width: usize, height: usize, hstream: Option<CUstream>) -> Result<()> {
    let mut st = lock();
    let sid = stream::resolve(&mut st, hstream.map_or(0, |s| s as u64))?;
    if width == 0 || height == 0 {
        return Ok(());
    }
    if height > 1 && (dst.pitch < width || src.pitch < width) {
        bail!(CUDA_ERROR_INVALID_VALUE, "pitches {}/{} are below the width {width}", dst.pitch, src.pitch);
    }
    let (d, s) = (end(&st, dst, width, height)?, end(&st, src, width, height)?);
    crate::costs::on_copy(width * height, s.device, d.device);
    let op = |d: End, s: Side, spitch: usize| {
        OpKind::Copy(Copy { dst: d.side, dpitch: dst.pitch, src: s, spitch, width, height })
    };
    if hstream.is_none() {
        if d.device && s.device {
            stream::enqueue(&mut st, sid, op(d, s.side, src.pitch), Vec::new());
            return Ok(());
        }
        return stream::run_sync(st, sid, op(d, s.side, src.pitch));
    }
    if d.pageable || s.pageable {
        crate::graph::not_capturable(&mut st, sid, "an asynchronous copy to or from pageable host memory")?;
    }
    if d.pageable {
        return stream::run_sync(st, sid, op(d, s.side, src.pitch));
    }
    if s.pageable {
        // Pageable source: the stream's earlier work first, then a private copy of the source.
        stream::synchronize(st, sid)?;
        let staged = stage(src.addr, src.pitch, width, height);
        let mut st = lock();
        let sid = stream::resolve(&mut st, hstream.map_or(0, |s| s as u64))?;
        let d = end(&st, dst, width, height)?;
        stream::enqueue(&mut st, sid, op(d, Side::Staged(staged), width), Vec::new());
        return Ok(());
    }
    stream::enqueue(&mut st, sid, op(d, s.side, src.pitch), Vec::new());
    Ok(())
}

fn ep(addr: u64, want: Want, what: &'static str) -> Endpoint {
    Endpoint { addr, pitch: 0, want, what }
}

/// Unified copy: each side's kind comes from its address. Synchronous (legacy stream).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    api("cuMemcpy", || copy(ep(dst, Want::Any, "dst"), ep(src, Want::Any, "src"), n, 1, None))
}

/// Host to device; the source must be host memory, the destination wholly inside one live
/// allocation. Returns when done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    api("cuMemcpyHtoD_v2", || {
        copy(ep(dst, Want::Device, "dstDevice"), ep(src as u64, Want::Host, "srcHost"), n, 1, None)
    })
}

/// Device to host; returns when done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    api("cuMemcpyDtoH_v2", || {
        copy(ep(dst as u64, Want::Host, "dstHost"), ep(src, Want::Device, "srcDevice"), n, 1, None)
    })
}

/// Device to device on the legacy stream; returns before it is done, as CUDA documents.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    api("cuMemcpyDtoD_v2", || copy(ep(dst, Want::Device, "dstDevice"), ep(src, Want::Device, "srcDevice"), n, 1, None))
}

/// Unified copy on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    api("cuMemcpyAsync", || copy(ep(dst, Want::Any, "dst"), ep(src, Want::Any, "src"), n, 1, Some(s)))
}

/// Host to device on a stream: pinned sources are read when the stream gets there;
/// pageable ones are staged after the stream's earlier work.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) -> CUresult {
    api("cuMemcpyHtoDAsync_v2", || {
        copy(ep(dst, Want::Device, "dstDevice"), ep(src as u64, Want::Host, "srcHost"), n, 1, Some(s))
    })
}

/// Device to host on a stream: into pinned memory fully asynchronous (not visible before a
/// synchronisation); into pageable memory returns when done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    api("cuMemcpyDtoHAsync_v2", || {
        copy(ep(dst as u64, Want::Host, "dstHost"), ep(src, Want::Device, "srcDevice"), n, 1, Some(s))
    })
}

/// Device to device on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> CUresult {
    api("cuMemcpyDtoDAsync_v2", || {
        copy(ep(dst, Want::Device, "dstDevice"), ep(src, Want::Device, "srcDevice"), n, 1, Some(s))
    })
}

/// Both contexts must be live and each pointer memory of its context's device.
fn check_peer(st: &State, p: u64, c: CUcontext, what: &str) -> Result<()> {
    let cdev = ctx::live(st, c as u64)?.device;
    if let Some(a) = st.mem.find_dev(p) {
        if a.device != cdev {
            bail!(CUDA_ERROR_INVALID_VALUE, "{what} {p:#x} is memory of device {}, its context is on {cdev}", a.device);
        }
    }
    Ok(())
}

/// Device to device between contexts; as cuMemcpyDtoD.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> CUresult {
    api("cuMemcpyPeer", || {
        {
            let st = lock();
            check_peer(&st, dst, dst_ctx, "dstDevice")?;
            check_peer(&st, src, src_ctx, "srcDevice")?;
        }
        copy(ep(dst, Want::Device, "dstDevice"), ep(src, Want::Device, "srcDevice"), n, 1, None)
    })
}

/// Device to device between contexts on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    s: CUstream,
) -> CUresult {
    api("cuMemcpyPeerAsync", || {
        {
            let st = lock();
            check_peer(&st, dst, dst_ctx, "dstDevice")?;
            check_peer(&st, src, src_ctx, "srcDevice")?;
        }
        copy(ep(dst, Want::Device, "dstDevice"), ep(src, Want::Device, "srcDevice"), n, 1, Some(s))
    })
}

/// The two endpoints of a CUDA_MEMCPY2D, read field by field (enum fields as integers).
///
/// # Safety
/// `p` points at a CUDA_MEMCPY2D.
unsafe fn endpoints_2d(p: *const CUDA_MEMCPY2D) -> Result<(Endpoint, Endpoint, usize, usize)> {
    non_null(p, "pCopy")?;
    // SAFETY: `p` points at a CUDA_MEMCPY2D (caller); the memory-type enums are read as
    // integers (an out-of-range value must not become a Rust enum).
    let (c, stype, dtype) = unsafe {
        (
            &*p,
            std::ptr::addr_of!((*p).srcMemoryType).cast::<u32>().read(),
            std::ptr::addr_of!((*p).dstMemoryType).cast::<u32>().read(),
        )
    };
    let side = |t: u32, host: u64, dev: u64, x: usize, y: usize, pitch: usize, what: &'static str| {
        let (base, want) = match t {
            1 => (host, Want::Host),
            2 => (dev, Want::Device),
            4 => (dev, Want::Any),
            3 => bail!(CUDA_ERROR_NOT_SUPPORTED, "{what}: CUDA arrays are not simulated"),
            _ => bail!(CUDA_ERROR_INVALID_VALUE, "{what}: memory type {t} is not valid"),
        };
        if base == 0 {
            bail!(CUDA_ERROR_INVALID_VALUE, "{what} is NULL");
        }
        let off = y.checked_mul(pitch).and_then(|v| v.checked_add(x)).unwrap_or(usize::MAX);
        Ok(Endpoint { addr: base.wrapping_add(off as u64), pitch, want, what })
    };
    let s = side(stype, c.srcHost as u64, c.srcDevice, c.srcXInBytes, c.srcY, c.srcPitch, "src")?;
    let d = side(dtype, c.dstHost as u64, c.dstDevice, c.dstXInBytes, c.dstY, c.dstPitch, "dst")?;
    Ok((d, s, c.WidthInBytes, c.Height))
}

/// 2D copy; every row of both sides is checked. Synchronous as cuMemcpy.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const CUDA_MEMCPY2D) -> CUresult {
    api("cuMemcpy2D_v2", || {
        // SAFETY: `p` points at a CUDA_MEMCPY2D (caller); NULL is checked.
        let (d, s, w, h) = unsafe { endpoints_2d(p)? };
        copy(d, s, w, h, None)
    })
}

/// As cuMemcpy2D_v2 (no alignment requirements are simulated).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const CUDA_MEMCPY2D) -> CUresult {
    api("cuMemcpy2DUnaligned_v2", || {
        // SAFETY: as above.
        let (d, s, w, h) = unsafe { endpoints_2d(p)? };
        copy(d, s, w, h, None)
    })
}

/// 2D copy on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const CUDA_MEMCPY2D, s: CUstream) -> CUresult {
    api("cuMemcpy2DAsync_v2", || {
        // SAFETY: as above.
        let (d, src, w, h) = unsafe { endpoints_2d(p)? };
        copy(d, src, w, h, Some(s))
    })
}

/// `height` rows of `count` elements of `elem` bytes at `dst` (rows `pitch` apart).
fn memset(
    dst: u64,
    pitch: usize,
    count: usize,
    height: usize,
    elem: usize,
    value: u32,
    hs: Option<CUstream>,
) -> Result<()> {
    let mut st = lock();
    let sid = stream::resolve(&mut st, hs.map_or(0, |s| s as u64))?;
    if !dst.is_multiple_of(elem as u64) {
        bail!(CUDA_ERROR_INVALID_VALUE, "dstDevice {dst:#x} is not aligned to {elem} bytes");
    }
    if count == 0 || height == 0 {
        return Ok(());
    }
    let width = count.saturating_mul(elem);
    if height > 1 && pitch < width {
        bail!(CUDA_ERROR_INVALID_VALUE, "pitch {pitch} is below the row width {width}");
    }
    let e = end(&st, Endpoint { addr: dst, pitch, want: Want::Any, what: "dstDevice" }, width, height)?;
    if e.pageable {
        bail!(CUDA_ERROR_INVALID_VALUE, "dstDevice {dst:#x} is pageable host memory, not device-accessible");
    }
    let pinned = !e.device;
    let op = OpKind::Memset { dst: e.side, pitch, count, height, elem, value };
    if hs.is_none() && pinned {
        return stream::run_sync(st, sid, op);
    }
    stream::enqueue(&mut st, sid, op, Vec::new());
    Ok(())
}

/// Sets bytes; asynchronous unless the target is pinned host memory (as CUDA documents).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult {
    api("cuMemsetD8_v2", || memset(dst, 0, n, 1, 1, u32::from(v), None))
}

/// Sets 16-bit values (2-byte aligned).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: c_ushort, n: usize) -> CUresult {
    api("cuMemsetD16_v2", || memset(dst, 0, n, 1, 2, u32::from(v), None))
}

/// Sets 32-bit values (4-byte aligned).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    api("cuMemsetD32_v2", || memset(dst, 0, n, 1, 4, v, None))
}

/// Sets bytes on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) -> CUresult {
    api("cuMemsetD8Async", || memset(dst, 0, n, 1, 1, u32::from(v), Some(s)))
}

/// Sets 16-bit values on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(dst: CUdeviceptr, v: c_ushort, n: usize, s: CUstream) -> CUresult {
    api("cuMemsetD16Async", || memset(dst, 0, n, 1, 2, u32::from(v), Some(s)))
}

/// Sets 32-bit values on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> CUresult {
    api("cuMemsetD32Async", || memset(dst, 0, n, 1, 4, v, Some(s)))
}

/// 2D byte memset; every row is checked.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, v: c_uchar, w: usize, h: usize) -> CUresult {
    api("cuMemsetD2D8_v2", || memset(dst, pitch, w, h, 1, u32::from(v), None))
}

/// 2D 16-bit memset.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, v: c_ushort, w: usize, h: usize) -> CUresult {
    api("cuMemsetD2D16_v2", || memset(dst, pitch, w, h, 2, u32::from(v), None))
}

/// 2D 32-bit memset.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, v: c_uint, w: usize, h: usize) -> CUresult {
    api("cuMemsetD2D32_v2", || memset(dst, pitch, w, h, 4, v, None))
}

/// 2D byte memset on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uchar,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    api("cuMemsetD2D8Async", || memset(dst, pitch, w, h, 1, u32::from(v), Some(s)))
}

/// 2D 16-bit memset on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_ushort,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    api("cuMemsetD2D16Async", || memset(dst, pitch, w, h, 2, u32::from(v), Some(s)))
}

/// 2D 32-bit memset on a stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uint,
    w: usize,
    h: usize,
    s: CUstream,
) -> CUresult {
    api("cuMemsetD2D32Async", || memset(dst, pitch, w, h, 4, v, Some(s)))
}
